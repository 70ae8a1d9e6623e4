"""The largest |key| and |value| each attention layer of a vision-language model writes for one image
prompt, and how many keys pass fp8_e4m3's largest value (448): whether vLLM's fp8 KV (one scale per
tensor, 1.0) loses an image prompt's KV to its range or to its three bits of mantissa (docs/vision.md
"vLLM's fp8 KV"). By hand, one engine in this process:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 [KV_DTYPE=fp8_e4m3] /opt/edgectl/venv/bin/python scripts/study/kv_range.py [MODEL_DIR]

(``KV_DTYPE``: the engine's KV dtype, bf16 by default; the answer printed shows what the KV dtype does to it.)
``ROUND=int8`` rounds every key and value the layers write (in place, before vLLM stores them in its bf16 KV)
as an int8 KV with a scale per token and KV head would hold them; ``ROUND=fp8`` as fp8_e4m3 would (the
control of the format alone). ``ISA=vec`` has vLLM write and read its "vec" KV layout where it would choose
"amx" (an AMX host; as edgectl's decode-attention lever does), to tell its two kernels apart.
"""
import base64
import os
import sys

WT = str(__import__("pathlib").Path(__file__).resolve().parents[2]); sys.path[:0] = [WT, WT + "/runtime"]
from vllm import LLM, SamplingParams  # noqa: E402

from edgectl.bench.vision import images, measure  # noqa: E402

FP8_E4M3_MAX = 448.0
STATS: dict[str, list[float]] = {}
ROUND = os.environ.get("ROUND", "")


def rounded(x, head_size: int):
    """``x`` [tokens, heads * head_size] as the KV dtype under study would hold it, back in its own dtype."""
    import torch

    if ROUND == "fp8":
        return x.to(torch.float8_e4m3fn).to(x.dtype)
    rows = x.float().unflatten(-1, (-1, head_size))  # one row a token and KV head
    scale = rows.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (torch.round(rows / scale).clamp(-127, 127) * scale).flatten(-2).to(x.dtype)


def hook(worker) -> int:
    """A pre-hook on every attention layer keeping its largest |key|, |value| and the keys over the fp8 range."""
    from vllm.model_executor.layers.attention import Attention

    layers = [(n, m) for n, m in worker.model_runner.model.named_modules() if isinstance(m, Attention)]
    for name, module in layers:
        def pre(mod, args, kwargs, n=name, head_size=module.head_size):
            _, k, v = args[:3]
            s = STATS.setdefault(n, [0.0, 0.0, 0, 0])
            s[0], s[1] = max(s[0], float(k.abs().max())), max(s[1], float(v.abs().max()))
            s[2] += int((k.abs() > FP8_E4M3_MAX).sum())
            s[3] += k.numel()
            if ROUND:
                k.copy_(rounded(k, head_size))
                v.copy_(rounded(v, head_size))
        module.register_forward_pre_hook(pre, with_kwargs=True)
    return len(layers)


def read(worker) -> dict[str, list[float]]:
    return STATS


def isa(worker) -> list[str]:
    return sorted({str(m.isa) for m in worker.model_runner.model.modules() if hasattr(m, "isa")})


if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else "/var/lib/edgectl/models/synth-smolvlm-256m"
    if os.environ.get("ISA") == "vec":
        from vllm.v1.attention.backends import cpu_attn

        chosen = cpu_attn._get_attn_isa
        cpu_attn._get_attn_isa = lambda *a, **k: "vec" if chosen(*a, **k) == "amx" else chosen(*a, **k)
    llm = LLM(model=model, enforce_eager=True, dtype="bfloat16", max_model_len=4096, max_num_seqs=1,
              kv_cache_memory_bytes=200_000_000, seed=0, distributed_executor_backend="uni",
              limit_mm_per_prompt={"image": 1}, kv_cache_dtype=os.environ.get("KV_DTYPE", "auto"))
    print("attention layers hooked:", llm.collective_rpc(hook)[0])
    png = images.noise_png(images.image_seed(0, 0, 1))  # the bench's first seeded 512x512 image
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": measure.QUESTION}]}]
    out = llm.chat(messages, SamplingParams(max_tokens=8, temperature=0))[0]
    print(f"answer {out.outputs[0].text!r}, {len(out.prompt_token_ids)} prompt tokens, KV layouts",
          llm.collective_rpc(isa)[0])
    for name, (k, v, over, total) in llm.collective_rpc(read)[0].items():
        print(f"{name}: max |k| {k:.1f}, max |v| {v:.1f}, keys over {FP8_E4M3_MAX:.0f}: {over} of {total}")
    os._exit(0)
