"""The RoPE cap (EDGECTL_ROPE_CAP): the capped table is exactly the first rows of vLLM's own
table, it is built without the full table, and classes whose table is not a plain function of
the position are left alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding  # noqa: E402
from vllm.model_executor.layers.rotary_embedding.dynamic_ntk_scaling_rope import (  # noqa: E402
    DynamicNTKScalingRotaryEmbedding,
)
from vllm.model_executor.layers.rotary_embedding.linear_scaling_rope import (
    LinearScalingRotaryEmbedding,  # noqa: E402
)
from vllm.model_executor.layers.rotary_embedding.llama3_rope import (
    Llama3RotaryEmbedding,  # noqa: E402
)
from vllm.model_executor.layers.rotary_embedding.ntk_scaling_rope import (
    NTKScalingRotaryEmbedding,  # noqa: E402
)
from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import (
    YaRNScalingRotaryEmbedding,  # noqa: E402
)

from edgectl_runtime.vllm_plugin import rope  # noqa: E402

MAX_MODEL_LEN = 1000


@pytest.fixture(scope="module")
def vllm_config():
    with set_current_vllm_config(VllmConfig()):
        yield


@pytest.fixture
def capped(monkeypatch, vllm_config):
    """The cap installed, with max_model_len as a running engine would report it."""
    monkeypatch.setattr(rope, "_max_model_len", lambda: MAX_MODEL_LEN)
    assert rope.install({"EDGECTL_ROPE_CAP": "1"})
    yield
    rope.uninstall()  # leave vLLM as it was for other tests


def _modules():
    f32 = torch.float32
    return {
        "plain": lambda: RotaryEmbedding(64, 64, 8192, 10000.0, True, f32),
        "partial": lambda: RotaryEmbedding(128, 64, 4096, 500000.0, False, f32),
        "llama3": lambda: Llama3RotaryEmbedding(64, 64, 131072, 500000.0, True, f32, 8.0, 1.0, 4.0, 8192),
        "linear": lambda: LinearScalingRotaryEmbedding(64, 64, 4096, 10000.0, True, [2.0], f32),
        "yarn": lambda: YaRNScalingRotaryEmbedding(64, 64, 4096, 1000000.0, True, 4.0, f32),
    }


@pytest.mark.parametrize("kind", list(_modules()))
def test_capped_table_is_the_first_rows_of_vllms_table(kind, capped):
    module = _modules()[kind]()
    rows = module.cos_sin_cache.shape[0]
    assert rows == MAX_MODEL_LEN
    assert module.edgectl_rope == {"rows": MAX_MODEL_LEN, "full_rows": rope.full_rows(module), "capped": True}
    # vLLM's own computation of the full table (the method the cap replaced), bit for bit.
    full = rope.vllm_table(module)
    assert full.shape[0] == rope.full_rows(module) > MAX_MODEL_LEN
    assert torch.equal(module.cos_sin_cache, full[:MAX_MODEL_LEN].to(module.cos_sin_cache.dtype))


def test_bf16_table_matches_too(capped):
    module = RotaryEmbedding(64, 64, 8192, 100000.0, True, torch.bfloat16)
    full = rope.vllm_table(module).to(torch.bfloat16)
    assert module.cos_sin_cache.dtype == torch.bfloat16
    assert torch.equal(module.cos_sin_cache, full[:MAX_MODEL_LEN])


def test_no_cap_when_max_model_len_covers_the_table(capped, monkeypatch):
    monkeypatch.setattr(rope, "_max_model_len", lambda: 100000)
    module = RotaryEmbedding(64, 64, 8192, 10000.0, True, torch.float32)
    assert module.cos_sin_cache.shape[0] == 8192
    assert module.edgectl_rope["capped"] is False


def test_other_classes_are_left_alone(capped):
    multi = LinearScalingRotaryEmbedding(64, 64, 2048, 10000.0, True, [1.0, 2.0], torch.float32)
    assert multi.cos_sin_cache.shape[0] == 2048 + 4096  # tables at offsets: not capped
    assert not hasattr(multi, "edgectl_rope")
    dynamic = DynamicNTKScalingRotaryEmbedding(64, 64, 4096, 2048, 10000.0, True, 2.0, torch.float32)
    assert dynamic.cos_sin_cache.shape[0] == 4096  # its numerics depend on the full length
    assert not hasattr(dynamic, "edgectl_rope")
    # A subclass that inherits the plain method goes through the patch and is recognized as
    # not eligible (exact class check), so it keeps vLLM's table.
    ntk = NTKScalingRotaryEmbedding(64, 64, 4096, 10000.0, True, 2.0, torch.float32)
    assert ntk.cos_sin_cache.shape[0] == 4096
    assert not hasattr(ntk, "edgectl_rope")


def test_lever_off_installs_nothing(vllm_config):
    assert rope.install({}) is False
    assert rope.install({"EDGECTL_ROPE_CAP": "0"}) is False
    assert "_compute_cos_sin_cache" not in RotaryEmbedding.__dict__  # vLLM's class untouched
    module = RotaryEmbedding(64, 64, 8192, 10000.0, True, torch.float32)
    assert module.cos_sin_cache.shape[0] == 8192


def test_bad_lever_value_is_refused():
    with pytest.raises(ValueError, match="EDGECTL_ROPE_CAP"):
        rope.install({"EDGECTL_ROPE_CAP": "yes"})


def test_capped_table_never_builds_the_full_table(capped, monkeypatch):
    # The fp32 transient of a 131072-row table is what the cap avoids (facts §2): count the
    # rows of every position vector the patched computation creates.
    seen = []
    real_arange = torch.arange

    def spy(*args, **kwargs):
        t = real_arange(*args, **kwargs)
        if t.dtype == torch.float32:
            seen.append(t.numel())
        return t

    monkeypatch.setattr(torch, "arange", spy)
    Llama3RotaryEmbedding(64, 64, 131072, 500000.0, True, torch.bfloat16, 8.0, 1.0, 4.0, 8192)
    assert max(seen) <= MAX_MODEL_LEN
