"""A vision plan's image limits (edgectl/contract/vision.py) as the plan carries them: a text plan's
JSON is as it was, a vision plan's reads back equal, a bad limit is named by its path."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_helpers import SMOLLM2, host_facts, make_plan, shape

from edgectl.contract.plan import Plan
from edgectl.contract.vision import PILLOW_BOMB_PIXELS, ImageLimits, VisionServe
from edgectl.errors import EdgectlError


@pytest.fixture(scope="module")
def text_plan() -> Plan:
    return make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2))


def test_a_text_plan_has_no_vision_part_and_its_json_none(text_plan):
    assert text_plan.vision is None and "vision" not in text_plan.to_dict()
    assert Plan.from_dict(text_plan.to_dict()) == text_plan


def test_a_vision_plan_says_so_and_a_text_plan_still_says_text(text_plan):
    vision = replace(text_plan, vision=VisionServe())
    assert (vision.modality, text_plan.modality) == ("vision", "text")
    # derived from the vision part, never written: the JSON differs by that part alone
    assert "modality" not in vision.to_dict()
    assert {k: v for k, v in vision.to_dict().items() if k != "vision"} == text_plan.to_dict()


def test_a_vision_plan_reads_back_equal(text_plan):
    limits = ImageLimits(max_pixels=1024 * 1024, max_images_per_request=3, max_request_bytes=4_000_000,
                         allow_remote_urls=True)
    plan = replace(text_plan, vision=VisionServe(images=limits))
    data = plan.to_dict()
    assert data["vision"] == {"images": {"max_pixels": 1048576, "max_images_per_request": 3,
                                         "max_request_bytes": 4000000, "allow_remote_urls": True},
                              "tower_tiles": 0}  # all tiles at once: what a plan without the lever runs
    assert Plan.from_dict(data) == plan


def test_the_defaults_fill_what_a_hand_written_plan_leaves_out(text_plan):
    data = text_plan.to_dict() | {"vision": {}}
    assert Plan.from_dict(data).vision == VisionServe(images=ImageLimits())
    limits = ImageLimits()
    assert (limits.max_pixels, limits.max_images_per_request, limits.max_request_bytes,
            limits.allow_remote_urls) == (4096 * 4096, 1, 20 * 1024 * 1024, False)


@pytest.mark.parametrize(("images", "says"), [
    ({"max_pixels": 0}, "plan.vision.images.max_pixels: expected a number >= 1, got 0"),
    ({"max_pixels": PILLOW_BOMB_PIXELS + 1}, "Pillow's decompression-bomb threshold"),
    ({"max_images_per_request": 0}, "plan.vision.images.max_images_per_request: expected a number >= 1"),
    ({"max_request_bytes": -1}, "plan.vision.images.max_request_bytes: expected a number >= 1"),
    ({"allow_remote_urls": "yes"}, "plan.vision.images.allow_remote_urls"),
    ({"max_pixel": 10}, "plan.vision.images.max_pixel"),
])
def test_a_bad_limit_is_named(text_plan, images, says):
    with pytest.raises(EdgectlError) as caught:
        Plan.from_dict(text_plan.to_dict() | {"vision": {"images": images}})
    assert says in caught.value.message


def test_the_pillow_threshold_is_pillows_own():
    image = pytest.importorskip("PIL.Image")
    assert image.MAX_IMAGE_PIXELS == PILLOW_BOMB_PIXELS
