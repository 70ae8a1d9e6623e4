"""An OOM kill at MemoryMax under a real systemd, with the real vLLM engine and the real SmolLM2.

How a deployment's limit ends up too small, the way an administrator does it: the deployment runs
(an eager plan: no compile), then its memory is capped with ``systemctl set-property UNIT
MemoryMax=…`` (systemctl(1); a drop-in that outranks the unit edgectl wrote) at half of what the plan
predicts the service holds steady. On cgroup v1 the kernel cannot shrink the running worker's
limit below what it holds (systemd logs "Failed to set 'memory.limit_in_bytes' … Device or resource
busy"), so the cap takes effect at the next start. The worker then crashes (``kill -9``): systemd
restarts it, and every start is killed by the kernel's OOM killer while the engine loads, until
systemd's start limit (StartLimitBurst=) gives up. The limit is crossed during start-up, not under
requests: vLLM's CPU worker holds its peak while loading (docs/memory.md, the load peak).

What systemd 252 records on cgroup v1 is only "Main process exited, code=killed, status=9/KILL"
and "Failed with result 'signal'" (it reads OOM kills from cgroup v2's memory.events); the kernel's
own log line names the unit's cgroup (mm/oom_kill.c). ``edgectl status`` must count the OOM kills
apart from the crash, say the cause with the limit and the plan's figures, and say what to do.
Figures are printed (``pytest -s``), never asserted against a clock.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from sandbox import host_dirs_restored, systemd_sandbox, unique_name  # noqa: F401  (the fixture)
from test_deploy_systemd import edgectl

from edgectl.errors import EXIT_FAILED
from edgectl.output import mib

pytestmark = [pytest.mark.systemd, pytest.mark.engine]


def _cgroup_limit(sb, unit: str) -> int | None:
    """The memory limit the kernel applies to the unit's cgroup now (None: no cgroup at this moment)."""
    cg = sb.show(unit, "ControlGroup")["ControlGroup"]
    if not cg:
        return None
    path = (f"/sys/fs/cgroup/memory{cg}/memory.limit_in_bytes" if sb.cgroup_version == 1
            else f"/sys/fs/cgroup{cg}/memory.max")
    out = sb.run(["cat", path]).stdout.strip()
    return int(out) if out.isdigit() else None


