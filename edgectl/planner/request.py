"""What the user asked for, checked before anything is decided: one error naming the flag."""

from __future__ import annotations

from enum import StrEnum

from edgectl.contract import int4_layout
from edgectl.contract.plan import (
    Compilation,
    EmbeddingPack,
    KvCacheDtype,
    OptionalImports,
    Request,
    TokenizerLever,
    Topology,
    WeightFormat,
)
from edgectl.errors import EdgectlError
from edgectl.planner.service import MIN_WATCHDOG_S


def check_request(request: Request) -> None:
    if not 1 <= request.port <= 65535:
        raise EdgectlError(f"--port {request.port} is not a TCP port: use 1-65535")
    if request.max_num_seqs < 1:
        raise EdgectlError(f"--max-num-seqs must be at least 1 (got {request.max_num_seqs})")
    if request.group_size is not None and request.group_size not in int4_layout.ALLOWED_GROUP_SIZES:
        raise EdgectlError(f"--group-size {request.group_size} is not one of "
                           f"{', '.join(map(str, int4_layout.ALLOWED_GROUP_SIZES))}")
    _one_of("unknown weight format", request.weight_format, WeightFormat)
    _one_of("unknown topology", request.bench.topology, Topology)
    if request.compilation and request.compilation not in set(Compilation):
        raise EdgectlError(f"--compilation {request.compilation!r}: use eager or default")
    _one_of("--kv-cache-dtype", request.kv_cache_dtype, KvCacheDtype)
    # none is the speech planner's with the int8 head scan, never asked: a head on vLLM's GEMM needs its copy
    asked_packs = (EmbeddingPack.VLLM, EmbeddingPack.LM_HEAD)
    if request.bench.embedding_pack and request.bench.embedding_pack not in asked_packs:
        raise EdgectlError(f"embedding pack {request.bench.embedding_pack!r}: use one of {', '.join(asked_packs)}")
    _one_of("optional imports", request.bench.optional_imports, OptionalImports)
    _one_of("tokenizer", request.bench.tokenizer, TokenizerLever)
    if request.bench.python_optimize is not None and request.bench.python_optimize not in (0, 1, 2):
        raise EdgectlError(f"python optimize level {request.bench.python_optimize}: use 0, 1 or 2")
    if request.watchdog_s is not None and request.watchdog_s < MIN_WATCHDOG_S:
        raise EdgectlError(f"--watchdog-sec {request.watchdog_s} is too short (at least {MIN_WATCHDOG_S} s)")


def _one_of(what: str, value: str | None, kind: type[StrEnum]) -> None:
    if value and value not in set(kind):
        raise EdgectlError(f"{what} {value!r}: use one of {', '.join(kind)}")
