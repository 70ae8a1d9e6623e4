"""One layer's quantized weights inside vLLM: how they are created, loaded, packed and used.

A :class:`CpuInt4LinearMethod` serves a linear layer, an untied LM head, or a tied embedding
that the LM head also reads (``role``), on one of three kernels (``config.py``): PyTorch's int4
op (``torch``), vLLM's ``cpu_gemm_wna16`` (``vllm``), or edgectl's own library (``edgectl``:
W4 blocks for linear layers, W4 or W8 for the head). A layer a kernel cannot hold delegates to
vLLM's dense method and says why (read back by ``readback.describe_model``). Nothing but the
packed weight (and, for PyTorch's and vLLM's kernels, their scales) stays resident.

Loading keeps the peak low:

- linear layers layer by layer, as each layer's last checkpoint shard arrives (vLLM's "online
  quantization" path, ``uses_meta_device`` + ``initialize_online_processing``,
  ``vllm/model_executor/model_loader/reload/layerwise.py``);
- the embedding / LM head (one tensor) straight from the checkpoint tensor as it arrives, so no
  dense copy of the largest matrix is ever materialized;
- with ``EDGECTL_LAYERWISE_REPACK=0``, the naive path: everything dense first, packed after.

Sources: a bf16/fp16/fp32 checkpoint quantized at load; a portable checkpoint written by
``edgectl quantize`` (group-wise int4); a 4-bit GPTQ (desc_act=false) or AWQ GEMM checkpoint,
converted exactly. For edgectl's W4 a group-wise source keeps its q and becomes blocks of 32
(``formats.blocks.from_groups``); for PyTorch's kernel its groups are split into the kernel's.
"""

from __future__ import annotations

import logging

import torch

from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info, initialize_online_processing
from vllm.model_executor.utils import set_weight_attrs

from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, choose_group_size, quantizable_partitions
from edgectl_runtime.kernels.cpu_int4.config import NAME, CpuInt4Config, gguf_load_format, tied_embeddings
from edgectl_runtime.formats import blocks, ggml
from edgectl_runtime.formats.gptq_awq import awq_to_int4, gptq_to_int4
from edgectl_runtime.formats.groups import dequantize_int4, quantize_int4, unpack_nibbles
from edgectl_runtime.kernels.ops.tinygemm import (
    PACK_BLOCK_ROWS,
    LayoutUnknown,
    gather_packed_rows,
    int4_matmul,
    kernel_pack,
    packed_layout,
    scales_and_zeros,
)
from edgectl_runtime.kernels.ops.wna16 import wna16_matmul, wna16_pack, wna16_unpack

logger = logging.getLogger("edgectl.cpu_int4")

# Attribute names on a quantized layer (read by readback.py).
W_ATTR = "int4_weight"  # torch: uint8 [N, K/2] packed for this ISA; edgectl: uint8 [tiles, blocks, record]
SZ_ATTR = "int4_scales_zeros"  # torch: [K/g, N, 2], activation dtype
INFO_ATTR = "edgectl_int4"  # dict: format, kernel, group_size, reason, role
LAYOUT_ATTR = "int4_row_slots"  # torch's tied embedding only: the learned PackedLayout.perm_table
# kernel vllm (w4a16-vllm): W_ATTR is int32 [N/16, 2K] in cpu_gemm_wna16's layout
S_ATTR = "int4_scales"  # [K/g, N], activation dtype
Z_ATTR = "int4_zeros"  # [K/g, N], float32 (the zero term is applied as a small GEMM)


def format_name(kernel: str, bits: int, group: int) -> str:
    """The read-back name of a layer's format (the plan's weight formats, by kernel)."""
    if kernel == "edgectl":
        return f"w{bits}a8/b{blocks.BLOCK}"
    return f"{NAME}/g{group}" if kernel == "torch" else f"{NAME}-wna16/g{group}"


