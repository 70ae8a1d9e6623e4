"""`edgectl probe`: what this box really has (device class, usable CPUs, memory budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgectl.output import emit


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)


def probe_command(
    as_json: Annotated[bool, typer.Option("--json", help='Print one JSON object (schema "edgectl.probe/1").')] = False,
    root: Annotated[Path, typer.Option(
        "--root", help="Read /proc and /sys under this directory instead of / (a captured tree).",
        file_okay=True, dir_okay=True, resolve_path=False)] = Path("/"),
    bandwidth: Annotated[bool, typer.Option(
        "--bandwidth", help="Also measure memory bandwidth with a multi-threaded copy (about 2 s).")] = False,
    capture: Annotated[Path | None, typer.Option(
        "--capture", metavar="DIR",
        help="Copy the files the probe reads into DIR (a new directory), e.g. for a bug report.")] = None,
) -> None:
    """Probe this machine: usable instruction set, CPUs, memory budget, software."""
    import os

    if capture is not None:
        if bandwidth:
            from edgectl.errors import EdgectlError

            raise EdgectlError("--capture copies files and measures nothing: drop --bandwidth")
        from edgectl.probe.capture import capture as do_capture

        emit(do_capture(capture, root=root, environ=os.environ), as_json)
        return
    from edgectl.probe import probe

    emit(probe(root, bandwidth=bandwidth, environ=os.environ), as_json)
