"""The plan's speeds: decode and prefill rates and the time to ready, from the profile's figures.

A profile's figures were measured on one model (its sources name it); a plan for another model moves
them by what that model costs per token:

- **decode**: a step reads every weight once, and does as much again that does not grow with the
  weights (vLLM's Python around the graph, attention, sampling: docs/kernels.md "Per-token overhead").
  Where the profile has the rate a step reads one more byte at (``compiled.decode_weight_gbps``, the
  slope between two models decoded on the class in one occasion), the time per token is the measured
  model's plus the difference in weight bytes at that rate. Without it, the figure is scaled by the
  bytes alone, which counts the fixed part as if it grew with them: for a model with more bytes than
  the measured one, a floor (docs/facts.md "The plan's speed figures, checked").
- **prefill**: a prompt token multiplies the weights of every linear layer but the LM head (the head
  runs once per sequence), so the figure is scaled by those layers' parameters where the source
  records them (``model_linear_params``); by the weight bytes otherwise.
- **ready**: the profile's time to ready, as measured (the warm start in compiled mode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgectl.contract.plan import Compilation, Predicted, Reason, WeightFormat
from edgectl.planner.decided import Decided

if TYPE_CHECKING:
    from edgectl.profiles import Figure, Profile

GB = 1e9


def predict(profile: Profile, weight_format: WeightFormat, weights_bytes: int, linear_params: int | None,
            compilation: Compilation = Compilation.EAGER) -> Decided[Predicted]:
    """The profile's figures for the plan's format and mode, moved to this model (the rules above).
    In compiled mode, the compiled figures of the same format where the profile has them."""
    figures = profile.formats.get(weight_format)
    decode_fig = figures.decode_tok_s if figures else None
    prefill_fig = figures.prefill_tok_s if figures else None
    ready_fig = profile.ready_s
    rate = None
    compiled = profile.compiled
    if compilation is Compilation.DEFAULT and compiled is not None and compiled.weight_format is weight_format:
        decode_fig = compiled.decode_tok_s or decode_fig
        prefill_fig = compiled.prefill_tok_s or prefill_fig
        ready_fig = compiled.ready_warm_s or ready_fig
        rate = compiled.decode_weight_gbps if compiled.decode_tok_s else None
    decode, decode_why = _decode(decode_fig, rate, weights_bytes)
    prefill, prefill_why = ((prefill_at(prefill_fig.median, prefill_fig, weights_bytes, linear_params),
                             _prefill_rule(prefill_fig, weights_bytes, linear_params)) if prefill_fig
                            else (None, "no prefill figure"))
    measured = decode_fig or prefill_fig
    predicted = Predicted(decode_tok_s=round(decode, 2) if decode else None,
                          prefill_tok_s=round(prefill, 2) if prefill else None,
                          ready_s=round(ready_fig.median, 1) if ready_fig else None,
                          measured_on=measured.source.model if measured else None)
    detail = (f"decode {decode_why}; prefill {prefill_why}; ready "
              + (f"the profile's {ready_fig.describe('s')}" if ready_fig else "not measured"))
    return Decided(predicted, Reason("predicted", {"decode_tok_s": predicted.decode_tok_s,
                                                   "prefill_tok_s": predicted.prefill_tok_s,
                                                   "ready_s": predicted.ready_s},
                                     profile.reason_source, detail))


def prefill_at(value: float, fig: Figure, weights_bytes: int, linear_params: int | None) -> float:
    """A prefill rate ``value`` of ``fig``'s model, moved to this one (prefill_scale)."""
    return value * prefill_scale(fig, weights_bytes, linear_params)[0]


def prefill_scale(fig: Figure, weights_bytes: int, linear_params: int | None) -> tuple[float, str | None]:
    """What a prefill figure of ``fig``'s model is multiplied by for this one, and by what measure (None:
    not moved): the linear layers' parameters where both are known, else the weight bytes."""
    src = fig.source
    if src.model_linear_params and linear_params:
        if src.model_linear_params == linear_params:
            return 1.0, None
        return (src.model_linear_params / linear_params,
                f"the linear layers' parameters but the LM head ({src.model_linear_params / 1e6:.1f}M → "
                f"{linear_params / 1e6:.1f}M)")
    if src.model_weights_bytes and src.model_weights_bytes != weights_bytes:
        return (src.model_weights_bytes / max(weights_bytes, 1),
                f"weight bytes ({src.model_weights_bytes / 1e6:.1f} → {weights_bytes / 1e6:.1f} MB)")
    return 1.0, None


def fixed_step_s(decode_tok_s: float, ref_bytes: int, rate_gbps: float) -> float:
    """The part of a measured decode step that does not read weights: its time per token minus its
    weight bytes at the rate. Negative when the figures disagree (a rate too slow for the decode)."""
    return 1.0 / decode_tok_s - ref_bytes / (rate_gbps * GB)


def _decode(fig: Figure | None, rate: Figure | None, weights_bytes: int) -> tuple[float | None, str]:
    if fig is None:
        return None, "no decode figure"
    ref_bytes = fig.source.model_weights_bytes
    measured = f"{fig.describe('tok/s')} on {fig.source.model or 'the profile model'}"
    if not ref_bytes or ref_bytes == weights_bytes:
        return fig.median, f"the profile's {measured}"
    if rate is not None:
        fixed = fixed_step_s(fig.median, ref_bytes, rate.median)
        if fixed >= 0:
            step = fixed + weights_bytes / (rate.median * GB)
            return 1.0 / step, (f"{1e3 * step:.2f} ms a token: the profile's {measured} ({ref_bytes / 1e6:.1f} MB of "
                                f"weights a token), {1e3 * fixed:.2f} ms of it not reading weights, plus "
                                f"{weights_bytes / 1e6:.1f} MB at {rate.describe('GB/s')}")
    scaled = fig.median * ref_bytes / max(weights_bytes, 1)
    return scaled, (f"the profile's {measured} scaled by weight bytes ({ref_bytes / 1e6:.1f} → "
                    f"{weights_bytes / 1e6:.1f} MB; the part of a step that does not read weights scaled with "
                    "them, so for a bigger model a floor)")


def _prefill_rule(fig: Figure, weights_bytes: int, linear_params: int | None) -> str:
    measured = f"the profile's {fig.describe('tok/s')} on {fig.source.model or 'the profile model'}"
    _, by = prefill_scale(fig, weights_bytes, linear_params)
    return f"{measured} scaled by {by}" if by else measured
