"""A stand-in server for testing the bench's *rules* (not a stand-in for any measurement).

A test double: it lives under tests/ and never ships. It speaks the few HTTP endpoints the bench
uses, in the dialect of the launcher it replaces, and takes that launcher's own command line
after ``--``:

    python fake_server.py [OPTIONS] -- --plan FILE            # edgectl's worker
    python fake_server.py [OPTIONS] -- --vllm ARGS...          # vLLM's OpenAI server
    python fake_server.py [OPTIONS] -- --llama ARGS...         # llama-server

OPTIONS make it misbehave the ways real engines have: ``--sabotage kv`` reports half the
asked KV bytes (a setting that did not take effect), ``--crash-on-start N --state FILE`` exits
before ready on its N-th start, ``--child-alloc-mb M`` starts a child process that holds M MB
(memory that only a whole-tree measurement sees), ``--alloc-mb M`` holds M MB itself,
``--ready-delay S`` answers 503 at first; ``--serial-streams`` streams one completion at a time
(a server that queues concurrent requests instead of batching them); ``--decode-ms M`` takes M ms
per streamed token (2 by default); ``--leak-kb-per-request K`` keeps K KiB for good at every
completion (a leak, for the soak); ``--sabotage recompile`` compiles its "graph" at every start
instead of loading the one it left in ``VLLM_CACHE_ROOT`` (a compile cache that does not load);
``--sabotage group`` quantizes every int4 layer in groups of 32 whatever group the plan asks for;
``--log-from FILE`` prints a real server's captured log first (what llama-server logged loading a model).
Standard library only, plus edgectl's plan type (it reads its plan file as the worker does);
the bench's tests start it as a real process on a real port.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from edgectl.contract import int4_layout, worker
from edgectl.contract.effective import KV_TENSOR_DTYPE
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.plan import Plan

VOCAB = 49152
SERIAL = threading.Lock()  # --serial-streams: one streamed completion at a time
LEAKED: list[bytes] = []
K_MAX = 20


def token_ids(text: str) -> list[int]:
    return [256 + int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "big") % (VOCAB - 256)
            for w in text.split()]


def distribution(prev: int, k: int) -> dict[int, float]:
    """A deterministic next-token distribution: k ids with geometric probabilities."""
    out = {}
    for j in range(k):
        tid = (prev * 7919 + j * 104729 + 13) % VOCAB
        out[tid] = math.log(0.5 ** (j + 1))
    return out


class State:
    def __init__(self, ns: argparse.Namespace, mode: str, rest: list[str]) -> None:
        self.ns = ns
        self.mode = mode
        self.started = time.monotonic()
        self.plan: Plan | None = None
        self.args: dict[str, str] = {}
        self.graph: dict[str, Any] = {"source": None}
        if mode == "worker":
            self.plan = Plan.load(rest[rest.index("--plan") + 1])
            self.port = self.plan.serve.port
            self.name = self.plan.model.name
            if str(self.plan.compilation) == "default":  # the compile cache, as the worker reads it back
                marker = Path(os.environ["VLLM_CACHE_ROOT"]) / "fake-graph"
                cached = marker.exists() and ns.sabotage != "recompile"
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text("graph")
                self.graph = {"source": "cache", "load_s": 0.1} if cached else {"source": "compiled", "compile_s": 1.0}
        else:
            i = 0
            while i < len(rest):  # "--flag value" pairs; a flag followed by another flag has no value
                has_value = i + 1 < len(rest) and not rest[i + 1].startswith("-")
                self.args[rest[i]] = rest[i + 1] if has_value else "1"
                i += 2 if has_value else 1
            self.port = int(self.args["--port"])
            self.name = self.args.get("--served-model-name") or self.args.get("--alias") or "fake"

    def max_model_len(self) -> int:
        if self.plan is not None:
            return self.plan.max_model_len
        if "--max-model-len" in self.args:
            return int(self.args["--max-model-len"])
        return int(self.args.get("-c", 4096)) // int(self.args.get("-np", 1))

    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.ns.ready_delay

    def processes(self) -> int:
        return 1 + (1 if CHILD else 0)

    # -- read-back, as each server reports it
    def worker_effective(self) -> dict[str, Any]:
        p = self.plan
        assert p is not None
        kv = p.kv_cache_bytes // 2 if self.ns.sabotage == "kv" else p.kv_cache_bytes
        int4 = p.weight_format.is_int4
        c = json.loads((Path(p.model.path) / "config.json").read_text())
        c = c.get("text_config", c)  # a vision-language model's language model
        widths = {f"model.layers.{i}.{n}": k for i in range(2) for n, k in (
            ("self_attn.qkv_proj", c["hidden_size"]), ("self_attn.o_proj", c["hidden_size"]),
            ("mlp.down_proj", c["intermediate_size"]))}
        # each layer's group by the plan's rule, as edgectl's runtime quantizes at load
        group = (lambda k: 32) if self.ns.sabotage == "group" else (
            lambda k: int4_layout.choose_group_size(k, p.group_size))
        layers = {name: (f"cpu_int4/g{group(k)}" if int4 else "bf16") for name, k in widths.items()}
        head = "cpu_int4/g64-tied-embedding" if p.quantize_lm_head else "bf16-tied-embedding"
        readback: dict[str, Any] = {}
        if p.vision is None and p.weight_format == "w4a8":  # edgectl's blocks and their int8 head, as the worker reads back
            layers = {name: "w4a8/b32" for name in layers}
            head = "w8a8/b32-tied-embedding"
        if p.vision is not None and int4:  # the language model in edgectl's blocks, the tower and connector bf16
            blocks = "w8a8/b32" if p.weight_format == "w8a8" else "w4a8/b32"
            layers = {name: blocks for name in layers} | {
                "model.vision_model.encoder.layers.0.mlp.fc1": "bf16", "model.connector.modality_projection.proj": "bf16"}
            head = "w8a8/b32-tied-embedding"
            readback = {"quantization_readback": {"method": "cpu_int4", "parts": "language-model",
                                                  "dense_parts": ["model.connector", "model.vision_model"]}}
        return {**readback,"schema": EFFECTIVE_SCHEMA, "max_model_len": p.max_model_len,
                "max_num_seqs": p.max_num_seqs, "kv_cache_bytes": kv, "threads": p.threads,
                "rope_rows": {"model.layers.0.self_attn.rotary_emb": p.rope_rows},
                "linear_formats": {**layers, "lm_head": head}, "lm_head_format": head,
                "linear_in_features": widths,
                "processes": self.processes(), "resident": {"parameters_bytes": p.memory.weights_bytes,
                                                            "outside_parameters_bytes": 0},
                # the memory levers and the KV dtype as the worker reads them back; the optimize
                # level is this process's own (the launcher passes -OO as the worker's command does)
                "kv_cache_dtype": [str(p.kv_cache_dtype)],
                "kv_tensor_dtypes": [KV_TENSOR_DTYPE[str(p.kv_cache_dtype)]],
                "python_optimize": sys.flags.optimize,
                "optional_imports": {n: "kept out" if p.levers.optional_imports == "skip" else "not imported"
                                     for n in ("opentelemetry", "cv2", "accelerate")},
                "idle_trim": {"enabled": p.levers.idle_trim, "available": True},
                "tokenizer": {"lean": p.levers.tokenizer == "lean", "processor_loaded": p.levers.tokenizer != "lean",
                          "construction_inputs": {"held": [] if p.levers.tokenizer == "lean" else ["_vocab", "_merges"],
                                                  "read_after_init": []}},
                "embedding_pack": {} if p.quantize_lm_head else {
                    "model.embed_tokens": {"state": "not packed" if p.levers.embedding_pack == "lm-head" else "packed",
                                           "lm_head": False},
                    "lm_head": {"state": "packed", "lm_head": True}},
                "compile": self.graph, "phase": worker.SERVING if self.ready() else "loading"}

    def vllm_config(self) -> dict[str, Any]:
        return json.loads((Path(self.args["--model"]) / "config.json").read_text())

    def kv_bytes_per_token(self) -> int:
        c = self.vllm_config()
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2 * c["num_hidden_layers"]

    def metrics(self) -> str:
        block = int(self.args.get("--block-size", 128))
        kv = int(self.args.get("--kv-cache-memory-bytes", 1 << 30))
        if self.ns.sabotage == "kv":
            kv //= 2
        blocks = kv // (block * self.kv_bytes_per_token())
        return ("# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="{block}",engine="0",enable_prefix_caching="True",'
                f'kv_cache_memory_bytes="{kv}",num_gpu_blocks="{blocks}"}} 1.0\n')

    def describe(self) -> dict[str, Any]:
        rows = int(self.vllm_config().get("max_position_embeddings", 2048))
        layers = [{"name": f"model.layers.0.{n}", "kind": "linear", "format": "bf16"}
                  for n in ("self_attn.qkv_proj", "mlp.down_proj")]
        layers.append({"name": "lm_head", "kind": "lm_head", "format": "bf16-tied-embedding"})
        return {"schema": "edgectl.readback/1", "quantization": None, "layers": layers,
                "formats": {"bf16": 2, "bf16-tied-embedding": 1},
                "rope": [{"name": "model.layers.0.self_attn.rotary_emb", "rows": rows}],
                "resident": {"parameters_bytes": 1000, "outside_parameters_bytes": 2000},
                "kernel": {"torch_threads": _vllm_threads()}}


def _vllm_threads() -> int:
    """Unmodified vLLM's OpenMP threads: the bound CPUs when VLLM_CPU_OMP_THREADS_BIND lists them;
    on its own ("auto") on a 2-core host it keeps a core for the front end, so 1."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if bind == "auto":
        return 1
    return sum(len(range(int(a), int(b or a) + 1)) for a, _, b in (part.partition("-") for part in bind.split(",")))


