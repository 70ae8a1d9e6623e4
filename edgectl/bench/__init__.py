"""``edgectl bench``: measurements that cannot fool themselves.

Arms (``arms.py``) are named configurations — unmodified vLLM, edgectl's plan and each of its
levers, llama.cpp — run in interleaved passes (``runner.py``), each pass a fresh server whose
settings are read back from the running engine and checked before anything is measured
(``measure.py``, ``fidelity.py``); memory is the PSS of the server's whole process tree
(``server.py``). ``report.py`` writes the artifact and refuses ratios for an incomplete grid;
``profile_record.py`` turns a complete run into a device profile. ``core.run_bench`` ties them
together. Nothing here imports torch or vLLM: the engines run in their own processes.
"""
