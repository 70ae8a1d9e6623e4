"""``edgectl status``: the watchdog interval and the cause of the last restart, in words.

After an automatic restart systemd's properties (Result=, ExecMainCode=, ExecMainStatus=) describe
the new run (seen with systemd 252: Result=success, ExecMainCode=0 right after a watchdog kill), so
the cause is read from the journal, where systemd records each failed run. The journal lines below
are systemd 252's own (``journalctl -u UNIT -o json``, fields trimmed), from a watchdog kill after
SIGSTOP and then a ``kill -9``.
"""

from __future__ import annotations

import json

from edgectl.status import DeploymentStatus
from edgectl.systemd import (PROCESS_EXIT_MESSAGE, UNIT_FAILED_MESSAGE, Failure, failure_from_properties,
                             failures_from_journal, parse_timespan_s)

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
