"""How vLLM's engine runs: its process topology, its execution mode, and edgectl's levers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgectl.contract.plan import Compilation, Reason, Request, Source, Topology
from edgectl.planner.decided import Decided

if TYPE_CHECKING:
    from edgectl.profiles import Profile


def choose_topology(request: Request) -> Decided[Topology]:
    topology = Topology(request.topology) if request.topology else Topology.SINGLE_PROCESS
    detail = ("API server, engine core and model worker in one process: each process that imports torch and "
              "vLLM costs ~0.5 GB (docs/facts.md)" if topology is Topology.SINGLE_PROCESS
              else "vLLM's own process layout")
    return Decided(topology, Reason("topology", topology, Source.FLAG if request.topology else Source.PROFILE, detail))


def choose_compilation(request: Request, profile: Profile) -> Decided[Compilation]:
    mode = Compilation(request.compilation) if request.compilation else profile.compilation
    source = Source.FLAG if request.compilation else profile.reason_source
    detail = ("eager: no torch.compile start-up cost (vLLM's default mode took 260 s to start on 2 cores, "
              "eager 56 s: docs/facts.md)" if mode is Compilation.EAGER
              else "vLLM's default CPU compilation (DYNAMO_TRACE_ONCE + inductor)")
    if mode != profile.compilation:
        detail += (f"; the profile's figures were measured in {profile.compilation} mode, so the memory "
                   "and speed predictions are for that mode")
    return Decided(mode, Reason("compilation", mode, source, detail))


@dataclass(frozen=True)
class Levers:
    rope_cap: bool  # the RoPE table has max_model_len rows (its reason: rope_rows)
    layerwise_repack: bool  # int4 layers are packed as their checkpoint shards arrive
    quantize_lm_head: bool  # the output head is int4 too


def choose_levers(request: Request) -> Levers:
    return Levers(
        rope_cap=True if request.rope_cap is None else request.rope_cap,
        layerwise_repack=True if request.layerwise_repack is None else request.layerwise_repack,
        quantize_lm_head=bool(request.quantize_lm_head),
    )
