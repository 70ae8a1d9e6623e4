"""The vision bench without an engine: its images, llama.cpp's GGUF pair (converted once, with its
provenance), its arms, its measurement of a stream, and its report from recorded passes."""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgectl.bench.arms import BenchContext
from edgectl.bench.measure import MeasurementFailed
from edgectl.bench.vision import gguf_pair, images, measure
from edgectl.bench.vision import report as vision_report
from edgectl.bench.vision.arms import (
    ARMS,
    VisionLlamaCppArm,
    parse_arm_names,
    prepare_arms,
)
from edgectl.client import Stream
from edgectl.errors import EdgectlError

# -- the images -------------------------------------------------------------------------------------


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the unfiltered RGB bytes of a PNG of one IDAT with filter 0 (what images.py writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind] = body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = [raw[y * (width * 3 + 1):(y + 1) * (width * 3 + 1)] for y in range(height)]
    assert all(r[0] == 0 for r in rows)
    return width, height, b"".join(r[1:] for r in rows)


def test_the_images_are_seeded_512_square_pngs_fresh_per_request() -> None:
    one = images.noise_png(7)
    width, height, pixels = read_png(one)
    assert (width, height, len(pixels)) == (512, 512, 512 * 512 * 3)
    assert images.noise_png(7) == one and images.noise_png(8) != one
    assert images.data_uri(one).startswith("data:image/png;base64,iVBORw0KGgo")
    seeds = {images.image_seed(p, r, s) for s in (0, 1) for p in range(5) for r in range(6)}
    assert len(seeds) == 2 * 5 * 6


# -- llama.cpp's GGUF pair --------------------------------------------------------------------------

FAKE_CONVERTER = """
import sys, pathlib
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--outfile") + 1])
runs = pathlib.Path(sys.argv[0]).with_name("runs.txt")
runs.write_text(runs.read_text() + " ".join(args) + "\\n" if runs.exists() else " ".join(args) + "\\n")
if "FAIL" in pathlib.Path(args[0], "config.json").read_text():
    print("KeyError: the converter cannot read it"); sys.exit(1)
out.write_bytes(b"GGUF" + (b"mmproj" if "--mmproj" in args else b"text"))
"""


def converter(tmp_path: Path) -> gguf_pair.Converter:
    script = tmp_path / "tools" / "convert_hf_to_gguf.py"
    script.parent.mkdir()
    script.write_text(FAKE_CONVERTER)
    return gguf_pair.Converter(script=script, python=sys.executable, build="0.3.36", source="llama-cpp-python==0.3.36")


def model_dir(tmp_path: Path, config: str = "{}") -> Path:
    d = tmp_path / "synth-vlm"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(config)
    (d / "model.safetensors").write_bytes(b"weights")
    (d / "edgectl-model.json").write_text("{}")  # edgectl's own record: not part of the source
    return d


def test_the_pair_is_converted_once_with_its_provenance(tmp_path: Path) -> None:
    conv, src, cache = converter(tmp_path), model_dir(tmp_path), tmp_path / "cache"
    pair = gguf_pair.gguf_pair(src, conv, cache, {}, progress=lambda line: None)
    assert pair.text.read_bytes() == b"GGUFtext" and pair.mmproj.read_bytes() == b"GGUFmmproj"
    assert pair.text.parent.parent == cache / "vision-gguf"
    record = json.loads((pair.text.parent / "converted.json").read_text())
    assert record == pair.provenance
    assert record["converter"]["build"] == "0.3.36" and record["converter"]["source"] == "llama-cpp-python==0.3.36"
    assert len(record["converter"]["sha256"]) == 64 and record["outtype"] == "bf16"
    assert record["text"]["sha256"] == gguf_pair.sha256_file(pair.text) and record["mmproj"]["bytes"] == 10
    assert set(record["source"]["files"]) == {"config.json", "model.safetensors"}
    assert record["commands"]["mmproj"][-3:] == ["--mmproj", "--outfile", str(pair.mmproj)]
    assert "--mmproj" not in record["commands"]["text"] and record["commands"]["text"][-1] == str(pair.text)
    runs = (conv.script.parent / "runs.txt").read_text().splitlines()
    assert len(runs) == 2

    again = gguf_pair.gguf_pair(src, conv, cache, {}, progress=lambda line: None)
    assert again == pair and len((conv.script.parent / "runs.txt").read_text().splitlines()) == 2  # kept

    (src / "model.safetensors").write_bytes(b"other weights")  # another model: another pair
    other = gguf_pair.gguf_pair(src, conv, cache, {}, progress=lambda line: None)
    assert other.text.parent != pair.text.parent and pair.text.is_file()


