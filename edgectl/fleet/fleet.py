"""Probes of several nodes → their classes → one plan per class → the objects for each class.

``plan_fleet(request, nodes, environ, image)`` takes the probe facts of each node (``edgectl
probe --json`` run there, one file per node), gives each node its labels (what ``edgectl probe
--nfd`` writes on that node), groups the nodes whose selector labels are equal, and plans once
per group from the group's labels alone (:func:`edgectl.fleet.labels.class_facts`). A group
whose plan does not fit is reported with the planner's reason; so is a node the probe could not
class (a selector label it could not give).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl.contract.plan import Plan, Request
from edgectl.errors import EdgectlError
from edgectl.fleet import k8s
from edgectl.fleet.labels import NAMESPACE, NodeLabels, class_facts, labels_for
from edgectl.probe.facts import HostFacts

if TYPE_CHECKING:
    from edgectl.profiles import Profile

SCHEMA = "edgectl.fleet/1"
# Where `edgectl models pull` (as root) puts catalog models on a node; the pods mount it from there.
NODE_MODEL_CACHE = "/var/lib/edgectl/models"


@dataclass(frozen=True)
class Node:
    name: str  # the probe file's name without .json
    facts: HostFacts
    labels: NodeLabels


@dataclass
class ClassPlan:
    class_id: str
    selector: dict[str, str]
    nodes: list[str]
    plan: Plan | None = None
    refusal: str | None = None  # why the model does not fit this class
    objects: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FleetResult:
    model: str
    image: str
    classes: list[ClassPlan]
    unclassed: dict[str, str]  # node → why it has no class

    def node_rows(self) -> list[tuple[str, str, str]]:
        """(node, class, what it gets) for every node, sorted by node name."""
        rows = [(n, "-", f"cannot be classed: {why}") for n, why in self.unclassed.items()]
        for c in self.classes:
            for n in c.nodes:
                rows.append((n, c.class_id, _summary(c.plan) if c.plan else f"will not fit: {c.refusal}"))
        return sorted(rows)

    def fitting(self) -> list[ClassPlan]:
        return [c for c in self.classes if c.plan is not None]

    def table(self) -> list[str]:
        nodes = sum(len(c.nodes) for c in self.classes) + len(self.unclassed)
        fit = sum(len(c.nodes) for c in self.fitting())
        lines = [f"edgectl plan {self.model}: {nodes} node(s), {len(self.classes)} class(es); "
                 f"fits on {fit} node(s)", ""]
        rows = self.node_rows()
        width_n = max([4, *(len(r[0]) for r in rows)])
        width_c = max([5, *(len(r[1]) for r in rows)])
        lines.append(f"{'node':<{width_n}}  {'class':<{width_c}}  gets")
        lines += [f"{n:<{width_n}}  {c:<{width_c}}  {what}" for n, c, what in rows]
        lines += ["", f"classes (nodeSelector labels, in {NAMESPACE}/):"]
        for c in self.classes:
            what = f"Deployment edgectl-{c.plan.serve.name}-{c.class_id}" if c.plan else "nothing (does not fit)"
            lines.append(f"  {c.class_id}: {len(c.nodes)} node(s) → {what}")
            lines.append("    " + " ".join(f"{k.split('/', 1)[1]}={v}" for k, v in c.selector.items()))
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "image": self.image,
            "nodes": [{"node": n, "class": None if c == "-" else c, "gets": what} for n, c, what in self.node_rows()],
            "classes": [{"class": c.class_id, "selector": c.selector, "nodes": c.nodes,
                         "plan": c.plan.to_dict() if c.plan else None,
                         "refusal": c.refusal, "objects": c.objects} for c in self.classes],
            "unclassed": dict(self.unclassed),
        }

    def render_text(self) -> str:
        return "\n".join(self.table()) + "\n"

    def render_k8s(self) -> str:
        """The objects of every class that fits, the table above them as YAML comments."""
        header = [*self.table(), "", f"image {self.image}; apply with `kubectl apply -f FILE`"]
        objects = [obj for c in self.fitting() for obj in c.objects]
        return k8s.render_yaml(objects, header)


def _summary(plan: Plan) -> str:
    m = plan.memory
    return (f"{plan.weight_format}, {plan.max_model_len} tokens × {plan.max_num_seqs}, "
            f"{plan.threads} thread(s), memory request {k8s._mebibytes(m.total_bytes)} "
            f"limit {k8s._mebibytes(m.limit_bytes)}")


def read_nodes(nodes_dir: Path) -> list[tuple[str, HostFacts]]:
    """(node name, facts) for every ``*.json`` probe in ``nodes_dir``, by name."""
    from edgectl.inputs import read_facts_file

    if not nodes_dir.is_dir():
        raise EdgectlError(f"--fleet {nodes_dir}: not a directory; give a directory of `edgectl probe --json` "
                           "outputs, one NODE.json per node")
    files = sorted(p for p in nodes_dir.glob("*.json") if p.is_file())
    if not files:
        raise EdgectlError(f"--fleet {nodes_dir}: no *.json files; on each node run "
                           f"`edgectl probe --json > NODE.json` and put the files in {nodes_dir}")
    return [(p.stem, read_facts_file(p)) for p in files]


def planning_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment plans for nodes are made in: catalog models where nodes keep them."""
    env = dict(environ)
    env.setdefault("EDGECTL_MODEL_CACHE", NODE_MODEL_CACHE)
    return env


