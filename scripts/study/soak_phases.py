"""Load a running worker one request kind at a time and read its memory attribution after each phase.

    python scripts/study/soak_phases.py PORT SECONDS KIND[,KIND...] OUT.json   # run the phases
    python scripts/study/soak_phases.py --table OUT.json                       # print MiB per part

KIND is one of edgectl/bench/soak.py's KINDS (chat, completion, stream, fresh-prompt,
dropped-stream); 3 clients send that kind for SECONDS, then GET /edgectl/memory. Used to find which
kind of request made the soak's PSS grow (docs/memory.md, "Prompts of every length").
"""
import json
import random
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
from edgectl.bench.prompts import prompt_set  # noqa: E402
from edgectl.bench.soak import KINDS, _request  # noqa: E402
from edgectl.client import Client  # noqa: E402


def attribution(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/edgectl/memory", timeout=300) as r:
        return json.loads(r.read())


def phase(client: Client, model: str, kind: str, seconds: float, prompts: list[str], vocab: int) -> int:
    deadline, done = time.monotonic() + seconds, [0] * 3

    def one(i: int) -> None:
        rng = random.Random(f"{kind}-{i}")
        while time.monotonic() < deadline:
            _request(client, model, kind, rng, prompts, vocab, 128)
            done[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def table(path: str) -> None:
    runs = json.load(open(path))
    flat = []
    for _, _, att in runs:
        parts: dict[str, int] = {}
        for row in att["rows"]:
            key = row["group"] if row["group"] == "libraries and mapped files" else f"{row['group']}: {row['part']}"
            key = re.sub(r"(?<=in )\d+ |(?<=\()\d+ ", "", key)  # "in 13 arena heaps", "(52 threads)": counts that vary by phase
            parts[key] = parts.get(key, 0) + row["bytes"]
        parts["PSS"], parts["of which anonymous"] = att["pss_bytes"], att["anon_bytes"]
        flat.append(parts)
    print(f"{'MiB':<48}" + "".join(f"{name[:12]:>13}" for name, _, _ in runs))
    print(f"{'requests in the phase':<48}" + "".join(f"{n:>13}" for _, n, _ in runs))
    for key in flat[0]:
        print(f"{key[:48]:<48}" + "".join(f"{p.get(key, 0) / 2**20:>13.1f}" for p in flat))


def main() -> None:
    if sys.argv[1] == "--table":
        return table(sys.argv[2])
    port, seconds, kinds, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"error: unknown kind(s) {sorted(unknown)}: use {', '.join(KINDS)}")
    client = Client("127.0.0.1", port)
    served = client.get_json("/v1/models")["data"][0]
    model = served["id"]
    vocab = json.loads((Path(served["root"]) / "config.json").read_text())["vocab_size"]  # the model's directory
    prompts = prompt_set().prompts
    runs = [("start", 0, attribution(port))]
    for kind in kinds:
        n = phase(client, model, kind, seconds, prompts, vocab)
        runs.append((kind, n, attribution(port)))
        print(kind, n, flush=True)
    Path(out).write_text(json.dumps(runs))
    table(out)


if __name__ == "__main__":
    main()
