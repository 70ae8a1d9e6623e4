"""The AVX2 tier's disassembly check (tests/isa_disassembly.py), on code whose answer is known:
hand-encoded instructions, and the three ISA levels of edgectl's kernel library, of which one,
``avx512vnni``, is AVX-512 by construction (build.py compiles it with ``-mavx512f ... -mavx512vnni``)
and must be caught, while ``avx2`` and ``scalar`` must pass. The tier's own use of it, over the
graphs inductor compiles and the level the run selects, is in tests/test_isa_tier.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import isa_disassembly
import pytest

REPO = Path(__file__).resolve().parents[1]
KERNEL_LIBRARY = REPO / "runtime" / "edgectl_runtime" / "kernels" / "ops" / "_edgectl_kernels.so"

pytestmark = pytest.mark.skipif(shutil.which(isa_disassembly.OBJDUMP) is None,
                                reason="objdump is missing (binutils: scripts/setup.sh installs it)")

# (machine code, what objdump prints, why it is above AVX2): one instruction per rule of above_avx2
ABOVE_AVX2 = [
    ("62 f1 74 48 58 c2", "vaddps %zmm2,%zmm1,%zmm0", "EVEX"),
    # AVX-512 VNNI on ymm registers: the text is the AVX-VNNI one's, the EVEX byte is not
    ("62 f2 75 28 50 c2", "vpdpbusd %ymm2,%ymm1,%ymm0", "EVEX"),
    # AVX-512VL on ymm16 (what g++ -march=native made of inductor's AVX2 code on an AVX-512 host)
    ("62 e1 7c 28 58 c1", "vaddps %ymm1,%ymm0,%ymm16", "EVEX"),
    # EVEX behind an address-size prefix
    ("67 62 f1 7c 48 10 00", "vmovups (%eax),%zmm0", "EVEX"),
    # VEX-encoded, but a mask register: AVX-512F
    ("c5 f8 90 c9", "kmovw  %k1,%k1", "AVX-512 register %k1"),
    ("c4 e2 7a 4b 04 24", "tilestored %tmm0,(%rsp)", "AMX"),
    ("c4 e2 75 50 c2", "{vex} vpdpbusd %ymm2,%ymm1,%ymm0", "VEX form"),
]
AVX2_AND_BELOW = [
    ("c5 fc 58 c1", "vaddps %ymm1,%ymm0,%ymm0"),
    ("c4 e2 7d 18 c0", "vbroadcastss %xmm0,%ymm0"),
    ("c4 e2 75 b8 c2", "vfmadd231ps %ymm2,%ymm1,%ymm0"),  # FMA
    ("c4 e2 75 04 c2", "vpmaddubsw %ymm2,%ymm1,%ymm0"),
    ("c5 f8 77", "vzeroupper"),
    ("c4 e2 78 f2 c1", "andn   %ecx,%eax,%eax"),  # BMI1
    ("c4 e2 7d 13 c0", "vcvtph2ps %xmm0,%ymm0"),  # F16C
    ("66 0f 58 c1", "addpd  %xmm1,%xmm0"),  # 0x66 prefix, SSE2
    ("c4 e3 7d 19 c1 01", "vextractf128 $0x1,%ymm0,%xmm1"),
    ("c5 fd 6f 04 24", "vmovdqa (%rsp),%ymm0"),
]


def test_every_kind_of_instruction_above_avx2_is_caught():
    code = b"".join(bytes.fromhex(h) for h, _, _ in ABOVE_AVX2)
    found = isa_disassembly.check_bytes(code)
    assert [(f.code, f.instruction) for f in found] == [(h, text) for h, text, _ in ABOVE_AVX2], \
        isa_disassembly.report(found)
    for f, (_, _, reason) in zip(found, ABOVE_AVX2):
        assert reason in f.reason, (f, reason)


def test_avx2_fma_f16c_and_bmi_pass():
    code = b"".join(bytes.fromhex(h) for h, _ in AVX2_AND_BELOW)
    assert isa_disassembly.check_bytes(code) == []
    # and objdump read them as these instructions (the check looked at each one)
    listing = isa_disassembly.disassemble_bytes(code)
    assert [(c.hex(" "), t) for _, c, t in isa_disassembly.instructions(listing)] == AVX2_AND_BELOW


def test_a_listing_with_no_instruction_is_an_error_not_a_pass():
    with pytest.raises(RuntimeError, match="no instructions"):
        isa_disassembly.findings_in_listing("\nDisassembly of section .text:\n", "empty.so")
    with pytest.raises(RuntimeError, match="no instructions"):
        isa_disassembly.findings_in_listing("  10:\tc5 f8 77 \tvzeroupper\n", "x.so", ranges=[(0x20, 0x30, "f")])


@pytest.fixture(scope="module")
def kernel_library() -> Path:
    if not KERNEL_LIBRARY.is_file():
        pytest.skip(f"edgectl's kernel library is not built ({KERNEL_LIBRARY}): scripts/setup.sh builds it")
    return KERNEL_LIBRARY


def test_the_kernel_librarys_avx512vnni_level_is_caught(kernel_library):
    """The level built with -mavx512f/-mavx512vnni: what the tier must catch if it ran."""
    found = isa_disassembly.check_kernel_unit(kernel_library, "avx512vnni")
    assert found, "the AVX-512 VNNI kernels disassembled with no AVX-512 instruction: the check is blind"
    assert any("vpdpbusd" in f.instruction and "EVEX" in f.reason for f in found), isa_disassembly.report(found)


@pytest.mark.parametrize("level", ["avx2", "scalar"])
def test_the_kernel_librarys_avx2_and_scalar_levels_pass(kernel_library, level):
    found = isa_disassembly.check_kernel_unit(kernel_library, level)
    assert found == [], isa_disassembly.report(found)


def test_the_kernel_librarys_avxvnni_level_adds_only_vex_vpdpbusd(kernel_library):
    """The AVX-VNNI level is the AVX2 level's code with VEX vpdpbusd: the check must see those (an
    AVX2 CPU lacks them: the level is chosen only where cpuid reports AVX-VNNI), and nothing else
    above AVX2 — no EVEX, no zmm — so it also runs on CPUs without AVX-512."""
    found = isa_disassembly.check_kernel_unit(kernel_library, "avxvnni")
    assert found, "the AVX-VNNI kernels disassembled with no AVX-VNNI instruction: the check is blind"
    others = [f for f in found if not ("{vex} vpdpbusd" in f.instruction and "VEX form" in f.reason)]
    assert others == [], isa_disassembly.report(others)


def test_each_level_is_its_own_code(kernel_library):
    """The levels' functions are told apart by their symbols (their local names repeat across
    levels): no address range is shared, and each level has its kernel table and its GEMM tiles."""
    ranges = {lv: isa_disassembly.kernel_unit_ranges(kernel_library, lv)
              for lv in ("scalar", "avx2", "avxvnni", "avx512vnni")}
    for lv, own in ranges.items():
        names = [n for _, _, n in own]
        assert any(f"kernel_table_{lv}" in n for n in names), names
        for other, theirs in ranges.items():
            if other != lv:
                assert not any(s < e2 and s2 < e for s, e, _ in own for s2, e2, _ in theirs), (lv, other)
    for lv in ("avx2", "avxvnni", "avx512vnni"):
        assert any("tile_w4" in n for _, _, n in ranges[lv]), ranges[lv]
    with pytest.raises(RuntimeError, match="no functions of isa_avx10.cpp"):
        isa_disassembly.kernel_unit_ranges(kernel_library, "avx10")
