"""Talking to systemd: ``systemctl`` and ``journalctl``, nothing else.

Every call goes through :class:`Systemd`, so deploy, status and the tests share one way
of reading a unit's state.
"""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgectl.errors import EXIT_BAD_INPUT, EdgectlError

PROPERTIES = (
    "LoadState", "ActiveState", "SubState", "Result", "StatusText", "NRestarts", "MainPID",
    "ControlGroup", "ActiveEnterTimestampMonotonic", "ExecMainStartTimestampMonotonic",
    "MemoryCurrent", "MemoryMax", "MemoryHigh", "FragmentPath", "UnitFileState",
    "WatchdogUSec", "ExecMainCode", "ExecMainStatus",
)

# systemd's journal catalog (src/systemd/sd-messages.h): a unit's run ended with a failure
# ("Failed with result 'watchdog'.", field UNIT_RESULT=), and its main process exited
# ("Main process exited, code=killed, status=6/ABRT", fields EXIT_CODE=, EXIT_STATUS=). Both
# carry the run's INVOCATION_ID. After an automatic restart the unit's own properties
# (Result=, ExecMainCode=, ExecMainStatus=) describe the new run, so the journal is where the
# cause of the last restart is kept.
UNIT_FAILED_MESSAGE = "d9b373ed55a64feb8242e02dbe79a49c"
PROCESS_EXIT_MESSAGE = "98e322203f7a4ed290d09fe03c09fe15"

# ExecMainCode= is a siginfo si_code (CLD_*), EXIT_CODE= its name in the journal.
_CLD = {"1": "exited", "2": "killed", "3": "dumped"}


@dataclass(frozen=True)
class Failure:
    """One run of a unit that ended in failure: systemd's result and how the main process ended."""

    result: str  # systemd's Result=: watchdog, oom-kill, signal, core-dump, exit-code, timeout, ...
    exit_code: str | None = None  # exited, killed, dumped
    exit_status: str | None = None  # the exit status, or the signal's number
    realtime_us: int | None = None  # when (the journal's __REALTIME_TIMESTAMP)

    @property
    def signal(self) -> str | None:
        """The signal that ended the main process, by name (ABRT, KILL, SEGV), if one did."""
        if self.exit_code not in ("killed", "dumped") or not self.exit_status:
            return None
        try:
            return signal.Signals(int(self.exit_status)).name.removeprefix("SIG")
        except ValueError:
            return self.exit_status.removeprefix("SIG")

    @property
    def kind(self) -> str:
        """watchdog, oom, crash, start-timeout or other."""
        if self.result == "watchdog":
            return "watchdog"
        if self.result == "oom-kill":
            return "oom"
        if self.result in ("signal", "core-dump", "exit-code"):
            return "crash"
        if self.result == "timeout":
            return "timeout"
        return "other"

    def describe(self) -> str:
        """The cause in words."""
        how = ""
        if self.signal:
            how = f"SIG{self.signal}"
        elif self.exit_code == "exited" and self.exit_status is not None:
            how = f"exit status {self.exit_status}"
        if self.kind == "watchdog":
            return "the watchdog: the engine made no progress for WatchdogSec" + (f" (killed with {how})" if how else "")
        if self.kind == "oom":
            return "out of memory: the kernel's OOM killer, at the unit's MemoryMax"
        if self.kind == "crash":
            return f"a crash ({how or self.result})"
        if self.kind == "timeout":
            return "a timeout: not ready within TimeoutStartSec, or not stopped within TimeoutStopSec"
        return f"systemd result {self.result!r}" + (f" ({how})" if how else "")

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "result": self.result, "exit_code": self.exit_code,
                "exit_status": self.exit_status, "signal": self.signal, "realtime_us": self.realtime_us,
                "cause": self.describe()}


def failures_from_journal(json_lines: str) -> list[Failure]:
    """The failed runs in ``journalctl -o json`` output (oldest first), each joined with its main
    process's exit by the run's INVOCATION_ID."""
    exits: dict[str, tuple[str | None, str | None]] = {}
    failed: list[tuple[str, str, int | None]] = []
    for line in json_lines.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        invocation = str(entry.get("INVOCATION_ID") or entry.get("_SYSTEMD_INVOCATION_ID") or "")
        if entry.get("MESSAGE_ID") == PROCESS_EXIT_MESSAGE:
            exits[invocation] = (entry.get("EXIT_CODE"), entry.get("EXIT_STATUS"))
        elif entry.get("MESSAGE_ID") == UNIT_FAILED_MESSAGE and entry.get("UNIT_RESULT"):
            when = entry.get("__REALTIME_TIMESTAMP")
            failed.append((invocation, str(entry["UNIT_RESULT"]), int(when) if str(when or "").isdigit() else None))
    return [Failure(result, *exits.get(inv, (None, None)), realtime_us=when) for inv, result, when in failed]


