"""lowbit.nn: NVFP4Linear / MXFP4Linear against the float64 product of their quantized operands,
quantize_model on a tiny transformers Llama, torch.compile, state_dict, load_quantized of a
checkpoint written by `lowbit quantize`; (marked gpu) the CUDA path and CUDA-graph replay.

Skips without torch (the Llama tests also without transformers). Run:
    PYTHONPATH=python python -m pytest -q tests/python/test_nn.py
"""

import copy

import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
from lowbit import nn as lnn  # noqa: E402

CLASSES = {"nvfp4": lnn.NVFP4Linear, "mxfp4": lnn.MXFP4Linear}


def _ulp(ref, dtype):
    """One ulp of `dtype` at |ref| (normal range)."""
    e = torch.floor(torch.log2(ref.abs().clamp_min(torch.finfo(dtype).tiny)))
    return torch.exp2(e) * torch.finfo(dtype).eps


def assert_gemm_rule(y, ref, out_dtype, what=""):
    """The library's GEMM rule: |y - ref| <= 1e-3 + 1e-3 |ref| + one output ulp, every element."""
    y, ref = y.double(), ref.double()
    tol = 1e-3 + 1e-3 * ref.abs() + _ulp(ref, out_dtype)
    bad = (y - ref).abs() > tol
    assert not bad.any(), f"{what}: {int(bad.sum())} elements off, max err {(y - ref).abs().max().item():.3g}"


def _linear(K, N, bias, seed):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g))
    return lin


def _reference(m, x):
    """float64 product of the operands the layer uses: bfloat16 activations (MXFP8-decoded for
    act="mxfp8") times the dequantized weight, + bias."""
    a = x.reshape(-1, m.in_features).to(torch.bfloat16)
    if getattr(m, "act", "bf16") == "mxfp8":
        q, s = torch.ops.lowbit.mxfp8_quantize(a)
        a = torch.ops.lowbit.dequantize(q, s, None, None, "mxfp8_e4m3")
    ref = a.double() @ m.dequantized_weight().double().T
    if m.bias is not None:
        ref = ref + m.bias.double()
    return ref.reshape(*x.shape[:-1], m.out_features)


