"""Build edgectl's kernel library (``_edgectl_kernels.so``) next to this file.

``python runtime/edgectl_runtime/kernels/ops/build.py`` (what ``scripts/setup.sh`` runs, before it
installs the checkout, so the installed package carries the same file) or
``python -m edgectl_runtime.kernels.ops.build``. Standard library and torch only: it runs from a
checkout before edgectl is installed.

- One object per ISA level, each with its own flags (``LEVELS``); the dispatcher and the
  registration (``dispatch.cpp``) with no ISA flags, so the library loads on any x86-64 CPU and
  picks a level at run time (``csrc/kernels.h``).
- The system ``g++``, against the headers of the torch in this interpreter
  (``torch.utils.cpp_extension.include_paths()``), no build isolation.
- OpenMP: compiled with ``-fopenmp`` but linked against the ``libgomp.so.1`` that torch's wheel
  ships (``torch/lib``), not the compiler's: two OpenMP runtimes in one process each keep their
  own thread pool and fight over the cores. At run time torch has already loaded its libgomp,
  and ours resolves to that same copy by its soname.
- Quick and reproducible: a stamp (``_edgectl_kernels.json``) records the hash of the sources,
  the flags, the compiler and torch; when they match, nothing is rebuilt. Paths are mapped out
  of the binary (``-ffile-prefix-map``).

Exit codes: 0 built or up to date; 2 the build cannot run here (one ``error:`` line, e.g. no
``g++``); 1 the compiler failed (its output is shown).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSRC = HERE / "csrc"
LIBRARY = "_edgectl_kernels.so"
STAMP = "_edgectl_kernels.json"
SCHEMA = "edgectl.kernel-build/1"

# -ffp-contract=off: a multiply and an add stay two roundings unless the source asks for an FMA,
# so every level rounds the way ops/reference.py does where the tests compare bit for bit.
COMMON = ["-std=c++20", "-O3", "-fPIC", "-fopenmp", "-fvisibility=hidden", "-fno-math-errno", "-ffp-contract=off",
          "-Wall", "-Wextra", "-Wno-unused-parameter"]
# (source, flags): the ISA files include no torch header (see csrc/kernels.h). GCC 12 warns
# "may be used uninitialized" inside its own intrinsic headers (_mm256_undefined_si256): silenced.
_VECTOR = ["-Wno-maybe-uninitialized"]
LEVELS_X86 = [
    ("isa_scalar.cpp", []),
    ("isa_avx2.cpp", ["-mavx2", "-mfma", "-mf16c", *_VECTOR]),
    ("isa_avxvnni.cpp", ["-mavx2", "-mfma", "-mf16c", "-mavxvnni", *_VECTOR]),
    ("isa_avx512vnni.cpp", ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl",
                            "-mavx512vnni", *_VECTOR]),
]
LEVELS_OTHER = [("isa_scalar.cpp", [])]
DISPATCH = ("dispatch.cpp", ["-O2"])


class BuildError(Exception):
    """The build cannot run on this machine (exit code 2, one line)."""


def levels() -> list[tuple[str, list[str]]]:
    return LEVELS_X86 if platform.machine() in ("x86_64", "AMD64") else LEVELS_OTHER


def _compiler() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        raise BuildError("g++ is not installed: edgectl's kernels are built with the system C++ compiler "
                         "(Debian: apt-get install g++; scripts/setup.sh installs it)")
    return cxx


def _torch_paths() -> tuple[list[str], Path, bool, str]:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        raise BuildError(f"torch is not importable by {sys.executable} ({exc}): run scripts/setup.sh") from None
    lib = Path(torch.__file__).resolve().parent / "lib"
    return cpp_extension.include_paths(), lib, bool(torch.compiled_with_cxx11_abi()), torch.__version__


def _gomp(torch_lib: Path) -> Path:
    gomp = torch_lib / "libgomp.so.1"
    if not gomp.is_file():
        raise BuildError(f"{gomp} is missing: this torch does not ship GNU OpenMP, and the kernels must use "
                         "the OpenMP runtime torch uses (a second one would fight it for the cores)")
    return gomp


def _inputs_hash(cxx_version: str, flags: dict) -> str:
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps(flags, sort_keys=True).encode())
    h.update(cxx_version.encode())
    return h.hexdigest()


def _unit_inputs(src: str) -> bytes:
    """The bytes a unit's object depends on: its source and every header beside it."""
    return b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in sorted(CSRC.iterdir())
                    if p.suffix == ".h" or p.name == src)


