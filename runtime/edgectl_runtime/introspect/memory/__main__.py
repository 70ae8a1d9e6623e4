"""``python -m edgectl_runtime.introspect.memory URL``: fetch a worker's attribution and print it."""

from __future__ import annotations

import argparse
import json
import urllib.request

from edgectl.contract.memory import render_text
from edgectl.contract.worker import MEMORY_ROUTE


def main(argv: list[str] | None = None) -> int:
    """``python -m edgectl_runtime.introspect.memory URL``: fetch a worker's attribution and print it."""
    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.introspect.memory", description=main.__doc__)
    parser.add_argument("url", help="the worker's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    with urllib.request.urlopen(ns.url.rstrip("/") + MEMORY_ROUTE, timeout=120) as r:
        att = json.loads(r.read())
    print(json.dumps(att, indent=1) if ns.json else render_text(att))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
