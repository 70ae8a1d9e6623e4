"""Models: the catalog of registry-installable models, pulling and converting them, and
reading what a model directory holds without loading it.

Public API (all pure Python; nothing here imports torch or vLLM):

- ``inspect_model(path, name=None) -> ModelFacts`` (schema ``edgectl.model/1``)
- ``resolve_model(spec, environ) -> Path``: a catalog name (must be pulled) or a directory
- ``list_models(environ) -> ModelList``; ``read_manifest(model_dir)`` (has ``gguf.path``)

Pulling (``edgectl.models.pull``: ``pull``, ``pull_file``, ``ensure_pulled``) is imported from its
module: it runs the runtime's converter and llama.cpp's tools, and its caller hands it the check
against llama.cpp; importing any part of the models does not load it.
"""

from edgectl.models.cache import list_models, read_manifest, resolve_model
from edgectl.models.catalog import CATALOG, CatalogEntry, get_entry
from edgectl.models.facts import LinearLayer, ModelFacts, ParamBytes
from edgectl.models.inspect import inspect_model

__all__ = [
    "CATALOG",
    "CatalogEntry",
    "LinearLayer",
    "ModelFacts",
    "ParamBytes",
    "get_entry",
    "inspect_model",
    "list_models",
    "read_manifest",
    "resolve_model",
]