def test_a_limit_too_small_is_an_oom_kill_that_status_counts_and_explains(systemd_sandbox, pulled_smollm2):  # noqa: F811
    sb = systemd_sandbox
    name, port = unique_name("oom"), 8900 + int(time.time()) % 90
    unit = f"edgectl-{name}.service"
    with host_dirs_restored("/var/lib/edgectl", "/var/cache/edgectl"):
        try:
            r = edgectl(sb, "deploy", "smollm2-135m", "--name", name, "--port", str(port), "--max-model-len", "2048",
                        "--compilation", "eager", "--json")
            assert r.returncode == 0, f"deploy failed:\n{r.stdout}\n{r.stderr}"
            memory = json.loads(r.stdout)["plan"]["memory"]
            predicted, plan_limit = memory["total_bytes"], memory["limit_bytes"]
            cap = predicted // 2 >> 20 << 20

            # -- the administrator caps the memory below what the plan predicts
            before = sb.show(unit, "MainPID", "NRestarts")
            sb.systemctl("set-property", "--runtime", unit, f"MemoryMax={cap}")
            assert int(sb.show(unit, "MemoryMax")["MemoryMax"]) == cap
            if sb.cgroup_version == 1:  # the running worker keeps the old limit
                assert "Device or resource busy" in sb.journal(unit, 50), sb.journal(unit, 50)

            # -- a crash; every start from now on is killed at the cap, until the start limit
            sb.run(["kill", "-9", before["MainPID"]])
            seen_limits: set[int] = set()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                v = sb.show(unit, "ActiveState", "NRestarts")
                if v["ActiveState"] == "failed":
                    break
                limit = _cgroup_limit(sb, unit) if int(v["NRestarts"]) > int(before["NRestarts"]) else None
                if limit is not None:  # a restarted run's cgroup (the killed worker's may linger a moment)
                    seen_limits.add(limit)
                time.sleep(0.2)
            final = sb.show(unit, "ActiveState", "SubState", "NRestarts", "Result")
            assert final["ActiveState"] == "failed", (final, sb.journal(unit, 80))
            restarts = int(final["NRestarts"])
            assert restarts >= 2, final
            assert seen_limits == {cap}, seen_limits  # what the kernel enforced in the restarted runs

            journal = sb.journal(unit, 400)
            kernel = sb.run(["journalctl", "-k", "--no-pager", "-o", "cat", f"--grep=memcg=/.*{unit}"]).stdout
            print(f"\nplan: predicted {mib(predicted)} steady, MemoryMax {mib(plan_limit)}; capped at {mib(cap)} "
                  f"(cgroup v{sb.cgroup_version}); {final}")
            print("\n".join(line for line in journal.splitlines() if unit in line))
            print(kernel)
            kills = re.findall(rf"oom_memcg=[^,]*/{re.escape(unit)},task_memcg=[^,]*/{re.escape(unit)},", kernel)
            assert len(kills) >= restarts - 1, kernel
            if sb.cgroup_version == 1:  # systemd 252 does not see the OOM kill there: a SIGKILL, result 'signal'
                assert "Main process exited, code=killed, status=9/KILL" in journal
                assert "Failed with result 'oom-kill'" not in journal

            # -- status: counted apart from the crash, the cause with the limit, what to do
            s = edgectl(sb, "status", name, "--json")
            assert s.returncode == 0, s.stderr
            dep = json.loads(s.stdout)["deployments"][0]
            assert dep["restarts"] == restarts
            if sb.cgroup_version == 1:  # the cap could not reach the running worker: its restart was the crash
                assert dep["restarts_by_oom"] == restarts - 1, dep
            else:  # on v2 the kernel may kill it at once, at set-property
                assert restarts - 1 <= dep["restarts_by_oom"] <= restarts, dep
            last = dep["last_failure"]
            assert last["kind"] == "oom", last
            kill = last["oom_kills"][-1]
            assert kill["at_unit_limit"] and kill["oom_memcg"].endswith(f"/{unit}"), kill
            assert 0 < kill["anon_rss_bytes"] <= cap, kill
            assert dep["memory_max_bytes"] == cap
            assert f"MemoryMax={plan_limit}" in dep["what_to_do"]

            text = edgectl(sb, "status", name).stdout
            print(text)
            assert f"{restarts} restart(s), {dep['restarts_by_oom']} by the OOM killer" in text, text
            assert "the kernel's OOM killer killed " in text and "at the unit's MemoryMax" in text, text
            assert (f"limit: the unit's MemoryMax {mib(cap)}; the plan predicted {mib(predicted)} steady and set "
                    f"MemoryMax {mib(plan_limit)}") in text, text
            assert "what to do: MemoryMax was lowered outside edgectl" in text, text

            # -- a re-deploy under the lowered limit is killed the same way; deploy says so, and what to do
            # (the failed start is rolled back, so status could not tell it)
            d = edgectl(sb, "deploy", "smollm2-135m", "--name", name, "--port", str(port), "--max-model-len", "2048",
                        "--compilation", "eager")
            print(d.stderr)
            assert d.returncode == EXIT_FAILED, (d.stdout, d.stderr)
            error = next(line for line in d.stderr.splitlines() if line.startswith("error: "))
            assert "did not become ready" in error and "the kernel's OOM killer killed " in error, error
            assert "at the unit's MemoryMax" in error and f"`systemctl revert {unit}` removes it" in error, error
        finally:
            sb.systemctl("revert", unit, check=False)
            edgectl(sb, "undeploy", name, timeout=300)
