"""The ``cpu_int4`` quantization method on single layers, through vLLM's own loading machinery
(the layer-wise "online processing" loader), without starting an engine.

The central property: after loading, a quantized layer holds only the packed weight and its
scales/zeros: walking its parameters and buffers finds no copy of the weight in the model dtype
and no unpacked copy.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # noqa: E402
from vllm_group import single_rank_group  # noqa: E402, F401  (the fixture)

from edgectl_runtime.formats.groups import dequantize_int4, quantize_int4  # noqa: E402
from edgectl_runtime.kernels import cpu_int4  # noqa: E402
from edgectl_runtime.kernels.cpu_int4 import kernel_torch  # noqa: E402
from edgectl_runtime.kernels.ops import tinygemm, wna16  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def _single_rank_group(single_rank_group):  # noqa: F811
    """vLLM's dense fallback (UnquantizedLinearMethod) asks for the tensor-parallel rank."""
    yield


def _config(**kw):
    base = {"group_size": 128, "lm_head": False, "layerwise": True, "kernel": "torch"}
    base.update(kw)
    return cpu_int4.CpuInt4Config(**base)


def _layer(config, n_parts, k, role="linear", weights=None, seed=0):
    """A module set up and loaded the way vLLM does it: create_weights, then each checkpoint
    shard through the parameter's (wrapped) weight_loader, then the global post-load pass."""
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    method = cpu_int4.CpuInt4LinearMethod(config, role=role, prefix="test.layer")
    layer.quant_method = method
    method.create_weights(layer, k, list(n_parts), k, sum(n_parts), BF16, weight_loader=default_weight_loader)
    gen = torch.Generator().manual_seed(seed)
    full = weights if weights is not None else (torch.randn(sum(n_parts), k, generator=gen) * 0.05).to(BF16)
    if "weight" in layer._parameters:
        param = layer.weight
        param.weight_loader(param, full)  # one fused tensor: completes the layer
    method.process_weights_after_loading(layer)  # vLLM's global pass (a no-op if already packed)
    return layer, method, full


def _tensors(layer):
    return list(layer.named_parameters()) + list(layer.named_buffers())


def test_layerwise_load_leaves_only_packed_weight_and_scales():
    layer, method, w = _layer(_config(), [960], 576)
    names = {name: (t.dtype, tuple(t.shape)) for name, t in _tensors(layer)}
    assert names == {
        cpu_int4.W_ATTR: (torch.uint8, (960, 288)),
        cpu_int4.SZ_ATTR: (BF16, (9, 960, 2)),  # 576 / 64 groups: 128 does not divide 576
    }
    assert method.group_size == 64
    assert getattr(layer, cpu_int4.INFO_ATTR)["format"] == "cpu_int4/g64"
    # No tensor anywhere holds N x K values (a dense or unpacked copy).
    assert all(t.numel() < 960 * 576 for _, t in _tensors(layer))


def test_layerwise_weight_is_created_on_meta_and_packed_on_its_last_shard():
    config = _config()
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    method = cpu_int4.CpuInt4LinearMethod(config, role="linear")
    layer.quant_method = method
    method.create_weights(layer, 256, [128, 64], 256, 192, BF16, weight_loader=_narrowing_loader([128, 64]))
    assert layer.weight.is_meta and method.uses_meta_device
    w = (torch.randn(192, 256) * 0.05).to(BF16)
    layer.weight.weight_loader(layer.weight, w[:128], 0)
    assert hasattr(layer, "weight") and not hasattr(layer, cpu_int4.W_ATTR)  # still waiting for shard 1
    layer.weight.weight_loader(layer.weight, w[128:], 1)
    assert not hasattr(layer, "weight") and hasattr(layer, cpu_int4.W_ATTR)  # packed on arrival
    q = tinygemm.packed_layout().gather_rows(getattr(layer, cpu_int4.W_ATTR), torch.arange(192))
    ref_q, _, _ = quantize_int4(w, 128, BF16)
    assert torch.equal(q, ref_q)  # the shards landed at their offsets


