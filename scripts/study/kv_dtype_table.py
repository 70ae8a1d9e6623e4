"""Summarise a KV-dtype study directory (kv_dtype_study.sh): speed medians and fidelity of each
fp8 KV dtype against bf16 KV ("auto") of the same pass, teacher-forced over the shipped prompts."""
import json
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
from edgectl.contract.fidelity import compare, perplexity  # noqa: E402

d = Path(sys.argv[1])  # the study's output directory, or the combined artifact under results/
loaded = json.loads(d.read_text())["runs"] if d.is_file() else [json.loads(f.read_text()) for f in sorted(d.glob("*-p*.json"))]
runs: dict[str, list[dict]] = {}
for r in loaded:
    for item in [*r["fidelity_raw"]["prompts"], r["fidelity_raw"]["perplexity"]]:  # JSON keys are strings
        item["positions"] = [None if d is None else {int(k): v for k, v in d.items()} for d in item["positions"]]
        item["next"] = {int(k): v for k, v in item["next"].items()}
    runs.setdefault(r["kv_cache_dtype"], []).append(r)
ref = {r["order"] // 3: r for r in runs.get("auto", [])}
print("| KV dtype | passes | decode tok/s | prefill tok/s | KV tensor dtype (read back) | attention ISA | top-1 vs bf16 KV | mean KL | next-token top-1 | perplexity | positions |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for dt, rs in runs.items():
    med = lambda k, rs=rs: f"{statistics.median(r[k] for r in rs):.1f} [{min(r[k] for r in rs):.1f}–{max(r[k] for r in rs):.1f}]"
    cmp = [compare(ref[r["order"] // 3]["fidelity_raw"], r["fidelity_raw"]) for r in rs if r["order"] // 3 in ref]
    t1 = statistics.median(c["top1_agreement"] for c in cmp) if cmp else None
    kl = statistics.median(c["mean_kl"] for c in cmp) if cmp else None
    nx = statistics.median(c["next_token_top1_agreement"] for c in cmp) if cmp else None
    ppl = statistics.median(perplexity(r["fidelity_raw"]["perplexity"]) for r in rs)
    rb = rs[0]["readback"]
    print(f"| {dt} | {len(rs)} | {med('decode_tok_s')} | {med('prefill_tok_s')} | {rb['kv_tensor_dtype']} ({rb['kv_bytes']} B) | "
          f"{','.join(rb['isa']) or '?'} | {t1:.3f} | {kl:.5f} | {nx:.3f} | {ppl:.2f} | {cmp[0]['positions']} teacher-forced, {cmp[0]['next_token_prompts']} next-token |" if cmp else f"| {dt} | {len(rs)} | {med('decode_tok_s')} | {med('prefill_tok_s')} | {rb['kv_tensor_dtype']} | {','.join(rb['isa'])} | – | – | – | {ppl:.2f} |")
