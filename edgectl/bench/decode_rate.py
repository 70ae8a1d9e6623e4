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
from typing import Any

import yaml

from edgectl.errors import EdgectlError

GB = 1e9
# Two models whose bytes per token differ by less than this factor leave the slope to the noise: a 25%
# spread in one run's decode (the bench's noise gate) moves it by more than the difference.
MIN_BYTES_RATIO = 1.5


def _passes(artifact: dict[str, Any], arm: str, path: str) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    """The arm's plan and its passes as (decode tok/s, weight bytes a token)."""
    entry = (artifact.get("arms") or {}).get(arm)
    if not entry or not entry.get("passes"):
        raise EdgectlError(f"{path}: no arm {arm!r} with passes")
    passes = [(float(p["decode_tok_s"]), int(p["weights_bytes_per_token"])) for p in entry["passes"]
              if p.get("decode_tok_s") and p.get("weights_bytes_per_token")]
    if len(passes) < len(entry["passes"]) or not passes:
        raise EdgectlError(f"{path}: arm {arm!r} has a pass without a decode rate or weight bytes (an incomplete run)")
    return entry.get("plan") or {}, passes


def _slope_gbps(small: tuple[float, int], big: tuple[float, int]) -> float | None:
    """GB/s from two (tok/s, bytes) points; None when the bigger model was not the slower one."""
    dt = 1.0 / big[0] - 1.0 / small[0]
    return (big[1] - small[1]) / dt / GB if dt > 0 else None


def fit(a: dict[str, Any], b: dict[str, Any], arm: str = "planned", paths: tuple[str, str] = ("A", "B")) -> dict[str, Any]:
    """The figure and what it was fitted from; EdgectlError when the runs do not make one."""
    (plan_a, passes_a), (plan_b, passes_b) = _passes(a, arm, paths[0]), _passes(b, arm, paths[1])
    classes = {(x.get("provenance") or {}).get("probe", {}).get("device_class") for x in (a, b)}
    if len(classes) != 1:
        raise EdgectlError(f"the two runs are of different device classes ({', '.join(sorted(map(str, classes)))})")
    for key in ("weight_format", "compilation"):
        if plan_a.get(key) != plan_b.get(key):
            raise EdgectlError(f"the two arms' plans differ in {key} ({plan_a.get(key)} and {plan_b.get(key)}): "
                               "the rate is one format's in one mode")
    models = [(statistics.median(d for d, _ in ps), int(statistics.median(w for _, w in ps)), ps, x, path)
              for ps, x, path in ((passes_a, a, paths[0]), (passes_b, b, paths[1]))]
    small, big = sorted(models, key=lambda m: m[1])
    if big[1] < MIN_BYTES_RATIO * small[1]:
        raise EdgectlError(f"the two models read {small[1] / 1e6:.1f} and {big[1] / 1e6:.1f} MB a token: less than "
                           f"{MIN_BYTES_RATIO}× apart, the slope would be the runs' noise")
    median = _slope_gbps((small[0], small[1]), (big[0], big[1]))
    pairs = [_slope_gbps(s, g) for s, g in product(small[2], big[2])]
    if median is None or any(p is None for p in pairs):
        raise EdgectlError(f"{big[4]} decoded as fast as {small[4]} or faster in some passes, with more bytes: "
                           "the host changed between the runs (measure the two again, one after the other)")
    rates = [p for p in pairs if p is not None]
    names = [(m[3].get("provenance") or {}).get("model") for m in (small, big)]
    return {
        "figure": {"median": round(median, 2), "min": round(min(rates), 2), "max": round(max(rates), 2),
                   "passes": min(len(small[2]), len(big[2]))},
        "models": {name: {"decode_tok_s": round(m[0], 2), "weights_bytes_per_token": m[1], "artifact": m[4]}
                   for name, m in zip(names, (small, big), strict=True)},
        "fixed_ms": round(1e3 * (1.0 / small[0] - small[1] / (median * GB)), 3),
        "weight_format": plan_a.get("weight_format"), "compilation": plan_a.get("compilation"),
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
