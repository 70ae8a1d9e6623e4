"""``edgectl status``: the watchdog interval and the cause of the last restart, in words.

After an automatic restart systemd's properties (Result=, ExecMainCode=, ExecMainStatus=) describe
the new run (seen with systemd 252: Result=success, ExecMainCode=0 right after a watchdog kill), so
the cause is read from the journal, where systemd records each failed run. The journal lines below
are systemd 252's own (``journalctl -u UNIT -o json``, fields trimmed), from a watchdog kill after
SIGSTOP and then a ``kill -9``.
"""

from __future__ import annotations

import json

from plan_helpers import host_facts, make_plan, shape

from edgectl.output import mib
from edgectl.status import DeploymentStatus
from edgectl.systemd import (
    PROCESS_EXIT_MESSAGE,
    RESTART_SCHEDULED_MESSAGE,
    UNIT_FAILED_MESSAGE,
    Failure,
    failure_from_properties,
    failures_from_journal,
    oom_kills_from_journal,
    parse_timespan_s,
    restarts_by_oom,
)

RUN1, RUN2 = "5455a1fb5cbc4d8e94514ef242c29666", "22f811d4fd964653a867793bcae98c0b"
JOURNAL = "\n".join(json.dumps(e) for e in [
    {"MESSAGE": "fp.service: Watchdog timeout (limit 3s)!", "INVOCATION_ID": RUN1,
     "__REALTIME_TIMESTAMP": "1796140000000000"},
    {"MESSAGE": "fp.service: Main process exited, code=killed, status=6/ABRT", "MESSAGE_ID": PROCESS_EXIT_MESSAGE,
     "EXIT_CODE": "killed", "EXIT_STATUS": "6", "INVOCATION_ID": RUN1, "__REALTIME_TIMESTAMP": "1796140000100000"},
    {"MESSAGE": "fp.service: Failed with result 'watchdog'.", "MESSAGE_ID": UNIT_FAILED_MESSAGE,
     "UNIT_RESULT": "watchdog", "INVOCATION_ID": RUN1, "__REALTIME_TIMESTAMP": "1796140000200000"},
    {"MESSAGE": "fp.service: Main process exited, code=killed, status=9/KILL", "MESSAGE_ID": PROCESS_EXIT_MESSAGE,
     "EXIT_CODE": "killed", "EXIT_STATUS": "9", "INVOCATION_ID": RUN2, "__REALTIME_TIMESTAMP": "1796140005000000"},
    {"MESSAGE": "fp.service: Failed with result 'signal'.", "MESSAGE_ID": UNIT_FAILED_MESSAGE,
     "UNIT_RESULT": "signal", "INVOCATION_ID": RUN2, "__REALTIME_TIMESTAMP": "1796140005100000"},
])


def test_failed_runs_are_read_from_the_journal_oldest_first():
    first, second = failures_from_journal(JOURNAL + "\nnot json\n")
    assert (first.kind, first.result, first.signal) == ("watchdog", "watchdog", "ABRT")
    assert first.describe() == "the watchdog: the engine made no progress for WatchdogSec (killed with SIGABRT)"
    assert (second.kind, second.signal) == ("crash", "KILL")
    assert second.describe() == "a crash (SIGKILL)"
    assert second.realtime_us == 1796140005100000


def test_each_cause_in_words():
    assert Failure("oom-kill", "killed", "9").kind == "oom"
    assert "OOM killer" in Failure("oom-kill", "killed", "9").describe()
    assert Failure("exit-code", "exited", "1").describe() == "a crash (exit status 1)"
    assert Failure("core-dump", "dumped", "11").describe() == "a crash (SIGSEGV)"
    assert Failure("timeout").kind == "timeout"
    assert Failure("start-limit-hit").describe() == "systemd result 'start-limit-hit'"


def test_a_failed_unit_that_was_not_restarted_is_described_by_its_properties():
    assert failure_from_properties({"Result": "success", "ExecMainCode": "0", "ExecMainStatus": "0"}) is None
    f = failure_from_properties({"Result": "oom-kill", "ExecMainCode": "2", "ExecMainStatus": "9"})
    assert (f.kind, f.exit_code, f.signal) == ("oom", "killed", "KILL")


def test_systemd_time_spans():
    assert parse_timespan_s("30s") == 30
    assert parse_timespan_s("6min 10s") == 370
    assert parse_timespan_s("500ms") == 0.5
    assert parse_timespan_s("0") is None and parse_timespan_s("") is None and parse_timespan_s("soon") is None


