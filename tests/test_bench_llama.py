"""llama.cpp at its best in `edgectl bench`: its formats, its thread sweep, its repack, the ratios' wording.

Without llama.cpp: the arms as declared, llama-server's log read from real captured logs
(tests/fixtures/llama_server: SmolLM2-135M's GGUF as Q4_1, and requantized to Q4_0 and Q4_K_M by
the same build's llama-quantize, llama-server at -lv 4, plus the load lines of a -lv 5 run), the
best of the sweep, the report's words, and the requantized files' cache and provenance with a
stand-in llama-quantize. With a llama.cpp build (``EDGECTL_TEST_LLAMA_SERVER``, else a cached build):
llama-quantize and llama-server really run on the catalog's SmolLM2 GGUF.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from bench_helpers import HOST, bench, tiny_model

from edgectl.bench import llama_log, report, requantize
from edgectl.bench.arms import (
    ARMS,
    gguf_types,
    llama_arm_name,
    parse_thread_counts,
    thread_sweep,
)
from edgectl.bench.core import reference_arm_for
from edgectl.errors import EdgectlError
from edgectl.probe import probe

LOGS = Path(__file__).resolve().parent / "fixtures" / "llama_server"


def _log(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


# -- the arms as declared -----------------------------------------------------------------------------


def test_the_llama_cpp_formats_are_arms_of_the_one_table() -> None:
    assert {n: (ARMS[n].launcher, ARMS[n].overrides) for n in ("llama.cpp", "llama.cpp-q4_0", "llama.cpp-q4_k_m",
                                                                "planned-q4_0")} == {
        "llama.cpp": ("llama.cpp", {}), "llama.cpp-q4_0": ("llama.cpp", {"gguf_type": "Q4_0"}),
        "llama.cpp-q4_k_m": ("llama.cpp", {"gguf_type": "Q4_K_M"}), "planned-q4_0": ("worker", {"gguf_type": "Q4_0"})}
    assert gguf_types(["stock", "llama.cpp", "llama.cpp-q4_0", "planned-q4_0", "llama.cpp-q4_k_m"]) == ["Q4_0", "Q4_K_M"]
    assert gguf_types(["planned", "llama.cpp"]) == []
    assert all(t in requantize.FILE_TYPES.values() for t in gguf_types(list(ARMS)))


def test_the_thread_sweep_is_1_2_and_every_usable_cpu() -> None:
    assert thread_sweep(1) == [1] and thread_sweep(2) == [1, 2] and thread_sweep(8) == [1, 2, 8]
    assert parse_thread_counts(None, 4) == [1, 2, 4]
    assert parse_thread_counts("all", 4) == [4] and parse_thread_counts("2, 1,2", 4) == [2, 1]
    for bad in ("5", "0", "two", ","):
        with pytest.raises(EdgectlError, match="--llama-threads"):
            parse_thread_counts(bad, 4)
    assert llama_arm_name("llama.cpp-q4_0", 2) == "llama.cpp-q4_0-t2"


def test_fidelity_is_against_llama_cpp_on_the_same_file_at_the_most_threads() -> None:
    ran = ["planned", "llama.cpp-t1", "llama.cpp-t2", "llama.cpp-q4_0-t2"]
    assert reference_arm_for(ran, gguf_served=True) == "llama.cpp-t2"
    assert reference_arm_for(ran, gguf_served=True, asked="llama.cpp-q4_0") == "llama.cpp-q4_0-t2"
    assert reference_arm_for(ran, gguf_served=True, asked="llama.cpp-t1") == "llama.cpp-t1"
    assert reference_arm_for(["planned", "stock"], gguf_served=True) == "stock"


# -- llama-server's log ------------------------------------------------------------------------------------


def test_the_repack_is_read_from_a_real_llama_server_log() -> None:
    q4_0 = llama_log.repack(_log("q4_0-lv4.log"))
    assert q4_0["repacked"] is True and q4_0["buffers_mib"] == {"CPU_Mapped": 85.30, "CPU_REPACK": 56.95}
    assert q4_0["repacked_bytes"] == round(56.95 * 2**20) and q4_0["layouts"] is None  # -lv 4: no debug lines
    assert llama_log.describe(q4_0) == "CPU_REPACK 56.95 MiB repacked (beside CPU_Mapped 85.30 MiB)"
    q4_1 = llama_log.repack(_log("q4_1-lv4.log"))  # llama.cpp's generic dot product: nothing repacked
    assert q4_1["repacked"] is False and q4_1["repacked_bytes"] == 0 and q4_1["buffers_mib"] == {"CPU_Mapped": 92.10}
    assert llama_log.describe(q4_1) == "nothing repacked (CPU_Mapped 92.10 MiB)"
    # SmolLM2's rows (576) are no multiple of Q4_K's 256: llama-quantize fell back on most tensors
    assert llama_log.repack(_log("q4_k_m-lv4.log"))["buffers_mib"]["CPU_REPACK"] == 7.59
    # at -lv 5 the sizing pass logs 0 MiB first; the last line of a buffer type holds; each tensor's layout
    debug = llama_log.repack(_log("q4_0-lv5-load.log"))
    assert debug["buffers_mib"]["CPU_REPACK"] == 56.95 and debug["layouts"] == {"q4_0_8x8": 210}
    assert llama_log.describe(debug).endswith(": 210 tensors as q4_0_8x8")
    assert llama_log.repack(["nothing here"]) == {**llama_log.repack([]), "buffers_mib": {}}
    assert llama_log.repack([])["repacked"] is None and llama_log.describe({}) == "no model buffer in the log (not read)"
    assert [llama_log.threads(_log(f)) for f in ("q4_0-lv4.log", "q4_1-lv4.log")] == [2, 2]
    assert llama_log.threads(["system_info: n_threads = 1 (n_threads_batch = 1) / 2"]) == 1


# -- the best of the sweep, and the words of every ratio -----------------------------------------------------


def _arm(launcher: str, decode: float, prefill: float, gguf_type: str | None = None, threads: int | None = None,
         **extra) -> dict:
    return {"launcher": launcher, "gguf_type": gguf_type, "threads": threads, "passes": [],
            "median": {"decode_tok_s": decode, "prefill_tok_s": prefill}, **extra}


ARMS_RUN = {
    "planned": _arm("worker", 130.0, 2300.0, "Q4_1"),
    "planned-q4_0": _arm("worker", 146.0, 2336.0, "Q4_0"),
    "llama.cpp-t1": _arm("llama.cpp", 100.0, 300.0, "Q4_1", 1),
    "llama.cpp-t2": _arm("llama.cpp", 162.0, 451.0, "Q4_1", 2),
    "llama.cpp-q4_0-t1": _arm("llama.cpp", 120.0, 900.0, "Q4_0", 1),
    "llama.cpp-q4_0-t2": _arm("llama.cpp", 181.0, 1456.0, "Q4_0", 2),
    "llama.cpp-q4_k_m-t2": _arm("llama.cpp", 170.0, 1000.0, "Q4_K_M", 2),
}


def test_the_best_median_decode_of_the_sweep_is_llama_cpp_at_its_best() -> None:
    assert report.best_llama(ARMS_RUN) == "llama.cpp-q4_0-t2"
    assert report.best_llama(ARMS_RUN, "Q4_1") == "llama.cpp-t2"
    assert report.best_llama({"planned": ARMS_RUN["planned"]}) is None
    assert report.versus_llama({"planned": ARMS_RUN["planned"]}) is None
    v = report.versus_llama(ARMS_RUN)
    assert v["against"] == {"arm": "llama.cpp-q4_0-t2", "gguf_type": "Q4_0", "threads": 2,
                            "label": "llama.cpp Q4_0 at 2 threads", "decode_tok_s": 181.0, "prefill_tok_s": 1456.0,
                            "decode_long_tok_s": None}
    assert set(v["llama_cpp_arms"]) == {n for n in ARMS_RUN if n.startswith("llama.cpp")}
    assert set(v["arms"]) == {"planned", "planned-q4_0"}
    assert v["arms"]["planned"]["decode"] == pytest.approx(130 / 181)
    assert v["arms"]["planned"]["prefill"] == pytest.approx(2300 / 1456)
    # each edgectl arm also against llama.cpp's best on the very file it reads
    assert v["same_file"]["planned"]["against"]["label"] == "llama.cpp Q4_1 at 2 threads"
    assert v["same_file"]["planned"]["decode"] == pytest.approx(130 / 162)
    assert v["same_file"]["planned-q4_0"]["against"]["arm"] == "llama.cpp-q4_0-t2"
    assert v["same_file"]["planned-q4_0"]["decode"] == pytest.approx(146 / 181)
    # an arm that did not complete is not a candidate
    broken = {**ARMS_RUN, "llama.cpp-q4_0-t2": {**ARMS_RUN["llama.cpp-q4_0-t2"], "median": None}}
    assert report.best_llama(broken) == "llama.cpp-q4_k_m-t2"


def test_each_figure_is_against_llama_cpp_at_its_best_for_that_figure() -> None:
    # one thread decodes one stream fastest, two threads prefill and serve eight streams fastest
    arms = {"planned": _arm("worker", 135.7, 2080.9, "Q4_1", aggregate_decode_tok_s=725.3),
            "llama.cpp-q4_0-t1": _arm("llama.cpp", 222.4, 944.7, "Q4_0", 1, aggregate_decode_tok_s=301.9),
            "llama.cpp-q4_0-t2": _arm("llama.cpp", 174.4, 1427.3, "Q4_0", 2, aggregate_decode_tok_s=539.0)}
    for arm in arms.values():
        arm["median"]["aggregate_decode_tok_s"] = arm.pop("aggregate_decode_tok_s")
    v = report.versus_llama(arms)
    assert v["against"]["arm"] == "llama.cpp-q4_0-t1"
    r = v["arms"]["planned"]
    assert r["decode"] == pytest.approx(135.7 / 222.4)
    assert r["prefill"] == pytest.approx(2080.9 / 1427.3)  # not 2080.9 / 944.7, the decode-best arm's
    assert r["aggregate_decode"] == pytest.approx(725.3 / 539.0)
    assert r["against_by_figure"] == {"decode": "llama.cpp-q4_0-t1", "prefill": "llama.cpp-q4_0-t2",
                                      "aggregate_decode": "llama.cpp-q4_0-t2"}
    assert "decode_long" not in r  # no llama.cpp arm measured it
    a = {"provenance": {"model": "m", "passes": 3, "max_model_len": 4096, "probe": {}}, "concurrency": 8,
         "arms": arms, "complete": True, "quotable": True, "fidelity": {}, "incomplete_reasons": [], "ratios": None,
         "versus_llama_cpp": v}
    assert ("planned decode 0.61× prefill 1.46× (vs llama.cpp Q4_0 at 2 threads) 8-stream aggregate 1.35× "
            "(vs llama.cpp Q4_0 at 2 threads)") in report.render_text(a, None, [])


def test_every_ratio_the_report_prints_names_the_llama_cpp_format_and_threads() -> None:
    repack = llama_log.repack(_log("q4_0-lv4.log"))
    arms = {n: {**a, "passes": [{"status": "ok", "llama_cpp": {"gguf_type": a["gguf_type"], "threads": a["threads"],
                                                                "repack": repack}}] if n == "llama.cpp-q4_0-t2" else []}
            for n, a in ARMS_RUN.items()}
    a = {"provenance": {"model": "m", "passes": 1, "max_model_len": 1024, "probe": {}}, "arms": arms,
         "complete": True, "quotable": False, "fidelity": {}, "incomplete_reasons": [],
         "ratios": {n: {"median": dict.fromkeys(report.RATIO_METRICS, 1.0)} for n in ("planned", "llama.cpp-t2")},
         "versus_llama_cpp": report.versus_llama(arms)}
    text = report.render_text(a, None, [])
    assert ("llama.cpp at its best: llama.cpp Q4_0 at 2 threads (llama.cpp-q4_0-t2), decode 181.0 tok/s — the best "
            "median decode of its arms") in text
    assert "Q4_1 at 1: 100; Q4_1 at 2: 162; Q4_0 at 1: 120; Q4_0 at 2: 181; Q4_K_M at 2: 170" in text
    assert ("relative to llama.cpp Q4_0 at 2 threads (medians; a figure where another llama.cpp arm was faster is "
            "against that one, named): planned decode 0.72× prefill 1.58×, planned-q4_0 decode 0.81× prefill 1.60×") in text
    assert "planned on the same Q4_1 file, relative to llama.cpp Q4_1 at 2 threads: decode 0.80×" in text
    assert "planned-q4_0 on the same Q4_0 file, relative to llama.cpp Q4_0 at 2 threads: decode 0.81×" in text
    # the ratios to the control name a llama.cpp arm's format and threads too
    assert "llama.cpp-t2 (llama.cpp Q4_1 at 2 threads)" in text
    assert ("llama.cpp-q4_0-t2 (llama.cpp Q4_0 at 2 threads): CPU_REPACK 56.95 MiB repacked (beside CPU_Mapped "
            "85.30 MiB)") in text
    # every line with a ratio against llama.cpp names a format and a thread count
    for line in text.splitlines():
        if "relative to llama.cpp" in line:
            assert " at 2 threads" in line, line


def test_an_artifact_from_before_the_sweep_still_renders() -> None:
    a = {"provenance": {"model": "m", "passes": 3, "max_model_len": 1024, "probe": {}}, "arms": {},
         "complete": True, "quotable": True, "fidelity": {}, "incomplete_reasons": [], "ratios": None,
         "versus_llama_cpp": {"planned": {"decode": 0.9, "prefill": 5.0}}}
    assert ("relative to llama.cpp on the catalog's GGUF at every usable CPU (its format not recorded; medians): "
            "planned decode 0.90× prefill 5.00×") in report.render_text(a, None, [])


# -- the requantized files: made once, kept by source, type and build, with their provenance ---------------------


def _tiny_gguf(path: Path, file_type: int) -> Path:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(file_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _stand_in_build(root: Path) -> Path:
    """A llama-server that says its version and a llama-quantize that copies its input: a build's interface."""
    bindir = root / "build" / "bin"
    bindir.mkdir(parents=True)
    server = bindir / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 7, commit abc1234)'\n")
    quantize = bindir / "llama-quantize"
    quantize.write_text("#!/bin/sh\necho \"quantizing $2 to $3 as $4\"\ncp \"$2\" \"$3\"\n"
                        "echo 'llama_model_quantize_impl: quant size  =     1.00 MiB'\n")
    for p in (server, quantize):
        p.chmod(0o755)
    return server


