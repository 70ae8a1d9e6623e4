"""Instructions above AVX2 in machine code, found by disassembling it (no tests here).

The AVX2 tier (scripts/test.sh, tests/isa_helpers.py) holds every layer to AVX2 by settings;
this module checks the code itself: it runs binutils' ``objdump -d -w`` over a shared object
(or over raw bytes) and reports each instruction an AVX2 CPU would fault on with SIGILL. One
line of objdump's listing is ``ADDRESS:<tab>BYTES<tab>MNEMONIC OPERANDS``; an instruction is
above AVX2 (:func:`above_avx2`) when

1. its encoding is **EVEX**: the first byte after the legacy prefixes (66, 67, F2, F3, F0,
   segment overrides) is 0x62. Every AVX-512 instruction is EVEX-encoded, also where its
   operands look like AVX2 ones (``vpdpbusd %ymm2,%ymm1,%ymm0`` exists as AVX-512 VNNI, EVEX,
   and as AVX-VNNI, VEX: only the bytes tell them apart). In 64-bit mode 0x62 there is nothing
   else (it was BOUND, invalid in 64-bit mode: Intel SDM vol. 2, "EVEX encoding");
2. it names a register only AVX-512 has: ``%zmm0-31``, the mask registers ``%k0-7`` (the VEX-
   encoded ``kmovw`` & co. are AVX-512 too), ``%xmm16-31``/``%ymm16-31``; or an AMX tile,
   ``%tmm0-7`` (VEX-encoded ``tileloadd``, ``tdpbf16ps``);
3. objdump marks it ``{vex}``: the VEX form of an instruction that also has an AVX-512 one, i.e.
   AVX-VNNI, AVX-IFMA, AVX-NE-CONVERT — extensions after AVX2 that AVX2 CPUs lack.

What it does not look for: the scalar extensions of x86-64-v3 an AVX2 CPU has (BMI1/2, LZCNT,
MOVBE, F16C, FMA), and instructions from other later extensions that no compiler flag of the
tier enables (e.g. VAES, GFNI). The kernel library's units are found by their ELF symbols
(:func:`kernel_unit_ranges`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

OBJDUMP = "objdump"
READELF = "readelf"

# x86 legacy prefixes: operand/address size, rep/repne, lock, segment overrides (Intel SDM vol. 2, 2.1.1)
_LEGACY_PREFIXES = frozenset({0x66, 0x67, 0xF2, 0xF3, 0xF0, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65})
_EVEX = 0x62
_AVX512_REGISTER = re.compile(r"%(zmm\d+|k[0-7]\b|[xy]mm(1[6-9]|2\d|3[01])\b)")
_AMX_REGISTER = re.compile(r"%tmm[0-7]\b")
# objdump -d -w: "  2fa8:<tab>62 e2 7d 28 18 25 <tab>vbroadcastss 0x2312(%rip),%ymm20"
_LISTING_LINE = re.compile(r"^\s*([0-9a-f]+):\t((?:[0-9a-f]{2} )+)\s*\t(.*)$")


@dataclass(frozen=True)
class Finding:
    """One instruction above AVX2: where, its bytes and text, and which rule caught it."""

    where: str  # the object's path, and the function for a kernel unit
    address: int
    code: str  # the instruction's bytes, hex
    instruction: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where} {self.address:#x}: {self.code:<30} {self.instruction}  [{self.reason}]"


def above_avx2(code: bytes, instruction: str) -> str | None:
    """Why the instruction (its bytes and objdump's text of it) needs more than AVX2, or None."""
    i = 0
    while i < len(code) and code[i] in _LEGACY_PREFIXES:
        i += 1
    if i < len(code) and code[i] == _EVEX:
        return "EVEX-encoded (AVX-512)"
    register = _AVX512_REGISTER.search(instruction)
    if register:
        return f"AVX-512 register %{register.group(1)}"
    if _AMX_REGISTER.search(instruction):
        return "AMX tile register"
    if instruction.startswith("{vex}"):
        return "VEX form of an extension after AVX2 (AVX-VNNI, AVX-IFMA or AVX-NE-CONVERT)"
    return None


def instructions(listing: str) -> list[tuple[int, bytes, str]]:
    """The instructions of objdump's ``-d -w`` listing: address, bytes, text."""
    found = []
    for line in listing.splitlines():
        m = _LISTING_LINE.match(line)
        if m is not None:
            found.append((int(m.group(1), 16), bytes.fromhex(m.group(2)), m.group(3).strip()))
    return found


def findings_in_listing(listing: str, where: str, ranges: list[tuple[int, int, str]] | None = None) -> list[Finding]:
    """Every instruction above AVX2 in objdump's ``-d -w`` listing; with ``ranges`` ([start, end)
    addresses and a name), only those inside one of them. Raises if it looked at no instruction:
    a check that saw nothing must not pass."""
    found, seen = [], 0
    for address, code, text in instructions(listing):
        name = None
        if ranges is not None:
            name = next((n for start, end, n in ranges if start <= address < end), None)
            if name is None:
                continue
        seen += 1
        reason = above_avx2(code, text)
        if reason:
            found.append(Finding(f"{where} <{name}>" if name else where, address, code.hex(" "), text, reason))
    if seen == 0:
        raise RuntimeError(f"{where}: objdump listed no instructions to check")
    return found


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def disassemble(path: Path) -> str:
    """``objdump -d -w``: every executable section, one instruction a line (``-w``: long
    instructions are not wrapped onto a second line of bytes)."""
    return _run([OBJDUMP, "-d", "-w", str(path)])


def check_shared_object(path: Path) -> list[Finding]:
    """Every instruction above AVX2 in a shared object's code (e.g. one inductor compiled)."""
    return findings_in_listing(disassemble(path), str(path))


def disassemble_bytes(code: bytes) -> str:
    """``objdump -D -w`` of raw x86-64 machine code (for the checker's own tests)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(code)
        f.flush()
        return _run([OBJDUMP, "-D", "-w", "-b", "binary", "-m", "i386:x86-64", f.name])


def check_bytes(code: bytes) -> list[Finding]:
    """The same check over raw x86-64 machine code."""
    return findings_in_listing(disassemble_bytes(code), "bytes")


def kernel_unit_ranges(library: Path, level: str) -> list[tuple[int, int, str]]:
    """The functions of one ISA level of edgectl's kernel library: ``[start, end)`` and name.

    build.py compiles each level from its own file, ``csrc/isa_<level>.cpp``, with that level's
    ``-m`` flags, and links them into one ``_edgectl_kernels.so``; the file's helpers are local
    (an anonymous namespace, csrc/kernels.h), so their names repeat across levels. The ELF
    symbol table keeps a ``FILE`` symbol per object, followed by that object's local symbols:
    the level's functions are the ``FUNC`` symbols after ``FILE isa_<level>.cpp`` up to the next
    ``FILE`` symbol, plus its one exported function, ``edgectl::kernel_table_<level>()`` (hidden,
    so the linker lists it with the library's other hidden symbols, after an empty ``FILE``)."""
    table = re.compile(rf"^_ZN7edgectl\d+kernel_table_{re.escape(level)}Ev$")
    unit, current, ranges = f"isa_{level}.cpp", None, []
    # readelf -sW: "Num: Value Size Type Bind Vis Ndx Name"; .symtab after .dynsym
    for line in _run([READELF, "-sW", str(library)]).splitlines():
        fields = line.split()
        if len(fields) < 7 or not fields[0].endswith(":") or not fields[0][:-1].isdigit():
            continue
        kind, name = fields[3], (fields[7] if len(fields) > 7 else "")
        if kind == "FILE":
            current = name
        elif kind == "FUNC" and fields[6] != "UND" and (current == unit or table.match(name)):
            start, size = int(fields[1], 16), int(fields[2])
            if size and (start, start + size, name) not in ranges:
                ranges.append((start, start + size, name))
    if not any(table.match(n) for _, _, n in ranges) or len(ranges) < 2:
        raise RuntimeError(f"{library}: no functions of {unit} found by their symbols (FILE {unit}, "
                           f"kernel_table_{level}): a stripped library, or a level it does not have")
    return ranges


def check_kernel_unit(library: Path, level: str) -> list[Finding]:
    """Every instruction above AVX2 in the functions of one level of edgectl's kernel library."""
    ranges = kernel_unit_ranges(library, level)
    listing = disassemble(library)
    return findings_in_listing(listing, f"{library.name} isa_{level}.cpp", ranges)


def report(findings: list[Finding], limit: int = 20) -> str:
    """The first ``limit`` findings, one a line, and how many in all."""
    lines = [str(f) for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"... {len(findings) - limit} more")
    return f"{len(findings)} instructions above AVX2:\n" + "\n".join(lines)
