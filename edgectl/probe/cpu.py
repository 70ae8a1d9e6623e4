"""The CPU: architecture, vendor, model, flags, the *usable* ISA and the device class.

Usable means the OS enabled it. The kernel's /proc/cpuinfo flags already say that: when the
kernel does not enable a feature's XSAVE state in XCR0 it clears the feature and everything that
depends on it (arch/x86/kernel/fpu/xstate.c, arch/x86/kernel/cpu/cpuid-deps.c), so a VM whose
cpuid advertises AVX-512 without the OS having enabled the ZMM state shows no ``avx512f`` there
(ollama/ollama#10074). On the live host the probe also reads cpuid and XCR0 itself and reports
every disagreement; a feature is usable only if the kernel lists it *and* cpuid advertises it
*and* XCR0 enables its state (when those are known).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from edgectl.probe import cpuid as cpuid_mod
from edgectl.probe.facts import (
    ISA_FEATURES,
    AmxPermission,
    CpuFacts,
    DeviceClass,
    Isa,
    IsaDisagreement,
)
from edgectl.probe.hostfs import HostFS, ReadFailed, Unknowns

_X86_ISA = tuple(f for f in ISA_FEATURES if f not in ("asimd", "sve"))

# "CPU implementer" / "CPU part" of arm64 /proc/cpuinfo → names (arch/arm64/include/asm/cputype.h).
_ARM_IMPLEMENTERS = {
    0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere",
}
_ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520", (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4",
    (0xC0, 0xAC3): "AmpereOne",
}


@dataclass(frozen=True)
class CpuInfo:
    """Parsed /proc/cpuinfo: one dict per ``processor`` block, plus trailing machine lines."""

    processors: tuple[dict[str, str], ...]
    machine: dict[str, str]  # arm boards print "Hardware", "Model", ... after the processors

    def first(self, key: str) -> str | None:
        for p in self.processors:
            if key in p:
                return p[key]
        return self.machine.get(key)


def parse_cpuinfo(text: str) -> CpuInfo:
    """Blocks of ``key<TAB>: value`` lines separated by blank lines (fs/proc/cpuinfo formats
    differ per architecture: x86 prints ``flags``, arm64 ``Features``)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"line without ':' {line[:60]!r}")
        current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    processors = tuple(b for b in blocks if "processor" in b)
    machine: dict[str, str] = {}
    for b in blocks:
        if "processor" not in b:
            machine.update(b)
    if not processors:
        raise ValueError("no 'processor' entries")
    for p in processors:
        try:
            int(p["processor"])
        except ValueError:
            # s390x prints "processor 0: version = ..." lines; not a format edgectl supports
            raise ValueError(f"'processor' is not a number: {p['processor'][:40]!r}") from None
    return CpuInfo(processors=processors, machine=machine)


def _flag_sets(info: CpuInfo) -> list[set[str]]:
    return [set((p.get("flags") or p.get("Features") or "").split()) for p in info.processors]


def _arch(fs: HostFS, info: CpuInfo) -> tuple[str | None, str]:
    """(arch, how it was found). The kernel's own answer first, then the cpuinfo format."""
    try:
        arch = fs.read_text("/proc/sys/kernel/arch").strip()
        if arch:
            return arch, "/proc/sys/kernel/arch"
    except ReadFailed:
        pass
    if fs.is_live:
        return os.uname().machine, "uname"
    p0 = info.processors[0]
    if "flags" in p0 and "vendor_id" in p0:
        return ("x86_64" if "lm" in p0["flags"].split() else "i686"), "cpuinfo format"
    if "Features" in p0 and "CPU implementer" in p0:
        return ("aarch64" if p0.get("CPU architecture", "8").strip() == "8" else "armv7l"), "cpuinfo format"
    return None, "cpuinfo format"


def _arm_names(info: CpuInfo) -> tuple[str | None, str | None]:
    vendors, models = [], []
    for p in info.processors:
        try:
            impl = int(p.get("CPU implementer", ""), 16)
            part = int(p.get("CPU part", ""), 16)
        except ValueError:
            continue
        vendor = _ARM_IMPLEMENTERS.get(impl, f"implementer {impl:#x}")
        model = _ARM_PARTS.get((impl, part), f"{vendor} part {part:#x}")
        if vendor not in vendors:
            vendors.append(vendor)
        if model not in models:
            models.append(model)
    board = info.machine.get("Model")  # Raspberry Pi kernels print the board name
    model_name = " + ".join(models) if models else None
    if board and model_name:
        model_name = f"{model_name} ({board})"
    return (" + ".join(vendors) if vendors else None), model_name or board


