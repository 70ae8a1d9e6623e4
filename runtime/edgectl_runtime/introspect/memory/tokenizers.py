"""How many tokenizer objects this process holds, and what one costs."""

from __future__ import annotations

import os
import sys
from typing import Any

from edgectl_runtime.introspect.memory.malloc import malloc_in_use
from edgectl_runtime.introspect.memory.tensors import all_gc_objects


def tokenizer_facts(model_dir: str | None, preloaded: str | None) -> dict[str, Any]:
    """How many tokenizer objects this process holds, and what one costs: a second copy of the
    backend is loaded from the model's ``tokenizer.json`` and the allocator's in-use bytes
    compared (after the PSS was read, so the copy is not in the figures above)."""
    import gc
    import warnings

    base = getattr(sys.modules.get("transformers.tokenization_utils_base"), "PreTrainedTokenizerBase", None)
    if base is None:
        return {"instances": 0, "python_wrappers": 0}
    inner_by_id: dict[int, Any] = {}
    wrappers = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in all_gc_objects():
            if not issubclass(type(obj), base):
                continue
            wrappers += 1
            try:  # the instance dict only: getattr could run arbitrary __getattr__ code
                inner = object.__getattribute__(obj, "__dict__").get("_tokenizer")
            except (AttributeError, TypeError):
                inner = None
            if inner is not None:
                inner_by_id[id(inner)] = inner
    backends = sorted({f"{type(i).__module__}.{type(i).__name__}" for i in inner_by_id.values()})
    out: dict[str, Any] = {"instances": len(inner_by_id), "python_wrappers": wrappers, "backends": backends}
    path = os.path.join(model_dir, "tokenizer.json") if model_dir else None
    loader = next((type(i) for i in inner_by_id.values() if hasattr(type(i), "from_file")), None)
    if path and os.path.exists(path) and loader is not None:
        gc.collect()
        before = malloc_in_use(preloaded)
        tok = loader.from_file(path)
        after = malloc_in_use(preloaded)
        del tok
        if before is not None and after is not None:
            out["bytes_per_instance"] = after - before
    return out