def _narrowing_loader(sizes):
    """A two-shard loader like MergedColumnParallelLinear's (shard id -> row offset)."""
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]

    def loader(param, loaded_weight, shard_id):
        param.data.narrow(0, offsets[shard_id], sizes[shard_id]).copy_(loaded_weight)

    return loader


@pytest.mark.parametrize("layerwise", [True, False])
@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_apply_matches_the_dequantized_weight(layerwise, m):
    layer, method, w = _layer(_config(layerwise=layerwise), [192, 64, 64], 384)
    q, s, z = quantize_int4(w, 128, BF16)
    x = torch.randn(m, 384, generator=torch.Generator().manual_seed(m)).to(BF16)
    out = method.apply(layer, x)
    ref = x.float() @ dequantize_int4(q, s, z).t()
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    bias = torch.randn(320).to(BF16)
    assert torch.allclose(method.apply(layer, x, bias).float(), out.float() + bias.float(), atol=0.05)


def test_naive_path_keeps_a_dense_weight_until_the_global_pass():
    config = _config(layerwise=False)
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    method = cpu_int4.CpuInt4LinearMethod(config, role="linear")
    method.create_weights(layer, 256, [128], 256, 128, BF16, weight_loader=default_weight_loader)
    assert not layer.weight.is_meta and not method.uses_meta_device
    layer.weight.weight_loader(layer.weight, torch.randn(128, 256).to(BF16))
    assert layer.weight.dtype == BF16  # nothing packed yet: the whole model would be dense now
    method.process_weights_after_loading(layer)
    assert {n for n, _ in _tensors(layer)} == {cpu_int4.W_ATTR, cpu_int4.SZ_ATTR}


def test_rows_not_a_multiple_of_16_stay_dense_and_say_why():
    layer, method, w = _layer(_config(), [40], 256)
    info = getattr(layer, cpu_int4.INFO_ATTR)
    assert method.dense is not None and info["format"] == "bfloat16" and "multiple of 16" in info["reason"]
    x = torch.randn(3, 256).to(BF16)
    ref = x.float() @ w.float().t()
    assert float((method.apply(layer, x).float() - ref).norm() / ref.norm()) < 1e-2


def test_k_without_a_group_stays_dense():
    layer, method, _ = _layer(_config(), [64], 48)
    assert method.dense is not None
    assert "not a multiple of any int4 group size" in getattr(layer, cpu_int4.INFO_ATTR)["reason"]


def test_tied_embedding_lookup_and_lm_head_read_one_packed_copy():
    config = _config(lm_head=True)
    embed, emb_method, w = _layer(config, [448], 192, role="embedding")
    assert {n for n, _ in embed.named_parameters()} == {cpu_int4.W_ATTR, cpu_int4.SZ_ATTR}
    q, s, z = quantize_int4(w, 64, BF16)
    deq = dequantize_int4(q, s, z)
    ids = torch.tensor([[0, 5, 447], [100, 100, 63]])
    rows = emb_method.embedding(embed, ids)
    assert rows.shape == (2, 3, 192) and rows.dtype == BF16
    assert torch.equal(rows, deq[ids].to(BF16))  # only the rows asked for, exactly dequantized

    head = torch.nn.Module()
    head.params_dtype = BF16
    head_method = cpu_int4.CpuInt4LinearMethod(config, role="lm_head")
    head.quant_method = head_method
    head_method.create_weights(head, 192, [448], 192, 448, BF16, weight_loader=default_weight_loader)
    head_method.tie_weights(head, embed)
    head_method.process_weights_after_loading(head)
    assert list(head.parameters()) == []  # nothing of its own: it reads the embedding's int4
    x = torch.randn(2, 192).to(BF16)
    ref = x.float() @ deq.t()
    assert float((head_method.apply(head, x).float() - ref).norm() / ref.norm()) < 1e-2