STATE: State
CHILD: subprocess.Popen | None = None
BALLAST: bytes = b""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the bench keeps the log
        pass

    def _send(self, status: int, body: Any, ctype: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        s = STATE
        if self.path == "/health":
            self._send(200 if s.ready() else 503, {})
        elif self.path == worker.EFFECTIVE_ROUTE and s.mode == "worker":
            self._send(200, s.worker_effective())
        elif self.path == "/v1/models" and s.mode == "vllm":
            self._send(200, {"data": [{"id": s.name, "max_model_len": int(s.args["--max-model-len"])}]})
        elif self.path == "/metrics" and s.mode == "vllm":
            self._send(200, s.metrics(), "text/plain")
        elif self.path == "/props" and s.mode == "llama":
            self._send(200, {"default_generation_settings": {"n_ctx": int(s.args["-c"]) // int(s.args.get("-np", 1))},
                             "total_slots": int(s.args.get("-np", 1)), "model_path": s.args["-m"],
                             "modalities": {"vision": "--mmproj" in s.args, "audio": False}})
        else:
            self._send(404, {"error": self.path})

    def do_POST(self) -> None:  # noqa: N802
        s = STATE
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/collective_rpc" and s.mode == "vllm":
            self._send(200, {"results": [s.describe()]})
        elif self.path == "/tokenize":
            self._send(200, {"tokens": token_ids(body.get("prompt") or body.get("content") or "")})
        elif self.path == "/completion" and s.mode == "llama":
            ids = body["prompt"] if isinstance(body["prompt"], list) else token_ids(body["prompt"])
            top = distribution(ids[-1], int(body.get("n_probs", 1)))
            self._send(200, {"content": " x", "completion_probabilities": [
                {"id": 1, "top_logprobs": [{"id": t, "logprob": lp} for t, lp in top.items()]}]})
        elif self.path == "/v1/completions":
            self._leak()
            self.completions(body)
        elif self.path == "/v1/chat/completions" and body.get("stream"):
            self._leak()
            self._stream(chat_prompt_ids(body), int(body.get("max_tokens", 16)), chat=True)
        elif self.path == "/v1/chat/completions":
            self._leak()
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."},
                                          "finish_reason": "stop"}], "usage": {"completion_tokens": 2}})
        else:
            self._send(404, {"error": self.path})

    def _leak(self) -> None:
        if STATE.ns.leak_kb_per_request:  # --leak-kb-per-request: memory no request gives back
            with SERIAL:
                LEAKED.append(b"\x01" * (STATE.ns.leak_kb_per_request << 10))

    def completions(self, body: dict[str, Any]) -> None:
        prompt = body.get("prompt")
        ids = prompt if isinstance(prompt, list) else token_ids(str(prompt))
        n = int(body.get("max_tokens", 16))
        if len(ids) + n > STATE.max_model_len():  # as vLLM refuses it
            self._send(400, {"error": {"message": f"{len(ids)} prompt + {n} tokens exceed the context"}})
            return
        time.sleep(0.00002 * len(ids))  # "prefill"
        if body.get("stream"):
            if STATE.ns.serial_streams:
                with SERIAL:
                    self._stream(ids, n)
            else:
                self._stream(ids, n)
            return
        self._answer(body, ids)

    def _stream(self, ids: list[int], n: int, chat: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            if i:
                time.sleep(STATE.ns.decode_ms / 1000)  # "decode"
            token = {"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"}
            chunk = {"choices": [{"index": 0, **token, "finish_reason": "length" if i == n - 1 else None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": len(ids), "completion_tokens": n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _answer(self, body: dict[str, Any], ids: list[int]) -> None:
        k = int(body.get("logprobs") or 0)
        choice: dict[str, Any] = {"index": 0, "text": " t0", "finish_reason": "length"}
        if k:
            top = distribution(ids[-1], k)
            choice["logprobs"] = {"top_logprobs": [{f"token_id:{t}": lp for t, lp in top.items()}]}
        pk = body.get("prompt_logprobs")
        if pk:
            positions: list[Any] = [None]
            for i in range(1, len(ids)):
                d = {str(t): {"logprob": lp} for t, lp in distribution(ids[i - 1], int(pk)).items()}
                d.setdefault(str(ids[i]), {"logprob": -12.0})  # vLLM always adds the actual token
                positions.append(d)
            choice["prompt_logprobs"] = positions
        self._send(200, {"choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": 1}})


# A 512x512 image's prompt tokens in the shape model (docs/vision.md: 17 tiles x 64, and their markers)
IMAGE_TOKENS = 1140


def chat_prompt_ids(body: dict[str, Any]) -> list[int]:
    """A chat request's "prompt": its text's token ids, and IMAGE_TOKENS per image part."""
    ids: list[int] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        for part in content if isinstance(content, list) else [{"type": "text", "text": str(content)}]:
            ids += [0] * IMAGE_TOKENS if part.get("type") == "image_url" else token_ids(str(part.get("text", "")))
    return ids


def main(argv: list[str]) -> int:
    global STATE, CHILD, BALLAST
    if "--" not in argv:
        print("usage: fake_server.py [OPTIONS] -- (--plan FILE | --vllm ARGS | --llama ARGS)", file=sys.stderr)
        return 2
    cut = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--sabotage", choices=["kv", "recompile", "group"])
    parser.add_argument("--crash-on-start", type=int)
    parser.add_argument("--state")
    parser.add_argument("--child-alloc-mb", type=int, default=0)
    parser.add_argument("--alloc-mb", type=int, default=0)
    parser.add_argument("--ready-delay", type=float, default=0.3)
    parser.add_argument("--serial-streams", action="store_true")
    parser.add_argument("--decode-ms", type=float, default=2.0)
    parser.add_argument("--leak-kb-per-request", type=int, default=0)
    parser.add_argument("--log-from")
    ns = parser.parse_args(argv[:cut])
    rest = argv[cut + 1:]
    mode = "worker" if rest[0] == "--plan" else rest[0].lstrip("-")
    if mode not in ("worker", "vllm", "llama"):
        print(f"unknown mode {rest[0]}", file=sys.stderr)
        return 2
    if ns.crash_on_start:
        state = Path(ns.state)
        starts = int(state.read_text()) + 1 if state.exists() else 1
        state.write_text(str(starts))
        if starts == ns.crash_on_start:
            print(f"fake server: crashing on start {starts}", flush=True)
            time.sleep(0.2)
            return 1
    STATE = State(ns, mode, rest if mode == "worker" else rest[1:])
    if ns.alloc_mb:
        BALLAST = b"\x01" * (ns.alloc_mb << 20)  # held by the server process itself
    if STATE.plan is not None and STATE.plan.topology == "stock" and not ns.child_alloc_mb:
        ns.child_alloc_mb = 1  # vLLM's own topology: the engine runs in a child process
    if ns.child_alloc_mb:
        # The child fills its memory (b"\x01" * n touches every page) and says so before the parent serves.
        CHILD = subprocess.Popen([sys.executable, "-c",
                                  f"import sys,time; b = b'\\x01' * ({ns.child_alloc_mb} << 20); "
                                  "print('held', flush=True); time.sleep(3600)"], stdout=subprocess.PIPE)
        assert CHILD.stdout is not None
        CHILD.stdout.readline()
    if ns.log_from:  # a real server's captured log, as if this one had loaded that model
        print(Path(ns.log_from).read_text(), end="", flush=True)
    if mode == "llama":
        print(f"system_info: n_threads = {STATE.args.get('-t')} (n_threads_batch = {STATE.args.get('-tb')})",
              flush=True)
    print(f"fake server ({mode}) on port {STATE.port}, pid {os.getpid()}", flush=True)
    server = ThreadingHTTPServer(("127.0.0.1", STATE.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main(sys.argv[1:]))
