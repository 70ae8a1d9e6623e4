"""The worker's warm-up: one generation through its own HTTP API, and only then ``READY=1``."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time

from edgectl.contract import worker as contract
from edgectl.contract.plan import Plan
from edgectl_runtime.service.idle_trim import release_freed_memory
from edgectl_runtime.service.state import Service

log = logging.getLogger("edgectl.runtime")


async def warm_up(plan: Plan) -> str:
    """One short generation (a speech model: the transcription of the shipped clip; a vision model: an
    answer about the shipped image) through this server's own OpenAI API; returns the text.

    Asynchronous (it runs on the server's own event loop), so not edgectl's worker client; it
    reaches the server where every client does (``contract.base_url``).
    """
    import aiohttp

    base = contract.base_url(plan.serve)
    timeout = aiohttp.ClientTimeout(total=float(plan.timeouts.start_s))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(600):
            try:
                async with session.get(f"{base}/health") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        if plan.speech is not None:
            return await _transcribe_clip(session, base, plan.model.name)
        if plan.vision is not None:
            return await _describe_image(session, base, plan.model.name)
        return await _generate(session, base, plan.model.name)


async def _transcribe_clip(session, base: str, model: str) -> str:
    """The shipped clip through ``/v1/audio/transcriptions``, as a client sends it."""
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("file", contract.WARMUP_CLIP.read_bytes(), filename=contract.WARMUP_CLIP.name,
                   content_type="audio/wav")
    for key, value in (("model", model), ("language", "en"), ("temperature", "0"), ("response_format", "json")):
        form.add_field(key, value)
    async with session.post(f"{base}/v1/audio/transcriptions", data=form) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"warm-up transcription failed: HTTP {r.status}: {data}")
    text: str = data.get("text", "")
    return text


def warmup_image_request(model: str) -> dict:
    """The warm-up's chat completion: the shipped image as a data: URI, as a client sends a local file."""
    uri = "data:image/png;base64," + base64.b64encode(contract.WARMUP_IMAGE.read_bytes()).decode("ascii")
    return {"model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": contract.WARMUP_IMAGE_QUESTION},
                {"type": "image_url", "image_url": {"url": uri}}]}]}


async def _describe_image(session, base: str, model: str) -> str:
    """The shipped image through ``/v1/chat/completions``, so through the image guard and the vision tower:
    an answer of at least one token must come back (a synthetic model's is nonsense)."""
    async with session.post(f"{base}/v1/chat/completions", json=warmup_image_request(model)) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"warm-up chat completion with {contract.WARMUP_IMAGE.name} failed: HTTP {r.status}: "
                               f"{data}")
    if not data.get("usage", {}).get("completion_tokens"):
        raise RuntimeError(f"warm-up answered {contract.WARMUP_IMAGE.name} with no tokens: {data}")
    text: str = data["choices"][0]["message"]["content"] or ""
    return text


async def _generate(session, base: str, model: str) -> str:
    """A chat completion of a few tokens (a plain completion for a model without a chat template)."""
    body = {"model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]}
    async with session.post(f"{base}/v1/chat/completions", json=body) as r:
        if r.status == 400:  # no chat template: a plain completion proves generation as well
            body = {"model": model, "max_tokens": 8, "temperature": 0, "prompt": "Hello"}
            async with session.post(f"{base}/v1/completions", json=body) as r2:
                data = await r2.json()
                if r2.status != 200:
                    raise RuntimeError(f"warm-up completion failed: HTTP {r2.status}: {data}")
                text = data["choices"][0]["text"]
        else:
            data = await r.json()
            if r.status != 200:
                raise RuntimeError(f"warm-up chat completion failed: HTTP {r.status}: {data}")
            text = data["choices"][0]["message"]["content"] or ""
    if not data.get("usage", {}).get("completion_tokens"):
        raise RuntimeError(f"warm-up generated no tokens: {data}")
    return text


async def warm_then_ready(plan: Plan, service: Service, engine_client, listen_address: str) -> None:
    """Warm up, give back what loading freed, read the tokenizer's state again, then ``READY=1``;
    a failed warm-up ends the process (nothing served yet: systemd restarts it)."""
    notifier = service.notifier
    try:
        text = await warm_up(plan)
    except Exception as exc:
        log.error("warm-up failed: %s", exc)
        notifier.status(f"warm-up failed: {exc}")
        os._exit(1)  # nothing served yet: let systemd restart us
    # Loading buffers each layer's checkpoint tensors before packing them; glibc's allocator keeps
    # the freed pages in its heaps. malloc_trim(0) returns them (40 MB here with SmolLM2).
    release_freed_memory()
    if service.effective is not None:  # the processor probe runs at the first chat render: read it again
        from edgectl_runtime.vllm_plugin.lean import tokenizer_state

        service.effective["tokenizer"] = tokenizer_state(engine_client)
    service.ready_s = time.monotonic() - service.started_monotonic
    service.phase = contract.SERVING
    log.info("warm-up answered %r", text)
    suspect = (contract.wrong_transcript(text, contract.warmup_clip_text()) if plan.speech is not None
               else contract.degenerate_answer(text))
    service.warmup = {"answer": text, "suspect": suspect}
    if suspect:
        log.warning("%s: the model may be broken (a wrong conversion or quantization); check its "
                    "answers before relying on it", suspect)
    what = (f"speech to text, {plan.speech.dtype}, {plan.max_num_seqs} at once" if plan.speech is not None
            else f"images and text, {plan.weight_format}, {plan.max_model_len} tokens" if plan.vision is not None
            else f"{plan.weight_format}, {plan.max_model_len} tokens")
    notifier.ready(f"serving {plan.model.name} on {listen_address} ({what}; ready in {service.ready_s:.0f} s)")