def test_padded_vocabulary_completes_on_the_real_rows():
    # vLLM pads the vocabulary to 64 rows; the loader fills only the real ones.
    config = _config(lm_head=True)
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    layer.org_vocab_size = 400
    method = cpu_int4.CpuInt4LinearMethod(config, role="lm_head")
    layer.quant_method = method

    def vocab_loader(param, loaded_weight):
        param.data[: loaded_weight.shape[0]].copy_(loaded_weight)
        param.data[loaded_weight.shape[0]:].fill_(0)

    method.create_weights(layer, 192, [448], 192, 448, BF16, weight_loader=vocab_loader)
    layer.weight.weight_loader(layer.weight, (torch.randn(400, 192) * 0.05).to(BF16))
    assert hasattr(layer, cpu_int4.W_ATTR)  # packed at once, not deferred to the end of loading


def test_padded_embedding_from_an_fp32_checkpoint_stays_int4():
    # A tied embedding whose checkpoint is fp32 while the model serves bf16, with vLLM's padded
    # vocabulary: the tail block (real rows + padding) must quantize from the same values as
    # every other block, or the packed-row check fails and the embedding silently stays dense.
    config = _config(lm_head=True)
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    layer.org_vocab_size = 400
    method = cpu_int4.CpuInt4LinearMethod(config, role="embedding")
    layer.quant_method = method

    def vocab_loader(param, loaded_weight):
        param.data[: loaded_weight.shape[0]].copy_(loaded_weight)
        param.data[loaded_weight.shape[0]:].fill_(0)

    method.create_weights(layer, 192, [448], 192, 448, BF16, weight_loader=vocab_loader)
    w = torch.randn(400, 192, generator=torch.Generator().manual_seed(3)) * 0.05  # fp32, 400 of 448 rows
    layer.weight.weight_loader(layer.weight, w)
    method.process_weights_after_loading(layer)
    assert method.dense is None and hasattr(layer, cpu_int4.W_ATTR), getattr(layer, cpu_int4.INFO_ATTR)
    q, s, z = quantize_int4(w, 64, BF16)
    ids = torch.tensor([0, 255, 256, 399])  # both sides of the 256-row pack block, and the last real row
    assert torch.equal(method.embedding(layer, ids), dequantize_int4(q, s, z)[ids].to(BF16))


def test_vllm_kernel_layers():
    if not wna16.wna16_available():
        pytest.skip("vLLM's library on this CPU does not register cpu_gemm_wna16")
    layer, method, w = _layer(_config(kernel="vllm"), [192, 64, 64], 384)
    assert method.kernel == "vllm"
    assert getattr(layer, cpu_int4.INFO_ATTR)["format"] == "cpu_int4-wna16/g128"
    assert {n: t.dtype for n, t in _tensors(layer)} == {
        cpu_int4.W_ATTR: torch.int32, cpu_int4.S_ATTR: BF16, cpu_int4.Z_ATTR: torch.float32}
    q, s, z = quantize_int4(w, 128, BF16)
    uq, us, uz = cpu_int4.unpack_layer(layer)
    assert torch.equal(uq, q) and torch.equal(us, s) and torch.equal(uz.to(BF16), z)
    x = torch.randn(5, 384).to(BF16)
    ref = x.float() @ dequantize_int4(q, s, z).t()
    assert float((method.apply(layer, x).float() - ref).norm() / ref.norm()) < 2e-2


def test_vllm_kernel_needs_multiples_of_32():
    if not wna16.wna16_available():
        pytest.skip("vLLM's library on this CPU does not register cpu_gemm_wna16")
    layer, method, _ = _layer(_config(kernel="vllm"), [48], 256)
    assert method.kernel == "torch" and "multiples of 32" in getattr(layer, cpu_int4.INFO_ATTR)["reason"]


