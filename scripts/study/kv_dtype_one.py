"""One process: load the default-plan engine with a KV dtype (auto, fp8_e4m3, fp8_e5m2, or int8: edgectl's),
measure, dump JSON (fp8 study). Teacher-forced fidelity reads prompt logprobs: the prompt's attention, which
for int8 is the plugin's attention over the dequantized KV, not the decode kernel; the greedy continuations
(CONTINUATION tokens per prompt, top-20 logprobs a step) are the decode path, kv_dtype_table.py compares them.
``ROUND=int8|fp8``: the keys and values rounded as that KV would hold them, in the bf16 KV (kv_range.py)."""
import json
import os
import random
import sys
import time

WT = str(__import__("pathlib").Path(__file__).resolve().parents[2]); sys.path[:0] = [WT, WT + "/runtime"]
kv_dtype, order, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
vllm_kv_dtype = kv_dtype
if kv_dtype == "int8":  # edgectl's int8 KV: the plugin writes and reads vLLM's one-byte allocation
    os.environ.update(EDGECTL_DECODE_ATTENTION="1", EDGECTL_KV_INT8="1")
    vllm_kv_dtype = "fp8_e4m3"
model = os.environ.get("MODEL_DIR", "/var/lib/edgectl/models/smollm2-135m")
mml = int(os.environ.get("MML", "4096"))
kv_bytes = int(os.environ.get("KV_BYTES", "97320960"))
CONTINUATION = int(os.environ.get("CONTINUATION", "48"))  # greedy tokens per prompt on the decode path
if os.environ.get("STUDY_INIT_AMX") == "1":  # request the AMX tile permission up front (see docs/memory.md)
    import torch
    torch._C._cpu._init_amx()
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

llm = LLM(model=model, quantization=os.environ.get("QUANT", "cpu_int4") or None, enforce_eager=True, dtype="bfloat16",
          max_model_len=mml, max_num_seqs=1, max_num_batched_tokens=512, kv_cache_memory_bytes=kv_bytes,
          block_size=128, seed=0, kv_cache_dtype=vllm_kv_dtype, distributed_executor_backend="uni")
if os.environ.get("ROUND"):  # every key and value rounded as another KV dtype would hold them (kv_range.py)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kv_range
    llm.collective_rpc(kv_range.hook)
    kv_dtype = f"{kv_dtype}+round-{os.environ['ROUND']}"
eng = llm.llm_engine
rb = {"cache_dtype_config": eng.vllm_config.cache_config.cache_dtype}
def facts(worker):
    import torch
    kv = worker.model_runner.kv_caches
    t = kv[0] if isinstance(kv, list) else next(iter(kv.values()))
    impl = [m for m in worker.model_runner.model.modules() if hasattr(m, "impl") and hasattr(m.impl, "kv_cache_dtype")]
    return {"kv_tensor_dtype": str(t.dtype), "kv_layers": len(kv), "kv_bytes": sum(x.untyped_storage().nbytes() for x in {x.untyped_storage().data_ptr(): x for x in kv}.values()),
            "attn_impl_kv_dtype": sorted({m.impl.kv_cache_dtype for m in impl}), "isa": sorted({getattr(m, "isa", None) or "" for m in impl if hasattr(m, "isa")}),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
rb.update(llm.collective_rpc(facts)[0])
prompts = json.load(open(f"{WT}/edgectl/data/prompts/fidelity.json"))
tok = llm.get_tokenizer()
items = []
for text in prompts["prompts"] + [prompts["perplexity_text"]]:
    ids = tok.encode(text)
    r = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, temperature=0, logprobs=20, prompt_logprobs=20), use_tqdm=False)[0]
    pos = [None if e is None else {int(t): float(v.logprob) for t, v in e.items()} for e in r.prompt_logprobs]
    nxt = {int(t): float(v.logprob) for t, v in r.outputs[0].logprobs[0].items()}
    items.append({"ids": ids, "positions": pos, "next": nxt})
fid = {"method": "vllm-prompt-logprobs", "k": 20, "prompts": items[:-1], "perplexity": items[-1]}
# the decode path: greedy continuations (token 0 from the prompt's pass, tokens 1.. from decode steps, which
# for int8 are edgectl's decode kernel), each step's top-20 logprobs
conts = []
for text in prompts["prompts"]:
    r = llm.generate([TokensPrompt(prompt_token_ids=tok.encode(text))],
                     SamplingParams(max_tokens=CONTINUATION, temperature=0, logprobs=20, ignore_eos=True), use_tqdm=False)[0]
    conts.append({"ids": list(r.outputs[0].token_ids),
                  "logprobs": [{int(t): float(v.logprob) for t, v in e.items()} for e in r.outputs[0].logprobs]})
fid["continuations"] = conts
# speed: decode 128 tokens (ignore_eos), prefill 512 fresh random ids
sp = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
t0 = time.perf_counter(); llm.generate([prompts["decode_prompt"]], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False); t1 = time.perf_counter()
t2 = time.perf_counter(); r = llm.generate([prompts["decode_prompt"]], sp, use_tqdm=False); t3 = time.perf_counter()
decode = (128 - 1) / ((t3 - t2) - (t1 - t0))  # minus the prefill + first token of the same prompt
rng = random.Random(1000 + order)
ids = [rng.randrange(100, 49000) for _ in range(512)]
t4 = time.perf_counter(); llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False); t5 = time.perf_counter()
res = {"kv_cache_dtype": kv_dtype, "order": order, "readback": rb, "decode_tok_s": decode, "prefill_tok_s": 512 / (t5 - t4),
       "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "STUDY_INIT_AMX")}, "fidelity_raw": fid}
json.dump(res, open(out, "w"))
print(json.dumps({k: v for k, v in res.items() if k != "fidelity_raw"}))
os._exit(0)
