"""Talking to systemd: ``systemctl`` and ``journalctl``, nothing else.

Every call goes through :class:`Systemd`, so deploy, status and the tests share one way
of reading a unit's state.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from dataclasses import dataclass, field, replace
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
# "Scheduled restart job, restart counter is at N.": field N_RESTARTS=, and the INVOCATION_ID of
# the run that ended (sd-messages.h SD_MESSAGE_UNIT_RESTART_SCHEDULED). It says which failed runs
# systemd restarted, and so which of them the unit's NRestarts= counts.
RESTART_SCHEDULED_MESSAGE = "5eb03494b6584870a536b337290809b3"

# The kernel's OOM killer (mm/oom_kill.c, dump_oom_victim and __oom_kill_process) writes, for each
# victim, to the kernel log (which journald keeps with _TRANSPORT=kernel):
#   oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
#     oom_memcg=/system.slice/edgectl-x.service,task_memcg=/system.slice/edgectl-x.service,task=python,pid=28154,uid=64712
#   Memory cgroup out of memory: Killed process 28154 (python) total-vm:2648980kB, anon-rss:947628kB, ...
# oom_memcg is the cgroup whose limit was hit (only for CONSTRAINT_MEMCG), task_memcg the victim's.
# systemd 252 turns a kill into Result=oom-kill only on the unified hierarchy (cgroup v2: it reads
# memory.events); on cgroup v1 the journal says just "Main process exited, code=killed,
# status=9/KILL" and "Failed with result 'signal'" (seen, docs/facts.md "OOM at MemoryMax"), so
# the kernel's own lines are the evidence there.
_OOM_KILL = re.compile(r"oom-kill:constraint=(?P<constraint>[A-Z_]+),.*?(?:oom_memcg=(?P<oom_memcg>[^,]*),)?"
                       r"task_memcg=(?P<task_memcg>[^,]*),task=(?P<task>.*?),pid=(?P<pid>\d+)")
_KILLED = re.compile(r"Killed process (?P<pid>\d+) \((?P<comm>.*?)\) total-vm:\d+kB, anon-rss:(?P<anon>\d+)kB, "
                     r"file-rss:(?P<file>\d+)kB")
KERNEL_OOM_GREP = "oom-kill:constraint=|Killed process [0-9]"
# A kill is reported by the kernel moments before systemd logs the end of the run it ended; the two
# lines reach the journal from different sources, in either order. A kill up to this long after a
# run's failure still belongs to that run: the next run starts RestartSec= (2 s, units.RESTART_S)
# later at the earliest, and has a Python to start before it holds any memory.
_KILL_SLACK_US = 1_000_000
# How far before the oldest failed run the journal holds to read the kernel's log for kills (the
# messages read do not say when that run started; a kill that ends a run comes moments before its
# end, unless it took a child whose loss the main process noticed later).
_KILL_LOOKBACK_US = 600_000_000

# ExecMainCode= is a siginfo si_code (CLD_*), EXIT_CODE= its name in the journal.
_CLD = {"1": "exited", "2": "killed", "3": "dumped"}


@dataclass(frozen=True)
class Failure:
    """One run of a unit that ended in failure: systemd's result and how the main process ended."""

    result: str  # systemd's Result=: watchdog, oom-kill, signal, core-dump, exit-code, timeout, ...
    exit_code: str | None = None  # exited, killed, dumped
    exit_status: str | None = None  # the exit status, or the signal's number
    realtime_us: int | None = None  # when (the journal's __REALTIME_TIMESTAMP)
    invocation: str = ""  # the run's INVOCATION_ID
    restarted: bool = False  # systemd scheduled a restart after it (counted in NRestarts=)
    oom_kills: tuple[OomKill, ...] = field(default=())  # the kernel's OOM kills in the unit's cgroup in this run

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
        if self.result == "oom-kill" or self.oom_kills:
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
            return self._describe_oom()
        if self.kind == "crash":
            return f"a crash ({how or self.result})"
        if self.kind == "timeout":
            return "a timeout: not ready within TimeoutStartSec, or not stopped within TimeoutStopSec"
        return f"systemd result {self.result!r}" + (f" ({how})" if how else "")

    def _describe_oom(self) -> str:
        if not self.oom_kills:  # systemd saw it itself (cgroup v2: Result=oom-kill)
            return "out of memory: the kernel's OOM killer, at the unit's MemoryMax"
        k = self.oom_kills[-1]
        victims = ", ".join(v.victim() for v in self.oom_kills)
        if k.at_unit_limit:
            where = "at the unit's MemoryMax"
        elif k.constraint == "CONSTRAINT_MEMCG":
            where = f"at the limit of {k.oom_memcg}, not the unit's own MemoryMax"
        else:
            where = f"because the machine ran out of memory ({k.constraint}), not at the unit's MemoryMax"
        noted = f"; systemd recorded result {self.result!r}" if self.result != "oom-kill" else ""
        return f"out of memory: the kernel's OOM killer killed {victims} {where} (kernel log{noted})"

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "result": self.result, "exit_code": self.exit_code,
                "exit_status": self.exit_status, "signal": self.signal, "realtime_us": self.realtime_us,
                "restarted": self.restarted, "oom_kills": [k.to_dict() for k in self.oom_kills],
                "cause": self.describe()}


