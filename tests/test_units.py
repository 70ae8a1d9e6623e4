"""The unit writer (edgectl/units.py): golden files, systemd's own checks, and refusals.

Golden files live in tests/golden/units/<scenario>/: the input ``plan.json`` (a full
edgectl.plan/1 plan), ``args.json`` (plan_path and python for render_unit) and the expected
``edgectl-NAME.service``, byte for byte. Every folder must be a listed scenario and every file
in it must be used. After a deliberate change to the template, regenerate and review the diff:

    PYTHONPATH=.:runtime python tests/test_units.py --regen
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgectl.contract.plan import Plan
from edgectl.errors import EdgectlError
from edgectl.units import (
    NAME_MAX_CHARS,
    quote_word,
    render_unit,
    unit_environment,
    unit_name,
    validate_name,
)

GOLDEN = Path(__file__).parent / "golden" / "units"

# One folder each; what each one covers.
SCENARIOS = {
    "small-default": "the small box: w4a16, CPUs 0-1, loopback, default timeouts",
    "pinned-cpus-memory-limit": "CPUs [2, 3] and a tighter memory limit",
    "lan-port-env": "one LAN address and port (network-online), extra environment with quotes and %",
    "bf16-wildcard": "bf16 weights, all addresses (no IP filter), fractional start timeout",
    "odd-paths": "model path, plan path and environment with spaces, quotes, %, $ and \\; IPv6 loopback",
}

PLAN_KEYS = {  # edgectl.plan/1, top level (edgectl/contract/plan.py)
    "schema", "model", "device_class", "profile", "weight_format", "group_size", "quantize_lm_head",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_bytes", "kv_bytes_per_token",
    "block_size", "rope_rows", "threads", "cpus", "topology", "compilation", "levers", "memory",
    "predicted", "serve", "timeouts", "env", "reasons", "request",
}
MAX_EXPOSURE = 2.5


def load_scenario(scenario: str) -> tuple[dict, dict, Path, set[str]]:
    """(plan, render arguments, expected unit file, names of the files used)."""
    folder = GOLDEN / scenario
    plan = json.loads((folder / "plan.json").read_text())
    args = json.loads((folder / "args.json").read_text())
    expected = folder / unit_name(plan["serve"]["name"])
    return plan, args, expected, {"plan.json", "args.json", expected.name}


def render_scenario(scenario: str) -> tuple[str, Path]:
    plan, args, expected, _ = load_scenario(scenario)
    return render_unit(Plan.from_dict(plan), plan_path=args["plan_path"], python=args["python"]), expected


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_unit_matches_golden_file(scenario):
    text, expected = render_scenario(scenario)
    assert expected.is_file(), f"missing golden file {expected}; run: python tests/test_units.py --regen"
    assert text == expected.read_text(encoding="utf-8")


def test_every_golden_file_is_used():
    folders = {p.name for p in GOLDEN.iterdir() if p.is_dir()}
    assert folders == set(SCENARIOS), "golden folders and SCENARIOS differ"
    for scenario in SCENARIOS:
        used = load_scenario(scenario)[3]
        present = {p.name for p in (GOLDEN / scenario).iterdir()}
        assert present == used, f"{scenario}: unused {present - used}, missing {used - present}"
    assert {p.name for p in GOLDEN.iterdir()} == folders, "stray files in tests/golden/units"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_golden_inputs_are_whole_plans(scenario):
    plan = load_scenario(scenario)[0]
    assert set(plan) == PLAN_KEYS
    assert plan["schema"] == "edgectl.plan/1"


def test_scenarios_differ_where_they_claim():
    units = {s: render_scenario(s)[0] for s in SCENARIOS}
    assert "CPUAffinity=2-3\nAllowedCPUs=2-3" in units["pinned-cpus-memory-limit"]
    assert "MemoryMax=1879048192" in units["pinned-cpus-memory-limit"]
    assert "After=network-online.target" in units["lan-port-env"]
    assert "IPAddressDeny" not in units["lan-port-env"] and "IPAddressDeny" not in units["bf16-wildcard"]
    assert "IPAddressDeny=any" in units["small-default"] and "IPAddressDeny=any" in units["odd-paths"]
    assert "TimeoutStartSec=413" in units["bf16-wildcard"]  # 412.3 s rounded up
    # The plan repeats HF_HUB_OFFLINE=1, which the unit sets itself: written once.
    assert units["lan-port-env"].count("HF_HUB_OFFLINE") == 1


# --- systemd's own checks ----------------------------------------------------------------


def _analyze(tmp_path: Path, scenario: str, *args: str) -> subprocess.CompletedProcess:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    plan, render_args, expected, _ = load_scenario(scenario)
    if not Path(render_args["python"]).exists():
        # verify checks that ExecStart's program exists
        pytest.skip(f"{render_args['python']} is missing: run scripts/setup.sh")
    unit = tmp_path / expected.name
    unit.write_text(render_unit(Plan.from_dict(plan), plan_path=render_args["plan_path"], python=render_args["python"]))
    return subprocess.run(["systemd-analyze", *args, str(unit)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_systemd_analyze_verify_is_clean(tmp_path, scenario):
    result = _analyze(tmp_path, scenario, "verify")
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_security_exposure_at_most_2_5(tmp_path, scenario):
    result = _analyze(tmp_path, scenario, "security", "--offline=true", "--no-pager")
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def test_verify_catches_a_broken_unit(tmp_path):
    # The check above can fail: an unknown setting is reported.
    result = _analyze(tmp_path, "small-default", "verify")
    unit = next(tmp_path.glob("*.service"))
    unit.write_text(unit.read_text().replace("OOMPolicy=stop", "OOMPolicy=stop\nRestartSteps=3"))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert "RestartSteps" in result.stderr


# --- what the unit contains, from any plan ----------------------------------------------


def small_plan() -> dict:
    return copy.deepcopy(load_scenario("small-default")[0])


def render(plan: dict, plan_path: str = "/etc/edgectl/small/plan.json",
           python: str = "/opt/edgectl/venv/bin/python") -> str:
    """The unit of a plan's JSON, read as every reader reads it (``Plan.from_dict``)."""
    return render_unit(Plan.from_dict(plan), plan_path=plan_path, python=python)


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_takes_its_numbers_from_the_plan():
    plan = small_plan()
    plan["timeouts"] = {"start_s": 123, "watchdog_s": 7, "stop_s": 11}
    plan["memory"]["high_bytes"], plan["memory"]["limit_bytes"] = 5 * 2**20, 6 * 2**20
    plan["cpus"] = [0, 2, 3, 5]
    s = settings(render(plan))
    assert s["TimeoutStartSec"] == ["123"] and s["WatchdogSec"] == ["7"] and s["TimeoutStopSec"] == ["11"]
    assert s["MemoryHigh"] == [str(5 * 2**20)] and s["MemoryMax"] == [str(6 * 2**20)]
    assert s["CPUAffinity"] == ["0 2-3 5"] and s["AllowedCPUs"] == ["0 2-3 5"]
    assert s["Type"] == ["notify"] and s["MemorySwapMax"] == ["0"] and s["DynamicUser"] == ["yes"]
    assert s["ExecStart"] == ["/opt/edgectl/venv/bin/python -P -m edgectl_runtime.service.worker "
                              "--plan /etc/edgectl/small/plan.json"]
    assert "MemoryDenyWriteExecute" not in s and "ProcSubset" not in s


