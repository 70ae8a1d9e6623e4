"""`edgectl plan MODEL`: what edgectl would run, and what it would cost."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgectl.errors import EdgectlError
from edgectl.output import emit
from edgectl.plan import Request


def read_facts_file(path: Path):
    """A probe taken elsewhere (`edgectl probe --json > facts.json`), to plan for that host."""
    from edgectl.probe.facts import HostFacts

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise EdgectlError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise EdgectlError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}): give the output of `edgectl probe --json`") from None
    return HostFacts.from_dict(data, source=str(path))  # errors name the file: `facts.json: cpu.isa: missing`


# Options shared with deploy, serve and bench.
MaxModelLen = Annotated[Optional[int], typer.Option("--max-model-len", help="Context length in tokens (default: the largest that fits, up to 4096 or the model's maximum).")]
MaxNumSeqs = Annotated[int, typer.Option("--max-num-seqs", help="Sequences served at once; KV is sized for each at full context.")]
Format = Annotated[Optional[str], typer.Option("--format", help="Weight format: w4a16, w4a8-amx, w4a16-vllm or bf16 (default: the fastest measured that runs here).")]
GroupSize = Annotated[Optional[int], typer.Option("--group-size", help="Preferred int4 group size (32, 64, 128, 256; default: what suits the model, else 128); chosen per layer where K is not a multiple.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="OpenMP threads (default: one per usable physical core).")]
Compilation = Annotated[Optional[str], typer.Option("--compilation", help="eager, or default (vLLM's torch.compile mode: faster decode, more memory, a slower start); default: the profile's.")]


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        model: Annotated[str, typer.Argument(help="A catalog name (`edgectl models list`) or a Hugging Face model directory.")],
        max_model_len: MaxModelLen = None,
        max_num_seqs: MaxNumSeqs = 1,
        weight_format: Format = None,
        group_size: GroupSize = None,
        threads: Threads = None,
        compilation: Compilation = None,
        facts: Annotated[Optional[Path], typer.Option("--facts", help="Plan for the host described by this `edgectl probe --json` output instead of this one.")] = None,
        root: Annotated[str, typer.Option("--root", help="Probe /proc and /sys under this directory.")] = "/",
        as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (schema edgectl.plan/1).")] = False,
    ) -> None:
        """Decide weight format, context, KV and RoPE budgets, threads and memory limit; refuse what won't fit."""
        from edgectl.planning import make_plan

        request = Request(model=model, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          weight_format=weight_format, group_size=group_size, threads=threads,
                          compilation=compilation)
        host = read_facts_file(facts) if facts else None
        emit(make_plan(request, os.environ, root=root, facts=host), as_json)
