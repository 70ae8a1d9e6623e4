"""Summarise a KV-dtype study directory (kv_dtype_study.sh): speed medians and fidelity of each
KV dtype against bf16 KV ("auto") of the same pass, teacher-forced over the shipped prompts (the
prompt's attention) and along greedy continuations (the decode path: each step's top-1 and KL while
both continuations still agree, so that both steps saw the same tokens; then where they part)."""
import json
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
from edgectl.contract.fidelity import compare, kl_topk, perplexity, top1  # noqa: E402

d = Path(sys.argv[1])  # the study's output directory, or the combined artifact under results/
loaded = json.loads(d.read_text())["runs"] if d.is_file() else [json.loads(f.read_text()) for f in sorted(d.glob("*-p*.json"))]
runs: dict[str, list[dict]] = {}
for r in loaded:
    for item in [*r["fidelity_raw"]["prompts"], r["fidelity_raw"]["perplexity"]]:  # JSON keys are strings
        item["positions"] = [None if d is None else {int(k): v for k, v in d.items()} for d in item["positions"]]
        item["next"] = {int(k): v for k, v in item["next"].items()}
    runs.setdefault(r["kv_cache_dtype"], []).append(r)
per_pass = len(runs)  # a pass runs every dtype once, in order
ref = {r["order"] // per_pass: r for r in runs.get("auto", [])}


def decode_path(reference: dict, arm: dict) -> dict | None:
    """Greedy continuations of the same prompts: steps compared (while the tokens so far agree), their
    top-1 agreement and mean KL, the prompts whose whole continuation agrees, the mean first parting."""
    pairs = list(zip(reference.get("continuations", []), arm.get("continuations", [])))
    if not pairs:
        return None
    steps, agree, kls, whole, parted = 0, 0, [], 0, []
    for a, b in pairs:
        n = min(len(a["ids"]), len(b["ids"]))
        first = next((i for i in range(n) if a["ids"][i] != b["ids"][i]), n)
        whole += first == n
        parted.append(first)
        for i in range(1, min(first + 1, n)):  # step 0 is the prompt's pass; step i saw ids[:i], equal in both
            ra = {int(k): v for k, v in a["logprobs"][i].items()}
            rb = {int(k): v for k, v in b["logprobs"][i].items()}
            steps += 1
            agree += top1(ra) == top1(rb)
            kls.append(kl_topk(ra, rb))
    return {"steps": steps, "top1": agree / steps if steps else None, "kl": statistics.fmean(kls) if kls else None,
            "whole": whole, "prompts": len(pairs), "first_parting": statistics.fmean(parted),
            "length": len(pairs[0][0]["ids"])}



decode_lines: list[str] = []
print("| KV dtype | passes | decode tok/s | prefill tok/s | KV tensor dtype (read back) | attention ISA | top-1 vs bf16 KV | mean KL | next-token top-1 | perplexity | positions |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for dt, rs in runs.items():
    med = lambda k, rs=rs: f"{statistics.median(r[k] for r in rs):.1f} [{min(r[k] for r in rs):.1f}–{max(r[k] for r in rs):.1f}]"
    cmp = [compare(ref[r["order"] // per_pass]["fidelity_raw"], r["fidelity_raw"]) for r in rs if r["order"] // per_pass in ref]
    dec = [x for x in (decode_path(ref[r["order"] // per_pass]["fidelity_raw"], r["fidelity_raw"])
                       for r in rs if r["order"] // per_pass in ref) if x]
    t1 = statistics.median(c["top1_agreement"] for c in cmp) if cmp else None
    kl = statistics.median(c["mean_kl"] for c in cmp) if cmp else None
    nx = statistics.median(c["next_token_top1_agreement"] for c in cmp) if cmp else None
    ppl = statistics.median(perplexity(r["fidelity_raw"]["perplexity"]) for r in rs)
    rb = rs[0]["readback"]
    if dec and dt != "auto":
        x = dec[0]  # greedy and deterministic: every pass's is the same (printed per pass below when not)
        decode_lines.append(f"| {dt} | {x['steps']} | {x['top1']:.3f} | {x['kl']:.5f} | {x['whole']}/{x['prompts']} | "
                            f"{x['first_parting']:.1f} of {x['length']} | {len({json.dumps(y, sort_keys=True) for y in dec})} |")
    print(f"| {dt} | {len(rs)} | {med('decode_tok_s')} | {med('prefill_tok_s')} | {rb['kv_tensor_dtype']} ({rb['kv_bytes']} B) | "
          f"{','.join(rb['isa']) or '?'} | {t1:.3f} | {kl:.5f} | {nx:.3f} | {ppl:.2f} | {cmp[0]['positions']} teacher-forced, {cmp[0]['next_token_prompts']} next-token |" if cmp else f"| {dt} | {len(rs)} | {med('decode_tok_s')} | {med('prefill_tok_s')} | {rb['kv_tensor_dtype']} | {','.join(rb['isa'])} | – | – | – | {ppl:.2f} |")
if decode_lines:
    print()
    print("Decode path (greedy continuations against bf16 KV's):")
    print("| KV dtype | decode steps compared | top-1 | mean KL | whole continuation equal | first parting (mean) | distinct results over passes |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(decode_lines))
