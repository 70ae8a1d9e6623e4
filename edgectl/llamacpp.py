"""llama.cpp's ``llama-server``, the comparison arm: found on PATH or built once from source.

The source is the one ``llama-cpp-python``'s source archive carries (``vendor/llama.cpp``), fetched
from PyPI with pip, the only registry the target boxes reach. The build is CPU-only, static,
with the web UI neither downloaded nor built (``LLAMA_USE_PREBUILT_UI=OFF`` — by default the
build fetches it from a Hugging Face bucket), and lands in a cache directory next to the model
cache: ``<EDGECTL_MODEL_CACHE>/../llama.cpp/<version>/bin/llama-server``.

The same build makes ``llama-quantize`` beside it and keeps the source's Hugging Face converter
(``convert_hf_to_gguf.py`` with its ``conversion/`` and ``gguf-py/``) under ``<version>/convert/``:
``edgectl models pull`` of a synthetic catalog model (edgectl/models/synthetic.py) converts and
quantizes with them, so the bench's llama.cpp arm reads a GGUF made by its own source.

Used by the bench, the pull's agreement check and the synthetic pull: it sits beside the models
(it needs only where their cache is), below all three.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import cache_dir

PACKAGE = "llama-cpp-python"
BINARY = "llama-server"
QUANTIZE = "llama-quantize"
TARGETS = (BINARY, QUANTIZE)
CONVERT_DIR = "convert"  # <version>/convert/convert_hf_to_gguf.py, conversion/, gguf-py/
CONVERT_SCRIPT = "convert_hf_to_gguf.py"
_CONVERT_FILES = (CONVERT_SCRIPT, "conversion", "gguf-py")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LlamaServer:
    path: str | None  # None: not available
    origin: str  # "PATH", "cache", "--llama-server" or why it is missing


def cache_root(environ: Mapping[str, str]) -> Path:
    return cache_dir(environ).parent / "llama.cpp"


# A cached build is compiled for the CPU that built it (``isa_options``): it may use any ISA extension
# of that CPU, and would die of SIGILL on one without (a cache kept across a hardware change).
# The builder's ISA flags are written beside the binary, and a build is used only where they all exist.
CPU_FLAGS_FILE = "CPU_FLAGS"
_ISA_PREFIXES = ("avx", "amx", "sse", "ssse", "fma", "f16c", "bmi", "popcnt", "movbe", "abm", "lzcnt", "adx",
                 "sha", "aes", "vaes", "vpclmul", "pclmul", "gfni", "asimd", "sve", "fp16", "i8mm", "dotprod")


def isa_flags(flags: Iterable[str]) -> set[str]:
    """The instruction-set extensions among /proc/cpuinfo's flags (what a native build may use)."""
    return {f for f in flags if f.startswith(_ISA_PREFIXES)}


# Extensions above AVX2 + FMA (x86-64-v3): what a run held to AVX2 does not use, and what a build
# for it leaves out (AVX-VNNI too: edgectl's AVX2 kernels use vpmaddubsw/vpmaddwd, not VNNI). A run
# held to AVX-VNNI (an AVX2 CPU with AVX-VNNI and no AVX-512, such as an N100) keeps that one.
_ABOVE_AVX2 = ("avx512", "amx", "avx_vnni", "avx_ifma", "avx_ne", "avx10")
HELD_ISA_FLAG = {"avx2": "avx2", "avxvnni": "avx_vnni"}  # a held ISA -> the CPU flag it needs (and keeps)
HELD_ISAS = tuple(HELD_ISA_FLAG)


def held_isa(environ: Mapping[str, str]) -> str | None:
    """The ISA a run is held to: ``ATEN_CPU_CAPABILITY=avx2`` holds it to AVX2, and with
    ``EDGECTL_KERNEL_ISA=avxvnni`` to AVX2 + AVX-VNNI (edgectl's kernels use it there, so llama.cpp's
    build may too); None: not held."""
    if (environ.get("ATEN_CPU_CAPABILITY") or "").strip().lower() != "avx2":
        return None
    return "avxvnni" if (environ.get("EDGECTL_KERNEL_ISA") or "").strip().lower() == "avxvnni" else "avx2"


