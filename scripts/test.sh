#!/bin/sh
# Sets everything up (scripts/setup.sh, then llama.cpp's llama-server and llama-quantize, built once by
# scripts/llama_cpp.sh), then runs ruff and mypy, the whole test suite against the installed edgectl,
# then its AVX2 tier: the tests marked isa_avx2 once more, with PyTorch, oneDNN, vLLM and edgectl's
# kernels held to AVX2 (tests/isa_helpers.py). Fails if any of them fails.
#   sh scripts/test.sh                     both passes
#   sh scripts/test.sh ARGS...             one pass on this machine's own ISA, ARGS go to pytest
#                                          (e.g. -m "not engine and not systemd" for the fast tier)
#   sh scripts/test.sh --isa avx2 ARGS...  the AVX2 tier alone (ARGS go to pytest after -m isa_avx2)
set -eu
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
if [ "${1:-}" = "--isa" ] && [ "${2:-}" != "avx2" ]; then
    echo "error: --isa takes avx2, the one ISA tier, not '${2:-}': sh scripts/test.sh --isa avx2 [pytest args]" >&2
    exit 2
fi
sh "$REPO/scripts/setup.sh"
sh "$REPO/scripts/llama_cpp.sh"
VENV=${EDGECTL_PREFIX:-/opt/edgectl}/venv
cd "$REPO"

avx2_tier() {
    # ATEN_CPU_CAPABILITY: PyTorch's kernels and inductor's vector ISA; ONEDNN_MAX_CPU_ISA: oneDNN's
    # JIT; MKL_ENABLE_INSTRUCTIONS: MKL's GEMMs; TORCHINDUCTOR_CPP_MARCH: the -march inductor
    # compiles its C++ with (else native); GLIBC_TUNABLES: glibc's string functions; tests/isa_avx2's
    # sitecustomize: torch.cpu._is_avx512_supported() & co., which vLLM asks; EDGECTL_KERNEL_ISA:
    # edgectl's own kernels (runtime/edgectl_runtime/kernels/ops). The same values, and why, are
    # tests/isa_helpers.py AVX2_CAPS; EDGECTL_TEST_ISA: what tests/test_isa_tier.py checks each of
    # them read back, and where it disassembles what inductor compiled and the kernels selected.
    echo "== the AVX2 tier: the tests marked isa_avx2, held to AVX2"
    EDGECTL_TEST_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        TORCHINDUCTOR_CPP_MARCH=x86-64-v3 GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD \
        EDGECTL_KERNEL_ISA=avx2 PYTHONPATH="$REPO/tests/isa_avx2${PYTHONPATH:+:$PYTHONPATH}" \
        "$VENV/bin/pytest" -p no:cacheprovider -m isa_avx2 "$@"
}

if [ "${1:-}" = "--isa" ]; then
    shift 2
    avx2_tier "$@"
    exit
fi
if [ $# -gt 0 ]; then
    exec "$VENV/bin/pytest" -p no:cacheprovider "$@"
fi
# The linter and the type checker (their settings: pyproject.toml), then the suite; a failure of
# any of them fails the run, after all have run.
lint=0
echo "== ruff check (pyproject.toml [tool.ruff])"
"$VENV/bin/ruff" check --no-cache edgectl runtime tests scripts || lint=$?
echo "== mypy --strict edgectl/contract edgectl/planner (pyproject.toml [tool.mypy])"
"$VENV/bin/mypy" --no-incremental || lint=$?
native=0
"$VENV/bin/pytest" -p no:cacheprovider || native=$?
tier=0
avx2_tier || tier=$?
if [ "$lint" -ne 0 ] || [ "$native" -ne 0 ] || [ "$tier" -ne 0 ]; then
    echo "== failed: ruff/mypy exit $lint; this machine's ISA: pytest exit $native; the AVX2 tier: pytest exit $tier" >&2
    exit 1
fi
