"""A Llama-3.2-1B-shaped model with seeded random weights (normal, sigma 0.02), SmolLM2's tokenizer."""
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
src = Path("/var/lib/edgectl/models/smollm2-135m")
H, I, L, NH, NKV, HD, V = 2048, 8192, 16, 32, 8, 64, 49152
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
       "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
       "vocab_size": V, "max_position_embeddings": 131072, "rope_theta": 500000.0,
       "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
       "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
       "bos_token_id": 1, "eos_token_id": 2}
g = torch.Generator().manual_seed(0)
def rnd(*shape): return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
t = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
for i in range(L):
    p = f"model.layers.{i}"
    t[f"{p}.self_attn.q_proj.weight"] = rnd(NH * HD, H); t[f"{p}.self_attn.k_proj.weight"] = rnd(NKV * HD, H)
    t[f"{p}.self_attn.v_proj.weight"] = rnd(NKV * HD, H); t[f"{p}.self_attn.o_proj.weight"] = rnd(H, NH * HD)
    t[f"{p}.mlp.gate_proj.weight"] = rnd(I, H); t[f"{p}.mlp.up_proj.weight"] = rnd(I, H); t[f"{p}.mlp.down_proj.weight"] = rnd(H, I)
    t[f"{p}.input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16); t[f"{p}.post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
(out / "config.json").write_text(json.dumps(cfg, indent=1))
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
    if (src / f).exists(): shutil.copy(src / f, out / f)
print("params", sum(x.numel() for x in t.values()))