def test_a_requantized_file_is_made_once_and_keyed_by_source_type_and_build(tmp_path) -> None:
    source = _tiny_gguf(tmp_path / "src.gguf", 3)  # LLAMA_FTYPE_MOSTLY_Q4_1
    assert requantize.file_type(source) == "Q4_1"
    server = _stand_in_build(tmp_path)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    said: list[str] = []
    got = requantize.variants(["Q4_0", "Q4_1"], source, str(server), model_dir, tmp_path / "cache", said.append)
    assert got["Q4_1"].gguf == source and got["Q4_1"].provenance["requantized"] is False  # the file as it is
    q4_0 = got["Q4_0"]
    sha = requantize.sha256_file(source)
    assert q4_0.model_dir == tmp_path / "cache" / "requantized" / f"{sha[:16]}-Q4_0-b7-abc1234"
    assert q4_0.gguf == q4_0.model_dir / "model.gguf" and (q4_0.model_dir / "config.json").is_file()
    prov = json.loads((q4_0.model_dir / "requantized.json").read_text())
    assert prov == q4_0.provenance
    assert prov["command"] == ["llama-quantize", "--allow-requantize", "src.gguf", "model.gguf", "Q4_0"]
    assert prov["llama_cpp"] == {"version": "0.5.0-dev", "build": "7", "commit": "abc1234",
                                 "line": "version: 0.5.0-dev (build 7, commit abc1234)"}
    assert prov["source"]["sha256"] == sha and prov["source"]["gguf_type"] == "Q4_1"
    assert prov["sha256"] == requantize.sha256_file(q4_0.gguf)
    assert prov["quantize_summary"] == ["llama_model_quantize_impl: quant size  =     1.00 MiB"]
    # kept: the next run reads it back without running llama-quantize
    (server.parent / "llama-quantize").write_text("#!/bin/sh\nexit 9\n")
    again = requantize.variants(["Q4_0"], source, str(server), model_dir, tmp_path / "cache", said.append)
    assert again["Q4_0"].provenance == prov and any("Q4_0 kept in" in s for s in said)
    # another build makes another file, and a failing llama-quantize says so and leaves nothing
    server.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 8, commit def5678)'\n")
    with pytest.raises(EdgectlError, match="llama-quantize to Q4_0 failed \\(exit 9\\)"):
        requantize.variants(["Q4_0"], source, str(server), model_dir, tmp_path / "cache", said.append)
    assert sorted(p.name for p in (tmp_path / "cache" / "requantized").iterdir()) == [q4_0.model_dir.name]
    (server.parent / "llama-quantize").unlink()
    with pytest.raises(EdgectlError, match="no llama-quantize beside"):
        requantize.variants(["Q4_0"], source, str(server), model_dir, tmp_path / "cache", said.append)


