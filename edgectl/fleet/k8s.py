"""One plan (edgectl.plan/1) as the Kubernetes objects that run the worker the systemd unit runs.

``render_objects(plan, target)`` → [ConfigMap, Deployment, Service] as plain dicts;
``render_yaml(objects, header)`` → one multi-document YAML stream for ``kubectl apply -f``.
Pure: no cluster, no I/O. Like the unit writer (``edgectl/units.py``) it takes a plan read
strictly (``Plan.from_dict``) and nothing else, and refuses, naming each field, what a pod
cannot carry.

What mirrors what (units/README.md explains the unit's side):

=====================================  ====================================================
the unit                               the pod
=====================================  ====================================================
``ExecStart=… worker --plan PATH``     the same command, the plan from a ConfigMap at PATH
``MemoryMax=``                         ``resources.limits.memory``
(the plan's steady prediction)         ``resources.requests.memory``: what the scheduler
                                       reserves on the node
``CPUAffinity=``/``AllowedCPUs=``      ``limits.cpu`` = the plan's CPUs, ``requests.cpu`` =
                                       its OpenMP threads; the kubelet picks which CPUs
``TimeoutStartSec=`` and ``READY=1``   ``startupProbe`` on ``/edgectl/ready`` (serving: the
                                       warm-up answered), failing after ``start_s``
``WatchdogSec=``                       ``livenessProbe`` on ``/edgectl/live`` (the rule the
                                       worker pings the watchdog by), restarting within
                                       about ``watchdog_s`` of the engine stalling
(none: systemd sends no traffic)       ``readinessProbe`` on ``/edgectl/ready``: serving, not
                                       draining
``TimeoutStopSec=``, ``KillMode=mixed``  ``terminationGracePeriodSeconds``: SIGTERM, the worker
                                       drains, SIGKILL at the end
``DynamicUser=yes``                    ``runAsNonRoot``, ``runAsUser`` 65532 (the image's)
``ProtectSystem=strict``               ``readOnlyRootFilesystem: true``
``NoNewPrivileges=yes``                ``allowPrivilegeEscalation: false``
``CapabilityBoundingSet=`` (empty)     ``capabilities.drop: [ALL]``
``SystemCallFilter=@system-service``   ``seccompProfile: RuntimeDefault``
``ReadOnlyPaths=`` the model           the model on a read-only ``hostPath`` volume
``StateDirectory=``/``CacheDirectory=``  ``emptyDir`` volumes at the same paths, with the same
                                       environment (HOME, the vLLM/torch/triton caches)
``PrivateTmp=yes``                     an ``emptyDir`` at ``/tmp``
``IPAddressAllow=localhost``           a ClusterIP Service: reachable inside the cluster only
=====================================  ====================================================

Not carried over, and why: ``MemoryHigh`` (no pod equivalent outside an alpha feature),
``MemorySwapMax=0`` (a node's swap is the kubelet's setting), ``LimitCORE=0`` (the node's
core_pattern decides), ``RestartPreventExitStatus=2 3`` (a Deployment restarts every exit; the
worker's reason for exit 2 or 3 is the last log line, shown by ``kubectl describe pod`` through
``terminationMessagePolicy: FallbackToLogsOnError``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgectl import __version__, launch
from edgectl.contract import worker
from edgectl.contract.plan import Plan, Topology
from edgectl.errors import EdgectlError
from edgectl.units import cache_dir, state_dir, unit_environment, validate_name

MiB = 1 << 20

# The image the Containerfile builds: scripts/setup.sh installs the runtime into this venv,
# and the image's user is this uid (Containerfile, USER).
IMAGE_PYTHON = "/opt/edgectl/venv/bin/python"
IMAGE_UID = 65532
DEFAULT_IMAGE = f"localhost/edgectl-runtime:{__version__}"

# The worker's probe endpoints (edgectl/contract/worker.py).
READY_PATH = worker.READY_ROUTE
LIVE_PATH = worker.LIVE_ROUTE
STARTUP_PERIOD_S = 10
READINESS_PERIOD_S = 5
LIVENESS_FAILURES = 3

def _literal(value: str) -> str:
    """``value`` as the container must see it: the kubelet expands ``$(NAME)`` in a container's
    command and environment values and turns ``$$`` into ``$`` (Kubernetes docs, "Define
    Dependent Environment Variables"), so every ``$`` is written doubled."""
    return value.replace("$", "$$")
# An image reference: no white space or control characters (the registry checks the rest).
_IMAGE_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,4096}")
_WILDCARD_HOSTS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class Target:
    """Where one plan goes: the node class it was planned for, and how many of its nodes."""

    class_id: str  # e.g. "x86-64-avx2-1a2b3c" (edgectl.fleet.labels.class_id)
    node_selector: dict[str, str]  # the class's NFD labels
    replicas: int  # nodes in the class: one worker each
    image: str = DEFAULT_IMAGE

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Target:
        return cls(class_id=d["class_id"], node_selector=dict(d["node_selector"]), replicas=d["replicas"],
                   image=d.get("image", DEFAULT_IMAGE))


