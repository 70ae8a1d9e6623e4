"""vLLM's one-rank gloo process groups, released once the engine has started.

vLLM's CPU worker always starts torch.distributed with gloo, and every ``GroupCoordinator`` it makes
(world, tensor, pipeline, data, expert, decode- and prefill-context parallel) opens two gloo groups of
its own, ``device_group`` and ``cpu_group`` (``vllm/distributed/parallel_state.py``,
``GroupCoordinator.__init__``). Each gloo group runs a transport thread (``gloo_tcp_loop``) whose loop
waits in ``epoll_wait`` with a 10 ms timeout (gloo, ``transport/tcp/loop.cc``, ``Loop::run``): it
wakes 100 times a second whether anything is sent or not. With 13 of them an idle SmolLM2 service woke
~1300 times a second (docs/kernels.md "Idle wake-ups"), on a box whose CPUs could otherwise sleep.

With one rank nothing uses these groups once the engine has started: vLLM's collectives return before
touching a group when its world size is 1, and what reduces across ranks (the KV memory's minimum) runs
at start. So, after start and only when every group has one rank, they are destroyed and their
attributes removed; ``GroupCoordinator.destroy`` skips what is gone (it asks ``hasattr``), so vLLM's
own shutdown stays as it is. The process's default group goes last, which ends torch.distributed.
"""

from __future__ import annotations

import glob
import os

GLOO_THREAD = "gloo_tcp_loop"


def gloo_transport_threads(pid: int | None = None) -> int:
    """How many of the process's threads are gloo transport loops (by their name in /proc)."""
    n = 0
    for comm in glob.glob(f"/proc/{pid or os.getpid()}/task/*/comm"):
        try:
            with open(comm) as f:
                n += f.read().strip() == GLOO_THREAD
        except OSError:  # the thread ended while we looked
            continue
    return n


def release_one_rank_groups(worker=None) -> dict[str, int | str]:
    """Destroy vLLM's gloo groups when every one of them has one rank; what was done, and the
    transport threads left. ``worker``: vLLM's collective_rpc passes it; unused."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    coordinators = [v for k, v in vars(parallel_state).items()
                    if k.startswith("_") and isinstance(v, parallel_state.GroupCoordinator)]
    if any(c.world_size != 1 for c in coordinators):
        return {"kept": "a group spans more than one rank", "transport_threads": gloo_transport_threads()}
    released = 0
    for c in coordinators:
        for attr in ("device_group", "cpu_group"):
            group = c.__dict__.get(attr)
            if group is not None:
                dist.destroy_process_group(group)
                delattr(c, attr)
                released += 1
    if dist.is_initialized():
        dist.destroy_process_group()
        released += 1
    return {"released": released, "transport_threads": gloo_transport_threads()}