def probe_cpu(fs: HostFS, unknown: Unknowns, notes: list[str]) -> tuple[CpuFacts, CpuInfo | None]:
    """Read the CPU facts; on failure the facts are unknown (and listed), never guessed."""
    try:
        info = parse_cpuinfo(fs.read_text("/proc/cpuinfo"))
    except ReadFailed as exc:
        info, why = None, exc.reason
    except ValueError as exc:
        info, why = None, f"{fs.describe('/proc/cpuinfo')} is garbled: {exc}"
    if info is None:
        for fact in ("cpu.arch", "cpu.vendor", "cpu.model_name", "cpu.flags", "cpu.isa"):
            unknown.add(fact, why)
        empty = CpuFacts(arch=None, vendor=None, model_name=None, flags=(), isa=Isa(),
                         isa_disagreements=(), amx_permission=AmxPermission.NOT_CHECKED)
        return empty, None

    arch, _ = _arch(fs, info)
    if arch is None:
        unknown.add("cpu.arch", "neither /proc/sys/kernel/arch nor the cpuinfo format names an "
                                "architecture edgectl knows")
    sets = _flag_sets(info)
    common = set.intersection(*sets) if sets else set()
    if any(s != sets[0] for s in sets):
        # A thread may run on any CPU: only what every CPU has is usable.
        notes.append("CPUs list different flags; only the flags all CPUs share are reported")
    if not common:
        unknown.add("cpu.flags", f"{fs.describe('/proc/cpuinfo')} lists no flags/Features")

    signature = None
    if arch is not None and arch.startswith("x86"):
        vendor = info.first("vendor_id")
        model_name = info.first("model name")
        signature = _x86_signature(info)
    elif arch is not None and (arch.startswith("aarch64") or arch.startswith("arm")):
        vendor, model_name = _arm_names(info)
    else:
        vendor, model_name = info.first("vendor_id"), info.first("model name") or info.first("cpu")
    if vendor is None:
        unknown.add("cpu.vendor", f"{fs.describe('/proc/cpuinfo')} names no vendor")
    if model_name is None:
        unknown.add("cpu.model_name", f"{fs.describe('/proc/cpuinfo')} names no model")

    is_x86 = arch is not None and arch.startswith("x86")
    view = _cpuid_view(fs, is_x86, "amx_tile" in common, unknown, notes)
    usable, disagreements = _usable_isa(common, view, is_x86)
    permission = _amx_permission(fs, usable, view, is_x86, notes)
    facts = CpuFacts(
        arch=arch,
        vendor=vendor,
        model_name=model_name,
        flags=tuple(sorted(common)),
        isa=Isa(**{f: f in usable for f in ISA_FEATURES}),
        isa_disagreements=disagreements,
        amx_permission=permission,
        signature=signature,
    )
    return facts, info


def _x86_signature(info: CpuInfo) -> str | None:
    """``family F model M stepping S`` of the first CPU, as /proc/cpuinfo gives them (decimal)."""
    parts = [(label, info.first(key)) for label, key in (("family", "cpu family"), ("model", "model"),
                                                          ("stepping", "stepping"))]
    if any(value is None or not value.strip().isdigit() for _, value in parts):
        return None
    return " ".join(f"{label} {int(value)}" for label, value in parts if value is not None)


def _cpuid_view(fs: HostFS, is_x86: bool, request_amx: bool, unknown: Unknowns,
                notes: list[str]) -> cpuid_mod.CpuidView | None:
    if not is_x86:
        return None
    try:
        if fs.is_live:
            if os.uname().machine != "x86_64":
                return None
            return cpuid_mod.read_live(request_amx=request_amx)
        view = cpuid_mod.read_stand_in(fs)
        if view is None:
            notes.append("captured tree without a cpuid-flags stand-in: the ISA is taken from its "
                         "/proc/cpuinfo alone (no cross-check with cpuid)")
        return view
    except ReadFailed as exc:
        unknown.add("cpu.isa_disagreements", f"cpuid could not be cross-checked: {exc.reason}")
        return None


