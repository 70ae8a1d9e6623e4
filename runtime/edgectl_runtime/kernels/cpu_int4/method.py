"""One layer's quantized weights inside vLLM: how they are created, loaded, packed and used.

A :class:`CpuInt4LinearMethod` serves a linear layer, an untied LM head, or a tied embedding
that the LM head also reads (``role``), on one of three kernels, each a class behind one
interface (``kernel.py``; chosen once, ``kernel_choice.py``): PyTorch's int4 op (``torch``),
vLLM's ``cpu_gemm_wna16`` (``vllm``), or edgectl's own library (``edgectl``: W4 blocks for linear
layers, W4 or W8 for the head). A layer a kernel cannot hold delegates to vLLM's dense method and
says why (read back by ``readback.describe_model``). Nothing but the packed weight (and, for
PyTorch's and vLLM's kernels, their scales) stays resident.

Loading keeps the peak low:

- linear layers layer by layer, as each layer's last checkpoint shard arrives (vLLM's "online
  quantization" path, ``uses_meta_device`` + ``initialize_online_processing``,
  ``vllm/model_executor/model_loader/reload/layerwise.py``);
- the embedding / LM head (one tensor) straight from the checkpoint tensor as it arrives, so no
  dense copy of the largest matrix is ever materialized;
- with ``EDGECTL_LAYERWISE_REPACK=0``, the naive path: everything dense first, packed after.

Sources: a bf16/fp16/fp32 checkpoint quantized at load; a portable checkpoint written by
``edgectl quantize`` (group-wise int4); a 4-bit GPTQ (desc_act=false) or AWQ GEMM checkpoint,
converted exactly (``checkpoint.py``). For edgectl's W4 a group-wise source keeps its q and
becomes blocks of 32 (``formats.blocks.from_groups``); for PyTorch's kernel its groups are split
into the kernel's.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    UnquantizedEmbeddingMethod,
)
from vllm.model_executor.model_loader.reload.layerwise import (
    get_layerwise_info,
    initialize_online_processing,
)
from vllm.model_executor.utils import set_weight_attrs

from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, choose_group_size
from edgectl_runtime.formats import ggml
from edgectl_runtime.kernels.cpu_int4.checkpoint import Int4Checkpoint, ParamSpec
from edgectl_runtime.kernels.cpu_int4.config import (
    CpuInt4Settings,
    gguf_load_format,
    tied_embeddings,
)
from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel, Int4Layer
from edgectl_runtime.kernels.cpu_int4.kernel_choice import (
    fit_kernel,
    head_kernel,
    kernel_class,
)
from edgectl_runtime.kernels.cpu_int4.names import INFO_ATTR, W_ATTR

logger = logging.getLogger("edgectl.cpu_int4")

_PREQUANTIZED = ("gptq", "awq")


class CpuInt4LinearMethod(LinearMethodBase):
    """See the module docstring."""

    def __init__(self, config: CpuInt4Settings, role: str, prefix: str = "") -> None:
        self.config = config
        self.role = role
        self.prefix = prefix
        self.dense: QuantizeMethodBase | None = None
        self.tied_source: torch.nn.Module | None = None  # lm_head tied to a quantized embedding
        # Per layer: the linear layers' kernel, or the head's own choice.
        linear = kernel_class(config.kernel)
        self.kernel_class: type[Int4Kernel] = linear if role == "linear" else head_kernel(linear, config.lm_head)
        bits = config.linear_bits if role == "linear" else 8 if config.lm_head == "int8" else 4
        self.spec = Int4Layer(prefix=prefix, role=role, bits=bits)
        self.layer_kernel: Int4Kernel | None = None  # built when the layer's shape is known
        # Layer-wise processing is vLLM's online-quantization path: the weight is created on the
        # meta device and the layer is materialized, loaded and packed when its last shard
        # arrives. Off = the naive path (whole model dense, then packed).
        self.uses_meta_device = bool(config.layerwise)
        # Loaded by edgectl's GGUF loader (gguf_loader.py): a kernel that takes the file's blocks
        # gets them (load_gguf); other kernels get dequantized weights like any checkpoint.
        self.takes_gguf = gguf_load_format() and self.kernel_class.takes_gguf_blocks

    # --- the layer's facts, as read back (readback.py, tests)

    @property
    def kernel(self) -> str:
        return self.kernel_class.name

    @property
    def bits(self) -> int:
        return self.spec.bits

    @property
    def group_size(self) -> int:
        return self.spec.group_size

    @property
    def n(self) -> int:
        return self.spec.n

    @property
    def k(self) -> int:
        return self.spec.k

    @property
    def out_dtype(self) -> torch.dtype:
        return self.spec.out_dtype

    def _use(self, kernel: type[Int4Kernel], **facts) -> None:
        """The layer's kernel, built for the layer's facts as known now."""
        self.kernel_class = kernel
        self.spec = dataclasses.replace(self.spec, **facts)
        self.layer_kernel = kernel(self.spec, self.config.checkpoint_tensors())

    # --- weights

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        k = input_size_per_partition
        sizes = list(output_partition_sizes)
        n = sum(sizes)
        self.spec = dataclasses.replace(self.spec, n=n, k=k, out_dtype=params_dtype)
        weight_loader = extra_weight_attrs.get("weight_loader")
        if self.config.source in _PREQUANTIZED and self.role == "linear":
            self._create_prequantized(layer, k, sizes, weight_loader)
            return
        if self.role == "lm_head" and tied_embeddings():
            # Tied: ParallelLMHead.tie_weights() hands us the embedding right after this; the
            # head owns no weight of its own (nothing to load, nothing resident).
            setattr(layer, INFO_ATTR, {"role": self.role, "format": "tied", "reason": "tied to the embedding"})
            self.uses_meta_device = self.takes_gguf = False
            return
        if self.takes_gguf:
            self._create_gguf_pending(layer, sizes)
            return
        stored_groups = self.config.source == "portable" and self.role == "linear"
        ok, reason = self.kernel_class.holds(sizes, k, self.bits, self.config.group_size, stored_groups)
        if not ok:
            self._make_dense(layer, reason, input_size_per_partition, sizes, input_size, output_size,
                             params_dtype, **extra_weight_attrs)
            return
        kernel, note = fit_kernel(self.kernel_class, n, k)
        source_group = self.config_group(k)
        self._use(kernel, source_group=source_group, group_size=kernel.kernel_group(source_group))
        if stored_groups:
            specs = Int4Checkpoint.portable_params(n, k, k // source_group, params_dtype)
            self._register(layer, specs, weight_loader)
        elif self.role != "linear" and self.uses_meta_device:
            # The embedding / LM head arrives as one tensor (the largest of a small model: 57 MB of
            # SmolLM2's 269): quantize it as it arrives, block by block, straight from the
            # checkpoint tensor, instead of materializing a dense copy first.
            self._register(layer, (("weight", (n, k), params_dtype, {"input_dim": 1, "output_dim": 0}),),
                           self._arriving_loader(layer))
        else:
            self._register(layer, (self._dense_weight_spec(layer, n, k, params_dtype),), weight_loader)
        layer.logical_widths = sizes
        self._describe(layer, reason + note, "portable" if stored_groups else "dense")
        if self.uses_meta_device and self.role == "linear":  # the head's arriving loader packs it
            initialize_online_processing(layer)

    def config_group(self, k: int) -> int:
        """The group of a portable checkpoint's stored tensors (the rule the writer used), and of
        the values a dense checkpoint is quantized in."""
        return choose_group_size(k, self.config.group_size) or 0

    def _register(self, layer: torch.nn.Module, specs: tuple[ParamSpec, ...], weight_loader) -> None:
        """Empty parameters (on the meta device on the layer-wise path) for vLLM's loaders to fill."""
        device = "meta" if self.uses_meta_device else None
        for name, shape, dtype, attrs in specs:
            p = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
            set_weight_attrs(p, {**attrs, "weight_loader": weight_loader})
            layer.register_parameter(name, p)

    def _dense_weight_spec(self, layer: torch.nn.Module, n: int, k: int, dtype: torch.dtype) -> ParamSpec:
        attrs = {"input_dim": 1, "output_dim": 0}
        org = getattr(layer, "org_vocab_size", None)
        if self.role != "linear" and org is not None and org < n:
            # vLLM pads the vocabulary; the padded rows are zero-filled by the loader, so the
            # layer is complete once the real rows have arrived.
            attrs["weight_loader_numel"] = org * k
        return ("weight", (n, k), dtype, attrs)

    def _describe(self, layer: torch.nn.Module, reason: str, source: str) -> None:
        """The layer's read-back entry (``readback.py``)."""
        setattr(layer, INFO_ATTR, {"role": self.role, "format": self.kernel_class.format_name(self.bits, self.group_size),
                                   "kernel": self.kernel, "bits": self.bits, "group_size": self.group_size,
                                   "reason": reason, "source": source, "out_features": self.n, "in_features": self.k})

    def _create_gguf_pending(self, layer: torch.nn.Module, sizes: list[int]) -> None:
        """Nothing to allocate: load_gguf() installs the packed blocks in one step."""
        self.uses_meta_device = False
        self._use(self.kernel_class, group_size=self.kernel_class.kernel_group(0))
        layer.logical_widths = sizes
        setattr(layer, INFO_ATTR, {"role": self.role, "format": "pending", "kernel": self.kernel,
                                   "bits": self.bits, "group_size": self.group_size, "source": "gguf",
                                   "reason": "GGUF blocks", "out_features": self.n, "in_features": self.k})

    def load_gguf(self, layer: torch.nn.Module, parts: list[tuple[str, torch.Tensor, int]]) -> None:
        """Install a layer from GGUF tensors: ``(ggml type, raw uint8 rows, k)`` per part, in
        output order (q, k, v). A linear layer keeps its file's precision — W4 where every part
        is a 4-bit type, W5 where its parts are Q5_0 (or Q4_0 beside it), W8 where one is 5 to 8 bits
        otherwise (Q8_0, Q6_K, Q5_K, ...), the plan's bits for floats (``gguf_types.layer_bits``, which
        the planner sizes the layer by); the embedding / head takes the plan's head format. How each part converts is the
        layer's read-back reason (``formats.ggml.conversion``)."""
        types = [t for t, _, _ in parts]
        bits = ggml.layer_bits(types, self.bits) if self.role == "linear" else self.bits
        rows = sum(raw.shape[0] for _, raw, _ in parts)
        if any(k != self.k for _, _, k in parts) or rows > self.n:
            raise ValueError(f"cpu_int4: {self.prefix}: GGUF tensors {[tuple(r.shape) for _, r, _ in parts]} "
                             f"do not fit [{self.n}, {self.k}]")
        packed = self.kernel_class.pack_gguf(parts, self.n, self.k, bits)
        self._use(self.kernel_class, bits=bits)
        getattr(layer, INFO_ATTR).update(
            format=self.kernel_class.format_name(bits, self.group_size), bits=bits,
            reason="; ".join(sorted({ggml.conversion(t, bits) for t in types})))
        self.layer_kernel.install(layer, {W_ATTR: packed})

    def _create_prequantized(self, layer: torch.nn.Module, k: int, sizes: list[int], weight_loader) -> None:
        """Parameters shaped like the GPTQ/AWQ checkpoint's tensors (``checkpoint.py``);
        converted and packed in process_weights_after_loading."""
        cfg, n = self.config, self.n
        ckpt_group = cfg.ckpt_group if cfg.ckpt_group > 0 else k
        group = self._prequantized_group(k, sizes, ckpt_group)
        kernel, _ = fit_kernel(self.kernel_class, n, k)
        self._use(kernel, source_group=group, group_size=kernel.kernel_group(group))
        self._register(layer, cfg.checkpoint_tensors().prequantized_params(n, k, k // ckpt_group), weight_loader)
        layer.logical_widths = sizes
        self._describe(layer, f"converted from {cfg.source.upper()} (group {cfg.ckpt_group})", cfg.source)
        if self.uses_meta_device:
            initialize_online_processing(layer)

    def _prequantized_group(self, k: int, sizes: list[int], ckpt_group: int) -> int:
        """The int4 group a GPTQ/AWQ checkpoint's values are read in; refused if the layer
        cannot be held."""
        group = choose_group_size(ckpt_group, max(ALLOWED_GROUP_SIZES)) if k % ckpt_group == 0 else None
        problems = []
        if group is None:
            problems.append(f"no int4 kernel group size divides the checkpoint's group {ckpt_group}")
        if any(part % 16 for part in sizes):
            problems.append(f"output sizes {sizes} are not multiples of 16")
        if k % 8:
            problems.append(f"in_features {k} is not a multiple of 8")
        if problems:
            raise ValueError(f"cpu_int4 cannot hold {self.prefix} [{self.n}, {k}] from this "
                             f"{self.config.source.upper()} checkpoint: {'; '.join(problems)}")
        return group

    def _arriving_loader(self, layer: torch.nn.Module):
        n, k, dtype = self.n, self.k, self.out_dtype

        def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args, **kwargs) -> None:
            if loaded_weight.dim() != 2 or loaded_weight.shape[0] > n or loaded_weight.shape[1] != k:
                raise ValueError(f"cpu_int4: {self.prefix}: checkpoint tensor {tuple(loaded_weight.shape)} does "
                                 f"not fit [{n}, {k}]")
            if not self.layer_kernel.pack_arriving(layer, loaded_weight, dtype):
                self._fall_back_to_dense(layer, dtype)

        return load

    def _fall_back_to_dense(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        logger.warning("cpu_int4: packed-row lookup failed verification on this machine; the tied "
                       "embedding stays in %s", dtype)
        self.dense = UnquantizedEmbeddingMethod()
        getattr(layer, INFO_ATTR).update(format=str(dtype).replace("torch.", ""),
                                         reason="packed-row lookup failed verification")

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
                                   "reason": "the embedding is not quantized"})
        return layer

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if self.uses_meta_device and self.role == "linear":
            self._refuse_incomplete(layer)
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
        if not self.layer_kernel.process_weights(layer, dtype):
            self._fall_back_to_dense(layer, layer.weight.dtype)
            self.dense.process_weights_after_loading(layer)

    def _refuse_incomplete(self, layer: torch.nn.Module) -> None:
        """vLLM's layer-wise path materializes a layer the checkpoint never fed (empty memory)
        and processes it silently (layerwise.py finalize_layerwise_processing), and skips its
        missing-weights check for quantized models: a checkpoint missing a tensor would load and
        then answer garbage. Refuse instead."""
        info = get_layerwise_info(layer)
        if info.can_load() and info.load_numel < (info.load_numel_total or 0):
            missing = "no weights" if info.load_numel <= 0 else \
                f"{info.load_numel} of {info.load_numel_total} weight values"
            raise ValueError(f"cpu_int4: the checkpoint gave {self.prefix} {missing}: "
                             "the model's safetensors are incomplete")

    # --- compute

    def _source(self) -> tuple["CpuInt4LinearMethod", torch.nn.Module | None]:
        """The method and module holding the packed weight (a tied head reads its embedding's)."""
        if self.tied_source is not None:
            return self.tied_source.quant_method, self.tied_source
        return self, None

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.apply(layer, x, bias)
        method, holder = self._source()
        out = method.layer_kernel.apply(holder if holder is not None else layer, x)
        if bias is not None:
            out = out + bias
        return out

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.embedding(layer, input_)
        return self.layer_kernel.embedding(layer, input_)


def unpack_layer(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q uint8 [N, K], scales [N, K/g], zeros [N, K/g])`` of a 4-bit layer, read back from the
    kernel's tensors, as group-wise int4 (``w = (q - 8) * scale + zero``; edgectl's W4 as groups of
    32 with fp32 scales and zeros, K padded to a multiple of 32). For tests and read-back;
    allocates an unpacked copy."""
    return layer.quant_method.layer_kernel.unpack(layer)


def dequantized_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The fp32 weight ``[N, K]`` a quantized layer's kernel multiplies by (any kernel, 4 or 8 bits)."""
    return layer.quant_method.layer_kernel.dequantize(layer)
