"""Interleaved A/B of worker memory levers: every pass a fresh worker; medians; JSON artifact.

usage: ab.py OUT.json PASSES arm=ENV1=V1,ENV2=V2 ...   (arm 'planned' with no env is the control)
"""
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

WT = str(__import__("pathlib").Path(__file__).resolve().parents[2])  # this checkout
sys.path[:0] = [WT, WT + "/runtime"]
from edgectl.bench import measure
from edgectl.bench.client import Client, HttpFailed
from edgectl.bench.prompts import ids_digest, prefill_token_ids, prompt_set
from edgectl.bench.server import ServerProcess, free_port

out, passes = Path(sys.argv[1]), int(sys.argv[2])
arms = {}
for spec in sys.argv[3:]:
    name, _, envs = spec.partition("=")
    arms[name] = dict(kv.split("=", 1) for kv in envs.split(",") if kv) if envs else {}
plan = json.loads(subprocess.run([sys.executable, "-m", "edgectl", "plan", os.environ.get("MODEL", "smollm2-135m"), "--json"]
                                 + (["--max-model-len", os.environ["MML"]] if os.environ.get("MML") else []),
                                 capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{WT}:{WT}/runtime"}, check=True).stdout)
prompts = prompt_set()
base_env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EDGECTL_", "OMP_", "MALLOC_", "LD_PRELOAD", "PYTHON"))}
base_env.update(PYTHONPATH=f"{WT}:{WT}/runtime", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
logs = out.with_suffix(".logs"); logs.mkdir(parents=True, exist_ok=True)
art = {"schema": "edgectl.memory-ab/1", "host": socket.gethostname(), "started_at": datetime.datetime.utcnow().isoformat() + "Z",
       "command": " ".join(sys.argv), "plan": plan, "arms": {n: {"env": e, "passes": []} for n, e in arms.items()},
       "git": subprocess.run(["git", "-C", WT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "git_dirty": bool(subprocess.run(["git", "-C", WT, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip())}
order = 0
for i in range(passes):
    for name, env in arms.items():
        port = free_port()
        pd = logs / f"{order:03d}-{name}-p{i+1}"; pd.mkdir(parents=True, exist_ok=True)
        p = {**plan, "serve": {**plan["serve"], "host": "127.0.0.1", "port": port}}
        (pd / "plan.json").write_text(json.dumps(p))
        rec = {"arm": name, "pass": i, "order": order, "loadavg_start": open("/proc/loadavg").read().split()[:3]}
        srv = ServerProcess([sys.executable, "-m", "edgectl_runtime.service.worker", "--plan", str(pd / "plan.json")], {**base_env, **env}, pd / "server.log")
        c = Client("127.0.0.1", port)
        try:
            t0 = time.monotonic()
            while True:
                if srv.returncode() is not None:
                    raise RuntimeError("exited: " + " | ".join(srv.log_tail(5)))
                try:
                    if c.get_json("/edgectl/effective", timeout=5).get("phase") == "serving":
                        break
                except HttpFailed:
                    pass
                if time.monotonic() - t0 > 900: raise RuntimeError("not ready")
                time.sleep(0.25)
            rec["ready_s"] = srv.elapsed_s()
            rec["pss_peak_bytes"] = srv.stop_sampling()
            rec["pss_ready_bytes"] = srv.memory().pss_bytes
            maps = open(f"/proc/{srv.pid}/maps").read()
            rec["readback_maps"] = sorted({l.split()[-1] for l in maps.splitlines() if any(x in l for x in ("jemalloc", "tcmalloc", "iomp", "libgomp", "cv2"))})
            ids = prefill_token_ids(0, order, 49152)
            d = measure.decode(c, plan["model"]["name"], prompts.decode_prompt)
            rec["decode_tok_s"] = d["decode_tok_s"]
            pr = measure.prefill(c, plan["model"]["name"], ids)
            rec["prefill_tok_s"] = pr["prefill_tok_s"]
            rec["prefill_digest"] = ids_digest(ids)
            # a second decode and prefill (fresh prompt): steady after real work
            d2 = measure.decode(c, plan["model"]["name"], prompts.decode_prompt)
            rec["decode2_tok_s"] = d2["decode_tok_s"]
            time.sleep(2)
            m = srv.memory()
            rec.update(pss_steady_bytes=m.pss_bytes, pss_anon_steady_bytes=m.pss_anon_bytes, pss_file_steady_bytes=m.pss_file_bytes, processes=len(m.processes))
            att = c.get_json("/edgectl/memory", timeout=300)
            rec["attribution"] = att
            rec["status"] = "ok"
        except Exception as exc:
            rec["status"] = "failed"; rec["error"] = repr(exc); rec["log_tail"] = srv.log_tail(12)
        finally:
            srv.stop()
        art["arms"][name]["passes"].append(rec)
        print(f"{name} p{i+1}: " + (f"ready {rec['ready_s']:.1f}s decode {rec['decode_tok_s']:.1f} prefill {rec['prefill_tok_s']:.0f} PSS {rec['pss_steady_bytes']/1e9:.3f} GB (anon {rec['pss_anon_steady_bytes']/2**20:.0f} MiB) maps {rec['readback_maps']}" if rec["status"] == "ok" else rec["error"]), flush=True)
        order += 1
        out.write_text(json.dumps(art, indent=1))
for name, a in art["arms"].items():
    ok = [r for r in a["passes"] if r["status"] == "ok"]
    def med(k, ok=ok):
        v = [r[k] for r in ok if r.get(k) is not None]; return (statistics.median(v), min(v), max(v)) if v else None
    a["median"] = {k: med(k) for k in ("decode_tok_s", "decode2_tok_s", "prefill_tok_s", "pss_steady_bytes", "pss_anon_steady_bytes", "pss_file_steady_bytes", "ready_s", "pss_peak_bytes")}
    m = a["median"]
    if m["pss_steady_bytes"]:
        print(f"{name:<12} decode {m['decode_tok_s'][0]:.1f} [{m['decode_tok_s'][1]:.1f}-{m['decode_tok_s'][2]:.1f}] prefill {m['prefill_tok_s'][0]:.0f} [{m['prefill_tok_s'][1]:.0f}-{m['prefill_tok_s'][2]:.0f}] PSS {m['pss_steady_bytes'][0]/1e9:.3f} [{m['pss_steady_bytes'][1]/1e9:.3f}-{m['pss_steady_bytes'][2]/1e9:.3f}] GB anon {m['pss_anon_steady_bytes'][0]/2**20:.0f} MiB ready {m['ready_s'][0]:.1f}s")
art["ended_at"] = datetime.datetime.utcnow().isoformat() + "Z"
out.write_text(json.dumps(art, indent=1))
