"""The settings of the ``cpu_int4`` quantization method, and where they come from.

vLLM builds the config object in the front-end process and pickles it to the engine and worker
processes. Its settings come from, in order:

1. a checkpoint's ``config.json`` ``quantization_config`` (:meth:`CpuInt4Config.from_config`):
   a portable checkpoint written by ``edgectl quantize``, or a 4-bit GPTQ / AWQ one, fixes what
   the stored data fixes (its group size);
2. a bf16/fp16/fp32 checkpoint served with ``quantization="cpu_int4"``: vLLM calls
   ``CpuInt4Config()`` with no arguments, so the settings come from the runtime environment
   (``edgectl.contract.environment``), which the worker sets from the plan before vLLM starts:
   ``EDGECTL_INT4_KERNEL`` (the weight format of the linear layers), ``EDGECTL_LINEAR_BITS``,
   ``EDGECTL_LM_HEAD``, ``EDGECTL_INT4_GROUP_SIZE``, ``EDGECTL_LAYERWISE_REPACK``,
   ``EDGECTL_INT4_PARTS``;
3. or explicitly, ``hf_overrides={"quantization_config_dict_json": '{"kernel": "edgectl"}'}``
   (:meth:`CpuInt4Config.from_config_dict_json`), which wins over the environment.

Kernels of the linear layers (the plan's weight format in brackets):

- ``torch`` [w4a16]: PyTorch's ``_weight_int4pack_mm_for_cpu``, groups of 32-256, activations
  in the model dtype (``ops/tinygemm.py``);
- ``vllm`` [w4a16-vllm]: vLLM's ``cpu_gemm_wna16``, only where its C library registers it
  (``ops/wna16.py``);
- ``edgectl`` [w4a8]: edgectl's own library, blocks of 32 with a scale and a minimum (GGUF
  Q4_1), activations quantized to int8 per call (``ops/``, ``formats/blocks.py``); with
  ``EDGECTL_LINEAR_BITS=8`` [w8a8] its W8 blocks of 32 with one scale (GGUF Q8_0) instead.

The LM head (``lm_head``): ``dense`` (the model dtype), ``int4`` (the linear layers' 4-bit
family: edgectl's W4 with the ``edgectl`` kernel, PyTorch's otherwise) or ``int8`` (edgectl's W8,
blocks of 32, one scale: GGUF Q8_0). A tied embedding is stored once, in the head's format; a
lookup dequantizes only the rows it needs.

vLLM's compile cache key includes the method's *name* only (``VllmConfig.compute_hash``), not
these settings: a caller that changes them between compiled runs should pass them in
``additional_config`` (which is hashed).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from edgectl.contract import environment as runtime_env
from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, PORTABLE_FORMAT
from edgectl_runtime.kernels.cpu_int4.checkpoint import Int4Checkpoint
from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel
from edgectl_runtime.kernels.cpu_int4.kernel_choice import (
    KERNELS,
    W8_KERNEL,
    head_kernel,
    kernel_class,
)
from edgectl_runtime.kernels.cpu_int4.names import NAME

LM_HEAD_FORMATS = ("dense", "int4", "int8")
SOURCES = ("dense", "portable", "gptq", "awq")
PARTS = ("all", "language-model")


def current_model_config():
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    return cfg.model_config if cfg is not None else None


def tied_embeddings() -> bool:
    mc = current_model_config()
    if mc is None:
        return False
    text = mc.hf_config.get_text_config() if hasattr(mc.hf_config, "get_text_config") else mc.hf_config
    return bool(getattr(text, "tie_word_embeddings", False))


def gguf_load_format() -> bool:
    """Whether the model is being loaded by edgectl's GGUF loader (``gguf_loader.py``)."""
    from vllm.config import get_current_vllm_config_or_none

    from edgectl.contract.vllm_args import GGUF_LOAD_FORMAT

    cfg = get_current_vllm_config_or_none()
    return cfg is not None and str(cfg.load_config.load_format) == GGUF_LOAD_FORMAT


def _lm_head_format(value: bool | str | None) -> str | None:
    """``True``/``False`` (the setting's old boolean form) or a format name."""
    if value is None or isinstance(value, str):
        return value
    return "int4" if value else "dense"


