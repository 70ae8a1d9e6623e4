"""The rate a decode step reads one more byte of weights at, fitted from two bench runs of two models.

A decode step on a CPU is the weights read once plus a part that does not grow with them (vLLM's
Python around the graph, attention, sampling). One model cannot tell the two apart; two models of
different sizes, decoded on the same class in one occasion with the same format and mode, can: the
slope of the time per token over the weight bytes per token is the rate the profile's
``compiled.decode_weight_gbps`` records (planner/speed.py moves a decode figure with it). The
farther apart the two are in bytes, and the more of the difference is layers rather than an LM head
(one long GEMV streams faster than many small layers), the better the slope describes the bigger
models a box serves (docs/facts.md "The plan's speed figures, checked").

    python -m edgectl.bench.decode_rate SMALL.json BIG.json [--arm planned]

prints the figure (the slope between the two arms' medians; min and max over every pair of one pass
of each) and the source entry for the profile, or one line saying why the two runs do not fit one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from edgectl.errors import EdgectlError
from edgectl.planner.speed import GB, fixed_step_s

# Two models whose bytes per token differ by less than this factor leave the slope to the noise: a 25%
# spread in one run's decode (the bench's noise gate) moves it by more than the difference.
MIN_BYTES_RATIO = 1.5


class _Run(NamedTuple):
    """One model's run: its arm's medians and passes (decode tok/s, weight bytes a token)."""

    model: str | None
    path: str
    plan: dict[str, Any]
    decode_tok_s: float
    weights_bytes: int
    passes: list[tuple[float, int]]


def _run(artifact: dict[str, Any], arm: str, path: str) -> _Run:
    entry = (artifact.get("arms") or {}).get(arm)
    if not entry or not entry.get("passes"):
        raise EdgectlError(f"{path}: no arm {arm!r} with passes")
    passes = [(float(p["decode_tok_s"]), int(p["weights_bytes_per_token"])) for p in entry["passes"]
              if p.get("decode_tok_s") and p.get("weights_bytes_per_token")]
    if len(passes) < len(entry["passes"]) or not passes:
        raise EdgectlError(f"{path}: arm {arm!r} has a pass without a decode rate or weight bytes (an incomplete run)")
    return _Run((artifact.get("provenance") or {}).get("model"), path, entry.get("plan") or {},
                statistics.median(d for d, _ in passes), int(statistics.median(w for _, w in passes)), passes)


def _slope_gbps(small: tuple[float, int], big: tuple[float, int]) -> float | None:
    """GB/s from two (tok/s, bytes) points; None when the bigger model was not the slower one."""
    dt = 1.0 / big[0] - 1.0 / small[0]
    return (big[1] - small[1]) / dt / GB if dt > 0 else None


def fit(a: dict[str, Any], b: dict[str, Any], arm: str = "planned", paths: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """The figure and what it was fitted from; EdgectlError when the runs do not make one."""
    classes = {(x.get("provenance") or {}).get("probe", {}).get("device_class") for x in (a, b)}
    small, big = sorted((_run(a, arm, paths[0]), _run(b, arm, paths[1])), key=lambda r: r.weights_bytes)
    if len(classes) != 1:
        raise EdgectlError(f"the two runs are of different device classes ({', '.join(sorted(map(str, classes)))})")
    for key in ("weight_format", "compilation"):
        if small.plan.get(key) != big.plan.get(key):
            raise EdgectlError(f"the two arms' plans differ in {key} ({small.plan.get(key)} and {big.plan.get(key)}): "
                               "the rate is one format's in one mode")
    if big.weights_bytes < MIN_BYTES_RATIO * small.weights_bytes:
        raise EdgectlError(f"the two models read {small.weights_bytes / 1e6:.1f} and {big.weights_bytes / 1e6:.1f} MB "
                           f"a token: less than {MIN_BYTES_RATIO}× apart, the slope would be the runs' noise")
    median = _slope_gbps((small.decode_tok_s, small.weights_bytes), (big.decode_tok_s, big.weights_bytes))
    pairs = [_slope_gbps(s, g) for s, g in product(small.passes, big.passes)]
    if median is None or any(p is None for p in pairs):
        raise EdgectlError(f"{big.path} decoded as fast as {small.path} or faster in some passes, with more bytes: "
                           "the host changed between the runs (measure the two again, one after the other)")
    rates = [p for p in pairs if p is not None]
    return {
        "figure": {"median": round(median, 2), "min": round(min(rates), 2), "max": round(max(rates), 2),
                   "passes": min(len(small.passes), len(big.passes))},
        "models": {r.model: {"decode_tok_s": round(r.decode_tok_s, 2), "weights_bytes_per_token": r.weights_bytes,
                             "artifact": r.path} for r in (small, big)},
        "fixed_ms": round(1e3 * fixed_step_s(small.decode_tok_s, small.weights_bytes, median), 3),
        "weight_format": small.plan.get("weight_format"), "compilation": small.plan.get("compilation"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgectl.bench.decode_rate", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts", nargs=2, help="two bench artifacts (JSON) of two models on one class")
    parser.add_argument("--arm", default="planned", help="the arm of each run to fit (default planned)")
    args = parser.parse_args(argv)
    try:
        docs = []
        for path in args.artifacts:
            try:
                docs.append(json.loads(Path(path).read_text()))
            except (OSError, ValueError) as exc:
                raise EdgectlError(f"{path}: not a readable bench artifact ({exc})") from exc
        out = fit(docs[0], docs[1], args.arm, (args.artifacts[0], args.artifacts[1]))
    except EdgectlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump({"decode_weight_gbps": out["figure"]}, sort_keys=False).rstrip())
    for name, m in out["models"].items():
        print(f"# {name}: {m['decode_tok_s']} tok/s, {m['weights_bytes_per_token'] / 1e6:.1f} MB a token ({m['artifact']})")
    print(f"# {out['weight_format']}, compilation {out['compilation']}; the part of a step that does not read "
          f"weights: {out['fixed_ms']} ms on the smaller model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
