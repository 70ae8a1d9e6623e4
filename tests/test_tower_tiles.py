"""The vision tower over an image's tiles a few at a time (runtime/edgectl_runtime/vllm_plugin/tower_tiles.py).

vLLM's own tower class (``Idefics2VisionTransformer``, what Idefics3 / SmolVLM build) on a tiny shape of
seeded random weights: five tiles encoded two at a time give the embeddings of the five in one batch, bit
for bit, and the batches are counted; the lever at 0 leaves vLLM's class as it is. The served model's tower
with the plan's lever against transformers: tests/test_vision_tower_agreement.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm_group import single_rank_group  # noqa: E402, F401  (the fixture)

from edgectl_runtime.vllm_plugin import tower_tiles  # noqa: E402

pytestmark = [pytest.mark.runtime]

TILE, PATCH = 32, 8  # 16 patches a tile


@pytest.fixture(scope="module")
def tower(single_rank_group):  # noqa: F811
    from transformers import Idefics3VisionConfig
    from vllm.model_executor.models.idefics2_vision_model import (
        Idefics2VisionTransformer,
    )

    config = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=TILE, patch_size=PATCH)
    torch.manual_seed(0)
    model = Idefics2VisionTransformer(config).to(torch.bfloat16)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    for module in model.modules():  # what vLLM's loader does after the weights are in (the CPU GEMM's dispatch)
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    return model


@pytest.fixture(autouse=True)
def _counts(monkeypatch):
    monkeypatch.setattr(tower_tiles, "_COUNTS", {"tiles": 0, "calls": 0, "batches": 0})


def _tiles(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(n, 3, TILE, TILE, generator=g).to(torch.bfloat16)
    return pixels, torch.ones(n, TILE // PATCH, TILE // PATCH, dtype=torch.bool)


def test_five_tiles_two_at_a_time_are_the_five_at_once_bit_for_bit(tower):
    cls = type(tower)
    pixels, mask = _tiles(5)
    with torch.inference_mode():
        whole = cls.forward(tower, pixels, patch_attention_mask=mask)
        batched = tower_tiles.batched_forward(cls.forward, 2)(tower, pixels, patch_attention_mask=mask)
    assert whole.shape == batched.shape == (5, (TILE // PATCH) ** 2, 32)
    assert torch.equal(whole, batched)
    assert tower_tiles.counts() == {"tiles": 0, "calls": 1, "batches": 3}  # 2 + 2 + 1 tiles


def test_a_call_the_lever_does_not_split_passes_through():
    """At most N tiles, or the tgt_sizes / position_ids another model's use of the class passes: one call as given."""
    seen = []

    def forward(self, pixel_values, patch_attention_mask=None, tgt_sizes=None, position_ids=None):
        seen.append((pixel_values.size(0), tgt_sizes, position_ids))
        return pixel_values

    batched = tower_tiles.batched_forward(forward, 2)
    pixels, mask = _tiles(5)
    sizes = torch.tensor([[4, 4]] * 5)
    batched(None, pixels[:2], mask[:2])
    assert batched(None, pixels, mask, sizes) is pixels
    batched(None, pixels, mask, None, torch.arange(16))
    assert [n for n, *_ in seen] == [2, 5, 5] and seen[1][1] is sizes
    assert tower_tiles.counts()["batches"] == 3


@pytest.mark.parametrize("tiles", [0, 2])
def test_install_wraps_the_tower_class_only_when_the_lever_is_above_zero(monkeypatch, tiles):
    from vllm.model_executor.models.idefics2_vision_model import (
        Idefics2VisionTransformer,
    )

    original = Idefics2VisionTransformer.forward
    monkeypatch.setattr(Idefics2VisionTransformer, "forward", original)  # put back after the test
    assert tower_tiles.install({"EDGECTL_TOWER_TILES": str(tiles)}) == tiles
    wrapped = Idefics2VisionTransformer.forward is not original
    assert wrapped is (tiles > 0)
    assert not wrapped or Idefics2VisionTransformer.forward.__wrapped__ is original
    assert tower_tiles.counts()["tiles"] == tiles


def test_a_value_the_lever_does_not_take_is_refused():
    with pytest.raises(ValueError, match="EDGECTL_TOWER_TILES='3' is not valid"):
        tower_tiles.install({"EDGECTL_TOWER_TILES": "3"})
