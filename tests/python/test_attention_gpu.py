"""MXFP8 flash attention on the GPU (lowbit.flash_attn_mxfp8_func, the varlen form,
quantize_mxfp8_attn and the lowbit:: torch ops), for the default exact path and the opt-in FP8
tensor-core path (precision="fp8": P rounded to E4M3, so O_pt rounds P to E4M3 too); the CPU
tests are in test_attention.py and test_attention_fp8.py.

Marked gpu; skipped without torch + CUDA + a CUDA build): FlashAttention-3's accuracy rule
over the shape sweep, applied per 32-channel block of the head dimension:

    max|O - O_ref| <= 2 max|O_pt - O_ref| + 2 max|bf16(O_ref) - O_ref|,
    |lse - lse_ref| <= 1e-3 max(1, |lse_ref|)  (+ 2^-10 max_j softmax_scale sum_c |q_c k_c| on
                                               the FP8 path: Hopper's FP8 MMAs accumulate in
                                               E8M13, 13 fraction bits, and the scores carry a few
                                               of its roundings),

O_ref the fp64 attention of the dequantized inputs, O_pt the same attention in low precision
(bf16 matmuls on bf16 copies, P rounded to KERNEL_P_DTYPE before the PV product), both computed
with torch on the GPU. Outputs come from allocator memory poisoned with 0xFF (conftest.py).
"""

import math

import numpy as np
import pytest

import lowbit

from attention_common import (FP8_P_DTYPE, KERNEL_BLOCK_M, KERNEL_BLOCK_N, KERNEL_P_DTYPE, assert_close,
                              exact_fp8_inputs, fp8_block_n, np_base2_reference)

# ---------------------------------------------------------------------------------------------
# GPU: the accuracy rule, torch ops, CUDA graphs

SHAPES = [(1, 239), (3, 799), (113, 203), (127, 512), (128, 217), (108, 256), (256, 512), (799, 3), (1023, 1024),
          (1024, 1023), (2048, 2048)]
HEADS = [(2, 2), (4, 1), (8, 1)]  # h / h_kv = 1, 4, 8


def _torch():
    import torch

    return torch


