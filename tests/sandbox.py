"""A real systemd for tests, booted in a private PID + mount namespace.

The machines edgectl is developed and tested on are VMs whose PID 1 is not systemd. systemd
boots fine as PID 1 of a new PID + mount namespace, but the namespace shares the host's file
systems: a plain boot runs ``systemd-tmpfiles-setup`` and wipes the host's ``/tmp`` (seen
twice). So the boot script below gives the namespace its own ``/run`` and masks every boot
service and timer that writes shared state, before systemd starts (the recipe is described in
the project's shared facts, ``systemd-sandbox.md``). Only this module boots systemd.

Use::

    with SystemdSandbox() as sandbox:          # or the session fixture ``systemd_sandbox``
        sandbox.install_unit("edgectl-x.service", text)
        sandbox.systemctl("start", "edgectl-x.service")
        print(sandbox.show("edgectl-x.service", "ActiveState", "StatusText"))

Inside: unit files go to the sandbox's private ``/run/systemd/system``; the state, cache and
log directories of dynamic users (``/var/{lib,cache,log}/private``) are private tmpfs too, so
nothing a test service writes there reaches the host. Everything else (``/etc``, ``/opt``,
``/var/lib/edgectl/models``, ``/tmp``) is the host's.

On a host where systemd already is PID 1 the same boot runs inside a transient scope with a
delegated cgroup (``systemd-run --scope -p Delegate=yes``), as systemd-nspawn does, so tests
still get their own manager and never touch the host's units.

tests/conftest.py imports the ``systemd_sandbox`` fixture; however many modules import it
too, one sandbox serves the whole session.
PYTEST_DONT_REWRITE (no asserts here; this lets the module be imported before it is a plugin)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import pytest

SYSTEMD = "/lib/systemd/systemd"

# Boot services that write to the file systems the namespace shares with the host, or that
# cannot work in it. Masked in /run/systemd/system.control, which outranks /etc/systemd/system,
# so a host's own copy of one of these units cannot undo the mask.
MASKED_UNITS = (
    "systemd-tmpfiles-setup.service",  # "D /tmp": empties the host's /tmp
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-sysctl.service",
    "systemd-sysusers.service",  # writes /etc/passwd, /etc/group
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "systemd-remount-fs.service",
    "systemd-update-utmp.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "ldconfig.service",
    "systemd-hwdb-update.service",
    "systemd-journal-catalog-update.service",
    "systemd-random-seed.service",
    "systemd-journal-flush.service",  # would move the journal to the host's /var/log/journal
    # Timers (apt-daily, dpkg-db-backup, man-db, e2scrub ...) would run host jobs and write
    # their stamps to /var/lib/systemd/timers: none is started without timers.target.
    "timers.target",
)

# Where systemd keeps dynamic users' StateDirectory=/CacheDirectory=/LogsDirectory=.
PRIVATE_DIRS = ("/var/lib/private", "/var/cache/private", "/var/log/private")

# $1..: directories to cover with a private tmpfs (mode 0700, as systemd wants them).
_BOOT_SCRIPT = r"""
set -e
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/systemd/system /run/systemd/system.control
for unit in {masked}; do
  ln -sf /dev/null "/run/systemd/system.control/$unit"
done
for dir in "$@"; do
  mkdir -p -m 0700 "$dir"
  mount -t tmpfs -o mode=0700 tmpfs "$dir"
