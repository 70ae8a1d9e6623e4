"""What the worker promises the control plane: how it is started, how it exits, where it answers.

The worker (``runtime/edgectl_runtime/service/worker.py``) is started with a plan file and nothing else
(``edgectl/launch.py``);
the unit (``units/edgectl.service.in``: ``RestartPreventExitStatus=2 3``), ``edgectl serve`` and
the bench read its exit code; deploy, status, serve and the bench reach it over HTTP.
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgectl.contract.plan import Serve

# A deployment's systemd unit is UNIT_PREFIX + NAME + ".service" (edgectl/units.py: unit_name).
UNIT_PREFIX = "edgectl-"


def systemd_unit(proc_self_cgroup: str) -> str | None:
    """The ``.service`` unit a process runs in, from its ``/proc/self/cgroup`` (v1 or v2), or None."""
    for line in proc_self_cgroup.splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def is_deployment_unit(unit: str | None) -> bool:
    """Whether ``unit`` is named as the units edgectl writes are."""
    return unit is not None and unit.startswith(UNIT_PREFIX) and unit.endswith(".service")


# -- exit codes ---------------------------------------------------------------------------------

EXIT_STOPPED = 0  # a clean stop (SIGTERM: drained)
EXIT_FAILED = 1  # anything else: systemd restarts it
EXIT_REFUSED = 2  # the plan cannot be served as written (bad plan, refused environment, port in use)
EXIT_MISMATCH = 3  # the effective settings differ from the plan (contract/effective.py)
# Restarting will not help after these: the unit tells systemd so (RestartPreventExitStatus=).
NOT_RESTARTABLE = (EXIT_REFUSED, EXIT_MISMATCH)


# -- HTTP -------------------------------------------------------------------------------------------

# GET: the worker's own report (schema edgectl.effective/1 plus phase, ready_s, load_peak).
EFFECTIVE_ROUTE = "/edgectl/effective"
# GET, for a supervisor that probes instead of listening for sd_notify (a Kubernetes pod):
# 200 while the engine makes progress (the rule the watchdog is pinged by) / while serving and
# not draining; 503 otherwise, with the reason.
LIVE_ROUTE = "/edgectl/live"
READY_ROUTE = "/edgectl/ready"
# GET: where the worker's PSS goes (schema edgectl.memory/1, edgectl/contract/memory.py); single-process only.
MEMORY_ROUTE = "/edgectl/memory"
# The phase it reports once its warm-up answered (before: starting, loading, in compiled mode
# compiling or loading the compiled graph, checking, warming up; after: stopping).
SERVING = "serving"


def endpoint(serve: Serve) -> str:
    """Where the API listens, as the user configured it: ``http://HOST:PORT`` (IPv6 in brackets)."""
    return f"http://{_bracketed(serve.host)}:{serve.port}"


def host_port(serve: Serve) -> str:
    """``HOST:PORT`` as a unit's description shows it."""
    return f"{_bracketed(serve.host)}:{serve.port}"


def connect_host(host: str) -> str:
    """The address a client on this machine connects to: a wildcard bind is reached on loopback."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return host


def base_url(serve: Serve) -> str:
    """``http://HOST:PORT`` for a client on this machine (see :func:`connect_host`)."""
    return f"http://{_bracketed(connect_host(serve.host))}:{serve.port}"


def _bracketed(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return f"[{host}]" if ":" in host else host


# -- the warm-up's answer --------------------------------------------------------------------------


def degenerate_answer(text: str) -> str | None:
    """Why a warm-up answer looks like a broken model, or None.

    A model whose weights were converted wrongly still generates, but its first answer is
    nothing, or one short piece repeated ("енененен"): the worker logs it and ``status`` shows
    it. A flag, not a refusal: a tiny model can answer oddly and still be what the user wants.
    """
    body = text.strip()
    if not body:
        return "the warm-up answer is empty"
    for period in range(1, 2 * len(body) // 5 + 1):  # at least two and a half repeats
        unit = body[:period]
        if (unit * (len(body) // period + 1))[:len(body)] == body:
            return f"the warm-up answer is {unit!r} repeated ({body!r})"
    return None


# The clip a speech service transcribes before it says READY: spoken by espeak-ng, shipped in the
# package with its text (edgectl/data/speech/, made by edgectl/bench/speech/clips.py).
WARMUP_CLIP = Path(__file__).resolve().parent.parent / "data" / "speech" / "warmup.wav"
WARMUP_CLIP_TEXT = WARMUP_CLIP.with_suffix(".json")


# The image a vision-language service describes before it says READY: coloured shapes, made by
# scripts/make_warmup_image.py and shipped in the package (edgectl/data/vision/). The answer of a
# synthetic model is nonsense: the warm-up asks only that an answer of at least one token came back.
WARMUP_IMAGE = Path(__file__).resolve().parent.parent / "data" / "vision" / "warmup.png"
WARMUP_IMAGE_QUESTION = "What shapes are in this image?"


def warmup_clip_text() -> str:
    """What the shipped warm-up clip says."""
    text: str = json.loads(WARMUP_CLIP_TEXT.read_text())["text"]
    return text


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def wrong_transcript(text: str, reference: str) -> str | None:
    """Why a warm-up transcript looks like a broken model, or None: empty, repeated, or fewer than
    half of the clip's words heard (a flag like :func:`degenerate_answer`, not a refusal)."""
    broken = degenerate_answer(text)
    if broken:
        return broken.replace("answer", "transcript")
    heard, said = set(_words(text)), _words(reference)
    found = sum(1 for w in said if w in heard)
    if said and found * 2 < len(said):
        return f"the warm-up transcript {text.strip()!r} has {found} of the clip's {len(said)} words ({reference!r})"
    return None
