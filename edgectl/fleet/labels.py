"""A node's class as Node Feature Discovery labels, and the facts a class's plan is made from.

NFD's local source (nfd-worker) reads the files in ``/etc/kubernetes/node-feature-discovery/
features.d/`` and publishes each ``<namespace>/<name>[=<value>]`` line as a node label. Lines
starting with ``#`` are comments, except ``# +expiry-time=<RFC 3339 time>``: once that time has
passed, the lines after it are ignored. Files whose name starts with a dot are ignored (so a file
is replaced by writing ``.name.XXXX`` and renaming it), and a file over 64 kB is ignored whole
(node-feature-discovery, docs/usage/customization-guide.md, "Local feature source").

The labels are edgectl's view of the node, in NFD's default namespace ``feature.node.kubernetes.io``:

================================  ==========================================================  ========
label (after the namespace)       value                                                       selector
================================  ==========================================================  ========
``edgectl-device-class``          the probe's device class (``x86_64-avx512``)                yes
``edgectl-arch``                  ``x86_64`` / ``aarch64``                                    yes
``edgectl-cpu-vendor``            ``GenuineIntel`` / ``AuthenticAMD`` / ``ARM`` (a profile    no
                                  may match on it; the profile is in the selector)
``edgectl-isa.avx2``              AVX2 with FMA usable (``true``/``false``)                   yes
``edgectl-isa.avx512``            AVX-512 F+BW+VL+DQ usable (what vLLM's AVX-512 build needs)  yes
``edgectl-isa.avx512-vnni``       AVX512_VNNI usable                                          yes
``edgectl-isa.avx512-bf16``       AVX512_BF16 usable                                          yes
``edgectl-isa.amx``               AMX tile/int8/bf16 usable (the device class's AMX rule)     yes
``edgectl-cpus``                  usable CPUs (affinity ∩ cgroup cpuset ∩ online)             no
``edgectl-cores``                 the OpenMP threads edgectl's planner runs here: usable      yes
                                  CPUs, one per physical core, on one NUMA node, within the
                                  CPU quota (before reserving a core for the HTTP front end)
``edgectl-memory-gib``            memory budget of one edgectl worker on this node, GiB       yes
                                  rounded down: min(MemTotal, cgroup limit) − the probe's
                                  reserve
``edgectl-bandwidth-gbps``        measured copy bandwidth, when ``--bandwidth`` was given     no
``edgectl-profile``               the device profile the planner selects for this node        yes
``edgectl-profile-version``       12 hex digits of the SHA-256 of that profile's content      yes
================================  ==========================================================  ========

The selector labels are what a class's plan is computed from (:func:`class_facts`), so nodes
with equal selector labels get the same plan, and a Deployment's ``nodeSelector`` made of them
lands only on nodes that plan fits. (The vendor label only lets a profile that matches on the
vendor match again; which profile it is, is in the selector.) The memory label is *not* the
probe's budget (which starts from MemAvailable): that moves with whatever runs, including
edgectl's own pod, and a label that changes when the pod starts would stop its node from
matching its own selector. What else runs on a node is the scheduler's business (requests
against allocatable memory). The other labels not in the selector are information: they vary
between probes of one node (bandwidth) or do not change the plan (CPUs beyond the cores used).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from edgectl.errors import EdgectlError
from edgectl.probe.facts import (
    AmxPermission,
    CpuFacts,
    DeviceClass,
    HostFacts,
    Isa,
    MemoryFacts,
    NumaNode,
    SoftwareFacts,
    TopologyFacts,
    UnknownFact,
)

if TYPE_CHECKING:
    from edgectl.profiles import Profile

NAMESPACE = "feature.node.kubernetes.io"  # NFD's default label namespace
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
FEATURE_FILE = f"{FEATURES_DIR}/edgectl"
FEATURE_FILE_MAX_BYTES = 64 * 1024  # NFD ignores a larger feature file
# edgectl-nfd.timer rewrites the file every hour; labels of a node whose edgectl stopped
# refreshing them lapse after six missed runs, and its pods are no longer scheduled there.
REFRESH_INTERVAL = timedelta(hours=1)
EXPIRY = timedelta(hours=6)
GiB = 1 << 30

DEVICE_CLASS = "edgectl-device-class"
ARCH = "edgectl-arch"
CPU_VENDOR = "edgectl-cpu-vendor"
ISA_AVX2 = "edgectl-isa.avx2"
ISA_AVX512 = "edgectl-isa.avx512"
ISA_AVX512_VNNI = "edgectl-isa.avx512-vnni"
ISA_AVX512_BF16 = "edgectl-isa.avx512-bf16"
ISA_AMX = "edgectl-isa.amx"
CPUS = "edgectl-cpus"
CORES = "edgectl-cores"
MEMORY_GIB = "edgectl-memory-gib"
BANDWIDTH_GBPS = "edgectl-bandwidth-gbps"
PROFILE = "edgectl-profile"
PROFILE_VERSION = "edgectl-profile-version"

ISA_LABELS = (ISA_AVX2, ISA_AVX512, ISA_AVX512_VNNI, ISA_AVX512_BF16, ISA_AMX)
# In file order; the ones a class's plan is computed from, which a nodeSelector matches.
ALL_LABELS = (DEVICE_CLASS, ARCH, CPU_VENDOR, *ISA_LABELS, CPUS, CORES, MEMORY_GIB, BANDWIDTH_GBPS, PROFILE, PROFILE_VERSION)
SELECTOR_LABELS = (DEVICE_CLASS, ARCH, *ISA_LABELS, CORES, MEMORY_GIB, PROFILE, PROFILE_VERSION)

# Kubernetes label syntax (k8s.io/apimachinery validation: IsQualifiedName, IsValidLabelValue).
_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_MAX = 63


def valid_label_value(value: str) -> bool:
    return len(value) <= _LABEL_MAX and bool(_VALUE_RE.fullmatch(value))


def valid_label_name(name: str) -> bool:
    return len(name) <= _LABEL_MAX and bool(_NAME_RE.fullmatch(name))


@dataclass(frozen=True)
class NodeLabels:
    """edgectl's labels of one node (names without the namespace), and those it could not give."""

    values: dict[str, str]
    missing: tuple[tuple[str, str], ...] = ()  # (label, why the probe could not give it)

    def full(self) -> dict[str, str]:
        """Label name with NFD's namespace → value, in file order."""
        return {f"{NAMESPACE}/{k}": v for k, v in self.values.items()}

    def selector(self) -> dict[str, str] | None:
        """The labels a class's plan is computed from (namespaced); None when one is missing."""
        if any(k not in self.values for k in SELECTOR_LABELS):
            return None
        return {f"{NAMESPACE}/{k}": self.values[k] for k in SELECTOR_LABELS}

    def why_no_class(self) -> str:
        return "; ".join(f"{label}: {why}" for label, why in self.missing if label in SELECTOR_LABELS)

    def class_id(self) -> str:
        """A short name for the class: ``x86-64-avx2-1a2b3c`` (device class + hash of the selector)."""
        selector = self.selector()
        if selector is None:
            raise ValueError("a node without every selector label has no class")
        return class_id(selector)


