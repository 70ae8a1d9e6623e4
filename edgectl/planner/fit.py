"""The weight format and the context, chosen together against the memory budget.

The best-ranked format that fits the target context wins; else (no --max-model-len) the one
that fits the longest context. A faster format that does not fit must not turn a request that
fits into a refusal. A request that fits in no format is refused with need vs budget and the
request that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgectl.contract.plan import (
    KvCacheDtype,
    Memory,
    Reason,
    Request,
    Source,
    WeightFormat,
)
from edgectl.errors import EdgectlError
from edgectl.output import mib
from edgectl.planner.decided import Decided
from edgectl.planner.engine import lm_head_quantized
from edgectl.planner.kv_dtype import kv_cost
from edgectl.planner.ledger import Costs, Ledger, weights_bytes_for

if TYPE_CHECKING:
    from edgectl.models.facts import ModelFacts
    from edgectl.profiles import Profile

MiB = 1 << 20
DEFAULT_CONTEXT_CAP = 4096  # unless asked: long contexts cost KV and prefill time on a small CPU box
MIN_CONTEXT = 512  # below this a chat model is of little use; refuse rather than plan it
MIN_ASKED_CONTEXT = 16


@dataclass(frozen=True)
class Fit:
    weight_format: WeightFormat
    weights_bytes: int
    max_model_len: int
    memory: Memory
    kv_dtype: KvCacheDtype = KvCacheDtype.AUTO


@dataclass(frozen=True)
class _Sized:
    """One candidate weight format, sized: its weights, its ledger and the longest context that fits."""

    fmt: WeightFormat
    reason: Reason
    weights: Reason
    ledger: Ledger
    fits_len: int | None


def fit_weights_and_context(budget: int | None, model: ModelFacts, profile: Profile, request: Request,
                            candidates: list[tuple[WeightFormat, Reason]], group_size: int,
                            quantize_lm_head: bool | None, rope_capped: bool, costs: Costs,
                            kv_dtypes: list[KvCacheDtype] | None = None) -> Decided[Fit]:
    """``quantize_lm_head``: as asked, or None for each format's default (``engine.lm_head_quantized``).
    ``kv_dtypes``: the KV dtypes to try, preferred first (``planner/kv_dtype.py``); the next
    one is tried only when no format fits the target context (or, without --max-model-len, any
    context) with the one before."""
    if budget is None:
        raise EdgectlError("the probe could not tell how much memory this host has (see `edgectl probe`): "
                           "cannot plan without a memory budget")
    model_max, cap, target = _context_bounds(model, request)
    kv_dtypes = kv_dtypes or [KvCacheDtype.AUTO]

    def size(kv_dtype: KvCacheDtype) -> list[_Sized]:
        sized: list[_Sized] = []
        for fmt, why in candidates:
            weights = _weights(model, profile, fmt, group_size, lm_head_quantized(fmt, quantize_lm_head))
            ledger = Ledger(model, request, costs, weights.value, rope_capped, kv_dtype)
            if ledger.at(target).limit_bytes <= budget:
                sized.append(_Sized(fmt, why, weights, ledger, target))
                break
            sized.append(_Sized(fmt, why, weights, ledger, ledger.largest_fitting(budget, MIN_CONTEXT, target)))
        return sized

    tried: list[tuple[KvCacheDtype, list[_Sized]]] = []
    for kv_dtype in kv_dtypes:
        sized = size(kv_dtype)
        tried.append((kv_dtype, sized))
        fitting = [c for c in sized
                   if c.fits_len is not None and (request.max_model_len is None or c.fits_len == target)]
        if fitting:
            break
    if not fitting:
        # Refuse with the numbers of the format (and KV dtype) that comes closest: its hint is the one that holds.
        at = target if request.max_model_len is not None else MIN_CONTEXT
        closest = min(sized, key=lambda c: (-(c.fits_len or 0), c.ledger.at(at).limit_bytes))
        raise _wont_fit(closest.ledger.at(at), budget, request, closest.fits_len,
                        closest.fmt if len(sized) > 1 else None,
                        kv_dtype if kv_dtype is not KvCacheDtype.AUTO and request.kv_cache_dtype is None else None)
    best = max(fitting, key=lambda c: (c.fits_len, -sized.index(c)))
    assert best.fits_len is not None
    why = _format_reason(best, sized, budget, target)
    max_len = best.fits_len
    memory = best.ledger.at(max_len)
    context = _context_reason(request, max_len, memory, budget, cap, model_max)
    kv_why = _kv_reason(kv_dtype, tried, request, budget, target, cap, best, kv_dtypes)
    return Decided(Fit(best.fmt, best.weights.value, max_len, memory, kv_dtype), why, best.weights, context, kv_why)


def _format_reason(best: _Sized, sized: list[_Sized], budget: int, target: int) -> Reason:
    """Why the format that fits best is chosen: its own reason, and why the ones ranked above it were not."""
    why = best.reason
    if best is sized[0]:
        return why
    first = sized[0]
    fits = f"fits only {first.fits_len} tokens" if first.fits_len else "does not fit at any context"
    return Reason("weight_format", best.fmt, why.source,
                  f"{first.fmt} ranks first but {fits} in the budget {mib(budget)} "
                  f"(needs {mib(first.ledger.at(target).limit_bytes)} at {target} tokens); {why.detail}")


def _context_reason(request: Request, max_len: int, memory: Memory, budget: int, cap: int, model_max: int) -> Reason:
    """Why the context is ``max_len``: as asked (it fits), or the largest that fits up to the cap."""
    if request.max_model_len is not None:
        return Reason("max_model_len", max_len, Source.FLAG,
                      f"asked; fits: limit {mib(memory.limit_bytes)} ≤ budget {mib(budget)}")
    limited_by = ("the model maximum" if cap == model_max else
                  f"the default {DEFAULT_CONTEXT_CAP} (ask for more with --max-model-len, up to {model_max})")
    return Reason("max_model_len", max_len, Source.PROBE if max_len < cap else Source.MODEL_CONFIG,
                  f"largest that fits the budget {mib(budget)} with {request.max_num_seqs} sequence(s), "
                  f"capped at {limited_by}")


def _kv_reason(kv_dtype: KvCacheDtype, tried: list[tuple[KvCacheDtype, list[_Sized]]], request: Request,
               budget: int, target: int, cap: int, best: _Sized, kv_dtypes: list[KvCacheDtype]) -> Reason:
    if request.kv_cache_dtype is not None:
        detail = "asked with --kv-cache-dtype" + (f"; {kv_cost(kv_dtype)}" if kv_dtype is not KvCacheDtype.AUTO else "")
        return Reason("kv_cache_dtype", kv_dtype, Source.FLAG, detail)
    if kv_dtype is not KvCacheDtype.AUTO:
        first = tried[0][1]
        longest = max((c.fits_len or 0) for c in first)
        wanted = f"{target} tokens" if request.max_model_len is not None else f"{MIN_CONTEXT} tokens (the shortest context planned)"
        detail = (f"{wanted} do not fit with bf16 KV in the budget {mib(budget)} in any weight format ("
                  + (f"bf16 KV fits {longest} tokens" if longest else "bf16 KV fits no context")
                  + f"); {kv_dtype} holds a token in about half the bytes, so the context fits. Its cost: "
                  + kv_cost(kv_dtype))
        return Reason("kv_cache_dtype", kv_dtype, Source.DEFAULT, detail)
    narrow = [d for d in kv_dtypes if d is not KvCacheDtype.AUTO]  # the one-byte KV this host runs, if any
    if not narrow:
        return Reason("kv_cache_dtype", KvCacheDtype.AUTO, Source.DEFAULT,
                      "bf16, the model's dtype (neither edgectl's int8 KV nor vLLM's fp8 KV can run here)")
    detail = f"bf16, the model's dtype: {narrow[0]} KV only when the context does not fit otherwise"
    if best.fits_len is not None and best.fits_len < cap and request.max_model_len is None:
        ledger = Ledger(best.ledger.model, request, best.ledger.costs, best.ledger.weights_bytes,
                        best.ledger.rope_capped, narrow[0])
        more = ledger.largest_fitting(budget, MIN_CONTEXT, cap)
        if more and more > best.fits_len:
            detail += (f"; with --kv-cache-dtype {narrow[0]} the budget holds {more} tokens instead of "
                       f"{best.fits_len} ({kv_cost(narrow[0])})")
    return Reason("kv_cache_dtype", KvCacheDtype.AUTO, Source.DEFAULT, detail)


def _context_bounds(model: ModelFacts, request: Request) -> tuple[int, int, int]:
    """(the model's maximum, the default cap, the context to try first)."""
    if not model.max_position_embeddings and request.max_model_len is None:
        raise EdgectlError(f"{model.path}/config.json gives no max_position_embeddings: cannot size the context; "
                           "pass --max-model-len")
    # without it in config.json, the user's --max-model-len is the only maximum there is
    model_max = model.max_position_embeddings or request.max_model_len
    assert model_max is not None  # one of them, checked above
    model_max = int(model_max)
    if request.max_model_len is not None:
        if request.max_model_len < MIN_ASKED_CONTEXT:
            raise EdgectlError(f"--max-model-len {request.max_model_len} is too small "
                               f"(at least {MIN_ASKED_CONTEXT} tokens)")
        if request.max_model_len > model_max:
            raise EdgectlError(f"--max-model-len {request.max_model_len} exceeds what {model.name} supports "
                               f"({model_max}, max_position_embeddings): use --max-model-len {model_max} or less")
    cap = min(model_max, DEFAULT_CONTEXT_CAP)
    return model_max, cap, (request.max_model_len if request.max_model_len is not None else cap)


def _weights(model: ModelFacts, profile: Profile, fmt: WeightFormat, group_size: int,
             quantize_lm_head: bool) -> Reason:
    """The resident weights in ``fmt``: from the model's shapes, times the measured ratio if any."""
    weights_bytes, n_quant, n_kept = weights_bytes_for(model, fmt, group_size, quantize_lm_head)
    stored = "in the GGUF" if model.param_source == "gguf" else "of parameters"
    detail = f"{model.param_bytes.total / MiB:.0f} MiB {stored} as {fmt}"
    source = Source.MODEL_CONFIG
    wide = sum(1 for layer in model.linear_layers if (layer.gguf_bits or 4) == 8)
    five = sum(1 for layer in model.linear_layers if layer.gguf_bits == 5)
    if fmt is WeightFormat.W4A8 and (wide or five):
        detail += f": {n_quant - wide - five} linear layers in edgectl's 4-bit blocks of 32"
        detail += f", {five} in its 5-bit blocks (the GGUF's Q5_0 as it is)" if five else ""
        detail += f", {wide} in its 8-bit blocks (the GGUF holds them in 5 to 8 bits)" if wide else ""
        detail += ", the output head in 8-bit blocks" if quantize_lm_head else ""
    elif fmt in (WeightFormat.W4A8, WeightFormat.W8A8):
        bits = 8 if fmt is WeightFormat.W8A8 else 4
        detail += f": {n_quant} linear layers in edgectl's {bits}-bit blocks of 32"
        detail += ", the output head in 8-bit blocks" if quantize_lm_head else ""
        detail += f", {n_kept} of the vision tower and connector in bf16" if n_kept else ""
    elif fmt.is_int4:
        detail += f": {n_quant} linear layers int4 (groups ≤ {group_size}, per layer by K), {n_kept} kept bf16"
        figures = profile.formats.get(fmt)
        if figures and figures.weights_bytes_ratio:
            weights_bytes = int(weights_bytes * figures.weights_bytes_ratio.median)
            detail += f"; × {figures.weights_bytes_ratio.median:.3f} measured resident/planned"
            source = profile.reason_source
    return Reason("weights_bytes", weights_bytes, source, detail)


def _wont_fit(mem: Memory, budget: int, request: Request, fits_len: int | None,
              fmt: WeightFormat | None = None, kv_dtype: KvCacheDtype | None = None) -> EdgectlError:
    """The refusal: need vs budget, and the request that would fit.

    ``fmt`` names the weight format the numbers are for when several were tried; ``kv_dtype``
    the KV dtype, when the planner tried a one-byte KV too.
    """
    as_fmt = f" as {fmt} (the format that comes closest)" if fmt is not None else ""
    if kv_dtype is not None:
        as_fmt += f" with {kv_dtype} KV (bf16 KV needs more)"
    need = (f"needs {mib(mem.limit_bytes)}{as_fmt} (steady {mib(mem.total_bytes)} incl. KV "
            f"{mib(mem.kv_cache_bytes)}), budget is {mib(budget)}")
    if fits_len is not None:
        hint = f"fits with --max-model-len {fits_len}"
    elif request.max_num_seqs > 1:
        hint = "does not fit even at the shortest context: try --max-num-seqs 1"
    else:
        hint = ("does not fit at any context: free memory, raise the cgroup limit, or pick a smaller model "
                "(`edgectl models list`)")
    what = (f"{request.model}" + (f" at --max-model-len {request.max_model_len}" if request.max_model_len else "")
            + (f" with --max-num-seqs {request.max_num_seqs}" if request.max_num_seqs > 1 else ""))
    return EdgectlError(f"{what} does not fit: {need}; {hint}")