def check_image(image: str) -> str:
    if not isinstance(image, str) or not _IMAGE_RE.fullmatch(image):
        raise EdgectlError(f"--image {image!r} is not an image reference (e.g. {DEFAULT_IMAGE} or "
                           "registry.example/edgectl-runtime@sha256:…)")
    return image


def _mebibytes(n: int) -> str:
    """A memory quantity: whole MiB (rounded up) as ``945Mi``."""
    return f"{math.ceil(n / MiB)}Mi"


def _probe(path: str, period_s: int, failures: int, timeout_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s,
            "timeoutSeconds": timeout_s, "failureThreshold": failures}


def _pod_problems(plan: Plan, target: Target) -> list[str]:
    """What a pod needs beyond a valid plan, one ``plan.FIELD: problem`` per bad field."""
    problems: list[str] = []
    name = plan.serve.name
    try:
        validate_name(name)
    except EdgectlError as exc:
        problems.append(f"plan.serve.name: {exc.message}")
    host = plan.serve.host
    if host not in _WILDCARD_HOSTS:
        problems.append(f"plan.serve.host: {host!r}: in a pod the worker must listen on the pod's address "
                        "for the Service to reach it; plan with host 0.0.0.0 (`edgectl plan --output k8s` does)")
    port = plan.serve.port
    if port < 1024:
        problems.append(f"plan.serve.port: expected a number >= 1024 (the pod runs unprivileged), got {port}")
    model_path = plan.model.path
    if not model_path.startswith("/"):
        problems.append(f"plan.model.path: {model_path!r} is not an absolute path")
    steady_bytes, limit_bytes = plan.memory.total_bytes, plan.memory.limit_bytes
    if steady_bytes > limit_bytes:
        problems.append(f"plan.memory.total_bytes: {steady_bytes} is above limit_bytes {limit_bytes}")
    threads, cpus = plan.threads, plan.cpus
    if threads > len(cpus):
        problems.append(f"plan.threads: {threads} is more than the {len(cpus)} planned CPUs")
    if plan.topology is not Topology.SINGLE_PROCESS:
        # vLLM's multi-process topology binds OpenMP to the plan's CPU numbers
        # (vllm/utils/ompmultiprocessing.py), which the kubelet, not the plan, chooses in a pod.
        problems.append(f"plan.topology: {str(plan.topology)!r}: a pod runs the single-process topology only")
    problems += _plan_env_problems(plan)
    try:
        check_image(target.image)
    except EdgectlError as exc:
        problems.append(exc.message)
    if not isinstance(target.replicas, int) or target.replicas < 1:
        problems.append(f"replicas: expected at least 1 node, got {target.replicas!r}")
    if not target.node_selector:
        problems.append("node selector: empty; a plan is only for the nodes of its class")
    return problems


def _plan_env_problems(plan: Plan) -> list[str]:
    """The plan's environment variables a pod cannot carry, or that the worker's pod sets itself."""
    problems: list[str] = []
    own = unit_environment(plan.serve.name)
    for key in sorted(plan.env):
        value = plan.env[key]
        if "\0" in value:
            problems.append(f"plan.env.{key}: contains a NUL character")
        elif key in own and value != own[key]:
            problems.append(f"plan.env.{key}: the worker's pod sets it to {own[key]!r} itself; "
                            "remove it from the plan")
    return problems


def _container_env(plan: Plan) -> list[dict[str, str]]:
    """The plan's own variables (sorted), then the ones the worker's pod sets for every plan."""
    own = unit_environment(plan.serve.name)
    env_items = [{"name": key, "value": _literal(plan.env[key])} for key in sorted(plan.env) if key not in own]
    return env_items + [{"name": k, "value": _literal(v)} for k, v in own.items()]


def _object_name(name: str, class_id: str) -> str:
    """``edgectl-NAME-CLASS``, the name of all three objects: it must be a DNS label."""
    base = f"edgectl-{name}-{class_id}"
    if len(base) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", base):
        raise EdgectlError(f"the objects' name {base!r} is not a DNS label (at most 63 lowercase letters, "
                           "digits and '-'): choose a --name without '_'")
    return base


def _labels(name: str, base: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "edgectl",
        "app.kubernetes.io/instance": base,
        "app.kubernetes.io/part-of": f"edgectl-{name}",
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/managed-by": "edgectl",
    }