def held_flags(flags: Iterable[str], held_to: str | None) -> list[str]:
    """The CPU flags a run may use when held to ``held_to`` (:func:`held_isa`; None: all)."""
    if held_to is None or held_to not in HELD_ISAS:
        return list(flags)
    kept = HELD_ISA_FLAG[held_to]
    return [f for f in flags if f == kept or not f.startswith(_ABOVE_AVX2)]


def find_llama_server(environ: Mapping[str, str], explicit: str | None = None,
                      host_flags: Iterable[str] | None = None, held_to: str | None = None) -> LlamaServer:
    """``--llama-server`` if given, else the newest cached build this CPU can run (``host_flags``:
    the probe's CPU flags; a build lacking its builder's flags is passed over), else
    ``llama-server`` on PATH. ``held_to="avx2"`` (a run with ``ATEN_CPU_CAPABILITY=avx2``): only a
    build without the extensions above AVX2 counts (``--build-llama-cpp --llama-cpp-isa avx2``), so
    both engines of an AVX2-path comparison run AVX2 code; ``held_to="avxvnni"`` likewise with
    AVX-VNNI kept (``--llama-cpp-isa avxvnni``)."""
    want = held_to if held_to in HELD_ISAS else None  # the held build this run takes, None: a native one
    if host_flags is not None:
        host_flags = held_flags(host_flags, want)
    held = f" (the run is held to {want})" if want else ""
    if explicit:
        p = Path(explicit).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise EdgectlError(f"--llama-server {explicit}: not an executable file")
        return LlamaServer(str(p.resolve()), "--llama-server")
    root = cache_root(environ)
    passed_over: list[str] = []
    if root.is_dir():
        built = sorted((d / "bin" / BINARY for d in root.iterdir() if (d / "bin" / BINARY).is_file()),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        for b in built:
            version_dir = b.parent.parent
            build_held = next((h for h in HELD_ISAS if version_dir.name.endswith(f"-{h}")), None)
            if build_held != want:
                passed_over.append(f"{version_dir.name}: " + (f"held to {build_held}, for runs held to it"
                                                              if build_held else "built for this CPU's own ISA"))
                continue
            if host_flags is not None:
                record = version_dir / CPU_FLAGS_FILE
                if not record.is_file():
                    passed_over.append(f"{version_dir.name}: built before edgectl recorded the building CPU")
                    continue
                missing = sorted(isa_flags(record.read_text().split()) - isa_flags(host_flags))
                if missing:
                    passed_over.append(f"{version_dir.name}: built on a CPU with {', '.join(missing[:4])}"
                                       f"{' …' if len(missing) > 4 else ''}, which this one lacks{held}")
                    continue
            return LlamaServer(str(b), f"cache ({version_dir.name})")
    on_path = shutil.which(BINARY, path=environ.get("PATH"))
    if on_path and not want:  # a binary on PATH says nothing about the ISA it was built for
        return LlamaServer(on_path, "PATH")
    why = f" (cached build {'; '.join(passed_over)})" if passed_over else ""
    how = f"`edgectl bench --build-llama-cpp --llama-cpp-isa {want}`" if want else "`edgectl bench --build-llama-cpp`"
    return LlamaServer(None, f"no {BINARY} {'' if want else 'on PATH and none '}built for this CPU{held} in "
                             f"{root}{why}: build it with {how} (several minutes)")


def build_llama_cpp(environ: Mapping[str, str], python: str, progress: Progress, jobs: int | None = None,
                    isa: str | None = None, archive: Path | None = None) -> Path:
    """Download llama-cpp-python's source archive, build llama-server from its vendor/llama.cpp:
    for this CPU, or (``isa="avx2"``) for its extensions up to AVX2 + FMA only, kept apart as
    ``<version>-avx2`` for runs held to AVX2. ``archive``: a source archive already at hand, built
    instead of the newest one pip finds (scripts/llama_cpp.sh downloads one pinned by sha256)."""
    if isa is not None and isa not in HELD_ISAS:
        raise EdgectlError(f"--llama-cpp-isa {isa}: use {', '.join(HELD_ISAS)} (or leave it out for this CPU's own)")
    for tool in ("cmake", "c++", "cc"):
        if not shutil.which(tool, path=environ.get("PATH")):
            raise EdgectlError(f"--build-llama-cpp needs {tool} on PATH: install cmake and a C/C++ compiler "
                               "(Debian: apt-get install cmake g++)")
    root = cache_root(environ)
    root.mkdir(parents=True, exist_ok=True)
    jobs = jobs or max(1, len(os.sched_getaffinity(0)))
    flags = held_flags(_own_cpu_flags(), isa)  # what the build targets, recorded beside the binary
    if isa is not None and HELD_ISA_FLAG[isa] not in flags:
        raise EdgectlError(f"--llama-cpp-isa {isa}: this CPU has no {HELD_ISA_FLAG[isa]}")
    options = isa_options(flags)
    with tempfile.TemporaryDirectory(prefix="edgectl-llama-build-", dir=root) as tmp:
        tmpdir = Path(tmp)
        if archive is None:
            archive = _download_archive(python, environ, tmpdir, progress)
        version = archive.name[len("llama_cpp_python-"):-len(".tar.gz")]
        progress(f"extracting vendor/llama.cpp from {archive.name}")
        src = _extract_vendor(archive, tmpdir / "src")
        build = tmpdir / "build"
        progress(f"configuring (cmake, CPU only, static, no web UI download) in {build}")
        _run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
              *options, "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
              "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
              "-DLLAMA_OPENSSL=OFF"], "cmake configure", environ, tmpdir / "cmake.log")
        progress(f"building {' and '.join(TARGETS)} with {jobs} job(s): several minutes on a small box")
        _run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)], "cmake build", environ,
             tmpdir / "build.log")
        name = f"{version}-{isa}" if isa else version  # the cache directory of this build
        dest = root / name / "bin"
        dest.mkdir(parents=True, exist_ok=True)
        for target in TARGETS:
            built = next((p for p in build.rglob(target) if p.is_file() and os.access(p, os.X_OK)), None)
            if built is None:
                raise EdgectlError(f"the build finished but produced no {target} (see {tmpdir}/build.log)",
                                   exit_code=EXIT_FAILED)
            tmp_bin = dest / f".{target}.tmp"
            shutil.copy2(built, tmp_bin)
            os.replace(tmp_bin, dest / target)
        _keep_converter(src, root / name / CONVERT_DIR)
        (root / name / CPU_FLAGS_FILE).write_text(" ".join(sorted(isa_flags(flags))) + "\n")
        (root / name / "SOURCE").write_text(
            f"{PACKAGE}=={version} (PyPI source archive), vendor/llama.cpp; built for the CPU of the machine "
            f"that built it{f', held to {isa}' if isa else ''}: {' '.join(options)}\n")
    progress(f"built {dest / BINARY} and {dest / QUANTIZE}; the source's converter is in {root / name / CONVERT_DIR}")
    return dest / BINARY