def test_status_shows_the_watchdog_and_the_last_failure():
    last = failures_from_journal(JOURNAL)[0]
    st = DeploymentStatus("chat", "edgectl-chat.service", "active", "running", "serving", 1, 12.0, None, None,
                          None, None, watchdog_s=30.0, last_failure=last)
    text = st.render_text()
    assert "watchdog 30 s; last failure at 2026-12-01 " in text
    assert "the watchdog: the engine made no progress for WatchdogSec (killed with SIGABRT)" in text
    d = st.to_dict()
    assert d["watchdog_s"] == 30.0 and d["last_failure"]["kind"] == "watchdog"
    quiet = DeploymentStatus("chat", "edgectl-chat.service", "active", "running", "", 0, 1.0, None, None, None, None)
    assert "no watchdog; no failure in the journal" in quiet.render_text()
    assert quiet.to_dict()["last_failure"] is None


# systemd 252 on cgroup v1 (the development box), a unit capped below what it holds: a kill -9
# (a crash), then each start killed by the kernel's OOM killer at MemoryMax. systemd records
# only "code=killed, status=9/KILL" and "Failed with result 'signal'" for both kinds; the kernel's
# lines (journalctl -k) name the unit's cgroup. Lines as journald kept them, fields trimmed.
U = "edgectl-oomp.service"
CRASH, OOM1, OOM2 = "6bcfc80174d64384a1df06fbfc134835", "a11a10957d2d42d3ad5d61a7991100ca", "2b9c90221de447a390b389381ecadf35"


def _run(inv: str, t: int, *, last: bool = False) -> list[dict]:
    entries = [
        {"MESSAGE": f"{U}: Main process exited, code=killed, status=9/KILL", "MESSAGE_ID": PROCESS_EXIT_MESSAGE,
         "EXIT_CODE": "killed", "EXIT_STATUS": "9", "INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": str(t)},
        {"MESSAGE": f"{U}: Failed with result 'signal'.", "MESSAGE_ID": UNIT_FAILED_MESSAGE, "UNIT_RESULT": "signal",
         "INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": str(t + 300)},
        {"MESSAGE": f"{U}: Scheduled restart job, restart counter is at 1.", "MESSAGE_ID": RESTART_SCHEDULED_MESSAGE,
         "N_RESTARTS": "1", "INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": str(t + 2_200_000)},
    ]
    if last:  # the start limit: the run's failure is logged once more, and no restart runs
        entries.append({"MESSAGE": f"{U}: Failed with result 'signal'.", "MESSAGE_ID": UNIT_FAILED_MESSAGE,
                        "UNIT_RESULT": "signal", "INVOCATION_ID": inv, "__REALTIME_TIMESTAMP": str(t + 2_200_400)})
    return entries


def _kernel(pid: int, t: int, memcg: str = f"/system.slice/{U}", constraint: str = "CONSTRAINT_MEMCG") -> list[dict]:
    oom_memcg = f"oom_memcg={memcg}," if constraint == "CONSTRAINT_MEMCG" else ""
    return [
        {"MESSAGE": f"Memory cgroup stats for {memcg}:", "__REALTIME_TIMESTAMP": str(t)},
        {"MESSAGE": f"oom-kill:constraint={constraint},nodemask=(null),cpuset=/,mems_allowed=0,{oom_memcg}"
                    f"task_memcg={memcg},task=python,pid={pid},uid=64712", "__REALTIME_TIMESTAMP": str(t + 10)},
        {"MESSAGE": f"Memory cgroup out of memory: Killed process {pid} (python) total-vm:2648980kB, "
                    "anon-rss:409600kB, file-rss:156332kB, shmem-rss:0kB, UID:64712 pgtables:2984kB oom_score_adj:0",
         "__REALTIME_TIMESTAMP": str(t + 20)},
    ]


T0 = 1796186953000000
UNIT_LOG = "\n".join(json.dumps(e) for e in _run(CRASH, T0) + _run(OOM1, T0 + 3_000_000)
                     + _run(OOM2, T0 + 6_000_000, last=True))
# the second kill reached the journal just after systemd's line about its run; another unit's kill is not ours
KERNEL_LOG = "\n".join(json.dumps(e) for e in _kernel(10894, T0 + 2_999_000) + _kernel(11081, T0 + 6_000_500)
                       + _kernel(999, T0 + 5_000_000, memcg="/system.slice/edgectl-other.service"))


def test_oom_kills_are_read_from_the_kernel_log_of_the_units_cgroup():
    kills = oom_kills_from_journal(KERNEL_LOG, U)
    assert [k.pid for k in kills] == [10894, 11081]
    k = kills[0]
    assert (k.task, k.constraint, k.at_unit_limit) == ("python", "CONSTRAINT_MEMCG", True)
    assert (k.anon_rss_bytes, k.file_rss_bytes) == (409600 << 10, 156332 << 10)
    assert oom_kills_from_journal(KERNEL_LOG, "edgectl-oo.service") == []


