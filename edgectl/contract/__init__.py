"""The contract between the control plane (``edgectl/``) and the runtime (``edgectl_runtime``).

Everything both sides must agree on, in one place, pure Python (no torch, no vLLM).

    int4_layout.py   which layers are int4, with which group, and their packed bytes
    procmem.py       PSS of a process tree or a cgroup (the load peak, status, the bench)
"""
