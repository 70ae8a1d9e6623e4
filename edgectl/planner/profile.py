"""The device profile the plan's figures come from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgectl.contract.plan import Reason
from edgectl.planner.decided import Decided
from edgectl.profiles import Profile, select_profile

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts


def choose_profile(profiles: Sequence[Profile], facts: HostFacts) -> Decided[Profile]:
    """The most specific profile that matches the host (``profiles.select_profile``)."""
    profile, _considered = select_profile(list(profiles), facts)
    detail = f"{profile.kind} profile for {profile.device_class}"
    if profile.emulated:
        detail += f", recorded on an emulated ISA ({profile.emulated})"
    if profile.kind == "fallback":
        detail += "; nobody has measured this class: figures are conservative guesses"
    if profile.kind == "external" and profile.sources:
        detail += f" ({profile.sources[next(iter(profile.sources))].reference})"
    return Decided(profile, Reason("profile", profile.name, profile.reason_source, detail))
