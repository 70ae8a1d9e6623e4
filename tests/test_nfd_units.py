"""edgectl-nfd.service and .timer: the unit writer's golden files, systemd's checks, a real run.

Golden files live in tests/golden/nfd-units/<scenario>/: ``args.json`` (python and out for
render_nfd_units) and the expected ``edgectl-nfd.service`` and ``edgectl-nfd.timer``, byte for
byte; every folder is a listed scenario and every file in it is used. After a deliberate
change to the templates, regenerate and review the diff:

    PYTHONPATH=.:runtime python tests/test_nfd_units.py --regen
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgectl.errors import EdgectlError
from edgectl.fleet.labels import EXPIRY, REFRESH_INTERVAL, parse_feature_file
from edgectl.units import NFD_SERVICE, NFD_TIMER, render_nfd_units

GOLDEN = Path(__file__).parent / "golden" / "nfd-units"
EDGECTL = "/opt/edgectl/venv/bin/edgectl"

SCENARIOS = {
    "default": "NFD's features.d, the venv's python",
    "odd-path": "an --out path with a space, % and $ (quoted for systemd)",
}
UNITS = (NFD_SERVICE, NFD_TIMER)


def render_scenario(scenario: str) -> dict[str, str]:
    args = json.loads((GOLDEN / scenario / "args.json").read_text())
    return render_nfd_units(python=args["python"], out=args["out"], refresh_interval=REFRESH_INTERVAL, expiry=EXPIRY)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_units_match_golden_files(scenario):
    units = render_scenario(scenario)
    assert sorted(units) == sorted(UNITS)
    for name, text in units.items():
        assert text == (GOLDEN / scenario / name).read_text(encoding="utf-8"), name


def test_every_golden_file_is_used():
    assert {p.name for p in GOLDEN.iterdir()} == set(SCENARIOS)
    for scenario in SCENARIOS:
        assert {p.name for p in (GOLDEN / scenario).iterdir()} == {"args.json", *UNITS}, scenario


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_the_service_sets_no_limit_the_probe_would_label():
    # The probe reads its own cgroup and affinity as the node's: a limit here would become a label.
    s = settings(render_scenario("default")[NFD_SERVICE])
    for key in ("MemoryMax", "MemoryHigh", "CPUQuota", "AllowedCPUs", "CPUAffinity", "Slice"):
        assert key not in s, key
    assert s["ExecStart"] == ["/opt/edgectl/venv/bin/python -m edgectl probe --nfd --out "
                              "/etc/kubernetes/node-feature-discovery/features.d/edgectl"]
    assert s["ReadWritePaths"] == ["/etc/kubernetes/node-feature-discovery/features.d"]
    assert s["Type"] == ["oneshot"] and s["CapabilityBoundingSet"] == [""] and s["PrivateNetwork"] == ["yes"]
    timer = settings(render_scenario("default")[NFD_TIMER])
    assert timer["OnUnitActiveSec"] == ["1h"] and timer["WantedBy"] == ["timers.target"]


@pytest.mark.parametrize("out, says", [
    ("features.d/edgectl", "not an absolute path"),
    ("/tmp/features.d/edgectl", "PrivateTmp=yes"),
    ("/root/edgectl", "ProtectHome=yes"),
    ("/etc/kubernetes/node-feature-discovery/features.d/.edgectl", "starts with a dot"),
])
def test_paths_the_service_cannot_use_are_refused(out, says):
    with pytest.raises(EdgectlError, match=re.escape(says)):
        render_nfd_units(python="/opt/edgectl/venv/bin/python", out=out, refresh_interval=REFRESH_INTERVAL,
                         expiry=EXPIRY)


def _analyze(tmp_path: Path, scenario: str, *args: str, unit: str = NFD_SERVICE) -> subprocess.CompletedProcess:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    python = json.loads((GOLDEN / scenario / "args.json").read_text())["python"]
    if not Path(python).exists():
        pytest.skip(f"{python} is missing: run scripts/setup.sh")  # verify checks ExecStart's program
    for name, text in render_scenario(scenario).items():
        (tmp_path / name).write_text(text)
    return subprocess.run(["systemd-analyze", *args, str(tmp_path / unit)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_is_clean(tmp_path, scenario, unit):
    result = _analyze(tmp_path, scenario, "verify", unit=unit)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_security_exposure_is_low(tmp_path):
    result = _analyze(tmp_path, "default", "security", "--offline=true", "--no-pager")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 2.5, result.stdout


# --- under a real systemd ---------------------------------------------------------------------


@pytest.mark.systemd
def test_install_runs_the_probe_as_a_service_then_the_timer_keeps_it(systemd_sandbox):
    if not Path(EDGECTL).exists():
        pytest.skip(f"{EDGECTL} is missing: run scripts/setup.sh")
    sb = systemd_sandbox
    out = "/run/edgectl-nfd-test/features.d/edgectl"  # the sandbox's private /run
    env = ["env", "EDGECTL_UNIT_DIR=/run/systemd/system"]
    try:
        r = sb.run([*env, EDGECTL, "probe", "--nfd", "--out", out, "--install-timer"], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith(f"edgectl-nfd.timer installed: {out} is rewritten every 1 h"), r.stdout
        written = sb.host_path(out)
        labels, expiry = parse_feature_file(written.read_text())
        # what the hardened service wrote is what the probe says outside it (no limit of the
        # unit's own leaked into the labels), expiry aside
        direct = subprocess.run([EDGECTL, "probe", "--nfd"], capture_output=True, text=True, timeout=120)
        assert direct.returncode == 0, direct.stderr
        assert labels == parse_feature_file(direct.stdout)[0]
        timer = sb.show(NFD_TIMER, "ActiveState", "UnitFileState")
        assert timer["ActiveState"] == "active" and timer["UnitFileState"] in ("enabled", "enabled-runtime"), timer
        service = sb.show(NFD_SERVICE, "Result", "ExecMainStatus", "User")
        assert (service["Result"], service["ExecMainStatus"]) == ("success", "0"), service

        r = sb.run([*env, EDGECTL, "probe", "--nfd", "--out", out, "--remove-timer"], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not written.exists()
        assert not sb.host_path(f"/run/systemd/system/{NFD_TIMER}").exists()
        assert sb.show(NFD_TIMER, "LoadState")["LoadState"] == "not-found"
    finally:
        for name in UNITS:
            sb.systemctl("stop", name, check=False)
            sb.systemctl("disable", "--runtime", name, check=False)
            sb.host_path(f"/run/systemd/system/{name}").unlink(missing_ok=True)
        sb.systemctl("daemon-reload", check=False)


def _regen() -> None:
    for scenario in sorted(SCENARIOS):
        for name, text in render_scenario(scenario).items():
            (GOLDEN / scenario / name).write_text(text, encoding="utf-8")
            print(f"wrote {GOLDEN / scenario / name}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regen()
    else:
        print(__doc__)
