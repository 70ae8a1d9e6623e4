"""`edgectl probe` through the CLI, as a user runs it: bad input, JSON, capture, imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from probe_helpers import cli_env, copy_host, host, probe_json, run_cli, unknown_facts


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *, contains: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and contains in lines[0], lines[0]
    assert proc.stdout == ""


# ---- bad input -------------------------------------------------------------------------------


def test_missing_root(tmp_path):
    assert_one_line_error(run_cli(["probe", "--root", str(tmp_path / "nope")]), contains="no such directory")


def test_root_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_one_line_error(run_cli(["probe", "--json", "--root", str(f)]), contains="not a directory")


def test_root_with_nothing_to_read(tmp_path):
    assert_one_line_error(run_cli(["probe", "--root", str(tmp_path)]), contains="nothing to probe")


def test_garbled_cpuinfo_and_meminfo_exit_2(tmp_path):
    tree = copy_host("container-cgroup2", tmp_path)
    (tree / "proc/cpuinfo").write_text("\x00garbage without structure\n")
    (tree / "proc/meminfo").write_text("MemTotal: lots\n")
    assert_one_line_error(run_cli(["probe", "--root", str(tree)]), contains="garbled")


def test_garbled_meminfo_gives_unknowns_not_zeros(tmp_path):
    tree = copy_host("container-cgroup2", tmp_path)
    (tree / "proc/meminfo").write_text("MemTotal:  twelve gigabytes\n")
    d = probe_json(tree)
    unknown = unknown_facts(d)
    for fact in ("memory.total_bytes", "memory.available_bytes"):
        assert "garbled" in unknown[fact]
    for fact in ("memory.total_bytes", "memory.available_bytes", "memory.budget_bytes"):
        assert fact in unknown
        assert d["memory"][fact.split(".")[1]] is None
    assert d["device_class"] == "x86_64-avx512-bf16"  # the rest still probed


def test_garbled_cpuinfo_gives_generic_and_says_why(tmp_path):
    tree = copy_host("container-cgroup2", tmp_path)
    (tree / "proc/cpuinfo").write_text("no colon here\n")
    d = probe_json(tree)
    unknown = unknown_facts(d)
    assert d["device_class"] == "generic"
    assert "device_class" in unknown and "cpu.isa" in unknown
    assert d["cpu"]["flags"] == []
    assert d["memory"]["budget_bytes"] is not None  # memory is still known


def test_garbled_cgroup_limit_withholds_the_budget(tmp_path):
    tree = copy_host("container-cgroup2", tmp_path)
    (tree / "sys/fs/cgroup/memory.max").write_text("four gigabytes\n")
    d = probe_json(tree)
    unknown = unknown_facts(d)
    assert "memory.cgroup_limit_bytes" in unknown and "memory.max" in unknown["memory.cgroup_limit_bytes"]
    # an unreadable limit may be the tightest one: no budget is claimed rather than the host's
    assert d["memory"]["budget_bytes"] is None and "memory.budget_bytes" in unknown


def test_garbled_cpu_max_is_unknown_not_unlimited(tmp_path):
    tree = copy_host("container-cgroup2", tmp_path)
    (tree / "sys/fs/cgroup/cpu.max").write_text("lots\n")
    d = probe_json(tree)
    assert d["topology"]["cpu_quota_cores"] is None
    assert "topology.cpu_quota_cores" in unknown_facts(d)


def test_garbled_proc_self_cgroup(tmp_path):
    tree = copy_host("host-cgroup1", tmp_path)
    (tree / "proc/self/cgroup").write_text("not a cgroup line\n")
    d = probe_json(tree)
    unknown = unknown_facts(d)
    assert {"memory.cgroup_limit_bytes", "memory.budget_bytes", "topology.cpu_quota_cores"} <= set(unknown)


def test_directory_and_fifo_in_place_of_files(tmp_path):
    tree = copy_host("arm64-board", tmp_path)
    (tree / "proc/self/status").unlink()
    (tree / "proc/self/status").mkdir()
    (tree / "sys/devices/system/cpu/online").unlink()
    os.mkfifo(tree / "sys/devices/system/cpu/online")  # would block a naive reader forever
    d = probe_json(tree)
    unknown = unknown_facts(d)
    assert "is a directory" in unknown["topology.usable_cpus"]
    assert d["topology"]["usable_cpus"] is None
    # online CPUs then come from /proc/cpuinfo's processor entries, and a note says so
    assert d["topology"]["logical_cpus"] == 4
    assert any("not a regular file" in n for n in d["notes"])


def test_unreadable_file():
    """A file the probing user may not read: run the CLI as an unprivileged user (root reads
    files whatever their mode), on a tree in a directory that user can traverse."""
    import shutil
    import tempfile

    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to drop root")
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    else:
        prefix = []
    top = Path(tempfile.mkdtemp(prefix="edgectl-probe-perm-"))
    try:
        top.chmod(0o755)
        tree = top / "arm64-board"
        shutil.copytree(host("arm64-board"), tree)
        (tree / "proc/meminfo").chmod(0)
        proc = subprocess.run([*prefix, sys.executable, "-m", "edgectl", "probe", "--json", "--root", str(tree)],
                              env=cli_env(), capture_output=True, text=True, timeout=60, check=False, cwd="/")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    unknown = unknown_facts(json.loads(proc.stdout))
    assert "permission denied" in unknown["memory.total_bytes"]
    assert "memory.budget_bytes" in unknown


def test_bandwidth_with_root_is_refused(tmp_path):
    assert_one_line_error(run_cli(["probe", "--bandwidth", "--root", str(host("arm64-board"))]),
                          contains="--bandwidth")


# ---- output ------------------------------------------------------------------------------------


def test_json_is_exactly_to_dict():
    from edgectl.probe import probe

    d = probe_json(host("host-cgroup1"))
    assert d == json.loads(json.dumps(probe(host("host-cgroup1")).to_dict()))


def test_text_view_states_the_rules():
    proc = run_cli(["probe", "--root", str(host("container-cgroup2"))])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "x86_64-avx512-bf16" in out
    assert "min(4 GiB, max(512 MiB, 10% of the effective limit))" in out  # the reserve rule
    assert "inactive page cache not counted" in out
    assert "CPU quota 1.5 cores" in out


def test_probe_json_imports_neither_torch_nor_vllm():
    code = (
        "import sys\n"
        "from edgectl.cli import main\n"
        "try:\n"
        "    main(['probe', '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'numpy', 'transformers'))\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy) + '\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert json.loads(proc.stdout)["schema"] == "edgectl.probe/1"
    assert "HEAVY=\n" in proc.stderr, proc.stderr


# ---- capture -----------------------------------------------------------------------------------


def test_capture_of_a_tree_probes_the_same(tmp_path):
    dest = tmp_path / "copy"
    proc = run_cli(["probe", "--capture", str(dest), "--root", str(host("host-cgroup1"))])
    assert proc.returncode == 0, proc.stderr
    original, copied = probe_json(host("host-cgroup1")), probe_json(dest)
    for d in (original, copied):
        d.pop("root")
    assert copied == original
    # only what the probe read: e.g. none of the 24 cpuN/topology/core_id files
    assert not list(dest.glob("sys/devices/system/cpu/cpu*/topology/core_id"))


def test_capture_refuses_an_existing_directory(tmp_path):
    assert_one_line_error(run_cli(["probe", "--capture", str(tmp_path)]), contains="already exists")
    assert list(Path(tmp_path).iterdir()) == []