def source_hash() -> str:
    """The hash of the sources alone (what the loader compares to tell a stale library)."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _run(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def build(out_dir: Path = HERE, force: bool = False, log=print) -> dict:
    """Compile and link the library into ``out_dir``; returns the stamp."""
    cxx = _compiler()
    includes, torch_lib, cxx11_abi, torch_version = _torch_paths()
    gomp = _gomp(torch_lib)
    cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    base = COMMON + [f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}", f"-ffile-prefix-map={CSRC}=csrc"]
    units = levels() + [DISPATCH]
    flags = {"common": base, "units": {src: extra for src, extra in units}, "torch": torch_version,
             "machine": platform.machine()}
    want = _inputs_hash(cxx_version, flags)
    lib_path, stamp_path = out_dir / LIBRARY, out_dir / STAMP
    if not force:
        current = _current_stamp(lib_path, stamp_path, want)
        if current is not None:
            log(f"kernels: {lib_path} is up to date")
            return current
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = out_dir / ".kernels-cache"  # one object per unit and input hash: an edit recompiles one file
    cache.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".kernels-", dir=out_dir) as tmp:
        commands = [_compile_command(cxx, base, src, extra, includes) for src, extra in units]
        objects = _compile(units, commands, (cxx_version, torch_version), cache, Path(tmp), log)
        tmp_lib = Path(tmp) / LIBRARY
        link = [cxx, "-shared", "-o", str(tmp_lib), *map(str, objects), f"-L{torch_lib}", "-lc10", "-ltorch_cpu",
                str(gomp), f"-Wl,-rpath,{torch_lib}", "-Wl,--as-needed", "-Wl,--build-id=sha1"]
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, "g++ (link)", output=done.stdout + done.stderr)
        stamp = {"schema": SCHEMA, "inputs_sha256": want, "sources_sha256": source_hash(), "compiler": cxx_version,
                 "torch": torch_version, "machine": platform.machine(),
                 "levels": [Path(src).stem.removeprefix("isa_") for src, _ in levels()], "openmp": str(gomp)}
        os.chmod(tmp_lib, 0o755)
        os.replace(tmp_lib, lib_path)  # atomic: a running process keeps its mapped copy
        stamp_path.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    log(f"kernels: built {lib_path} ({', '.join(stamp['levels'])})")
    return stamp


def _current_stamp(lib_path: Path, stamp_path: Path, want: str) -> dict | None:
    """The stamp of a library already built from the same inputs, or None."""
    if not (lib_path.is_file() and stamp_path.is_file()):
        return None
    try:
        if json.loads(stamp_path.read_text()).get("inputs_sha256") == want:
            return json.loads(stamp_path.read_text())
    except ValueError:
        pass
    return None


def _compile_command(cxx: str, base: list[str], src: str, extra: list[str], includes: list[str]) -> list[str]:
    cmd = [cxx, *base, *extra, "-c", str(CSRC / src)]
    if src == DISPATCH[0]:
        cmd[1:1] = [f"-I{p}" for p in includes]
    return cmd


def _compile(units: list, commands: list[list[str]], tools: tuple[str, str], cache: Path, tmp: Path, log) -> list[Path]:
    """The object of each unit: from the cache where its command, compiler, torch and inputs are
    unchanged, compiled otherwise (in parallel, reported in order); stale objects removed."""
    objects, procs = [], []
    for (src, _), cmd in zip(units, commands):
        key = hashlib.sha256(json.dumps([cmd, *tools]).encode() + _unit_inputs(src)).hexdigest()
        obj = cache / f"{Path(src).stem}-{key[:16]}.o"
        objects.append(obj)
        if not obj.is_file():
            procs.append((src, obj, _run(cmd + ["-o", str(tmp / obj.name)])))
    failed = []
    for src, obj, proc in procs:  # compiled in parallel, reported in order
        output = proc.communicate()[0]
        if proc.returncode != 0:
            failed.append(f"--- {src}\n{output}")
            continue
        if output.strip():
            log(output.rstrip())
        os.replace(tmp / obj.name, obj)
    if failed:
        raise subprocess.CalledProcessError(1, "g++", output="\n".join(failed))
    for stale in cache.glob("*.o"):
        if stale not in objects:
            stale.unlink()
    return objects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.kernels.ops.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the library (default: beside this file)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args(argv)
    try:
        build(args.out, force=args.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(exc.output, file=sys.stderr)
        print("error: the kernel library did not compile (output above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
