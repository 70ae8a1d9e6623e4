"""EDGECTL_EMBEDDING_PACK (runtime/edgectl_runtime/vllm_plugin/embedding.py): which dense embedding tables
keep vLLM's prepacked GEMM copy. Runs vLLM's own method on stand-in layers in a subprocess of the
runtime interpreter (vLLM's classes are patched per process)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import isa_helpers
import pytest

pytestmark = pytest.mark.isa_avx2

REPO = Path(__file__).resolve().parent.parent
PYTHON = "/opt/edgectl/venv/bin/python"

CODE = r"""
import json, os, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead, UnquantizedEmbeddingMethod, VocabParallelEmbedding)
from edgectl_runtime.vllm_plugin import embedding

mode = embedding.install(os.environ)

def layer(cls):
    m = cls.__new__(cls)
    torch.nn.Module.__init__(m)
    g = torch.Generator().manual_seed(0)
    m.weight = torch.nn.Parameter(torch.randn(512, 64, generator=g).to(torch.bfloat16), requires_grad=False)
    return m

embed, head = layer(VocabParallelEmbedding), layer(ParallelLMHead)
method = UnquantizedEmbeddingMethod()
for m in (embed, head):
    method.process_weights_after_loading(m)
x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
ref = torch.nn.functional.linear(x.float(), head.weight.float())
ref_embed = torch.nn.functional.linear(x.float(), embed.weight.float())
out = {"mode": mode, "states": {n: s["state"] for n, s in
       zip(("embed", "head"), embedding.packed_copies(torch.nn.ModuleDict({"embed": embed, "head": head})))},
       "head_error": float((head.cpu_linear(x, head.weight, None).float() - ref).abs().max()),
       "embed_error": float((embed.cpu_linear(x, embed.weight, None).float() - ref_embed).abs().max()),
       "head_scale": float(ref.abs().max()), "embed_scale": float(ref_embed.abs().max())}
print(json.dumps(out))
"""


def _run(mode: str) -> dict:
    if not Path(PYTHON).exists():
        pytest.skip("the runtime venv is not installed (scripts/setup.sh)")
    env = {"PATH": "/usr/bin:/bin", "EDGECTL_EMBEDDING_PACK": mode, "HF_HUB_OFFLINE": "1",
           **isa_helpers.tier_environment([str(REPO), str(REPO / "runtime")])}
    out = subprocess.run([PYTHON, "-c", CODE], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _kept() -> str:
    """What a table left to vLLM reads back: ISA-dependent (isa_helpers.vllm_packs_bf16_gemm): a
    packed copy with AMX or AVX-512, none on AVX2 (oneDNN builds no bf16 matmul there)."""
    return "packed" if isa_helpers.vllm_packs_bf16_gemm(isa_helpers.host_isa()) else "no packed kernel"


def test_lm_head_mode_packs_only_the_layer_that_computes_logits():
    got = _run("lm-head")
    assert got["states"] == {"embed": "not packed", "head": _kept()}
    # both still multiply correctly: within bf16's rounding of the outputs (8 significant bits: a
    # result near 20 is off by up to 0.06 on a path that rounds once, more where it accumulates in
    # bf16), far below what a wrong product would give (of the order of the outputs themselves)
    assert got["head_error"] < 0.02 * got["head_scale"] and got["embed_error"] < 0.02 * got["embed_scale"], got


def test_vllm_mode_is_unmodified_vllm_both_packed_where_the_cpu_can():
    assert _run("vllm")["states"] == {"embed": _kept(), "head": _kept()}