done
exec env container=other {systemd} --system --unit=basic.target
"""


class SandboxError(RuntimeError):
    """The sandbox could not boot, or a command inside it failed."""


def pid1_is_systemd() -> bool:
    return os.path.isdir("/run/systemd/system") and Path("/proc/1/comm").read_text().strip() == "systemd"


def why_no_sandbox() -> str | None:
    """Why a systemd sandbox cannot be booted here, or None if it can."""
    if os.geteuid() != 0:
        return "the systemd sandbox needs root (it boots systemd in a private PID + mount namespace)"
    for tool in ("unshare", "nsenter", "systemctl", "journalctl"):
        if shutil.which(tool) is None:
            return f"the systemd sandbox needs {tool} (Debian packages util-linux and systemd)"
    if not os.access(SYSTEMD, os.X_OK):
        return f"the systemd sandbox needs systemd ({SYSTEMD} is missing: install the systemd package)"
    if pid1_is_systemd() and shutil.which("systemd-run") is None:
        return "systemd is PID 1 here but systemd-run is missing: cannot give the sandbox its own cgroup"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--", "true"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"cannot create PID and mount namespaces here: {probe.stderr.strip()}"
    return None


def _die_with_parent() -> None:
    # If pytest dies, unshare dies (SIGKILL), and unshare --kill-child takes the namespace's
    # PID 1 and with it every process of the sandbox.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class SystemdSandbox:
    """systemd 252 as PID 1 of a private PID + mount namespace; see the module docstring."""

    def __init__(self, *, boot_timeout_s: float = 90, private_dirs: Sequence[str] = PRIVATE_DIRS):
        self.boot_timeout_s = boot_timeout_s
        self.private_dirs = tuple(private_dirs)
        self.pid: int | None = None  # the sandbox's systemd, as seen from the host
        self.failed_units: list[str] = []  # failed after boot
        # 1: legacy or hybrid hierarchy. systemd then ignores the v2-only settings: MemoryHigh=,
        # MemorySwapMax=, AllowedCPUs=, IPAddressDeny= (BPF). MemoryMax= still applies (v1 limit).
        self.cgroup_version: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None  # unlinked at once: nothing is left behind
        self._scope: str | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> SystemdSandbox:
        if self._proc is not None:
            raise SandboxError("the sandbox is already started")
        reason = why_no_sandbox()
        if reason:
            raise SandboxError(reason)
        self._log = tempfile.TemporaryFile(prefix="edgectl-sandbox-")
        script = _BOOT_SCRIPT.format(masked=" ".join(MASKED_UNITS), systemd=SYSTEMD)
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--mount", "--propagation", "private",
               "--kill-child", "--", "sh", "-c", script, "sh", *self.private_dirs]
        if pid1_is_systemd():
            # Give the nested systemd a cgroup subtree of its own, as systemd-nspawn does.
            self._scope = f"edgectl-sandbox-{uuid.uuid4().hex[:8]}.scope"
            cmd = ["systemd-run", "--quiet", "--scope", f"--unit={self._scope}", "-p", "Delegate=yes",
                   "--", *cmd]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                      preexec_fn=_die_with_parent)
        try:
            self.pid = self._find_init()
            self._wait_running()
        except BaseException:
            self.poweroff()
            raise
        return self

    def _find_init(self) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise SandboxError(f"the sandbox exited at boot ({self._proc.returncode}): {self.boot_log()}")
            # unshare --fork: its one child is the namespace's PID 1 (sh, then exec'd systemd).
            for pid in _descendants(self._proc.pid):
                if _comm(pid) == "systemd":
                    return pid
            time.sleep(0.05)
        raise SandboxError(f"systemd did not start in the sandbox: {self.boot_log()}")

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.boot_timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.run(["systemctl", "is-system-running"]).stdout.strip()
            if state in ("running", "degraded"):
                break
            if self._proc is not None and self._proc.poll() is not None:
                raise SandboxError(f"the sandbox exited at boot: {self.boot_log()}")
            time.sleep(0.1)
        else:
            raise SandboxError(f"the sandbox's systemd is {state!r} after {self.boot_timeout_s} s; jobs: "
                               + self.run(["systemctl", "list-jobs", "--no-legend"]).stdout)
        failed = self.run(["systemctl", "list-units", "--failed", "--plain", "--no-legend"]).stdout
        self.failed_units = [line.split()[0] for line in failed.splitlines() if line.strip()]
        fs = self.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"]).stdout.strip()
        self.cgroup_version = 2 if fs == "cgroup2fs" else 1

    def boot_log(self) -> str:
        if self._log is None:
            return "(no boot log)"
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def poweroff(self, timeout_s: float = 60) -> None:
        """Stop every unit and end the namespace; safe to call twice and after a failed start."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None and self.pid is not None:
            subprocess.run(["nsenter", "-t", str(self.pid), "-p", "-m", "--", "systemctl", "poweroff"],
                           capture_output=True, timeout=30, check=False)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            # The namespace's PID 1 takes every process of the sandbox with it.
            if self.pid is not None:
                _kill(self.pid)
            _kill(proc.pid)
            proc.wait(timeout=30)
        self._proc = None
        self.pid = None
        if self._scope and pid1_is_systemd():
            subprocess.run(["systemctl", "stop", self._scope], capture_output=True, check=False)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SystemdSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.poweroff()

    # --- working inside -----------------------------------------------------------------------

    def run(self, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """``cmd`` in the sandbox's PID and mount namespaces (it talks to the sandbox's systemd)."""
        if self.pid is None:
            raise SandboxError("the sandbox is not running")
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("check", False)
        kw.setdefault("timeout", 120)
        return subprocess.run(["nsenter", "-t", str(self.pid), "-p", "-m", "--", *cmd], **kw)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """``systemctl ARGS`` in the sandbox; SandboxError if it fails and ``check``."""
        result = self.run(["systemctl", *args], timeout=timeout)
        if check and result.returncode != 0:
            raise SandboxError(f"systemctl {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def journal(self, unit: str, lines: int = 50) -> str:
        return self.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit, "-n", str(lines)]).stdout

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show`` properties of ``unit`` as a dict."""
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_for(self, unit: str, done, *, timeout_s: float, props: Sequence[str] = ("ActiveState", "SubState"),
                 what: str = "") -> dict[str, str]:
        """Poll ``show(unit, *props)`` until ``done(values)`` holds; SandboxError with the journal if not."""
        deadline = time.monotonic() + timeout_s
        values: dict[str, str] = {}
        while time.monotonic() < deadline:
            values = self.show(unit, *props)
            if done(values):
                return values
            time.sleep(0.2)
        raise SandboxError(f"{unit}: {what or 'condition'} not reached in {timeout_s} s; last {values}; "
                           f"journal:\n{self.journal(unit, 40)}")

    def host_path(self, path: str) -> Path:
        """Where the host sees ``path`` of the sandbox (e.g. its private /run)."""
        if self.pid is None:
            raise SandboxError("the sandbox is not running")
        return Path(f"/proc/{self.pid}/root") / path.lstrip("/")

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` to ``path`` as the sandbox sees it, creating parents (mode 0755)."""
        target = self.host_path(path)
        for parent in reversed(target.relative_to(self.host_path("/")).parents):
            directory = self.host_path("/" + str(parent))
            if not directory.exists():
                directory.mkdir(mode=0o755)
        target.write_text(text)
        os.chmod(target, mode)

    def install_unit(self, name: str, text: str) -> None:
        """Put unit file ``name`` in the sandbox's /run/systemd/system and reload."""
        self.write_file(f"/run/systemd/system/{name}", text)
        self.systemctl("daemon-reload")

    def remove_unit(self, name: str) -> None:
        """Stop ``name``, remove its state and cache directories and its file, reload."""
        self.systemctl("stop", name, check=False)
        self.systemctl("clean", "--what=all", name, check=False)
        self.systemctl("reset-failed", name, check=False)
        path = self.host_path(f"/run/systemd/system/{name}")
        if path.exists():
            path.unlink()
        self.systemctl("daemon-reload")


