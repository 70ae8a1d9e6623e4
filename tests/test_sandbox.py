"""The systemd sandbox itself (tests/sandbox.py): boots cleanly, leaves the host alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandbox import (
    MASKED_UNITS,
    SystemdSandbox,
    host_dirs_restored,
    unique_name,
    why_no_sandbox,
)

pytestmark = pytest.mark.systemd

TESTS = Path(__file__).resolve().parent


def needs_sandbox():
    reason = why_no_sandbox()
    if reason:
        pytest.skip(reason)


def test_boot_keeps_the_hosts_tmp_and_leaves_nothing_running():
    needs_sandbox()
    with tempfile.TemporaryDirectory(prefix="edgectl-canary-") as tmp:
        canary = Path(tmp) / "canary"
        canary.write_text("still here")
        sandbox = SystemdSandbox()
        with sandbox:
            pid = sandbox.pid
            assert sandbox.failed_units == []
            masked = sandbox.show("systemd-tmpfiles-setup.service", "LoadState")
            assert masked == {"LoadState": "masked"}
            # A unit the sandbox runs sees the host's /tmp file (same file system) ...
            seen = sandbox.run(["cat", str(canary)])
            assert seen.stdout == "still here"
        # ... and after power-off the file is still there, and the namespace is gone.
        assert canary.read_text() == "still here"
        assert not Path(f"/proc/{pid}").exists()
        assert not sandbox.running


def test_boot_services_that_write_to_the_host_are_masked(systemd_sandbox):
    for unit in MASKED_UNITS:
        assert systemd_sandbox.show(unit, "LoadState") == {"LoadState": "masked"}, unit
    # No timer runs host jobs (apt, dpkg backups, man-db) from inside the sandbox.
    timers = systemd_sandbox.systemctl("list-units", "--type=timer", "--state=active", "--no-legend").stdout
    assert timers.strip() == ""


def test_dynamic_users_state_stays_inside(systemd_sandbox):
    name = unique_name("s")
    unit = f"edgectl-{name}.service"
    with host_dirs_restored("/var/lib/edgectl-sandbox-test"):
        _state_stays_inside(systemd_sandbox, name, unit)
    assert not Path("/var/lib/edgectl-sandbox-test").exists()


def _state_stays_inside(systemd_sandbox, name, unit):
    systemd_sandbox.install_unit(unit, "[Service]\nType=oneshot\nDynamicUser=yes\n"
                                       f"StateDirectory=edgectl-sandbox-test/{name}\n"
                                       "ExecStart=/bin/sh -c 'echo hello > \"$STATE_DIRECTORY/f\"; echo wrote'\n")
    try:
        systemd_sandbox.systemctl("start", unit)
        inside = systemd_sandbox.run(["cat", f"/var/lib/private/edgectl-sandbox-test/{name}/f"])
        assert inside.stdout == "hello\n"
        assert not Path(f"/var/lib/private/edgectl-sandbox-test/{name}").exists()  # the host's
        assert "wrote" in systemd_sandbox.journal(unit)
    finally:
        systemd_sandbox.remove_unit(unit)
    assert not Path(f"/var/lib/edgectl-sandbox-test/{name}").exists()  # systemctl clean took the link


def test_failed_command_and_state_are_reported(systemd_sandbox):
    name = f"edgectl-{unique_name('f')}.service"
    systemd_sandbox.install_unit(name, "[Service]\nType=oneshot\nExecStart=/bin/false\n")
    try:
        result = systemd_sandbox.systemctl("start", name, check=False)
        assert result.returncode != 0
        assert systemd_sandbox.show(name, "ActiveState", "Result") == {"ActiveState": "failed",
                                                                        "Result": "exit-code"}
    finally:
        systemd_sandbox.remove_unit(name)
    assert not systemd_sandbox.host_path(f"/run/systemd/system/{name}").exists()


def test_sandbox_dies_with_its_owner():
    # If pytest is killed, unshare dies with it and takes the namespace along.
    needs_sandbox()
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from sandbox import SystemdSandbox\n"
            "s = SystemdSandbox().start(); print(s.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(TESTS)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "systemd"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()


def test_sandbox_boots_where_systemd_is_pid_1(systemd_sandbox):
    # Inside the sandbox systemd is PID 1, as on a normal host: the sandbox must then boot its
    # own systemd in a delegated scope of the outer one, not use the outer one's units.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from sandbox import SystemdSandbox, pid1_is_systemd\n"
            "assert pid1_is_systemd()\n"
            "with SystemdSandbox() as s:\n"
            "    print(s._scope, s.run(['systemctl', 'is-system-running']).stdout.strip(), s.failed_units)\n")
    result = systemd_sandbox.run([sys.executable, "-c", code, str(TESTS)], timeout=120)
    assert result.returncode == 0, result.stderr
    scope, state, failed = result.stdout.split(" ", 2)
    assert scope.startswith("edgectl-sandbox-") and state == "running" and failed.strip() == "[]"
    # the scope is gone with the inner sandbox
    assert systemd_sandbox.show(scope, "ActiveState")["ActiveState"] == "inactive"


def test_not_root_skips_with_the_reason():
    if os.geteuid() != 0:
        assert "needs root" in why_no_sandbox()
        return
    code = "import sys; sys.path.insert(0, sys.argv[1]); from sandbox import why_no_sandbox; print(why_no_sandbox())"
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                             code, str(TESTS)], capture_output=True, text=True, cwd="/")
    assert "needs root" in result.stdout, result.stderr