def failure_from_properties(props: dict[str, str]) -> Failure | None:
    """The current run's failure, for a unit that failed and was not restarted (Result= and
    ExecMainCode=/ExecMainStatus= still describe it)."""
    result = props.get("Result", "")
    if not result or result == "success":
        return None
    code = _CLD.get(props.get("ExecMainCode", ""))
    return Failure(result, code, props.get("ExecMainStatus") or None)


@dataclass(frozen=True)
class UnitState:
    name: str
    props: dict[str, str]

    @property
    def active(self) -> str:
        return self.props.get("ActiveState", "")

    @property
    def sub(self) -> str:
        return self.props.get("SubState", "")

    @property
    def status_text(self) -> str:
        return self.props.get("StatusText", "")

    @property
    def main_pid(self) -> int:
        try:
            return int(self.props.get("MainPID", "0") or 0)
        except ValueError:
            return 0

    @property
    def restarts(self) -> int:
        try:
            return int(self.props.get("NRestarts", "0") or 0)
        except ValueError:
            return 0

    @property
    def loaded(self) -> bool:
        return self.props.get("LoadState") == "loaded"

    @property
    def watchdog_s(self) -> float | None:
        """WatchdogSec (systemd shows it as a time span: ``30s``, ``1min 30s``, ``0``), or None."""
        return parse_timespan_s(self.props.get("WatchdogUSec", ""))

    def int_prop(self, key: str) -> int | None:
        value = self.props.get(key, "")
        if not value or value in ("[not set]", "infinity"):
            return None
        try:
            return int(value)
        except ValueError:
            return None


_SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_timespan_s(text: str) -> float | None:
    """``systemctl show``'s time span (``30s``, ``1min 30s``, ``500ms``, ``0``) in seconds; None
    when unset (``0``, ``infinity``, empty) or not understood."""
    import re

    text = text.strip()
    if not text or text in ("0", "infinity"):
        return None
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(us|ms|min|s|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        return None
    return sum(float(n) * _SPAN_UNITS[u] for n, u in parts)


def systemd_running() -> bool:
    """Whether a systemd manager answers here (PID 1, or the namespace we run in)."""
    try:
        r = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return r.stdout.strip() in ("running", "degraded", "starting", "initializing", "maintenance")


class Systemd:
    def __init__(self, unit_dir: Path) -> None:
        self.unit_dir = unit_dir
        # Units under /run are runtime units: enabling them must be --runtime too.
        self.runtime = str(unit_dir).startswith("/run/")

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise EdgectlError(f"{args[0]} not found: edgectl deploy needs systemd (use `edgectl serve` without it)",
                               exit_code=EXIT_BAD_INPUT) from None
        if check and r.returncode != 0:
            raise EdgectlError(f"`{' '.join(args)}` failed: {(r.stderr or r.stdout).strip().splitlines()[-1:] or ''}",
                               exit_code=1)
        return r

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return self._run("systemctl", *args, check=check, timeout=timeout)

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload")

    def show(self, unit: str) -> UnitState:
        r = self.systemctl("show", unit, "-p", ",".join(PROPERTIES), check=False)
        props = {}
        for line in r.stdout.splitlines():
            key, _, value = line.partition("=")
            props[key] = value
        return UnitState(unit, props)

    def restart(self, unit: str) -> None:
        self.systemctl("restart", "--no-block", unit)

    def stop(self, unit: str) -> None:
        self.systemctl("stop", unit, check=False, timeout=300)

    def reset_failed(self, unit: str) -> None:
        self.systemctl("reset-failed", unit, check=False)

    def clean(self, unit: str) -> None:
        """Remove the unit's StateDirectory= and CacheDirectory= (a stopped unit only)."""
        self.systemctl("clean", "--what=all", unit, check=False)

    def enable(self, unit: str) -> None:
        args = ["enable", unit] if not self.runtime else ["enable", "--runtime", unit]
        self.systemctl(*args, check=False)

    def disable(self, unit: str) -> None:
        args = ["disable", unit] if not self.runtime else ["disable", "--runtime", unit]
        self.systemctl(*args, check=False)

    def journal(self, unit: str, lines: int = 30) -> list[str]:
        args = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"]
        r = self._run(*args, check=False, timeout=30)
        return [line for line in r.stdout.splitlines() if line.strip()]

    def failures(self, unit: str, limit: int = 50) -> list[Failure]:
        """The unit's failed runs that the journal still holds, oldest first (empty if it cannot be read)."""
        r = self._run("journalctl", "-u", unit, "-o", "json", "--no-pager", "-n", str(2 * limit),
                      f"MESSAGE_ID={UNIT_FAILED_MESSAGE}", f"MESSAGE_ID={PROCESS_EXIT_MESSAGE}", check=False, timeout=30)
        return failures_from_journal(r.stdout)

    def follow(self, unit: str, lines: int = 50) -> int:
        """``journalctl -f``: blocks until interrupted."""
        return subprocess.call(["journalctl", "-u", unit, "-n", str(lines), "-f", "--no-pager", "-o", "cat"])