def _download_archive(python: str, environ: Mapping[str, str], tmpdir: Path, progress: Progress) -> Path:
    """The newest llama-cpp-python source archive, downloaded with pip into ``tmpdir``."""
    progress(f"downloading the {PACKAGE} source archive with pip")
    # --no-binary for this package only: build dependencies may come as wheels.
    _run([python, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, PACKAGE, "-d", str(tmpdir)],
         "pip download", environ, tmpdir / "pip.log")
    archives = sorted(tmpdir.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise EdgectlError(f"pip downloaded no {PACKAGE} source archive (see {tmpdir}/pip.log)", exit_code=EXIT_FAILED)
    return archives[-1]


def _keep_converter(src: Path, dest: Path) -> None:
    """Copy the source's Hugging Face -> GGUF converter beside the binaries (replacing an older copy whole)."""
    missing = [name for name in _CONVERT_FILES if not (src / name).exists()]
    if missing:
        raise EdgectlError(f"the llama.cpp source has no {', '.join(missing)}: this version of {PACKAGE} "
                           "cannot convert models", exit_code=EXIT_FAILED)
    staging = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in _CONVERT_FILES:
        if (src / name).is_dir():
            shutil.copytree(src / name, staging / name)
        else:
            shutil.copy2(src / name, staging / name)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staging, dest)