def test_config_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("EDGECTL_INT4_GROUP_SIZE", "32")
    monkeypatch.setenv("EDGECTL_LM_HEAD", "int4")
    monkeypatch.setenv("EDGECTL_LAYERWISE_REPACK", "0")
    c = cpu_int4.CpuInt4Config()
    assert (c.group_size, c.lm_head, c.layerwise, c.source, c.kernel) == (32, "int4", False, "dense", "torch")
    # explicit settings (hf_overrides quantization_config_dict_json) win over the environment
    c = cpu_int4.CpuInt4Config.from_config_dict_json('{"group_size": 64, "lm_head": false}')
    assert (c.group_size, c.lm_head, c.layerwise) == (64, "dense", False)
    c = cpu_int4.CpuInt4Config.from_config_dict_json('{"kernel": "edgectl", "lm_head": "int8"}')
    assert (c.kernel, c.lm_head, c.head_kernel) == ("edgectl", "int8", "edgectl")
    with pytest.raises(ValueError, match="unknown settings"):
        cpu_int4.CpuInt4Config.from_config_dict_json('{"groupsize": 64}')
    monkeypatch.setenv("EDGECTL_INT4_GROUP_SIZE", "100")
    with pytest.raises(ValueError, match="EDGECTL_INT4_GROUP_SIZE"):
        cpu_int4.CpuInt4Config()


def test_portable_checkpoint_config():
    c = cpu_int4.CpuInt4Config.from_config({"quant_method": "cpu_int4", "format": "edgectl.cpu_int4/1",
                                            "group_size": 32})
    assert c.source == "portable" and c.group_size == 32
    with pytest.raises(ValueError, match="edgectl quantize"):
        cpu_int4.CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32})


def test_a_layout_that_fails_verification_keeps_the_embedding_dense(monkeypatch):
    # If the learned layout ever stopped matching torch's pack op, the lookup would return
    # wrong rows: the load-time check must catch it and keep the embedding in the model dtype.
    true = tinygemm.packed_layout()
    wrong = tinygemm.PackedLayout(true.block_rows, true.perm_table.roll(1, dims=1))
    monkeypatch.setattr(kernel_torch, "packed_layout", lambda: wrong)
    embed, method, w = _layer(_config(lm_head=True), [448], 192, role="embedding")
    assert method.dense is not None
    assert getattr(embed, cpu_int4.INFO_ATTR)["reason"] == "packed-row lookup failed verification"
    ids = torch.tensor([3, 200, 447])
    assert torch.equal(method.embedding(embed, ids), w[ids])


# --- GPTQ / AWQ checkpoints converted at load


def _prequantized(source, n_parts, k, ckpt_group, *, sym=True, seed=0):
    """Synthetic checkpoint tensors: GPTQ (qweight [K/8, N] packed along K) or AWQ GEMM
    (qweight [K, N/8] packed along N in AWQ order), and the weight they stand for."""
    from edgectl_runtime.formats.gptq_awq import _AWQ_ORDER, pack_int32

    gen = torch.Generator().manual_seed(seed)
    n = sum(n_parts)
    groups = k // (ckpt_group if ckpt_group > 0 else k)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    zp = torch.full((groups, n), 8, dtype=torch.uint8) if sym else torch.randint(0, 16, (groups, n), generator=gen,
                                                                                    dtype=torch.uint8)
    scales = (torch.rand(groups, n, generator=gen) * 0.01 + 0.001).to(torch.float16)
    rep = k // groups
    w = ((q.float() - zp.float().repeat_interleave(rep, 0)) * scales.float().repeat_interleave(rep, 0)).t()
    if source == "gptq":
        tensors = {"qweight": pack_int32(q, 0), "qzeros": pack_int32((zp.int() - 1) & 0xF, 1), "scales": scales}
    else:
        tensors = {"qweight": pack_int32(q, 1, _AWQ_ORDER), "qzeros": pack_int32(zp, 1, _AWQ_ORDER),
                   "scales": scales}
    return tensors, w


