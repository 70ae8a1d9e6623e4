"""How long the OpenMP threads spin, by hand (a study: docs/kernels.md "Waiting threads").

    /opt/edgectl/venv/bin/python scripts/study/spin_rounds.py ROUNDS TOKENS PLAN.json...

One worker per plan per round (each plan's environment, e.g. a GOMP_SPINCOUNT edited into a copy of
``edgectl plan MODEL --json``), three streamed greedy completions of TOKENS tokens each on fresh prompts,
decode tok/s between the first and the last token. Rounds interleave the plans, the order rotated.
``BUSY=1`` runs a shell loop pinned to CPU 1 while the completions run, ``BUSY_EARLY=1`` from before
the worker starts. The worker takes any spin count for the plan's ``spin-short`` (the study's only
change to it: the read-back names a count it does not know ``spin-N``, which the plan cannot say).
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

WORKER = """
import os, sys
from edgectl_runtime.service import readback, worker
readback.thread_wait = lambda: "spin-short" if os.environ.get("GOMP_SPINCOUNT") else "spin"
sys.exit(worker.main())
"""


def busy_cpu1():
    return subprocess.Popen(["taskset", "-c", "1", "sh", "-c", "while :; do :; done"])


def completion(port, model, prompt, tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"content-type": "application/json"})
    t0 = t1 = None
    k = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            t1 = time.perf_counter()
            t0 = t0 or t1
            k += 1
    return (k - 1) / (t1 - t0)


def main():
    rounds, tokens, plans = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    results = {p: [] for p in plans}
    for r in range(rounds):
        for path in plans[r % len(plans):] + plans[:r % len(plans)]:
            plan = json.load(open(path))
            port, model = plan["serve"]["port"], plan["model"]["name"]
            early = busy_cpu1() if os.environ.get("BUSY_EARLY") else None
            env = {**os.environ, **plan["env"]}
            worker = subprocess.Popen([sys.executable, "-OO", "-P", "-c", WORKER, "--plan", path], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(400):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    break
                except OSError:
                    time.sleep(1)
            completion(port, model, "Hello there.", 8)
            busy = busy_cpu1() if os.environ.get("BUSY") else None
            try:
                rates = [completion(port, model, f"Write a long essay about topic {r}-{i}-{path}.", tokens)
                         for i in range(3)]
            finally:
                for loop in (busy, early):
                    if loop:
                        loop.kill()
                        loop.wait()
            results[path].append(statistics.median(rates))
            print(f"round {r} {path}: {[round(x, 1) for x in rates]} load {os.getloadavg()[0]:.2f}", flush=True)
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    for path, rates in results.items():
        rates.sort()
        print(f"{path}: median {statistics.median(rates):.1f} [{rates[0]:.1f}-{rates[-1]:.1f}]")


if __name__ == "__main__":
    main()
