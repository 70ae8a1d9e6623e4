"""vLLM's compiled mode starting from its cache (``edgectl_runtime/vllm_plugin/compile_cache.py``), for real.

Each start is a fresh subprocess running this file as a script (vLLM's CPU backend spawns, so the
entry point is ``__main__``-guarded); starts of one test share a cache directory, as restarts of a
service do.

- The smallest case: one module under vLLM's ``@support_torch_compile``, compiled the way vLLM's CPU
  platform configures it. Unmodified, vLLM saves the graph and fails to load it in the next process
  (the bug ``compile_cache`` works around); with the fix the next process loads it and computes the
  same numbers, bit for bit.
- A tiny Llama through vLLM's engine with edgectl's ``cpu_int4`` plugin: the second start loads the
  graph the first compiled and generates the same tokens; a third start with another int4 group
  size compiles again (the graph has other weight shapes) instead of reusing the stale one.

Times are printed, never asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPTS = ["The capital of France is Paris. The capital of Italy is", "One, two, three, four, five"]


def _mini_main(argv: list[str]) -> int:
    """One decorated module, compiled (or loaded) once; prints its output and the read-back."""
    import hashlib
    import time

    import torch
    from torch import nn

    with_fix = argv[0] == "fix"
    if with_fix:
        from edgectl_runtime.vllm_plugin import compile_cache

        compile_cache.install({"EDGECTL_COMPILE_CACHE": "1"})
    from vllm.compilation.counter import compilation_counter as counter
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import (
        CompilationConfig,
        CompilationMode,
        VllmConfig,
        set_current_vllm_config,
    )

    @support_torch_compile(dynamic_arg_dims={"x": 0})
    class Mini(nn.Module):
        def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x)) * 2 + x.sum(-1, keepdim=True)

    # VLLM_COMPILE is what `--compilation default` asks for; the CPU platform turns it into
    # DYNAMO_TRACE_ONCE with the "inductor" backend (vllm/platforms/cpu.py:356-377).
    cfg = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    with set_current_vllm_config(cfg):
        torch.manual_seed(0)
        m = Mini(vllm_config=cfg)
        x = torch.randn(8, 64)
        with torch.no_grad():
            t0 = time.monotonic()
            y = m(x)
            first_call_s = time.monotonic() - t0
            eager = m.forward(x)
    print(json.dumps({
        "mode": str(cfg.compilation_config.mode), "backend": cfg.compilation_config.backend,
        "first_call_s": round(first_call_s, 2), "aot_compiles": counter.num_aot_compiles,
        "aot_loaded": counter.num_aot_artifacts_loaded, "aot_saved": counter.num_aot_artifacts_saved,
        "output_sha256": hashlib.sha256(y.numpy().tobytes()).hexdigest(),
        "max_abs_diff_vs_eager": float((y - eager).abs().max()),
        "facts": compile_cache.facts(cfg) if with_fix else None,
    }))
    return 0


def _engine_main(argv: list[str]) -> int:
    """A tiny Llama in vLLM's engine (compiled mode, cpu_int4); prints tokens and the read-back."""
    import time

    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(model=argv[0], quantization="cpu_int4", dtype="bfloat16", max_model_len=256, max_num_seqs=1,
              max_num_batched_tokens=256, kv_cache_memory_bytes=16 << 20, seed=0,
              worker_extension_cls="edgectl_runtime.service.readback.ReadbackExtension")
    ready_s = time.monotonic() - t0
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0))
    facts = llm.collective_rpc("edgectl_effective")[0]
    print(json.dumps({"ready_s": round(ready_s, 1), "generated": [list(o.outputs[0].token_ids) for o in outs],
                      "compile": {k: v for k, v in facts["compile"].items() if k != "key"},
                      "key": facts["compile"]["key"]["digest"], "formats": facts["linear_format_counts"]}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "mini":
        sys.exit(_mini_main(sys.argv[2:]))
    sys.exit(_engine_main(sys.argv[2:]))


# ---------------------------------------------------------------------------------------------
# The tests (pytest side)

import pytest  # noqa: E402
from int4_helpers import build_tiny_llama, read_json_line, run_runtime  # noqa: E402

pytestmark = pytest.mark.engine


def _start(kind: str, arg: str, cache: Path, env: dict[str, str] | None = None) -> tuple[dict, str]:
    extra = {"VLLM_CACHE_ROOT": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
             "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})}
    done = run_runtime([str(Path(__file__).resolve()), kind, arg], extra_env=extra, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return read_json_line(done.stdout), done.stdout + done.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("vllm")
    return tmp_path_factory.mktemp("compile-cache")


def test_unmodified_vllm_discards_the_graph_it_saved(work):
    """The bug (vLLM 0.32, torch 2.13): the second process finds the artifact and throws it away.

    If this starts failing, vLLM or torch fixed it: ``compile_cache.install_load_fix`` then
    installs nothing (it checks) and can go.
    """
    cache = work / "mini-unfixed"
    first, _ = _start("mini", "nofix", cache)
    second, log = _start("mini", "nofix", cache)
    assert (first["mode"], first["backend"]) == ("2", "inductor")  # DYNAMO_TRACE_ONCE, torch's inductor
    assert first["aot_saved"] == 1
    assert second["aot_loaded"] == 0 and second["aot_compiles"] == 1
    assert "Compiling model again due to a load failure" in log
    assert "'function' object has no attribute 'finalize_loading'" in log
    print(f"\nunmodified: first call {first['first_call_s']} s, "
          f"next process {second['first_call_s']} s (compiled again)")


def test_with_the_fix_the_next_process_loads_the_same_graph(work):
    cache = work / "mini-fixed"
    first, _ = _start("mini", "fix", cache)
    second, log = _start("mini", "fix", cache)
    assert first["facts"]["source"] == "compiled" and first["aot_saved"] == 1
    assert second["facts"]["source"] == "cache", log[-3000:]
    assert (second["aot_loaded"], second["aot_compiles"]) == (1, 0)
    assert "load failure" not in log
    assert second["output_sha256"] == first["output_sha256"]
    assert second["max_abs_diff_vs_eager"] < 1e-4
    print(f"\nfixed: compiled in {first['first_call_s']} s, loaded in {second['first_call_s']} s")


def test_a_setting_change_compiles_again_and_the_same_settings_load(work):
    """Same settings: the second start loads and generates the same tokens. Another int4 group
    size (other weight shapes in the graph): compiled again, never the stale graph. The load
    fails on vLLM alone; vLLM's own key would not see the group size."""
    model = build_tiny_llama(work / "tiny")
    cache = work / "engine-cache"
    levers = {"EDGECTL_COMPILE_CACHE": "1", "EDGECTL_INT4_GROUP_SIZE": "64"}
    cold, _ = _start("engine", str(model), cache, levers)
    warm, warm_log = _start("engine", str(model), cache, levers)
    other, _ = _start("engine", str(model), cache, {**levers, "EDGECTL_INT4_GROUP_SIZE": "32"})
    print(f"\ncold {cold['ready_s']} s (compile {cold['compile']['compile_s']} s), warm {warm['ready_s']} s "
          f"(load {warm['compile']['load_s']} s), group size changed {other['ready_s']} s")

    assert cold["compile"]["source"] == "compiled" and cold["compile"]["aot_saved"] == 1
    # the kernels' precompiled header is kept in the inductor cache, not in /tmp (which a unit with
    # PrivateTmp= loses at every start, and with it 6-8 s of the next load)
    assert list((cache / "inductor" / "precompiled_headers").glob("*.gch")), sorted(cache.rglob("*"))[:40]
    assert warm["compile"]["source"] == "cache", warm_log[-3000:]
    assert warm["compile"]["artifact"] == cold["compile"]["artifact"]
    assert warm["generated"] == cold["generated"]
    assert "load failure" not in warm_log
    # inductor's ISA probe (x86 only, torch/_inductor/cpu_vec_isa.py): the cold start probed and
    # recorded it; the warm one trusted the record where every ISA passed
    records = list((cache / "edgectl").glob("inductor-vec-isa-*.json"))
    if cold["compile"]["vec_isa"] is None:
        assert not records  # nothing probed (not x86)
    else:
        assert cold["compile"]["vec_isa"] == "probed" and len(records) == 1
        record = json.loads(records[0].read_text())
        assert warm["compile"]["vec_isa"] == ("recorded" if record["valid"] == record["candidates"] else "probed")

    assert other["compile"]["source"] == "compiled"
    assert other["key"] != cold["key"] and other["compile"]["artifact"] != cold["compile"]["artifact"]
    assert any(f.startswith("cpu_int4/g32") for f in other["formats"]), other["formats"]
    assert not any(f.startswith("cpu_int4/g64") for f in other["formats"]), other["formats"]
