"""The memory attribution (runtime/edgectl_runtime/introspect/memory/): its parts come from their own
sources and add up to the PSS the kernel reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from edgectl_runtime.introspect import memory  # noqa: E402  (imports neither torch nor vLLM at module level)

SITE = "/opt/venv/lib/python3.11/site-packages/"

SMAPS = f"""\
55d000000000-55d000001000 r--p 00000000 fe:00 1 /opt/venv/bin/python3.11
Rss:                   4 kB
Pss:                   4 kB
Anonymous:             0 kB
7f0000000000-7f0000400000 r-xp 00000000 fe:00 2 {SITE}torch/lib/libtorch_cpu.so
Rss:                4096 kB
Pss:                2048 kB
Anonymous:             0 kB
7f0000400000-7f0000500000 rw-p 00400000 fe:00 2 {SITE}torch/lib/libtorch_cpu.so
Rss:                1024 kB
Pss:                1024 kB
Anonymous:          1024 kB
7f0000500000-7f0000600000 r-xp 00000000 fe:00 3 {SITE}numpy.libs/libopenblas64_p-r0.so
Rss:                 512 kB
Pss:                 512 kB
Anonymous:             0 kB
7f0000600000-7f0000700000 r--p 00000000 fe:00 4 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 100 kB
Pss:                  10 kB
Anonymous:             0 kB
7f0000700000-7f0000800000 r--p 00000000 fe:00 5 /models/m/model.safetensors
Rss:                 200 kB
Pss:                 200 kB
Anonymous:             0 kB
7f1000000000-7f1000800000 rw-p 00000000 00:00 0
Rss:                8192 kB
Pss:                8192 kB
Anonymous:          8192 kB
7f2000000000-7f2000800000 rw-p 00000000 00:00 0
Rss:                  16 kB
Pss:                  16 kB
Anonymous:            16 kB
"""


def test_smaps_is_parsed_per_mapping():
    maps = memory.parse_smaps(SMAPS)
    assert len(maps) == 8
    lib = maps[2]
    assert (lib.start, lib.end, lib.perms) == (0x7F0000400000, 0x7F0000500000, "rw-p")
    assert lib.path.endswith("libtorch_cpu.so") and lib.pss == lib.anonymous == 1024 * 1024
    assert maps[6].path == "" and not maps[6].file_backed


@pytest.mark.parametrize("path, group", [
    (f"{SITE}torch/lib/libtorch_cpu.so", "torch"),
    (f"{SITE}numpy.libs/libopenblas64_p-r0.so", "numpy"),
    (f"{SITE}_cffi_backend.cpython-311-x86_64-linux-gnu.so", "_cffi_backend"),
    ("/usr/lib/x86_64-linux-gnu/libc.so.6", "system libraries"),
    ("/models/m/model.safetensors", "checkpoint (mapped)"),
    ("/tmp/something", "other files"),
])
def test_mapped_files_are_grouped_by_the_package_that_ships_them(path, group):
    assert memory.package_of(path, [SITE], model_dir="/models/m") == group


def test_parts_and_the_unattributed_rest_sum_to_the_measured_pss():
    maps = memory.parse_smaps(SMAPS)
    stacks = [{"tid": 1, "name": "python", "sp": 0x7F2000000100}]
    att = memory.attribute(maps, stacks=stacks, model_dir="/models/m", site_dirs=[SITE],
                           mallinfo={"uordblks": 4 << 20, "hblkhd": 2 << 20, "fordblks": 0, "arena": 4 << 20},
                           pymalloc={"total_bytes": 1 << 20}, arena_heaps=[])
    rows = {r["part"]: r for r in att["rows"]}
    assert att["pss_bytes"] == sum(m.pss for m in maps)
    assert sum(r["bytes"] for r in att["rows"]) == att["pss_bytes"]  # "not attributed" closes the sum
    assert rows["torch"]["file_bytes"] == 2048 * 1024 and rows["torch"]["anon_bytes"] == 1024 * 1024
    assert rows["checkpoint (mapped)"]["bytes"] == 200 * 1024
    assert rows["thread stacks (1 threads)"]["bytes"] == 16 * 1024  # the mapping holding the stack pointer
    assert rows["in use: native allocations and Python objects > 512 B"]["bytes"] == 6 << 20
    assert rows["measured PSS minus every part above"]["bytes"] == (8192 << 10) - (7 << 20)
    assert "PSS" in memory.render_text(att)


def test_a_live_process_is_attributed_within_five_percent(tmp_path):
    """A real interpreter with torch, a few tensors, threads: every part from its own source,
    the sum within 5% of the kernel's PSS, and the tensors found where they are."""
    runtime_python = "/opt/edgectl/venv/bin/python"
    if not Path(runtime_python).exists():
        pytest.skip("the runtime venv is not installed (scripts/setup.sh)")
    code = (
        "import json, threading, torch\n"
        "from edgectl_runtime.introspect import memory\n"
        "kv = torch.zeros(32 << 20, dtype=torch.uint8)\n"
        "w = torch.ones(48 << 20, dtype=torch.uint8)\n"
        # what a compiled graph keeps: a tensor whose storage refuses data_ptr() (found in a
        # compiled worker, where /edgectl/memory answered 500)
        "fake = torch.ones(4); torch._C._set_throw_on_mutable_data_ptr(fake)\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.p = torch.nn.Parameter(w, requires_grad=False)\n"
        "ev = threading.Event(); [threading.Thread(target=ev.wait, daemon=True).start() for _ in range(3)]\n"
        "print(json.dumps(memory.collect(model=M(), kv_caches=[kv])))\n"
    )
    out = subprocess.run([runtime_python, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{REPO}:{REPO / 'runtime'}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    att = json.loads(out.stdout.strip().splitlines()[-1])
    rows = {r["part"]: r for r in att["rows"]}
    assert rows["KV cache"]["bytes"] == 32 << 20
    assert rows["weights"]["bytes"] == 48 << 20
    assert abs(att["unattributed_fraction"]) < 0.05, memory.render_text(att)
    threads = [r for r in att["rows"] if r["group"] == "threads"][0]
    assert sum(threads["threads"].values()) >= 4  # the main thread and the three waiting ones


def test_status_fetches_the_attribution_from_the_worker_and_prints_it():
    """`edgectl status --memory`: the control plane asks the worker's route (a stand-in HTTP
    server here, serving an attribution made from the fixture above) and prints it."""
    import http.server
    import threading

    from edgectl.client import Client
    from edgectl.contract.worker import MEMORY_ROUTE
    from edgectl.status import DeploymentStatus, attribution_of

    att = memory.attribute(memory.parse_smaps(SMAPS), site_dirs=[SITE], mallinfo=None, pymalloc=None, arena_heaps=[])
    answers = {MEMORY_ROUTE: att}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps(answers.get(self.path, {"error": "no"})).encode()
            self.send_response(200 if self.path in answers else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = Client("127.0.0.1", httpd.server_address[1])
        got, why = attribution_of(client)
        assert (got, why) == (att, None)
        st = DeploymentStatus("x", "edgectl-x.service", "active", "running", "", 0, 1.0, None, None, None, None,
                              attribution=got)
        text = st.render_text()
        assert "where the worker's memory goes" in text and "attributed" in text and "torch" in text
        assert st.to_dict()["attribution"] == att
        answers[MEMORY_ROUTE] = {"schema": "something/1"}
        assert attribution_of(client) == (None, "the worker answered something else than edgectl.memory/1")
        del answers[MEMORY_ROUTE]
        got, why = attribution_of(client)
        assert got is None and why.startswith("the worker did not give one")
    finally:
        httpd.shutdown()