def _descendants(pid: int) -> Iterator[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return
    for child in map(int, children):
        yield child
        yield from _descendants(child)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def host_dirs_restored(*paths: str) -> Iterator[None]:
    """Afterwards, remove those of ``paths`` that did not exist before and are empty.

    systemd creates the parents of a dynamic user's directory links on the host (e.g.
    /var/lib/edgectl for StateDirectory=edgectl/NAME); ``systemctl clean`` removes only the links.
    """
    absent = [p for p in paths if not os.path.lexists(p)]
    try:
        yield
    finally:
        for path in absent:
            try:
                os.rmdir(path)
            except OSError:
                pass  # not created, or something was put there meanwhile: leave it


def unique_name(prefix: str = "t") -> str:
    """A deployment name no other test run uses (units of parallel sandboxes share cgroup names)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


# --- pytest fixtures (tests/conftest.py imports them) ---------------------------------------

_session: dict[str, object] = {"sandbox": None, "users": 0}


@pytest.fixture(scope="session")
def systemd_sandbox() -> Iterator[SystemdSandbox]:
    """One systemd sandbox per test session (booting takes a second; services take longer).

    Skips with the reason when this machine cannot boot one (not root, tools missing). Even if
    this fixture is imported into several modules, they share one sandbox.
    """
    reason = why_no_sandbox()
    if reason:
        pytest.skip(reason)
    if _session["sandbox"] is None:
        _session["sandbox"] = SystemdSandbox().start()
    _session["users"] = int(_session["users"]) + 1  # type: ignore[call-overload]
    try:
        yield _session["sandbox"]  # type: ignore[misc]
    finally:
        _session["users"] = int(_session["users"]) - 1  # type: ignore[call-overload]
        if _session["users"] == 0:
            sandbox = _session["sandbox"]
            _session["sandbox"] = None
            sandbox.poweroff()  # type: ignore[union-attr]
