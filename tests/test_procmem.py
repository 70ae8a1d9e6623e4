"""procmem (edgectl/contract/procmem.py) on real processes read through the real /proc.

PSS of a tree must include every descendant (vLLM keeps the model in a child) and count a
file two processes map once, where RSS counts it twice.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgectl.contract.procmem import mem_of_pids, read_proc_mem, tree_mem, tree_pids

MiB = 1 << 20

# A process that holds `anon` MiB of its own memory and maps `shared` (a file, or -) fully, says
# READY when both are resident, and lives until its stdin closes.
HOLDER = r"""
import mmap, sys
anon, shared = int(sys.argv[1]), sys.argv[2]
buf = bytearray(anon << 20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
if shared != "-":
    with open(shared, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), 4096))
print("READY", flush=True)
sys.stdin.read()
"""


def _holder(tmp_path: Path, anon_mib: int, shared: Path | None) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    return subprocess.Popen([sys.executable, str(script), str(anon_mib), str(shared or "-")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _wait_ready(p: subprocess.Popen) -> None:
    assert p.stdout.readline().strip() == "READY"


@pytest.fixture
def shared_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x01" * (48 * MiB))
    return path


def test_a_tree_counts_its_descendants(tmp_path):
    # parent (a shell) → child holding 64 MiB: reading the parent alone misses it
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    parent = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} {script} 64 -; :"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _wait_ready(parent)
        pids = tree_pids(parent.pid)
        assert len(pids) == 2 and pids[0] == parent.pid, pids
        tree = tree_mem(parent.pid)
        alone = read_proc_mem(parent.pid)
        assert alone is not None and alone.pss_anon_bytes < 16 * MiB
        assert tree.pss_anon_bytes >= 64 * MiB, tree.to_dict()
        assert {p.pid for p in tree.processes} == set(pids) and tree.unreadable == ()
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)


def test_a_file_mapped_by_two_processes_is_counted_once(tmp_path, shared_file):
    a, b = _holder(tmp_path, 1, shared_file), _holder(tmp_path, 1, shared_file)
    try:
        _wait_ready(a)
        _wait_ready(b)
        both = mem_of_pids([a.pid, b.pid])
        rss = sum(p.rss_bytes for p in both.processes)
        # RSS: 48 MiB in each; PSS: 24 MiB charged to each, 48 in all (plus the interpreters' own)
        assert rss - both.pss_bytes >= 40 * MiB, both.to_dict()
        assert 48 * MiB <= both.pss_file_bytes, both.to_dict()
    finally:
        for p in (a, b):
            p.stdin.close()
            p.wait(timeout=30)


def test_a_process_that_is_gone_is_reported_not_raised(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    time.sleep(0.1)
    assert read_proc_mem(p.pid) is None
    tree = mem_of_pids([p.pid])
    assert tree.processes == () and tree.unreadable == (p.pid,)


# A process that madvises 16 MiB of anonymous memory MADV_HUGEPAGE before touching it (what
# PyTorch's allocator does under THP_MEM_ALLOC_ENABLE=1) and says READY.
HUGE_HOLDER = r"""
import mmap, sys
m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_HUGEPAGE)
for i in range(0, len(m), 4096):
    m[i] = 1
print("READY", flush=True)
sys.stdin.read()
"""


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip()


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason=f"transparent huge pages: {_thp_mode()}")
def test_anonymous_memory_on_huge_pages_is_read(tmp_path):
    # the huge-pages lever's read-back (bench/runner.py): AnonHugePages of the tree, from the kernel
    script = tmp_path / "huge.py"
    script.write_text(HUGE_HOLDER)
    plain = _holder(tmp_path, 16, None)
    huge = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _wait_ready(plain)
        _wait_ready(huge)
        got = read_proc_mem(huge.pid)
        assert got is not None and got.anon_huge_bytes >= 2 * MiB, got  # at least one 2 MiB page of the 16
        assert tree_mem(huge.pid).anon_huge_bytes == got.anon_huge_bytes
        assert "anon_huge_bytes" in got.to_dict()
        if _thp_mode() == "madvise":  # nothing asked, nothing given
            assert read_proc_mem(plain.pid).anon_huge_bytes == 0
    finally:
        for p in (plain, huge):
            p.stdin.close()
            p.wait(timeout=30)
