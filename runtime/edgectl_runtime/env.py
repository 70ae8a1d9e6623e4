"""Every environment variable the runtime (worker, vLLM plugin) reads, declared once.

Same style as ``edgectl/envvars.py``: nothing reads ``os.environ`` directly; callers pass a
mapping. The worker puts the plan's levers into its own environment before vLLM starts, and
vLLM's spawned EngineCore and worker processes inherit them; a benchmark A/Bs a lever by
changing one variable.

Defaults are those of *unmodified vLLM* wherever a lever changes vLLM's own behaviour
(``EDGECTL_ROPE_CAP``): the plugin is installed in the venv as an entry point and therefore
loads into every vLLM process there, including a benchmark's "stock" control arm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str
    default: str
    choices: tuple[str, ...] | None = None


_BOOL = ("0", "1")

REGISTRY: dict[str, EnvVar] = {
    v.name: v
    for v in [
        EnvVar("EDGECTL_ROPE_CAP",
               "1: build the RoPE cos/sin table only up to max_model_len rows (plain, Llama3, "
               "single-factor linear and YaRN rotary classes), without the fp32 transient of the "
               "full table; 0: vLLM's table of max_position_embeddings rows", "0", _BOOL),
        EnvVar("EDGECTL_LAYERWISE_REPACK",
               "1: cpu_int4 quantizes and packs each layer as soon as its last checkpoint shard "
               "arrives, and the embedding / LM head straight from the checkpoint tensor (no dense "
               "copy of the model is ever resident); 0: the naive path, the whole model is loaded in "
               "the model dtype first and packed afterwards (SmolLM2: +90 MB anonymous memory left "
               "resident by the freed dense copy)", "1", _BOOL),
        EnvVar("EDGECTL_INT4_LM_HEAD",
               "1: cpu_int4 also quantizes the LM head (a tied embedding is quantized once; the "
               "lookup dequantizes only the rows it needs); 0: the LM head stays in the model dtype",
               "0", _BOOL),
        EnvVar("EDGECTL_INT4_GROUP_SIZE",
               "preferred int4 group size when a model is quantized at load (--quantization "
               "cpu_int4 on a bf16/fp16 checkpoint); per layer the shared rule in "
               "edgectl/contract/int4_layout.py picks a size that divides K", str(DEFAULT_GROUP_SIZE),
               tuple(str(g) for g in ALLOWED_GROUP_SIZES)),
        EnvVar("EDGECTL_INT4_KERNEL",
               "the kernel of cpu_int4's linear layers: torch (PyTorch's _weight_int4pack_mm_for_cpu, "
               "every ISA; the plan's w4a16) or vllm (vLLM's cpu_gemm_wna16, only where its C library "
               "registers it; the plan's w4a16-vllm). The tied embedding / LM head always uses torch's",
               "torch", ("torch", "vllm")),
    ]
}


def read(name: str, environ: Mapping[str, str]) -> str:
    """The value of a registered variable in ``environ`` (empty means unset), or its default.

    A value outside the variable's choices raises ValueError naming the variable and the
    values it accepts: a mistyped lever must not silently run the other arm of a benchmark.
    """
    var = REGISTRY[name]  # KeyError: register the variable first
    value = environ.get(name, "").strip()
    if not value:
        return var.default
    if var.choices is not None and value not in var.choices:
        raise ValueError(f"{name}={value!r} is not valid: use one of {', '.join(var.choices)}")
    return value


def read_bool(name: str, environ: Mapping[str, str]) -> bool:
    return read(name, environ) == "1"


def read_int(name: str, environ: Mapping[str, str]) -> int:
    return int(read(name, environ))


def snapshot(environ: Mapping[str, str]) -> dict[str, str]:
    """The effective value of every runtime variable (for read-back and bench provenance)."""
    return {name: read(name, environ) for name in REGISTRY}
