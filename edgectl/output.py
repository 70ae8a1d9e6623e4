"""Rendering results: the same result object as text or as versioned JSON."""

from __future__ import annotations

import json
import sys
from typing import Any, Protocol


class Renderable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...

    def render_text(self) -> str: ...


MiB = 1 << 20
GiB = 1 << 30


def mib(n: int) -> str:
    """Bytes for a person: whole MiB below 10 GiB, else GiB with one decimal."""
    return f"{n / MiB:.0f} MiB" if n < 10 * GiB else f"{n / GiB:.1f} GiB"


def to_json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def progress(line: str) -> None:
    """A progress line for the person watching: stderr, so stdout stays the result."""
    print(line, file=sys.stderr, flush=True)


def emit(result: Renderable, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(to_json(result.to_dict()))
    else:
        text = result.render_text()
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