def test_the_bench_runs_each_llama_cpp_format_at_each_thread_count(tmp_path) -> None:
    """The harness end to end with stand-ins: a fake llama-server process per (format, threads), the
    Q4_0 file written by the stand-in llama-quantize, and the repack read from a real captured log."""
    import edgectl.bench.core as core

    facts = probe(str(HOST), environ={})
    source = _tiny_gguf(tmp_path / "src.gguf", 3)
    server = _stand_in_build(tmp_path)
    orig = core._gguf_for
    core._gguf_for = lambda model, env: source
    try:
        result = bench(tmp_path, tiny_model(tmp_path), facts, "llama.cpp,llama.cpp-q4_0", passes=1,
                       llama_server=str(server), fidelity=False,
                       options={"llama.cpp-q4_0": ["--log-from", str(LOGS / "q4_0-lv4.log")],
                                "llama.cpp": ["--log-from", str(LOGS / "q4_1-lv4.log")]})
    finally:
        core._gguf_for = orig
    a = result.to_dict()
    assert a["complete"], a["incomplete_reasons"]
    assert list(a["arms"]) == ["llama.cpp-t1", "llama.cpp-t2", "llama.cpp-q4_0-t1", "llama.cpp-q4_0-t2"]
    prov = a["provenance"]["llama_server"]
    assert prov["gguf_type"] == "Q4_1" and prov["threads"] == [1, 2]
    assert prov["requantized"]["Q4_0"]["command"][-1] == "Q4_0"
    for name, arm in a["arms"].items():
        (p,) = arm["passes"]
        cmd = p["command"]
        assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == str(arm["threads"])
        assert cmd[cmd.index("-lv") + 1] == "4"
        assert p["effective"]["threads"] == arm["threads"]  # read back from the log
        assert p["llama_cpp"]["gguf_type"] == arm["gguf_type"] and p["llama_cpp"]["threads"] == arm["threads"]
        q4_0 = name.startswith("llama.cpp-q4_0")
        assert arm["gguf_type"] == ("Q4_0" if q4_0 else "Q4_1")
        assert Path(cmd[cmd.index("-m") + 1]).name == ("model.gguf" if q4_0 else "src.gguf")
        assert p["llama_cpp"]["repack"]["repacked"] is q4_0
    assert a["versus_llama_cpp"]["against"]["arm"] in a["arms"]
    assert "llama.cpp's repack at load (its log, first pass):" in result.render_text()


