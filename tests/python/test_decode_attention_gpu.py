"""NF4 K-cache decode attention on the GPU (lowbit.attn_forward_decode_nf4,
kproj_rope_nf4_encode, nf4_kcache_append and the lowbit:: torch ops); the CPU tests are in
test_decode_attention.py.

Marked gpu (skipped without torch + CUDA + a CUDA build). A build without the sm_90a kernels (no
CUTLASS) raises NotImplementedError: every test calls the op and is marked xfail exactly then
(any other error, or a wrong result, fails). The encode and the append are compared with the CPU
reference bit for bit. The attention's accuracy rule, unpruned (delta = inf):

    max|O - O_ref| <= 3 max|O_bf16 - O_ref| + 2^-9

O_ref the fp64 attention of the dequantized cache (nf4 * scale + residual, fp32 rule), O_bf16
the same attention in bf16 (bf16 copies of q, the dequantized keys and v; bf16 scores; softmax
in fp32; bf16 P @ V), both computed with torch on the GPU. Outputs are poisoned: an explicit
`out` filled with NaN, plus allocator memory filled with 0xFF (conftest.py).
"""

import math

import pytest

import lowbit

from decode_attention_common import NF4

NO_KERNEL = "this build has no sm_90a kernels for the NF4 decode ops (CUDA + CUTLASS needed; docs/decode_attention.md)"

# (B, T, H_q, H_kv, D, Dv): B up to 64, GQA 32/8 and 64/8 and MHA 8/8, T = 1, odd and long
SHAPES = [(1, 1, 32, 8, 128, 128), (1, 4097, 32, 8, 128, 128), (3, 1000, 64, 8, 128, 128), (64, 257, 32, 8, 128, 128),
          (7, 63, 8, 8, 64, 64), (2, 777, 8, 8, 256, 256), (5, 129, 32, 8, 64, 128), (64, 33, 64, 8, 256, 64)]


def _torch():
    import torch

    return torch


def call_or_xfail(fn, *args, **kwargs):
    """fn(*args, **kwargs), or xfail when the build has no kernel for the op (NotImplementedError)."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        assert "this build has no sm_90a" in str(e) or "has no CUDA kernels" in str(e), str(e)
        pytest.xfail(NO_KERNEL)


def t_cache(B, T, H, HK, D, DV, seed, sinks=False):
    """q, the cache (lowbit.nf4_kcache_quantize on the CPU, then moved), v on the GPU."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((B, T, HK, D), generator=g)
    if sinks:
        k[:, 8:T - 8] *= 0.1
    c, s, r = lowbit.nf4_kcache_quantize(k)
    q = torch.randn((B, 1, H, D), generator=g).to(torch.bfloat16)
    v = torch.randn((B, T, HK, DV), generator=g).to(torch.bfloat16)
    return tuple(t.cuda() for t in (q, c, s, r, v))


def t_keys(c, s, r):
    """fp64 keys [B, T, H_kv, D]: fp32 nf4 * scale + residual, element 2i in the low nibble."""
    torch = _torch()
    codes = torch.stack([c & 0xF, c >> 4], dim=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],)).long()
    table = torch.tensor(NF4, device=c.device)
    return (table[codes] * s[:, None] + r.float()).double()


