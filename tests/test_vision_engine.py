"""A vision-language model planned and served by the real worker (vLLM's engine, one start): a tiny shape
of synth-smolvlm-256m's spec (a 2-layer language model with the tests' stub of SmolLM2's tokenizer, a
2-layer tower on 64x64 tiles, made by the maker as tests/test_models_synthetic_vision.py makes it). The
worker says READY only after its warm-up answered the shipped image through the image guard (the plan as it
comes, its language model in edgectl's 8-bit blocks, and dense bf16); then one
chat completion with that image is answered, a request whose image is not one is refused 400 by the
guard, and the service goes on answering. Nothing here asserts timing or the answer's sense (random
weights)."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from installed import RUNTIME_PYTHON
from models_helpers import REPO, SHAPES
from test_models_synthetic_vision import TINY, TINY_TEXT, _make
from test_worker import _env, _free_port, _get, _worker

from edgectl.contract.worker import WARMUP_IMAGE

pytestmark = [pytest.mark.engine]


# vLLM's CPU paged attention takes no head of 16 (test_models_synthetic_vision's tiny LM): one head of 64
TEXT = {**TINY_TEXT, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64}


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The maker's output around a 2-layer LlamaForCausalLM with seeded weights and the tests' stub of
    SmolLM2's tokenizer (as tests/test_models_synthetic_vision.py's ``tiny_lm``, one attention head of 64)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    lm = tmp_path_factory.mktemp("lm")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (lm / f).write_bytes((SHAPES / "smollm2-135m" / f).read_bytes())
    (lm / "config.json").write_text(json.dumps(TEXT))
    g = torch.Generator().manual_seed(0)
    h, i = 64, 128
    shapes = {"model.embed_tokens.weight": (64, h), "model.norm.weight": (h,)}
    for n in range(2):
        p = f"model.layers.{n}."
        shapes |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h, h),
                   p + "self_attn.v_proj.weight": (h, h), p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    save_file({n: (torch.randn(s, generator=g) * 0.1).to(torch.bfloat16) for n, s in shapes.items()},
              str(lm / "model.safetensors"))
    out = tmp_path_factory.mktemp("vlm") / "tiny-vlm"
    _make(out, lm, {**TINY.maker_spec(), "vocab_size": 128})
    return out


def _chat(port: int, url: str) -> tuple[int, dict]:
    body = {"model": "tiny-vlm", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    return r.status, json.loads(r.read())


# the plan as it comes runs edgectl's kernels in a compiled graph: the AVX2 tier runs it again, held to AVX2
# edgectl's int8 KV too (its kernels at the AVX2 level there): written and read by edgectl alone
@pytest.mark.parametrize("fmt,kv", [pytest.param(None, None, marks=pytest.mark.isa_avx2), ("bf16", None),
                                    pytest.param("bf16", "int8", marks=pytest.mark.isa_avx2)])
def test_a_vision_plan_is_served_answers_an_image_and_refuses_a_bad_one(tmp_path, tiny_vlm, fmt, kv):
    """The plan as it comes (on x86, where edgectl's kernels run: the language model in their 8-bit blocks,
    compiled, the tower bf16), dense bf16 as asked, and that with edgectl's int8 KV."""
    port = _free_port()
    asked = (["--format", fmt] if fmt else []) + (["--kv-cache-dtype", kv] if kv else [])
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", str(tiny_vlm), "--max-model-len", "512", "--json",
                          *asked], capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["vision"]["images"]["max_images_per_request"] == 1
    assert plan["weight_format"] == (fmt or "w8a8"), plan["weight_format"]
    plan["serve"]["port"] = port
    plan["model"]["name"] = "tiny-vlm"
    if fmt == "bf16":  # edgectl's decode attention asked for on every host (off by default on AMX hosts)
        plan["levers"]["decode_attention"] = True
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
        # READY came after the warm-up's answer about the shipped image, which the guard counted
        status, effective = _get(f"http://127.0.0.1:{port}/edgectl/effective", timeout=30)
        assert status == 200 and effective["images_served"] == 1 and effective["image_requests"] == 1, effective
        good = "data:image/png;base64," + base64.b64encode(WARMUP_IMAGE.read_bytes()).decode()
        status, answer = _chat(port, good)
        assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
        bad = "data:image/png;base64," + base64.b64encode(b"%PDF-1.7 not an image").decode()
        status, refused = _chat(port, bad)
        assert status == 400 and "is not an image" in refused["error"]["message"], refused
        status, again = _chat(port, good)  # still serving
        assert status == 200 and again["usage"]["completion_tokens"] >= 1, again
        effective = _get(f"http://127.0.0.1:{port}/edgectl/effective", timeout=30)[1]
        assert effective["images_served"] == 3
        # decode steps took edgectl's attention where the plan says so (prefill and the tower: vLLM's), over
        # vLLM's KV in its "vec" layout, on AMX hosts too (asked there: the dense plan below asks on every host)
        attention = effective["decode_attention"]
        if kv == "int8":  # every decoder call on edgectl's: decode steps on its int8 kernel, prompts on the dequantized KV
            assert plan["levers"]["decode_attention"] is True and plan["kv_cache_dtype"] == "int8", plan["levers"]
            assert effective["kv_cache_dtype"] == ["int8"] and effective["kv_tensor_dtypes"] == ["uint8"], effective
            calls = attention["calls"]
            assert calls["edgectl"] > 0 and calls["edgectl_prefill"] > 0 and calls["vllm"] == 0, attention
        elif plan["levers"]["decode_attention"]:
            assert attention["kernel"] == "edgectl" and attention["calls"]["edgectl"] > 0 < attention["calls"]["vllm"], \
                attention
            assert effective["attention_isa"] == ["vec"], effective["attention_isa"]
        else:  # the AMX host's default: vLLM's AMX attention, as fast there
            assert attention["kernel"] == "vllm", attention
        counts, quant = effective["linear_format_counts"], effective["quantization_readback"]
        if fmt is None:  # the language model's layers and head in 8-bit blocks, the tower's and connector's bf16
            assert quant["parts"] == "language-model", quant
            assert quant["dense_parts"] == ["model.connector", "model.vision_model"], quant
            # 2 layers x (qkv, o, gate_up, down) and the head; 2 tower layers x (qkv, out, fc1, fc2) and the connector
            assert counts == {"w8a8/b32": 9, "w8a8/b32-tied-embedding": 1, "bf16": 9}, counts
        else:  # every linear layer dense
            assert set(counts) <= {"bf16", "bf16-tied-embedding"}, counts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
