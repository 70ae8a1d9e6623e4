"""`edgectl plan MODEL`: what edgectl would run, and what it would cost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgectl.commands.options import (
    Compilation,
    Format,
    GroupSize,
    KvDtype,
    MaxModelLen,
    MaxNumSeqs,
    Model,
    Threads,
)
from edgectl.contract.plan import DEFAULT_NAME, Request
from edgectl.errors import EdgectlError
from edgectl.output import emit

OUTPUTS = ("text", "json", "k8s")


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        model: Model,
        max_model_len: MaxModelLen = None,
        max_num_seqs: MaxNumSeqs = 1,
        weight_format: Format = None,
        group_size: GroupSize = None,
        threads: Threads = None,
        compilation: Compilation = None,
        kv_cache_dtype: KvDtype = None,
        facts: Annotated[Optional[Path], typer.Option("--facts", help="Plan for the host described by this `edgectl probe --json` output instead of this one.")] = None,
        root: Annotated[str, typer.Option("--root", help="Probe /proc and /sys under this directory.")] = "/",
        as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (schema edgectl.plan/1); the same as --output json.")] = False,
        output: Annotated[Optional[str], typer.Option("--output", help="text (default), json, or k8s: the Kubernetes objects (ConfigMap, Deployment, Service) for the node class of --facts, or of every class of --fleet.")] = None,
        fleet: Annotated[Optional[Path], typer.Option("--fleet", help="Plan for a fleet: a directory of `edgectl probe --json` outputs, one NODE.json per node; one plan per node class, and a table of which node gets what.")] = None,
        image: Annotated[Optional[str], typer.Option("--image", help="The runtime image the k8s objects run (built from the Containerfile); default localhost/edgectl-runtime:VERSION.")] = None,
        name: Annotated[str, typer.Option("--name", help="Deployment name: the k8s objects are edgectl-NAME-CLASS, the plan /etc/edgectl/NAME/plan.json.")] = DEFAULT_NAME,
    ) -> None:
        """Decide weight format, context, KV and RoPE budgets, threads and memory limit; refuse what won't fit."""
        from edgectl.inputs import make_plan, read_facts_file

        fmt = _output_format(output, as_json, fleet=fleet is not None, image=image)
        request = Request(model=model, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          weight_format=weight_format, group_size=group_size, threads=threads,
                          compilation=compilation, kv_cache_dtype=kv_cache_dtype, name=name)
        if fleet is not None or fmt == "k8s":
            _plan_nodes(request, fmt, fleet=fleet, facts=facts, root=root, image=image)
            return
        host = read_facts_file(facts) if facts else None
        emit(make_plan(request, os.environ, root=root, facts=host), fmt == "json")


def _output_format(output: str | None, as_json: bool, *, fleet: bool, image: str | None) -> str:
    if output is not None and output not in OUTPUTS:
        raise EdgectlError(f"--output {output!r}: use one of {', '.join(OUTPUTS)}")
    if as_json and output not in (None, "json"):
        raise EdgectlError(f"--json and --output {output}: give one of them")
    fmt = "json" if as_json else output or "text"
    if image is not None and fmt != "k8s":
        raise EdgectlError("--image is what the Kubernetes objects run: add --output k8s")
    return fmt


def _plan_nodes(request: Request, fmt: str, *, fleet: Path | None, facts: Path | None, root: str,
                image: str | None) -> None:
    """A node class (``--facts``, or this host) or a fleet (``--fleet``): plans per class."""
    import sys

    from edgectl.fleet.fleet import plan_fleet, read_nodes
    from edgectl.fleet.k8s import DEFAULT_IMAGE
    from edgectl.inputs import read_facts_file
    from edgectl.units import validate_name

    validate_name(request.name)
    if fleet is not None and facts is not None:
        raise EdgectlError("--fleet and --facts: give one (--fleet DIR plans every NODE.json in DIR)")
    if fleet is not None:
        nodes = read_nodes(fleet)
    elif facts is not None:
        nodes = [(facts.stem, read_facts_file(facts))]
    else:
        import socket

        from edgectl.probe import probe

        nodes = [(socket.gethostname(), probe(root, environ=os.environ))]
    result = plan_fleet(request, nodes, os.environ, image=image or DEFAULT_IMAGE)
    if fmt == "k8s":
        sys.stdout.write(result.render_k8s())
    else:
        emit(result, fmt == "json")