def test_a_frozen_worker_is_killed_soon_after_the_watchdog_fires():
    # On expiry systemd sends SIGABRT; a SIGSTOPped worker cannot act on it, so SIGKILL must not
    # wait the whole stop timeout (which a draining worker needs on an ordinary stop).
    plan = small_plan()
    plan["timeouts"] = {"start_s": 100, "watchdog_s": 30, "stop_s": 30}
    s = settings(render(plan))
    assert s["TimeoutStopSec"] == ["30"]
    (abort,) = s["TimeoutAbortSec"]
    assert 0 < int(abort) < 30


def test_start_limit_outlasts_a_loop_of_hung_starts():
    plan = small_plan()
    plan["timeouts"] = {"start_s": 100, "watchdog_s": 10, "stop_s": 20}
    s = settings(render(plan))
    burst, interval = int(s["StartLimitBurst"][0]), int(s["StartLimitIntervalSec"][0])
    restart = int(s["RestartSec"][0])
    # burst + 1 starts that each hang until the start timeout, are stopped and wait to restart
    # must fall in one interval, or systemd's window resets and the loop never ends.
    assert interval > burst * (100 + 20 + restart)


def test_plan_environment_is_written_sorted_and_quoted():
    plan = small_plan()
    plan["env"] = {"ZED": "1", "ALPHA": "two words", "PCT": "100%", "BS": 'a\\b"c'}
    s = settings(render(plan))
    env = s["Environment"]
    assert env[:4] == ['"ALPHA=two words"', '"BS=a\\\\b\\"c"', '"PCT=100%%"', "ZED=1"]
    assert env[4:] == [f"{k}={v}" for k, v in unit_environment("small").items()]


