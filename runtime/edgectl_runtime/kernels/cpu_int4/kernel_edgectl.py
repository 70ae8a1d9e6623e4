"""The ``edgectl`` kernel [w4a8]: edgectl's own library (``ops/``), blocks of 32 with a scale
and a minimum (GGUF Q4_1, ``formats/blocks.py``), activations quantized to int8 per call; W8
blocks (GGUF Q8_0) for an int8 LM head next to any linear kernel. Any N and K (the blocks pad
both); a group-wise source keeps its q (``blocks.from_groups``); a GGUF file's blocks are
installed as they are (Q5_0 in W5 blocks)."""

from __future__ import annotations

from typing import Any

import torch

from edgectl_runtime.formats import blocks, ggml
from edgectl_runtime.kernels import ops
from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel, dense_weight
from edgectl_runtime.kernels.cpu_int4.names import W_ATTR


class EdgectlBlocksKernel(Int4Kernel):
    """See the module docstring."""

    name = "edgectl"
    takes_gguf_blocks = True

    @classmethod
    def require(cls) -> None:
        """Fail at configuration, with the fix, rather than at the first forward pass."""
        try:
            ops.load()
        except ops.KernelLibraryError as exc:
            raise ValueError(f"cpu_int4: {exc}") from None

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"isa": ops.active_level()}

    @classmethod
    def holds(cls, sizes: list[int], k: int, bits: int, group_setting: int, stored_groups: bool) -> tuple[bool, str]:
        if stored_groups:
            return super().holds(sizes, k, bits, group_setting, stored_groups)
        return True, f"w{bits}a8, blocks of {blocks.BLOCK} (edgectl's kernels; any N and K)"

    @classmethod
    def kernel_group(cls, source_group: int) -> int:
        return blocks.BLOCK

    @classmethod
    def format_name(cls, bits: int, group: int) -> str:
        return f"w{bits}a8/b{blocks.BLOCK}"

    @classmethod
    def pack_gguf(cls, parts: list[tuple[str, torch.Tensor, int]], n: int, k: int, bits: int) -> torch.Tensor:
        kp = blocks.ceil_div(k, blocks.BLOCK) * blocks.BLOCK
        q = torch.zeros((n, kp), dtype=torch.int8 if bits == 8 else torch.uint8)
        d = torch.zeros((n, kp // blocks.BLOCK), dtype=torch.float16)
        m = torch.zeros_like(d) if bits == 4 else None
        r0 = 0
        for type_name, raw, part_k in parts:
            for c0 in range(0, raw.shape[0], blocks.PACK_ROWS * 16):  # bounds the int32/fp32 transient
                chunk = raw[c0:c0 + blocks.PACK_ROWS * 16]
                a, b = r0 + c0, r0 + c0 + chunk.shape[0]
                if bits == 4:
                    q[a:b], d[a:b], m[a:b] = ggml.to_w4(chunk, type_name, part_k)
                elif bits == 5:
                    q[a:b], d[a:b] = ggml.to_w5(chunk, type_name, part_k)
                else:
                    q[a:b], d[a:b] = ggml.to_w8(chunk, type_name, part_k)
            r0 += raw.shape[0]
        packed = torch.empty(blocks.packed_shape(n, k, bits), dtype=torch.uint8)
        for a in range(0, n, blocks.PACK_ROWS):
            b = min(n, a + blocks.PACK_ROWS)
            t0, t1 = a // blocks.TILE_ROWS, blocks.ceil_div(b, blocks.TILE_ROWS)
            if bits == 4:
                packed[t0:t1] = blocks.pack_w4(q[a:b], d[a:b], m[a:b])
            else:
                packed[t0:t1] = (blocks.pack_w5 if bits == 5 else blocks.pack_w8)(q[a:b], d[a:b])
        return packed

    def process_weights(self, module: torch.nn.Module, dtype: torch.dtype) -> bool:
        """Quantize a dense weight in row blocks, or take a group-wise source's q as is
        (``blocks.from_groups``: d = scale, m = zero - 8 scale)."""
        # GPTQ / AWQ: zeros (8 - zp) * scale kept in fp32, rounded once, to fp16, as m
        stored = self.checkpoint.take_values(module, torch.float32, self.layer.source_group)
        if stored is not None:
            packed = blocks.pack_w4(*blocks.from_groups(*stored))
            del stored
        else:
            weight = dense_weight(module, self.layer.prefix)
            packed = blocks.quantize_and_pack(weight, self.layer.bits)
            delattr(module, "weight")
            del weight
        self.install(module, {W_ATTR: packed})
        return True

    def pack_arriving(self, module: torch.nn.Module, loaded: torch.Tensor, dtype: torch.dtype) -> bool:
        del module._parameters["weight"]
        self.install(module, {W_ATTR: blocks.quantize_and_pack(loaded, self.layer.bits, n_total=self.layer.n)})
        return True

    def apply(self, holder: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        bits = self.layer.bits
        lib = torch.ops.edgectl
        op = lib.linear_w4a8 if bits == 4 else lib.linear_w5a8 if bits == 5 else lib.linear_w8a8
        return op(x, getattr(holder, W_ATTR), self.layer.n, self.layer.k)

    def embedding(self, module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        op = torch.ops.edgectl.embedding_w4 if self.layer.bits == 4 else torch.ops.edgectl.embedding_w8
        return op(ids, getattr(module, W_ATTR), self.layer.n, self.layer.k, self.layer.out_dtype)

    def unpack(self, module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.layer.bits != 4:
            raise ValueError(f"{self.layer.prefix} holds {self.layer.bits}-bit weights; use dequantized_weight()")
        return blocks.to_groups(*blocks.unpack_w4(getattr(module, W_ATTR), self.layer.n))

    def dequantize(self, module: torch.nn.Module) -> torch.Tensor:
        if self.layer.bits == 8:
            q, d = blocks.unpack_w8(getattr(module, W_ATTR), self.layer.n)
            return blocks.dequantize_w8(q, d, self.layer.k)
        if self.layer.bits == 5:
            q, d = blocks.unpack_w5(getattr(module, W_ATTR), self.layer.n)
            return blocks.dequantize_w5(q, d, self.layer.k)
        return super().dequantize(module)
