"""`edgectl deploy`, `serve` and `undeploy`."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from edgectl.commands.options import (
    Compilation,
    Format,
    GroupSize,
    Host,
    JsonResult,
    KvDtype,
    MaxModelLen,
    MaxNumSeqs,
    Model,
    Port,
    Threads,
)
from edgectl.contract.plan import DEFAULT_HOST, DEFAULT_NAME, DEFAULT_PORT, Request
from edgectl.output import emit, progress

Name = Annotated[str, typer.Option("--name", help="Deployment name: unit edgectl-NAME.service, config /etc/edgectl/NAME/.")]


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    def deploy_cmd(
        model: Model,
        name: Name = DEFAULT_NAME,
        host: Host = DEFAULT_HOST,
        port: Port = DEFAULT_PORT,
        max_model_len: MaxModelLen = None,
        max_num_seqs: MaxNumSeqs = 1,
        weight_format: Format = None,
        group_size: GroupSize = None,
        threads: Threads = None,
        compilation: Compilation = None,
        kv_cache_dtype: KvDtype = None,
        watchdog_sec: Annotated[Optional[int], typer.Option("--watchdog-sec", help="WatchdogSec (default: 3 × the longest predicted engine step, at least 30 s).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and the unit; write nothing.")] = False,
        allow_synthetic: Annotated[bool, typer.Option("--allow-synthetic", help="Deploy a synthetic model (random weights, e.g. synth-smolvlm-256m) knowingly, to test a deployment: its answers are nonsense.")] = False,
        as_json: JsonResult = False,
    ) -> None:
        """Run MODEL as a supervised systemd service (Type=notify, watchdog, MemoryMax from the plan)."""
        from edgectl.deploy import deploy

        request = Request(model=model, name=name, host=host, port=port, max_model_len=max_model_len,
                          max_num_seqs=max_num_seqs, weight_format=weight_format, group_size=group_size,
                          threads=threads, watchdog_s=watchdog_sec, compilation=compilation,
                          kv_cache_dtype=kv_cache_dtype)
        emit(deploy(request, os.environ, dry_run=dry_run, allow_synthetic=allow_synthetic, progress=progress), as_json)

    @app.command("serve")
    def serve_cmd(
        model: Model,
        host: Host = DEFAULT_HOST,
        port: Port = DEFAULT_PORT,
        max_model_len: MaxModelLen = None,
        max_num_seqs: MaxNumSeqs = 1,
        weight_format: Format = None,
        group_size: GroupSize = None,
        threads: Threads = None,
        compilation: Compilation = None,
        kv_cache_dtype: KvDtype = None,
        ask: Annotated[Optional[str], typer.Option("--ask", help="Once serving, ask this question and print the answer.")] = None,
    ) -> None:
        """Run the same worker in the foreground, with the same plan (for hosts without systemd)."""
        from edgectl.serve import serve

        request = Request(model=model, host=host, port=port, max_model_len=max_model_len,
                          max_num_seqs=max_num_seqs, weight_format=weight_format, group_size=group_size,
                          threads=threads, compilation=compilation, kv_cache_dtype=kv_cache_dtype)
        raise typer.Exit(serve(request, os.environ, question=ask, progress=progress))

    @app.command("undeploy")
    def undeploy_cmd(
        name: Annotated[str, typer.Argument(help="The deployment's name.")],
        as_json: JsonResult = False,
    ) -> None:
        """Stop and remove a deployment (unit and configuration); pulled models are kept."""
        from edgectl.deploy import undeploy

        emit(undeploy(name, os.environ), as_json)