def _pod_selector(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def _container(plan: Plan, image: str) -> dict[str, Any]:
    """The worker's container: the unit's command, limits, timeouts and sandbox as a pod has them."""
    name = plan.serve.name
    plan_dir = f"/etc/edgectl/{name}"  # where the ConfigMap's plan.json is mounted
    # seconds and bytes: rounding up never promises less than planned
    start_s, watchdog_s = math.ceil(plan.timeouts.start_s), math.ceil(plan.timeouts.watchdog_s)
    # The watchdog's rule: the worker reports unhealthy once the engine has not come back for
    # half of watchdog_s (worker.py, Service.stall_limit_s); LIVENESS_FAILURES failed checks in
    # the other half restart it, so a stall is acted on within about watchdog_s, as systemd's
    # watchdog acts on it (which waits watchdog_s after the last ping).
    live_period_s = max(1, math.ceil(watchdog_s / 2 / LIVENESS_FAILURES))
    return {
        "name": "worker",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [_literal(word) for word in launch.worker_command(IMAGE_PYTHON, f"{plan_dir}/plan.json",
                                                              plan.levers.python_optimize)],
        "ports": [{"name": "http", "containerPort": plan.serve.port, "protocol": "TCP"}],
        "env": _container_env(plan),
        "resources": {
            "requests": {"cpu": str(plan.threads), "memory": _mebibytes(plan.memory.total_bytes)},
            "limits": {"cpu": str(len(plan.cpus)), "memory": _mebibytes(plan.memory.limit_bytes)},
        },
        # The start timeout: failing from the first check for start_s, the container is restarted.
        "startupProbe": _probe(READY_PATH, STARTUP_PERIOD_S, math.ceil(start_s / STARTUP_PERIOD_S), 5),
        "livenessProbe": _probe(LIVE_PATH, live_period_s, LIVENESS_FAILURES, min(live_period_s, 10)),
        "readinessProbe": _probe(READY_PATH, READINESS_PERIOD_S, 2, 5),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "plan", "mountPath": plan_dir, "readOnly": True},
            {"name": "model", "mountPath": plan.model.path, "readOnly": True},
            {"name": "state", "mountPath": state_dir(name)},
            {"name": "cache", "mountPath": cache_dir(name)},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _pod_spec(plan: Plan, target: Target, base: str) -> dict[str, Any]:
    """The pod: pinned to the class's nodes, one per node, the unit's sandbox, the container's volumes."""
    return {
        "nodeSelector": dict(target.node_selector),
        # Each plan is sized to its node's whole budget: one edgectl worker per node.
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app.kubernetes.io/name": "edgectl"}},
             "topologyKey": "kubernetes.io/hostname"}]}},
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # seconds: rounding up never promises less than planned
        "terminationGracePeriodSeconds": math.ceil(plan.timeouts.stop_s),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(plan, target.image)],
        "volumes": [
            {"name": "plan", "configMap": {"name": base}},
            {"name": "model", "hostPath": {"path": plan.model.path, "type": "Directory"}},
            {"name": "state", "emptyDir": {}},
            {"name": "cache", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }


def _config_map(base: str, labels: Mapping[str, str], plan_text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": base, "labels": dict(labels)},
        "data": {"plan.json": plan_text},
    }


def _deployment(plan: Plan, target: Target, base: str, labels: Mapping[str, str],
                plan_text: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": base, "labels": dict(labels)},
        "spec": {
            "replicas": target.replicas,
            # The old worker stops before the new one starts: a node holds one at a time.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _pod_selector(labels)},
            "template": {
                # A changed plan changes this annotation, and so rolls the pods.
                "metadata": {"labels": dict(labels),
                             "annotations": {"edgectl-plan-sha256": hashlib.sha256(plan_text.encode()).hexdigest()}},
                "spec": _pod_spec(plan, target, base),
            },
        },
    }


def _service(base: str, labels: Mapping[str, str], port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": base, "labels": dict(labels)},
        "spec": {
            "type": "ClusterIP",
            "selector": _pod_selector(labels),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_objects(plan: Plan, target: Target) -> list[dict[str, Any]]:
    """[ConfigMap, Deployment, Service] for ``plan`` on the nodes of ``target``'s class.

    ``plan`` was read strictly (``Plan.from_dict``); what is checked here is what a pod needs
    beyond a valid plan, one ``plan.FIELD: problem`` per bad field.
    """
    problems = _pod_problems(plan, target)
    if problems:
        raise EdgectlError(f"cannot write the Kubernetes objects from this plan: {problems[0]}",
                           details=problems[1:])
    name = plan.serve.name
    base = _object_name(name, target.class_id)
    labels = _labels(name, base)
    plan_text = plan.to_json()
    return [_config_map(base, labels, plan_text), _deployment(plan, target, base, labels, plan_text),
            _service(base, labels, plan.serve.port)]


def render_yaml(objects: list[dict[str, Any]], header: list[str] = ()) -> str:
    """One YAML stream (``---`` between documents), ``header`` as comment lines at the top."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        # plan.json as a literal block, readable in `kubectl get configmap -o yaml` too
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, text)
    out = [f"# {line}".rstrip() for line in header]
    for obj in objects:
        out.append("---")
        out.append(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=4096,
                             allow_unicode=True).rstrip("\n"))
    return "\n".join(out) + "\n"
