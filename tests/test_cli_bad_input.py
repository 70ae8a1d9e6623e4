"""Bad input seen from outside: one ``error:`` line, exit 2, no traceback, nothing written.

Each case here printed a traceback, exited 0 or printed a bare HTTP error before its fix.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from models_helpers import run_cli

from edgectl.client import Client
from edgectl.serve import ask


def _env(tmp_path: Path) -> dict[str, str]:
    return {"EDGECTL_UNIT_DIR": str(tmp_path / "units"), "EDGECTL_CONFIG_DIR": str(tmp_path / "etc"),
            "EDGECTL_MODEL_CACHE": str(tmp_path / "models"), "EDGECTL_PROFILES_DIR": str(tmp_path / "profiles")}


def _one_error_line(proc, says: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["deploy", "smollm2-135m", "--dry-run"], ["serve", "smollm2-135m"]])
@pytest.mark.parametrize("port", ["70000", "0"])
def test_a_port_outside_tcp_is_one_error_line(tmp_path, command, port):
    proc = run_cli([*command, "--port", port], env=_env(tmp_path), timeout=120)
    _one_error_line(proc, f"--port {port} is not a TCP port: use 1-65535")
    assert not any(tmp_path.rglob("*")), list(tmp_path.rglob("*"))  # nothing written


def test_logs_of_a_name_never_deployed_is_an_error(tmp_path):
    proc = run_cli(["logs", "no-such-name"], env=_env(tmp_path), timeout=60)
    _one_error_line(proc, "no deployment named 'no-such-name'")


class _BaseModelServer(BaseHTTPRequestHandler):
    """What vLLM's OpenAI server answers for a model without a chat template: chat is refused
    with 400 (vllm/entrypoints/openai/serving_chat.py, the "default chat template is no longer
    allowed" error), completions work."""

    seen: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append(self.path)
        if self.path == "/v1/chat/completions":
            status, answer = 400, {"error": {"message": "As of transformers v4.44, default chat template is no "
                                                        "longer allowed", "code": 400}}
        else:
            status, answer = 200, {"choices": [{"text": f" {body['prompt']} Paris."}]}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        pass


@pytest.fixture
def base_model_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BaseModelServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _BaseModelServer.seen = []
    yield Client("127.0.0.1", server.server_address[1])
    server.shutdown()


def test_ask_a_model_without_a_chat_template_completes_the_question(base_model_server, capsys):
    said: list[str] = []
    ask(base_model_server, "base", "The capital of France is", chat=False, progress=said.append)
    assert _BaseModelServer.seen == ["/v1/completions"]
    assert "no chat template" in said[0]
    assert "The capital of France is → The capital of France is Paris." in capsys.readouterr().out


def test_ask_a_chat_model_uses_chat(base_model_server):
    said: list[str] = []
    ask(base_model_server, "base", "Hi", chat=True, progress=said.append)
    assert _BaseModelServer.seen == ["/v1/chat/completions"]
    assert "HTTP 400" in said[0] and "chat template" in said[0]  # the server's reason, not a bare status