def test_a_failed_conversion_writes_nothing(tmp_path: Path) -> None:
    conv, cache = converter(tmp_path), tmp_path / "cache"
    with pytest.raises(EdgectlError, match=r"convert_hf_to_gguf.py failed \(exit 1\): KeyError"):
        gguf_pair.gguf_pair(model_dir(tmp_path, '{"FAIL": 1}'), conv, cache, {}, progress=lambda line: None)
    assert list((cache / "vision-gguf").iterdir()) == []


# -- the arms ---------------------------------------------------------------------------------------


def context(tmp_path: Path, gguf: str | None = "/c/model.gguf") -> BenchContext:
    planned = SimpleNamespace(max_model_len=4096, max_num_seqs=4)
    return BenchContext(model_name="synth-vlm", model_path=str(tmp_path), vocab_size=0, kv_bytes_per_token=0,
                        planned=planned, planner=lambda o: None, runtime_python=sys.executable,  # type: ignore[arg-type]
                        child_env={}, logs_dir=tmp_path / "logs", usable_cpus=2, stock_plugins="",
                        llama_server="/b/llama-server", gguf_path=gguf, llama_threads=(1, 2))


def test_arm_names() -> None:
    assert parse_arm_names(None) == ["planned", "stock", "llama.cpp"]
    assert parse_arm_names("all") == list(ARMS)
    with pytest.raises(EdgectlError, match="unknown vision arm"):
        parse_arm_names("planned,llama.cpp-q4_0")
    with pytest.raises(EdgectlError, match="given twice"):
        parse_arm_names("stock,stock")


def test_llama_server_gets_the_projector_at_each_thread_count(tmp_path: Path) -> None:
    arms, skipped = prepare_arms(["llama.cpp"], context(tmp_path), mmproj=Path("/c/mmproj.gguf"), why_no_llama=None)
    assert skipped == {} and [a.name for a in arms] == ["llama.cpp-t1", "llama.cpp-t2"]
    args = arms[1].server_args(8080)
    assert args[args.index("-m") + 1] == "/c/model.gguf" and args[args.index("--mmproj") + 1] == "/c/mmproj.gguf"
    assert args[args.index("-t") + 1] == "2" and args[args.index("-np") + 1] == "4"
    assert args[args.index("-c") + 1] == str(4096 * 4)
    assert arms[1].describe()["mmproj"] == "/c/mmproj.gguf"

    arms, skipped = prepare_arms(["llama.cpp"], context(tmp_path, gguf=None), mmproj=None,
                                 why_no_llama="no GGUF pair: the converter failed")
    assert arms == [] and skipped == {"llama.cpp": "no GGUF pair: the converter failed"}


def test_a_llama_server_without_vision_is_invalid(tmp_path: Path) -> None:
    from edgectl.contract.effective import Effective

    arm = VisionLlamaCppArm(ARMS["llama.cpp"], context(tmp_path), Path("/c/mmproj.gguf"), threads=2)
    eff = Effective.from_dict({"schema": "edgectl.effective/1", "max_model_len": 16384, "max_num_seqs": 4,
                               "threads": 2, "model_path": "/c/model.gguf"})
    arm.modalities = {"vision": True, "audio": False}
    assert arm.check(eff, 1) == ["max_model_len is 16384, the arm asks for 4096"]
    arm.modalities = {"vision": False}
    assert any("takes no images" in p for p in arm.check(eff, 1))


