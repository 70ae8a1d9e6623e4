"""The noise gate (edgectl/bench/noise.py): an arm whose passes disagree is noisy, not quotable.

Checked on fabricated pass lists (quiet, noisy, noisy only in the aggregate, noisy only in prefill)
and, through the same function, on committed artifacts: a run made while other work shared the host
and one made on a quiet host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgectl.bench import report
from edgectl.bench.noise import MAX_DECODE_SPREAD, noise_gate

RESULTS = Path(__file__).resolve().parents[1] / "results"


def passes(decode: list[float], prefill: list[float], aggregate: list[float] | None = None,
           status: str = "ok") -> list[dict]:
    out = [{"status": status, "decode_tok_s": d, "prefill_tok_s": p} for d, p in zip(decode, prefill)]
    for rec, agg in zip(out, aggregate or []):
        rec["aggregate_decode_tok_s"] = agg
    return out


def test_quiet_passes_pass_the_gate() -> None:
    gate = noise_gate({"stock": {"passes": passes([50.0, 52.0, 51.0], [300, 310, 305])},
                       "planned": {"passes": passes([120.0, 126.0, 131.0], [900, 1000, 950])}})
    assert gate["quiet"] is True and gate["control"] == "stock"
    assert gate["arms"]["planned"]["decode_tok_s"] == pytest.approx(131 / 120)
    assert gate["arms"]["planned"]["prefill_tok_s"] == pytest.approx(1000 / 900)
    assert gate["arms"]["planned"]["aggregate_decode_tok_s"] is None  # not measured: unknown, not 1
    assert not any(a["noisy"] for a in gate["arms"].values())


def test_one_disturbed_pass_makes_its_arm_and_the_run_noisy() -> None:
    gate = noise_gate({"stock": {"passes": passes([50.0, 52.0, 51.0], [300, 310, 305])},
                       "planned": {"passes": passes([120.0, 60.0, 125.0], [900, 1000, 950])}})
    assert gate["arms"]["planned"]["noisy"] is True and gate["arms"]["stock"]["noisy"] is False
    assert gate["quiet"] is False


def test_the_bound_is_inclusive_and_a_noisy_control_counts() -> None:
    at_bound = passes([100.0, 100.0 * MAX_DECODE_SPREAD], [1, 1])
    just_over = passes([100.0, 100.0 * MAX_DECODE_SPREAD + 0.1], [1, 1])
    assert noise_gate({"planned": {"passes": at_bound}})["quiet"] is True
    gate = noise_gate({"stock": {"passes": just_over}, "planned": {"passes": at_bound}})
    assert gate["arms"]["stock"]["noisy"] and not gate["quiet"]  # ratios are divided by the control


def test_the_aggregate_decode_is_gated_and_prefill_only_recorded() -> None:
    aggregate_noisy = passes([100.0, 101.0], [500, 510], aggregate=[400.0, 45.0])
    assert noise_gate({"planned": {"passes": aggregate_noisy}})["arms"]["planned"]["noisy"] is True
    prefill_noisy = passes([100.0, 101.0], [500, 1500])
    gate = noise_gate({"planned": {"passes": prefill_noisy}})
    assert gate["arms"]["planned"]["prefill_tok_s"] == pytest.approx(3.0) and gate["quiet"] is True


def test_only_ok_passes_count() -> None:
    mixed = passes([100.0, 102.0], [1, 1]) + passes([5.0], [1], status="invalid")
    assert noise_gate({"planned": {"passes": mixed}})["quiet"] is True


def test_a_committed_run_on_a_shared_host_is_noisy() -> None:
    # docs/measurements/eight-streams.md: "Other work shared the machine during the run"
    artifact = json.loads((RESULTS / "2026-12-02-x86_64-amx-smollm2-135m-8-streams.json").read_text())
    assert artifact["quotable"] is True  # written before the gate
    gate = noise_gate(artifact["arms"])
    assert gate["quiet"] is False
    assert gate["arms"]["llama.cpp"]["decode_tok_s"] > 9  # 6.3–74.0 tok/s
    assert gate["arms"]["planned"]["aggregate_decode_tok_s"] > 9  # 42.4–386.7 tok/s
    assert {n for n, v in gate["arms"].items() if v["noisy"]} == {"stock", "planned", "llama.cpp"}
    # the report, given the gate, prints it per arm and does not call the run quotable
    text = report.render_text({**artifact, "noise": gate, "quotable": False}, None, [])
    assert "(noisy: stock, planned, llama.cpp: not a figure to quote" in text
    assert "  llama.cpp: decode 11.72×" in text and text.count("— noisy, not quotable") == 3


def test_a_committed_run_on_a_quiet_host_is_quiet() -> None:
    artifact = json.loads((RESULTS / "2026-12-02-x86_64-avx512-bf16-smollm2-135m-recorded.json").read_text())
    gate = noise_gate(artifact["arms"])
    assert gate["quiet"] is True
    assert max(v["decode_tok_s"] for v in gate["arms"].values()) < 1.1
    assert report.render_text({**artifact, "noise": gate}, None, []).count("— quiet") == len(artifact["arms"])