def test_an_arm_whose_file_cannot_be_made_is_skipped_saying_why(tmp_path) -> None:
    facts = probe(str(HOST), environ={})
    a = bench(tmp_path, tiny_model(tmp_path), facts, "planned,llama.cpp-q4_0,planned-q4_0", passes=1,
              fidelity=False).to_dict()
    assert set(a["skipped"]) == {"llama.cpp-q4_0", "planned-q4_0"}
    assert a["skipped"]["planned-q4_0"].startswith("no Q4_0 file: the model has no GGUF")


# -- with llama.cpp ------------------------------------------------------------------------------------------------


def test_llama_quantize_and_llama_server_really_repack_q4_0(tmp_path) -> None:
    """The catalog's SmolLM2 GGUF (Q4_1) to Q4_0 by the build's llama-quantize; llama-server, started
    as the bench starts it (-lv 4), logs the repack of the Q4_0 file and none of the Q4_1 file's."""
    from edgectl.bench.server import ServerProcess, free_port
    from edgectl.client import Client
    from edgectl.llamacpp import find_llama_server
    from edgectl.models.cache import gguf_path
    from edgectl.models.catalog import CATALOG

    found = find_llama_server(dict(os.environ))
    source = gguf_path(CATALOG["smollm2-135m"], os.environ)
    if not found.path or not (Path(found.path).parent / requantize.QUANTIZE).is_file():
        pytest.skip(found.origin if not found.path else f"no {requantize.QUANTIZE} beside {found.path}")
    if not source.is_file():
        pytest.skip("smollm2-135m is not pulled (`edgectl models pull smollm2-135m`)")
    q4_0 = requantize.variants(["Q4_0"], source, found.path, None, tmp_path / "cache", lambda _m: None)["Q4_0"]
    assert requantize.file_type(q4_0.gguf) == "Q4_0" and q4_0.provenance["source"]["gguf_type"] == "Q4_1"
    for gguf, repacked in ((q4_0.gguf, True), (source, False)):
        port = free_port()
        server = ServerProcess([found.path, "-m", str(gguf), "-c", "512", "-t", "1", "--host", "127.0.0.1",
                                "--port", str(port), "--no-webui", "-lv", str(llama_log.VERBOSITY)],
                               dict(os.environ), tmp_path / f"{Path(gguf).name}.log")
        try:
            deadline = time.monotonic() + 120
            while Client("127.0.0.1", port).status("/health") != 200:
                assert server.alive() and time.monotonic() < deadline, server.log_tail(5)
                time.sleep(0.2)
        finally:
            server.stop()
        facts = llama_log.repack(server.log_path.read_text(errors="replace").splitlines())
        assert facts["repacked"] is repacked, server.log_tail(20)
