"""The planner's inputs, gathered: probe the host, find the model, load the profiles; then plan.

``plan``, ``deploy``, ``serve`` and ``bench`` all go through :func:`make_plan`, so the same
request gives the same plan whichever command made it. This is the I/O around the pure planner
(``edgectl/planner/``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl import paths
from edgectl.contract import environment
from edgectl.contract.plan import Plan, Request
from edgectl.errors import EdgectlError
from edgectl.output import mib
from edgectl.planner import plan
from edgectl.probe.formats import format_cpu_list
from edgectl.profiles import Profile, load_profiles

if TYPE_CHECKING:
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts


@dataclass(frozen=True)
class Planned:
    facts: HostFacts
    model: ModelFacts
    plan: Plan
    pulled: bool  # False: planned from the catalog's shipped config, before any download

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict()

    def render_text(self) -> str:
        text = render_plan(self.plan)
        if not self.pulled:
            text += (f"\n  (planned from the catalog's configuration; `edgectl models pull {self.model.name}` "
                     "downloads the weights, and deploy pulls them itself)")
        return text


def _kv_dtype_name(plan: Plan) -> str:
    if plan.kv_cache_dtype != "auto":
        return str(plan.kv_cache_dtype)
    return "bf16" if plan.speech is None else plan.speech.dtype  # "auto": the model's dtype


def _groups(plan: Plan) -> str:
    """How a quantized plan's weights are grouped: edgectl's 8-bit blocks (w8a8), else int4 groups."""
    if not plan.weight_format.is_int4:
        return ""
    if plan.weight_format == "w8a8":
        return f", 8-bit blocks of {plan.group_size}"
    return f", int4 groups of {plan.group_size}"


def render_plan(plan: Plan) -> str:
    """The plan for a person: what runs, what it costs, and every reason."""
    m = plan.memory
    lines = [f"plan for {plan.model.name} on {plan.device_class} (profile {plan.profile.name}, {plan.profile.kind})"]
    if plan.speech is not None:
        sp = plan.speech
        lines += [
            f"  speech      {_speech_weights(plan)}; {plan.max_num_seqs} transcription(s) at once; uploads up to "
            f"{sp.max_audio_s} s and {sp.max_upload_bytes / 1e6:.0f} MB, in {sp.window_s} s windows",
            f"  decoder     {plan.max_model_len} tokens and {sp.encoder_positions} cross-attention rows per transcription",
        ]
    else:
        lines += [
            f"  weights     {plan.weight_format}" + _groups(plan),
            f"  context     {plan.max_model_len} tokens × {plan.max_num_seqs} sequence(s); RoPE rows {plan.rope_rows}",
        ]
    lines += [
        f"  threads     {plan.threads} on CPUs {format_cpu_list(plan.cpus)}; topology {plan.topology}; {plan.compilation} mode",
        "  memory (steady, predicted):",
        f"    runtime    {mib(m.runtime_bytes)}",
        f"    weights    {mib(m.weights_bytes)}",
        f"    KV cache   {mib(m.kv_cache_bytes)} ({plan.kv_bytes_per_token} B/token, "
        f"{_kv_dtype_name(plan)})",
        *([f"    RoPE       {mib(m.rope_bytes)}"] if plan.speech is None else []),
        f"    workspace  {mib(m.workspace_bytes)}",
        f"    total      {mib(m.total_bytes)}   MemoryHigh {mib(m.high_bytes)}   MemoryMax {mib(m.limit_bytes)}",
    ]
    pred = plan.predicted
    if pred.decode_tok_s:
        lines.append(f"  predicted   decode {pred.decode_tok_s:.1f} tok/s"
                     + (f", prefill {pred.prefill_tok_s:.0f} tok/s" if pred.prefill_tok_s else ""))
    lines.append("  reasons:")
    for r in plan.reasons:
        lines.append(f"    - {r.decision} = {r.value} [{r.source}] {r.detail}")
    return "\n".join(lines)


def profile_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Shipped profiles first; locally recorded ones (``bench --record-profile``) override them."""
    return [paths.profiles_dir(), Path(environment.read("EDGECTL_PROFILES_DIR", environ))]


def load_all_profiles(environ: Mapping[str, str]) -> list[Profile]:
    return load_profiles(profile_dirs(environ))


# The catalog's copy of a model's GGUF header, tensor table included (no tensor data), to plan it
# before the pull: edgectl/data/catalog/<name>/ (written by tests/test_models_gguf.py's check).
GGUF_HEADER_JSON = "gguf-header.json"


def model_facts(spec: str, environ: Mapping[str, str]) -> tuple[ModelFacts, bool]:
    """Facts about a catalog model or a model directory; (facts, pulled)."""
    from edgectl.models.cache import model_dir, resolve_model
    from edgectl.models.catalog import CATALOG
    from edgectl.models.inspect import inspect_model

    try:
        path = resolve_model(spec, environ)
    except EdgectlError:
        entry = CATALOG.get(spec)
        shipped = paths.data_dir() / "catalog" / spec
        if entry is None or not ((shipped / "config.json").is_file() or (shipped / GGUF_HEADER_JSON).is_file()):
            raise
        # Not pulled yet: plan from the shipped copy of its GGUF's header (the pull serves the
        # GGUF as it is), else its configuration; the path is where it will be.
        header = shipped / GGUF_HEADER_JSON
        if header.is_file():
            import json

            from edgectl.contract.gguf_header import header_from_json
            from edgectl.models.gguf_inspect import facts_from_header
            from edgectl.models.tokenizer_files import tokenizer_cost

            facts = facts_from_header(header_from_json(json.loads(header.read_text()), shipped / entry.gguf_name),
                                      spec)
            facts = replace(facts, tokenizer_bytes=tokenizer_cost(shipped))
        else:
            facts = inspect_model(shipped, name=spec, require_tokenizer=False)
        return replace(facts, path=str(model_dir(entry, environ))), False
    name = spec if spec in CATALOG else None
    return inspect_model(path, name=name), True


def make_plan(request: Request, environ: Mapping[str, str], *, root: str = "/",
              facts: HostFacts | None = None) -> Planned:
    """Plan ``request`` for this host (probed under ``root``), or for the host ``facts`` describe."""
    from edgectl.models.catalog import CATALOG
    from edgectl.probe import probe

    host = facts if facts is not None else probe(root, environ=environ)
    model, pulled = model_facts(request.model, environ)
    entry = CATALOG.get(request.model)
    if entry is not None and entry.int4_group_size and request.group_size_hint is None:
        request = replace(request, group_size_hint=entry.int4_group_size)
    profiles = load_all_profiles(environ)
    return Planned(host, model, plan(host, model, profiles, request), pulled)


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


def _speech_weights(plan: Plan) -> str:
    """A speech plan's weights in words: the dtype, or the linear layers' format and the rest's dtype."""
    assert plan.speech is not None
    if plan.weight_format.is_int4:
        return f"linear layers {plan.weight_format}, the rest {plan.speech.dtype}"
    return f"{plan.speech.dtype} weights"
