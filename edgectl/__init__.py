"""edgectl: serve a language model on a small CPU box with vLLM's CPU backend.

The control plane (probe, plan, units, deploy, status, bench) lives here and imports
neither torch nor vLLM; the data plane (the worker and the vLLM plugin) lives in
``edgectl_runtime`` and is installed with the ``runtime`` extra.
"""

__version__ = "0.1.0"
