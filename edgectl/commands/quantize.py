"""`edgectl quantize SRC OUT [--group-size N]`: write a portable cpu_int4 checkpoint.

The control plane checks the arguments (no torch here), then runs
``<runtime python> -m edgectl_runtime.tools.quantize`` (EDGECTL_RUNTIME_PYTHON), which streams the
checkpoint tensor by tensor into a temporary directory beside OUT and renames it into place:
on any failure nothing is left at OUT.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from edgectl import launch
from edgectl.contract import environment
from edgectl.contract.int4_layout import (
    ALLOWED_GROUP_SIZES,
    DEFAULT_GROUP_SIZE,
    PORTABLE_FORMAT,
)
from edgectl.errors import EXIT_BAD_INPUT, EXIT_FAILED, EdgectlError
from edgectl.output import emit, progress

SCHEMA = "edgectl.quantize/1"


@dataclass(frozen=True)
class QuantizeResult:
    source: str
    output: str
    group_size: int
    group_sizes_used: dict[str, int]
    quantized_weights: int
    copied_tensors: int
    source_bytes: int
    output_bytes: int
    sha256: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "source": self.source, "output": self.output, "format": PORTABLE_FORMAT,
                "group_size": self.group_size, "group_sizes_used": dict(self.group_sizes_used),
                "quantized_weights": self.quantized_weights, "copied_tensors": self.copied_tensors,
                "source_bytes": self.source_bytes, "output_bytes": self.output_bytes, "sha256": dict(self.sha256)}

    def render_text(self) -> str:
        groups = ", ".join(f"g{g}: {n}" for g, n in sorted(self.group_sizes_used.items(), key=lambda kv: int(kv[0])))
        return "\n".join([
            f"wrote {self.output}",
            f"  from {self.source}",
            f"  {self.quantized_weights} linear weights as int4 (preferred group {self.group_size}; {groups}), "
            f"{self.copied_tensors} tensors copied",
            f"  weights {self.source_bytes / 1e6:.1f} MB -> {self.output_bytes / 1e6:.1f} MB",
            f"  model.safetensors sha256 {self.sha256.get('model.safetensors', '?')}",
            "  vLLM serves it as cpu_int4 (its config.json names the method)",
        ])


def check_arguments(src: Path, out: Path, group_size: int) -> None:
    """Everything that can be checked without torch; raises EdgectlError (exit 2) on bad input."""
    if group_size not in ALLOWED_GROUP_SIZES:
        raise EdgectlError(f"--group-size {group_size} is not supported: use one of "
                           f"{', '.join(str(g) for g in ALLOWED_GROUP_SIZES)}")
    if not src.is_dir():
        raise EdgectlError(f"{src} is not a directory: give a Hugging Face model directory "
                           "(e.g. one from `edgectl models pull`)")
    config_path = src / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EdgectlError(f"{src} has no config.json: give a Hugging Face model directory") from None
    except (OSError, ValueError) as exc:
        raise EdgectlError(f"{config_path} is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise EdgectlError(f"{config_path} is not a JSON object")
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise EdgectlError(f"{src} is already quantized (quant_method {method}): quantize a bf16/fp16 checkpoint")
    if not any(src.glob("*.safetensors")):
        raise EdgectlError(f"{src} has no *.safetensors files: quantize reads safetensors checkpoints only")
    if out.exists() or out.is_symlink():
        raise EdgectlError(f"{out} already exists: choose a new output directory or remove it")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise EdgectlError(f"{parent} does not exist: create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise EdgectlError(f"{parent} is not writable: choose an output directory you can write")


def quantize_checkpoint(src: Path, out: Path, group_size: int, environ: Mapping[str, str],
                        progress: Callable[[str], None] | None = None) -> QuantizeResult:
    """Validate, then run the runtime's quantizer in a subprocess."""
    check_arguments(src, out, group_size)
    python = environment.runtime_python(environ)
    cmd = launch.command(python, launch.QUANTIZE, [str(src), str(out.absolute()), "--group-size", str(group_size)])
    proc = subprocess.Popen(cmd, env=launch.environment(environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    other: list[str] = []
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:  # progress lines as they come
        line = line.rstrip("\n")
        if line.startswith("quantize: "):
            if progress:
                progress(line)
        elif line.strip():
            other.append(line)
    stdout = proc.stdout.read()
    code = proc.wait()
    if code == EXIT_BAD_INPUT:
        message = next((x[len("error: "):] for x in reversed(other) if x.startswith("error: ")), None)
        raise EdgectlError(message or f"the quantizer refused its input: {other[-1] if other else '(no output)'}")
    if code != 0:
        missing = [m for m in ("torch", "safetensors") if f"No module named '{m}'" in "\n".join(other)]
        hint = (f"; {python} lacks {', '.join(missing)}: install edgectl[runtime] into it" if missing else "")
        raise EdgectlError(f"quantizing {src} failed (exit {code}): {other[-1] if other else '(no output)'}{hint}",
                           exit_code=EXIT_FAILED, details=other[-10:-1])
    try:
        summary = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise EdgectlError(f"the quantizer wrote {out} but no summary; check it with `edgectl models inspect {out}`",
                           exit_code=EXIT_FAILED) from None
    return QuantizeResult(
        source=summary["source"], output=summary["output"], group_size=summary["group_size"],
        group_sizes_used=summary["group_sizes_used"], quantized_weights=summary["quantized_weights"],
        copied_tensors=summary["copied_tensors"], source_bytes=summary["source_bytes"],
        output_bytes=summary["output_bytes"], sha256=summary["sha256"])


def quantize_command(
    src: Annotated[Path, typer.Argument(help="A bf16/fp16 Hugging Face model directory (safetensors).",
                                        show_default=False)],
    out: Annotated[Path, typer.Argument(help="The new directory to write (must not exist).", show_default=False)],
    group_size: Annotated[int, typer.Option(
        "--group-size", help="Preferred int4 group size (32, 64, 128 or 256); a layer whose input size it "
                             "does not divide gets the largest smaller one that does.")] = DEFAULT_GROUP_SIZE,
    as_json: Annotated[bool, typer.Option("--json", help=f'Print one JSON object (schema "{SCHEMA}").')] = False,
) -> None:
    """Write a portable cpu_int4 checkpoint (see _HELP)."""
    emit(quantize_checkpoint(src, out, group_size, os.environ, progress), as_json)


_HELP = (
    "Write a portable cpu_int4 checkpoint: 4-bit linear weights with per-group scales and zeros.\n\n"
    "The output is the same on every machine (packing for this CPU's kernel happens when vLLM loads it) and "
    "byte-for-byte reproducible; vLLM picks the cpu_int4 method from its config.json. Progress goes to stderr."
)


def register(app: typer.Typer) -> None:
    app.command("quantize", help=_HELP)(quantize_command)
