"""Which weight formats this host can run, ranked; and the int4 group size.

The ranking is by measured decode speed on the device class (the profile), then by
``FORMAT_PRIOR`` among formats nobody measured. Which one is chosen also depends on memory:
``fit.py`` takes the best-ranked one that fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgectl.contract import int4_layout
from edgectl.contract.plan import Compilation, Reason, Request, Source, WeightFormat
from edgectl.errors import EdgectlError
from edgectl.planner.decided import Decided
from edgectl.profiles import RECORDED_NOT_SERVED

if TYPE_CHECKING:
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts
    from edgectl.profiles import Figure, Profile

# Order among formats nobody measured here: 4-bit on PyTorch's kernel reads the fewest bytes
# per token and runs everywhere; the others need a measurement to be chosen at all.
FORMAT_PRIOR = (WeightFormat.W4A16, WeightFormat.W4A8, WeightFormat.W4A16_VLLM, WeightFormat.BF16)
# Chosen only where a profile of the device class measured them running (or asked for by name).
MEASURED_ONLY = (WeightFormat.W4A8, WeightFormat.W4A16_VLLM)
# A text model's formats: w8a8 serves a speech model's linear layers only (planner/speech.py).
TEXT_FORMATS = tuple(f for f in WeightFormat if f is not WeightFormat.W8A8)


def checkpoint_format(model: ModelFacts) -> str:
    """How the checkpoint stores its weights: bf16, or the quant_method config.json names."""
    q = model.quantization_config or {}
    method = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
    if method in ("gptq", "awq", "cpu_int4"):
        return method
    return "bf16" if not method else method


def choose_group_size(request: Request) -> Decided[int]:
    """The preferred int4 group (each layer then takes the largest allowed one that divides K)."""
    if request.group_size is not None:
        return Decided(request.group_size, Reason("group_size", request.group_size, Source.FLAG,
                                                  "asked with --group-size"))
    if request.group_size_hint is not None:
        size, why = request.group_size_hint
        return Decided(size, Reason("group_size", size, Source.MODEL_CONFIG, why))
    return Decided(int4_layout.DEFAULT_GROUP_SIZE, Reason(
        "group_size", int4_layout.DEFAULT_GROUP_SIZE, Source.FALLBACK,
        "the common default for 4-bit weights; smaller groups cost more scale bytes"))


def kernels_run(facts: HostFacts) -> tuple[bool, str]:
    """Whether edgectl's own kernel library runs here, and why: one library holds its 4- and 8-bit linear
    layers, its decode attention and its int8 KV, so the W4A8 kernel's answer is the library's."""
    return host_runs(WeightFormat.W4A8, facts)


def host_runs(fmt: WeightFormat, facts: HostFacts) -> tuple[bool, str]:
    """Whether this host can execute a format's kernel at all (before any profile says so)."""
    isa, arch = facts.cpu.isa, facts.cpu.arch
    if fmt is WeightFormat.BF16:
        return True, "vLLM's CPU backend runs bf16 everywhere it runs"
    if fmt is WeightFormat.W4A16:
        if arch in ("x86_64", "aarch64"):
            return True, "PyTorch's _weight_int4pack_mm_for_cpu has AVX2, AVX-512, NEON and scalar kernels"
        return False, f"PyTorch's CPU int4 kernel is not available for {arch}"
    if fmt is WeightFormat.W4A8:
        if arch == "x86_64" and isa.avx2 and isa.fma:
            return True, ("edgectl's own kernels (set-up compiles them with the system g++): an AVX2 and an "
                          "AVX-512 VNNI build, the level chosen at run time from cpuid (docs/kernels.md)")
        if arch == "x86_64":
            return False, "edgectl's kernels below AVX2 + FMA have only a plain C++ build, too slow to plan"
        return False, f"edgectl's kernels have no vector build for {arch} yet (plain C++ only, too slow to plan)"
    if fmt is WeightFormat.W4A16_VLLM:
        if arch == "x86_64" and isa.avx512:
            return True, "vLLM loads its AVX-512 library here, which has cpu_gemm_wna16"
        return False, ("vLLM's cpu_gemm_wna16 is compiled only into its AVX-512 libraries; this host "
                       "loads _C_AVX2 (vllm-project/vllm#55613)" if arch == "x86_64" else
                       f"vLLM's int4 CPU kernels are not built for {arch}")
    return False, f"edgectl has no rule yet for where {fmt} runs"  # a format added without its rule


def _format_runs(fmt: WeightFormat, facts: HostFacts, checkpoint: str, profile: Profile,
                 request: Request) -> tuple[bool, str]:
    """Whether ``fmt`` can be planned here, and why: the host runs its kernel, the profile did not
    see it fail, it was measured if it must be, and the checkpoint can be served in it."""
    ok, why = host_runs(fmt, facts)
    figures = profile.formats.get(fmt)
    if ok and figures is not None and not figures.runs:
        ok, why = False, f"profile {profile.name}: {figures.reason}"
    if (ok and fmt in MEASURED_ONLY and (figures is None or figures.decode_tok_s is None)
            and request.weight_format != fmt):  # asked for by name, e.g. to measure it
        # these kernels are chosen only where a measurement showed them running
        ok, why = False, f"not measured on {profile.name}: chosen only where a profile shows it runs"
    if ok and checkpoint in ("gptq", "awq") and fmt is WeightFormat.BF16:
        ok, why = False, f"the checkpoint is {checkpoint} 4-bit: edgectl serves it as 4-bit, not bf16"
    if ok and checkpoint == "cpu_int4" and fmt not in (WeightFormat.W4A16, WeightFormat.W4A8):
        ok, why = False, ("the checkpoint is a cpu_int4 portable checkpoint (PyTorch's int4 kernel, or "
                          "edgectl's, which keeps its int4 values)")
    return ok, why


