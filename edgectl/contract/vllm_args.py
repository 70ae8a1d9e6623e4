"""A plan as vLLM server arguments: the one translation, used by the worker and the bench.

Pure: the control plane can show exactly what the worker will run (``deploy --dry-run``)
without importing vLLM.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from edgectl.contract.plan import Compilation, KvCacheDtype, Topology, WeightFormat
from edgectl.contract.whisper_names import ARCHITECTURE, ENGLISH_ONLY_ARCHITECTURE

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan

CPU_INT4 = "cpu_int4"
# vLLM's worker extension (``--worker-extension-cls``) that adds edgectl's read-back RPCs.
READBACK_EXTENSION = "edgectl_runtime.service.readback.ReadbackExtension"
# vLLM's --load-format for a directory serving a GGUF as it is (checkpoint format "gguf"): the
# loader edgectl's plugin registers (runtime/edgectl_runtime/vllm_plugin/gguf_loader.py).
GGUF_LOAD_FORMAT = "edgectl_gguf"
# vLLM's ``ir_op_priority`` that puts its RMSNorm IR ops on edgectl's fused op (the provider the
# plugin registers, runtime/edgectl_runtime/vllm_plugin/fused_norm.py); vLLM appends its own ``native`` after.
EDGECTL_NORMS = {"rms_norm": ["edgectl"], "fused_add_rms_norm": ["edgectl"]}


def fused_norms(plan: Plan) -> bool:
    """Whether the plan runs vLLM's norms on edgectl's fused op: with edgectl's kernels (w4a8), in
    eager mode (compiled, inductor fuses the norm into its graph itself). docs/kernels.md."""
    return plan.weight_format is WeightFormat.W4A8 and plan.compilation is Compilation.EAGER


def quantization_for(plan: Plan) -> str | None:
    """The ``--quantization`` a plan needs, or None when the checkpoint says it itself."""
    if plan.weight_format is WeightFormat.BF16:
        return None
    if plan.model.checkpoint_format in ("cpu_int4", "gptq", "awq"):
        return None  # config.json's quantization_config names the method
    if plan.weight_format in (WeightFormat.W4A16, WeightFormat.W4A16_VLLM, WeightFormat.W4A8, WeightFormat.W8A8):
        return CPU_INT4  # the plugin's kernel (torch, vLLM's or edgectl's) comes from EDGECTL_INT4_KERNEL
    raise ValueError(f"no runtime path for weight format {plan.weight_format!r}")


def server_args(plan: Plan, *, stock: bool = False) -> list[str]:
    """Arguments for vLLM's OpenAI server that carry every setting of the plan.

    ``stock=True`` drops what only edgectl's runtime understands (its quantization method, its
    GGUF loader and the in-process executor) — the bench's control arm: unmodified vLLM on the
    same model with the same context, concurrency and KV bytes (for a GGUF, on its bf16
    conversion: ``bench.core``).
    """
    args = [
        "--model", plan.model.path,
        "--served-model-name", plan.model.name,
        "--host", plan.serve.host,
        "--port", str(plan.serve.port),
        "--dtype", plan.dtype,
        "--max-model-len", str(plan.max_model_len),
        "--max-num-seqs", str(plan.max_num_seqs),
        "--max-num-batched-tokens", str(plan.max_num_batched_tokens),
        "--kv-cache-memory-bytes", str(plan.kv_cache_bytes),
        "--block-size", str(plan.block_size),
        "--kv-cache-dtype", KvCacheDtype(plan.kv_cache_dtype).vllm_name,
        "--seed", "0",
    ]
    if plan.compilation is Compilation.EAGER:
        args.append("--enforce-eager")
    if plan.vision is not None:
        # vLLM refuses more images itself and sizes its encoder budget and memory profiling for them, not
        # its default 999 (docs/vision-guard.md); --allowed-local-media-path is never passed, so vLLM
        # refuses file: URLs itself. A vLLM flag, not edgectl's: the stock arm keeps it.
        args += ["--limit-mm-per-prompt", json.dumps({"image": plan.vision.images.max_images_per_request})]
        # No cache of processed images: vLLM's (mm_processor_cache_gb, 4 GiB by default:
        # vllm/config/multimodal.py) keeps every distinct image's, ~76 MiB each for the shape model, so a
        # service under MemoryMax grows with each new frame until it is killed (docs/vision-guard.md).
        args += ["--mm-processor-cache-gb", "0"]
    if not stock:
        if plan.model.checkpoint_format == "gguf":
            args += ["--load-format", GGUF_LOAD_FORMAT]
        quant = quantization_for(plan)
        if quant:
            args += ["--quantization", quant]
        if plan.speech is not None:
            # edgectl's Whisper classes (edgectl/contract/whisper_names.py): the best logits exact, and an
            # English-only model prompted as it was trained (vLLM 0.32's prompt makes it answer nothing).
            arch = ARCHITECTURE if plan.speech.multilingual else ENGLISH_ONLY_ARCHITECTURE
            args += ["--hf-overrides", json.dumps({"architectures": [arch]})]
        if fused_norms(plan):
            args += ["--ir-op-priority", json.dumps(EDGECTL_NORMS, separators=(",", ":"))]
        if plan.topology is Topology.SINGLE_PROCESS:
            args += ["--distributed-executor-backend", "uni"]
        else:
            # vLLM's worker is another process: the read-back runs there, called by name
            # (a function cannot be sent to it).
            args += ["--worker-extension-cls", READBACK_EXTENSION]
        args += ["--shutdown-timeout", str(max(1, int(plan.timeouts.stop_s) - 5))]
    return args
