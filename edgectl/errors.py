"""The one exception type the core raises for anything a user can fix.

Only the CLI turns it into output: one ``error:`` line on stderr and the exit code.
"""

from __future__ import annotations

# Exit codes, used by every command.
EXIT_BAD_INPUT = 2  # the request cannot be served as asked: nothing was written or stopped
EXIT_FAILED = 1  # the request was valid but failed while being carried out


class EdgectlError(Exception):
    """A problem the user can act on: what was wrong, and what to do about it."""

    def __init__(self, message: str, *, exit_code: int = EXIT_BAD_INPUT, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        # extra lines shown after the one-line message (e.g. a journal tail, one line per bad field)
        self.details = list(details or [])

    def __str__(self) -> str:
        return self.message