@dataclass(frozen=True)
class OomKill:
    """One victim of the kernel's OOM killer, from the kernel log."""

    pid: int  # as the kernel's (initial) PID namespace numbers it
    task: str
    constraint: str  # CONSTRAINT_MEMCG: a cgroup's limit was hit; CONSTRAINT_NONE: the whole machine
    oom_memcg: str | None  # the cgroup whose limit was hit
    task_memcg: str  # the victim's cgroup
    realtime_us: int | None = None
    anon_rss_bytes: int | None = None  # what the victim held when killed
    file_rss_bytes: int | None = None

    @property
    def at_unit_limit(self) -> bool:
        """The victim's own cgroup hit its limit (the unit's MemoryMax), not a parent's (a slice's) or the
        machine's. (edgectl's units put every process in the unit's own cgroup: no Delegate=.)"""
        return self.constraint == "CONSTRAINT_MEMCG" and self.oom_memcg == self.task_memcg

    def victim(self) -> str:
        held = ""
        if self.anon_rss_bytes is not None and self.file_rss_bytes is not None:
            held = f", holding {self.anon_rss_bytes >> 20} MiB anonymous + {self.file_rss_bytes >> 20} MiB file-backed"
        return f"{self.task} (pid {self.pid}{held})"

    def to_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "task": self.task, "constraint": self.constraint, "oom_memcg": self.oom_memcg,
                "task_memcg": self.task_memcg, "at_unit_limit": self.at_unit_limit, "realtime_us": self.realtime_us,
                "anon_rss_bytes": self.anon_rss_bytes, "file_rss_bytes": self.file_rss_bytes}


def _in_unit_cgroup(path: str, unit: str) -> bool:
    """Whether cgroup ``path`` is the unit's (``/system.slice/UNIT``, or a cgroup below it)."""
    return unit in path.split("/")


def oom_kills_from_journal(json_lines: str, unit: str) -> list[OomKill]:
    """The kernel's OOM kills of processes in ``unit``'s cgroup, in ``journalctl -k -o json`` output."""
    kills: list[OomKill] = []
    rss: dict[int, tuple[int, int]] = {}
    for line in json_lines.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("MESSAGE"), str):
            continue
        message = entry["MESSAGE"]
        when = entry.get("__REALTIME_TIMESTAMP")
        m = _OOM_KILL.search(message)
        if m and _in_unit_cgroup(m["task_memcg"], unit):
            kills.append(OomKill(int(m["pid"]), m["task"], m["constraint"], m["oom_memcg"], m["task_memcg"],
                                 int(when) if str(when or "").isdigit() else None))
            continue
        k = _KILLED.search(message)
        if k:
            rss[int(k["pid"])] = (int(k["anon"]) << 10, int(k["file"]) << 10)
    return [replace(k, anon_rss_bytes=rss[k.pid][0], file_rss_bytes=rss[k.pid][1]) if k.pid in rss else k
            for k in kills]


