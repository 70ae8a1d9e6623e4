"""Load on the real worker (SmolLM2, one engine start): more clients than sequences, a client
that goes away mid-stream. Nothing here asserts timing: only what was answered and what the
engine counted (its Prometheus page, the one `edgectl status` reads)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from installed import RUNTIME_PYTHON
from models_helpers import REPO
from test_worker import _env, _free_port, _get, _worker

SEQS = 2
CLIENTS = 5
TOKENS = 16


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metrics(port: int) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def _complete(port: int, prompt: str, tokens: int, stream: bool = False) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "stream": stream}
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    return c.getresponse()


@pytest.mark.engine
def test_more_clients_than_sequences_are_all_answered_and_a_dropped_stream_frees_its_sequence(tmp_path, pulled_smollm2):
    port = _free_port()
    # eager: a compile costs minutes on 2 cores; the compiled default is served in the deploy test
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", "smollm2-135m", "--max-model-len", "1024",
                          "--compilation", "eager", "--max-num-seqs", str(SEQS), "--json"], capture_output=True, text=True, timeout=120,
                         env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    plan["serve"]["port"] = port
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = _worker(path, python=RUNTIME_PYTHON)
    log: list[str] = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                if _get(f"http://127.0.0.1:{port}/edgectl/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("the worker did not become ready")
        threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()

        # CLIENTS at once on SEQS sequences: queued, none refused, every one answered in full
        answers: list[tuple[int, dict]] = [(0, {})] * CLIENTS

        def ask(i: int) -> None:
            r = _complete(port, f"Question {i}: name a colour.", TOKENS)
            answers[i] = (r.status, json.loads(r.read()))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert [s for s, _ in answers] == [200] * CLIENTS, answers
        assert [a["usage"]["completion_tokens"] for _, a in answers] == [TOKENS] * CLIENTS, answers
        before = _metrics(port)
        assert _metric(before, "vllm:request_success_total", finished_reason="length") >= CLIENTS

        # a client that disconnects after its first tokens: the engine aborts its request
        body = json.dumps({"model": "smollm2-135m", "prompt": "Tell a very long story.", "max_tokens": 900,
                           "ignore_eos": True, "temperature": 0, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         + f"content-length: {len(body)}\r\n\r\n".encode() + body)
            got = b""
            while b"data: {" not in got:
                chunk = sock.recv(4096)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200"), got[:200]
            sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = _metrics(port)
            if _metric(now, "vllm:num_requests_running") == 0:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the dropped stream's request is still running: " +
                        " ".join(re.findall(r"vllm:num_requests_running\{[^}]*\} \S+", now)))
        # aborted, not run to its max_tokens: no new "length" finish, and fewer tokens made than asked
        # (vLLM counts a request its client abandoned under no finished_reason)
        assert _metric(now, "vllm:request_success_total", finished_reason="length") == \
            _metric(before, "vllm:request_success_total", finished_reason="length")
        generated = _metric(now, "vllm:generation_tokens_total") - _metric(before, "vllm:generation_tokens_total")
        assert 0 < generated < 900, generated
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