@pytest.mark.parametrize("fmt,act", [("nvfp4", "bf16"), ("mxfp4", "bf16"), ("mxfp4", "mxfp8")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lead,K,N,bias", [((3,), 64, 24, True), ((2, 5), 96, 40, False), ((1,), 32, 8, True)])
def test_forward_matches_dequantized_reference(fmt, act, dtype, lead, K, N, bias):
    lin = _linear(K, N, bias, seed=K + N)
    m = lnn.MXFP4Linear.from_linear(lin, act=act) if fmt == "mxfp4" else lnn.NVFP4Linear.from_linear(lin)
    x = torch.randn(*lead, K, generator=torch.Generator().manual_seed(7)).to(dtype)
    y = m(x)
    assert y.dtype == dtype and y.shape == (*lead, N)
    out_dtype = torch.bfloat16 if dtype == torch.float32 else dtype
    assert_gemm_rule(y, _reference(m, x), out_dtype, f"{fmt}/{act}/{dtype}")


def test_quantization_is_the_library_recipe():
    lin = _linear(64, 16, True, seed=3)
    m = lnn.NVFP4Linear.from_linear(lin)
    qt = lowbit.quantize(lin.weight.detach(), "nvfp4", compute_global_amax=True)
    assert torch.equal(m.qweight, qt.data)
    assert torch.equal(m.weight_scale.view(torch.uint8), qt.scales.view(torch.uint8))
    assert torch.equal(m.weight_global_amax, qt.global_amax.reshape(1))
    m4 = lnn.MXFP4Linear.from_linear(lin)
    qt4 = lowbit.quantize(lin.weight.detach(), "mxfp4")
    assert torch.equal(m4.qweight, qt4.data)
    assert torch.equal(m4.weight_scale.view(torch.uint8), qt4.scales.view(torch.uint8))
    assert torch.equal(m4.bias, lin.bias.detach())


def test_empty_batch_and_bad_inputs():
    m = lnn.MXFP4Linear.from_linear(_linear(32, 8, False, seed=1))
    assert m(torch.zeros(0, 32, dtype=torch.bfloat16)).shape == (0, 8)
    with pytest.raises(ValueError, match="in_features"):
        m(torch.zeros(2, 64))
    with pytest.raises(TypeError, match="bfloat16"):
        m(torch.zeros(2, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple of 16"):
        lnn.NVFP4Linear(24, 8)
    with pytest.raises(ValueError, match="act"):
        lnn.MXFP4Linear(32, 8, act="int8")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_state_dict_round_trip(fmt):
    m = CLASSES[fmt].from_linear(_linear(64, 16, True, seed=5))
    sd = m.state_dict()
    expect = {"qweight", "weight_scale", "bias"} | ({"weight_global_amax"} if fmt == "nvfp4" else set())
    assert set(sd) == expect
    m2 = CLASSES[fmt](64, 16, bias=True)
    m2.load_state_dict(sd)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(m(x), m2(x))
    assert f"format={fmt}" in repr(m2) and "in_features=64" in repr(m2)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_torch_compile_fullgraph(fmt):
    """Dynamo + AOTAutograd trace the custom ops through their fakes (no graph break)."""
    m = CLASSES[fmt].from_linear(_linear(64, 24, True, seed=9))
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    assert torch.equal(cm(x), m(x))


# ---------------------------------------------------------------------------------------------
# quantize_model and load_quantized on a tiny Llama

def _tiny_llama(seed=0):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval(), cfg


class _EmulatedLinear(torch.nn.Module):
    """The quantized layer's computation written with torch ops on its dequantized weight:
    bfloat16 activations, float64 sums rounded once to float32, times the NVFP4 per-tensor decode
    factor in float32, + bias, rounded to bfloat16."""

    def __init__(self, m):
        super().__init__()
        self.sb = None
        if isinstance(m, lnn.NVFP4Linear):  # the block-scaled weight without S_dec, and S_dec apart
            unit = lnn.NVFP4Linear(m.in_features, m.out_features)
            unit.load_state_dict({**m.state_dict(), "weight_global_amax": torch.tensor([2688.0])}, strict=False)
            self.w = unit.dequantized_weight().double()
            self.sb = 1.0 / (torch.tensor(2688.0, dtype=torch.float32) / m.weight_global_amax[0])
        else:
            self.w = m.dequantized_weight().double()
        self.b = m.bias

    def forward(self, x):
        y = (x.to(torch.bfloat16).double() @ self.w.T).float()
        if self.sb is not None:
            y = y * self.sb
        if self.b is not None:
            y = y + self.b
        return y.to(torch.bfloat16).to(x.dtype)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_model_tiny_llama(fmt):
    model, cfg = _tiny_llama()
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    report = lnn.quantize_model(model, fmt)
    names = {n for n, _ in report.replaced}
    assert len(names) == 2 * 7 and "model.layers.0.mlp.gate_proj" in names
    assert dict(report.skipped) == {"lm_head": "excluded (lm_head)"}
    assert isinstance(model.model.layers[1].self_attn.o_proj, CLASSES[fmt])
    ref = copy.deepcopy(model)
    for n in names:
        lnn._set_child(ref, n, _EmulatedLinear(ref.get_submodule(n)))
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert str(report).startswith(f"{fmt}: 14 replaced, 1 skipped")


def test_quantize_model_selection_and_cuda_shapes():
    seq = torch.nn.Sequential()
    seq.add_module("up", torch.nn.Linear(64, 256))
    seq.add_module("odd", torch.nn.Linear(64, 40))
    seq.add_module("router", torch.nn.Linear(256, 8))
    seq.add_module("tail", torch.nn.Linear(40, 16))
    r = lnn.quantize_model(seq, "nvfp4")
    assert [n for n, _ in r.replaced] == ["up"]
    why = dict(r.skipped)
    assert "N % 128" in why["odd"] and why["router"].startswith("excluded") and "block 16" in why["tail"]
    seq2 = torch.nn.Sequential(torch.nn.Linear(64, 40), torch.nn.Linear(40, 8))
    r2 = lnn.quantize_model(seq2, "nvfp4", cuda_shapes=False, include=[r"^0$"])
    assert [n for n, _ in r2.replaced] == ["0"] and dict(r2.skipped) == {"1": "not matched by include"}
    with pytest.raises(ValueError, match="format"):
        lnn.quantize_model(seq2, "int4")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_load_quantized_cli_checkpoint(tmp_path, fmt):
    """A checkpoint quantized by the command line loads into a fresh model and gives the logits
    of quantize_model on the original (same recipe: identical codes)."""
    from lowbit.cli import main
    model, cfg = _tiny_llama(seed=2)
    src_dir, out_dir = tmp_path / "src", tmp_path / "q"
    model.save_pretrained(src_dir, safe_serialization=True)
    out_dir.mkdir()
    rc = main(["quantize", str(src_dir / "model.safetensors"), str(out_dir / "model.safetensors"), "--format", fmt,
               "--exclude", "embed", "--exclude", "lm_head"])
    assert rc == 0
    fresh, _ = _tiny_llama(seed=3)
    state = lnn.load_quantized(str(out_dir), fresh)
    assert "model.layers.0.self_attn.q_proj.qweight" in state
    assert "model.layers.0.self_attn.q_proj.weight" not in state
    assert isinstance(fresh.model.layers[0].mlp.down_proj, CLASSES[fmt])
    lnn.quantize_model(model, fmt)
    ids = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    flat = lnn.load_quantized(str(out_dir / "model.safetensors"))
    assert set(flat) == set(state)


def _cli_checkpoint_model(tmp_path, fmt, device):
    """A bf16 tiny Llama written by save_pretrained, quantized by the command line, loaded by
    load_quantized into a fresh bf16 model, then moved to `device`; with its token ids."""
    from lowbit.cli import main
    model, cfg = _tiny_llama(seed=2)
    src_dir, out_dir = tmp_path / "src", tmp_path / "q"
    model.to(torch.bfloat16).save_pretrained(src_dir, safe_serialization=True)
    out_dir.mkdir()
    assert main(["quantize", str(src_dir / "model.safetensors"), str(out_dir / "model.safetensors"), "--format",
                 fmt, "--exclude", "embed", "--exclude", "lm_head"]) == 0
    fresh, _ = _tiny_llama(seed=3)
    fresh = fresh.to(torch.bfloat16)
    lnn.load_quantized(str(out_dir), fresh)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    return fresh.to(device), ids.to(device)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_cli_checkpoint_runs_on_the_kernels(tmp_path, fmt):
    """The whole chain on the GPU: a transformers checkpoint quantized by `lowbit quantize`,
    loaded by load_quantized into a transformers model, run on lowbit's CUDA kernels; its logits
    against the same loaded model on the CPU reference (per token, nn_models.TOL)."""
    from nn_models import TOL
    gpu, ids = _cli_checkpoint_model(tmp_path, fmt, "cuda")
    cpu = copy.deepcopy(gpu).cpu()
    layer = gpu.model.layers[0].mlp.down_proj
    assert isinstance(layer, CLASSES[fmt]) and layer.packed_weight.is_cuda and layer.packed_weight.numel() > 0
    with torch.no_grad():
        y = gpu(ids).logits.double().cpu()
        r = cpu(ids.cpu()).logits.double()
    y, r = y.reshape(-1, y.shape[-1]), r.reshape(-1, r.shape[-1])
    err = (y - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)
    assert bool(torch.isfinite(y).all()) and err.max().item() <= TOL[fmt], f"{fmt}: max per-token error {err.max():.3g}"


# ---------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)

def _cuda_case(fmt, act="bf16"):
    lin = _linear(256, 256, True, seed=21).cuda()
    m = lnn.MXFP4Linear.from_linear(lin, act=act) if fmt == "mxfp4" else lnn.NVFP4Linear.from_linear(lin)
    return m


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_prepacked_weights_follow_the_weights(fmt):
    """The CUDA kernel's layout is made once (from_linear, load_state_dict), is not in the
    state_dict, and is cleared where the kernel does not take the shape or the layer was made
    with prepack=False."""
    lin = _linear(256, 256, True, seed=11)
    m = CLASSES[fmt].from_linear(lin)
    want = (lowbit.nvfp4_gemm_prepack(m.qweight, m.weight_scale),) if fmt == "nvfp4" else \
        lowbit.mxfp4_gemm_prepack(m.qweight, m.weight_scale)
    got = (m.packed_weight,) if fmt == "nvfp4" else (m.packed_weight, m.packed_scale)
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
    assert not any(k.startswith("packed_") for k in m.state_dict())
    fresh = CLASSES[fmt](256, 256, bias=True)
    assert fresh.packed_weight.numel() == 0  # nothing to lay out before the weights arrive
    fresh.load_state_dict(m.state_dict())  # the post-hook prepacks the loaded weights
    assert torch.equal(fresh.packed_weight, m.packed_weight) and torch.equal(fresh.packed_scale, m.packed_scale)
    off = CLASSES[fmt](256, 256, bias=True, prepack=False)
    off.load_state_dict(m.state_dict())
    assert off.packed_weight.numel() == 0
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(off(x), m(x))  # (CPU tensors take the plain path either way)
    if fmt == "nvfp4":  # N = 96: the CUDA kernel needs N % 128 == 0, so nothing is prepacked
        assert CLASSES[fmt].from_linear(_linear(256, 96, False, seed=1)).packed_weight.numel() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", [("nvfp4", "bf16"), ("mxfp4", "bf16"), ("mxfp4", "mxfp8")])
@pytest.mark.parametrize("M", [1, 7, 200])
def test_gpu_forward_matches_cpu(fmt, act, M):
    m = _cuda_case(fmt, act)
    x = torch.randn(M, 256, device="cuda", dtype=torch.bfloat16)
    y = m(x)
    assert y.is_cuda
    assert_gemm_rule(y.cpu(), _reference(copy.deepcopy(m).cpu(), x.cpu()), torch.bfloat16, f"cuda {fmt}/{act}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_cuda_graph_and_compile(fmt):
    m = _cuda_case(fmt)
    assert m.packed_weight.is_cuda and m.packed_weight.numel() > 0  # the prepacked path is what runs
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    m(x)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = m(x)
    x.copy_(torch.randn(16, 256, device="cuda", dtype=torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, m(x))
    cm = torch.compile(m, fullgraph=True)
    assert torch.equal(cm(x), m(x))


# ---------------------------------------------------------------------------------------------
# gpt-oss experts

def _hf_experts(E=4, H=64, I=32, seed=0):
    mod = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    cfg = pytest.importorskip("transformers").GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                                                           num_experts_per_tok=2)
    ex = mod.GptOssExperts(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ex.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return ex


def _experts_reference(m, x, ids, wts):
    """float64 evaluation of the formula on the dequantized weights, the activations of both
    GEMMs rounded to bfloat16 as the W4A16 op rounds them."""
    def deq(w, s):
        return torch.ops.lowbit.dequantize(w, s, None, None, "mxfp4").double()
    w1, w2 = deq(m.w1, m.w1_scale), deq(m.w2, m.w2_scale)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w1[e] @ x[t].to(torch.bfloat16).double() + m.b1[e].double()
            gate, up = h[0::2].clamp(max=m.limit), h[1::2].clamp(-m.limit, m.limit)
            y = (gate * torch.sigmoid(m.alpha * gate) * (up + 1)).float().to(torch.bfloat16).double()
            out[t] += float(wts[t, j]) * (w2[e] @ y + m.b2[e].double())
    return out


def test_gpt_oss_experts_against_reference_and_transformers():
    ex = _hf_experts()
    m = lnn.GptOssExperts.from_experts(ex)
    T = 6
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, 64, generator=g)
    ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(T)])
    wts = torch.softmax(torch.randn(T, 2, generator=g), -1)
    y = m(x, ids, wts)
    assert y.shape == x.shape and y.dtype == x.dtype
    ref = _experts_reference(m, x, ids, wts)
    scale = ref.abs().max().item()
    assert (y.double() - ref).abs().max().item() <= 1e-4 * scale
    # the same layer in transformers with the dequantized weights: same gate / up interleaving
    with torch.no_grad():
        ex.gate_up_proj.copy_(torch.ops.lowbit.dequantize(m.w1, m.w1_scale, None, None, "mxfp4").transpose(1, 2))
        ex.down_proj.copy_(torch.ops.lowbit.dequantize(m.w2, m.w2_scale, None, None, "mxfp4").transpose(1, 2))
        hf = ex(x, ids, wts)
    assert (y - hf).abs().max().item() <= 2e-2 * scale
    assert "num_experts=4" in repr(m)
    m2 = lnn.GptOssExperts(4, 64, 32)
    m2.load_state_dict(m.state_dict())
    assert torch.equal(m2(x, ids, wts), y)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    assert torch.equal(cm(x, ids, wts), y)


def test_gpt_oss_experts_prepacked_weights():
    """from_experts and load_state_dict lay the weights out once for the packed path (not in the
    state_dict); the op gives the same bits with them (CPU here, CUDA in the gpu test)."""
    m = lnn.GptOssExperts.from_experts(_hf_experts(seed=3))
    for name in ("w1", "w2"):
        pb, ps = lowbit.group_gemm_mxfp4_prepack(getattr(m, name), getattr(m, name + "_scale"), b_scale_layout="row_major")
        assert torch.equal(getattr(m, name + "_packed"), pb) and torch.equal(getattr(m, name + "_scale_packed"), ps)
    assert not any("packed" in k for k in m.state_dict())
    fresh = lnn.GptOssExperts(m.num_experts, m.hidden_size, m.intermediate_size)
    fresh.load_state_dict(m.state_dict())
    assert torch.equal(fresh.w2_packed, m.w2_packed)
    x = torch.randn(6, m.hidden_size)
    ids = torch.randint(0, m.num_experts, (6, 2), generator=torch.Generator().manual_seed(1)).int()
    wts = torch.rand(6, 2)
    args = (x, ids, wts)
    plain = torch.ops.lowbit.gpt_oss_moe_mlp(*args, m.w1, m.w1_scale, m.b1, m.w2, m.w2_scale, m.b2, m.alpha, m.limit,
                                             "bf16", False)
    packed = torch.ops.lowbit.gpt_oss_moe_mlp(*args, m.w1_packed, m.w1_scale_packed, m.b1, m.w2_packed,
                                              m.w2_scale_packed, m.b2, m.alpha, m.limit, "bf16", True)
    assert torch.equal(plain, packed)


def test_quantize_model_replaces_gpt_oss_experts():
    ex = _hf_experts(seed=1)
    holder = torch.nn.Module()
    holder.add_module("experts", ex)
    r = lnn.quantize_model(holder, "nvfp4")
    assert "MXFP4 only" in dict(r.skipped)["experts"]
    r = lnn.quantize_model(holder, "mxfp4")
    assert [n for n, _ in r.replaced] == ["experts"] and isinstance(holder.experts, lnn.GptOssExperts)


def test_load_quantized_decodes_other_modules(tmp_path):
    """A checkpoint quantized without excludes: the embedding's quantized weight is loaded decoded."""
    from lowbit.cli import main
    model, _ = _tiny_llama(seed=4)
    model.save_pretrained(tmp_path / "src", safe_serialization=True)
    out = tmp_path / "q.safetensors"
    assert main(["quantize", str(tmp_path / "src" / "model.safetensors"), str(out), "--format", "mxfp4",
                 "--no-default-excludes"]) == 0
    fresh, _ = _tiny_llama(seed=5)
    lnn.load_quantized(str(out), fresh)
    assert isinstance(fresh.lm_head, lnn.MXFP4Linear)
    w = model.model.embed_tokens.weight.detach()
    assert torch.equal(fresh.model.embed_tokens.weight.detach(), lowbit.dequantize(lowbit.quantize(w, "mxfp4")))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_load_quantized_compressed_tensors(tmp_path, fmt):
    """A compressed-tensors directory (X.weight_packed / X.weight_scale / X.weight_global_scale)
    with lowbit's codes: the loaded model equals quantize_model's, and (with the compressed-tensors
    package) its weights decode as compressed-tensors decodes them."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model, cfg = _tiny_llama(seed=6)
    tensors = {}
    for name, t in model.state_dict().items():
        mod = name[: -len(".weight")]
        if not name.endswith(".weight") or "layers" not in name or "norm" in name:
            tensors[name] = t.contiguous()
            continue
        qt = lowbit.quantize(t, fmt)
        tensors[f"{mod}.weight_packed"] = qt.data
        tensors[f"{mod}.weight_scale"] = qt.scales.view(torch.uint8) if fmt == "mxfp4" else qt.scales
        if fmt == "nvfp4":
            tensors[f"{mod}.weight_global_scale"] = torch.tensor([2688.0]) / qt.global_amax.reshape(1)
            tensors[f"{mod}.input_global_scale"] = torch.ones(1)
    (tmp_path / "ct").mkdir()
    safetensors_torch.save_file(tensors, str(tmp_path / "ct" / "model.safetensors"))
    fresh, _ = _tiny_llama(seed=7)
    lnn.load_quantized(str(tmp_path / "ct"), fresh)
    lnn.quantize_model(model, fmt)
    ids = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)
    helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
    m = fresh.model.layers[0].mlp.up_proj
    codes = helpers.unpack_fp4_from_uint8(m.qweight, m.out_features, m.in_features, torch.float32)
    mod = "model.layers.0.mlp.up_proj"
    if fmt == "nvfp4":
        sc = m.weight_scale.float().repeat_interleave(16, 1)
        ct = codes * sc / tensors[f"{mod}.weight_global_scale"]
    else:
        ct = codes * torch.exp2(m.weight_scale.view(torch.uint8).float() - 127).repeat_interleave(32, 1)
    torch.testing.assert_close(m.dequantized_weight(), ct, rtol=2e-7, atol=0)


def _s_dec(amax):
    """lowbit's NVFP4 per-tensor decode factor 1 / (2688 / amax), float32."""
    return (torch.tensor(1.0) / (torch.tensor(2688.0) / amax.float().reshape(()))).item()


def test_load_quantized_modelopt(tmp_path):
    """`--convention modelopt` (X.weight uint8, X.weight_scale, X.weight_scale_2 = S_dec): every
    loaded layer's weight is ModelOpt's decode of the files (e2m1 * weight_scale * weight_scale_2)
    bit for bit, its decode factor is the one of the amax the command used (shared by q/k/v and
    gate/up), and
    the model equals the one loaded from the compressed-tensors output of the same model."""
    from safetensors.torch import load_file
    from lowbit.cli import main
    model, cfg = _tiny_llama(seed=8)
    model.save_pretrained(tmp_path / "src", safe_serialization=True)
    for conv in ("modelopt", "compressed-tensors"):
        assert main(["quantize", str(tmp_path / "src"), str(tmp_path / conv), "-f", "nvfp4", "--convention", conv,
                     "--device", "cpu", "-q"]) == 0
    files = load_file(str(tmp_path / "modelopt" / "model.safetensors"))
    a, _ = _tiny_llama(seed=9)
    b, _ = _tiny_llama(seed=10)
    lnn.load_quantized(str(tmp_path / "modelopt"), a)
    lnn.load_quantized(str(tmp_path / "compressed-tensors"), b)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    layers = [(n, m) for n, m in a.named_modules() if isinstance(m, lnn.NVFP4Linear)]
    assert len(layers) == 14
    for n, m in layers:
        p = files[f"{n}.weight"]
        q = e2m1[torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1).long()]
        dec = (q.reshape(q.shape[0], -1, 16) * files[f"{n}.weight_scale"].float()[..., None]).reshape(q.shape)
        dec = dec * files[f"{n}.weight_scale_2"]
        assert torch.equal(m.dequantized_weight(), dec), n
        # amax -> S_dec is many-to-one: the loaded amax is one whose S_dec is the stored one
        assert _s_dec(m.weight_global_amax) == _s_dec(b.get_submodule(n).weight_global_amax), n
        group = [g for g in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")) if n.split(".")[-1] in g]
        names = [n.rsplit(".", 1)[0] + "." + x for x in (group[0] if group else (n.split(".")[-1],))]
        amax = max(model.get_submodule(x).weight.detach().abs().max() for x in names)
        assert _s_dec(m.weight_global_amax) == _s_dec(amax) == files[f"{n}.weight_scale_2"], n
    ids = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_modelopt_decode_scale_not_written_by_lowbit():
    """A weight_scale_2 written as amax / 2688 (ModelOpt's own rounding) loads as the float32
    amax whose S_dec is nearest to it."""
    g = torch.Generator().manual_seed(12)
    for amax in (torch.rand(200, generator=g) * 50 + 1e-3).tolist():
        ws2 = torch.tensor(amax, dtype=torch.float32) / 2688.0
        got = lnn._amax_from_decode_scale(ws2)
        s_dec = torch.tensor(1.0) / (torch.tensor(2688.0) / got)
        assert (s_dec - ws2).abs().item() <= ws2.item() * 2.0 ** -23


# ---------------------------------------------------------------------------------------------
# Whole models: transformers models with lowbit modules against the same model holding the
# dequantized weights in bfloat16 (CPU always; CUDA marked gpu). Shared with bench/bench_nn.py.

from nn_models import MODEL_CASES, build_case, token_rel_errors  # noqa: E402


def _model_case(name, fmt, device):
    pytest.importorskip("transformers")
    case = build_case(name, fmt, device)
    if case.report.replaced == []:
        pytest.fail(f"{name}: nothing was replaced: {case.report}")
    return case


@pytest.mark.parametrize("name,fmt", MODEL_CASES)
def test_model_matches_dequantized_bf16_cpu(name, fmt):
    """Tolerance: per token, ||y - ref|| / ||ref|| <= TOL[fmt] (nn_models.TOL: 3e-2 NVFP4, 2e-2
    MXFP4) over the output (logits / last hidden state). Each lowbit linear differs from the bf16
    reference GEMM by its own bf16 output rounding and summation order, and NVFP4 also by the
    reference's weights rounded to bf16 (e2m1 * e4m3 * S_dec needs more than 8 significant
    bits: up to 2^-9 relative per weight); gpt-oss's expert MLP rounds its intermediates
    differently from transformers' bf16 ops. Two layers compound these to about 1e-2 on the CPU
    (MXFP4 Llama: bit-equal there); the tolerance leaves room for cuBLAS' summation order on CUDA.
    gpt-oss: a token whose top-k router scores are nearly tied can route to another expert in one
    model than in the other, and attention carries the change to later tokens, so 90% of the
    tokens must meet the tolerance, and every token of its expert modules fed the reference's
    own inputs and routing (nn_models.expert_rel_errors)."""
    case = _model_case(name, fmt, "cpu")
    errs = token_rel_errors(case)
    case.check(errs)


@pytest.mark.gpu
@pytest.mark.parametrize("name,fmt", MODEL_CASES)
def test_gpu_model_matches_dequantized_bf16(name, fmt):
    """The same on CUDA: the sm_90a kernels against cuBLAS bf16 on the dequantized weights."""
    case = _model_case(name, fmt, "cuda")
    errs = token_rel_errors(case)
    case.check(errs)


@pytest.mark.gpu
@pytest.mark.parametrize("name,fmt", [("llama", "nvfp4"), ("llama", "mxfp4")])
def test_gpu_model_cuda_graph(name, fmt):
    """The whole quantized model captured in a CUDA graph replays to the eager output."""
    case = _model_case(name, fmt, "cuda")
    ids = case.inputs["input_ids"]
    with torch.no_grad():
        eager = case.run(case.model).clone()
        static = ids.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            case.run(case.model, input_ids=static)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = case.run(case.model, input_ids=static)
        static.copy_(ids)
        g.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", [("nvfp4", "bf16"), ("mxfp4", "bf16"), ("mxfp4", "mxfp8")])
def test_gpu_prepacked_forward_is_the_plain_one(fmt, act):
    """On CUDA the prepacked weights give the bits of the plain call."""
    m = _cuda_case(fmt, act)
    kw = {"act": act} if fmt == "mxfp4" else {}
    plain = CLASSES[fmt](m.in_features, m.out_features, bias=m.bias is not None, device="cuda", prepack=False, **kw)
    plain.load_state_dict(m.state_dict())
    assert m.packed_weight.numel() > 0 and plain.packed_weight.numel() == 0
    for M in (1, 64, 300):
        x = torch.randn(M, m.in_features, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(m(x).view(torch.int16), plain(x).view(torch.int16))


@pytest.mark.gpu
def test_gpu_gpt_oss_experts_prepacked_is_the_plain_one():
    m = lnn.GptOssExperts.from_experts(_hf_experts(seed=4).cuda())
    plain = lnn.GptOssExperts(m.num_experts, m.hidden_size, m.intermediate_size, device="cuda", prepack=False)
    plain.load_state_dict(m.state_dict())
    assert m.w1_packed.is_cuda and m.w1_packed.numel() > 0 and plain.w1_packed.numel() == 0
    x = torch.randn(40, m.hidden_size, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, m.num_experts, (40, 2), device="cuda")
    wts = torch.rand(40, 2, device="cuda")
    assert torch.equal(m(x, ids, wts).view(torch.int16), plain(x, ids, wts).view(torch.int16))