def failures_from_journal(json_lines: str, oom_kills: list[OomKill] | None = None) -> list[Failure]:
    """The failed runs in ``journalctl -o json`` output (oldest first), each joined with its main
    process's exit and its restart by the run's INVOCATION_ID, and with the kernel's OOM kills
    (``oom_kills_from_journal``) that happened during it."""
    exits: dict[str, tuple[str | None, str | None]] = {}
    restarted: set[str] = set()
    failed: dict[str, tuple[str, int | None]] = {}  # one per run: systemd repeats it when the start limit hits
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
        elif entry.get("MESSAGE_ID") == RESTART_SCHEDULED_MESSAGE:
            restarted.add(invocation)
        elif entry.get("MESSAGE_ID") == UNIT_FAILED_MESSAGE and entry.get("UNIT_RESULT"):
            when = entry.get("__REALTIME_TIMESTAMP")
            if invocation not in failed or not invocation:
                failed[invocation or f"#{len(failed)}"] = (str(entry["UNIT_RESULT"]),
                                                           int(when) if str(when or "").isdigit() else None)
    failures = [Failure(result, *exits.get(inv, (None, None)), realtime_us=when, invocation=inv,
                        restarted=inv in restarted) for inv, (result, when) in failed.items()]
    return _with_oom_kills(failures, oom_kills or [])


# The oldest failed run the journal shows has no earlier run to bound it: a kill counts for it only
# if it came at most this long before the run's end (the process that was killed, or whose child
# was, ends within moments). The kernel's log keeps kills of earlier deployments of the same name
# (an undeploy and deploy again; a test sandbox's journal that imported the host's kernel buffer):
# those are not this run's.
_FIRST_RUN_LOOKBACK_US = 60_000_000


def _with_oom_kills(failures: list[Failure], kills: list[OomKill]) -> list[Failure]:
    """Each kill goes to the first run that ended after it (allowing for the two lines' order), the
    oldest run only for a kill shortly before its end."""
    out, previous_end = [], None
    for f in failures:
        if f.realtime_us is None:
            out.append(f)
            continue
        end = f.realtime_us + _KILL_SLACK_US
        start = previous_end if previous_end is not None else f.realtime_us - _FIRST_RUN_LOOKBACK_US
        mine = tuple(k for k in kills if k.realtime_us is not None and start < k.realtime_us <= end)
        out.append(replace(f, oom_kills=mine) if mine else f)
        previous_end = end
    return out


def restarts_by_oom(failures: list[Failure], restarts: int) -> int:
    """Of the unit's last ``restarts`` automatic restarts (NRestarts=), how many followed an OOM kill."""
    if restarts <= 0:
        return 0
    return sum(1 for f in [f for f in failures if f.restarted][-restarts:] if f.kind == "oom")


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
        """The unit's failed runs that the journal still holds, oldest first (empty if it cannot be read),
        with the kernel's OOM kills in its cgroup."""
        r = self._run("journalctl", "-u", unit, "-o", "json", "--no-pager", "-n", str(4 * limit),
                      f"MESSAGE_ID={UNIT_FAILED_MESSAGE}", f"MESSAGE_ID={PROCESS_EXIT_MESSAGE}",
                      f"MESSAGE_ID={RESTART_SCHEDULED_MESSAGE}", check=False, timeout=30)
        failures = failures_from_journal(r.stdout)
        times = [f.realtime_us for f in failures if f.realtime_us]
        if not times:
            return failures
        return failures_from_journal(r.stdout, self.oom_kills(unit, since_us=min(times) - _KILL_LOOKBACK_US))

    def oom_kills(self, unit: str, since_us: int) -> list[OomKill]:
        """The kernel's OOM kills in ``unit``'s cgroup since ``since_us`` (empty if the kernel log is not
        in the journal, or cannot be read)."""
        args = ["journalctl", "_TRANSPORT=kernel", "-o", "json", "--output-fields=MESSAGE", "--no-pager",
                f"--since=@{since_us // 1_000_000}"]
        r = self._run(*args, f"--grep={KERNEL_OOM_GREP}", check=False, timeout=30)
        if r.returncode != 0 and r.stderr.strip() and "No entries" not in r.stderr:
            r = self._run(*args, check=False, timeout=60)  # a journalctl without pattern matching (PCRE2)
        return oom_kills_from_journal(r.stdout, unit)

    def follow(self, unit: str, lines: int = 50) -> int:
        """``journalctl -f``: blocks until interrupted."""
        return subprocess.call(["journalctl", "-u", unit, "-n", str(lines), "-f", "--no-pager", "-o", "cat"])