@pytest.mark.parametrize(("source", "sym", "ckpt_group", "kernel_group"),
                         [("gptq", True, 128, 128), ("gptq", False, 64, 64), ("gptq", True, -1, 128),
                          ("awq", False, 128, 128), ("awq", False, 512, 256)])
def test_gptq_awq_checkpoints_convert_exactly(source, sym, ckpt_group, kernel_group):
    k = 512 if ckpt_group == 512 else 384
    config = cpu_int4.CpuInt4Config.from_config(
        {"quant_method": source, "bits": 4, "group_size": ckpt_group, "desc_act": False, "sym": sym,
         "version": "GEMM", "zero_point": True})
    config.layerwise = True
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    method = cpu_int4.CpuInt4LinearMethod(config, role="linear", prefix="model.layers.0.mlp.down_proj")
    layer.quant_method = method
    method.create_weights(layer, k, [192, 64], k, 256, BF16, weight_loader=default_weight_loader)
    tensors, w = _prequantized(source, [192, 64], k, ckpt_group, sym=sym)
    for name, t in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, t)
    method.process_weights_after_loading(layer)
    assert {n for n, _ in _tensors(layer)} == {cpu_int4.W_ATTR, cpu_int4.SZ_ATTR}
    assert method.group_size == kernel_group
    q, s, z = cpu_int4.unpack_layer(layer)
    deq = dequantize_int4(q, s, z)
    # exact up to rounding the per-group zero (8 - zp) * scale to bf16
    assert float((deq - w).abs().max()) <= 0.02 * float(w.abs().max())
    x = torch.randn(4, k).to(BF16)
    ref = x.float() @ w.t()
    assert float((method.apply(layer, x).float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize(("config", "message"), [
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "4-bit"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, "desc_act"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 16}, "finer than"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "GEMM"),
])
def test_unsupported_gptq_awq_checkpoints_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        cpu_int4.CpuInt4Config.from_config(config)


def test_gptq_and_awq_are_claimed_only_when_asked_for():
    gptq = {"quant_method": "gptq", "bits": 4}
    assert cpu_int4.CpuInt4Config.override_quantization_method(gptq, "cpu_int4") == "cpu_int4"
    assert cpu_int4.CpuInt4Config.override_quantization_method(gptq, None) is None  # vLLM's own path
    assert cpu_int4.CpuInt4Config.override_quantization_method({"quant_method": "fp8"}, "cpu_int4") is None


# --- edgectl's kernels (w4a8 linear layers, int8 / int4 heads)

def _edgectl_available():
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    assert ok, why  # scripts/setup.sh builds the library: its absence is a failure


def test_edgectl_linear_holds_any_shape_and_matches_its_reference():
    """N = 200 is not a multiple of 16 and K = 100 not of 32: edgectl's blocks pad both."""
    _edgectl_available()
    from edgectl_runtime.formats import blocks
    from edgectl_runtime.kernels.ops import reference

    layer, method, w = _layer(_config(kernel="edgectl"), [120, 80], 100)
    info = getattr(layer, cpu_int4.INFO_ATTR)
    assert (method.kernel, info["format"], info["bits"]) == ("edgectl", "w4a8/b32", 4)
    assert {n: tuple(t.shape) for n, t in _tensors(layer)} == {cpu_int4.W_ATTR: blocks.packed_shape(200, 100, 4)}
    q, d, m = blocks.quantize_w4(w)
    x = torch.randn(3, 100).to(BF16)
    assert torch.equal(method.apply(layer, x), torch.ops.edgectl.linear_w4a8(x, getattr(layer, cpu_int4.W_ATTR), 200, 100))
    ref = reference.linear_w4a8(x, q, d, m)
    assert float((method.apply(layer, x).float() - ref.float()).norm() / ref.float().norm()) < 1e-2
    uq, us, uz = cpu_int4.unpack_layer(layer)  # read back as groups of 32 (fp32 scales and zeros)
    assert torch.equal(uq, q)  # K padded to 128 (4 blocks), padding q = 0
    torch.testing.assert_close(dequantize_int4(uq, us, uz)[:, :100], blocks.dequantize_w4(q, d, m, 100),
                               rtol=0, atol=1e-6)


