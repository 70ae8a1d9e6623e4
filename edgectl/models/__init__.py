"""Models: the catalog of registry-installable models, pulling and converting them, and
reading what a model directory holds without loading it.

Public API (all pure Python; nothing here imports torch or vLLM):

- ``inspect_model(path, name=None) -> ModelFacts`` (schema ``edgectl.model/1``)
- ``resolve_model(spec, environ) -> Path``: a catalog name (must be pulled) or a directory
- ``ensure_pulled(name, progress, environ) -> Path`` and ``pull(name, environ, progress) -> PullResult``
- ``list_models(environ) -> ModelList``; ``read_manifest(model_dir)`` (has ``gguf.path``)
"""

from edgectl.models.cache import list_models, read_manifest, resolve_model
from edgectl.models.catalog import CATALOG, CatalogEntry, get_entry
from edgectl.models.facts import LinearLayer, ModelFacts, ParamBytes
from edgectl.models.inspect import inspect_model
from edgectl.models.pull import PullResult, ensure_pulled, pull

__all__ = [
    "CATALOG",
    "CatalogEntry",
    "LinearLayer",
    "ModelFacts",
    "ParamBytes",
    "PullResult",
    "ensure_pulled",
    "get_entry",
    "inspect_model",
    "list_models",
    "pull",
    "read_manifest",
    "resolve_model",
]
