"""What the CPU *advertises* (cpuid) and what the OS enabled in XCR0, to cross-check /proc/cpuinfo.

On the live host the registers are read by ``_cpuid_helper.py`` in a short-lived subprocess
(why a subprocess: see that file). py-cpuinfo is not used for this: its cpuid path
(``_get_cpu_info_from_cpuid``) spawns a multiprocessing child and sleeps one second to measure
the clock (``CPUID.get_raw_hz``), and its flag table stops at CPUID.7.0 EBX/ECX, so it cannot
see AVX512_BF16 (7.1 EAX) or AMX (7.0 EDX) at all — measured here: ``cpuinfo.get_cpu_info()``
takes over a second. The helper takes ~20 ms.

For a captured tree there is no CPU to ask; a fixture may carry a file ``cpuid-flags`` at its
root that stands in for the cpuid view (see :func:`read_stand_in`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edgectl.probe.hostfs import HostFS, ReadFailed

STAND_IN_FILE = "/cpuid-flags"

# (leaf, register index in [eax, ebx, ecx, edx], bit) -> the kernel's /proc/cpuinfo name.
# Bits: Intel SDM vol. 2A, CPUID; names: arch/x86/include/asm/cpufeatures.h.
_BITS: dict[tuple[str, int, int], str] = {
    ("1", 2, 12): "fma",
    ("1", 2, 26): "xsave",
    ("1", 2, 28): "avx",
    ("7.0", 1, 5): "avx2",
    ("7.0", 1, 16): "avx512f",
    ("7.0", 1, 17): "avx512dq",
    ("7.0", 1, 21): "avx512ifma",
    ("7.0", 1, 28): "avx512cd",
    ("7.0", 1, 30): "avx512bw",
    ("7.0", 1, 31): "avx512vl",
    ("7.0", 2, 1): "avx512vbmi",
    ("7.0", 2, 6): "avx512_vbmi2",
    ("7.0", 2, 11): "avx512_vnni",
    ("7.0", 2, 12): "avx512_bitalg",
    ("7.0", 2, 14): "avx512_vpopcntdq",
    ("7.0", 3, 22): "amx_bf16",
    ("7.0", 3, 23): "avx512_fp16",
    ("7.0", 3, 24): "amx_tile",
    ("7.0", 3, 25): "amx_int8",
    ("7.1", 0, 4): "avx_vnni",
    ("7.1", 0, 5): "avx512_bf16",
}

# XCR0 state components a feature's registers need (Intel SDM vol. 1, 13.1): 1 SSE, 2 AVX (YMM
# upper halves), 5 opmask, 6 ZMM_Hi256, 7 Hi16_ZMM, 17 XTILECFG, 18 XTILEDATA.
_XCR0_AVX = (1 << 1) | (1 << 2)
_XCR0_AVX512 = _XCR0_AVX | (1 << 5) | (1 << 6) | (1 << 7)
_XCR0_AMX = (1 << 17) | (1 << 18)


def xcr0_needed(feature: str) -> int:
    if feature.startswith("amx_"):
        return _XCR0_AMX
    if feature.startswith("avx512"):
        return _XCR0_AVX512
    if feature in ("avx", "avx2", "fma", "avx_vnni", "f16c"):
        return _XCR0_AVX
    return 0


@dataclass(frozen=True)
class CpuidView:
    advertised: frozenset[str]  # kernel spelling, only the bits in _BITS
    xcr0: int | None  # None: not known (fixture stand-in without xcr0=)
    source: str  # for notes: "the cpuid instruction" / "the fixture's cpuid-flags stand-in"
    amx_request: str | None = None  # "granted" | "denied" | "unsupported" | None (not asked)
    amx_errno: int | None = None

    def os_enabled(self, feature: str) -> bool | None:
        """Does XCR0 enable the register state ``feature`` needs? None when XCR0 is unknown."""
        if self.xcr0 is None:
            return None
        need = xcr0_needed(feature)
        return self.xcr0 & need == need


def decode_leaves(leaves: dict[str, list[int]]) -> frozenset[str]:
    """Registers per leaf (``{"7.0": [eax, ebx, ecx, edx]}``) → advertised flag names."""
    found = set()
    for (leaf, reg, bit), name in _BITS.items():
        regs = leaves.get(leaf)
        if regs is not None and regs[reg] >> bit & 1:
            found.add(name)
    return frozenset(found)


def read_live(*, request_amx: bool, timeout_s: float = 10.0) -> CpuidView:
    """Run the helper on this host; raises :class:`ReadFailed` with the reason if it fails."""
    helper = Path(__file__).with_name("_cpuid_helper.py")
    cmd = [sys.executable, "-I", "-S", str(helper)] + (["--amx"] if request_amx else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReadFailed(f"the cpuid helper could not run: {exc}") from None
    if proc.returncode != 0:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        raise ReadFailed(f"the cpuid helper failed ({why})")
    try:
        out = json.loads(proc.stdout)
        leaves = {k: [int(x) for x in v] for k, v in out["leaves"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ReadFailed("the cpuid helper printed something that is not its JSON") from None
    if out.get("error"):
        raise ReadFailed(str(out["error"]))
    amx = out.get("amx") or {}
    xcr0 = out.get("xcr0")
    if xcr0 is None:
        # CPUID.1:ECX.OSXSAVE is 0: the OS never enabled XSAVE, so no state beyond x87/SSE is on
        xcr0 = 0x3
    return CpuidView(
        advertised=decode_leaves(leaves),
        xcr0=int(xcr0),
        source="the cpuid instruction",
        amx_request=amx.get("request"),
        amx_errno=amx.get("errno"),
    )


def read_stand_in(fs: HostFS) -> CpuidView | None:
    """The fixture's ``cpuid-flags`` file, or None when the tree has none.

    Format (documented in tests/fixtures/hosts/README.md): whitespace-separated flag names in
    the kernel's spelling (what cpuid advertises), ``#`` starts a comment, and an optional token
    ``xcr0=0x…`` gives the XCR0 value the guest's OS set.
    """
    text = fs.read_optional(STAND_IN_FILE)
    if text is None:
        return None
    flags: set[str] = set()
    xcr0: int | None = None
    for line in text.splitlines():
        for token in line.split("#", 1)[0].split():
            if token.startswith("xcr0="):
                try:
                    xcr0 = int(token[5:], 0)
                except ValueError:
                    raise ReadFailed(f"{fs.describe(STAND_IN_FILE)}: bad xcr0 value {token!r}") from None
            elif token.replace("_", "").isalnum():
                flags.add(token)
            else:
                raise ReadFailed(f"{fs.describe(STAND_IN_FILE)}: {token!r} is not a flag name")
    return CpuidView(advertised=frozenset(flags), xcr0=xcr0, source="the fixture's cpuid-flags stand-in")