def t_inputs(b, sq, sk, h, hk, d, seed, spread):
    """make_inputs on the GPU: N(0, 1) data quantized by the device kernel, scale bytes moved."""
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = [torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)
         for shape in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d))]
    (q, qs), (k, ks), (v, vs) = (lowbit.quantize_mxfp8_attn(t) for t in x)
    qs, ks, vs = (s.view(torch.uint8).to(torch.int32) for s in (qs, ks, vs))
    if spread:
        r = lambda shape, lo, hi: torch.randint(lo, hi + 1, shape, generator=g, device="cuda", dtype=torch.int32)  # noqa: E731
        e = r((b, hk, 1, d // 32), -spread, spread)
        qs = qs + e.repeat_interleave(h // hk, dim=1) + r((b, h, sq, 1), -2, 2)
        ks = ks - e
        vs = vs + r((b, hk, 1, d // 32), -spread, spread) + r((b, hk, sk, 1), -2, 2)
    clip = lambda s: s.clamp(0, 254).to(torch.uint8)  # noqa: E731
    return q, k, v, clip(qs), clip(ks), clip(vs)


def t_dequant(codes, scales):
    """fp64 [b, h, s, d] values of codes [b, s, h, d] and scales [b, h, s, d/32] (255 -> NaN)."""
    torch = _torch()
    vals = codes.view(torch.float8_e4m3fn).to(torch.float64).transpose(1, 2)
    s = scales.view(torch.uint8).to(torch.float64)
    sv = torch.where(s == 255, torch.full_like(s, math.nan), torch.exp2(s - 127))
    return vals * sv.repeat_interleave(32, dim=-1)


def t_score_abs(q, k, qs, ks, scale, causal):
    """[b, h, sq]: per query row, the largest |softmax_scale| sum_c |q_c k_c| over the keys it sees
    (0 for rows that see none): what the FP8 MMA's E8M13 accumulator rounds the scores against."""
    torch = _torch()
    qd, kd = t_dequant(q, qs), t_dequant(k, ks)
    kd = kd.repeat_interleave(qd.shape[1] // kd.shape[1], dim=1)
    sq, sk = qd.shape[2], kd.shape[2]
    i = torch.arange(sq, device=qd.device)[:, None]
    j = torch.arange(sk, device=qd.device)[None, :]
    vis = (j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool, device=qd.device)
    return ((qd.abs() @ kd.abs().transpose(-1, -2)) * abs(scale)).masked_fill(~vis, 0.0).amax(-1)


def t_references(q, k, v, qs, ks, vs, scale, causal, p_dtype=KERNEL_P_DTYPE):
    """(O_ref fp64 [b, sq, h, d], lse_ref fp64 [b, h, sq], O_pt [b, sq, h, d], lse_tol [b, h, sq]) for
    finite operands; p_dtype "e4m3" is the FP8 path, whose lse_tol adds 2^-10 of the row's largest
    softmax_scale sum_c |q_c k_c| (the E8M13 accumulator of the FP8 MMA)."""
    torch = _torch()
    qd, kd, vd = t_dequant(q, qs), t_dequant(k, ks), t_dequant(v, vs)
    h, hk = qd.shape[1], kd.shape[1]
    kd, vd = kd.repeat_interleave(h // hk, dim=1), vd.repeat_interleave(h // hk, dim=1)
    sq, sk = qd.shape[2], kd.shape[2]
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    vis = (j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    empty = ~vis.any(-1)  # rows that see no key
    s = (qd @ kd.transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1).masked_fill(empty, -math.inf)
    lse_tol = 1e-3 * lse.abs().clamp(min=1)
    if p_dtype == "e4m3":
        lse_tol = lse_tol + 2.0 ** -10 * t_score_abs(q, k, qs, ks, scale, causal)
    p = torch.softmax(s, -1).masked_fill(empty[:, None], 0.0)
    o_ref = (p @ vd).transpose(1, 2)
    # O_pt: FlashAttention-3's FP8 test in bf16 (K pre-scaled, bf16 scores and P, bf16 PV)
    qb, kb, vb = qd.to(torch.bfloat16), (kd.to(torch.bfloat16) * scale).to(torch.bfloat16), vd.to(torch.bfloat16)
    sb = (qb @ kb.transpose(-1, -2)).masked_fill(~vis, -math.inf)
    pb = torch.softmax(sb.float(), -1).to(torch.bfloat16)
    if p_dtype == "e4m3":
        pb = pb.to(torch.float8_e4m3fn).to(torch.bfloat16)
    pb = pb.masked_fill(empty[:, None], 0.0)
    o_pt = (pb @ vb).transpose(1, 2)
    return o_ref, lse, o_pt, lse_tol


def check_rule(out, lse, o_ref, lse_ref, o_pt, lse_tol, what=""):
    """FlashAttention-3's rule per 32-channel block, |lse - lse_ref| <= lse_tol (t_references)."""
    torch = _torch()
    o = out.to(torch.float64)
    assert torch.isfinite(o).all(), f"{what}: non-finite output (poison left or NaN)"
    d = o.shape[-1]
    blk = lambda t: t.reshape(-1, d // 32, 32).abs().amax(dim=(0, 2))  # noqa: E731
    err = blk(o - o_ref)
    err_pt = blk(o_pt.to(torch.float64) - o_ref)
    err_bf = blk(o_ref.to(torch.bfloat16).to(torch.float64) - o_ref)
    bound = 2 * err_pt + 2 * err_bf
    assert (err <= bound).all(), f"{what}: per-block max|O - O_ref| {err.tolist()} > bound {bound.tolist()}"
    masked = torch.isinf(lse_ref)
    lse = lse.to(torch.float64)
    assert (lse[masked] == -math.inf).all(), f"{what}: lse of rows that see no key"
    assert ((lse - lse_ref).abs()[~masked] <= lse_tol[~masked]).all(), f"{what}: lse"
    rows = masked.transpose(1, 2)[..., None].expand_as(o)  # [b, sq, h, d] of rows that see no key
    assert (out.view(torch.int16)[rows] == 0).all(), f"{what}: out of rows that see no key"


def _sweep():
    cases = []
    n = 0
    for sq, sk in SHAPES:
        for d in (64, 128, 256):
            for h, hk in HEADS:
                for causal in (False, True):
                    cases.append(pytest.param(sq, sk, d, h, hk, causal, 40 if n % 3 == 0 else 0,
                                              id=f"sq{sq}_sk{sk}_d{d}_h{h}-{hk}_{'causal' if causal else 'full'}"))
                    n += 1
    return cases


PRECISIONS = [("exact", KERNEL_P_DTYPE), ("fp8", FP8_P_DTYPE)]  # (precision, the P rounding of its O_pt)


@pytest.mark.gpu
@pytest.mark.parametrize("precision, p_dtype", PRECISIONS, ids=["exact", "fp8"])
@pytest.mark.parametrize("sq, sk, d, h, hk, causal, spread", _sweep())
def test_gpu_accuracy_rule(sq, sk, d, h, hk, causal, spread, precision, p_dtype):
    b = 1 if sq * sk >= 1 << 20 else 2
    seed = sq * 7919 + sk * 31 + d + h + causal
    q, k, v, qs, ks, vs = t_inputs(b, sq, sk, h, hk, d, seed, spread)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=causal, precision=precision)
    assert out.dtype == _torch().bfloat16 and out.shape == (b, sq, h, d) and lse.shape == (b, h, sq)
    check_rule(out, lse, *t_references(q, k, v, qs, ks, vs, 1 / math.sqrt(d), causal, p_dtype),
               f"{precision}: b{b} sq{sq} sk{sk} d{d} h{h}/{hk} causal={causal} spread={spread}")


@pytest.mark.gpu
@pytest.mark.parametrize("precision, p_dtype", PRECISIONS, ids=["exact", "fp8"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_varlen(d, causal, precision, p_dtype):
    torch = _torch()
    h, hk = 8, 2
    rng = np.random.default_rng(d + causal)
    lq = [1, 2048] + rng.integers(1, 2049, 4).tolist()
    lk = [2048, 1] + rng.integers(1, 2049, 4).tolist()
    seqs = [t_inputs(1, a, c, h, hk, d, 100 * d + i, 20) for i, (a, c) in enumerate(zip(lq, lk))]
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32, device="cuda")
    q = torch.cat([s[0][0] for s in seqs])
    k = torch.cat([s[1][0] for s in seqs])
    v = torch.cat([s[2][0] for s in seqs])
    qs = torch.cat([s[3][0] for s in seqs], 1)
    ks = torch.cat([s[4][0] for s in seqs], 1)
    vs = torch.cat([s[5][0] for s in seqs], 1)
    out, lse = lowbit.flash_attn_mxfp8_varlen_func(q, k, v, qs, ks, vs, cq, ck, max(lq), max(lk), causal=causal,
                                                   precision=precision)
    for i, s in enumerate(seqs):
        a, b_ = int(cq[i]), int(cq[i + 1])
        check_rule(out[a:b_][None], lse[:, a:b_][None], *t_references(*s, 1 / math.sqrt(d), causal, p_dtype),
                   f"{precision}: varlen seq {i} ({lq[i]}, {lk[i]})")


@pytest.mark.gpu
@pytest.mark.parametrize("precision, p_dtype", PRECISIONS, ids=["exact", "fp8"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_extreme_exponents(d, precision, p_dtype):
    # q / k blocks at 2^+-55 (compensated), V blocks 2^-55 .. 2^+55 apart (+-2 per row): finite in
    # fp32 and bf16, and within what a scale folded relative to a per-row (Q) / per-head (K, V)
    # exponent keeps exact in bf16 (E4M3 x 2^e for e down to -124); the FP8 path folds the per-block
    # offsets into its per-block references (no rounding) and re-rounds the +-2 per row
    for spread in (40, 55):
        q, k, v, qs, ks, vs = t_inputs(2, 300, 700, 4, 1, d, spread + d, spread)
        out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True, precision=precision)
        check_rule(out, lse, *t_references(q, k, v, qs, ks, vs, 1 / math.sqrt(d), True, p_dtype),
                   f"{precision}: d{d} spread {spread}")


@pytest.mark.gpu
def test_gpu_matches_cpu_reference_on_small_shapes():
    torch = _torch()
    q, k, v, qs, ks, vs = t_inputs(1, 37, 91, 4, 2, 64, 5, 10)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True)
    host = [t.cpu() for t in (q, k, v, qs, ks, vs)]
    ref_out, ref_lse = lowbit.flash_attn_mxfp8_func(*host, causal=True)  # torch CPU tensors: the CPU reference
    o_ref, lse_ref, o_pt, lse_tol = t_references(q, k, v, qs, ks, vs, 0.125, True)
    o64 = o_ref.cpu()
    assert ((ref_out.double() - o64).abs() <= o64.abs() * 2.0 ** -8).all()  # the reference is bf16(O_ref)
    assert ((ref_lse.double() - lse_ref.cpu()).abs() <= 1e-6 * lse_ref.cpu().abs().clamp(min=1)).all()
    check_rule(out, lse, o_ref, lse_ref, o_pt, lse_tol, "vs CPU reference")


def nan_allowed_rows(sq, sk, t, causal):
    """Rows i that do not see key t but whose query tile processes t's key tile: where the kernel
    may also write NaN for a NaN v[t, c] (docs/attention.md: P = 0 times NaN in the tile's PV product)."""
    rows = np.arange(sq)
    if not causal:
        return np.zeros(sq, bool)
    last_of_tile = np.minimum(sk - 1, (rows // KERNEL_BLOCK_M + 1) * KERNEL_BLOCK_M - 1 + sk - sq)
    return (rows + sk - sq < t) & (last_of_tile >= t // KERNEL_BLOCK_N * KERNEL_BLOCK_N)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["exact", "fp8"])
@pytest.mark.parametrize("where", ["codes", "scales"])
def test_gpu_nan_rules(where, precision):
    torch = _torch()
    q, k, v, qs, ks, vs = t_inputs(1, 300, 300, 1, 1, 64, 9, 0)
    t_k, t_v = 40, 170  # the NaN key (rows 40.. see it) and the NaN value row (rows 170.. see it)
    if where == "codes":
        qs[0, 0, 5, 0] = 255                        # q row 5: a NaN scale
        k.view(torch.uint8)[0, t_k, 0, 9] = 0x7F    # a NaN code in key 40
        v.view(torch.uint8)[0, t_v, 0, 3] = 0xFF    # v[170, 3]
        nan_channels = [3]
    else:
        q.view(torch.uint8)[0, 5, 0, 33] = 0x7F     # q row 5: a NaN code
        ks[0, 0, t_k, 1] = 255                      # key 40: a NaN scale (channels 32..63)
        vs[0, 0, t_v, 0] = 255                      # v[170, 0..31]
        nan_channels = list(range(32))
    out, lse = lowbit.flash_attn_mxfp8_func(q, k.view(torch.uint8), v, qs, ks, vs, causal=True, precision=precision)
    o = out[0, :, 0].float().cpu().numpy()
    lse = lse[0, 0].cpu().numpy()
    rows = np.arange(300)
    nan_row = (rows == 5) | (rows >= t_k)
    np.testing.assert_array_equal(np.isnan(lse), nan_row)
    assert np.isnan(o[nan_row]).all()
    allowed = nan_allowed_rows(300, 300, t_v, True)  # d = 64: key tiles of 128 on both paths
    for c in range(64):
        got = np.isnan(o[:, c])
        if c in nan_channels:  # rows that see key 170: NaN; rows of a tile that reads it: may be NaN
            want = rows >= t_v
            assert (got[~nan_row] == (want | (got & allowed))[~nan_row]).all(), c
        else:
            assert not got[~nan_row].any(), c


@pytest.mark.gpu
def test_gpu_misaligned_codes_are_refused():
    torch = _torch()
    q, k, v, qs, ks, vs = t_inputs(1, 8, 8, 2, 1, 64, 13, 0)
    buf = torch.empty(q.numel() + 1, dtype=torch.uint8, device="cuda")
    q_off = buf[1:].view(q.shape)  # base address one byte off (TMA needs 16)
    q_off.copy_(q.view(torch.uint8))
    with pytest.raises(ValueError, match="argument 'q': the CUDA kernel reads it with TMA"):
        lowbit.flash_attn_mxfp8_func(q_off, k, v, qs, ks, vs)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_gpu_torch_compile_and_cuda_graph(precision):
    torch = _torch()
    import lowbit.torch_ops  # noqa: F401

    prec = () if precision == "exact" else ("fp8",)  # the exact path through the ops' default
    e2e_d = 64 if precision == "exact" else 128
    q, k, v, qs, ks, vs = t_inputs(2, 200, 333, 8, 2, 128, 11, 5)
    eager = torch.ops.lowbit.flash_attn_mxfp8(q, k, v, qs, ks, vs, None, True, *prec)
    if prec:
        exact = torch.ops.lowbit.flash_attn_mxfp8(q, k, v, qs, ks, vs, None, True)
        assert not torch.equal(eager[0], exact[0])  # the two paths differ (P in E4M3 against bf16)

    def f(q, k, v, qs, ks, vs):
        out, lse = torch.ops.lowbit.flash_attn_mxfp8(q, k, v, qs, ks, vs, None, True, *prec)
        return out.float() * 2, lse

    got = torch.compile(f, fullgraph=True)(q, k, v, qs, ks, vs)
    assert torch.equal(got[0], eager[0].float() * 2) and torch.equal(got[1], eager[1])

    # bf16 -> quantize -> attention, captured in one CUDA graph and replayed on new inputs
    x = [torch.randn(1, 256, 4, e2e_d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]

    def e2e():
        parts = [torch.ops.lowbit.quantize_mxfp8_attn(t, "bshd", "rceil") for t in x]
        return torch.ops.lowbit.flash_attn_mxfp8(parts[0][0], parts[1][0], parts[2][0], parts[0][1], parts[1][1],
                                                 parts[2][1], 0.1, False, *prec)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        e2e()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = e2e()
    for t in x:
        t.copy_(torch.randn_like(t))
    graph.replay()
    want = e2e()
    torch.cuda.synchronize()
    assert torch.equal(static[0], want[0]) and torch.equal(static[1], want[1])

    # varlen op under torch.compile
    cq = torch.tensor([0, 200, 400], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, 333, 666], dtype=torch.int32, device="cuda")
    args = (q.reshape(400, 8, 128), torch.cat([k[0], k[1]]), torch.cat([v[0], v[1]]),
            qs.transpose(0, 1).reshape(8, 400, 4), torch.cat([ks[0], ks[1]], 1), torch.cat([vs[0], vs[1]], 1), cq, ck,
            200, 333)
    vf = torch.compile(lambda *a: torch.ops.lowbit.flash_attn_mxfp8_varlen(*a, None, True, *prec), fullgraph=True)
    got = vf(*args)
    want = torch.ops.lowbit.flash_attn_mxfp8_varlen(*args, None, True, *prec)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gpu_end_to_end_from_float(dtype):
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(12)
    x = [torch.randn(2, 500, 8, 128, generator=g, device="cuda").to(getattr(torch, dtype)) for _ in range(3)]
    out, lse = lowbit.flash_attn_mxfp8_quantized(*x, causal=True)
    parts = [lowbit.quantize_mxfp8_attn(t) for t in x]
    assert parts[0][0].is_cuda and parts[0][1].shape == (2, 8, 500, 4)
    q, qs = parts[0]
    k, ks = parts[1]
    v, vs = parts[2]
    check_rule(out, lse, *t_references(q, k, v, qs, ks, vs, 1 / math.sqrt(128), True), "end to end")
    # and against bf16 SDPA of the unquantized inputs: MXFP8 quantization error only
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in x), is_causal=True)
    ref = sdpa.transpose(1, 2)
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 0.05, rel


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_autograd_wrapper(causal):
    """flash_attn_mxfp8_autograd on CUDA: the forward is flash_attn_mxfp8_quantized's bits, the
    gradients those of the fp64 attention at the dequantized inputs within 1e-2 of their largest
    (the CPU test's rule: out and lse enter the backward rounded); GQA, s_q != s_k."""
    torch = _torch()
    from lowbit.attention_autograd import _dequantize

    g = torch.Generator(device="cuda").manual_seed(11)
    b, sq, sk, h, hk, d = 2, 300, 513, 8, 2, 128
    q = torch.randn((b, sq, h, d), device="cuda", generator=g).bfloat16().requires_grad_(True)
    k = torch.randn((b, sk, hk, d), device="cuda", generator=g).bfloat16().requires_grad_(True)
    v = torch.randn((b, sk, hk, d), device="cuda", generator=g).bfloat16().requires_grad_(True)
    out = lowbit.flash_attn_mxfp8_autograd(q, k, v, causal=causal)
    want, _ = lowbit.flash_attn_mxfp8_quantized(q.detach(), k.detach(), v.detach(), causal=causal)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    dout = torch.randn(out.shape, device="cuda", generator=g).bfloat16()
    out.backward(dout)
    deq = [_dequantize(*torch.ops.lowbit.quantize_mxfp8_attn(t.detach(), "bshd", "rceil")).double().requires_grad_(True)
           for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(h // hk, dim=2) for t in deq[1:])
    s = torch.einsum("bihd,bjhd->bhij", deq[0], kk) / math.sqrt(d)
    if causal:
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        s = s.masked_fill(~(j <= i + sk - sq), -math.inf)
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), vv)
    grads = torch.autograd.grad(ref, deq, dout.double())
    for got, want_g in zip((q.grad, k.grad, v.grad), grads):
        assert torch.isfinite(got).all()
        assert (got.double() - want_g).abs().max().item() <= 1e-2 * want_g.abs().max().item()


# ---------------------------------------------------------------------------------------------
# the FP8 path: exactness on exactly representable data, the CPU model, torch ops

def _to_cuda(*arrays):
    torch = _torch()
    return [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]


EXACT_SHAPES = [  # b, sq, sk, h, hk, d, causal: several key tiles (the running maximum moves), tails, GQA
    (2, 1, 239, 2, 2, 64, False), (1, 113, 203, 4, 1, 64, True), (2, 128, 217, 8, 2, 128, False),
    (1, 300, 700, 4, 1, 128, True), (1, 1023, 1024, 1, 1, 128, True), (1, 799, 3, 2, 1, 128, False),
    (1, 127, 512, 2, 2, 256, True), (2, 256, 333, 4, 2, 256, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["exact", "fp8"])
@pytest.mark.parametrize("shape", EXACT_SHAPES, ids=lambda s: "b%d_sq%d_sk%d_h%d-%d_d%d_%s" % (*s[:6], "causal" if s[6] else "full"))
def test_gpu_exact_inputs(shape, precision):
    """Layout-catching property: on exact_fp8_inputs every operand, score, P and partial sum is
    representable, so both paths must return bf16 of the exact result (within one bf16 ulp); a
    wrong token order of V'^T, P fragment, channel, swizzle or scale would move values by O(1)."""
    b, sq, sk, h, hk, d, causal = shape
    host = exact_fp8_inputs(b, sq, sk, h, hk, d, seed=sq * 3 + sk + d)
    q, k, v, qs, ks, vs = _to_cuda(*host[:6])
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, softmax_scale=host[6], causal=causal, precision=precision)
    ref_o, ref_l = np_base2_reference(*host[:6], causal)
    assert_close(out.cpu().float().numpy(), lse.cpu().numpy(), ref_o, ref_l)


@pytest.mark.gpu
def test_gpu_fp8_exact_inputs_varlen():
    torch = _torch()
    h, hk, d = 4, 2, 128
    lq, lk = [1, 300, 129, 0, 17], [5, 700, 1000, 3, 1]
    seqs = [exact_fp8_inputs(1, max(a, 1), max(c, 1), h, hk, d, seed=40 + i) for i, (a, c) in enumerate(zip(lq, lk))]
    cat = lambda parts, axis: np.ascontiguousarray(np.concatenate(parts, axis=axis))  # noqa: E731
    host = [cat([s[0][0, :n] for s, n in zip(seqs, lq)], 0), cat([s[1][0, :n] for s, n in zip(seqs, lk)], 0),
            cat([s[2][0, :n] for s, n in zip(seqs, lk)], 0), cat([s[3][0, :, :n] for s, n in zip(seqs, lq)], 1),
            cat([s[4][0, :, :n] for s, n in zip(seqs, lk)], 1), cat([s[5][0, :, :n] for s, n in zip(seqs, lk)], 1)]
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32, device="cuda")
    for causal in (False, True):
        out, lse = lowbit.flash_attn_mxfp8_varlen_func(*_to_cuda(*host), cq, ck, max(lq), max(lk),
                                                       softmax_scale=seqs[0][6], causal=causal, precision="fp8")
        out, lse = out.cpu().float().numpy(), lse.cpu().numpy()
        for i, s in enumerate(seqs):
            if lq[i] == 0:
                continue
            a, b_ = int(cq[i]), int(cq[i + 1])
            sl = [s[0][:, :lq[i]], s[1][:, :lk[i]], s[2][:, :lk[i]], s[3][:, :, :lq[i]], s[4][:, :, :lk[i]],
                  s[5][:, :, :lk[i]]]
            assert_close(out[a:b_][None], lse[:, a:b_][None], *np_base2_reference(*sl, causal))


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_fp8_close_to_cpu_model(d):
    """One key tile (the kernel's running maximum is the row maximum): the kernel and the CPU
    model of the FP8 arithmetic share every operand byte and P's rounding points; they differ by
    fp32 accumulation, the FP8 MMA's E8M13 accumulator of the scores, and MUFU.EX2 (a P value may
    round to the neighbouring E4M3 value)."""
    torch = _torch()
    sk = fp8_block_n(d) - 3
    q, k, v, qs, ks, vs = t_inputs(1, 77, sk, 4, 2, d, 21, 20)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True, precision="fp8")
    host = [t.cpu() for t in (q, k, v, qs, ks, vs)]
    ref_out, ref_lse = lowbit.flash_attn_mxfp8_func(*host, causal=True, precision="fp8")
    o, r = out.float().cpu(), ref_out.float()
    assert torch.isfinite(o).all()
    for blk in range(d // 32):  # per 32-channel block (their magnitudes differ by up to 2^40)
        ob, rb = o[..., 32 * blk:32 * blk + 32], r[..., 32 * blk:32 * blk + 32]
        assert (ob - rb).abs().max() <= 2.0 ** -4 * rb.abs().max(), blk
    fin = torch.isfinite(ref_lse)
    # fp32 softmax sums against fp64 ones, and the E8M13 accumulator of the FP8 MMA (t_score_abs)
    tol = 1e-5 * ref_lse.abs().clamp(min=1) + 2.0 ** -10 * t_score_abs(q, k, qs, ks, 1 / math.sqrt(d), True).cpu()
    assert ((lse.cpu() - ref_lse).abs()[fin] <= tol[fin]).all()
    assert (lse.cpu()[~fin] == ref_lse[~fin]).all()


@pytest.mark.gpu
def test_gpu_fp8_end_to_end_from_bf16():
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(13)
    x = [torch.randn(2, 500, 8, 128, generator=g, device="cuda").bfloat16() for _ in range(3)]
    out, lse = lowbit.flash_attn_mxfp8_quantized(*x, causal=True, precision="fp8")
    (q, qs), (k, ks), (v, vs) = (lowbit.quantize_mxfp8_attn(t) for t in x)
    check_rule(out, lse, *t_references(q, k, v, qs, ks, vs, 1 / math.sqrt(128), True, FP8_P_DTYPE), "fp8 end to end")
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in x), is_causal=True)
    rel = ((out.float() - sdpa.transpose(1, 2)).norm() / sdpa.norm()).item()
    assert rel < 0.06, rel