def _asked_format(fmt: WeightFormat, runnable: dict[WeightFormat, str],
                  refused: dict[WeightFormat, str]) -> Decided[list[tuple[WeightFormat, Reason]]]:
    """The format asked for with --format, if it can run here."""
    if fmt not in runnable:
        options = ", ".join(sorted(runnable)) or "none"
        raise EdgectlError(f"--format {fmt} cannot run here: {refused[fmt]} (runnable here: {options})")
    return Decided([(fmt, Reason("weight_format", fmt, Source.FLAG, f"asked with --format; {runnable[fmt]}"))])


class _MeasuredDecode:
    """Each format's measured decode on the profile: in compiled mode, the format the profile
    measured compiled counts with its compiled figure."""

    def __init__(self, profile: Profile, compilation: Compilation) -> None:
        self.profile = profile
        self.compiled = profile.compiled if compilation is Compilation.DEFAULT and profile.compiled else None
        self.compiled_fmt = (self.compiled.weight_format
                             if self.compiled and self.compiled.decode_tok_s is not None else None)

    def __call__(self, fmt: WeightFormat) -> Figure | None:
        if self.compiled is not None and fmt == self.compiled_fmt:
            return self.compiled.decode_tok_s
        figures = self.profile.formats.get(fmt)
        return figures.decode_tok_s if figures else None

    def named(self, fmt: WeightFormat) -> str:
        return f"{fmt} compiled" if fmt == self.compiled_fmt else f"{fmt}"

    def rank_key(self, fmt: WeightFormat) -> tuple[bool, float, int]:
        """Measured first, then the faster, then ``FORMAT_PRIOR``'s order."""
        fig = self(fmt)
        return fig is not None, fig.median if fig else 0.0, -FORMAT_PRIOR.index(fmt)


def _unserved_figures(profile: Profile) -> list[str]:
    """Figures the profile keeps for formats edgectl does not serve (profiles.RECORDED_NOT_SERVED):
    never candidates, but named, so a faster published figure is not silently passed over."""
    return [f"{name} {fig.decode_tok_s.median:g} tok/s ({RECORDED_NOT_SERVED[name]})"
            for name, fig in profile.recorded_not_served.items() if fig.runs and fig.decode_tok_s is not None]


def _rank_reason(fmt: WeightFormat, ranked: list[WeightFormat], measured: _MeasuredDecode,
                 runnable: dict[WeightFormat, str], unserved: list[str]) -> Reason:
    """Why ``fmt`` stands where it does: its measured decode against the others', or the prior."""
    profile = measured.profile
    fig = measured(fmt)
    if fig is None:
        return Reason("weight_format", fmt, Source.FALLBACK,
                      f"not measured on {profile.name}; 4-bit reads the fewest bytes per token "
                      f"({runnable[fmt]})" if fmt.is_int4 else
                      f"not measured on {profile.name}; {runnable[fmt]}")
    others = [f"{measured.named(f)} {other.median:g}" for f in ranked
              if f != fmt and (other := measured(f)) is not None]
    detail = (f"measured decode on {profile.name}: {fig.describe('tok/s')}"
              + (" in compiled mode" if fmt == measured.compiled_fmt else ""))
    if fmt == ranked[0]:
        detail = "fastest " + detail
    if others:
        detail += "; others: " + ", ".join(others) + " tok/s" + (" (eager)" if measured.compiled_fmt else "")
    if unserved:
        detail += f"; recorded on {profile.name} but not served by edgectl: " + ", ".join(unserved)
    return Reason("weight_format", fmt, profile.reason_source, detail)


def runnable_formats(facts: HostFacts, model: ModelFacts, profile: Profile, request: Request,
                     compilation: Compilation = Compilation.EAGER) -> Decided[list[tuple[WeightFormat, Reason]]]:
    """The formats this host can run, best first, each with the reason it would be chosen.

    In compiled mode, the format the profile measured compiled ranks by its compiled decode (the
    plan then runs a combination that was measured, not eager's fastest format compiled).
    The reasons given are the formats that cannot run here, and why (if any).
    """
    checkpoint = checkpoint_format(model)
    runnable: dict[WeightFormat, str] = {}
    refused: dict[WeightFormat, str] = {}
    if request.weight_format == WeightFormat.W8A8:
        raise EdgectlError("--format w8a8 serves a speech model's linear layers (a Whisper); a text model's formats are "
                           + ", ".join(TEXT_FORMATS))
    for fmt in TEXT_FORMATS:
        ok, why = _format_runs(fmt, facts, checkpoint, profile, request)
        (runnable if ok else refused)[fmt] = why
    not_runnable = ([Reason("formats_not_runnable", sorted(str(f) for f in refused), Source.PROBE,
                            "; ".join(f"{f}: {why}" for f, why in refused.items()))] if refused else [])
    if request.weight_format:
        # a known one: checked with the request
        return _asked_format(WeightFormat(request.weight_format), runnable, refused)

    measured = _MeasuredDecode(profile, compilation)
    ranked = sorted(runnable, key=measured.rank_key, reverse=True)
    if not ranked:
        raise EdgectlError("no weight format can run on this host: " + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    unserved = _unserved_figures(profile)
    return Decided([(fmt, _rank_reason(fmt, ranked, measured, runnable, unserved)) for fmt in ranked], *not_runnable)
