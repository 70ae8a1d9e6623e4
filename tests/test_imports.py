"""The control plane stays light: no torch, no vLLM, for any command that does not need them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "vllm", "transformers", "numpy")


@pytest.mark.parametrize("code", [
    "import edgectl, edgectl.cli",
    "from edgectl.cli import app",
    "import edgectl.planner, edgectl.inputs, edgectl.profiles, edgectl.deploy, edgectl.status, edgectl.units",
    "import edgectl.deployment, edgectl.client, edgectl.serve",
    "import edgectl.models.inspect, edgectl.models.pull, edgectl.contract.effective, edgectl.contract.vllm_args",
    "import edgectl.contract.plan, edgectl.contract.environment, edgectl.contract.procmem, edgectl.contract.worker",
    "import edgectl.cli_reference",
])
def test_importing_the_control_plane_pulls_in_nothing_heavy(code: str):
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{code!r} imported {out.stdout.strip()}"


def test_plan_runs_without_heavy_imports(tmp_path):
    """`edgectl plan` on a config-only model: the planner, the probe and inspection only."""
    code = (
        "import sys, os\n"
        "from edgectl.cli import main\n"
        "try:\n"
        "    main(['plan', sys.argv[1], '--json'])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    from pathlib import Path

    shape = Path(__file__).parent / "model_shapes" / "smollm2-135m"
    out = subprocess.run([sys.executable, "-c", code, str(shape)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY=\n" in out.stderr or out.stderr.rstrip().endswith("HEAVY="), out.stderr[-500:]


def test_the_runtime_takes_only_the_contract_from_the_control_plane():
    """runtime/ imports edgectl.contract (and the error type it raises), nothing else of edgectl;
    the contract imports nothing of the control plane outside itself either. Every file, in every
    subpackage (the reader walks the folders recursively)."""
    allowed = ("edgectl.contract", "edgectl.errors")
    graph = import_graph()
    fenced = [m for m in graph if m.split(".")[0] == "edgectl_runtime" or m.startswith("edgectl.contract")]
    assert any(m.count(".") >= 2 for m in fenced if m.startswith("edgectl_runtime."))  # subpackages are seen
    for module in sorted(fenced):
        outside = {t for t in graph[module] if t.split(".")[0] == "edgectl" and not t.startswith(allowed)
                   and (module, t) not in KNOWN_UPWARD}
        assert not outside, f"{module} imports {sorted(outside)}"


# --- the import graph: no cycle, no upward import ------------------------------------------------
# Counted from the source with `ast`, every import statement wherever it stands (module level,
# inside a function, under `if TYPE_CHECKING:`), relative ones resolved: a function-level import
# that hides a cycle still counts as the cycle.

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ((ROOT, "edgectl"), (ROOT / "runtime", "edgectl_runtime"))

# The layers, bottom first: a module may import its own layer and the ones below, never one above.
# An entry names a module or a package (and everything in it); "edgectl" alone is the package's
# own __init__ (its version), not everything under it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("edgectl", "edgectl.errors", "edgectl.paths", "edgectl.atomic", "edgectl.output", "edgectl.data"),
    ("edgectl.contract",),
    # The data plane: it takes the contract and the error type, nothing above (the fence test below).
    ("edgectl_runtime",),
    ("edgectl.probe", "edgectl.models", "edgectl.llamacpp", "edgectl.launch"),
    ("edgectl.profiles", "edgectl.systemd", "edgectl.client"),
    ("edgectl.units",),
    ("edgectl.planner",),
    ("edgectl.inputs",),
    ("edgectl.deployment",),
    ("edgectl.bench", "edgectl.status", "edgectl.fleet"),
    ("edgectl.deploy", "edgectl.serve"),
    ("edgectl.commands",),
    ("edgectl.cli", "edgectl.__main__", "edgectl.cli_reference"),
)

# Known exceptions, each to be fixed: none today (the runtime's were removed by its regrouping). An
# entry must still exist (the test fails when one is gone, so the lists only shrink).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the two packages: dotted name -> (file, is a package's __init__)."""
    found = {}
    for base, package in SOURCES:
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the two packages it imports (``from P import name`` counts as P.name when
    that is a module, else as P)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        package = module if is_package else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else known(base)
                            for a in node.names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first): the arrows to cut."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        after = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in came_from:
                    came_from[w] = v
                    after.append(w)
        frontier = after
    return component


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching entry, layer)
    for layer, entries in enumerate(LAYERS):
        for entry in entries:
            if module == entry or (entry != "edgectl" and module.startswith(entry + ".")):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), layer)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not unplaced, f"place these modules in LAYERS (tests/test_imports.py): {unplaced}"


def test_no_import_cycle():
    graph = import_graph()
    cycles = {frozenset(c) for c in import_cycles(graph)}
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert not new, "import cycles (each: one path round it, then every module caught in it):\n" + "\n".join(
        f"{' -> '.join(one_cycle(graph, c))}\n    ({len(c)} modules: {', '.join(c)})" for c in new)
    gone = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not gone, f"fixed: remove these from KNOWN_CYCLES (tests/test_imports.py): {gone}"


def test_no_upward_import():
    graph = import_graph()
    if any(layer_of(m) is None for m in graph):
        pytest.skip("a module has no layer (test_every_module_has_a_layer)")
    upward = upward_imports(graph)
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports from a lower layer to a higher one (LAYERS, tests/test_imports.py):\n" + "\n".join(
        f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in new)
    gone = sorted(KNOWN_UPWARD - upward)
    assert not gone, f"fixed: remove these from KNOWN_UPWARD (tests/test_imports.py): {gone}"


def test_the_control_plane_never_imports_the_runtime():
    """It starts runtime code in another process; importing it would pull torch into every command."""
    graph = import_graph()
    into = sorted((a, b) for a, targets in graph.items() if a.split(".")[0] == "edgectl"
                  for b in targets if b.split(".")[0] == "edgectl_runtime")
    assert not into, f"the control plane imports the runtime: {into}"


def test_the_graph_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """The reader itself: an import inside a function, ``from . import x`` and ``from .x import y`` all count."""
    pkg = tmp_path / "edgectl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from .. import top\n")
    (pkg / "top.py").write_text("def h():\n    import edgectl.sub.a\n")
    (tmp_path / "runtime" / "edgectl_runtime").mkdir(parents=True)
    (tmp_path / "runtime" / "edgectl_runtime" / "__init__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SOURCES",
                        ((tmp_path, "edgectl"), (tmp_path / "runtime", "edgectl_runtime")))
    graph = import_graph()
    assert graph["edgectl.sub"] == {"edgectl.sub.a"}
    assert graph["edgectl.sub.a"] == {"edgectl.sub.b"}
    assert graph["edgectl.sub.b"] == {"edgectl.top"}
    assert graph["edgectl.top"] == {"edgectl.sub.a"}
    assert import_cycles(graph) == [["edgectl.sub.a", "edgectl.sub.b", "edgectl.top"]]


def test_every_control_plane_module_imports_first():
    """Each module of edgectl/ imported first, in a clean state: a loop through a package's
    ``__init__`` (which the graph above does not draw: importing ``edgectl.models.cache`` runs
    ``edgectl/models/__init__.py`` first) fails here as a partially initialized module."""
    modules = sorted(m for m in import_graph() if m.split(".")[0] == "edgectl" and m != "edgectl.__main__")
    code = (
        "import importlib, sys\n"
        "failed = []\n"
        "for m in sys.argv[1:]:\n"
        "    for k in [k for k in sys.modules if k == 'edgectl' or k.startswith('edgectl.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{m}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", "modules that cannot be imported first:\n" + out.stdout