class CpuInt4LinearMethod(LinearMethodBase):
    """See the module docstring."""

    def __init__(self, config: CpuInt4Config, role: str, prefix: str = "") -> None:
        self.config = config
        self.role = role
        self.prefix = prefix
        self.group_size = 0
        self.dense: QuantizeMethodBase | None = None
        self.tied_source: torch.nn.Module | None = None  # lm_head tied to a quantized embedding
        self.block_rows = 0  # torch's tied embedding: PackedLayout.block_rows
        # Per layer: vllm only for linear layers cpu_gemm_wna16 can hold; the head's own choice.
        self.kernel = config.kernel if role == "linear" else config.head_kernel
        if self.kernel == "vllm" and role != "linear":
            self.kernel = "torch"
        self.bits = 8 if role != "linear" and config.lm_head == "int8" else 4
        self.n = self.k = 0
        self.out_dtype = torch.bfloat16
        self.isa_hint = "vec"
        # Layer-wise processing is vLLM's online-quantization path: the weight is created on the
        # meta device and the layer is materialized, loaded and packed when its last shard
        # arrives. Off = the naive path (whole model dense, then packed).
        self.uses_meta_device = bool(config.layerwise)
        # Loaded by edgectl's GGUF loader (gguf_loader.py): edgectl's kernels take the file's
        # blocks (load_gguf); other kernels get dequantized weights like any checkpoint.
        self.takes_gguf = gguf_load_format() and self.kernel == "edgectl"

    # --- weights

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        k = input_size_per_partition
        sizes = list(output_partition_sizes)
        self.n, self.k, self.out_dtype = sum(sizes), k, params_dtype
        if self.config.source in ("gptq", "awq") and self.role == "linear":
            self._create_prequantized(layer, k, sizes, params_dtype, extra_weight_attrs.get("weight_loader"))
            return
        if self.role == "lm_head" and tied_embeddings():
            # Tied: ParallelLMHead.tie_weights() hands us the embedding right after this; the
            # head owns no weight of its own (nothing to load, nothing resident).
            setattr(layer, INFO_ATTR, {"role": self.role, "format": "tied", "reason": "tied to the embedding"})
            self.uses_meta_device = self.takes_gguf = False
            return
        if self.takes_gguf:
            # Nothing to allocate: load_gguf() installs the packed blocks in one step.
            self.uses_meta_device = False
            self.group_size = blocks.BLOCK
            layer.logical_widths = sizes
            setattr(layer, INFO_ATTR, {"role": self.role, "format": "pending", "kernel": self.kernel,
                                       "bits": self.bits, "group_size": blocks.BLOCK, "source": "gguf",
                                       "reason": "GGUF blocks", "out_features": self.n, "in_features": k})
            return
        ok, reason = self._holds(sizes, k)
        if not ok:
            self._make_dense(layer, reason, input_size_per_partition, sizes, input_size, output_size,
                             params_dtype, **extra_weight_attrs)
            return
        n = self.n
        if self.kernel == "edgectl":
            self.group_size = blocks.BLOCK
        else:
            self.group_size = choose_group_size(k, self.config.group_size) or 0
        if self.kernel == "vllm" and not (n % 32 == 0 and k % 32 == 0):
            self.kernel = "torch"
            reason += f"; torch kernel (cpu_gemm_wna16 needs N and K multiples of 32, got [{n}, {k}])"
        device = "meta" if self.uses_meta_device else None
        weight_loader = extra_weight_attrs.get("weight_loader")
        portable = self.config.source == "portable" and self.role == "linear"
        if portable:
            groups = k // self.config_group(k)
            for name, shape, dtype in (("qweight", (n, k // 2), torch.uint8),
                                       ("scales", (n, groups), params_dtype),
                                       ("zeros", (n, groups), params_dtype)):
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
        setattr(layer, INFO_ATTR, {"role": self.role, "format": format_name(self.kernel, self.bits, self.group_size),
                                   "kernel": self.kernel, "bits": self.bits, "group_size": self.group_size,
                                   "reason": reason, "source": "portable" if portable else "dense",
                                   "out_features": n, "in_features": k})
        if self.uses_meta_device and "weight" in layer._parameters and self.role != "linear":
            return  # the direct loader packs it
        if self.uses_meta_device:
            initialize_online_processing(layer)

    def load_gguf(self, layer: torch.nn.Module, parts: list[tuple[str, torch.Tensor, int]]) -> None:
        """Install a layer from GGUF tensors: ``(ggml type, raw uint8 rows, k)`` per part, in
        output order (q, k, v). A linear layer keeps its file's precision — W4 where every part
        is a 4-bit type, W8 where one is 5 to 8 bits (Q5_0, Q8_0, Q6_K, ...), the plan's bits for
        floats; the embedding / head takes the plan's head format. How each part converts is the
        layer's read-back reason (``formats.ggml.conversion``)."""
        types = [t for t, _, _ in parts]
        if self.role == "linear":
            native = {ggml.NATIVE_BITS.get(t) for t in types}
            bits = 8 if 8 in native else 4 if 4 in native else self.bits
        else:
            bits = self.bits
        rows = sum(raw.shape[0] for _, raw, _ in parts)
        if any(k != self.k for _, _, k in parts) or rows > self.n:
            raise ValueError(f"cpu_int4: {self.prefix}: GGUF tensors {[tuple(r.shape) for _, r, _ in parts]} "
                             f"do not fit [{self.n}, {self.k}]")
        kp = blocks.ceil_div(self.k, blocks.BLOCK) * blocks.BLOCK
        q = torch.zeros((self.n, kp), dtype=torch.uint8 if bits == 4 else torch.int8)
        d = torch.zeros((self.n, kp // blocks.BLOCK), dtype=torch.float16)
        m = torch.zeros_like(d) if bits == 4 else None
        r0 = 0
        for type_name, raw, k in parts:
            for c0 in range(0, raw.shape[0], blocks.PACK_ROWS * 16):  # bounds the int32/fp32 transient
                chunk = raw[c0:c0 + blocks.PACK_ROWS * 16]
                a, b = r0 + c0, r0 + c0 + chunk.shape[0]
                if bits == 4:
                    q[a:b], d[a:b], m[a:b] = ggml.to_w4(chunk, type_name, k)
                else:
                    q[a:b], d[a:b] = ggml.to_w8(chunk, type_name, k)
            r0 += raw.shape[0]
        packed = torch.empty(blocks.packed_shape(self.n, self.k, bits), dtype=torch.uint8)
        step = blocks.PACK_ROWS
        for a in range(0, self.n, step):
            b = min(self.n, a + step)
            t0, t1 = a // blocks.TILE_ROWS, blocks.ceil_div(b, blocks.TILE_ROWS)
            packed[t0:t1] = blocks.pack_w4(q[a:b], d[a:b], m[a:b]) if bits == 4 else blocks.pack_w8(q[a:b], d[a:b])
        self.bits = bits
        getattr(layer, INFO_ATTR).update(
            format=format_name(self.kernel, bits, blocks.BLOCK), bits=bits,
            reason="; ".join(sorted({ggml.conversion(t, bits) for t in types})))
        self._install_blocks(layer, packed)

    def config_group(self, k: int) -> int:
        """The group of a portable checkpoint's stored tensors (the rule the writer used)."""
        return choose_group_size(k, self.config.group_size) or 0

    def _holds(self, sizes: list[int], k: int) -> tuple[bool, str]:
        """Whether this layer's kernel can hold ``[sum(sizes), k]``, and why (not)."""
        portable = self.config.source == "portable" and self.role == "linear"
        if self.kernel == "edgectl" and not portable:
            kind = f"w{self.bits}a8"
            return True, f"{kind}, blocks of {blocks.BLOCK} (edgectl's kernels; any N and K)"
        # PyTorch's and vLLM's kernels, and a portable checkpoint's stored groups: the shared rule.
        return quantizable_partitions(sizes, k, self.config.group_size)

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
        if self.kernel == "vllm" and not (n % 32 == 0 and k % 32 == 0):
            self.kernel = "torch"
        device = "meta" if self.uses_meta_device else None
        groups = k // ckpt_group
        # The checkpoint's fp16 scales are held in fp32 until packed (a bf16 parameter would round them).
        if cfg.source == "gptq":
            specs = (("qweight", (k // 8, n), torch.int32, {"packed_dim": 0}),
                     ("qzeros", (groups, n // 8), torch.int32, {"packed_dim": 1}),
                     ("scales", (groups, n), torch.float32, {}))
        else:
            specs = (("qweight", (k, n // 8), torch.int32, {"packed_dim": 1}),
                     ("qzeros", (groups, n // 8), torch.int32, {"packed_dim": 1}),
                     ("scales", (groups, n), torch.float32, {}))
        for name, shape, dtype, extra in specs:
            p = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
            attrs = {"input_dim": 0, "output_dim": 1, "weight_loader": weight_loader, **extra}
            if "packed_dim" in extra:
                attrs["packed_factor"] = 8
                attrs["pack_factor"] = 8
            set_weight_attrs(p, attrs)
            layer.register_parameter(name, p)
        layer.logical_widths = sizes
        shown = blocks.BLOCK if self.kernel == "edgectl" else group
        setattr(layer, INFO_ATTR, {"role": self.role, "format": format_name(self.kernel, 4, shown),
                                   "kernel": self.kernel, "bits": 4, "group_size": shown,
                                   "reason": f"converted from {cfg.source.upper()} (group {cfg.ckpt_group})",
                                   "source": cfg.source, "out_features": n, "in_features": k})
        if self.kernel == "edgectl":
            self.group_size = blocks.BLOCK
        if self.uses_meta_device:
            initialize_online_processing(layer)

    def _prequantized_values(self, layer: torch.nn.Module, dtype: torch.dtype, group: int):
        cfg = self.config
        qweight, qzeros, scales = layer.qweight.data, layer.qzeros.data, layer.scales.data
        for name in ("qweight", "qzeros", "scales"):
            delattr(layer, name)
        if cfg.source == "gptq":
            return gptq_to_int4(qweight, qzeros, scales, sym=cfg.ckpt_sym, zero_offset=cfg.ckpt_zero_offset,
                                group_size=group, dtype=dtype)
        return awq_to_int4(qweight, qzeros, scales, group_size=group, dtype=dtype)

    def _direct_loader(self, layer: torch.nn.Module, n: int, k: int, dtype: torch.dtype):
        def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args, **kwargs) -> None:
            if loaded_weight.dim() != 2 or loaded_weight.shape[0] > n or loaded_weight.shape[1] != k:
                raise ValueError(f"cpu_int4: {self.prefix}: checkpoint tensor {tuple(loaded_weight.shape)} does "
                                 f"not fit [{n}, {k}]")
            if self.kernel == "edgectl":
                del layer._parameters["weight"]
                self._install_blocks(layer, blocks.quantize_and_pack(loaded_weight, self.bits, n_total=n))
                return
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
        """PyTorch's int4 kernel's tensors."""
        layer.register_parameter(W_ATTR, torch.nn.Parameter(packed, requires_grad=False))
        layer.register_parameter(SZ_ATTR, torch.nn.Parameter(sz, requires_grad=False))
        if self.role == "embedding":
            # The lookup's slot table, as a (tiny) buffer so torch.compile sees a module tensor.
            layout = packed_layout()
            self.block_rows = layout.block_rows
            layer.register_buffer(LAYOUT_ATTR, layout.perm_table.clone(), persistent=False)
        layer._already_called_process_weights_after_loading = True

    def _install_blocks(self, layer: torch.nn.Module, packed: torch.Tensor) -> None:
        """edgectl's packed records: the only tensor of the layer (scales are inside)."""
        layer.register_parameter(W_ATTR, torch.nn.Parameter(packed, requires_grad=False))
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
                                   "reason": "the embedding is not quantized"})
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
        if self.kernel == "edgectl":
            self._process_blocks(layer, dtype)
            return
        if self.kernel == "vllm":
            self._process_wna16(layer, dtype)
            return
        stored = self._stored_values(layer, dtype, self.group_size)
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

    def _stored_values(self, layer: torch.nn.Module, dtype: torch.dtype, group: int):
        """``(q, scales, zeros)`` of a checkpoint stored in 4 bits (GPTQ/AWQ with groups of
        ``group``, or edgectl's portable format), its tensors removed from the layer; None for a
        dense checkpoint."""
        if "qzeros" in layer._parameters:  # GPTQ / AWQ
            return self._prequantized_values(layer, dtype, group)
        if "qweight" in layer._parameters:
            q = unpack_nibbles(layer.qweight.data)
            scales, zeros = layer.scales.data, layer.zeros.data
            for name in ("qweight", "scales", "zeros"):
                delattr(layer, name)
            return q, scales, zeros
        return None

    def _process_blocks(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        """edgectl's W4/W8: quantize a dense weight in row blocks, or take a group-wise source's
        q as is (``blocks.from_groups``: d = scale, m = zero - 8 scale)."""
        ckpt_group = self.config.ckpt_group if self.config.ckpt_group > 0 else self.k
        group = choose_group_size(ckpt_group, max(ALLOWED_GROUP_SIZES)) if self.config.source in ("gptq", "awq") \
            else self.config_group(self.k)
        # GPTQ / AWQ: zeros (8 - zp) * scale kept in fp32, rounded once, to fp16, as m
        stored = self._stored_values(layer, torch.float32, group)
        if stored is not None:
            packed = blocks.pack_w4(*blocks.from_groups(*stored))
            del stored
        else:
            weight = layer.weight.data
            if weight.is_meta:
                raise RuntimeError(f"cpu_int4: {self.prefix} was never loaded from the checkpoint")
            packed = blocks.quantize_and_pack(weight, self.bits)
            delattr(layer, "weight")
            del weight
        self._install_blocks(layer, packed)

    def _process_wna16(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        stored = self._stored_values(layer, dtype, self.group_size)
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

    def _source(self) -> tuple["CpuInt4LinearMethod", torch.nn.Module | None]:
        """The method and module holding the packed weight (a tied head reads its embedding's)."""
        if self.tied_source is not None:
            return self.tied_source.quant_method, self.tied_source
        return self, None

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.apply(layer, x, bias)
        method, holder = self._source()
        src = holder if holder is not None else layer
        if method.kernel == "edgectl":
            op = torch.ops.edgectl.linear_w4a8 if method.bits == 4 else torch.ops.edgectl.linear_w8a8
            out = op(x, getattr(src, W_ATTR), method.n, method.k)
        elif method.kernel == "vllm":
            out = wna16_matmul(x, getattr(src, W_ATTR), getattr(src, S_ATTR), getattr(src, Z_ATTR),
                               method.group_size, method.isa_hint)
        else:
            out = int4_matmul(x, getattr(src, W_ATTR), method.group_size, getattr(src, SZ_ATTR))
        if bias is not None:
            out = out + bias
        return out

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.embedding(layer, input_)
        packed = getattr(layer, W_ATTR)
        if self.kernel == "edgectl":
            op = torch.ops.edgectl.embedding_w4 if self.bits == 4 else torch.ops.edgectl.embedding_w8
            return op(input_, packed, self.n, self.k, self.out_dtype)
        sz = getattr(layer, SZ_ATTR)
        shape = input_.shape
        rows = input_.reshape(-1)
        q = gather_packed_rows(packed, rows, self.block_rows, getattr(layer, LAYOUT_ATTR))  # [M, K]
        out = _dequant_rows(q, sz, rows)
        return out.to(sz.dtype).reshape(*shape, -1)


def _quantize_and_pack(weight: torch.Tensor, group_size: int, dtype: torch.dtype,
                       n_total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's int4 kernel: quantize and pack ``weight`` in blocks of rows: (packed
    ``uint8 [N, K/2]``, scales and zeros ``[K/g, N, 2]``). Rows past ``weight``'s own up to
    ``n_total`` (vLLM's vocabulary padding) are zeros. The transient is one block of fp32 rows."""
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
    """Whether packed-row lookup (PyTorch's layout, learned) returns exactly the quantized rows of
    ``weight`` (a spread sample, the first and the last rows, which include any tail block)."""
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
    """``(q uint8 [N, K], scales [N, K/g], zeros [N, K/g])`` of a 4-bit layer, read back from the
    kernel's tensors, as group-wise int4 (``w = (q - 8) * scale + zero``; edgectl's W4 as groups of
    32 with fp32 scales and zeros, K padded to a multiple of 32). For tests and read-back;
    allocates an unpacked copy."""
    method = layer.quant_method
    packed = getattr(layer, W_ATTR)
    if method.kernel == "edgectl":
        if method.bits != 4:
            raise ValueError(f"{method.prefix} holds 8-bit weights; use dequantized_weight()")
        return blocks.to_groups(*blocks.unpack_w4(packed, method.n))
    if method.kernel == "vllm":
        n = getattr(layer, S_ATTR).shape[1]
        q = wna16_unpack(packed, n)
        return q, getattr(layer, S_ATTR).t(), getattr(layer, Z_ATTR).t()
    q = packed_layout().gather_rows(packed, torch.arange(packed.shape[0]))
    sz = getattr(layer, SZ_ATTR)
    return q, sz[:, :, 0].t(), sz[:, :, 1].t()


def dequantized_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The fp32 weight ``[N, K]`` a quantized layer's kernel multiplies by (any kernel, 4 or 8 bits)."""
    method = layer.quant_method
    if method.kernel == "edgectl" and method.bits == 8:
        q, d = blocks.unpack_w8(getattr(layer, W_ATTR), method.n)
        return blocks.dequantize_w8(q, d, method.k)
    return dequantize_int4(*unpack_layer(layer))[:, :method.k]