@dataclass(frozen=True)
class LlamaTools:
    """What makes a GGUF for the llama.cpp arm: the converter and llama-quantize of one cached build."""

    convert_script: Path
    quantize: Path
    build: Path  # <cache>/llama.cpp/<version>

    @property
    def version(self) -> str:
        return self.build.name


def find_llama_tools(environ: Mapping[str, str], host_flags: Iterable[str] | None = None) -> LlamaTools:
    """The newest cached build with llama-server, llama-quantize and the converter, that this CPU can run.

    Raises a one-line EdgectlError saying how to build them when there is none (builds made before
    edgectl kept llama-quantize and the converter do not count)."""
    root = cache_root(environ)
    flags = isa_flags(host_flags if host_flags is not None else _own_cpu_flags())
    candidates = []
    if root.is_dir():
        for d in root.iterdir():
            server, quantize = d / "bin" / BINARY, d / "bin" / QUANTIZE
            script = d / CONVERT_DIR / CONVERT_SCRIPT
            if not (server.is_file() and quantize.is_file() and os.access(quantize, os.X_OK) and script.is_file()):
                continue
            record = d / CPU_FLAGS_FILE
            if not record.is_file() or isa_flags(record.read_text().split()) - flags:
                continue
            candidates.append((server.stat().st_mtime, LlamaTools(script, quantize, d)))
    if not candidates:
        raise EdgectlError(f"no llama.cpp build in {root} has {QUANTIZE} and {CONVERT_SCRIPT} for this CPU: build "
                           "them with `edgectl bench --build-llama-cpp` (several minutes), then pull again")
    return max(candidates, key=lambda c: c[0])[1]


# ggml's x86 build options (ggml/CMakeLists.txt) by the /proc/cpuinfo flag that allows each.
_GGML_X86 = (("sse4_2", "GGML_SSE42"), ("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"),
             ("f16c", "GGML_F16C"), ("bmi2", "GGML_BMI2"), ("avx_vnni", "GGML_AVX_VNNI"),
             ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
             ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"))


def isa_options(flags: Iterable[str]) -> list[str]:
    """cmake options for this CPU. x86: each extension the CPU has, named, and never AMX — ggml's AMX
    kernels run tile instructions without asking Linux for the AMX tile permission
    (arch_prctl(ARCH_REQ_XCOMP_PERM)), and died of SIGILL in tilezero on an AMX KVM guest, where
    -march=native (GGML_NATIVE) had compiled them in. Elsewhere: GGML_NATIVE."""
    have = set(flags)
    if "avx2" not in have and "avx" not in have:
        return ["-DGGML_NATIVE=ON"]
    return ["-DGGML_NATIVE=OFF", *(f"-D{opt}={'ON' if flag in have else 'OFF'}" for flag, opt in _GGML_X86),
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def _own_cpu_flags() -> list[str]:
    """This CPU's flags from /proc/cpuinfo (x86 ``flags``, Arm ``Features``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return value.split()
    return []


def _extract_vendor(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
        if not members:
            raise EdgectlError(f"{archive.name} has no vendor/llama.cpp: this version of {PACKAGE} cannot be used",
                               exit_code=EXIT_FAILED)
        for m in members:  # Python < 3.11.4 has no extraction filter: refuse escaping paths ourselves
            if m.name.startswith("/") or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
                raise EdgectlError(f"{archive.name}: refusing to extract {m.name!r} (not a plain file "
                                   "inside the archive)", exit_code=EXIT_FAILED)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)
    (top,) = {m.name.split("/", 1)[0] for m in members}
    return dest / top / "vendor" / "llama.cpp"


def _run(argv: list[str], what: str, environ: Mapping[str, str], log: Path) -> None:
    with log.open("wb") as f:
        done = subprocess.run(argv, env=dict(environ), stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise EdgectlError(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}", exit_code=EXIT_FAILED)