def t_references(q, c, s, r, v, lens):
    """(O_ref fp64, O_bf16) [B, H_q, Dv] over tokens t < lens[b]."""
    torch = _torch()
    K = t_keys(c, s, r)
    B, T, HK, D = K.shape
    H = q.shape[2]
    kk = K.repeat_interleave(H // HK, dim=2).permute(0, 2, 1, 3)  # [B, H, T, D]
    vv = v.double().repeat_interleave(H // HK, dim=2).permute(0, 2, 1, 3)
    qq = q.double()[:, 0, :, None, :]  # [B, H, 1, D]
    mask = torch.arange(T, device=q.device)[None, :] >= torch.as_tensor(lens, device=q.device)[:, None]  # [B, T]
    scale = 1 / math.sqrt(D)
    sc = (qq @ kk.transpose(-1, -2)) * scale
    sc = sc.masked_fill(mask[:, None, None, :], -math.inf)
    o_ref = (torch.softmax(sc, -1) @ vv)[:, :, 0]
    sb = ((qq.bfloat16() @ kk.bfloat16().transpose(-1, -2)) * scale).float()
    sb = sb.masked_fill(mask[:, None, None, :], -math.inf)
    o_bf = (torch.softmax(sb, -1).bfloat16() @ vv.bfloat16()).double()[:, :, 0]
    return o_ref, o_bf


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_t%d_h%d-%d_d%d-%d" % s)
@pytest.mark.parametrize("ragged", [False, True])
def test_gpu_unpruned_accuracy(shape, ragged):
    torch = _torch()
    B, T, H, HK, D, DV = shape
    q, c, s, r, v = t_cache(B, T, H, HK, D, DV, seed=T + B)
    lens = [max(1, T - (37 * b) % T) for b in range(B)] if ragged else [T] * B
    out = torch.full((B, H, DV), math.nan, dtype=torch.bfloat16, device="cuda")
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v, seq_lens=lens_t, delta=math.inf, out=out)
    torch.cuda.synchronize()
    o_ref, o_bf = t_references(q, c, s, r, v, lens)
    err = (out.double() - o_ref).abs().max().item()
    bound = 3 * (o_bf - o_ref).abs().max().item() + 2 ** -9
    assert torch.isfinite(out).all() and err <= bound, (err, bound)


def t_v8(B, T, HK, DV, seed, dtype):
    """An FP8 V cache on the GPU (codes of N(0, 1) values, per-channel float32 scales, a third of
    them not powers of two) and its fp64 dequantized values."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    codes = torch.randn((B, T, HK, DV), generator=g).to(getattr(torch, dtype))
    i = torch.arange(B * HK * DV).reshape(B, HK, DV)
    scale = torch.where(i % 3 == 0, 0.37 + 0.01 * (i % 7), torch.ldexp(torch.ones(()), (i % 7 - 3).float())).float()
    codes, scale = codes.cuda(), scale.cuda()
    return codes, scale, codes.double() * scale.double()[:, None]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3], SHAPES[5], SHAPES[6], SHAPES[7]],
                         ids=lambda s: "b%d_t%d_h%d-%d_d%d-%d" % s)
@pytest.mark.parametrize("vdt", ["float8_e4m3fn", "float8_e5m2"])
def test_gpu_fp8_v_unpruned_accuracy(shape, vdt):
    """FP8 V with per-channel scales (the fused path, and the generic one for D != Dv), under the
    rule with O_ref / O_bf16 of the dequantized V."""
    torch = _torch()
    B, T, H, HK, D, DV = shape
    q, c, s, r, _ = t_cache(B, T, H, HK, D, DV, seed=T + 2 * B)
    v8, vs, vd = t_v8(B, T, HK, DV, seed=T + 5, dtype=vdt)
    lens = [max(1, T - (41 * b) % T) for b in range(B)]
    out = torch.full((B, H, DV), math.nan, dtype=torch.bfloat16, device="cuda")
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v8, v_scale=vs, seq_lens=lens_t, delta=math.inf, out=out)
    torch.cuda.synchronize()
    o_ref, o_bf = t_references(q, c, s, r, vd, lens)
    err = (out.double() - o_ref).abs().max().item()
    bound = 3 * (o_bf - o_ref).abs().max().item() + 2 ** -9
    assert torch.isfinite(out).all() and err <= bound, (err, bound)
    # the channel scales are applied: doubling one channel's scale doubles that channel, bit for bit
    vs2 = vs.clone()
    vs2[:, :, 5] *= 2
    out2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v8, v_scale=vs2, seq_lens=lens_t, delta=math.inf)
    assert torch.equal(out2[..., 5].float(), 2 * out[..., 5].float())


@pytest.mark.gpu
@pytest.mark.parametrize("vdt", ["float8_e4m3fn", "float8_e5m2"])
def test_gpu_fp8_v_pruned_matches_cpu_reference(vdt):
    torch = _torch()
    B, T, H, HK, D = 4, 1000, 32, 8, 128
    q, c, s, r, _ = t_cache(B, T, H, HK, D, D, seed=13, sinks=True)
    v8, vs, _ = t_v8(B, T, HK, D, seed=14, dtype=vdt)
    # delta 1: about half of the blocks pruned on these inputs (2.0 prunes none of them)
    kw = dict(block_size=32, sub_block_size=16, delta=1.0, return_skip_ratio=True)
    out, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v8, v_scale=vs, **kw)
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(*(t.cpu() for t in (q, c, s, r, v8)), v_scale=vs.cpu(), **kw)
    assert ref_ratio.max().item() > 0  # the case prunes
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= 2 / 32
    # one bf16 rounding apart (either side of a tie) and fp32 against fp64 sums
    assert ((out.cpu().double() - ref.double()).abs() <= 2 ** -6 * ref.double().abs().clamp(min=1)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("delta", [0.0, 2.0])
def test_gpu_pruning_matches_cpu_reference(delta):
    """Pruned: the skip ratio equal to the CPU reference's, the output within the rule of the
    reference over the same kept blocks (sinks make the middle blocks prunable)."""
    torch = _torch()
    B, T, H, HK, D = 4, 1000, 32, 8, 128
    q, c, s, r, v = t_cache(B, T, H, HK, D, D, seed=3, sinks=True)
    kw = dict(block_size=64, sub_block_size=16, delta=delta, return_skip_ratio=True)
    out, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v, **kw)
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(*(t.cpu() for t in (q, c, s, r, v)), **kw)
    # NOTE: block maxima near the threshold may round either way in fp32: allow a few blocks
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= 2 / 16
    assert (out.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6


# encode: (B, T, hidden, H_kv, D, x / w dtype, positions dtype, rope_theta); T = 1, odd T, B up to
# 4, H_kv 1 and 8, D 64 / 128 / 256 and D = 6 (the per-pair encode path, D not a multiple of 16)
ENCODE_CASES = [(1, 1, 64, 1, 64, "bfloat16", "int32", 1e4), (4, 37, 96, 8, 128, "float32", "int64", 1e6),
                (2, 300, 256, 8, 128, "bfloat16", "int32", 1e6), (3, 129, 200, 1, 256, "float16", "int64", 5e5),
                (4, 1, 72, 8, 256, "float32", "int32", 1e4), (1, 513, 128, 2, 64, "bfloat16", "int64", 1e4),
                (2, 5, 16, 3, 6, "float32", "int32", 1e4)]
RESIDUALS = ["float8_e5m2", "float8_e4m3fn"]
NIBBLES = ["low", "high"]


def _ulp_diff(a, b):
    """|bits(a) - bits(b)| of two float32 CPU tensors of one sign (int64)."""
    torch = _torch()
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@pytest.mark.gpu
@pytest.mark.parametrize("case", ENCODE_CASES, ids=lambda c: "b%d_t%d_e%d_h%d_d%d_%s_%s_%g" % c)
@pytest.mark.parametrize("residual", RESIDUALS)
@pytest.mark.parametrize("nibbles", NIBBLES)
def test_gpu_encode_matches_cpu(case, residual, nibbles):
    """The fused encode on the GPU against the CPU reference: float32 inputs take the fp64
    CUDA-core projection, whose rotated keys equal the reference's (only the device's fp64 cos /
    sin may move a key by one fp32 ulp, very rarely); bf16 / fp16 inputs take the tensor-core
    projection (fp32 sums), within the fp32 accumulation bound of the reference's keys. The cache
    is bit for bit nf4_kcache_quantize of the GPU's keys (so equal to the CPU's cache wherever the
    keys are). Outputs come from the poisoned allocator."""
    torch = _torch()
    B, T, E, HK, D, dt, pdt, theta = case
    g = torch.Generator().manual_seed(B * 1000 + T + D)
    dtype = getattr(torch, dt)
    x = torch.randn((B, T, E), generator=g).to(dtype)
    w = (torch.randn((HK * D, E), generator=g) / math.sqrt(E)).to(dtype)
    pos = torch.randint(0, 100000, (B, T), generator=g).to(getattr(torch, pdt))
    kw = dict(head_dim=D, rope_theta=theta, residual_dtype=residual, nibble_order=nibbles)
    got = call_or_xfail(lowbit.kproj_rope_nf4_encode, x.cuda(), w.cuda(), pos.cuda(), return_k=True, **kw)
    torch.cuda.synchronize()
    c, s, r, k = (t.cpu() for t in got)
    want = lowbit.kproj_rope_nf4_encode(x, w, pos, return_k=True, **kw)
    if dt == "float32":  # the fp64 CUDA-core projection: equal, or one fp32 ulp apart in a few keys
        diff = _ulp_diff(k, want[3])
        assert diff.max().item() <= 1 and int((diff > 0).sum()) <= max(2, k.numel() // 100000)
    else:  # the tensor-core projection sums in fp32: within E 2^-24 sum|x w| of both projections
        S = (x.double().abs() @ w.double().abs().T).reshape(B, T, HK, D)
        S2 = S + torch.cat([S[..., D // 2:], S[..., : D // 2]], dim=-1)  # channel c and its rotation partner
        bound = E * 2.0 ** -24 * S2 + 2.0 ** -23 * want[3].double().abs()
        assert ((k.double() - want[3].double()).abs() <= bound).all()
    # the cache: exactly the quantize of the GPU's keys
    qc, qs, qr = lowbit.nf4_kcache_quantize(k, residual_dtype=residual, nibble_order=nibbles)
    assert torch.equal(s, qs) and torch.equal(c, qc)
    assert torch.equal(r.view(torch.uint8), qr.view(torch.uint8))
    if torch.equal(k, want[3]):  # (nearly always) the CPU reference's cache itself
        assert torch.equal(s, want[1]) and torch.equal(c, want[0])
        assert torch.equal(r.view(torch.uint8), want[2].view(torch.uint8))
    # without k_out (keys in pool scratch): the same cache
    c2, s2, r2 = (t.cpu() for t in lowbit.kproj_rope_nf4_encode(x.cuda(), w.cuda(), pos.cuda(), **kw))
    assert torch.equal(c2, c) and torch.equal(s2, s) and torch.equal(r2.view(torch.uint8), r.view(torch.uint8))


# append: (B, T cache, H_kv, D, N new tokens, k_new dtype)
APPEND_CASES = [(1, 1, 1, 64, 1, "float32"), (4, 300, 8, 128, 1, "bfloat16"), (3, 77, 8, 256, 5, "float16"),
                (2, 1000, 1, 128, 16, "float32"), (4, 33, 8, 64, 33, "bfloat16"), (2, 9, 3, 6, 2, "float32")]


def _append_inputs(B, T, HK, D, N, dt, residual, nibbles, seed):
    """A cache holding lengths[b] tokens (ragged, one sequence empty when B > 1; the slots past
    them filled with garbage bytes) and N new keys, some channels of which outgrow their scale
    (one NaN and one Inf key among them)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    lens = [T - N, 0] + [int(torch.randint(0, T - N + 1, (1,), generator=g)) for _ in range(B - 2)]
    lens = lens[:B]
    k = torch.randn((B, T, HK, D), generator=g)
    c, s, r = lowbit.nf4_kcache_quantize(k, residual_dtype=residual, nibble_order=nibbles)
    for b, L in enumerate(lens):  # each sequence quantized over its stored tokens, garbage past them
        s[b] = 0
        if L > 0:
            cb, sb, rb = lowbit.nf4_kcache_quantize(k[b:b + 1, :L], residual_dtype=residual, nibble_order=nibbles)
            c[b, :L], s[b], r.view(torch.uint8)[b, :L] = cb[0], sb[0], rb.view(torch.uint8)[0]
        c[b, L:] = 0xA5
        r.view(torch.uint8)[b, L:] = 0x3C
    new = torch.randn((B, N, HK, D), generator=g) * 0.5
    grow = torch.rand((B, 1, HK, D), generator=g) < 0.25
    new = torch.where(grow, new * 8, new)  # about a quarter of the channels outgrow their scale
    if D > 6:
        new[0, 0, 0, 3] = math.nan
        new[-1, N - 1, HK - 1, 5] = math.inf
    return c, s, r, new.to(getattr(torch, dt)), torch.tensor(lens, dtype=torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("case", APPEND_CASES, ids=lambda c: "b%d_t%d_h%d_d%d_n%d_%s" % c)
@pytest.mark.parametrize("residual", RESIDUALS)
@pytest.mark.parametrize("nibbles", NIBBLES)
def test_gpu_append_matches_cpu(case, residual, nibbles):
    """The append on the GPU bit for bit equal to the CPU reference, rescaled channels included;
    the bytes past lengths[b] + N (garbage) must stay as they were."""
    torch = _torch()
    B, T, HK, D, N, dt = case
    c, s, r, new, lens = _append_inputs(B, T, HK, D, N, dt, residual, nibbles, seed=T + D + N)
    cg, sg, rg = (t.cuda() for t in (c, s, r))
    call_or_xfail(lowbit.nf4_kcache_append, new.cuda(), cg, sg, rg, lens.cuda(), nibble_order=nibbles)
    torch.cuda.synchronize()
    s_before = s.clone()
    lowbit.nf4_kcache_append(new, c, s, r, lens, nibble_order=nibbles)
    assert (s > s_before).any()  # the case does rescale
    assert torch.equal(sg.cpu(), s) and torch.equal(cg.cpu(), c)
    assert torch.equal(rg.cpu().view(torch.uint8), r.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("residual", RESIDUALS)
def test_gpu_append_into_empty_cache_is_quantize(residual):
    """Appending T keys into an empty cache (scale 0, lengths 0) gives nf4_kcache_quantize's bytes."""
    torch = _torch()
    B, T, HK, D = 3, 41, 8, 128
    k = torch.randn((B, T, HK, D), generator=torch.Generator().manual_seed(5))
    c = torch.full((B, T, HK, D // 2), 0xFF, dtype=torch.uint8, device="cuda")
    s = torch.zeros((B, HK, D), device="cuda")
    r = torch.full((B, T, HK, D), 0xFF, dtype=torch.uint8, device="cuda").view(getattr(torch, residual))
    call_or_xfail(lowbit.nf4_kcache_append, k.cuda(), c, s, r, torch.zeros(B, dtype=torch.int32, device="cuda"))
    qc, qs, qr = lowbit.nf4_kcache_quantize(k, residual_dtype=residual)
    assert torch.equal(c.cpu(), qc) and torch.equal(s.cpu(), qs)
    assert torch.equal(r.cpu().view(torch.uint8), qr.view(torch.uint8))


@pytest.mark.gpu
def test_gpu_append_checks_lengths_on_the_host():
    torch = _torch()
    c = torch.zeros((2, 16, 2, 32), dtype=torch.uint8, device="cuda")
    s = torch.ones((2, 2, 64), device="cuda")
    r = torch.zeros((2, 16, 2, 64), dtype=torch.uint8, device="cuda").view(torch.float8_e5m2)
    new = torch.zeros((2, 2, 2, 64), device="cuda")
    with pytest.raises(ValueError, match="argument 'lengths'.*0..14"):
        call_or_xfail(lowbit.nf4_kcache_append, new, c, s, r, torch.tensor([15, 0], dtype=torch.int32, device="cuda"))
    assert (c == 0).all() and (s == 1).all()  # nothing written


@pytest.mark.gpu
@pytest.mark.parametrize("vdt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("xdt", ["float32", "bfloat16"])
def test_gpu_fp8_vcache_matches_cpu(vdt, xdt):
    """fp8_vcache_quantize and fp8_vcache_append on the GPU bit for bit equal to the CPU reference
    (NaN / Inf values, strided values, a rescaling append with ragged lengths); the bytes past
    lengths[b] + N must stay as they were; the attention reads the cache."""
    torch = _torch()
    g = torch.Generator().manual_seed(21)
    B, T, HK, D, N = 3, 300, 8, 128, 5
    v = torch.randn((B, T, 2 * HK, D), generator=g) * torch.exp2(torch.randint(-9, 9, (1, 1, 2 * HK, D), generator=g))
    v[0, 3, 0, 1], v[2, 7, 4, 9] = math.nan, -math.inf
    v = v.to(getattr(torch, xdt))[:, :, ::2]  # every other head: a strided view
    codes, scale = call_or_xfail(lowbit.fp8_vcache_quantize, v.cuda(), vdt)
    c_ref, s_ref = lowbit.fp8_vcache_quantize(v, vdt)
    assert torch.equal(codes.cpu().view(torch.uint8), c_ref.view(torch.uint8)) and torch.equal(scale.cpu(), s_ref)
    lens = torch.tensor([T - N, 17, 0], dtype=torch.int32)
    new = torch.randn((B, N, HK, D), generator=g) * 4
    new[:, :, :, ::4] *= 1000  # a quarter of the channels outgrow their scale
    new = new.to(getattr(torch, xdt))
    lowbit.fp8_vcache_append(new.cuda(), codes, scale, lens.cuda())
    torch.cuda.synchronize()
    s_before = s_ref.clone()
    lowbit.fp8_vcache_append(new, c_ref, s_ref, lens)
    assert (s_ref > s_before).any()  # the case does rescale
    assert torch.equal(codes.cpu().view(torch.uint8), c_ref.view(torch.uint8)) and torch.equal(scale.cpu(), s_ref)
    q, c, s, r, _ = t_cache(B, T, 32, HK, D, D, seed=22)
    out = lowbit.attn_forward_decode_nf4(q, c, s, r, codes, v_scale=scale, seq_lens=(lens + N).cuda(), delta=math.inf)
    ref = lowbit.attn_forward_decode_nf4(*(t.cpu() for t in (q, c, s, r, codes)), v_scale=scale.cpu(),
                                         seq_lens=lens + N, delta=math.inf)
    ok = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out.cpu()), ok)
    assert ((out.cpu().double() - ref.double()).abs()[ok] <= 2 ** -6 * ref.double().abs()[ok].clamp(min=1)).all()


@pytest.mark.gpu
def test_gpu_torch_ops():
    torch = _torch()
    import lowbit.torch_ops  # noqa: F401  registers torch.ops.lowbit.*

    q, c, s, r, v = t_cache(2, 100, 8, 2, 64, 64, seed=1)
    out, ratio = call_or_xfail(torch.ops.lowbit.attn_forward_decode_nf4, q, c, s, r, v, None, None, 16, 16, math.inf)
    assert out.shape == (2, 8, 64) and ratio.shape == (2, 2)
    # the cache writers through the torch ops: the CPU reference's bytes
    g = torch.Generator().manual_seed(2)
    x = torch.randn((2, 50, 64), generator=g).to(torch.bfloat16)
    w = (torch.randn((2 * 64, 64), generator=g) / 8).to(torch.bfloat16)
    pos = torch.arange(50, dtype=torch.int64).expand(2, 50).contiguous()
    got = call_or_xfail(torch.ops.lowbit.kproj_rope_nf4_encode, x.cuda(), w.cuda(), pos.cuda(), 64)
    want = torch.ops.lowbit.kproj_rope_nf4_encode(x, w, pos, 64)
    assert all(a.shape == b.shape and a.dtype == b.dtype and a.is_cuda for a, b in zip(got, want))
    # bf16 inputs: the tensor-core projection (fp32 sums, test_gpu_encode_matches_cpu bounds its keys
    # against the CPU's); the op itself must return what the Python API returns on the GPU
    api = lowbit.kproj_rope_nf4_encode(x.cuda(), w.cuda(), pos.cuda(), head_dim=64)
    for a, b in zip(got, api):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert _ulp_diff(got[1].cpu(), want[1]).max().item() <= 64  # scales: amax of keys summed over E = 64 in fp32
    new = torch.randn((2, 1, 2, 64), generator=g) * 4
    lens = torch.tensor([10, 49], dtype=torch.int32)
    c, s, r = (t.cpu() for t in got)  # host copies of the GPU's cache, appended to by the CPU reference
    call_or_xfail(torch.ops.lowbit.nf4_kcache_append, new.cuda(), *got, lens.cuda())
    torch.ops.lowbit.nf4_kcache_append(new, c, s, r, lens)
    assert torch.equal(got[0].cpu(), c) and torch.equal(got[1].cpu(), s)
    assert torch.equal(got[2].cpu().view(torch.uint8), r.view(torch.uint8))
    # the FP8 V cache through the torch ops, and the attention's v_scale argument
    vals = torch.randn((2, 50, 2, 64), generator=g)  # the V cache beside the K cache `got` (T = 50)
    vc, vs = call_or_xfail(torch.ops.lowbit.fp8_vcache_quantize, vals.cuda(), "float8_e5m2")
    wc, ws = torch.ops.lowbit.fp8_vcache_quantize(vals, "float8_e5m2")
    assert torch.equal(vc.cpu().view(torch.uint8), wc.view(torch.uint8)) and torch.equal(vs.cpu(), ws)
    torch.ops.lowbit.fp8_vcache_append(vals[:, :1].cuda() * 100, vc, vs, torch.tensor([3, 49], dtype=torch.int32).cuda())
    torch.ops.lowbit.fp8_vcache_append(vals[:, :1] * 100, wc, ws, torch.tensor([3, 49], dtype=torch.int32))
    assert torch.equal(vc.cpu().view(torch.uint8), wc.view(torch.uint8)) and torch.equal(vs.cpu(), ws)
    out8, _ = torch.ops.lowbit.attn_forward_decode_nf4(q, *got, vc, None, None, 16, 16, math.inf, True, None, vs)
    assert out8.shape == (2, 8, 64) and torch.isfinite(out8).all()


def t_cache_variant(B, T, H, HK, D, seed, residual_dtype, nibble_order):
    """Like t_cache, with the residual dtype and nibble order of the cache chosen (sinks on)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((B, T, HK, D), generator=g)
    k[:, 8:T - 8] *= 0.1
    c, s, r = lowbit.nf4_kcache_quantize(k, residual_dtype=residual_dtype, nibble_order=nibble_order)
    q = torch.randn((B, 1, H, D), generator=g).to(torch.bfloat16)
    v = torch.randn((B, T, HK, D), generator=g).to(torch.bfloat16)
    return q, c, s, r, v


# (B, T, H_q, H_kv, D, block_size, residual dtype, nibble order, residual used): the fused kernel's
# block sizes (divisors of its 128-token tile), the generic kernels' (256, 100), MQA with 16 query
# heads per KV head (two head chunks scoring all heads), both residual dtypes, both nibble orders
PRUNED = [(2, 1000, 32, 8, 128, 16, "float8_e5m2", "low", True), (2, 1000, 32, 8, 128, 32, "float8_e4m3fn", "high", True),
          (3, 777, 64, 8, 64, 128, "float8_e5m2", "low", True), (1, 700, 16, 1, 128, 64, "float8_e4m3fn", "low", True),
          (2, 1500, 32, 8, 256, 64, "float8_e5m2", "high", False), (2, 1000, 32, 8, 128, 256, "float8_e5m2", "low", True),
          (2, 1000, 8, 8, 128, 100, "float8_e5m2", "low", True), (4, 130, 4, 4, 64, 1, "float8_e5m2", "low", True)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", PRUNED, ids=lambda c: "b%d_t%d_h%d-%d_d%d_bs%d_%s_%s_res%d" % c)
def test_gpu_pruned_paths_match_cpu_reference(case):
    """Every pruning path (fused and generic kernels) against the CPU reference: skip ratio within
    a few blocks (block maxima near the threshold round either way in fp32), output within 2^-6."""
    torch = _torch()
    B, T, H, HK, D, bs, rdt, nib, use_res = case
    q, c, s, r, v = t_cache_variant(B, T, H, HK, D, seed=T + bs, residual_dtype=rdt, nibble_order=nib)
    lens = torch.tensor([T - (91 * b) % (T // 2) for b in range(B)], dtype=torch.int32)
    delta = 0.0 if H // HK > 8 else 1.0  # a block is skipped only when all H / H_kv heads are below
    kw = dict(block_size=bs, sub_block_size=1, delta=delta, return_skip_ratio=True, use_fp8_residual=use_res)
    r_arg = r if use_res else None
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(q, c, s, r_arg, v, seq_lens=lens, **kw)
    out = torch.full((B, H, D), math.nan, dtype=torch.bfloat16, device="cuda")
    got, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q.cuda(), c.cuda(), s.cuda(),
                               r_arg.cuda() if use_res else None, v.cuda(), seq_lens=lens.cuda(), out=out, **kw)
    torch.cuda.synchronize()
    n_blocks = (lens.max().item() + bs - 1) // bs
    assert ref_ratio.max().item() > 0.05  # the sinks make middle blocks prunable
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= max(2, n_blocks // 50) / n_blocks
    assert torch.isfinite(out).all()
    assert (out.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6


@pytest.mark.gpu
def test_gpu_precomputed_threshold_and_unaligned_rows():
    """A given threshold (no threshold kernel) and rows that do not start 16-byte aligned (codes
    viewed out of a wider buffer: the generic kernels) match the CPU reference."""
    torch = _torch()
    B, T, H, HK, D = 2, 600, 32, 8, 128
    q, c, s, r, v = t_cache_variant(B, T, H, HK, D, seed=5, residual_dtype="float8_e5m2", nibble_order="low")
    thr = torch.full((B, H), -0.5, dtype=torch.float32)
    kw = dict(precomputed_threshold=thr, return_skip_ratio=True)
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, **kw)
    got, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q.cuda(), c.cuda(), s.cuda(), r.cuda(), v.cuda(),
                               precomputed_threshold=thr.cuda(), return_skip_ratio=True)
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= 2 / 10
    assert (got.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6
    wide = torch.zeros((B, T, HK, D // 2 + 1), dtype=torch.uint8)
    wide[..., 1:] = c
    cu = wide.cuda()[..., 1:]  # last dim contiguous, rows 65 bytes apart
    got2 = lowbit.attn_forward_decode_nf4(q.cuda(), cu, s.cuda(), r.cuda(), v.cuda(), delta=math.inf)
    ref2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v, delta=math.inf)
    assert (got2.cpu().double() - ref2.double()).abs().max().item() <= 2 ** -6


def t_paginate(x, page, table, pages):
    """[B, T, ...] -> [pages, page, ...] (torch): token t of sequence b to row t % page of page
    table[b, t // page]; unused rows hold 0xEE bytes."""
    torch = _torch()
    out = torch.full((pages, page) + tuple(x.shape[2:]), 0xEE, dtype=torch.uint8, device=x.device)
    out = out.view(x.dtype) if x.element_size() == 1 else torch.full_like(out, 0, dtype=x.dtype)
    B, T = x.shape[:2]
    for b in range(B):
        for j in range(-(-T // page)):
            n = min(page, T - j * page)
            out[int(table[b, j]), :n] = x[b, j * page:j * page + n]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("v8", [False, True])
@pytest.mark.parametrize("dims", [(128, 128), (64, 128)], ids=["fused", "generic"])
def test_gpu_paged_attention_is_the_dense_one(page, v8, dims):
    """A paged cache (block table of distinct pages in random order) gives the dense call's bits on
    the GPU (the fused path, and the generic one for D != Dv), pruned and not."""
    torch = _torch()
    D, DV = dims
    B, T, H, HK = 3, 1000, 32, 8
    q, c, s, r, v = t_cache(B, T, H, HK, D, DV, seed=page + v8, sinks=True)
    vs = None
    if v8:
        v, vs, _ = t_v8(B, T, HK, DV, seed=page, dtype="float8_e4m3fn")
    per = -(-T // page)
    pages = B * per + 5
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(page))[: B * per].reshape(B, per)
    table = table.to(torch.int32).cuda()
    lens = torch.tensor([T, 1, 613], dtype=torch.int32, device="cuda")
    pc, pr, pv = (t_paginate(x, page, table.cpu(), pages) for x in (c, r, v))
    for delta in (math.inf, 2.0):
        kw = dict(seq_lens=lens, block_size=32, delta=delta, return_skip_ratio=True, v_scale=vs)
        dense, dr = call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v, **kw)
        paged, pratio = lowbit.attn_forward_decode_nf4(q, pc, s, pr, pv, block_table=table, **kw)
        assert torch.equal(paged.view(torch.int16), dense.view(torch.int16)) and torch.equal(pratio, dr)


@pytest.mark.gpu
def test_gpu_paged_appends_match_cpu():
    """nf4_kcache_append and fp8_vcache_append into pages on the GPU: the CPU reference's bytes."""
    torch = _torch()
    g = torch.Generator().manual_seed(31)
    B, T, H, D, N, P = 3, 200, 8, 128, 4, 16
    k = torch.randn((B, T, H, D), generator=g)
    c, s, r = lowbit.nf4_kcache_quantize(k)
    vc, vsc = lowbit.fp8_vcache_quantize(torch.randn((B, T, H, D), generator=g))
    per = -(-T // P)
    pages = B * per + 2
    table = torch.randperm(pages, generator=g)[: B * per].reshape(B, per).to(torch.int32)
    pc, pr, pvc = (t_paginate(x, P, table, pages) for x in (c, r, vc))
    lens = torch.tensor([T - N, 0, 77], dtype=torch.int32)
    new = torch.randn((B, N, H, D), generator=g) * 3
    gc, gr, gs, gvc, gvs = pc.cuda(), pr.cuda(), s.cuda(), pvc.cuda(), vsc.cuda()
    call_or_xfail(lowbit.nf4_kcache_append, new.cuda(), gc, gs, gr, lens.cuda(), block_table=table.cuda())
    lowbit.fp8_vcache_append(new.cuda(), gvc, gvs, lens.cuda(), block_table=table.cuda())
    lowbit.nf4_kcache_append(new, pc, s, pr, lens, block_table=table)
    lowbit.fp8_vcache_append(new, pvc, vsc, lens, block_table=table)
    assert torch.equal(gs.cpu(), s) and torch.equal(gvs.cpu(), vsc) and torch.equal(gc.cpu(), pc)
    assert torch.equal(gr.cpu().view(torch.uint8), pr.view(torch.uint8))
    assert torch.equal(gvc.cpu().view(torch.uint8), pvc.view(torch.uint8))
