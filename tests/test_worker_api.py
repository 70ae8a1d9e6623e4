"""The OpenAI API the worker serves stays whole with the memory levers on (the default plan's:
docs/memory.md): completions, chat, streaming, tools, structured output; the worker's memory
attribution adds up; and a plan with fp8 KV runs with fp8 KV.

The real SmolLM2, on the plan `edgectl plan` makes. Each lever is read back from the running
process, so a lever that silently did not apply fails here rather than passing for the wrong reason.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import isa_helpers
import pytest

from edgectl.launch import worker_command

pytestmark = pytest.mark.isa_avx2

PYTHON = os.environ.get("EDGECTL_RUNTIME_PYTHON", "/opt/edgectl/venv/bin/python")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(base: str, path: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None


def _get(base: str, path: str, timeout: float = 300) -> dict:
    with urllib.request.urlopen(base + path, timeout=timeout) as r:
        return json.loads(r.read())


def _start(tmp: Path, plan_args: list[str]):
    """The worker on the plan `edgectl plan smollm2-135m ARGS` makes, started as the unit starts it
    (edgectl/contract/worker.py's command: python -OO for the plan's levers); (process, base URL, plan)."""
    port = _free_port()
    # eager: where the planner would compile (a measured class), each start would cost minutes
    # on 2 cores; compiled mode serving the API is test_compile_cache_engine.py's and the deploy test's
    out = subprocess.run([PYTHON, "-m", "edgectl", "plan", "smollm2-135m", "--compilation", "eager", *plan_args, "--json",
                          *isa_helpers.plan_args(tmp)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    plan["serve"]["port"] = port
    (tmp / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "VLLM_CPU_KVCACHE_SPACE")}
    log = (tmp / "worker.log").open("w")
    command = worker_command(PYTHON, str(tmp / "plan.json"), plan["levers"]["python_optimize"])
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while True:
        assert proc.poll() is None, (tmp / "worker.log").read_text()[-3000:]
        try:
            if _get(base, "/edgectl/effective", timeout=5).get("phase") == "serving":
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the worker did not become ready"
        time.sleep(0.5)
    return proc, log, base, plan


def _stop(proc, log) -> None:
    proc.terminate()
    proc.wait(timeout=120)
    log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, pulled_smollm2):
    proc, log, base, plan = _start(tmp_path_factory.mktemp("api"), ["--max-model-len", "2048"])
    yield base, plan
    _stop(proc, log)


def _packs_expected(plan: dict) -> dict[str, str]:
    """The embedding-pack read-back the plan's format implies. SmolLM2's LM head is tied to its
    input embedding: with a bf16 head only the head keeps vLLM's packed copy, where vLLM has a
    packed bf16 GEMM for this ISA (AVX-512 or AMX; none on AVX2: isa_helpers). With w4a8 (the
    default where a profile measured it fastest) the tied table is edgectl's int8 blocks: vLLM has
    no dense embedding layer left to pack."""
    if plan["weight_format"] == "w4a8":
        return {}
    head = "packed" if isa_helpers.vllm_packs_bf16_gemm(isa_helpers.host_isa()) else "no packed kernel"
    return {"model.embed_tokens": "not packed", "lm_head": head}


@pytest.mark.engine
def test_completion_and_chat(server):
    base, plan = server
    comp = _post(base, "/v1/completions", {"model": "smollm2-135m", "prompt": "The capital of France is",
                                           "max_tokens": 8, "temperature": 0})
    assert comp["usage"]["completion_tokens"] > 0 and comp["choices"][0]["text"]
    chat = _post(base, "/v1/chat/completions", {"model": "smollm2-135m", "max_tokens": 16, "temperature": 0,
                                                "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert chat["choices"][0]["message"]["content"]


@pytest.mark.engine
def test_streaming_chat_ends_with_done(server):
    base, _ = server
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps({
        "model": "smollm2-135m", "max_tokens": 12, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Count to five."}]}).encode(),
        headers={"content-type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.strip()
            if line.startswith(b"data: "):
                events.append(line[6:])
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    assert text and chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.engine
def test_a_request_with_tools_is_served_and_tool_calls_need_a_parser(server):
    """edgectl configures no --tool-call-parser (vLLM 0.32 needs one per model family to turn
    output into tool calls, vllm/renderers/online_renderer.py:259-280): a request that carries
    tools with tool_choice "none" is served, one that asks for a call is refused with vLLM's
    message. Pinned so that the day a parser is planned, this test says so."""
    base, _ = server
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = _post(base, "/v1/chat/completions", {"model": "smollm2-135m", "max_tokens": 16, "temperature": 0,
                                               "tools": [tool], "tool_choice": "none", "messages": messages})
    assert out["choices"][0]["message"]["content"]
    with pytest.raises(AssertionError, match="tool-call-parser"):
        _post(base, "/v1/chat/completions", {"model": "smollm2-135m", "max_tokens": 16, "temperature": 0,
                                             "tools": [tool], "tool_choice": "required", "messages": messages})


@pytest.mark.engine
def test_structured_output_follows_the_json_schema(server):
    base, _ = server
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    out = _post(base, "/v1/chat/completions", {
        "model": "smollm2-135m", "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        "messages": [{"role": "user", "content": "Describe a person as JSON."}]})
    data = json.loads(out["choices"][0]["message"]["content"])
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)


@pytest.mark.engine
def test_the_memory_attribution_adds_up_and_reads_the_levers_back(server):
    base, plan = server
    att = _get(base, "/edgectl/memory")
    assert att["schema"] == "edgectl.memory/1"
    parts = {r["part"]: r["bytes"] for r in att["rows"]}
    assert abs(att["unattributed_fraction"]) < 0.05, json.dumps(att["rows"], indent=1)
    assert parts["weights"] > 50 << 20 and parts["KV cache"] > 0
    assert att["details"]["process"]["optional_imports"] == {
        "opentelemetry": "kept out", "cv2": "kept out", "accelerate": "kept out"}
    assert att["details"]["process"]["python_optimize"] == 2
    packs = {p["name"]: p["state"] for p in att["details"]["embedding_pack"]}
    assert packs == _packs_expected(plan), packs


@pytest.mark.engine
def test_a_started_worker_keeps_no_gloo_transport_threads(server):
    # vLLM opens 13 one-rank gloo groups whose transport threads wake 100 times a second each; the worker
    # destroys them once the engine has started, and the threads end with them (counted in /proc here)
    base, plan = server
    eff = _get(base, "/edgectl/effective")
    assert eff["gloo_groups"]["released"] >= 2 and eff["gloo_groups"]["transport_threads"] == 0, eff["gloo_groups"]
    names = [Path(f).read_text().strip() for f in glob.glob(f"/proc/{eff['server_pid']}/task/*/comm")]
    assert names and "gloo_tcp_loop" not in names, sorted(set(names))
    comp = _post(base, "/v1/completions", {"model": "smollm2-135m", "prompt": "The capital of France is",
                                           "max_tokens": 4, "temperature": 0})
    assert comp["usage"]["completion_tokens"] == 4  # and it still serves


@pytest.mark.engine
def test_the_worker_reads_the_memory_levers_back_and_they_match_the_plan(server):
    base, plan = server
    assert (plan["levers"]["embedding_pack"], plan["levers"]["optional_imports"],
            plan["levers"]["python_optimize"]) == ("lm-head", "skip", 2)
    eff = _get(base, "/edgectl/effective")
    assert eff["python_optimize"] == 2
    assert eff["optional_imports"] == {"opentelemetry": "kept out", "cv2": "kept out", "accelerate": "kept out"}
    assert {n: e["state"] for n, e in eff["embedding_pack"].items()} == _packs_expected(plan)
    assert (eff["kv_cache_dtype"], eff["kv_tensor_dtypes"]) == (["auto"], ["bfloat16"])
    # decode steps attend with edgectl's kernel where the plan says so (x86 with AVX2 + FMA, not AMX: in
    # the AVX2 tier its AVX2 level), the warm-up's and the tests' decode steps among them
    attention = eff["decode_attention"]
    if plan["levers"]["decode_attention"]:
        assert attention["kernel"] == "edgectl" and attention["calls"]["edgectl"] > 0, attention
    else:
        assert attention["kernel"] == "vllm", attention
    # the lean tokenizer: read again after the warm-up, whose chat render is where vLLM would load
    # the tokenizer a second time looking for a processor
    assert plan["levers"]["tokenizer"] == "lean"
    assert eff["tokenizer"]["lean"] is True and eff["tokenizer"]["processor_loaded"] is False, eff["tokenizer"]
    inputs = eff["tokenizer"]["construction_inputs"]
    assert set(inputs["held"]) <= set(inputs["read_after_init"]), inputs
    # the idle trim: on, and it runs once the server has had 1 s without requests (the warm-up and
    # the other tests' requests came before; /edgectl/ routes are not API requests)
    assert plan["levers"]["idle_trim"] is True and eff["idle_trim"]["enabled"] is True, eff["idle_trim"]
    assert eff["idle_trim"]["available"] is True
    deadline = time.monotonic() + 30
    while _get(base, "/edgectl/effective")["idle_trim"]["trims"] < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    trim = _get(base, "/edgectl/effective")["idle_trim"]
    assert trim["trims"] >= 1 and trim["in_flight"] == 0 and trim["last_ms"] is not None, trim


@pytest.mark.engine
def test_a_plan_with_fp8_kv_runs_with_fp8_kv(tmp_path, pulled_smollm2):
    """ISA-dependent: vLLM's CPU attention runs fp8 KV only with AVX-512 or AMX
    (vllm/v1/attention/backends/cpu_attn.py:540-543). There a plan with fp8 KV runs with it, read
    back in the engine; on AVX2 (the AVX2 tier, an AVX2 machine) the planner refuses it, exit 2,
    saying why and what to use."""
    fp8 = ["--max-model-len", "2048", "--kv-cache-dtype", "fp8_e4m3"]
    isa = isa_helpers.host_isa()
    if not (isa_helpers.avx512(isa) or isa["amx_tile"]):
        out = subprocess.run([PYTHON, "-m", "edgectl", "plan", "smollm2-135m", *fp8, "--json",
                              *isa_helpers.plan_args(tmp_path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and not out.stdout, (out.returncode, out.stdout[-500:])
        assert out.stderr.startswith("error: --kv-cache-dtype fp8_e4m3 cannot run here") and "AVX-512 or AMX" in \
            out.stderr and "--kv-cache-dtype auto" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
        return
    proc, log, base, plan = _start(tmp_path, fp8)
    try:
        assert plan["kv_cache_dtype"] == "fp8_e4m3"
        eff = _get(base, "/edgectl/effective")
        # read back in the engine: the attention layers' dtype, the KV tensors' own, their bytes (half of bf16's)
        assert (eff["kv_cache_dtype"], eff["kv_tensor_dtypes"]) == (["fp8_e4m3"], ["uint8"])
        assert eff["kv_cache_bytes"] == plan["kv_cache_bytes"] == 2048 // 128 * 128 * plan["kv_bytes_per_token"] + \
            128 * plan["kv_bytes_per_token"]  # 16 blocks + vLLM's null block, at 11520 B/token
        comp = _post(base, "/v1/completions", {"model": "smollm2-135m", "prompt": "The capital of France is",
                                               "max_tokens": 8, "temperature": 0})
        assert comp["usage"]["completion_tokens"] == 8
    finally:
        _stop(proc, log)
