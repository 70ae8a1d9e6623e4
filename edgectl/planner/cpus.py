"""Which CPUs serve, how many OpenMP threads run on them, how they wait, and whether one is kept for
the front end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgectl.contract.plan import Reason, Request, Source, ThreadWait, Topology
from edgectl.errors import EdgectlError
from edgectl.planner.decided import Decided, Reasons
from edgectl.probe.formats import format_cpu_list

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts, TopologyFacts
    from edgectl.profiles import Profile


@dataclass(frozen=True)
class Cpus:
    cpus: list[int]  # the CPUs the service may run on
    threads: int  # OpenMP threads, bound to the first `threads` of them
    reserve_frontend_core: bool
    thread_wait: ThreadWait = ThreadWait.SPIN


# How the threads wait when nothing is asked, and the measurement behind it.
THREAD_WAIT = ThreadWait.SPIN_SHORT
THREAD_WAIT_EVIDENCE = ("a bounded spin (GOMP_SPINCOUNT=10000, then sleep): SmolLM2 decoded at 144 tok/s with it on a "
                        "quiet host against 133 with libgomp's default spin (both under the noise gate), and at 9.5 "
                        "against 0.7 with one CPU busy with other work; sleeping at once cost 4.2x quiet "
                        "(x86_64-amx, docs/kernels.md \"Waiting threads\")")


def choose_cpus(facts: HostFacts, request: Request, profile: Profile, topology: Topology) -> Decided[Cpus]:
    reasons = Reasons()
    cpus, scope = reasons.take(_serving_cpus(facts.topology))
    threads = reasons.take(_capped_threads(facts.topology, len(cpus), scope))
    reserve = reasons.take(_reserve_frontend_core(request, profile, topology, threads))
    if reserve:
        # OpenMP binds to the first `threads` CPUs; the process keeps all of them, so the
        # front end's threads run on the one left over.
        threads -= 1
    threads = reasons.take(_threads(request, cpus, threads))
    wait = reasons.take(_thread_wait(request, profile))
    return Decided(Cpus(cpus, threads, reserve, wait), *reasons.items)


def _serving_cpus(topo: TopologyFacts) -> Decided[tuple[list[int], int]]:
    """(the CPUs the service runs on, how many CPUs they are taken from): the usable ones, those
    of the best NUMA node when there are several."""
    reasons: list[Reason] = []
    usable = list(topo.usable_cpus or [])
    if not usable:
        n = topo.logical_cpus or 1
        usable = list(range(n))
        reasons.append(Reason("cpus", format_cpu_list(usable), Source.FALLBACK,
                              "usable CPUs unknown; assuming all online CPUs"))
    nodes = [n for n in (topo.numa_nodes or []) if set(n.cpus) & set(usable)]
    cpus = usable
    scope = topo.logical_cpus or len(usable)  # the CPUs the chosen ones are taken from
    if len(nodes) > 1:
        best = max(nodes, key=lambda n: (len(set(n.cpus) & set(usable)), -n.id))
        cpus = sorted(set(best.cpus) & set(usable))
        scope = len(best.cpus)
        reasons.append(Reason("cpus", format_cpu_list(cpus), Source.PROBE,
                              f"{len(nodes)} NUMA nodes: node-local cores of node {best.id} "
                              "(weights and KV stay in its memory)"))
    else:
        reasons.append(Reason("cpus", format_cpu_list(cpus), Source.PROBE,
                              "the CPUs this process may use (affinity ∩ cgroup cpuset)"))
    return Decided((cpus, scope), *reasons)


def _capped_threads(topo: TopologyFacts, n_cpus: int, scope: int) -> Decided[int]:
    """One thread per CPU, capped at one per physical core and at the cgroup's CPU quota."""
    reasons: list[Reason] = []
    threads = n_cpus
    # SMT siblings share a core's execution units; vLLM binds one thread per physical core.
    # The probe gives core counts, not which CPUs are siblings, so the cap is the number of
    # cores behind the scope (the node, or the host): a cpuset of CPUs on distinct cores
    # (`docker --cpuset-cpus 2-3` on a 4-core × 2-thread host) keeps a thread per CPU.
    if topo.physical_cores and topo.logical_cpus and topo.physical_cores < topo.logical_cpus:
        per_core = topo.logical_cpus // topo.physical_cores
        cores = max(1, scope // per_core)
        if per_core > 1 and threads > cores:
            threads = cores
            reasons.append(Reason("threads_smt", threads, Source.PROBE,
                                  f"{per_core} hardware threads per core: one OpenMP thread per physical core"))
    if topo.cpu_quota_cores:
        quota_threads = max(1, math.floor(topo.cpu_quota_cores))
        if quota_threads < threads:
            threads = quota_threads
            reasons.append(Reason("threads_quota", threads, Source.PROBE,
                                  f"cgroup CPU quota is {topo.cpu_quota_cores:g} cores: more threads would be throttled"))
    return Decided(threads, *reasons)


def _reserve_frontend_core(request: Request, profile: Profile, topology: Topology, threads: int) -> Decided[bool]:
    """Whether a core is kept for the HTTP front end: as asked, else as measured, else not; never
    the only one."""
    reasons: list[Reason] = []
    reserve = request.bench.reserve_frontend_core
    if reserve is not None:
        reasons.append(Reason("reserve_frontend_core", reserve, Source.FLAG, "asked"))
    elif profile.reserve_frontend_core is not None:
        reserve = profile.reserve_frontend_core
        reasons.append(Reason("reserve_frontend_core", reserve, profile.reason_source,
                              profile.reserve_evidence or f"measured on {profile.name}"))
    else:
        reserve = False
        reasons.append(Reason("reserve_frontend_core", False, Source.FALLBACK,
                              f"not measured on {profile.name}; in the {topology} topology the HTTP front end only "
                              "queues requests and streams tokens"))
    if reserve and threads <= 1:
        reasons.append(Reason("reserve_frontend_core", False, Source.PROBE, "only one core: nothing to reserve"))
        reserve = False
    return Decided(reserve, *reasons)


def _threads(request: Request, cpus: list[int], threads: int) -> Decided[int]:
    """The OpenMP threads: as asked with --threads (within the CPUs), else as capped."""
    if request.threads is None:
        return Decided(threads, Reason("threads", threads, Source.PROBE,
                                       f"OpenMP threads on CPUs {format_cpu_list(cpus[:threads])}"))
    if request.threads < 1 or request.threads > len(cpus):
        raise EdgectlError(f"--threads {request.threads} is outside 1..{len(cpus)} "
                           f"(the usable CPUs: {format_cpu_list(cpus)})")
    return Decided(request.threads, Reason("threads", request.threads, Source.FLAG, "asked with --threads"))


def _thread_wait(request: Request, profile: Profile) -> Decided[ThreadWait]:
    """How the OpenMP threads wait between parallel regions: as the bench asks, else as the device
    class's profile measured, else the default measured on ``x86_64-amx``."""
    asked = request.bench.thread_wait
    if asked is not None:
        return Decided(ThreadWait(asked), Reason("thread_wait", str(asked), Source.FLAG, "asked"))
    if profile.thread_wait is not None:
        return Decided(profile.thread_wait, Reason("thread_wait", str(profile.thread_wait), profile.reason_source,
                                                   profile.thread_wait_evidence or f"measured on {profile.name}"))
    return Decided(THREAD_WAIT, Reason("thread_wait", str(THREAD_WAIT), Source.DEFAULT, THREAD_WAIT_EVIDENCE))