def classify(nodes: list[tuple[str, HostFacts]], profiles: list[Profile]) -> tuple[list[Node], dict[str, str]]:
    classed, unclassed = [], {}
    for name, facts in nodes:
        labels = labels_for(facts, profiles)
        if labels.selector() is None:
            unclassed[name] = labels.why_no_class()
        else:
            classed.append(Node(name, facts, labels))
    return classed, unclassed


def plan_fleet(request: Request, nodes: list[tuple[str, HostFacts]], environ: Mapping[str, str], *,
               image: str = k8s.DEFAULT_IMAGE) -> FleetResult:
    """Group ``nodes`` by class, plan each class, render the objects of each class that fits.

    ``request`` is the planning request (edgectl.contract.plan.Request); its host becomes 0.0.0.0 (the
    pod's address). Raises EdgectlError when the model fits no node.
    """
    from edgectl.inputs import load_all_profiles, make_plan

    k8s.check_image(image)
    env = planning_environment(environ)
    request = replace(request, host="0.0.0.0")
    profiles = load_all_profiles(env)
    classed, unclassed = classify(nodes, profiles)
    groups: dict[str, ClassPlan] = {}
    representative: dict[str, Node] = {}
    for node in classed:
        cid = node.labels.class_id()
        if cid not in groups:
            groups[cid] = ClassPlan(cid, node.labels.selector() or {}, [])
            representative[cid] = node
        groups[cid].nodes.append(node.name)
    for cid, group in groups.items():
        rep = representative[cid]
        facts = class_facts(rep.labels.full(), source=f"node class {cid}")
        try:
            planned = make_plan(request, env, facts=facts)
        except EdgectlError as exc:
            group.refusal = exc.message
            continue
        plan = planned.plan
        labelled = rep.labels.values["edgectl-profile"]
        if plan.profile.name != labelled:
            raise EdgectlError(f"node class {cid}: its nodes select profile {labelled} but the class's facts select "
                               f"{plan.profile.name} (a profile that matches on more than the labels); "
                               "plan these nodes one by one with `edgectl plan --facts`")
        group.plan = plan
        group.objects = k8s.render_objects(plan, k8s.Target(cid, group.selector, len(group.nodes), image))
    result = FleetResult(request.model, image, sorted(groups.values(), key=lambda c: c.class_id), unclassed)
    if not result.fitting():
        details = [f"{n}: {what}" for n, _, what in result.node_rows()]
        raise EdgectlError(f"{request.model} fits on none of the {len(nodes)} node(s)", details=details)
    return result