def test_edgectl_linear_in_8_bits_when_asked_matches_its_reference():
    """EDGECTL_LINEAR_BITS=8 (the plan's w8a8): the linear layers in edgectl's W8 blocks, any shape."""
    _edgectl_available()
    from edgectl_runtime.formats import blocks
    from edgectl_runtime.kernels.ops import reference

    layer, method, w = _layer(_config(kernel="edgectl", linear_bits=8), [120, 80], 100)
    info = getattr(layer, cpu_int4.INFO_ATTR)
    assert (method.kernel, info["format"], info["bits"]) == ("edgectl", "w8a8/b32", 8)
    assert {n: tuple(t.shape) for n, t in _tensors(layer)} == {cpu_int4.W_ATTR: blocks.packed_shape(200, 100, 8)}
    x = torch.randn(3, 100).to(BF16)
    assert torch.equal(method.apply(layer, x), torch.ops.edgectl.linear_w8a8(x, getattr(layer, cpu_int4.W_ATTR), 200, 100))
    q, d = blocks.quantize_w8(w)
    ref = reference.linear_w8a8(x, q, d)
    assert float((method.apply(layer, x).float() - ref.float()).norm() / ref.float().norm()) < 1e-2
    # closer to the dense layer than the same layer in 4 bits
    dense = x.float() @ w.float().T
    w4_layer, w4_method, _ = _layer(_config(kernel="edgectl"), [120, 80], 100)
    err8 = float((method.apply(layer, x).float() - dense).norm() / dense.norm())
    err4 = float((w4_method.apply(w4_layer, x).float() - dense).norm() / dense.norm())
    assert err8 < err4 / 4


def test_8_bit_linear_layers_are_refused_where_they_cannot_run(monkeypatch):
    monkeypatch.setenv("EDGECTL_LINEAR_BITS", "8")
    monkeypatch.setenv("EDGECTL_INT4_KERNEL", "torch")
    with pytest.raises(ValueError, match="8-bit linear layers run on edgectl's kernels"):
        cpu_int4.CpuInt4Config()
    with pytest.raises(ValueError, match="linear layers of 6 bits"):
        _config(kernel="edgectl", linear_bits=6)
    monkeypatch.setenv("EDGECTL_INT4_KERNEL", "edgectl")
    _edgectl_available()
    assert cpu_int4.CpuInt4Config().linear_bits == 8
    with pytest.raises(ValueError, match="quantized at load from a dense checkpoint"):
        cpu_int4.CpuInt4Config(source="gptq")


@pytest.mark.parametrize("head", ["int8", "int4"])
def test_edgectl_tied_head_and_lookup_read_one_copy(head):
    _edgectl_available()
    from edgectl_runtime.formats import blocks

    config = _config(kernel="edgectl", lm_head=head)
    embed, emb_method, w = _layer(config, [448], 192, role="embedding")
    assert {n for n, _ in embed.named_parameters()} == {cpu_int4.W_ATTR}
    bits = 8 if head == "int8" else 4
    deq = blocks.dequantize_w8(*blocks.quantize_w8(w), 192) if bits == 8 else \
        blocks.dequantize_w4(*blocks.quantize_w4(w), 192)
    ids = torch.tensor([[0, 5, 447], [100, 100, 63]])
    rows = emb_method.embedding(embed, ids)
    assert rows.shape == (2, 3, 192) and rows.dtype == BF16
    assert torch.equal(rows, deq[ids].to(BF16))
    head_layer = torch.nn.Module()
    head_layer.params_dtype = BF16
    head_method = cpu_int4.CpuInt4LinearMethod(config, role="lm_head")
    head_layer.quant_method = head_method
    head_method.create_weights(head_layer, 192, [448], 192, 448, BF16, weight_loader=default_weight_loader)
    head_method.tie_weights(head_layer, embed)
    head_method.process_weights_after_loading(head_layer)
    assert list(head_layer.parameters()) == []
    x = torch.randn(2, 192).to(BF16)
    ref = x.float() @ deq.t()
    assert float((head_method.apply(head_layer, x).float() - ref).norm() / ref.norm()) < 1e-2


