"""CLI commands, one module per command family; each module has ``register(app)``.

Modules import only the light control plane at module level: ``edgectl --help`` and
``edgectl probe`` must not pay for torch or vLLM.
"""

from edgectl.commands import bench, deploy, models, plan, probe, quantize, status

ALL = [probe, models, plan, quantize, deploy, status, bench]
