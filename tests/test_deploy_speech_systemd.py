"""edgectl deploy whisper-base under a real systemd, with the real vLLM engine and the pulled weights.

One scenario, in order (each engine start ~30-60 s on 2 vCPUs): deploy → active only after READY,
which came after the service transcribed its shipped clip, hardened as the text unit is →
deploy's own check transcribed the clip → bad audio gets a 4xx and the service keeps serving →
status counts the audio transcribed → ``kill -9`` of the worker → systemd restarts it and it is
READY again within 60 s (asserted: the issue's bound for this service) → undeploy leaves nothing.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from audio_clips import need_tools, speech_wav
from sandbox import SystemdSandbox, systemd_sandbox  # noqa: F401  (the fixture)

from edgectl.contract.worker import WARMUP_CLIP

pytestmark = [pytest.mark.systemd, pytest.mark.engine]

EDGECTL = "/opt/edgectl/venv/bin/edgectl"
UNIT_DIR = "/run/systemd/system"
CONFIG_DIR = "/run/edgectl-test/etc"
KILL_BACK_S = 60  # issue 30: a kill -9 back to READY within a minute


def edgectl(sb: SystemdSandbox, *args: str, timeout: float = 900):
    env = ["env", f"EDGECTL_UNIT_DIR={UNIT_DIR}", f"EDGECTL_CONFIG_DIR={CONFIG_DIR}"]
    return sb.run([*env, EDGECTL, *args], timeout=timeout)


def transcribe(port: int, data: bytes, filename: str = "clip.wav") -> tuple[int, dict]:
    boundary = uuid.uuid4().hex
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
                    for k, v in {"model": "whisper-base", "language": "en", "temperature": "0"}.items())
    body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\r\n"
             ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/transcriptions", data=body,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_deploy_hears_survives_kill_and_refuses_bad_audio(systemd_sandbox, pulled_whisper_base,  # noqa: F811
                                                          tmp_path):
    need_tools()
    sb = systemd_sandbox
    name, port = "hears", 8313
    unit = f"edgectl-{name}.service"
    clip = speech_wav(tmp_path).read_bytes()

    # -- deploy: active only after READY (the warm-up transcribed the shipped clip), checked by deploy
    r = edgectl(sb, "deploy", "whisper-base", "--name", name, "--port", str(port), "--json")
    assert r.returncode == 0, f"deploy failed:\n{r.stdout}\n{r.stderr}"
    result = json.loads(r.stdout)
    assert result["plan"]["speech"]["dtype"] in ("bfloat16", "float16", "float32")
    assert result["answer"].strip(), result  # deploy's own transcription of the shipped clip
    state = sb.show(unit, "ActiveState", "SubState", "StatusText", "NRestarts", "MainPID", "MemoryMax",
                    "DynamicUser", "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp")
    assert (state["ActiveState"], state["SubState"]) == ("active", "running")
    assert state["StatusText"].startswith("serving whisper-base"), state["StatusText"]
    assert "speech to text" in state["StatusText"]
    assert int(state["MemoryMax"]) == result["plan"]["memory"]["limit_bytes"]
    hardened = {k: state[k] for k in ("DynamicUser", "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp")}
    assert hardened == {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                        "ProtectHome": "yes", "PrivateTmp": "yes"}, hardened
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/edgectl/effective", timeout=10) as resp:
        warm = json.loads(resp.read())["warmup"]
    assert warm["suspect"] is None and warm["answer"].strip(), warm  # READY came after a real transcription
    assert WARMUP_CLIP.is_file()

    # -- bad audio: a 4xx each, and the service serving after each
    for bad in (b"", b"not a recording at all\n" * 50, clip[: len(clip) // 2]):
        status, body = transcribe(port, bad)
        assert 400 <= status < 500 and body["error"]["message"], (status, body)
        status, body = transcribe(port, clip)
        assert status == 200 and "fox" in body["text"].lower(), body

    # -- status: the audio transcribed (the deploy's check, and the four good clips above)
    s = edgectl(sb, "status", name, "--json")
    assert s.returncode == 0, s.stderr
    dep = json.loads(s.stdout)["deployments"][0]
    assert dep["state"] == "active"
    text = edgectl(sb, "status", name).stdout
    assert "audio transcribed:" in text, text

    # -- kill -9: back to READY within the bound
    pid = int(state["MainPID"])
    killed_at = time.monotonic()
    sb.run(["kill", "-9", str(pid)])
    after = sb.wait_for(
        unit, lambda v: int(v.get("NRestarts", "0") or 0) > int(state["NRestarts"]) and v["ActiveState"] == "active"
        and v["SubState"] == "running", timeout_s=300,
        props=("ActiveState", "SubState", "NRestarts", "MainPID"), what="restarted and READY again")
    back_s = time.monotonic() - killed_at
    print(f"\nwhisper-base: kill -9 → READY again in {back_s:.1f} s (RestartSec= included)")
    assert int(after["MainPID"]) != pid
    assert back_s <= KILL_BACK_S, f"kill -9 → READY took {back_s:.1f} s"
    status, body = transcribe(port, clip)
    assert status == 200 and "fox" in body["text"].lower(), body

    # -- undeploy: nothing left
    u = edgectl(sb, "undeploy", name)
    assert u.returncode == 0, u.stderr
    assert sb.show(unit, "LoadState")["LoadState"] == "not-found"
