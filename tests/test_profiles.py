"""Device profiles: strict validation (`file: path.to.field: problem`, one line per bad field, all
at once), the shipped profiles, the frozen copies the planner tables rest on, and which profile a
host gets.

The tests of the SHIPPED profiles (profiles/) hold for any set of valid profiles: adding a profile
or re-recording one from a benchmark does not break them; expectations come from the profiles' own
match rules and provenance. Tests that need known figures or a known set use the frozen copies
(tests/profiles_frozen/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from plan_helpers import (
    FROZEN_PROFILES,
    SHIPPED_PROFILES,
    SMOLLM2,
    frozen_profiles,
    host_facts,
    make_plan,
    profile_from_yaml,
    profile_yaml,
    reasons_by_decision,
    shape,
    shipped_profiles,
    with_cpu,
    write_profile,
)
from probe_helpers import FIXTURE_NAMES

from edgectl.contract.plan import ProfileRef, WeightFormat
from edgectl.errors import EdgectlError
from edgectl.profiles import (
    RECORDED_NOT_SERVED,
    Figure,
    Profile,
    load_profile,
    load_profiles,
    parse_profile,
    select_profile,
)

# A valid measured profile; each case below breaks one field of it.
GOOD = """\
schema: edgectl.profile/1
name: lab-box
device_class: x86_64-avx2
kind: measured
match:
  arch: x86_64
  isa_all: [avx2, fma]
  vendor: AuthenticAMD
sources:
  bench:
    cpu_model: "AMD EPYC 7B13"
    cores: 2
    ram_bytes: 25769803776
    date: 2026-12-01
    command: "edgectl bench smollm2-135m --record-profile"
    vllm: "0.32.0"
    torch: "2.13.0+cpu"
    edgectl_commit: "0165d14"
  paper:
    cpu_model: "Intel Xeon Platinum 8480C"
    cores: 24
    ram_bytes: 1099511627776
    date: "2026-11"
    command: "published"
    external: true
    reference: "vllm-embedding study"
formats:
  w4a16:
    runs: true
    decode_tok_s: {median: 20.5, min: 19.0, max: 21.0, passes: 5, source: bench}
  w4a16-vllm:
    runs: false
    reason: "no cpu_gemm_wna16 in _C_AVX2"
  bf16:
    runs: true
    decode_tok_s: {median: 71.6, source: paper}
runtime:
  process_bytes: {median: 734003200, passes: 3, source: bench}
threads:
  reserve_frontend_core: false
  evidence: "bench: 2 threads 20.5 vs 1 + front end 18.0 tok/s"
