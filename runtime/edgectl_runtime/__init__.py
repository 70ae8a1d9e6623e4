"""edgectl's data plane: the worker that runs inside the service, and the vLLM plugin.

This is the only package that imports torch and vLLM. It is installed with the
``runtime`` extra and is started by the unit (or by ``edgectl serve``) with a plan file.
"""