def test_a_sigkill_with_an_oom_kill_in_its_run_is_an_oom_and_counted_apart_from_the_crash():
    failures = failures_from_journal(UNIT_LOG, oom_kills_from_journal(KERNEL_LOG, U))
    assert [f.kind for f in failures] == ["crash", "oom", "oom"]  # the repeated last failure is one run
    assert [f.restarted for f in failures] == [True, True, True]
    assert [k.pid for k in failures[2].oom_kills] == [11081]
    assert failures[1].describe() == ("out of memory: the kernel's OOM killer killed python (pid 10894, holding "
                                      "400 MiB anonymous + 152 MiB file-backed) at the unit's MemoryMax "
                                      "(kernel log; systemd recorded result 'signal')")
    assert restarts_by_oom(failures, 3) == 2 and restarts_by_oom(failures, 2) == 2
    assert restarts_by_oom(failures, 1) == 1 and restarts_by_oom(failures, 0) == 0
    # without the kernel's log, systemd's lines alone cannot tell: all three are SIGKILLs
    assert [f.kind for f in failures_from_journal(UNIT_LOG)] == ["crash", "crash", "crash"]


def test_status_counts_oom_restarts_and_says_the_limit_the_plan_and_what_to_do():
    plan = make_plan(host_facts("kvm-xeon-avx512-2c"), shape("smollm2-135m"))
    failures = failures_from_journal(UNIT_LOG, oom_kills_from_journal(KERNEL_LOG, U))
    cap = 450 << 20
    st = DeploymentStatus("oomp", U, "failed", "failed", "", 3, None, None, plan, None, None, watchdog_s=30.0,
                          last_failure=failures[-1], restarts_by_oom=restarts_by_oom(failures, 3),
                          memory_max_bytes=cap)
    text = st.render_text()
    assert "failed (failed), 3 restart(s), 2 by the OOM killer" in text
    assert "the kernel's OOM killer killed python (pid 11081" in text
    assert (f"  limit: the unit's MemoryMax 450 MiB; the plan predicted {mib(plan.memory.total_bytes)} steady "
            f"and set MemoryMax {mib(plan.memory.limit_bytes)}") in text
    assert "  what to do: MemoryMax was lowered outside edgectl" in text
    assert f"`systemctl set-property {U} MemoryMax={plan.memory.limit_bytes}`" in text
    d = st.to_dict()
    assert (d["restarts"], d["restarts_by_oom"], d["memory_max_bytes"]) == (3, 2, cap)
    assert d["last_failure"]["kind"] == "oom" and d["last_failure"]["oom_kills"][0]["at_unit_limit"]
    # the plan's own limit was too small: the plan under-predicts
    own = DeploymentStatus("oomp", U, "failed", "failed", "", 3, None, None, plan, None, None,
                           last_failure=failures[-1], memory_max_bytes=plan.memory.limit_bytes)
    assert "what to do: the plan under-predicts this service's memory here" in own.render_text()
    # the machine ran out, not the unit's limit
    machine = failures_from_journal(UNIT_LOG, oom_kills_from_journal(
        "\n".join(json.dumps(e) for e in _kernel(11081, T0 + 6_000_500, constraint="CONSTRAINT_NONE")), U))[-1]
    assert "because the machine ran out of memory (CONSTRAINT_NONE)" in machine.describe()
    st = DeploymentStatus("oomp", U, "failed", "failed", "", 3, None, None, plan, None, None, last_failure=machine)
    assert "what to do: the machine's memory ran out, not this service's MemoryMax" in st.render_text()
    assert st.oom_limits() is None
    # no OOM: no limit line, no advice, no count
    crash = DeploymentStatus("oomp", U, "active", "running", "", 1, 5.0, None, plan, None, None,
                             last_failure=failures[0])
    assert "by the OOM killer" not in crash.render_text() and "what to do" not in crash.render_text()
    assert crash.to_dict()["what_to_do"] is None and crash.to_dict()["restarts_by_oom"] == 0


def test_a_kill_of_an_earlier_deployment_of_the_same_name_is_not_this_runs():
    # the kernel's log still holds an OOM kill of a unit of the same name from an hour before (an
    # earlier deployment, undeployed since); this deployment's first failure was a plain kill -9
    old = "\n".join(json.dumps(e) for e in _kernel(4242, T0 - 3_600_000_000))
    (crash,) = failures_from_journal("\n".join(json.dumps(e) for e in _run(CRASH, T0)), oom_kills_from_journal(old, U))
    assert (crash.kind, crash.signal, crash.oom_kills) == ("crash", "KILL", ())
    # a kill moments before the same run's end is still its own
    now = "\n".join(json.dumps(e) for e in _kernel(4243, T0 - 500_000))
    (oom,) = failures_from_journal("\n".join(json.dumps(e) for e in _run(CRASH, T0)), oom_kills_from_journal(now, U))
    assert oom.kind == "oom" and [k.pid for k in oom.oom_kills] == [4243]