def test_int8_head_next_to_torch_linear_layers():
    """The int8 head is edgectl's whatever the linear layers' kernel (it is "available for any layer")."""
    _edgectl_available()
    config = _config(kernel="torch", lm_head="int8")
    embed, method, _ = _layer(config, [448], 192, role="embedding")
    assert (method.kernel, method.bits, getattr(embed, cpu_int4.INFO_ATTR)["format"]) == ("edgectl", 8, "w8a8/b32")
    linear, lmethod, _ = _layer(config, [192], 192)
    assert lmethod.kernel == "torch"


def test_edgectl_padded_vocabulary_packs_as_the_rows_arrive():
    _edgectl_available()
    config = _config(kernel="edgectl", lm_head="int8")
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    layer.org_vocab_size = 400
    method = cpu_int4.CpuInt4LinearMethod(config, role="embedding")
    layer.quant_method = method
    method.create_weights(layer, 192, [448], 192, 448, BF16, weight_loader=default_weight_loader)
    w = torch.randn(400, 192, generator=torch.Generator().manual_seed(3)) * 0.05  # fp32 checkpoint
    layer.weight.weight_loader(layer.weight, w)
    assert hasattr(layer, cpu_int4.W_ATTR) and "weight" not in layer._parameters
    ids = torch.tensor([0, 255, 399, 447])  # the last id is a padding row: zeros
    rows = method.embedding(layer, ids)
    assert not rows[3].any() and torch.allclose(rows[:3].float(), w[ids[:3]], atol=0.05 / 127 * 4)


@pytest.mark.parametrize(("source", "sym", "ckpt_group"), [("gptq", True, 128), ("awq", False, 64), ("gptq", True, -1)])
def test_gptq_awq_to_edgectl_blocks_keep_q(source, sym, ckpt_group):
    """A group-wise checkpoint becomes W4 blocks without requantizing: the same q, d = scale,
    m = zero - 8 scale (exact up to fp16 rounding of d and m)."""
    _edgectl_available()
    k = 384
    config = cpu_int4.CpuInt4Config.from_config(
        {"quant_method": source, "bits": 4, "group_size": ckpt_group, "desc_act": False, "sym": sym,
         "version": "GEMM", "zero_point": True})
    config.kernel = "edgectl"
    config.layerwise = True
    layer = torch.nn.Module()
    layer.params_dtype = BF16
    method = cpu_int4.CpuInt4LinearMethod(config, role="linear", prefix="model.layers.0.mlp.down_proj")
    layer.quant_method = method
    method.create_weights(layer, k, [192, 64], k, 256, BF16, weight_loader=default_weight_loader)
    tensors, w = _prequantized(source, [192, 64], k, ckpt_group, sym=sym)
    for name, t in tensors.items():
        param = getattr(layer, name)
        param.weight_loader(param, t)
    method.process_weights_after_loading(layer)
    assert getattr(layer, cpu_int4.INFO_ATTR)["format"] == "w4a8/b32"
    q, d, z = cpu_int4.unpack_layer(layer)
    deq = dequantize_int4(q, d, z)
    # d = the checkpoint's fp16 scale exactly; m = -zp * scale rounded once to fp16
    m = z - 8 * d
    assert float((deq - w).abs().max()) <= 2 ** -11 * float(m.abs().max()) + 1e-6
