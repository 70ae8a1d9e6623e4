"""The pull's short agreement check: edgectl's worker and llama-server on the same GGUF.

``edgectl models pull`` runs it on the directory it has just written, before that directory
takes its place (``edgectl/models/pull.py``), when a llama-server this CPU can run is at hand
(``edgectl bench --build-llama-cpp`` builds one): llama.cpp is GGUF's reference implementation,
so a model edgectl serves differently from it on the same file is a conversion or loader bug
(the Gemma-3 conversion of ``docs/gguf.md`` answered nonsense and was served as ready).

Both servers start on the model (the worker in eager mode and a short context, so the check
takes seconds, not a compile); the first ``PROMPTS`` prompts of the shipped set are tokenized by
each, and where both give the same ids their next-token distributions are compared as
``edgectl bench`` does (``edgectl/bench/fidelity.py``). Below ``REFUSE_BELOW`` top-1 agreement
the pull refuses the model. The full measurement over the whole set is ``edgectl bench MODEL``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgectl import launch
from edgectl.bench import fidelity
from edgectl.bench.prompts import prompt_set
from edgectl.client import Client, HttpFailed
from edgectl.contract import fidelity as scoring
from edgectl.contract import worker
from edgectl.contract.effective import Effective
from edgectl.contract.fidelity import PromptSet
from edgectl.contract.plan import Request
from edgectl.errors import EdgectlError

PROMPTS = 6
# Gross disagreement. On the same file edgectl agreed with llama.cpp at 0.913 (SmolLM2) and 1.000
# (Gemma-3) over the whole set (docs/gguf.md); llama.cpp's own bf16 dequantization agreed at 0.870.
# A broken conversion agrees at chance.
REFUSE_BELOW = 0.5
CONTEXT = 512
START_TIMEOUT_S = 600.0


def _wait(ready: Callable[[], bool], server, what: str, deadline: float) -> None:
    while not ready():
        if server.returncode() is not None:
            tail = " | ".join(server.log_tail(4))
            raise EdgectlError(f"the agreement check's {what} exited with code {server.returncode()} before it was "
                               f"ready: {tail}")
        if time.monotonic() > deadline:
            raise EdgectlError(f"the agreement check's {what} was not ready in {START_TIMEOUT_S:.0f} s")
        time.sleep(0.25)


def _worker_ready(client: Client) -> bool:
    try:
        return Effective.from_dict(client.get_json(worker.EFFECTIVE_ROUTE, timeout=5)).phase == worker.SERVING
    except (HttpFailed, OSError, ValueError):
        return False


def check(model_dir: Path, gguf: Path, environ: Mapping[str, str], progress: Callable[[str], None],
          logs: Path) -> dict[str, Any]:
    """Top-1 agreement of edgectl with llama-server on ``PROMPTS`` prompts; the record the manifest
    keeps. ``{"checked": False, "why": ...}`` when no llama-server runs here."""
    from edgectl.bench.server import ServerProcess, free_port
    from edgectl.contract import environment
    from edgectl.inputs import make_plan
    from edgectl.llamacpp import find_llama_server, held_isa
    from edgectl.probe import probe

    host = probe("/", environ=environ)
    llama = find_llama_server(environ, host_flags=host.cpu.flags, held_to=held_isa(environ))
    if llama.path is None:
        return {"checked": False, "why": llama.origin}
    plan = make_plan(Request(model=str(model_dir), max_model_len=CONTEXT, compilation="eager", name="pull-check",
                             port=free_port()), environ, facts=host).plan
    plan = replace(plan, model=replace(plan.model, name=model_dir.name))
    logs.mkdir(parents=True, exist_ok=True)
    plan_path = logs / "plan.json"
    plan_path.write_text(plan.to_json())
    prompts = prompt_set()
    subset = PromptSet(prompts.decode_prompt, prompts.prompts[:PROMPTS], prompts.prompts[0], prompts.source)
    env = {k: v for k, v in environ.items() if k not in environment.NOT_INHERITED_BY_SERVERS}
    llama_port = free_port()
    threads = str(plan.threads)
    progress(f"check: serving it with edgectl and with llama-server ({llama.path}) to compare their next tokens "
             f"on {PROMPTS} prompts")
    started = time.monotonic()
    servers = []
    try:
        servers.append(ServerProcess([llama.path, "-m", str(gguf), "-c", str(CONTEXT), "-np", "1", "-t", threads,
                                      "-tb", threads, "--host", "127.0.0.1", "--port", str(llama_port),
                                      "--no-webui"], env, logs / "llama-server.log"))
        deadline = time.monotonic() + START_TIMEOUT_S
        llama_client = Client("127.0.0.1", llama_port)
        try:
            _wait(lambda: llama_client.status("/health") == 200, servers[0], "llama-server", deadline)
        except EdgectlError as exc:  # the reference cannot read the file: nothing to compare with
            return {"checked": False, "why": exc.message}
        servers.append(ServerProcess(launch.worker_command(environment.runtime_python(environ), str(plan_path),
                                                    plan.levers.python_optimize), env, logs / "worker.log"))
        ours = Client.of(plan.serve)
        _wait(lambda: _worker_ready(ours), servers[1], "edgectl worker", deadline)
        reference = fidelity.collect_llama(llama_client, subset)
        served = fidelity.collect_vllm(ours, plan.model.name, subset)
    finally:
        for s in servers:
            s.stop(timeout_s=30)
    got = scoring.compare(reference, served)
    refused = verdict(got)
    return {"checked": True, "llama_server": llama.path, "prompts": got["next_token_prompts"],
            "prompts_tokenized_differently": got["prompts_tokenized_differently"],
            "next_token_top1_agreement": got["next_token_top1_agreement"],
            "next_token_mean_kl": got["next_token_mean_kl"], "refuse_below": REFUSE_BELOW,
            "seconds": round(time.monotonic() - started, 1), "passed": refused is None, "refused": refused}


def verdict(compared: Mapping[str, Any]) -> str | None:
    """Why the model is refused (a gross disagreement, or no prompt both tokenized alike), or None."""
    n = compared.get("next_token_prompts") or 0
    agreement = compared.get("next_token_top1_agreement")
    if n == 0 or agreement is None:
        differ = compared.get("prompts_tokenized_differently") or 0
        return (f"edgectl and llama.cpp tokenized {differ} of the check's prompts differently and agreed on none: "
                "its tokenizer does not match the GGUF's")
    if agreement < REFUSE_BELOW:
        return (f"edgectl's next token agrees with llama.cpp's on the same GGUF on {agreement:.2f} of {n} prompts "
                f"(refused below {REFUSE_BELOW}): edgectl would serve this model wrongly")
    return None
