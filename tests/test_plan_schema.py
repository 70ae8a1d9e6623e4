"""The plan as every reader reads it (``Plan.from_dict``): plans written by an earlier edgectl still
load unchanged, and a malformed plan is refused naming each bad field."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from plan_helpers import SMOLLM2, host_facts, make_plan, shape

from edgectl.contract import codec
from edgectl.contract.plan import (
    BenchLevers,
    Plan,
    Request,
    Source,
    Topology,
    WeightFormat,
)
from edgectl.errors import EdgectlError

OLD_PLANS = sorted((Path(__file__).parent / "fixtures" / "plans").glob("*.json"))


# Fields added after the fixtures were written, with the default an older plan loads with
# (unmodified vLLM's behaviour: the memory levers of docs/memory.md off, bf16 KV).
ADDED_SINCE = {
    None: {"kv_cache_dtype": "auto"},
    "levers": {"embedding_pack": "vllm", "optional_imports": "load", "python_optimize": 0, "tokenizer": "vllm",
               "idle_trim": False, "thread_wait": "spin", "huge_pages": False,
               "decode_attention": False, "lean_attention": False, "cpp_wrapper": False},
    "request": {"kv_cache_dtype": None, "embedding_pack": None, "optional_imports": None, "tokenizer": None, "idle_trim": None,
                "python_optimize": None, "thread_wait": None, "huge_pages": None, "decode_attention": None, "lean_attention": None, "cpp_wrapper": None, "speech_head": None, "speech_dtype": None,
                "tower_tiles": None},
    "predicted": {"measured_on": None},
}


def problems_of(data) -> list[str]:
    with pytest.raises(EdgectlError) as exc:
        Plan.from_dict(data)
    return [exc.value.message, *exc.value.details]


@pytest.fixture
def plan_dict() -> dict:
    return json.loads(OLD_PLANS[0].read_text())


@pytest.mark.parametrize("path", OLD_PLANS, ids=lambda p: p.stem)
def test_a_plan_written_by_an_earlier_edgectl_loads_unchanged(path: Path):
    text = path.read_text()
    plan = Plan.from_dict(json.loads(text))
    # written back, it is the same document, field for field and in the same order, plus the
    # fields added since, at their defaults: what that plan ran with
    written = json.loads(plan.to_json())
    for section, added in ADDED_SINCE.items():
        where = written if section is None else written[section]
        for key, default in added.items():
            assert where.pop(key) == default, (section, key)
    assert json.dumps(written, indent=2) + "\n" == text
    assert plan.kv_cache_bytes == json.loads(text)["kv_cache_bytes"] == plan.memory.kv_cache_bytes


def test_the_three_fixtures_cover_what_readers_branch_on():
    plans = [Plan.from_dict(json.loads(p.read_text())) for p in OLD_PLANS]
    assert {p.weight_format for p in plans} == {WeightFormat.W4A16, WeightFormat.BF16}
    assert {p.topology for p in plans} == {Topology.SINGLE_PROCESS, Topology.STOCK}
    assert {p.serve.host for p in plans} == {"0.0.0.0", "127.0.0.1"}


# Every edgectl before w4a8-amx left the formats wrote it into a plan's formats_not_runnable reason
# (a reason's value is free data, not a WeightFormat). Those plans sit on users' boxes as
# /etc/edgectl/NAME/plan.json: status reads them, and a plan that failed to read would show as none.
PLANS_NAMING_W4A8_AMX = [*(p for p in OLD_PLANS if p.name != "bf16-1024.json"),
                         Path(__file__).parent / "fixtures" / "plans" / "later" / "x86_64-amx-28c3555.json"]


@pytest.mark.parametrize("path", PLANS_NAMING_W4A8_AMX, ids=lambda p: p.stem)
def test_a_stored_plan_naming_w4a8_amx_still_loads_and_shows(path: Path, tmp_path: Path):
    data = json.loads(path.read_text())
    skipped = [r for r in data["reasons"] if r["decision"] == "formats_not_runnable"]
    assert "w4a8-amx" in skipped[0]["value"] and "w4a8-amx: " in skipped[0]["detail"]  # the fixture does
    plan = Plan.from_dict(data)
    assert json.loads(plan.to_json())["reasons"] == data["reasons"]  # kept as written
    # deployed: found where status looks, and shown
    from edgectl.deployment import Layout
    from edgectl.status import status_of

    env = {"EDGECTL_CONFIG_DIR": str(tmp_path / "etc"), "EDGECTL_UNIT_DIR": str(tmp_path / "units")}
    name = "noamx-stored-plan-test"  # no such unit exists: systemd (where it runs) reports it not loaded
    layout = Layout.of(name, env)
    layout.config_dir.mkdir(parents=True)
    layout.plan_path.write_text(path.read_text())
    assert layout.existing_plan() == plan
    shown = status_of(name, env)
    assert shown.plan == plan
    assert f"model smollm2-135m ({plan.weight_format})" in shown.render_text()


def test_a_new_plan_reads_back_equal():
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), shape("qwen3-1.7b"))
    again = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p and again.to_dict() == p.to_dict()
    assert isinstance(again.weight_format, WeightFormat) and isinstance(again.reasons[0].source, Source)


def test_unknown_fields_are_refused_by_name(plan_dict):
    plan_dict["turbo"] = True
    plan_dict["levers"]["warp"] = 9
    found = problems_of(plan_dict)
    assert any(p.startswith("plan.turbo: unknown field (known: ") for p in found), found
    assert any(p.startswith("plan.levers.warp: unknown field (known: cpp_wrapper, decode_attention, embedding_pack, huge_pages, idle_trim, kv_exact, layerwise_repack, lean_attention, ") for p in found), found
    assert len(found) == 2


@pytest.mark.parametrize("change, says", [
    (lambda d: d.update(threads="two"), "plan.threads: expected an integer, got a string 'two'"),
    (lambda d: d.update(max_model_len=True), "plan.max_model_len: expected an integer, got a boolean True"),
    (lambda d: d.update(weight_format="w8a16"),
     "plan.weight_format: 'w8a16' is not one of w4a16, w4a8, w8a8, w4a16-vllm, bf16"),
    # a format edgectl never served cannot be a plan's (no plan with it was ever written: every path refused it)
    (lambda d: d.update(weight_format="w4a8-amx"),
     "plan.weight_format: 'w4a8-amx' is not one of w4a16, w4a8, w8a8, w4a16-vllm, bf16"),
    (lambda d: d.update(device_class="x86_64-sse"), "plan.device_class: 'x86_64-sse' is not one of"),
    (lambda d: d.pop("rope_rows"), "plan.rope_rows: missing"),
    (lambda d: d["memory"].pop("limit_bytes"), "plan.memory.limit_bytes: missing"),
    (lambda d: d["model"].update(path=""), "plan.model.path: expected a non-empty string"),
    (lambda d: d["reasons"][0].update(source="hearsay"), "plan.reasons[0].source: 'hearsay' is not one of"),
    (lambda d: d["request"].update(max_num_seqs=None), "plan.request.max_num_seqs: expected an integer, got null"),
    (lambda d: d.update(cpus=[]), "plan.cpus: expected a non-empty list of distinct CPU numbers, got []"),
    (lambda d: d.update(kv_cache_bytes=1), "plan.kv_cache_bytes: 1 differs from memory.kv_cache_bytes"),
    (lambda d: d.pop("kv_cache_bytes"), "plan.kv_cache_bytes: missing"),
    (lambda d: d["levers"].update(topology="stock"), "plan.levers.topology: stock differs from topology"),
    (lambda d: d["timeouts"].update(stop_s=0), "plan.timeouts.stop_s: expected a number >= 1, got 0"),
])
def test_a_bad_field_is_named(plan_dict, change, says):
    change(plan_dict)
    found = problems_of(plan_dict)
    assert len(found) == 1 and found[0].startswith(says), found


def test_every_bad_field_is_named_at_once(plan_dict):
    plan_dict["threads"] = -1
    plan_dict["serve"]["port"] = 0
    del plan_dict["predicted"]["ready_s"]
    plan_dict["env"]["2BAD"] = "x"
    found = problems_of(plan_dict)
    assert len(found) == 4, found
    for field_ in ("plan.threads:", "plan.serve.port: 0 is not a TCP port", "plan.predicted.ready_s: missing",
                   "plan.env: '2BAD' is not a variable name"):
        assert sum(p.startswith(field_) for p in found) == 1, (field_, found)


@pytest.mark.parametrize("data, says", [
    ({"schema": "edgectl.plan/2"}, "this is not an edgectl plan (schema edgectl.plan/1, got schema 'edgectl.plan/2')"),
    ({"model": "x"}, "this is not an edgectl plan (schema edgectl.plan/1)"),
    ([1, 2], "plan: not a JSON object, got a list"),
])
def test_what_is_not_a_plan_says_so(data, says):
    assert says in problems_of(data)[0]


def test_a_plan_file_is_named_in_every_line(tmp_path: Path, plan_dict):
    path = tmp_path / "plan.json"
    bad = copy.deepcopy(plan_dict)
    bad["threads"], bad["block_size"] = "x", "y"
    path.write_text(json.dumps(bad))
    with pytest.raises(EdgectlError) as exc:
        Plan.load(path)
    assert exc.value.message.startswith(f"{path}: plan.")
    assert exc.value.details and all(d.startswith(f"{path}: plan.") for d in exc.value.details)
    path.write_text("{not json")
    with pytest.raises(EdgectlError, match=f"the plan {path} is not JSON"):
        Plan.load(path)
    with pytest.raises(EdgectlError, match="cannot read the plan"):
        Plan.load(tmp_path / "missing.json")


# -- how the schema grows ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Before:
    name: str
    size: int


@dataclass(frozen=True)
class _After:
    name: str
    size: int
    compile_cache: str | None = field(default=None, kw_only=True)  # a field added later


def test_a_field_added_with_a_default_keeps_older_documents_loading():
    old = codec.to_json(_Before("x", 3))
    after, problems = codec.read(_After, old, "doc")
    assert problems == [] and after == _After("x", 3)
    new = codec.to_json(_After("x", 3, compile_cache="/var/cache/x"))
    assert codec.read(_After, new, "doc")[0].compile_cache == "/var/cache/x"
    # the older reader refuses the newer field by name: a typo is never silently ignored
    assert codec.read(_Before, new, "doc") == (None, [
        "doc.compile_cache: unknown field (known: name, size)"])


# ---- the request: what the user asked, and apart what the bench varies; one flat object in JSON --


def test_the_bench_levers_are_apart_in_the_request_and_inline_in_its_json():
    plan = make_plan(host_facts("xeon-spr-amx-2s"), shape(SMOLLM2), max_model_len=1024, topology="stock",
                     rope_cap=False, kv_cache_bytes=64 << 20)
    assert (plan.request.max_model_len, plan.request.bench.topology, plan.request.bench.rope_cap,
            plan.request.bench.kv_cache_bytes) == (1024, "stock", False, 64 << 20)
    written = plan.to_dict()["request"]
    assert "bench" not in written and (written["topology"], written["rope_cap"]) == ("stock", False)
    # the keys in the order plans had before the levers had their own type
    assert list(written)[9:16] == ["port", "topology", "rope_cap", "layerwise_repack", "reserve_frontend_core",
                                   "compilation", "quantize_lm_head"]
    assert Plan.from_dict(plan.to_dict()) == plan
    broken = plan.to_dict()
    broken["request"].update(rope_cap="no", bench={})
    assert problems_of(broken) == [
        "plan.request.bench: unknown field (known: " + ", ".join(sorted(written)) + ")",
        "plan.request.rope_cap: expected a boolean, got a string 'no'"]


def test_a_request_from_flat_names_sends_each_lever_to_the_bench():
    asked = Request.from_flat(model="m", max_model_len=512, compilation="eager", idle_trim=False, topology="stock")
    assert asked == Request(model="m", max_model_len=512, compilation="eager",
                            bench=BenchLevers(idle_trim=False, topology="stock"))


@dataclass(frozen=True)
class _Inner:
    b: int = 0
    d: int = 0


@dataclass(frozen=True)
class _Outer:
    a: int
    c: int = 0
    inner: _Inner = field(default_factory=_Inner, metadata=codec.flat())

    _json_order = ("a", "b", "c", "d")


def test_a_flat_field_is_written_and_read_among_its_parents_keys():
    value = _Outer(1, 3, _Inner(2, 4))
    assert list(codec.to_json(value).items()) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert codec.read(_Outer, {"a": 1, "b": 2, "c": 3, "d": 4}, "doc") == (value, [])
    assert codec.read(_Outer, {"a": 1}, "doc") == (_Outer(1), [])
    assert codec.read(_Outer, {"a": 1, "d": True, "inner": {}}, "doc") == (None, [
        "doc.inner: unknown field (known: a, b, c, d)", "doc.d: expected an integer, got a boolean True"])
