"""The Kubernetes objects of one plan (edgectl/fleet/k8s.py): golden files, the schemas of a current
Kubernetes release, and what they mirror of the systemd unit.

Golden files live in tests/golden/k8s/<scenario>/: the input ``plan.json`` (a whole
edgectl.plan/1 plan), ``target.json`` (the node class: id, NFD selector, replicas, image) and
the expected ``objects.yaml``, byte for byte. Every folder is a listed scenario and every file in
it is used. After a deliberate change, regenerate and review the diff:

    PYTHONPATH=.:runtime python tests/test_fleet_k8s.py --regen

Offline validation uses the ``kubernetes-validate`` package (the test extra in pyproject.toml,
installed by scripts/setup.sh), which carries the JSON schemas of each Kubernetes release it
supports: nothing is downloaded. ``kubectl apply --dry-run=client`` runs too where kubectl can
reach an API server (client-side dry run still asks the server for its resource list).
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgectl.contract.plan import Plan
from edgectl.errors import EdgectlError
from edgectl.fleet import k8s
from edgectl.units import render_unit, unit_environment

GOLDEN = Path(__file__).parent / "golden" / "k8s"
REPO = Path(__file__).resolve().parents[1]

SCENARIOS = {
    "avx2-small": "a 2-core AVX2 node class, one node, the default image",
    "amx-three-nodes": "an AMX class of three nodes (56 cores, 4 sequences), an image pinned by digest",
    "odd-values-reserve-core": "IPv6 wildcard, port 18080, a model path with a space and %, an environment value "
                               "with quotes, $ and %, a fractional start timeout, a core reserved for the front end",
}
FILES = {"plan.json", "target.json", "objects.yaml"}

# Kubernetes' quantity syntax (k8s.io/apimachinery/pkg/api/resource), as edgectl writes them.
QUANTITY = re.compile(r"(\d+(\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?")


def load_scenario(scenario: str) -> tuple[dict, k8s.Target]:
    folder = GOLDEN / scenario
    plan = json.loads((folder / "plan.json").read_text())
    target = k8s.Target.from_dict(json.loads((folder / "target.json").read_text()))
    return plan, target


def render(plan: dict, target: k8s.Target) -> list[dict]:
    """The objects for a plan as JSON, read as every reader reads a plan (strictly)."""
    return k8s.render_objects(Plan.from_dict(plan), target)


def render_scenario(scenario: str) -> str:
    plan, target = load_scenario(scenario)
    return k8s.render_yaml(render(plan, target), [f"scenario {scenario}"])


def objects_of(scenario: str) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(render_scenario(scenario)) if d]
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_objects_match_golden_file(scenario):
    expected = GOLDEN / scenario / "objects.yaml"
    assert expected.is_file(), f"missing {expected}; run: python tests/test_fleet_k8s.py --regen"
    assert render_scenario(scenario) == expected.read_text(encoding="utf-8")


def test_every_golden_file_is_used():
    assert {p.name for p in GOLDEN.iterdir()} == set(SCENARIOS), "golden folders and SCENARIOS differ"
    for scenario in SCENARIOS:
        assert {p.name for p in (GOLDEN / scenario).iterdir()} == FILES, scenario


# --- the schemas of a current Kubernetes release, offline ------------------------------------


def _latest_schemas() -> str:
    import kubernetes_validate.utils as kv

    version = kv.latest_version()
    # a current release: the package carries 1.37's schemas (1.33 is the oldest still supported
    # upstream as this is written)
    assert tuple(int(x) for x in version.split(".")[:2]) >= (1, 33), version
    return version


def validate(obj: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(obj, _latest_schemas(), strict=True)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_objects_validate_against_the_kubernetes_schemas(scenario):
    objects = objects_of(scenario)
    assert set(objects) == {"ConfigMap", "Deployment", "Service"}
    for obj in objects.values():
        validate(obj)  # raises kubernetes_validate.ValidationError naming the path


def test_the_schema_check_can_fail():
    import kubernetes_validate

    deployment = objects_of("avx2-small")["Deployment"]
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFs"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFs"):
        validate(wrong)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(wrong)


def _kubectl_reason() -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not installed"
    probe = subprocess.run([kubectl, "version", "--request-timeout=5s", "-o", "json"], capture_output=True,
                           text=True, timeout=30)
    if probe.returncode != 0 or "serverVersion" not in probe.stdout:
        return ("kubectl is installed but reaches no API server: `kubectl apply --dry-run=client` still asks "
                "the server for its resource list and OpenAPI schema, so it cannot run here")
    return None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kubectl_client_dry_run_accepts_the_objects(tmp_path, scenario):
    reason = _kubectl_reason()
    if reason:
        pytest.skip(reason)
    path = tmp_path / "objects.yaml"
    path.write_text(render_scenario(scenario))
    r = subprocess.run(["kubectl", "apply", "--dry-run=client", "--validate=strict", "-f", str(path), "-o", "name"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(f"{kind.lower()}{'.apps' if kind == 'Deployment' else ''}/"
                                              f"{obj['metadata']['name']}" for kind, obj in objects_of(scenario).items())


# --- what the objects carry of the plan and of the unit ------------------------------------------


def _container(objects: dict) -> dict:
    return objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def _unit_settings(plan: dict) -> dict[str, list[str]]:
    unit = render_unit(Plan.from_dict(plan), plan_path=f"/etc/edgectl/{plan['serve']['name']}/plan.json", python=k8s.IMAGE_PYTHON)
    out: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


_C_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


def _systemd_words(value: str, *, dollar: bool = False) -> list[str]:
    """The words systemd reads from a setting the unit writer quoted (units/README.md, "Quoting")."""
    words = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\S+)', value):
        word = m.group(2)
        if word is None:
            word = re.sub(r"\\(x[0-9a-f]{2}|.)",
                          lambda e: chr(int(e.group(1)[1:], 16)) if e.group(1).startswith("x") else _C_ESCAPES[e.group(1)],
                          m.group(1))
        word = word.replace("%%", "%")
        words.append(word.replace("$$", "$") if dollar else word)
    return words


def _kubelet_expand(value: str, defined: dict[str, str]) -> str:
    """What the container sees of a command word or environment value: the kubelet's expansion
    (Kubernetes, third_party/forked/golang/expansion: "$$" → "$", "$(NAME)" → NAME's value when
    NAME is defined, anything else as written)."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(" and ")" in value[i + 2:]:
                end = value.index(")", i + 2)
                name = value[i + 2:end]
                out.append(defined.get(name, value[i:end + 1]))
                i = end + 1
                continue
        out.append(value[i])
        i += 1
    return "".join(out)


