"""The one way the control plane starts runtime code.

Every runtime program — the worker a unit, ``edgectl serve`` and the bench start; the offline
tools ``models pull`` and ``quantize`` start — runs as ``PYTHON -P -m MODULE ARGS`` in the
runtime interpreter (``EDGECTL_RUNTIME_PYTHON``), never by file path, with the environment
:func:`environment` builds. ``-P``: the working directory is not put on ``sys.path``, so nothing
there can shadow a module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from edgectl import paths
from edgectl.contract.environment import OFFLINE, SYSTEMD_NOTIFY

# What the control plane starts, by what it is (runtime/edgectl_runtime/…).
WORKER = "edgectl_runtime.service.worker"  # serves a plan: the unit's main process
CONVERT_GGUF = "edgectl_runtime.tools.convert_gguf"  # a GGUF -> the directory the worker loads
CONVERT_CT2_WHISPER = "edgectl_runtime.tools.convert_ct2_whisper"  # CTranslate2 Whisper -> Hugging Face
CONVERT_GGUF_VLM = "edgectl_runtime.tools.convert_gguf_vlm"  # llama.cpp's VLM GGUF pair -> Hugging Face
SYNTH_MODEL = "edgectl_runtime.tools.synth_model"  # a seeded random model of a real shape
SYNTH_VLM = "edgectl_runtime.tools.synth_vlm"  # a VLM's shape: a real language model, a seeded random vision tower
QUANTIZE = "edgectl_runtime.tools.quantize"  # a bf16 checkpoint -> edgectl's portable int4 one
TOKENIZER_COST = "edgectl_runtime.introspect.tokenizer_cost"  # what a tokenizer holds in the worker
SPEECH_ANCHOR = "edgectl_runtime.tools.speech_anchor"  # faster-whisper / whisper.cpp on a clip set, timed
WHISPER_GGML = "edgectl_runtime.tools.whisper_ggml"  # a converted Whisper directory -> whisper.cpp's ggml file
VISION_TOWER_AGREEMENT = "edgectl_runtime.tools.vision_tower_agreement"  # vLLM's vision tower vs transformers'
ENTRY_POINTS = (WORKER, CONVERT_GGUF, CONVERT_CT2_WHISPER, CONVERT_GGUF_VLM, SYNTH_MODEL, SYNTH_VLM, QUANTIZE,
                TOKENIZER_COST, SPEECH_ANCHOR, WHISPER_GGML, VISION_TOWER_AGREEMENT)


def command(python: str, module: str, args: Sequence[str] = (), *, optimize: int = 0) -> list[str]:
    """``python [-O…] -P -m module args``. ``optimize``: the worker's ``levers.python_optimize``
    (set when the interpreter starts, so it is on the command line)."""
    if module not in ENTRY_POINTS:
        raise ValueError(f"{module} is not one of the runtime's entry points ({', '.join(ENTRY_POINTS)})")
    flag = ["-" + "O" * optimize] if optimize else []
    return [python, *flag, "-P", "-m", module, *args]


def worker_command(python: str, plan_path: str, python_optimize: int = 0) -> list[str]:
    """The worker's command line: the runtime interpreter and the plan file, nothing else."""
    return command(python, WORKER, ["--plan", plan_path], optimize=python_optimize)


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a runtime program starts with: ``environ`` without systemd's notify
    variables (they are meant for a service's main process, not for a child it starts), with the
    offline switches (nothing may reach a model hub), and — when edgectl runs from a checkout —
    the checkout's runtime first on ``PYTHONPATH``, so a checkout never runs an older installed copy."""
    env = {k: v for k, v in environ.items() if k not in SYSTEMD_NOTIFY}
    env.update(OFFLINE)
    root = paths.checkout()
    if root is not None:
        entries = [str(root), str(root / "runtime"), *filter(None, [env.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(entries)
    return env
