#!/bin/sh
# Builds llama.cpp's llama-server and llama-quantize once, for the tests that run edgectl against
# llama.cpp (tests/test_pull_agreement.py, tests/test_bench_llama.py, tests/test_models_synthetic.py).
# The source is llama-cpp-python's source archive on PyPI, pinned below by version and sha256; the
# build is edgectl's own (edgectl/llamacpp.py's build_llama_cpp, what `edgectl bench --build-llama-cpp`
# runs: CPU only, static, those two targets, no web UI), given the verified archive, and lands where
# edgectl looks for it: <EDGECTL_MODEL_CACHE>/../llama.cpp/<version> (/var/lib/edgectl/llama.cpp as root).
# A stamp beside the build (the archive's sha256) makes a second run reuse it in a second.
# Needs scripts/setup.sh first: its venv, and cmake and g++ from Debian.
set -eu
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VENV=${EDGECTL_PREFIX:-/opt/edgectl}/venv
PY="$VENV/bin/python"

ROOT=$("$PY" -c "import os; from edgectl.llamacpp import cache_root; print(cache_root(os.environ))")
BUILD="$ROOT/$VERSION"
STAMP="$BUILD/SDIST_SHA256"

# Reused when built from this archive, with both tools, on a CPU with every ISA extension it was
# built for (edgectl records them in CPU_FLAGS; find_llama_server passes over a build without them).
reusable() {
  [ "$(cat "$STAMP" 2>/dev/null || true)" = "$SHA256" ] || return 1
  [ -x "$BUILD/bin/llama-server" ] && [ -x "$BUILD/bin/llama-quantize" ] || return 1
  have=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || grep -m1 '^Features' /proc/cpuinfo 2>/dev/null || true)
  for flag in $(cat "$BUILD/CPU_FLAGS" 2>/dev/null || echo missing-record); do
    case " ${have#*:} " in *" $flag "*) ;; *) return 1 ;; esac
  done
}
if reusable; then
  echo "llama.cpp: llama-server and llama-quantize of llama-cpp-python $VERSION already built in $BUILD"
  exit 0
fi

for tool in cmake c++ cc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is missing: run scripts/setup.sh first" >&2; exit 2; }
done
ARCHIVE_DIR=$(mktemp -d)
trap 'rm -rf "$ARCHIVE_DIR"' EXIT
echo "llama.cpp: building llama-server and llama-quantize of llama-cpp-python $VERSION into $BUILD (several minutes, once)"
printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$VERSION" "$SHA256" > "$ARCHIVE_DIR/requirements.txt"
"$PY" -m pip download --disable-pip-version-check -q --no-deps --no-binary llama-cpp-python \
    --require-hashes -r "$ARCHIVE_DIR/requirements.txt" -d "$ARCHIVE_DIR" 2>&1 | grep -v "is ignored: it is neither" || true
ARCHIVE="$ARCHIVE_DIR/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$ARCHIVE" ] || ! echo "$SHA256  $ARCHIVE" | sha256sum -c --quiet >/dev/null 2>&1; then
  echo "error: pip did not download llama-cpp-python $VERSION's source archive with sha256 $SHA256; see above" >&2
  exit 1
fi
"$PY" - "$ARCHIVE" <<'PYEOF'
import os, sys
from pathlib import Path
from edgectl.errors import EdgectlError
from edgectl.llamacpp import build_llama_cpp
try:
    build_llama_cpp(os.environ, sys.executable, lambda line: print(f"llama.cpp: {line}", flush=True),
                    archive=Path(sys.argv[1]))
except EdgectlError as exc:
    sys.exit(f"error: {exc.message}")
PYEOF
echo "$SHA256" > "$STAMP"
