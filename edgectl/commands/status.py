"""`edgectl status` and `edgectl logs`."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from edgectl.output import emit


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status_cmd(
        name: Annotated[Optional[str], typer.Argument(help="A deployment's name (default: all).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print as JSON (schema edgectl.status/1).")] = False,
        memory: Annotated[bool, typer.Option("--memory", help="Also where the worker's memory goes: its attribution of its PSS by part (libraries, weights, KV, allocators, Python objects; docs/memory.md).")] = False,
    ) -> None:
        """State, restarts, uptime, endpoint, measured memory (PSS) against the plan, and tokens served."""
        from edgectl.status import status

        emit(status(name, os.environ, memory_attribution=memory), as_json)

    @app.command("logs")
    def logs_cmd(
        name: Annotated[str, typer.Argument(help="The deployment's name.")],
        follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
        lines: Annotated[int, typer.Option("-n", "--lines", help="How many lines.")] = 50,
    ) -> None:
        """The deployment's journal."""
        from edgectl.status import logs

        raise typer.Exit(logs(name, os.environ, follow, lines))
