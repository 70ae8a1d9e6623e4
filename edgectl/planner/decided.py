"""A decision's value with the reasons given for it, and the plan's list of reasons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from edgectl.contract.plan import Reason

T = TypeVar("T")


@dataclass(frozen=True)
class Decided(Generic[T]):
    """What a decision chose, and why (one reason, or several when it was made in steps)."""

    value: T
    reasons: tuple[Reason, ...]

    def __init__(self, value: T, *reasons: Reason) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "reasons", tuple(reasons))


class Reasons:
    """The plan's reasons, in the order the decisions were made."""

    def __init__(self) -> None:
        self.items: list[Reason] = []

    def take(self, decided: Decided[T]) -> T:
        """Record a decision's reasons; its value."""
        self.items.extend(decided.reasons)
        return decided.value
