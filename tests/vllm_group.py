"""vLLM's process groups for one rank, as its worker sets them up: what a test needs to build vLLM
layers (its linear layers ask for the tensor-parallel rank) without starting an engine."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def single_rank_group(tmp_path_factory):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps._TP is not None:
        yield
        return
    init = f"file://{tmp_path_factory.mktemp('dist')}/init"
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=init, local_rank=0,
                                        backend="gloo")
        ps.initialize_model_parallel(1, 1)
        yield
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
