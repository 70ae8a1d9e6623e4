"""The contract between the control plane (``edgectl/``) and the runtime (``edgectl_runtime``).

Everything both sides must agree on, in one place, pure Python (no torch, no vLLM): the control
plane imports it to plan, write units and check; the runtime imports it to read the plan and to
know what to report. Nothing else of the control plane is imported by the runtime.

    plan.py          the plan (schema edgectl.plan/1): its type, its closed sets, strict reading
    codec.py         how the plan's dataclasses become JSON and are read back, naming bad fields
    vllm_args.py     a plan as vLLM server arguments
    environment.py   every environment variable edgectl reads, sets or refuses; the plan's levers
                     as the runtime's variables
    effective.py     the effective settings (edgectl.effective/1) checked against the plan
    worker.py        the worker's command line, exit codes, HTTP routes and endpoints
    int4_layout.py   which layers are int4, with which group, and their packed bytes
    procmem.py       PSS of a process tree or a cgroup (the load peak, status, the bench)
    vision.py        a vision plan's image limits, which the worker's image guard enforces
"""
