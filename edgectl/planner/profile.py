"""The device profile the plan's figures come from.

A profile recorded on the device class itself is chosen over one recorded with the ISA held down on
a bigger CPU (``profiles.select_profile``). Where the chosen one never measured a weight format that
an emulated profile of the same class did, the format's figures are taken from that one
(:func:`with_emulated_formats`): scaled by a format both measured, so a figure of the emulating
CPU's memory system and clock is never ranked against one of the class's own, and named so in
every reason that cites them ("emulated"), until the class itself is measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgectl.contract.plan import Reason, WeightFormat
from edgectl.planner.decided import Decided
from edgectl.profiles import (
    CompiledFigures,
    Figure,
    FormatFigures,
    Profile,
    select_profile,
)

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts


def choose_profile(profiles: Sequence[Profile], facts: HostFacts) -> Decided[Profile]:
    """The most specific profile that matches the host (``profiles.select_profile``), with the
    formats only an emulated profile of its class measured (:func:`with_emulated_formats`)."""
    profile, _considered = select_profile(list(profiles), facts)
    profile, borrowed = with_emulated_formats(profile, profiles, facts)
    detail = f"{profile.kind} profile for {profile.device_class}"
    if profile.emulated:
        detail += f", recorded on an emulated ISA ({profile.emulated})"
    if profile.kind == "fallback":
        detail += "; nobody has measured this class: figures are conservative guesses"
    if profile.kind == "external" and profile.sources:
        detail += f" ({profile.sources[next(iter(profile.sources))].reference})"
    if borrowed:
        detail += "; " + borrowed
    return Decided(profile, Reason("profile", profile.name, profile.reason_source, detail))


def emulated_companion(profile: Profile, profiles: Sequence[Profile], facts: HostFacts) -> Profile | None:
    """The emulated profile of the chosen profile's class that matches this host, if the chosen one is
    not emulated itself (the most specific, as ``select_profile`` ranks)."""
    if profile.emulated:
        return None
    companions = [p for p in profiles if p.emulated and p is not profile and p.device_class == profile.device_class
                  and p.device_class == facts.device_class and p.matches(facts)[0]]
    return max(companions, key=lambda p: p.specificity(), default=None)


def with_emulated_formats(profile: Profile, profiles: Sequence[Profile], facts: HostFacts) -> tuple[Profile, str]:
    """``profile`` with the formats it never measured taken from its emulated companion, and what was
    taken, in words ("" when nothing was).

    A borrowed format's decode and prefill are the companion's scaled by a format both profiles
    measured (the chosen profile's fastest such; each speed by its own ratio): figure × (this class's
    reference / the companion's reference, same run as the figure). Its measured resident-weights
    ratio is the companion's as it is (bytes do not depend on the clock). Its source says all this.
    The companion's compiled mode is taken the same way where the chosen profile measured none
    (:func:`_borrowed_compiled`).
    """
    companion = emulated_companion(profile, profiles, facts)
    if companion is None:
        return profile, ""
    reference = _reference_format(profile, companion)
    if reference is None:
        return profile, ""
    ours, theirs = profile.formats[reference], companion.formats[reference]
    borrowed: dict[WeightFormat, FormatFigures] = {}
    for fmt, figures in companion.formats.items():
        if fmt in profile.formats or not figures.runs or figures.decode_tok_s is None:
            continue
        borrowed[fmt] = FormatFigures(
            runs=True, reason=None,
            decode_tok_s=_scaled(figures.decode_tok_s, ours.decode_tok_s, theirs.decode_tok_s, companion),
            prefill_tok_s=_scaled(figures.prefill_tok_s, ours.prefill_tok_s, theirs.prefill_tok_s, companion),
            weights_bytes_ratio=figures.weights_bytes_ratio)
    formats = {**profile.formats, **borrowed}
    compiled = _borrowed_compiled(profile, companion, formats, ours, theirs)
    parts = sorted(borrowed) + ([f"{compiled.weight_format} compiled"] if compiled else [])
    if not parts:
        return profile, ""
    what = (f"{', '.join(parts)} not measured on {profile.device_class} itself: taken from {companion.name} "
            f"(emulated: {companion.emulated}), speeds scaled by {reference} measured on both"
            + (", start times by the eager start measured on both" if compiled and _starts_scaled(profile, companion)
               else "") + "; to re-measure on this class")
    return dataclasses.replace(profile, formats=formats, compiled=compiled or profile.compiled), what


def _borrowed_compiled(profile: Profile, companion: Profile, formats: dict[WeightFormat, FormatFigures],
                       ours: FormatFigures, theirs: FormatFigures) -> CompiledFigures | None:
    """The companion's compiled-mode figures, where the chosen profile measured no compiled mode and the
    companion's compiled format is among ``formats``: speeds scaled as the formats' are, start times by
    the eager start both measured (copied where either lacks it), memory (the bytes compiled mode adds,
    the compiling start's peak over the steady PSS) as the companion measured it."""
    theirs_compiled = companion.compiled
    if profile.compiled is not None or theirs_compiled is None or theirs_compiled.weight_format not in formats:
        return None
    def start(figure: Figure | None) -> Figure | None:
        if not _starts_scaled(profile, companion):
            return figure
        return _scaled(figure, profile.ready_s, companion.ready_s, companion)

    return dataclasses.replace(
        theirs_compiled,
        decode_tok_s=_scaled(theirs_compiled.decode_tok_s, ours.decode_tok_s, theirs.decode_tok_s, companion),
        prefill_tok_s=_scaled(theirs_compiled.prefill_tok_s, ours.prefill_tok_s, theirs.prefill_tok_s, companion),
        ready_cold_s=start(theirs_compiled.ready_cold_s), ready_warm_s=start(theirs_compiled.ready_warm_s))


def _starts_scaled(profile: Profile, companion: Profile) -> bool:
    """Whether both measured the eager start that start times are scaled by."""
    return profile.ready_s is not None and companion.ready_s is not None


def _reference_format(profile: Profile, companion: Profile) -> WeightFormat | None:
    """The format both measured (decode on both), the chosen profile's fastest such."""
    shared = [f for f, fig in profile.formats.items()
              if fig.runs and fig.decode_tok_s is not None and f in companion.formats
              and companion.formats[f].runs and companion.formats[f].decode_tok_s is not None]
    return max(shared, key=lambda f: profile.formats[f].decode_tok_s.median, default=None)  # type: ignore[union-attr]


def _scaled(figure: Figure | None, ours: Figure | None, theirs: Figure | None, companion: Profile) -> Figure | None:
    """``figure`` (the companion's) × ours / theirs, its source naming both; None without all three."""
    if figure is None or ours is None or theirs is None or theirs.median <= 0:
        return None
    k = ours.median / theirs.median

    def scale(value: float | None) -> float | None:
        return None if value is None else round(value * k, 2)  # to the recorder's precision

    src = figure.source
    source = dataclasses.replace(
        src, key=f"{src.key} (emulated) x {ours.source.key} / {theirs.source.key}",
        notes=(f"emulated on {companion.emulated}: {figure.median:g} there, scaled by {k:.3f} = this class's "
               f"{ours.median:g} / the emulation's {theirs.median:g}, the same measurement on both"))
    median = scale(figure.median)
    assert median is not None
    return Figure(median=median, min=scale(figure.min), max=scale(figure.max), passes=figure.passes, source=source)