def test_the_kubelet_expansion_is_undone():
    plan, target = load_scenario("avx2-small")
    plan["env"]["TRICKY"] = "$(HOME) $$ $x $"
    c = _container({"Deployment": render(plan, target)[1]})
    value = next(e["value"] for e in c["env"] if e["name"] == "TRICKY")
    assert _kubelet_expand(value, {"HOME": "/elsewhere"}) == "$(HOME) $$ $x $"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_pod_runs_what_the_unit_runs(scenario):
    plan, target = load_scenario(scenario)
    objects, unit = objects_of(scenario), _unit_settings(plan)
    c = _container(objects)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    # the same command line, the plan mounted where --plan says
    assert [_kubelet_expand(w, {}) for w in c["command"]] == _systemd_words(unit["ExecStart"][0], dollar=True)
    plan_mount = next(m for m in c["volumeMounts"] if m["name"] == "plan")
    assert c["command"][-1] == plan_mount["mountPath"] + "/plan.json" and plan_mount["readOnly"]
    assert json.loads(objects["ConfigMap"]["data"]["plan.json"]) == plan
    assert pod["volumes"][0] == {"name": "plan", "configMap": {"name": objects["ConfigMap"]["metadata"]["name"]}}
    # the same environment, in the same order: the plan's, then the unit's own
    defined: dict[str, str] = {}
    for e in c["env"]:  # each value may refer to the ones before it, as the kubelet reads them
        defined[e["name"]] = _kubelet_expand(e["value"], defined)
    env = [f"{name}={value}" for name, value in defined.items()]
    assert env == [_systemd_words(v)[0] for v in unit["Environment"]]
    # memory: MemoryMax is the limit, the steady prediction the request (whole MiB, rounded up)
    assert _mib(c["resources"]["limits"]["memory"]) == math.ceil(int(unit["MemoryMax"][0]) / 2**20)
    assert _mib(c["resources"]["requests"]["memory"]) == math.ceil(plan["memory"]["total_bytes"] / 2**20)
    # CPUs: the unit's CPUs are the limit, the OpenMP threads the request
    assert c["resources"]["limits"]["cpu"] == str(len(plan["cpus"]))
    assert c["resources"]["requests"]["cpu"] == str(plan["threads"])
    for quantity in [*c["resources"]["limits"].values(), *c["resources"]["requests"].values()]:
        assert QUANTITY.fullmatch(quantity), quantity
    # stop: TimeoutStopSec is the grace period
    assert pod["terminationGracePeriodSeconds"] == int(unit["TimeoutStopSec"][0])
    # the model read-only at its path; the state and cache where the unit's environment points
    model = next(m for m in c["volumeMounts"] if m["name"] == "model")
    assert (model["mountPath"], model["readOnly"]) == (plan["model"]["path"], True)
    assert {"name": "model", "hostPath": {"path": plan["model"]["path"], "type": "Directory"}} in pod["volumes"]
    own = unit_environment(plan["serve"]["name"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == own["HOME"] and mounts["cache"] == own["XDG_CACHE_HOME"] and mounts["tmp"] == "/tmp"
    for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert own[var].startswith(mounts["cache"] + "/")  # the compile cache is on the cache volume
    assert c["ports"] == [{"name": "http", "containerPort": plan["serve"]["port"], "protocol": "TCP"}]
    assert objects["Deployment"]["spec"]["replicas"] == target.replicas


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_pod_is_hardened_as_the_unit_is(scenario):
    objects = objects_of(scenario)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    sc = _container(objects)["securityContext"]
    # DynamicUser=yes → a fixed unprivileged user; ProtectSystem=strict → read-only root;
    # NoNewPrivileges=yes; CapabilityBoundingSet= (empty); SystemCallFilter= → the runtime's seccomp
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == k8s.IMAGE_UID > 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_probes_follow_the_plans_timeouts(scenario):
    plan, _ = load_scenario(scenario)
    c = _container(objects_of(scenario))
    start, live, ready = c["startupProbe"], c["livenessProbe"], c["readinessProbe"]
    for p in (start, live, ready):
        assert p["httpGet"]["port"] == "http"
    assert start["httpGet"]["path"] == ready["httpGet"]["path"] == "/edgectl/ready"  # READY=1: warm-up answered
    assert live["httpGet"]["path"] == "/edgectl/live"  # the rule the watchdog is pinged by
    # TimeoutStartSec: failing from the first check, the container gets start_s (rounded up to a period)
    budget = start["periodSeconds"] * start["failureThreshold"]
    assert plan["timeouts"]["start_s"] <= budget < plan["timeouts"]["start_s"] + start["periodSeconds"]
    # WatchdogSec: the worker turns unhealthy after watchdog_s / 2 without engine progress; the
    # failed checks that restart it fit in the other half
    watchdog = plan["timeouts"]["watchdog_s"]
    assert live["periodSeconds"] * live["failureThreshold"] <= watchdog / 2 + live["periodSeconds"]
    assert live["timeoutSeconds"] <= live["periodSeconds"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_service_is_the_clusters_and_selects_this_class_only(scenario):
    objects = objects_of(scenario)
    svc, dep = objects["Service"]["spec"], objects["Deployment"]["spec"]
    assert svc["type"] == "ClusterIP"
    assert not {"externalIPs", "loadBalancerIP", "externalName"} & set(svc)
    assert all("nodePort" not in p for p in svc["ports"])
    assert svc["selector"] == dep["selector"]["matchLabels"]
    labels = dep["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["selector"].items())
    assert svc["ports"][0]["targetPort"] == "http"
    plan, target = load_scenario(scenario)
    assert dep["template"]["spec"]["nodeSelector"] == target.node_selector
    assert dep["strategy"] == {"type": "Recreate"}  # a node holds one worker at a time
    anti = dep["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"


def test_a_changed_plan_rolls_the_pods():
    plan, target = load_scenario("avx2-small")
    before = render(plan, target)[1]["spec"]["template"]["metadata"]["annotations"]
    plan["max_model_len"] -= 256
    after = render(plan, target)[1]["spec"]["template"]["metadata"]["annotations"]
    assert before["edgectl-plan-sha256"] != after["edgectl-plan-sha256"]


# --- refusals ------------------------------------------------------------------------------------


def test_a_loopback_plan_is_refused():
    plan, target = load_scenario("avx2-small")
    plan["serve"]["host"] = "127.0.0.1"
    with pytest.raises(EdgectlError, match="in a pod the worker must listen on the pod's address"):
        render(plan, target)


def test_the_stock_topology_is_refused():
    plan, target = load_scenario("avx2-small")
    plan["topology"] = plan["levers"]["topology"] = "stock"
    with pytest.raises(EdgectlError, match="a pod runs the single-process topology only"):
        render(plan, target)


@pytest.mark.parametrize("image", ["", "has space:1", "tab\there"])
def test_a_bad_image_is_refused(image):
    plan, target = load_scenario("avx2-small")
    with pytest.raises(EdgectlError, match="is not an image reference"):
        render(plan, k8s.Target(target.class_id, target.node_selector, 1, image))


def test_every_bad_field_is_named():
    plan, target = load_scenario("avx2-small")
    plan["serve"]["port"] = 80
    plan["memory"]["total_bytes"] = plan["memory"]["limit_bytes"] + 1
    plan["env"] = {"OK": "1", "HOME": "/root"}
    plan["topology"] = plan["levers"]["topology"] = "stock"
    with pytest.raises(EdgectlError) as exc:
        render(plan, target)
    problems = [exc.value.message, *exc.value.details]
    for field in ("serve.port: expected a number >= 1024", "plan.memory.total_bytes", "plan.env.HOME",
                  "plan.topology"):
        assert sum(field in p for p in problems) == 1, (field, problems)
    assert len(problems) == 4


def test_a_malformed_plan_is_refused_before_any_object():
    plan, target = load_scenario("avx2-small")
    del plan["timeouts"]["watchdog_s"]
    plan["cpus"] = []
    with pytest.raises(EdgectlError) as exc:
        render(plan, target)
    problems = [exc.value.message, *exc.value.details]
    assert any("plan.timeouts.watchdog_s: missing" in p for p in problems), problems
    assert any("plan.cpus" in p for p in problems), problems
    with pytest.raises(EdgectlError, match="not an edgectl plan"):
        render({"schema": "edgectl.probe/1"}, target)


def test_a_name_kubernetes_cannot_take_is_refused():
    plan, target = load_scenario("avx2-small")
    plan["serve"]["name"] = "my_model"  # a valid deployment name for systemd, not a DNS label
    with pytest.raises(EdgectlError, match="is not a DNS label.*without '_'"):
        render(plan, target)
    plan["serve"]["name"] = "a" * 23  # the longest name and a long class still fit in 63
    render(plan, k8s.Target("x86-64-avx512-bf16-123456", target.node_selector, 1))


# --- the image ----------------------------------------------------------------------------------


def test_the_containerfile_builds_what_the_objects_run():
    # No container engine runs in the tests: this checks the Containerfile says what the
    # objects assume (the venv's python, the uid), built by the README's own set-up script.
    text = (REPO / "Containerfile").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert any(ln.startswith("RUN ") and "scripts/setup.sh" in ln for ln in lines)
    assert f"USER {k8s.IMAGE_UID}:{k8s.IMAGE_UID}" in lines
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "PREFIX=${EDGECTL_PREFIX:-/opt/edgectl}" in setup and 'VENV="$PREFIX/venv"' in setup
    assert k8s.IMAGE_PYTHON == "/opt/edgectl/venv/bin/python"
    assert "EDGECTL_PREFIX" not in text  # the image uses setup.sh's default prefix


def _regen() -> None:
    for scenario in sorted(SCENARIOS):
        out = GOLDEN / scenario / "objects.yaml"
        out.write_text(render_scenario(scenario), encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regen()
    else:
        print(__doc__)