class CpuInt4Settings(QuantizationConfig):
    """Settings of the ``cpu_int4`` method; see the module docstring for where they come from.
    vLLM's config API but for the choice of each layer's method, which the registered subclass
    adds (``registration.CpuInt4Config``)."""

    def __init__(self, group_size: int | None = None, lm_head: bool | str | None = None,
                 layerwise: bool | None = None, source: str = "dense",
                 checkpoint: dict[str, Any] | None = None, kernel: str | None = None,
                 linear_bits: int | None = None) -> None:
        super().__init__()
        environ = os.environ
        self.group_size = int(group_size if group_size is not None
                              else runtime_env.read_int("EDGECTL_INT4_GROUP_SIZE", environ))
        if self.group_size not in ALLOWED_GROUP_SIZES:
            raise ValueError(f"cpu_int4: group size {self.group_size} is not supported; use one of "
                             f"{', '.join(str(g) for g in ALLOWED_GROUP_SIZES)}")
        head = _lm_head_format(lm_head)
        self.lm_head = head if head is not None else runtime_env.read("EDGECTL_LM_HEAD", environ)
        if self.lm_head not in LM_HEAD_FORMATS:
            raise ValueError(f"cpu_int4: LM head format {self.lm_head!r} is not one of {', '.join(LM_HEAD_FORMATS)}")
        self.layerwise = bool(layerwise if layerwise is not None
                              else runtime_env.read_bool("EDGECTL_LAYERWISE_REPACK", environ))
        self.kernel = kernel if kernel is not None else runtime_env.read("EDGECTL_INT4_KERNEL", environ)
        if self.kernel not in KERNELS:
            raise ValueError(f"cpu_int4: kernel {self.kernel!r} is not one of {', '.join(KERNELS)}")
        # the bits of linear layers quantized here (a stored 4-bit checkpoint or a GGUF's blocks keep their own)
        self.linear_bits = int(linear_bits if linear_bits is not None
                               else runtime_env.read_int("EDGECTL_LINEAR_BITS", environ))
        if self.linear_bits not in (4, 8):
            raise ValueError(f"cpu_int4: linear layers of {self.linear_bits} bits; use 4 or 8")
        # "language-model": a multimodal model's encoders and connectors stay dense (registration.py)
        self.parts = runtime_env.read("EDGECTL_INT4_PARTS", environ)
        if self.parts not in PARTS:
            raise ValueError(f"cpu_int4: parts {self.parts!r} is not one of {', '.join(PARTS)}")
        if self.linear_bits == 8 and kernel_class(self.kernel) is not W8_KERNEL:
            raise ValueError(f"cpu_int4: 8-bit linear layers run on edgectl's kernels, not {self.kernel!r}")
        for kernel in self.kernels_in_use():
            kernel.require()
        if source not in SOURCES:
            raise ValueError(f"cpu_int4: unknown source {source!r}")
        self.source = source  # "dense": quantize a bf16/fp16/fp32 checkpoint at load
        if self.linear_bits == 8 and source != "dense":
            raise ValueError(f"cpu_int4: 8-bit linear layers are quantized at load from a dense checkpoint, and this "
                             f"one is {source}")
        self.checkpoint = dict(checkpoint or {})
        # GPTQ / AWQ checkpoints converted at load: their own group (-1 = one per output channel)
        self.ckpt_group = int(self.checkpoint.get("group_size", self.checkpoint.get("q_group_size", -1)) or -1)
        self.ckpt_sym = bool(self.checkpoint.get("sym", True))
        self.ckpt_zero_offset = 0 if self.checkpoint.get("checkpoint_format") == "gptq_v2" else 1
        self.not_convert = list(self.checkpoint.get("modules_to_not_convert") or [])

    def kernels_in_use(self) -> list[type[Int4Kernel]]:
        """The linear layers' kernel, then the LM head's where it is another."""
        linear = kernel_class(self.kernel)
        head = head_kernel(linear, self.lm_head)
        return [linear] if head is linear else [linear, head]

    def checkpoint_tensors(self) -> Int4Checkpoint:
        """What the checkpoint stores, for a layer's kernel to read it back."""
        return Int4Checkpoint(self.source, sym=self.ckpt_sym, zero_offset=self.ckpt_zero_offset)

    def __repr__(self) -> str:
        return (f"CpuInt4Config(kernel={self.kernel!r}, group_size={self.group_size}, lm_head={self.lm_head!r}, "
                f"linear_bits={self.linear_bits}, layerwise={self.layerwise}, source={self.source!r})")

    def describe(self) -> dict[str, Any]:
        out = {"group_size": self.group_size, "lm_head": self.lm_head, "layerwise": self.layerwise,
               "source": self.source, "kernel": self.kernel, "parts": self.parts}
        if self.source in ("gptq", "awq"):
            out["checkpoint_group_size"] = self.ckpt_group
        for kernel in self.kernels_in_use():
            out.update(kernel.describe())
        return out

    @property
    def head_kernel(self) -> str:
        """The kernel of a quantized LM head / tied embedding: edgectl's for int8 and for int4
        next to edgectl's linear layers, PyTorch's int4 kernel otherwise (vLLM's has no lookup)."""
        return head_kernel(kernel_class(self.kernel), self.lm_head).name

    # --- QuantizationConfig API

    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # a bf16 checkpoint has none: vLLM then calls CpuInt4Config()

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """Claim a 4-bit GPTQ/AWQ checkpoint when ``quantization="cpu_int4"`` is asked for: it is
        converted at load to a kernel that exists on every CPU, where vLLM's own W4A16 kernel
        exists only in its AVX-512 libraries (``diagnostics/report.py``)."""
        if user_quant == NAME and hf_quant_cfg.get("quant_method") in ("gptq", "awq"):
            return NAME
        return None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CpuInt4Settings":
        """From a checkpoint's ``quantization_config``: a portable checkpoint, or a GPTQ/AWQ one."""
        method = config.get("quant_method")
        if method in ("gptq", "awq"):
            return cls._from_gptq_awq(config)
        fmt = config.get("format")
        if fmt != PORTABLE_FORMAT:
            raise ValueError(f"cpu_int4: checkpoint format {fmt!r} is not {PORTABLE_FORMAT!r}; "
                             "write it with `edgectl quantize`")
        return cls(group_size=int(config["group_size"]), lm_head=config.get("lm_head"),
                   layerwise=config.get("layerwise"), source="portable", checkpoint=config,
                   kernel=config.get("kernel"))

    @classmethod
    def _from_gptq_awq(cls, config: dict[str, Any]) -> "CpuInt4Settings":
        method = config["quant_method"]
        bits = config.get("bits", config.get("w_bit"))
        if bits != 4:
            raise ValueError(f"cpu_int4 converts 4-bit {method.upper()} checkpoints; this one has {bits} bits")
        group = int(config.get("group_size", config.get("q_group_size", -1)) or -1)
        if 0 < group < min(ALLOWED_GROUP_SIZES):
            raise ValueError(f"cpu_int4: the checkpoint's group size {group} is finer than the int4 kernel's "
                             f"smallest ({min(ALLOWED_GROUP_SIZES)})")
        if method == "gptq" and config.get("desc_act"):
            raise ValueError("cpu_int4: act-order GPTQ (desc_act=true) permutes the input rows per group; "
                             "use a checkpoint quantized with desc_act=false")
        if method == "awq":
            if str(config.get("version", "gemm")).lower() != "gemm":
                raise ValueError(f"cpu_int4 converts AWQ GEMM checkpoints; this one is {config.get('version')}")
            if not config.get("zero_point", True):
                raise ValueError("cpu_int4 converts AWQ checkpoints with zero points only")
        # group_size (from the environment) then only applies to an LM head quantized at load.
        return cls(group_size=None, source=method, checkpoint=config)

    @classmethod
    def from_config_dict_json(cls, text: str) -> "CpuInt4Settings":
        """From ``hf_overrides={"quantization_config_dict_json": ...}`` on a dense checkpoint."""
        data = json.loads(text)
        unknown = set(data) - {"group_size", "lm_head", "layerwise", "kernel", "quant_method"}
        if unknown:
            raise ValueError(f"cpu_int4: unknown settings {sorted(unknown)}; "
                             "known: group_size, lm_head, layerwise, kernel")
        return cls(group_size=data.get("group_size"), lm_head=data.get("lm_head"),
                   layerwise=data.get("layerwise"), kernel=data.get("kernel"))
