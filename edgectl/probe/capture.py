"""``edgectl probe --capture DIR``: copy exactly the files the probe reads into a tree.

The tree can be probed anywhere with ``edgectl probe --root DIR`` and gives the same facts
(except what only a live process can know: the AMX permission, the bandwidth). Users attach it
to bug reports; the test fixtures under tests/fixtures/hosts/ were made with it or by hand in
its layout. Besides the kernel's files the tree gets:

- ``cpuid-flags`` (x86): what the cpuid instruction advertises, and XCR0, as the stand-in the
  probe reads for a captured tree (format: :func:`edgectl.probe.cpuid.read_stand_in`);
- ``edgectl-software.json``: the runtime's Python/torch/vLLM versions;
- ``README.md``: when, from where, and what the tree holds.

Nothing is written unless the whole capture succeeds (it is built in a temporary directory
next to DIR and renamed into place).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.probe.facts import HostFacts
from edgectl.probe.hostfs import HostFS, ReadFailed


@dataclass(frozen=True)
class CaptureResult:
    directory: str
    files: tuple[str, ...]  # host paths copied
    facts: HostFacts

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.probe-capture/1", "directory": self.directory,
                "files": list(self.files), "facts": self.facts.to_dict()}

    def render_text(self) -> str:
        return (f"captured {len(self.files)} files into {self.directory}\n"
                f"probe it anywhere with: edgectl probe --root {self.directory}\n")


def capture(dest: str | Path, *, root: str | Path = "/", environ: Mapping[str, str] | None = None) -> CaptureResult:
    from edgectl.probe import _check_root, _probe, cpuid
    from edgectl.probe.software import SOFTWARE_FILE, runtime_versions

    dest = Path(dest).absolute()
    if dest.exists():
        raise EdgectlError(f"--capture {dest}: already exists; give a directory that does not exist yet")
    if not dest.parent.is_dir():
        raise EdgectlError(f"--capture {dest}: its parent directory does not exist; create it first")
    environ = os.environ if environ is None else environ
    fs = HostFS(_check_root(root), record=True)
    facts = _probe(fs, bandwidth=False, environ=environ)

    extra: dict[str, str] = {}
    if fs.is_live and (facts.cpu.arch or "").startswith("x86") and os.uname().machine == "x86_64":
        try:
            view = cpuid.read_live(request_amx=False)
            xcr0 = f"\nxcr0={view.xcr0:#x}" if view.xcr0 is not None else ""
            extra[cpuid.STAND_IN_FILE] = (
                "# what the cpuid instruction advertised on the captured host (edgectl probe --capture)\n"
                + " ".join(sorted(view.advertised)) + xcr0 + "\n")
        except ReadFailed:
            pass
    elif not fs.is_live and fs.exists(cpuid.STAND_IN_FILE):
        extra[cpuid.STAND_IN_FILE] = fs.read_text(cpuid.STAND_IN_FILE)
    try:
        extra[SOFTWARE_FILE] = json.dumps(runtime_versions(fs, environ), indent=2) + "\n"
    except ReadFailed:
        pass
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    extra["/README.md"] = (
        f"# Captured by `edgectl probe --capture` on {now}\n\n"
        f"Root probed: {fs.root}. Device class then: {facts.device_class}; "
        f"CPU: {facts.cpu.model_name}; kernel {facts.software.kernel}.\n\n"
        "Holds only the files the probe read (paths as on the host; /proc/self is the capturing\n"
        "process), plus `cpuid-flags` (what cpuid advertised, x86 only) and `edgectl-software.json`.\n"
        "Probe it with `edgectl probe --root DIR`.\n")

    files = dict(fs.recorded)
    if "/proc/self/mountinfo" in files:
        # only the cgroup mounts matter to the probe; the rest would tell a bug tracker the
        # user's whole mount table
        files["/proc/self/mountinfo"] = "".join(
            line + "\n" for line in files["/proc/self/mountinfo"].splitlines()
            if " - cgroup " in line or " - cgroup2 " in line)
    files.update(extra)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for host_path, text in sorted(files.items()):
            target = tmp / host_path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        os.rename(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EdgectlError(f"--capture {dest}: could not write the tree ({exc.strerror or exc})",
                           exit_code=EXIT_FAILED) from None
    return CaptureResult(directory=str(dest), files=tuple(sorted(files)), facts=facts)