def _usable_isa(kernel: set[str], view: cpuid_mod.CpuidView | None,
                is_x86: bool) -> tuple[set[str], tuple[IsaDisagreement, ...]]:
    usable = {f for f in ISA_FEATURES if f in kernel}
    if not is_x86 or view is None:
        return usable, ()
    disagreements = []
    for f in _X86_ISA:
        in_kernel, in_cpuid = f in kernel, f in view.advertised
        enabled = view.os_enabled(f)
        if in_kernel == in_cpuid:
            if in_kernel and enabled is False:
                usable.discard(f)
                disagreements.append(IsaDisagreement(
                    f, True, True, f"both list it but XCR0={view.xcr0:#x} does not enable its register "
                                   "state: treated as not usable"))
            continue
        usable.discard(f)
        if in_cpuid and enabled is False:
            note = (f"cpuid advertises it but the OS has not enabled its register state "
                    f"(XCR0={view.xcr0:#x}): code that trusts cpuid dies with SIGILL; not usable")
        elif in_cpuid and enabled:
            note = ("cpuid advertises it and XCR0 enables its state, but the kernel does not list it "
                    "(disabled at boot with clearcpuid=, or a kernel too old to know it): not usable")
        elif in_cpuid:
            note = ("cpuid advertises it but the kernel has not enabled it (its XSAVE state is off, "
                    "or it was disabled at boot): code that trusts cpuid dies with SIGILL; not usable")
        else:
            note = f"the kernel lists it but {view.source} does not advertise it: not usable"
        disagreements.append(IsaDisagreement(f, in_kernel, in_cpuid, note))
    return usable, tuple(disagreements)


def _amx_permission(fs: HostFS, usable: set[str], view: cpuid_mod.CpuidView | None, is_x86: bool,
                    notes: list[str]) -> AmxPermission:
    if not is_x86 or "amx_tile" not in usable:
        return AmxPermission.UNSUPPORTED
    if not fs.is_live:
        notes.append("AMX permission not checked: a captured tree has no process to ask; "
                     "the device class assumes arch_prctl(ARCH_REQ_XCOMP_PERM) would succeed")
        return AmxPermission.NOT_CHECKED
    if view is None or view.amx_request is None:
        notes.append("AMX permission could not be requested (the cpuid helper did not run)")
        return AmxPermission.NOT_CHECKED
    if view.amx_request != "granted":
        notes.append(f"AMX tile-data permission {view.amx_request} by the kernel "
                     f"(errno {view.amx_errno}): AMX kernels cannot run here")
    return AmxPermission(view.amx_request)


def device_class(cpu: CpuFacts, *, live: bool) -> DeviceClass:
    """The class a deployment is planned for, from the usable ISA.

    avx512 = F+BW+VL+DQ: what vLLM's CPU build and torch check before loading their AVX-512
    library. amx needs AMX-TILE+AMX-BF16 usable and the tile-data permission granted; for a
    captured tree (``live`` False) the permission cannot be asked and the tree's files decide.
    On the live host a permission that could not be checked does not count as granted.
    """
    isa, arch = cpu.isa, cpu.arch or ""
    if arch.startswith("x86"):
        permitted = cpu.amx_permission is AmxPermission.GRANTED or (
            not live and cpu.amx_permission is AmxPermission.NOT_CHECKED)
        if isa.amx_tile and isa.amx_bf16 and permitted:
            return DeviceClass.X86_64_AMX
        if isa.avx512 and isa.avx512_bf16:
            return DeviceClass.X86_64_AVX512_BF16
        if isa.avx512:
            return DeviceClass.X86_64_AVX512
        if isa.avx2 and isa.fma:
            return DeviceClass.X86_64_AVX2
        return DeviceClass.GENERIC
    if arch.startswith("aarch64"):
        if isa.sve:
            return DeviceClass.AARCH64_SVE
        if isa.asimd:
            return DeviceClass.AARCH64_NEON
    return DeviceClass.GENERIC
