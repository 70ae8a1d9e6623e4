#!/bin/sh
# The speech profile's memory figures (docs/speech.md "Memory"): PSS of the planned whisper-base
# worker's whole process tree after a fixed workload, for one plan per call.
#   sh scripts/speech_memory.sh OUT_DIR LABEL [edgectl plan options...]
# Workload: the shipped clip set's four longest clips at once, then every clip once, then 3 s idle
# (the idle trim). Prints one JSON line: the plan's ledger, the PSS, the start's peak, the KV read back.
# Needs a pulled whisper-base and nothing listening on port 8311; run from a checkout as root.
set -eu
OUT=$1; L=$2; shift 2
REPO=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
PY=${EDGECTL_RUNTIME_PYTHON:-/opt/edgectl/venv/bin/python}
export PYTHONPATH="$REPO:$REPO/runtime"
RUN="$OUT/$L"; mkdir -p "$RUN"
CLIPS="$OUT/clips"
[ -f "$CLIPS/clips.json" ] || "$PY" -c "import sys; from pathlib import Path; from edgectl.bench.speech.clips import make_clip_set; make_clip_set(Path(sys.argv[1]))" "$CLIPS"
"$PY" -m edgectl plan whisper-base --json "$@" > "$RUN/planned.json"
"$PY" -c "import json,sys; p=json.load(open(sys.argv[1])); p['serve']['port']=8311; json.dump(p, open(sys.argv[2], 'w'))" "$RUN/planned.json" "$RUN/plan.json"
"$PY" -P -m edgectl_runtime.service.worker --plan "$RUN/plan.json" > "$RUN/worker.log" 2>&1 &
W=$!
trap 'kill $W 2>/dev/null || true' EXIT
"$PY" - "$RUN" "$CLIPS" "$W" <<'PYEOF'
import json, sys, threading, time
from pathlib import Path
from edgectl.client import Client
from edgectl.contract.procmem import tree_mem
run, clips_dir, pid = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
client = Client("127.0.0.1", 8311)
for _ in range(600):
    if client.status("/edgectl/ready") == 200:
        break
    time.sleep(1)
else:
    sys.exit("not ready in 600 s: " + str(run / "worker.log"))
clips = json.loads((clips_dir / "clips.json").read_text())["clips"]
def send(c):
    client.transcribe("whisper-base", (clips_dir / c["file"]).read_bytes(), c["file"], timeout=600)
longest = sorted(clips, key=lambda c: -c["seconds"])[:4]
threads = [threading.Thread(target=send, args=(c,)) for c in longest]
for t in threads: t.start()
for t in threads: t.join()
for c in clips: send(c)
time.sleep(3)
eff = client.get_json("/edgectl/effective")
plan = json.loads((run / "plan.json").read_text())
mem = tree_mem(pid)
print(json.dumps({"label": run.name, "pss_bytes": mem.pss_bytes, "pss_anon_bytes": mem.pss_anon_bytes,
                  "load_peak_pss_bytes": eff["load_peak"]["pss_bytes"], "ready_s": eff["ready_s"],
                  "kv_cache_bytes_read_back": eff["kv_cache_bytes"], "max_num_seqs": plan["max_num_seqs"],
                  "dtype": plan["speech"]["dtype"], "weight_format": plan["weight_format"], "memory": plan["memory"]}))
PYEOF
