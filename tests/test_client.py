"""The one client to a served model (edgectl/client.py), against a real HTTP server on a real port,
and the endpoint formatting every user of it shares (edgectl/contract/worker.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgectl.client import Client, HttpFailed
from edgectl.contract import worker
from edgectl.contract.effective import Effective
from edgectl.contract.plan import Serve
from edgectl.status import parse_metrics

METRICS = """# HELP vllm:request_success_total Count of successfully processed requests.
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0
vllm:generation_tokens_total{engine="0",model_name="m"} 64.0
"""


class _Handler(BaseHTTPRequestHandler):
    answers: dict[tuple[str, str], tuple[int, bytes]] = {}
    seen: list[tuple[str, str, object]] = []

    def _reply(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((method, self.path, body))
        status, data = self.answers.get((method, self.path), (404, b"{}"))
        self.send_response(status)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._reply("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._reply("POST")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    _Handler.answers, _Handler.seen = {}, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, _Handler
    httpd.shutdown()
    httpd.server_close()


def test_chat_state_and_metrics_from_a_served_model(server):
    httpd, handler = server
    handler.answers = {
        ("POST", "/v1/chat/completions"): (200, json.dumps({"choices": [{"message": {"content": "Paris."}}]}).encode()),
        ("GET", worker.EFFECTIVE_ROUTE): (200, json.dumps({"phase": worker.SERVING}).encode()),
        ("GET", "/metrics"): (200, METRICS.encode()),
    }
    # a plan bound to every address is reached on loopback
    client = Client.of(Serve(name="x", host="0.0.0.0", port=httpd.server_address[1]))
    assert client.host == "127.0.0.1"
    assert client.chat("m", "What is the capital of France?") == "Paris."
    method, path, body = handler.seen[-1]
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert body == {"model": "m", "temperature": 0, "max_tokens": 32,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    assert client.worker_state() == Effective(phase="serving")
    assert parse_metrics(client.metrics()) == {"requests": 5.0, "prompt_tokens": 120.0, "generated_tokens": 64.0}


def test_failures_are_one_exception_or_none(server):
    httpd, handler = server
    client = Client("127.0.0.1", httpd.server_address[1])
    handler.answers = {("POST", "/v1/chat/completions"): (200, b'{"choices": []}')}
    with pytest.raises(HttpFailed, match="the answer has no message"):
        client.chat("m", "hi")
    handler.answers = {("POST", "/v1/chat/completions"): (503, b'{"error": "shutting down"}')}
    with pytest.raises(HttpFailed, match="HTTP 503"):
        client.chat("m", "hi")
    assert client.worker_state() is None and client.metrics() is None  # 404: not a worker
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(HttpFailed):
        client.get_json("/v1/models", timeout=2)


@pytest.mark.parametrize("host, endpoint, base", [
    ("127.0.0.1", "http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("0.0.0.0", "http://0.0.0.0:8000", "http://127.0.0.1:8000"),
    ("::", "http://[::]:8000", "http://127.0.0.1:8000"),
    ("::1", "http://[::1]:8000", "http://[::1]:8000"),
    ("edge.local", "http://edge.local:8000", "http://edge.local:8000"),
])
def test_endpoints_are_formatted_once(host, endpoint, base):
    serve = Serve(name="x", host=host, port=8000)
    assert worker.endpoint(serve) == endpoint
    assert worker.base_url(serve) == base
    assert worker.host_port(serve) == endpoint.removeprefix("http://")
