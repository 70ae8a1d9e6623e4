"""The planner: from probe facts, model facts and device profiles to a Plan.

``plan(facts, model, profiles, request)`` is a pure function: no I/O, no clock, no
environment. It reads as the decisions in the order they are made; each is made in one module
and returns its value with its reason (the source of the number behind it: a measured profile,
the model's config, the user's flag, the probe, edgectl's default, or a stated fallback):

    profile                        profile.py   the most specific profile matching the host
    topology, compilation, levers  engine.py    how vLLM's engine runs (the memory levers too)
    KV dtypes to try               kv_dtype.py  bf16, then fp8 where vLLM runs it
    cpus, threads, front-end core  cpus.py
    runtime memory, load peak      ledger.py    the fixed costs
    formats, group size            formats.py   what runs here, ranked by measured speed
    weight format + context        fit.py       the best format that fits, the longest context,
                                                with bf16 KV, else fp8 KV
    batched tokens                 engine.py
    KV cache, RoPE rows, limits    ledger.py    the memory ledger
    predicted speeds               speed.py     the profile's figures, moved to this model
    timeouts, env                  service.py

A speech-to-text model (``model.speech``) is planned by :mod:`edgectl.planner.speech`, which shares
the profile, topology, CPU and lever decisions and sizes an encoder-decoder instead of a context.
A vision-language model (``model.vision``) is planned by :mod:`edgectl.planner.vision`: as its
language model, with the text planner's fit, plus the vision tower, the image tokens and the encoder.

A request that cannot be served raises :class:`EdgectlError` (exit 2) with need vs budget and
the request that would fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgectl.contract.plan import (
    ModelRef,
    Plan,
    ProfileRef,
    Request,
    Serve,
    WeightFormat,
)
from edgectl.planner import ledger
from edgectl.planner.cpus import choose_cpus
from edgectl.planner.decided import Reasons
from edgectl.planner.engine import (
    LEAN_ATTENTION_TEXT,
    choose_batched_tokens,
    choose_compilation,
    choose_graph_wrapper,
    choose_levers,
    choose_lm_head,
    choose_memory_levers,
    choose_topology,
    text_decode_attention,
)
from edgectl.planner.fit import fit_weights_and_context
from edgectl.planner.formats import (
    checkpoint_format,
    choose_group_size,
    runnable_formats,
)
from edgectl.planner.kv_dtype import decode_attention_for, kv_dtype_candidates
from edgectl.planner.profile import choose_profile
from edgectl.planner.request import check_request
from edgectl.planner.service import choose_timeouts, worker_environment
from edgectl.planner.speech import plan_speech
from edgectl.planner.speed import predict
from edgectl.planner.vision import plan_vision

if TYPE_CHECKING:
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts
    from edgectl.profiles import Profile

__all__ = ["Plan", "Request", "plan"]


def plan(facts: HostFacts, model: ModelFacts, profiles: Sequence[Profile], request: Request) -> Plan:
    """Decide everything the worker will run with, and what it will cost."""
    if model.speech is not None:
        return plan_speech(facts, model, profiles, request)
    if model.vision is not None:
        return plan_vision(facts, model, profiles, request)
    why = Reasons()
    profile = why.take(choose_profile(profiles, facts))
    check_request(request)
    topology = why.take(choose_topology(request.bench))
    compilation = why.take(choose_compilation(request, profile))
    profile, cpp_wrapper = choose_graph_wrapper(profile, compilation, request.bench.cpp_wrapper)
    cpus = why.take(choose_cpus(facts, request, profile, topology))
    costs = why.take(ledger.fixed_costs(model, profile, topology, compilation))
    formats = why.take(runnable_formats(facts, model, profile, request, compilation))
    group_size, levers = choose_group_size(request), choose_levers(request.bench)
    fit = why.take(fit_weights_and_context(
        facts.memory.budget_bytes, model, profile, request, formats, group_size.value,
        request.bench.quantize_lm_head, levers.value.rope_cap, costs, kv_dtype_candidates(facts, model, request)))
    # after the fit: an int8 KV, asked or planned, is read by edgectl's decode attention only
    memory_levers = why.take(choose_memory_levers(
        request.bench, facts, topology, cpp_wrapper=cpp_wrapper, lean_attention=(True, LEAN_ATTENTION_TEXT),
        decode_attention=decode_attention_for(request, fit.kv_dtype, text_decode_attention(facts, model))))
    lm_head = choose_lm_head(request.bench, fit.weight_format)
    if fit.weight_format.is_int4:
        if fit.weight_format is not WeightFormat.W4A8:  # edgectl's blocks are 32 columns, whatever the group
            why.take(group_size)
        why.take(levers)
        why.take(lm_head)
    batched = why.take(choose_batched_tokens(fit.max_model_len))
    why.take(ledger.kv_cache(model, request, fit.memory, fit.max_model_len, fit.kv_dtype))
    rope_rows = why.take(ledger.rope(model, fit.max_model_len, levers.value.rope_cap))
    why.take(ledger.memory_limit(fit.memory, costs))
    predicted = why.take(predict(profile, fit.weight_format, fit.weights_bytes, model.linear_params, compilation))
    timeouts = why.take(choose_timeouts(request, profile, fit.weight_format, fit.weights_bytes, model.linear_params,
                                        batched, compilation))
    plan_levers = memory_levers.levers(rope_cap=levers.value.rope_cap, layerwise_repack=levers.value.layerwise_repack,
                                       topology=topology, reserve_frontend_core=cpus.reserve_frontend_core,
                                       thread_wait=cpus.thread_wait)

    return Plan(
        model=ModelRef(model.name, model.path, model.architecture, checkpoint_format(model)),
        device_class=facts.device_class,
        profile=ProfileRef(profile.name, profile.file, profile.kind),
        weight_format=fit.weight_format,
        group_size=group_size.value,
        quantize_lm_head=lm_head.value if fit.weight_format.is_int4 else False,
        max_model_len=fit.max_model_len,
        max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=batched,
        kv_bytes_per_token=ledger.kv_bytes_per_token(model, fit.kv_dtype),
        kv_cache_dtype=fit.kv_dtype,
        block_size=ledger.BLOCK_SIZE_TOKENS,
        rope_rows=rope_rows,
        threads=cpus.threads,
        cpus=cpus.cpus,
        topology=topology,
        compilation=compilation,
        levers=plan_levers,
        memory=fit.memory,
        predicted=predicted,
        serve=Serve(request.name, request.host, request.port),
        timeouts=timeouts,
        env=worker_environment(cpus, plan_levers),
        reasons=why.items,
        request=request,
    )