compilation: eager
"""


def test_the_good_profile_is_good(tmp_path: Path):
    p = profile_from_yaml(tmp_path, GOOD, "lab.yaml")
    assert (p.name, p.kind, p.device_class, p.file) == ("lab-box", "measured", "x86_64-avx2",
                                                        str(tmp_path / "lab.yaml"))
    fig = p.formats["w4a16"].decode_tok_s
    assert (fig.median, fig.min, fig.max, fig.passes, fig.source.key) == (20.5, 19.0, 21.0, 5, "bench")
    assert fig.source.edgectl_commit == "0165d14" and fig.source.vllm == "0.32.0"
    assert p.formats["bf16"].decode_tok_s.source.external is True  # an external figure needs no passes
    assert p.formats["w4a16-vllm"].runs is False and p.process_bytes.median == 734003200
    assert p.reserve_frontend_core is False


def test_a_format_recorded_but_not_served_is_kept_apart(tmp_path: Path):
    # W4A8 on AMX: figures others published for a kernel edgectl's runtime has no path to. The
    # profile keeps them, with their source, apart from the formats a plan can take.
    assert set(RECORDED_NOT_SERVED) == {"w4a8-amx"} and not set(RECORDED_NOT_SERVED) & set(WeightFormat)
    text = GOOD.replace('  bf16:\n', "  w4a8-amx:\n    runs: true\n    decode_tok_s: {median: 74.4, source: paper}\n"
                                     "  bf16:\n")
    p = profile_from_yaml(tmp_path, text, "lab.yaml")
    assert "w4a8-amx" not in p.formats and set(p.formats) == {"w4a16", "w4a16-vllm", "bf16"}
    fig = p.recorded_not_served["w4a8-amx"].decode_tok_s
    assert (fig.median, fig.source.key, fig.source.external) == (74.4, "paper", True)
    # the fastest figure of the profile, yet never planned: the plan takes the fastest format edgectl
    # serves (bf16, 71.6 here) and names the recorded one
    plan = make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2), [p])
    assert plan.profile.name == "lab-box" and plan.weight_format == "bf16"
    assert reasons_by_decision(plan)["weight_format"][0]["detail"].endswith(
        "; recorded on lab-box but not served by edgectl: w4a8-amx 74.4 tok/s "
        "(W4A8 on AMX is vLLM's int4_scaled_mm_cpu, which edgectl's runtime never calls)")


def _errors(text: str) -> list[str]:
    profile, errors = parse_profile(yaml.safe_load(text), "lab.yaml")
    assert profile is None or not errors
    return errors


def _swap(old: str, new: str) -> str:
    assert GOOD.count(old) == 1, old
    return GOOD.replace(old, new)


@pytest.mark.parametrize("text, expected", [
    pytest.param(_swap("compilation: eager\n", "compilation: eager\ncolour: blue\n"),
                 "lab.yaml: colour: unknown field (known: bandwidth_gbps, compilation, compiled, description, device_class, "
                 "emulated, formats, kind, match, name, notes, runtime, schema, sources, speech, threads)", id="unknown-key"),
    pytest.param(_swap("    decode_tok_s: {median: 20.5, min: 19.0, max: 21.0, passes: 5, source: bench}",
                       "    decode_tok_s: {median: 20.5, min: 19.0, max: 21.0, passes: 5, source: bench, runs: 3}"),
                 "lab.yaml: formats.w4a16.decode_tok_s.runs: unknown field (known: max, median, min, passes, source)",
                 id="unknown-nested-key"),
    pytest.param(_swap("    cores: 2\n", "    cores: two\n"),
                 "lab.yaml: sources.bench.cores: expected an integer, got a string 'two'", id="wrong-type"),
    pytest.param(_swap("    runs: true\n    decode_tok_s: {median: 20.5",
                       "    runs: yes please\n    decode_tok_s: {median: 20.5"),
                 "lab.yaml: formats.w4a16.runs: expected a boolean, got a string 'yes please'", id="wrong-type-bool"),
    pytest.param(_swap("median: 20.5, min: 19.0, max: 21.0, passes: 5, source: bench",
                       "median: fast, min: 19.0, max: 21.0, passes: 5, source: bench"),
                 "lab.yaml: formats.w4a16.decode_tok_s.median: expected a number, got a string 'fast'", id="wrong-type-median"),
    pytest.param(_swap("  process_bytes: {median: 734003200, passes: 3, source: bench}",
                       "  process_bytes: {median: 734003200, passes: 3}"),
                 "lab.yaml: runtime.process_bytes.source: missing (every figure names its source)",
                 id="missing-source"),
    pytest.param(_swap("  process_bytes: {median: 734003200, passes: 3, source: bench}",
                       "  process_bytes: {median: 734003200, passes: 3, source: benhc}"),
                 "lab.yaml: runtime.process_bytes.source: unknown source 'benhc' (defined: bench, paper)",
                 id="unknown-source"),
    pytest.param(_swap("median: 20.5, min: 19.0, max: 21.0", "median: 25.0, min: 19.0, max: 21.0"),
                 "lab.yaml: formats.w4a16.decode_tok_s: median 25.0 is not within min 19.0 and max 21.0",
                 id="median-outside-range"),
    pytest.param(_swap('    runs: false\n    reason: "no cpu_gemm_wna16 in _C_AVX2"\n', "    runs: false\n"),
                 "lab.yaml: formats.w4a16-vllm.reason: missing (say why the kernel does not run here)",
                 id="runs-false-without-reason"),
    pytest.param(_swap(", passes: 5, source: bench}", ", source: bench}"),
                 "lab.yaml: formats.w4a16.decode_tok_s.passes: missing (a measured figure says how many passes "
                 "it is the median of)", id="measured-without-passes"),
    pytest.param(_swap(", passes: 5, source: bench}", ", passes: 0, source: bench}"),
                 "lab.yaml: formats.w4a16.decode_tok_s.passes: must be at least 1", id="zero-passes"),
    pytest.param(_swap("  vendor: AuthenticAMD\n", "  vendor: 'Authentic(AMD'\n"),
                 "lab.yaml: match.vendor: not a regular expression: missing ), unterminated subpattern at "
                 "position 9", id="bad-regex"),
    pytest.param(_swap("schema: edgectl.profile/1\n", "schema: edgectl.profile/2\n"),
                 "lab.yaml: schema: 'edgectl.profile/2' is not 'edgectl.profile/1'", id="wrong-schema"),
    pytest.param(_swap("device_class: x86_64-avx2\n", "device_class: x86_64-sse\n"),
                 "lab.yaml: device_class: 'x86_64-sse' is not one of x86_64-amx, x86_64-avx512-bf16, x86_64-avx512, "
                 "x86_64-avx2, aarch64-sve, aarch64-neon, generic", id="unknown-device-class"),
    pytest.param(_swap("  isa_all: [avx2, fma]\n", "  isa_all: [avx2, fma3]\n"),
                 "lab.yaml: match.isa_all[1]: 'fma3' is not one of avx2, fma, avx512f, avx512bw, avx512vl, "
                 "avx512dq, avx512_vnni, avx512_bf16, amx_tile, amx_int8, amx_bf16, asimd, sve", id="unknown-isa"),
    pytest.param(_swap("  w4a16:\n    runs: true\n", "  w4a4:\n    runs: true\n"),
                 "lab.yaml: formats.w4a4: 'w4a4' is not one of w4a16, w4a8, w8a8, w4a16-vllm, bf16 (nor a format "
                 "recorded but not served by edgectl: w4a8-amx)", id="unknown-format"),
    # a format recorded but not served is read as strictly as any other
    pytest.param(_swap('  w4a16-vllm:\n    runs: false\n    reason: "no cpu_gemm_wna16 in _C_AVX2"\n',
                       "  w4a8-amx:\n    runs: false\n"),
                 "lab.yaml: formats.w4a8-amx.reason: missing (say why the kernel does not run here)",
                 id="recorded-format-without-reason"),
    pytest.param(_swap('  w4a16-vllm:\n    runs: false\n    reason: "no cpu_gemm_wna16 in _C_AVX2"\n',
                       "  w4a8-amx:\n    runs: true\n    decode_tok_s: {median: 74.4, source: papre}\n"),
                 "lab.yaml: formats.w4a8-amx.decode_tok_s.source: unknown source 'papre' (defined: bench, paper)",
                 id="recorded-format-unknown-source"),
    pytest.param(_swap('    edgectl_commit: "0165d14"\n', ""),
                 "lab.yaml: sources.bench.edgectl_commit: missing (a figure measured with edgectl records the "
                 "versions it ran)", id="measured-source-without-commit"),
    pytest.param(_swap('    reference: "vllm-embedding study"\n', ""),
                 "lab.yaml: sources.paper.reference: missing (an external source says where its figures were "
                 "published)", id="external-source-without-reference"),
    pytest.param(_swap("    cores: 2\n", ""), "lab.yaml: sources.bench.cores: missing", id="source-missing-field"),
])
def test_each_bad_field_is_one_line(text: str, expected: str):
    assert _errors(text) == [expected]


@pytest.mark.parametrize("text, expected", [
    # a wrong type for a whole section is one line, not one per field below it
    (_swap("match:\n  arch: x86_64\n  isa_all: [avx2, fma]\n  vendor: AuthenticAMD\n", "match: x86_64\n"),
     "lab.yaml: match: expected an object, got a string 'x86_64'"),
    (_swap("runtime:\n  process_bytes: {median: 734003200, passes: 3, source: bench}\n", "runtime: [1, 2]\n"),
     "lab.yaml: runtime: expected an object, got a list [1, 2]"),
    (_swap("  isa_all: [avx2, fma]\n", "  isa_all: avx2\n"), "lab.yaml: match.isa_all: expected a list, got a string 'avx2'"),
    (_swap("    cores: 24\n", "    cores: [24]\n"), "lab.yaml: sources.paper.cores: expected an integer, got a list [24]"),
    (_swap("  vendor: AuthenticAMD\n", "  vendor: 5\n"), "lab.yaml: match.vendor: expected a string, got an integer 5"),
])
def test_a_wrong_section_type_is_one_line_and_no_crash(text: str, expected: str):
    assert _errors(text) == [expected]


def test_a_broken_source_is_reported_once_not_at_every_figure():
    text = _swap("  bench:\n    cpu_model:", "  bench: oops\n  bench_old:\n    cpu_model:")
    assert _errors(text) == ["lab.yaml: sources.bench: expected an object, got a string 'oops'"]


def test_every_problem_is_reported_at_once(tmp_path: Path):
    text = (GOOD.replace("schema: edgectl.profile/1", "schema: edgectl.profile/0")
                .replace("  vendor: AuthenticAMD", "  vendor: '('\n  colour: blue")
                .replace("median: 20.5, min: 19.0", "median: 18.0, min: 19.0")
                .replace('    reason: "no cpu_gemm_wna16 in _C_AVX2"\n', "")
                .replace("passes: 3, source: bench}", "passes: 3, source: nowhere}"))
    path = write_profile(tmp_path, text, "many.yaml")
    with pytest.raises(EdgectlError) as exc:
        load_profile(path)
    lines = [exc.value.message, *exc.value.details]
    assert exc.value.exit_code == 2
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    assert sorted(line.split(": ")[1] for line in lines) == sorted([
        "schema", "match.colour", "match.vendor", "formats.w4a16.decode_tok_s", "formats.w4a16-vllm.reason",
        "runtime.process_bytes.source"])


def test_problems_in_several_files_are_all_reported(tmp_path: Path):
    write_profile(tmp_path, _swap("schema: edgectl.profile/1\n", "schema: nope\n"), "a.yaml")
    write_profile(tmp_path, _swap("    cores: 2\n", "    cores: two\n"), "b.yaml")
    write_profile(tmp_path, "schema: [unclosed\n", "c.yaml")
    with pytest.raises(EdgectlError) as exc:
        load_profiles([tmp_path])
    lines = [exc.value.message, *exc.value.details]
    assert lines[0] == f"{tmp_path / 'a.yaml'}: schema: 'nope' is not 'edgectl.profile/1'"
    assert lines[1] == f"{tmp_path / 'b.yaml'}: sources.bench.cores: expected an integer, got a string 'two'"
    assert lines[2].startswith(f"{tmp_path / 'c.yaml'}: not valid YAML at line 2")
    assert lines[3] == "fix the profile(s) above, or remove them"


def test_not_a_mapping_at_all(tmp_path: Path):
    with pytest.raises(EdgectlError, match=r"empty\.yaml: \(top level\): expected an object, got null"):
        load_profile(write_profile(tmp_path, "", "empty.yaml"))


def test_a_fallback_profile_must_match_any_host():
    text = _swap("kind: measured\n", "kind: fallback\n")
    assert _errors(text) == ["lab.yaml: match: a fallback profile must match any host (arch: any, no ISA rules)"]


# ---- the shipped profiles (any set of them) -------------------------------------------------------


def _figures(p: Profile) -> list[tuple[str, Figure]]:
    """Every figure a profile holds, with its path in the file."""
    out = [(path, fig) for path, fig in (
        ("runtime.process_bytes", p.process_bytes), ("runtime.workspace_bytes_per_token", p.workspace_bytes_per_token),
        ("runtime.load_peak_ratio", p.load_peak_ratio), ("runtime.ready_s", p.ready_s),
        ("bandwidth_gbps", p.bandwidth_gbps)) if fig is not None]
    for fmt, f in [*p.formats.items(), *p.recorded_not_served.items()]:
        for key in ("decode_tok_s", "prefill_tok_s", "weights_bytes_ratio"):
            if getattr(f, key) is not None:
                out.append((f"formats.{fmt}.{key}", getattr(f, key)))
    return out


def test_every_shipped_profile_validates():
    files = sorted(SHIPPED_PROFILES.glob("*.yaml"))
    profiles = [load_profile(f) for f in files]  # raises with every problem if one is invalid
    names = [p.name for p in profiles]
    # one profile per name: a second file of the same name would silently hide the first
    assert len(set(names)) == len(names), names
    assert sorted(p.file for p in shipped_profiles()) == sorted(str(f) for f in files)
    # the fallback ships (the planner's "no profile" error points at it) and matches every host
    generic = load_profile(SHIPPED_PROFILES / "generic.yaml")
    assert (generic.kind, generic.device_class) == ("fallback", "generic")
    for host in FIXTURE_NAMES:
        assert generic.matches(host_facts(host))[0], host


def test_shipped_figures_carry_their_provenance():
    checked = 0
    for p in shipped_profiles():
        assert p.sources, p.name
        for path, fig in _figures(p):
            where = f"{p.file}: {path}"
            src = fig.source
            assert p.sources.get(src.key) == src, where  # a source defined in the same file
            assert src.cpu_model.strip() and src.cores >= 1 and src.date.strip() and src.command.strip(), where
            if src.external:
                assert src.reference and src.reference.strip(), where  # where it was published
            else:
                # measured with edgectl: the versions it ran, and the passes the median is of
                assert src.edgectl_commit and src.vllm and src.torch, where
                assert fig.passes is not None and fig.passes >= 1, where
            if fig.min is not None and fig.max is not None:
                assert fig.min <= fig.median <= fig.max, where
            checked += 1
        if p.kind == "external":
            # a profile that says its figures are external must not pass off any as edgectl's own
            assert all(fig.source.external for _, fig in _figures(p)), p.name
        for fmt, f in [*p.formats.items(), *p.recorded_not_served.items()]:
            assert f.runs or (f.reason and f.reason.strip()), f"{p.file}: formats.{fmt}: runs false without a reason"
        assert set(p.recorded_not_served) <= set(RECORDED_NOT_SERVED), p.name
    assert checked > 0  # the loop saw figures at all


@pytest.mark.parametrize("host", FIXTURE_NAMES)
def test_each_fixture_host_gets_a_sensible_shipped_profile(host: str):
    facts = host_facts(host)
    profiles = list(shipped_profiles())
    chosen, considered = select_profile(profiles, facts)
    # one line per shipped profile, saying why it matched or not
    assert [line.split(": ", 1)[0] for line in considered] == [p.name for p in profiles]
    # the chosen one's own rules accept this host: its arch, ISA it can use, none it must not have
    assert chosen.matches(facts) == (True, "matches")
    assert chosen.match.arch in ("any", facts.cpu.arch)
    isa = facts.cpu.isa
    assert all(getattr(isa, f) for f in chosen.match.isa_all)
    assert not any(getattr(isa, f) for f in chosen.match.isa_none)
    # a figure for the host beats the guesses of the fallback, and one for the probed class beats one
    # for another class
    matching = [p for p in profiles if p.matches(facts)[0]]
    measured = [p for p in matching if p.kind != "fallback"]
    assert (chosen.kind == "fallback") == (not measured)
    if any(p.device_class == str(facts.device_class) for p in measured):
        assert chosen.device_class == str(facts.device_class)
    # and a plan made with it names it, and says so when it holds guesses
    try:
        plan = make_plan(facts, shape(SMOLLM2), profiles)
    except EdgectlError:
        return  # a refusal is checked below (test_the_shipped_profiles_never_plan_a_kernel_the_host_lacks)
    assert plan.profile == ProfileRef(name=chosen.name, file=chosen.file, kind=chosen.kind)
    why = reasons_by_decision(plan)["profile"][0]
    assert (why["source"] == "fallback") == (chosen.kind == "fallback")
    assert ("nobody has measured this class" in why["detail"]) == (chosen.kind == "fallback")


@pytest.mark.parametrize("host", FIXTURE_NAMES)
def test_the_shipped_profiles_never_plan_a_kernel_the_host_lacks(host: str):
    facts = host_facts(host)
    try:
        p = make_plan(facts, shape(SMOLLM2), shipped_profiles())
    except EdgectlError as exc:  # a shipped profile may make SmolLM2 not fit; it must say so cleanly
        assert exc.exit_code == 2 and "\n" not in exc.message
        return
    isa = facts.cpu.isa
    if p.weight_format == "w4a16-vllm":  # vLLM's cpu_gemm_wna16: only in its AVX-512 library
        assert facts.cpu.arch == "x86_64" and all(getattr(isa, f) for f in ("avx512f", "avx512bw", "avx512vl",
                                                                             "avx512dq"))
    assert p.weight_format in set(WeightFormat)  # a format edgectl serves, never one only recorded
    assert p.memory.limit_bytes <= facts.memory.budget_bytes


# ---- the frozen copies the planner tables rest on -------------------------------------------------


def test_the_frozen_profiles_hold_the_figures_the_tables_use():
    # tests/profiles_frozen/*.yaml, read by hand; test_plan_table.py's GENERIC_PROCESS, AVX2_PROCESS
    # and load peak 1.3 come from here
    frozen = {p.name: p for p in frozen_profiles()}
    assert {n: (p.kind, p.device_class) for n, p in frozen.items()} == {
        "generic": ("fallback", "generic"), "x86_64-avx2": ("external", "x86_64-avx2"),
        "x86_64-amx-spr": ("external", "x86_64-amx")}
    generic, avx2, spr = frozen["generic"], frozen["x86_64-avx2"], frozen["x86_64-amx-spr"]
    assert (generic.process_bytes.median, generic.load_peak_ratio.median) == (671088640, 1.3)
    assert (avx2.process_bytes.median, avx2.load_peak_ratio) == (734003200, None)
    assert (spr.process_bytes, spr.load_peak_ratio) == (None, None)
    assert all(p.workspace_bytes_per_token is None for p in frozen.values())  # the fallback workspace rule
    assert all(p.processes["single-process"] == 1 for p in frozen.values())
    # the published figures (docs/facts.md): 74.4 (W4A8 AMX), 71.6 / 2190 (W4A16 tinygemm), 32.3 (vLLM wna16);
    # W4A8 on AMX is recorded there but not served by edgectl: kept apart from the formats
    assert spr.recorded_not_served["w4a8-amx"].decode_tok_s.median == 74.4 and "w4a8-amx" not in spr.formats
    assert (spr.formats["w4a16"].decode_tok_s.median, spr.formats["w4a16"].prefill_tok_s.median) == (71.6, 2190)
    assert spr.formats["w4a16-vllm"].decode_tok_s.median == 32.3
    assert spr.bandwidth_gbps.median == 222
    src = spr.formats["w4a16"].decode_tok_s.source
    assert src.external and src.reference and src.cpu_model == "Intel(R) Xeon(R) Platinum 8480C" and src.cores == 24
    # the AVX2 baselines are stock vLLM's figures, not edgectl's path: they do not rank formats
    # (the frozen copy keeps the reference it shipped with)
    assert avx2.formats["bf16"].runs and avx2.formats["bf16"].decode_tok_s is None
    assert avx2.process_bytes.source.reference.startswith("shared/facts/measured-here.md")
    assert not avx2.formats["w4a16-vllm"].runs and not avx2.recorded_not_served["w4a8-amx"].runs


FROZEN_CHOICE = {
    "arm64-board": "generic",  # aarch64: nothing measured
    "container-cgroup2": "generic",  # x86_64-avx512-bf16: nothing measured
    "host-cgroup1": "generic",  # x86_64-avx512: nothing measured
    "k8s-pod-cgroup2": "x86_64-avx2",  # Intel N100: AVX2 + FMA, no AVX-512
    "kvm-epyc-avx2-2c": "x86_64-avx2",
    "kvm-xeon-avx512-2c": "generic",  # avx512f usable: the AVX2 profile says isa_none [avx512f]
    "vm-avx512-disabled": "x86_64-avx2",  # cpuid's AVX-512 is not enabled by the kernel: AVX2 class
    "xeon-spr-amx-2s": "x86_64-amx-spr",
}


@pytest.mark.parametrize("host", FIXTURE_NAMES)
def test_frozen_profile_for_each_fixture_host(host: str):
    profile, considered = select_profile(list(frozen_profiles()), host_facts(host))
    assert profile.name == FROZEN_CHOICE[host]
    assert len(considered) == 3 and all(": " in line for line in considered)


def test_the_amx_profile_needs_intel_and_amx():
    amd_amx = with_cpu(host_facts("xeon-spr-amx-2s"), vendor="AuthenticAMD")
    profile, considered = select_profile(list(frozen_profiles()), amd_amx)
    assert profile.name == "generic"
    assert "x86_64-amx-spr: vendor 'AuthenticAMD' does not match 'GenuineIntel'" in considered


# ---- selection ------------------------------------------------------------------------------------


def test_the_most_specific_matching_profile_wins(tmp_path: Path):
    broad = profile_from_yaml(tmp_path, profile_yaml(name="broad", device_class="x86_64-avx2",
                                                     match="  arch: x86_64\n  isa_all: [avx2]\n"), "broad.yaml")
    narrow = profile_from_yaml(tmp_path, profile_yaml(
        name="narrow", device_class="x86_64-avx2",
        match="  arch: x86_64\n  isa_all: [avx2, fma]\n  vendor: AuthenticAMD\n  model_pattern: 'EPYC 7B13'\n"),
        "narrow.yaml")
    other_class = profile_from_yaml(tmp_path, profile_yaml(
        name="other-class", device_class="x86_64-avx512",
        match="  arch: x86_64\n  isa_all: [avx2, fma]\n  vendor: AuthenticAMD\n  model_pattern: 'EPYC'\n"
              "  min_cores: 1\n  max_cores: 64\n"), "other.yaml")
    generic = [p for p in frozen_profiles() if p.kind == "fallback"]
    facts = host_facts("kvm-epyc-avx2-2c")  # AMD EPYC 7B13, AVX2 + FMA, class x86_64-avx2
    for order in ([broad, narrow, other_class, *generic], [*generic, other_class, narrow, broad]):
        # the probed class first (other-class's rules are the most specific, but for another class),
        # then the most specific rules; the fallback only when nothing else matches
        assert select_profile(order, facts)[0].name == "narrow"
    assert select_profile([broad, *generic], facts)[0].name == "broad"
    assert select_profile([other_class, *generic], facts)[0].name == "other-class"
    assert select_profile([*generic], facts)[0].name == "generic"


def test_a_profile_edgectl_measured_beats_external_figures_for_the_class(tmp_path: Path):
    external = profile_from_yaml(tmp_path, profile_yaml(
        name="published", device_class="x86_64-avx2",
        match="  arch: x86_64\n  isa_all: [avx2, fma]\n  vendor: AuthenticAMD\n  model_pattern: 'EPYC 7B13'\n",
    ).replace("kind: measured", "kind: external"), "published.yaml")
    measured = profile_from_yaml(tmp_path, profile_yaml(name="measured", device_class="x86_64-avx2",
                                                        match="  arch: x86_64\n  isa_all: [avx2]\n"), "measured.yaml")
    generic = [p for p in frozen_profiles() if p.kind == "fallback"]
    facts = host_facts("kvm-epyc-avx2-2c")
    assert (external.kind, measured.kind) == ("external", "measured")
    for order in ([external, measured, *generic], [*generic, measured, external]):
        # the external rules are more specific, yet edgectl's own measurement on the class wins
        assert select_profile(order, facts)[0].name == "measured"
    assert select_profile([external, *generic], facts)[0].name == "published"


def test_core_count_rules(tmp_path: Path):
    big = profile_from_yaml(tmp_path, profile_yaml(name="big", device_class="x86_64-avx2",
                                                   match="  arch: x86_64\n  isa_all: [avx2]\n  min_cores: 8\n"))
    p, considered = select_profile([big, *[p for p in frozen_profiles() if p.kind == "fallback"]],
                                   host_facts("kvm-epyc-avx2-2c"))
    assert p.name == "generic" and "big: 2 usable CPUs < 8" in considered


def test_a_local_profile_replaces_a_shipped_one_of_the_same_name(tmp_path: Path):
    # the frozen copies stand in for the shipped directory (load_profiles does not care which it is)
    local = tmp_path / "local"
    original = (FROZEN_PROFILES / "x86_64-avx2.yaml").read_text()
    assert original.count("median: 734003200") == 1
    write_profile(local, original.replace("median: 734003200", "median: 700000000"), "mine.yaml")
    profiles = {p.name: p for p in load_profiles([FROZEN_PROFILES, local])}
    assert profiles["x86_64-avx2"].process_bytes.median == 700000000
    assert profiles["x86_64-avx2"].file == str(local / "mine.yaml")
    assert profiles["generic"].file == str(FROZEN_PROFILES / "generic.yaml")  # the others stay
    assert load_profiles([FROZEN_PROFILES, tmp_path / "does-not-exist"])  # a missing directory is no error
