"""llama.cpp's ``llama-server``, the comparison arm: found on PATH or built once from source.

The source is the one ``llama-cpp-python``'s source archive carries (``vendor/llama.cpp``), fetched
from PyPI with pip, the only registry the target boxes reach. The build is CPU-only, static,
with the web UI neither downloaded nor built (``LLAMA_USE_PREBUILT_UI=OFF`` — by default the
build fetches it from a Hugging Face bucket), and lands in a cache directory next to the model
cache: ``<EDGECTL_MODEL_CACHE>/../llama.cpp/<version>/bin/llama-server``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from edgectl.errors import EXIT_FAILED, EdgectlError

PACKAGE = "llama-cpp-python"
BINARY = "llama-server"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LlamaServer:
    path: str | None  # None: not available
    origin: str  # "PATH", "cache", "--llama-server" or why it is missing


def cache_root(environ: Mapping[str, str]) -> Path:
    from edgectl.models.cache import cache_dir

    return cache_dir(environ).parent / "llama.cpp"


def find_llama_server(environ: Mapping[str, str], explicit: str | None = None) -> LlamaServer:
    """``--llama-server`` if given, else the newest cached build, else ``llama-server`` on PATH."""
    if explicit:
        p = Path(explicit).expanduser()
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise EdgectlError(f"--llama-server {explicit}: not an executable file")
        return LlamaServer(str(p.resolve()), "--llama-server")
    root = cache_root(environ)
    if root.is_dir():
        built = sorted((d / "bin" / BINARY for d in root.iterdir() if (d / "bin" / BINARY).is_file()),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        if built:
            return LlamaServer(str(built[0]), f"cache ({built[0].parent.parent.name})")
    on_path = shutil.which(BINARY, path=environ.get("PATH"))
    if on_path:
        return LlamaServer(on_path, "PATH")
    return LlamaServer(None, f"no {BINARY} on PATH and none built in {root}: build it once with "
                             "`edgectl bench --build-llama-cpp` (several minutes)")


def build_llama_cpp(environ: Mapping[str, str], python: str, progress: Progress, jobs: int | None = None) -> Path:
    """Download llama-cpp-python's source archive, build llama-server from its vendor/llama.cpp."""
    for tool in ("cmake", "c++", "cc"):
        if not shutil.which(tool, path=environ.get("PATH")):
            raise EdgectlError(f"--build-llama-cpp needs {tool} on PATH: install cmake and a C/C++ compiler "
                               "(Debian: apt-get install cmake g++)")
    root = cache_root(environ)
    root.mkdir(parents=True, exist_ok=True)
    jobs = jobs or max(1, len(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="edgectl-llama-build-", dir=root) as tmp:
        tmpdir = Path(tmp)
        progress(f"downloading the {PACKAGE} source archive with pip")
        # --no-binary for this package only: build dependencies may come as wheels.
        _run([python, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, PACKAGE, "-d", str(tmpdir)],
             "pip download", environ, tmpdir / "pip.log")
        archives = sorted(tmpdir.glob("llama_cpp_python-*.tar.gz"))
        if not archives:
            raise EdgectlError(f"pip downloaded no {PACKAGE} source archive (see {tmpdir}/pip.log)", exit_code=EXIT_FAILED)
        archive = archives[-1]
        version = archive.name[len("llama_cpp_python-"):-len(".tar.gz")]
        progress(f"extracting vendor/llama.cpp from {archive.name}")
        src = _extract_vendor(archive, tmpdir / "src")
        build = tmpdir / "build"
        progress(f"configuring (cmake, CPU only, static, no web UI download) in {build}")
        _run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
              "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
              "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
              "-DLLAMA_OPENSSL=OFF"], "cmake configure", environ, tmpdir / "cmake.log")
        progress(f"building {BINARY} with {jobs} job(s): several minutes on a small box")
        _run(["cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs)], "cmake build", environ,
             tmpdir / "build.log")
        built = next((p for p in build.rglob(BINARY) if p.is_file() and os.access(p, os.X_OK)), None)
        if built is None:
            raise EdgectlError(f"the build finished but produced no {BINARY} (see {tmpdir}/build.log)",
                               exit_code=EXIT_FAILED)
        dest = root / version / "bin"
        dest.mkdir(parents=True, exist_ok=True)
        tmp_bin = dest / f".{BINARY}.tmp"
        shutil.copy2(built, tmp_bin)
        os.replace(tmp_bin, dest / BINARY)
        (root / version / "SOURCE").write_text(
            f"{PACKAGE}=={version} (PyPI source archive), vendor/llama.cpp; GGML_NATIVE=ON: built for the CPU "
            "of the machine that built it\n")
    progress(f"built {dest / BINARY}")
    return dest / BINARY


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
