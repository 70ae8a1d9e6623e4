"""The one HTTP client to a served model: deploy, status, serve and the bench use it.

Standard library only (``http.client``). It speaks the OpenAI-compatible API, the worker's own
routes (``edgectl/contract/worker.py``) and Prometheus text; any failure, unreachable or an
error status, is one exception, :class:`HttpFailed`. Streaming completions are read as
server-sent events, and every chunk is timestamped on arrival with ``time.perf_counter``:
decode and prefill speeds are measured from the client, the way a deployed service is used,
not from the server's own log. (The worker's warm-up, which runs on the server's own event
loop, uses an asyncio client, and the same endpoint formatting.)
"""

from __future__ import annotations

import http.client
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgectl.contract import worker
from edgectl.contract.effective import Effective

if TYPE_CHECKING:
    from edgectl.contract.plan import Serve


class HttpFailed(Exception):
    """The server could not be reached, or answered with an error status."""


@dataclass
class Client:
    host: str
    port: int

    @classmethod
    def of(cls, serve: Serve) -> Client:
        """A client for the server a plan describes (a wildcard bind is reached on loopback)."""
        return cls(worker.connect_host(serve.host), serve.port)

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
        conn = self._conn(timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                         headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise HttpFailed(f"{method} {path}: {exc.__class__.__name__}: {exc}") from None
        finally:
            conn.close()

    def status(self, path: str, timeout: float = 2.0) -> int | None:
        """The HTTP status of GET ``path``, or None if nothing answered."""
        try:
            return self.request("GET", path, timeout=timeout)[0]
        except HttpFailed:
            return None

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        status, data = self.request("GET", path, timeout=timeout)
        return _decode(status, data, f"GET {path}")

    def get_text(self, path: str, timeout: float = 10.0) -> str:
        status, data = self.request("GET", path, timeout=timeout)
        if status != 200:
            raise HttpFailed(f"GET {path}: HTTP {status}: {data[:300]!r}")
        return data.decode("utf-8", "replace")

    def post_json(self, path: str, body: Any, timeout: float = 600.0) -> Any:
        status, data = self.request("POST", path, body, timeout=timeout)
        return _decode(status, data, f"POST {path}")

    # -- what the commands ask a served model --------------------------------------------------

    def chat(self, model: str, question: str, *, max_tokens: int = 32, timeout: float = 120.0) -> str:
        """One greedy chat completion; the answer's text."""
        data = self.post_json("/v1/chat/completions", {
            "model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}]}, timeout=timeout)
        try:
            return data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise HttpFailed(f"POST /v1/chat/completions: the answer has no message: {str(data)[:200]}") from None

    def complete(self, model: str, prompt: str, *, max_tokens: int = 32, timeout: float = 120.0) -> str:
        """One greedy completion of ``prompt`` (a model without a chat template); the text."""
        data = self.post_json("/v1/completions", {
            "model": model, "temperature": 0, "max_tokens": max_tokens, "prompt": prompt}, timeout=timeout)
        try:
            return data["choices"][0]["text"] or ""
        except (KeyError, IndexError, TypeError):
            raise HttpFailed(f"POST /v1/completions: the answer has no text: {str(data)[:200]}") from None

    def transcribe(self, model: str, audio: bytes, filename: str, *, language: str = "en",
                   timeout: float = 600.0) -> dict[str, Any]:
        """One transcription through the OpenAI API (``POST /v1/audio/transcriptions``, multipart, the
        answer as ``json``, greedy: temperature 0); the answer (``{"text": …}``)."""
        fields = {"model": model, "response_format": "json", "temperature": "0", "language": language}
        body, content_type = _multipart(fields, "file", filename, audio)
        conn = self._conn(timeout)
        path = "/v1/audio/transcriptions"
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": content_type})
            resp = conn.getresponse()
            status, data = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise HttpFailed(f"POST {path}: {exc.__class__.__name__}: {exc}") from None
        finally:
            conn.close()
        answer = _decode(status, data, f"POST {path}")
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
            raise HttpFailed(f"POST {path}: the answer has no text: {str(answer)[:200]}")
        return answer

    def worker_state(self, timeout: float = 3.0) -> Effective | None:
        """The worker's own report (its phase, the settings read back, the load peak), or None when
        no worker answers; EdgectlError naming every bad field if the report does not fit its schema."""
        try:
            state = self.get_json(worker.EFFECTIVE_ROUTE, timeout=timeout)
        except HttpFailed:
            return None
        return Effective.from_dict(state) if isinstance(state, dict) else None

    def metrics(self, timeout: float = 3.0) -> str | None:
        """The server's Prometheus page, or None if it does not answer."""
        try:
            return self.get_text("/metrics", timeout=timeout)
        except HttpFailed:
            return None

    # -- streaming ----------------------------------------------------------------------------

    def stream(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> "Stream":
        """POST ``body`` with ``stream: true`` and time every server-sent event."""
        conn = self._conn(timeout)
        chunks: list[tuple[float, dict[str, Any]]] = []
        try:
            payload = json.dumps({**body, "stream": True}).encode()
            t_sent = time.perf_counter()
            conn.request("POST", path, body=payload, headers={"Content-Type": "application/json",
                                                               "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise HttpFailed(f"POST {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            while True:
                line = resp.readline()
                if not line:
                    break
                now = time.perf_counter()
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    chunks.append((now, json.loads(data)))
                except json.JSONDecodeError:
                    raise HttpFailed(f"POST {path}: a stream event is not JSON: {data[:200]!r}") from None
            return Stream(t_sent, chunks)
        except (OSError, http.client.HTTPException) as exc:
            raise HttpFailed(f"POST {path} (stream): {exc.__class__.__name__}: {exc}") from None
        finally:
            conn.close()

    def stream_and_drop(self, path: str, body: dict[str, Any], events: int, timeout: float = 600.0) -> int:
        """POST ``body`` streamed, read ``events`` server-sent events, then hang up (a client that
        goes away mid-answer); the events read."""
        conn = self._conn(timeout)
        seen = 0
        try:
            conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise HttpFailed(f"POST {path}: HTTP {resp.status}: {resp.read()[:300]!r}")
            while seen < events:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    seen += 1
            return seen
        except (OSError, http.client.HTTPException) as exc:
            raise HttpFailed(f"POST {path} (stream): {exc.__class__.__name__}: {exc}") from None
        finally:
            conn.close()


@dataclass
class Stream:
    t_sent: float
    chunks: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def token_events(self) -> list[tuple[float, dict[str, Any]]]:
        """Events that carry generated text (a choice), in arrival order; usage-only events excluded."""
        return [(t, c) for t, c in self.chunks if c.get("choices")]

    def usage(self) -> dict[str, Any] | None:
        for _t, c in reversed(self.chunks):
            if isinstance(c.get("usage"), dict):
                return c["usage"]
        return None


def _decode(status: int, data: bytes, what: str) -> Any:
    if status != 200:
        raise HttpFailed(f"{what}: HTTP {status}: {data[:300]!r}")
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        raise HttpFailed(f"{what}: the answer is not JSON: {data[:200]!r}") from None


def _multipart(fields: dict[str, str], file_field: str, filename: str, content: bytes) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body (RFC 7578) of text fields and one file; the body and its
    Content-Type. The boundary is random: an upload that happens to contain it is vanishingly unlikely."""
    boundary = "edgectl-" + uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
             for name, value in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{file_field}"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