def class_id(selector: Mapping[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(dict(sorted(selector.items()))).encode()).hexdigest()[:6]
    device_class = selector.get(f"{NAMESPACE}/{DEVICE_CLASS}", "node")
    return f"{device_class.replace('_', '-')}-{digest}"


def profile_version(profile: Profile) -> str:
    """12 hex digits of the SHA-256 of a profile's content (its YAML, comments not counted)."""
    import yaml

    try:
        with open(profile.file, encoding="utf-8") as f:
            content = yaml.safe_load(f)
    except OSError as exc:
        raise EdgectlError(f"{profile.file}: cannot read the profile: {exc.strerror}") from None
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def planned_cores(facts: HostFacts) -> int:
    """The OpenMP threads the planner gives this host, before reserving a front-end core.

    The planner's own CPU decision (NUMA node, one thread per physical core, the CPU quota), so
    the label and the plan cannot disagree. It consults a profile only about reserving a core
    for the front end, which this count leaves out, and about how the threads wait, which does not
    change it (the class's plan decides both again).
    """
    from edgectl.contract.plan import BenchLevers, Request, Topology
    from edgectl.planner.cpus import choose_cpus

    # both named: the profile is not consulted (any profile will do)
    asked = BenchLevers(reserve_frontend_core=False, thread_wait="spin")
    decided = choose_cpus(facts, Request(model="-", bench=asked), None,  # type: ignore[arg-type]
                          Topology.SINGLE_PROCESS)
    return decided.value.threads


def _bool(value: bool) -> str:
    return "true" if value else "false"


def memory_gib(facts: HostFacts) -> tuple[int | None, str]:
    """(the memory label's GiB, or None; how it was derived or why it is unknown)."""
    m = facts.memory
    if m.total_bytes is None or m.reserve_bytes is None:
        return None, "MemTotal is unknown"
    if facts.is_unknown("memory.cgroup_limit_bytes"):
        return None, "a cgroup memory limit may apply but could not be read"
    effective = m.total_bytes if m.cgroup_limit_bytes is None else min(m.total_bytes, m.cgroup_limit_bytes)
    return max(0, effective - m.reserve_bytes) // GiB, "min(MemTotal, cgroup limit) − reserve"


def node_labels(facts: HostFacts, *, profile: str, profile_version: str, cores: int) -> NodeLabels:
    """edgectl's labels for a node whose probe gave ``facts`` (pure)."""
    isa = facts.cpu.isa
    values: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    values[DEVICE_CLASS] = str(facts.device_class)
    if facts.cpu.arch:
        values[ARCH] = facts.cpu.arch
    else:
        missing.append((ARCH, "the CPU architecture is unknown"))
    vendor = facts.cpu.vendor
    if vendor and valid_label_value(vendor):
        values[CPU_VENDOR] = vendor
    else:
        missing.append((CPU_VENDOR, "the CPU vendor is unknown" if not vendor else
                        f"{vendor!r} cannot be a label value"))
    values[ISA_AVX2] = _bool(isa.avx2 and isa.fma)
    values[ISA_AVX512] = _bool(isa.avx512f and isa.avx512bw and isa.avx512vl and isa.avx512dq)
    values[ISA_AVX512_VNNI] = _bool(isa.avx512_vnni)
    values[ISA_AVX512_BF16] = _bool(isa.avx512_bf16)
    values[ISA_AMX] = _bool(facts.device_class is DeviceClass.X86_64_AMX and isa.amx_int8)
    usable = facts.topology.usable_cpus
    if usable:
        values[CPUS] = str(len(usable))
    else:
        missing.append((CPUS, "the usable CPUs are unknown"))
    values[CORES] = str(cores)
    gib, why = memory_gib(facts)
    if gib is None:
        missing.append((MEMORY_GIB, why))
    else:
        values[MEMORY_GIB] = str(gib)
    if facts.bandwidth_gbps is not None:
        values[BANDWIDTH_GBPS] = f"{facts.bandwidth_gbps:.1f}"
    values[PROFILE] = profile
    values[PROFILE_VERSION] = profile_version
    for name, value in values.items():
        if not valid_label_value(value):
            raise EdgectlError(f"{name}={value!r} cannot be a Kubernetes label value (at most 63 letters, "
                               "digits, '-', '_' or '.', starting and ending with a letter or digit)"
                               + ("; rename the profile" if name == PROFILE else ""))
    return NodeLabels(values, tuple(missing))


def labels_for(facts: HostFacts, profiles: list[Profile]) -> NodeLabels:
    """The labels of a node, with the profile the planner selects for it from ``profiles``."""
    from edgectl.profiles import select_profile

    profile, _ = select_profile(profiles, facts)
    return node_labels(facts, profile=profile.name, profile_version=profile_version(profile),
                       cores=planned_cores(facts))


def render_feature_file(labels: NodeLabels, now: datetime) -> str:
    """The local-source feature file: labels in file order, expiring :data:`EXPIRY` after ``now``."""
    expiry = (now.astimezone(timezone.utc) + EXPIRY).replace(microsecond=0)
    lines = [
        "# edgectl probe --nfd: this node's class for edgectl's Kubernetes plans. NFD's local source",
        "# publishes each line below as a node label; edgectl-nfd.timer rewrites this file every hour.",
        f"# +expiry-time={expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}",
    ]
    for label, why in labels.missing:
        lines.append(f"# {NAMESPACE}/{label}: not given, {why}")
    lines += [f"{k}={v}" for k, v in labels.full().items()]
    text = "\n".join(lines) + "\n"
    assert len(text.encode()) < FEATURE_FILE_MAX_BYTES
    return text


def parse_feature_file(text: str, source: str = "feature file") -> tuple[dict[str, str], datetime | None]:
    """(label → value, the last expiry time) as NFD's local source reads the file."""
    labels: dict[str, str] = {}
    expiry: datetime | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            directive = line[1:].strip()
            if directive.startswith("+expiry-time="):
                stamp = directive.split("=", 1)[1].strip()
                try:
                    expiry = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                except ValueError:
                    raise EdgectlError(f"{source}:{n}: expiry time {stamp!r} is not RFC 3339") from None
            continue
        name, has_value, value = line.partition("=")
        labels[name] = value if has_value else "true"  # NFD: a name alone means "true"
    return labels, expiry


# --- the facts of a class --------------------------------------------------------------------


class _LabelReader:
    """A node class's labels read strictly: a missing or malformed one names itself."""

    def __init__(self, labels: Mapping[str, str], source: str) -> None:
        self.labels, self.source = labels, source

    def get(self, label: str) -> str:
        key = f"{NAMESPACE}/{label}"
        if key not in self.labels:
            raise EdgectlError(f"{self.source}: label {key} is missing")
        return self.labels[key]

    def flag(self, label: str) -> bool:
        value = self.get(label)
        if value not in ("true", "false"):
            raise EdgectlError(f"{self.source}: label {NAMESPACE}/{label}={value!r}: expected true or false")
        return value == "true"

    def count(self, label: str, minimum: int) -> int:
        value = self.get(label)
        if not value.isdigit() or int(value) < minimum:
            raise EdgectlError(f"{self.source}: label {NAMESPACE}/{label}={value!r}: "
                               f"expected an integer >= {minimum}")
        return int(value)

    def device_class(self) -> DeviceClass:
        try:
            return DeviceClass(self.get(DEVICE_CLASS))
        except ValueError:
            raise EdgectlError(f"{self.source}: label {NAMESPACE}/{DEVICE_CLASS}={self.get(DEVICE_CLASS)!r} is not "
                               f"a device class ({', '.join(str(c) for c in DeviceClass)})") from None


def _labelled_isa(r: _LabelReader, device_class: DeviceClass) -> Isa:
    """The ISA the labels say is usable, each label standing for the features its rule needs."""
    avx2, avx512, vnni, bf16, amx = (r.flag(label) for label in ISA_LABELS)
    return Isa(
        avx2=avx2, fma=avx2,
        avx512f=avx512, avx512bw=avx512, avx512vl=avx512, avx512dq=avx512,
        avx512_vnni=vnni, avx512_bf16=bf16,
        amx_tile=amx, amx_int8=amx, amx_bf16=amx,
        asimd=device_class in (DeviceClass.AARCH64_NEON, DeviceClass.AARCH64_SVE),
        sve=device_class is DeviceClass.AARCH64_SVE,
    )


def class_facts(labels: Mapping[str, str], source: str = "node class") -> HostFacts:
    """The facts a class's plan is computed from: its labels (namespaced), and nothing else.

    The selector labels decide; the topology is ``edgectl-cores`` CPUs, one per core, on one
    NUMA node, and the memory budget is ``edgectl-memory-gib``. ``edgectl-cpu-vendor``, when
    given, only lets a profile that matches on the vendor match again (the class's plan must
    select the profile its ``edgectl-profile`` label names; edgectl/fleet/fleet.py checks).
    Raises EdgectlError naming a missing or malformed label.
    """
    r = _LabelReader(labels, source)
    device_class = r.device_class()
    arch = r.get(ARCH)
    isa = _labelled_isa(r, device_class)
    cores = r.count(CORES, 1)
    budget = r.count(MEMORY_GIB, 0) * GiB
    cpus = tuple(range(cores))
    vendor = labels.get(f"{NAMESPACE}/{CPU_VENDOR}")
    cpu = CpuFacts(arch=arch, vendor=vendor, model_name=None, flags=(), isa=isa, isa_disagreements=(),
                   amx_permission=AmxPermission.GRANTED if isa.amx_tile else AmxPermission.UNSUPPORTED)
    from edgectl.probe.cpu import device_class as classify

    if classify(cpu, live=True) is not device_class:
        raise EdgectlError(f"{source}: the ISA labels describe {classify(cpu, live=True)}, not the labelled "
                           f"device class {device_class}")
    unknown = tuple(UnknownFact(f, "a node class has no such fact: planned from its labels")
                    for f in ("memory.total_bytes", "memory.available_bytes", "software.python"))
    return HostFacts(
        root=source,
        device_class=device_class,
        cpu=cpu,
        topology=TopologyFacts(logical_cpus=cores, physical_cores=cores, sockets=1, usable_cpus=cpus,
                               cpu_quota_cores=None, numa_nodes=(NumaNode(0, cpus, None),)),
        memory=MemoryFacts(total_bytes=None, available_bytes=None, swap_total_bytes=None, cgroup_version=None,
                           cgroup_path=None, cgroup_limit_bytes=None, cgroup_usage_bytes=None, reserve_bytes=None,
                           budget_bytes=budget),
        bandwidth_gbps=None,
        software=SoftwareFacts(python=None, torch=None, vllm=None, systemd_pid1=None, kernel=None),
        unknown=unknown,
        notes=(f"the facts of a node class, from its labels: {cores} cores, {budget // GiB} GiB",),
    )
