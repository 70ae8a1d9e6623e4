"""The options more than one command takes, declared once (as vLLM's ``EngineArgs.add_cli_args``
declares an engine flag once for every entry point that takes it).

``plan``, ``deploy`` and ``serve`` take what a plan is made from; ``bench`` plans every arm from
its own context (:data:`ArmsMaxModelLen`, whose help says so).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from edgectl.contract.plan import WeightFormat

Model = Annotated[str, typer.Argument(help="A catalog name (`edgectl models list`) or a Hugging Face model directory.")]

# what a plan is made from
MaxModelLen = Annotated[Optional[int], typer.Option("--max-model-len", help="Context length in tokens (default: the largest that fits, up to 4096 or the model's maximum).")]
MaxNumSeqs = Annotated[int, typer.Option("--max-num-seqs", help="Sequences served at once; KV is sized for each at full context.")]
# the formats edgectl serves, from the contract's list (what the planner accepts)
_TEXT = [f for f in WeightFormat if f is not WeightFormat.W8A8]  # w8a8: a speech model's only
_FORMATS = ", ".join(_TEXT[:-1]) + f" or {_TEXT[-1]}"
Format = Annotated[Optional[str], typer.Option("--format", help=f"Weight format: {_FORMATS} (default: the fastest measured that runs here); a speech model: float16, bfloat16, float32, w4a8 or w8a8; a vision-language model: bf16, or its language model as w4a8 or w8a8.")]
GroupSize = Annotated[Optional[int], typer.Option("--group-size", help="Preferred int4 group size (32, 64, 128, 256; default: what suits the model, else 128); chosen per layer where K is not a multiple.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="OpenMP threads (default: one per usable physical core).")]
KvDtype = Annotated[Optional[str], typer.Option("--kv-cache-dtype", help="KV cache dtype: auto (bf16), fp8_e4m3 (vLLM's: half the bytes per token, AVX-512/AMX only; top-1 0.930 against bf16 KV) or int8 (edgectl's: half the bytes plus a scale per token and KV head, read by edgectl's decode attention; top-1 0.953; docs/memory.md). Default: bf16, fp8_e4m3 where the context fits only with it.")]
Compilation = Annotated[Optional[str], typer.Option("--compilation", help="eager, or default (vLLM's torch.compile mode: faster decode, more memory, a slower start); default: the profile's.")]

# bench: the same flag, one context for every arm (each arm's plan is made with it)
ArmsMaxModelLen = Annotated[Optional[int], typer.Option("--max-model-len", help="Context for every arm (default: the plan's).")]

# where a deployment or a foreground server answers
Host = Annotated[str, typer.Option("--host", help="Address the OpenAI API binds to (localhost unless told otherwise).")]
Port = Annotated[int, typer.Option("--port", help="TCP port of the OpenAI API.")]

# deploy and undeploy
JsonResult = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
