"""A node's class as NFD labels (edgectl/fleet/labels.py): golden feature files, syntax, and the
class's facts, which are what its plan is computed from.

Golden files live in tests/golden/nfd/<scenario>/: the input ``facts.json`` (edgectl.probe/1),
``args.json`` (the profile name and version, and the time the file is written at) and the
expected feature file ``edgectl``, byte for byte. Every folder is a listed scenario and every
file in it is used. After a deliberate change, regenerate and review the diff:

    PYTHONPATH=.:runtime python tests/test_fleet_labels.py --regen
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from plan_helpers import SMOLLM2, make_plan, shape
from probe_helpers import FIXTURE_NAMES, GIB, host, run_cli

from edgectl.errors import EdgectlError
from edgectl.fleet import labels as L
from edgectl.inputs import load_all_profiles
from edgectl.probe import HostFacts, probe

GOLDEN = Path(__file__).parent / "golden" / "nfd"

SCENARIOS = {
    "epyc-avx2": "2-core AVX2 guest (kvm-epyc-avx2-2c): a small node",
    "spr-amx-two-sockets": "224 CPUs on two NUMA nodes with SMT: 56 cores, AMX",
    "container-quota": "AVX-512 BF16 in a container: cpuset 2-3, quota 1.5 → 1 core, 4 GiB limit",
    "arm64-board": "aarch64 NEON board: no x86 ISA",
    "bandwidth-measured": "the AVX2 node probed with --bandwidth: an information label",
    "memory-unknown": "MemTotal unreadable: no memory label, a comment says why, and no class",
}

# Kubernetes' own label syntax, written out again here (k8s.io/apimachinery IsQualifiedName,
# IsValidLabelValue): prefix a DNS subdomain, name and value at most 63 characters.
QUALIFIED = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def load_scenario(scenario: str) -> tuple[HostFacts, dict, Path]:
    folder = GOLDEN / scenario
    facts = HostFacts.from_dict(json.loads((folder / "facts.json").read_text()), source=f"{scenario}/facts.json")
    args = json.loads((folder / "args.json").read_text())
    return facts, args, folder / "edgectl"


def render_scenario(scenario: str) -> str:
    facts, args, _ = load_scenario(scenario)
    labels = L.node_labels(facts, profile=args["profile"], profile_version=args["profile_version"],
                           cores=L.planned_cores(facts))
    return L.render_feature_file(labels, datetime.fromisoformat(args["now"]))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_feature_file_matches_golden_file(scenario):
    expected = load_scenario(scenario)[2]
    assert expected.is_file(), f"missing {expected}; run: python tests/test_fleet_labels.py --regen"
    assert render_scenario(scenario) == expected.read_text(encoding="utf-8")


def test_every_golden_file_is_used():
    assert {p.name for p in GOLDEN.iterdir()} == set(SCENARIOS), "golden folders and SCENARIOS differ"
    for scenario in SCENARIOS:
        assert {p.name for p in (GOLDEN / scenario).iterdir()} == {"facts.json", "args.json", "edgectl"}, scenario


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_what_nfd_reads_is_every_label_with_its_expiry(scenario):
    facts, args, _ = load_scenario(scenario)
    text = render_scenario(scenario)
    assert len(text.encode()) < 64 * 1024  # NFD ignores a larger file
    labels, expiry = L.parse_feature_file(text)
    now = datetime.fromisoformat(args["now"])
    assert expiry == now + timedelta(hours=6)
    assert labels and all(k.startswith("feature.node.kubernetes.io/edgectl-") for k in labels)
    for name, value in labels.items():
        assert QUALIFIED.fullmatch(name) and len(name.split("/", 1)[1]) <= 63, name
        assert VALUE.fullmatch(value), (name, value)
    assert labels["feature.node.kubernetes.io/edgectl-device-class"] == str(facts.device_class)
    assert labels["feature.node.kubernetes.io/edgectl-profile-version"] == args["profile_version"]


def test_scenarios_differ_where_they_claim():
    files = {s: L.parse_feature_file(render_scenario(s))[0] for s in SCENARIOS}
    ns = "feature.node.kubernetes.io/"
    spr = files["spr-amx-two-sockets"]
    # 224 usable CPUs; node 0 has 112 of them, two threads per core: 56 OpenMP threads
    assert (spr[ns + "edgectl-cpus"], spr[ns + "edgectl-cores"]) == ("224", "56")
    assert spr[ns + "edgectl-isa.amx"] == "true" and spr[ns + "edgectl-isa.avx512-bf16"] == "true"
    container = files["container-quota"]
    # cpuset 2-3, cpu.max 1.5 → one thread; min(32 GB, 4 GiB limit) − 512 MiB = 3.5 GiB → 3
    assert (container[ns + "edgectl-cpus"], container[ns + "edgectl-cores"]) == ("2", "1")
    assert container[ns + "edgectl-memory-gib"] == "3"
    arm = files["arm64-board"]
    assert arm[ns + "edgectl-arch"] == "aarch64"
    assert all(arm[ns + label] == "false" for label in L.ISA_LABELS)
    assert files["bandwidth-measured"][ns + "edgectl-bandwidth-gbps"] == "41.7"
    assert ns + "edgectl-bandwidth-gbps" not in files["epyc-avx2"]
    assert ns + "edgectl-memory-gib" not in files["memory-unknown"]
    assert "edgectl-memory-gib: not given, MemTotal is unknown" in render_scenario("memory-unknown")


def test_the_memory_label_does_not_move_with_what_runs():
    # MemAvailable falls when the node's worker starts; the label must not (or the node would stop
    # matching its own Deployment's selector): it comes from MemTotal and the cgroup limit.
    facts = load_scenario("epyc-avx2")[0]
    busy = HostFacts.from_dict({**facts.to_dict(), "memory": {**facts.to_dict()["memory"],
                                                              "available_bytes": 2 * GIB, "budget_bytes": GIB}})
    assert L.memory_gib(busy) == L.memory_gib(facts)
    m = facts.memory
    assert L.memory_gib(facts)[0] == (m.total_bytes - m.reserve_bytes) // GIB


def test_a_node_with_a_label_missing_has_no_class():
    facts = load_scenario("memory-unknown")[0]
    labels = L.node_labels(facts, profile="generic", profile_version="0" * 12, cores=L.planned_cores(facts))
    assert labels.selector() is None
    assert "MemTotal is unknown" in labels.why_no_class()


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_a_class_plans_what_its_nodes_would(name):
    """Planned from the labels alone, a node's class gets the node's own decisions.

    Threads, profile and weight format are the same; the memory budget is the label's, which
    starts from MemTotal, so the class's MemoryMax fits that, whatever runs on the node.
    """
    facts = probe(host(name))
    import os

    labels = L.labels_for(facts, load_all_profiles(os.environ))
    cls = L.class_facts(labels.full())
    # the class's facts label as the node did (but memory, which a class has only as a budget)
    again = L.node_labels(cls, profile=labels.values[L.PROFILE], profile_version=labels.values[L.PROFILE_VERSION],
                          cores=L.planned_cores(cls))
    assert {k: v for k, v in again.values.items() if k in L.SELECTOR_LABELS} == {
        k: v for k, v in labels.values.items() if k in L.SELECTOR_LABELS and k != L.MEMORY_GIB}
    node_plan = make_plan(facts, shape(SMOLLM2))
    budget = int(labels.values[L.MEMORY_GIB]) * GIB
    if node_plan.memory.limit_bytes > budget:
        # GiB rounded down costs up to a GiB: a node just big enough is not, as a class
        # (the pod fixture: 1.46 GiB → 1)
        with pytest.raises(EdgectlError, match=f"budget is {budget >> 20} MiB"):
            make_plan(cls, shape(SMOLLM2))
        assert L.planned_cores(cls) == node_plan.threads
        return
    class_plan = make_plan(cls, shape(SMOLLM2))
    assert class_plan.threads == node_plan.threads
    assert class_plan.weight_format == node_plan.weight_format
    assert class_plan.profile.name == node_plan.profile.name
    assert class_plan.memory.limit_bytes <= budget
    assert str(cls.device_class) == labels.values[L.DEVICE_CLASS]


def test_class_facts_refuse_labels_that_disagree():
    facts = load_scenario("epyc-avx2")[0]
    selector = L.node_labels(facts, profile="x86_64-avx2", profile_version="0" * 12, cores=2).selector()
    L.class_facts(selector)  # as written: fine
    with pytest.raises(EdgectlError, match="describe x86_64-avx512, not the labelled device class x86_64-avx2"):
        L.class_facts({**selector, f"{L.NAMESPACE}/{L.ISA_AVX512}": "true"})
    with pytest.raises(EdgectlError, match="edgectl-cores='0': expected an integer >= 1"):
        L.class_facts({**selector, f"{L.NAMESPACE}/{L.CORES}": "0"})
    with pytest.raises(EdgectlError, match="label feature.node.kubernetes.io/edgectl-memory-gib is missing"):
        L.class_facts({k: v for k, v in selector.items() if not k.endswith(L.MEMORY_GIB)})
    with pytest.raises(EdgectlError, match="expected true or false"):
        L.class_facts({**selector, f"{L.NAMESPACE}/{L.ISA_AMX}": "yes"})


def test_a_profile_name_that_cannot_be_a_label_is_refused():
    facts = load_scenario("epyc-avx2")[0]
    with pytest.raises(EdgectlError, match="cannot be a Kubernetes label value.*rename the profile"):
        L.node_labels(facts, profile="my profile", profile_version="0" * 12, cores=2)


def test_profile_version_follows_the_content_not_the_comments(tmp_path):
    from edgectl.profiles import load_profile

    src = Path(__file__).resolve().parents[1] / "profiles" / "generic.yaml"
    a = tmp_path / "a.yaml"
    a.write_text(src.read_text())
    b = tmp_path / "b.yaml"
    b.write_text("# another comment\n" + src.read_text())
    c = tmp_path / "c.yaml"
    c.write_text(src.read_text() + "\n# end\n")
    versions = {p.name: L.profile_version(load_profile(p)) for p in (a, b, c)}
    assert len(set(versions.values())) == 1 and re.fullmatch(r"[0-9a-f]{12}", versions["a.yaml"])
    changed = tmp_path / "d.yaml"
    changed.write_text(src.read_text().replace("Conservative fallback", "Cautious fallback", 1))
    assert L.profile_version(load_profile(changed)) != versions["a.yaml"]


# --- the command ------------------------------------------------------------------------------


def test_probe_nfd_prints_the_file(tmp_path):
    proc = run_cli(["probe", "--nfd", "--root", str(host("kvm-epyc-avx2-2c"))])
    assert proc.returncode == 0, proc.stderr
    labels, expiry = L.parse_feature_file(proc.stdout)
    assert labels["feature.node.kubernetes.io/edgectl-device-class"] == "x86_64-avx2"
    assert labels["feature.node.kubernetes.io/edgectl-profile"] == "x86_64-avx2"
    now = datetime.now(timezone.utc)
    assert now + timedelta(hours=5) < expiry <= now + timedelta(hours=6, minutes=1)


def test_probe_nfd_out_writes_the_file_whole(tmp_path):
    out = tmp_path / "features.d" / "edgectl"
    out.parent.mkdir()
    proc = run_cli(["probe", "--nfd", "--root", str(host("xeon-spr-amx-2s")), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out}: 13 labels, node class x86-64-amx-")
    assert sorted(p.name for p in out.parent.iterdir()) == ["edgectl"]  # no temporary file left
    assert out.stat().st_mode & 0o777 == 0o644
    labels, _ = L.parse_feature_file(out.read_text())
    assert labels["feature.node.kubernetes.io/edgectl-cores"] == "56"


@pytest.mark.parametrize("args, says", [
    (["--out", "{d}/edgectl"], "go with --nfd"),
    (["--nfd", "--out", "{d}/missing/edgectl"], "does not exist"),
    (["--nfd", "--out", "{d}/.edgectl"], "does not start with a dot"),
    (["--nfd", "--capture", "{d}/capture"], "--nfd and --capture"),
    (["--nfd", "--install-timer", "--remove-timer"], "give one of them"),
    (["--nfd", "--install-timer", "--root", "{root}"], "drop --root"),
])
def test_probe_nfd_bad_input(tmp_path, args, says):
    args = [a.format(d=tmp_path, root=host("arm64-board")) for a in args]
    proc = run_cli(["probe", *args])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and says in proc.stderr
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


def _regen() -> None:
    for scenario in sorted(SCENARIOS):
        out = load_scenario(scenario)[2]
        out.write_text(render_scenario(scenario), encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regen()
    else:
        print(__doc__)
