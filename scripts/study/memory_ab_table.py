import json
import statistics
import sys

a = json.load(open(sys.argv[1]))
def fmt(vals, f):
    if not vals: return "–"
    return f"{f(statistics.median(vals))} [{f(min(vals))}–{f(max(vals))}]"
rows = []
ctrl = None
print("| arm | env | passes ok | decode tok/s | prefill tok/s | PSS steady GB | anon MiB | file-backed resident MiB | PSS if alone GB | ready s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, arm in a["arms"].items():
    ok = [r for r in arm["passes"] if r["status"] == "ok"]
    g = lambda k, ok=ok: [r[k] for r in ok if r.get(k) is not None]
    # anonymous PSS of the tree (read before the attribution call) + file-backed resident bytes
    alone = [(r["pss_anon_steady_bytes"] + r["attribution"]["file_rss_bytes"]) for r in ok]
    frss = [r["attribution"]["file_rss_bytes"] for r in ok]
    env = ",".join(f"{k}={v.split('/')[-1]}" for k, v in arm["env"].items()) or "(control)"
    print(f"| {name} | {env} | {len(ok)}/{len(arm['passes'])} | {fmt(g('decode_tok_s'), lambda v: f'{v:.1f}')} | {fmt(g('prefill_tok_s'), lambda v: f'{v:.0f}')} | "
          f"{fmt(g('pss_steady_bytes'), lambda v: f'{v/1e9:.3f}')} | {fmt(g('pss_anon_steady_bytes'), lambda v: f'{v/2**20:.0f}')} | {fmt(frss, lambda v: f'{v/2**20:.0f}')} | {fmt(alone, lambda v: f'{v/1e9:.3f}')} | {fmt(g('ready_s'), lambda v: f'{v:.1f}')} |")
