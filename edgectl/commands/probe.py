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
    nfd: Annotated[bool, typer.Option(
        "--nfd", help="Print this node's class as a Node Feature Discovery feature file (labels for "
                      "`edgectl plan --output k8s`).")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", help="With --nfd: write the file atomically to FILE (NFD reads "
                                      "/etc/kubernetes/node-feature-discovery/features.d/).")] = None,
    install_timer: Annotated[bool, typer.Option(
        "--install-timer", help="With --nfd: install edgectl-nfd.timer, which rewrites the file every hour "
                                "(--out, default features.d/edgectl).")] = False,
    remove_timer: Annotated[bool, typer.Option(
        "--remove-timer", help="With --nfd: remove edgectl-nfd.timer and the file.")] = False,
) -> None:
    """Probe this machine: usable instruction set, CPUs, memory budget, software."""
    import os

    if nfd or out is not None or install_timer or remove_timer:
        _nfd(root, bandwidth=bandwidth, as_json=as_json, capture=capture, nfd=nfd, out=out,
             install_timer=install_timer, remove_timer=remove_timer)
        return
    if capture is not None:
        if bandwidth:
            from edgectl.errors import EdgectlError

            raise EdgectlError("--capture copies files and measures nothing: drop --bandwidth")
        from edgectl.probe.capture import capture as do_capture

        emit(do_capture(capture, root=root, environ=os.environ), as_json)
        return
    from edgectl.probe import probe
    from edgectl.probe.render import Probed

    emit(Probed(probe(root, bandwidth=bandwidth, environ=os.environ)), as_json)


def _nfd(root: Path, *, bandwidth: bool, as_json: bool, capture: Path | None, nfd: bool, out: Path | None,
         install_timer: bool, remove_timer: bool) -> None:
    import os

    from edgectl.errors import EdgectlError

    if not nfd:
        raise EdgectlError("--out, --install-timer and --remove-timer go with --nfd")
    if capture is not None:
        raise EdgectlError("--nfd and --capture: give one of them")
    if install_timer and remove_timer:
        raise EdgectlError("--install-timer and --remove-timer: give one of them")
    if install_timer or remove_timer:
        from edgectl.fleet import node
        from edgectl.fleet.labels import FEATURE_FILE
        from edgectl.output import progress

        if root != Path("/") or bandwidth:
            raise EdgectlError("the timer probes this node as it is: drop --root and --bandwidth")
        target = out or Path(FEATURE_FILE)
        if install_timer:
            emit(node.install_timer(os.environ, target, progress), as_json)
        else:
            emit(node.remove_timer(os.environ, target), as_json)
        return
    from edgectl.fleet.node import feature_file

    emit(feature_file(root, bandwidth=bandwidth, environ=os.environ, out=out), as_json)
