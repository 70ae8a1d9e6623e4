"""A llama.cpp pair pulled with `edgectl models pull FILE.gguf --mmproj FILE`, planned and served by the
real worker (vLLM's engine, one start): the tiny pair of tests/test_models_pull_pair.py (llama.cpp's
converter on the maker's tiny Idefics3 directory, one attention head of 64 as vLLM's CPU paged attention
takes), turned back into a directory by the pull. The worker says READY only after its warm-up answered
the shipped image; then a chat completion with that image is answered. Nothing here asserts timing or the
answer's sense (random weights). Needs the runtime, a llama.cpp build and the pulled smollm2-135m's
tokenizer; skipped, saying which is missing, without them."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from installed import RUNTIME_PYTHON
from models_helpers import REPO, run_cli
from test_models_pull_pair import make_tiny_pair
from test_vision_engine import _chat
from test_worker import _env, _free_port, _get, _worker

from edgectl.contract.worker import WARMUP_IMAGE

pytestmark = [pytest.mark.engine]


def test_a_pulled_llama_cpp_pair_is_planned_and_answers_an_image(tmp_path: Path) -> None:
    pair = make_tiny_pair(tmp_path / "pair", heads=1, kv_heads=1, head_dim=64, outtypes=("bf16",))
    cache = tmp_path / "cache"
    pulled = run_cli(["models", "pull", str(pair["text"]), "--mmproj", str(pair["mmproj"]), "--name", "tiny-vlm",
                      "--json"], env={"EDGECTL_MODEL_CACHE": str(cache)}, timeout=600)
    assert pulled.returncode == 0, pulled.stderr
    model = Path(json.loads(pulled.stdout)["path"])
    assert model == cache / "tiny-vlm"

    port = _free_port()
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", str(model), "--max-model-len", "512", "--json"],
                         capture_output=True, text=True, timeout=120, env=_env({"EDGECTL_MODEL_CACHE": str(cache)}),
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["vision"]["images"]["max_images_per_request"] == 1
    plan["serve"]["port"] = port
    plan["model"]["name"] = "tiny-vlm"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    proc = _worker(path, python=RUNTIME_PYTHON)
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(proc.stdout.read()[-4000:])
            try:
                if _get(f"http://127.0.0.1:{port}/edgectl/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the worker did not become ready")
        status, effective = _get(f"http://127.0.0.1:{port}/edgectl/effective", timeout=30)
        assert status == 200 and effective["images_served"] == 1, effective  # the warm-up's image
        image = "data:image/png;base64," + base64.b64encode(WARMUP_IMAGE.read_bytes()).decode()
        status, answer = _chat(port, image)
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
        assert answer["usage"]["prompt_tokens"] > 20, answer  # the image's tokens are in the prompt
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