def test_quote_word():
    assert quote_word("/opt/edgectl/venv/bin/python") == "/opt/edgectl/venv/bin/python"
    assert quote_word("a b") == '"a b"'
    assert quote_word("50%") == '"50%%"'
    assert quote_word("$HOME") == '"$HOME"'
    assert quote_word("$HOME", dollar=True) == '"$$HOME"'
    assert quote_word('q"\\') == '"q\\"\\\\"'
    assert quote_word("line\nnext\x01") == '"line\\nnext\\x01"'
    with pytest.raises(ValueError):
        quote_word("nul\0")


def test_description_cannot_break_out_of_its_line():
    plan = small_plan()
    plan["model"]["name"] = "evil\nExecStartPre=/bin/rm -rf /"
    text = render(plan)
    assert "\nExecStartPre" not in text
    assert settings(text)["Description"][0].startswith("edgectl small: evil\\nExecStartPre")


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "smollm2", "qwen2-5-0-5b", "x_y", "9lives", "a" * NAME_MAX_CHARS])
def test_valid_names(name):
    assert validate_name(name) == name
    assert unit_name(name) == f"edgectl-{name}.service"


@pytest.mark.parametrize("name, says", [
    ("", "empty"),
    ("Big", "invalid"),
    ("qwen2.5", "invalid"),
    ("-x", "invalid"),
    ("x-", "invalid"),
    ("a b", "invalid"),
    ("../etc", "invalid"),
    ("a" * (NAME_MAX_CHARS + 1), "at most 31"),
    ("models", "reserved"),
    ("profiles", "reserved"),
])
def test_invalid_names(name, says):
    with pytest.raises(EdgectlError) as exc:
        validate_name(name)
    assert says in exc.value.message and "\n" not in exc.value.message


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize("path, hidden_by", [
    ("/tmp/models/x", "PrivateTmp=yes"),
    ("/var/tmp/x", "PrivateTmp=yes"),
    ("/root/models/x", "ProtectHome=yes"),
    ("/home/me/x", "ProtectHome=yes"),
    ("/var/lib/../../tmp/x", "PrivateTmp=yes"),
])
def test_model_the_service_cannot_see_is_refused(path, hidden_by):
    plan = small_plan()
    plan["model"]["path"] = path
    with pytest.raises(EdgectlError) as exc:
        render(plan)
    assert hidden_by in exc.value.message and "plan.model.path" in exc.value.message


def test_python_and_plan_path_the_service_cannot_see_are_refused():
    with pytest.raises(EdgectlError) as exc:
        render(small_plan(), python="/root/.venv/bin/python", plan_path="/tmp/p.json")
    problems = [exc.value.message, *exc.value.details]
    assert any("runtime python" in p and "ProtectHome" in p for p in problems)
    assert any("plan path" in p and "PrivateTmp" in p for p in problems)


def test_every_bad_field_is_named():
    plan = small_plan()
    del plan["timeouts"]["watchdog_s"]
    plan["serve"]["port"] = 70000
    plan["cpus"] = [1, 1]
    plan["memory"]["high_bytes"] = plan["memory"]["limit_bytes"] + 1
    plan["env"] = {"OK": "1", "bad name": "x", "NUM": 3}
    with pytest.raises(EdgectlError) as exc:
        render(plan)
    problems = [exc.value.message, *exc.value.details]
    for field in ("timeouts.watchdog_s: missing", "serve.port: 70000", "plan.cpus", "memory.high_bytes",
                  "'bad name' is not a variable name", "plan.env.NUM"):
        assert sum(field in p for p in problems) == 1, (field, problems)
    assert len(problems) == 6


@pytest.mark.parametrize("port", [80, 1023])
def test_privileged_port_is_refused(port):
    plan = small_plan()
    plan["serve"]["port"] = port
    with pytest.raises(EdgectlError, match=f"plan.serve.port: {port} is a privileged port"):
        render(plan)
    plan["serve"]["port"] = 1024
    assert "on 127.0.0.1:1024" in render(plan)


def test_plan_may_not_move_the_units_own_directories():
    plan = small_plan()
    plan["env"]["HOME"] = "/root"
    with pytest.raises(EdgectlError, match="plan.env.HOME: the unit sets it"):
        render(plan)


def test_not_a_plan():
    with pytest.raises(EdgectlError, match="not a JSON object"):
        render([], plan_path="/etc/edgectl/x/plan.json", python="/usr/bin/python3")


def test_writer_imports_neither_torch_nor_vllm():
    code = "import sys, edgectl.units; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]"


def _regen() -> None:
    for scenario in sorted(SCENARIOS):
        text, expected = render_scenario(scenario)
        for old in (GOLDEN / scenario).glob("*.service"):
            old.unlink()
        expected.write_text(text, encoding="utf-8")
        print(f"wrote {expected}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regen()
    else:
        print(__doc__)
