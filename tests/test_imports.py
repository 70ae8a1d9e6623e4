"""The control plane stays light: no torch, no vLLM, for any command that does not need them."""

from __future__ import annotations

import subprocess
import sys

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
    the contract imports nothing of the control plane outside itself either."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def edgectl_imports(path: Path) -> set[str]:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "edgectl":
                names |= {node.module} if node.module != "edgectl" else {f"edgectl.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.split(".")[0] == "edgectl"}
        return names

    allowed = ("edgectl.contract", "edgectl.errors")
    for folder in (root / "runtime" / "edgectl_runtime", root / "edgectl" / "contract"):
        for path in sorted(folder.glob("*.py")):
            outside = {n for n in edgectl_imports(path) if not n.startswith(allowed)}
            assert not outside, f"{path.relative_to(root)} imports {sorted(outside)}"
