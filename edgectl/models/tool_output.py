"""What the helper tools a pull runs (the runtime's converter and model maker, llama.cpp's) printed:
the last lines for a one-line error, and the JSON report on their last line."""

from __future__ import annotations

import json
from typing import Any

from edgectl.errors import EXIT_FAILED, EdgectlError


def tail(text: str, n: int = 1) -> str:
    """The last ``n`` non-empty lines of ``text``, joined with " | " (for a one-line error)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


def last_json(out: str, what: str) -> dict[str, Any]:
    """The JSON object on the last line of ``out``; refused naming ``what`` printed nothing readable."""
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise EdgectlError(f"{what} printed no result ({tail(out)})", exit_code=EXIT_FAILED) from None