def test_the_llama_read_back_is_one_the_bench_can_read(tmp_path: Path) -> None:
    from edgectl.contract.effective import Effective

    class Props:
        def get_json(self, path: str, timeout: float = 10.0) -> dict:
            assert path == "/props"
            return {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4, "model_path": "/c/model.gguf",
                    "build_info": "b1-0c1e570", "modalities": {"vision": True, "video": True, "audio": False}}

    class Log:
        def log_tail(self, lines: int) -> list[str]:
            return ["system_info: n_threads = 2 (n_threads_batch = 2) / 2"]

    arm = VisionLlamaCppArm(ARMS["llama.cpp"], context(tmp_path), Path("/c/mmproj.gguf"), threads=2)
    raw = arm.readback(Props(), Log())  # type: ignore[arg-type]
    effective, problems = Effective.read(raw)
    assert problems == [] and effective is not None
    assert arm.check(effective, 1) == []
    assert arm.from_log(Log())["llama_cpp"]["modalities"]["vision"] is True  # type: ignore[arg-type]


# -- one stream -------------------------------------------------------------------------------------


class StreamingClient:
    """A stand-in Client whose streams are made up: ``per_token_s`` between tokens, the first after ``ttft_s``."""

    def __init__(self, tokens: int = measure.DECODE_TOKENS, ttft_s: float = 2.0, per_token_s: float = 0.1) -> None:
        self.tokens, self.ttft_s, self.per_token_s = tokens, ttft_s, per_token_s
        self.bodies: list[dict[str, Any]] = []

    def stream(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> Stream:
        assert path == "/v1/chat/completions"
        self.bodies.append(body)
        chunks = [(100.0 + self.ttft_s + i * self.per_token_s, {"choices": [{"delta": {"content": f"t{i}"}}]})
                  for i in range(self.tokens)]
        chunks.append((chunks[-1][0], {"choices": [], "usage": {"completion_tokens": self.tokens, "prompt_tokens": 1142}}))
        return Stream(100.0, chunks)


def test_one_answer_s_ttft_and_decode() -> None:
    client = StreamingClient()
    r = measure.one_image(client, "m", images.noise_png(1))  # type: ignore[arg-type]
    assert r["ttft_s"] == pytest.approx(2.0) and r["prompt_tokens"] == 1142
    assert r["decode_tok_s"] == pytest.approx((measure.DECODE_TOKENS - 1) / ((measure.DECODE_TOKENS - 1) * 0.1))
    assert "t_sent" not in r and r["with_image"] is True
    content = client.bodies[0]["messages"][0]["content"]
    assert content[0]["image_url"]["url"].startswith("data:image/png;base64,") and content[1]["type"] == "text"
    assert client.bodies[0]["ignore_eos"] is True and client.bodies[0]["temperature"] == 0

    measure.text_only(client, "m")  # type: ignore[arg-type]
    assert [p["type"] for p in client.bodies[1]["messages"][0]["content"]] == ["text"]
    with pytest.raises(MeasurementFailed, match="not 64"):
        measure.one_image(StreamingClient(tokens=10), "m", images.noise_png(1))  # type: ignore[arg-type]


class AlternatingClient(StreamingClient):
    """Streams whose pace depends on the request: ``image_s`` / ``text_s`` between tokens, each a list
    consumed in the order requests arrive (a host that changes pace during a pass)."""

    def __init__(self, image_s: list[float], text_s: list[float]) -> None:
        super().__init__()
        self.image_s, self.text_s = image_s, text_s

    def stream(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> Stream:
        with_image = body["messages"][0]["content"][0]["type"] == "image_url"
        self.per_token_s = (self.image_s if with_image else self.text_s).pop(0)
        return super().stream(path, body, timeout)


def test_decode_pairs_alternate_and_take_the_median_of_their_own_ratios() -> None:
    # pair 0: the first image (already answered) then text; pair 1 text first; pair 2 image first.
    # The host slows 2x for pair 1 (both halves): its ratio is still 0.9, and the median ratio is
    # 0.9 whatever the single outlier pair says.
    client = AlternatingClient(image_s=[0.2 / 0.9, 0.1 / 0.5], text_s=[0.1, 0.2, 0.1])
    first = {"decode_tok_s": 9.0, "ttft_s": 2.0, "with_image": True}
    r = measure.decode_pairs(client, "m", first, [images.noise_png(2), images.noise_png(3)])  # type: ignore[arg-type]
    kinds = ["image" if b["messages"][0]["content"][0]["type"] == "image_url" else "text" for b in client.bodies]
    assert kinds == ["text", "text", "image", "image", "text"]  # (first, text), (text, image), (image, text)
    assert [p["text"]["decode_tok_s"] for p in r["pairs"]] == pytest.approx([10.0, 5.0, 10.0])
    assert [p["image"]["decode_tok_s"] for p in r["pairs"]] == pytest.approx([9.0, 4.5, 5.0])
    assert r["image_text_decode_ratio"] == pytest.approx(0.9)  # ratios 0.9, 0.9, 0.5
    assert r["decode_image_tok_s"] == pytest.approx(5.0) and r["decode_text_tok_s"] == pytest.approx(10.0)
    assert len(r["pairs"]) == measure.DECODE_PAIRS


def test_four_images_at_once_aggregate_every_answer() -> None:
    r = measure.together(StreamingClient(), "m", [images.noise_png(i) for i in range(4)])  # type: ignore[arg-type]
    span = 2.0 + (measure.DECODE_TOKENS - 1) * 0.1
    assert r["requests"] == 4 and r["aggregate_tok_s"] == pytest.approx(4 * measure.DECODE_TOKENS / span)
    assert r["prompt_tokens"] == [1142] * 4


# -- the report from recorded passes ----------------------------------------------------------------


def rec(arm: str, i: int, ttft: float, image: float, text: float, agg: float, pss: int, status: str = "ok") -> dict:
    r: dict[str, Any] = {"arm": arm, "pass": i, "status": status, "problems": [], "error": None}
    if status == "ok":
        r.update(ttft_image_s=ttft, decode_image_tok_s=image, decode_text_tok_s=text, aggregate_tok_s=agg,
                 ready_s=20.0 + i, pss_steady_bytes=pss, pss_peak_bytes=pss * 2, processes=1, prompt_tokens_image=1142)
    else:
        r["error"] = "the server exited with code 1 before it was ready"
    return r


def artifact(records: dict[str, list[dict]], passes: int) -> dict:
    launcher = {"planned": "worker", "stock": "vllm-stock"}
    return {"provenance": {"model": "synth-vlm", "passes": passes, "device_class": "x86_64-amx",
                           "requests": {"image_px": "512x512", "question": measure.QUESTION, "decode_tokens": 64,
                                        "concurrent_images": 4}},
            "arms": {n: {"launcher": launcher.get(n, "llama.cpp"), "plan": None, "passes": []} for n in records},
            "skipped": {}}


def test_the_report_compares_with_llama_cpp_at_its_best() -> None:
    records = {
        "planned": [rec("planned", i, 6.0 + i / 10, 19.0, 20.0, 40.0, 700_000_000) for i in range(3)],
        "llama.cpp-t1": [rec("llama.cpp-t1", i, 20.0, 8.0, 10.0, 12.0, 600_000_000) for i in range(3)],
        "llama.cpp-t2": [rec("llama.cpp-t2", i, 12.0, 15.0, 16.0, 20.0, 620_000_000) for i in range(3)],
    }
    a = artifact(records, 3)
    vision_report.finish(a, records, 3)
    assert a["complete"] and a["quotable"]
    assert a["arms"]["planned"]["median"]["ttft_image_s"] == pytest.approx(6.1)
    assert a["arms"]["planned"]["median"]["image_text_decode_ratio"] == pytest.approx(0.95)
    vs = a["versus_llama_cpp"]
    assert vs["reference_arms"] == {"ttft_image_s": "llama.cpp-t2", "aggregate_tok_s": "llama.cpp-t2",
                                    "pss_steady_bytes": "llama.cpp-t1"}
    planned = vs["arms"]["planned"]
    assert planned["ttft_ratio"] == pytest.approx(6.1 / 12.0) and planned["ttft_holds"]
    assert planned["ttft_goal_met"] is False  # 0.508×: the bar holds, the goal of half does not
    assert planned["image_text_decode_holds"] and planned["aggregate_ratio"] == pytest.approx(2.0)
    assert vs["arms"]["llama.cpp-t1"]["image_text_decode_holds"] is False  # 0.8×
    assert "ttft_ratio" not in vs["arms"]["llama.cpp-t1"]
    text = vision_report.render_text(a, None, [])
    assert "— complete" in text and "planned: TTFT 0.51× (bar ≤ 1×: holds, goal 0.5× not met)" in text


def test_an_incomplete_or_noisy_grid_is_not_quoted() -> None:
    records = {"planned": [rec("planned", 0, 6.0, 19.0, 20.0, 40.0, 1), rec("planned", 1, 0, 0, 0, 0, 0, "crashed")],
               "llama.cpp-t2": [rec("llama.cpp-t2", i, 12.0, 15.0, 16.0, 20.0, 1) for i in range(2)]}
    a = artifact(records, 2)
    vision_report.finish(a, records, 2)
    assert not a["complete"] and not a["quotable"] and a["versus_llama_cpp"] is None
    assert a["arms"]["planned"]["median"] is None
    assert "no comparisons: the grid is incomplete" in vision_report.render_text(a, None, [])

    noisy = {"planned": [rec("planned", i, 6.0 * (1 + i), 19.0, 20.0, 40.0, 1) for i in range(3)]}
    a = artifact(noisy, 3)
    vision_report.finish(a, noisy, 3)
    assert a["complete"] and not a["quotable"] and a["noise"]["arms"]["planned"]["noisy"]
    assert "noisy: planned" in vision_report.render_text(a, None, [])


# -- a whole run on stand-in servers ----------------------------------------------------------------


def test_a_run_on_stand_in_servers_writes_a_complete_artifact(tmp_path: Path) -> None:
    from bench_helpers import HOST, environ, fake_launchers
    from vision_helpers import make_vlm

    from edgectl.bench.vision.core import (
        VisionBenchOptions,
        is_vision_model,
        run_vision_bench,
    )
    from edgectl.probe import probe

    model = make_vlm(tmp_path / "synth-vlm")
    assert is_vision_model(str(model), {}) and not is_vision_model(str(tmp_path), {})
    (tmp_path / "pair").mkdir()
    pair = gguf_pair.GgufPair(tmp_path / "pair" / "model.gguf", tmp_path / "pair" / "mmproj.gguf",
                              {"converter": {"build": "0.3.36"}})
    opts = VisionBenchOptions(model=str(model), arms="planned,llama.cpp", passes=1, out=tmp_path / "results",
                              start_timeout_s=60, llama_threads="2", argv=["edgectl", "bench", "test"], quiet_s=0.0)
    lines: list[str] = []
    result = run_vision_bench(opts, environ(tmp_path), lines.append, facts=probe(str(HOST), environ={}),
                              launchers=fake_launchers(), pair=pair)
    a = result.to_dict()
    assert a["schema"] == "edgectl.bench.vision/1" and a["complete"], a["incomplete_reasons"]
    assert list(a["arms"]) == ["planned", "llama.cpp-t2"] and not a["quotable"]  # one pass: indicative only
    planned = a["arms"]["planned"]["passes"][0]
    assert planned["prompt_tokens_image"] > planned["prompt_tokens_text"] + 1000  # the image was sent
    assert len(planned["decode_pairs"]["pairs"]) == measure.DECODE_PAIRS
    assert planned["image_text_decode_ratio"] == a["arms"]["planned"]["median"]["image_text_decode_ratio"]
    assert planned["together"]["requests"] == 4 and planned["pss_steady_bytes"] > 0
    llama = a["arms"]["llama.cpp-t2"]
    assert "--mmproj" in llama["passes"][0]["command"] and llama["passes"][0]["llama_cpp"]["modalities"]["vision"]
    assert a["provenance"]["llama_server"]["gguf_pair"] == pair.provenance
    assert a["versus_llama_cpp"]["reference_arms"]["ttft_image_s"] == "llama.cpp-t2"
    assert "planned" in a["memory_prediction"]["arms"]
    assert result.path is not None and json.loads(result.path.read_text()) == a
    assert "edgectl bench synth-vlm (vision)" in result.render_text()
