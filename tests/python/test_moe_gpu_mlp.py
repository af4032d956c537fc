"""CUDA results of the gpt-oss expert MLP (gpt_oss_moe_mlp) and of the grouped GEMM's prepack
against lowbit's CPU reference; the tolerance is described in test_moe_gpu.py. Every test is
marked gpu (skipped without torch, a CUDA device or a CUDA build of lowbit)."""

import ml_dtypes
import numpy as np
import pytest

import lowbit

from moe_gpu_common import _decode_bits, _dev, _host_bits, MLP_H_REL, _ulp


# ---------------------------------------------------------------------------------------------
# gpt-oss expert MLP

def _mlp_operands(T, H, I, E, topk, seed, x_dtype, bias_dtype, duplicate_ids=False):
    rng = np.random.default_rng(seed)
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H), dtype=np.float32) * np.float32(0.25), "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I), dtype=np.float32) * np.float32(0.1), "mxfp4")
    bdt = np.float32 if bias_dtype == "float32" else ml_dtypes.bfloat16
    b1 = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32).astype(bdt)
    b2 = (rng.standard_normal((E, H)) * 0.5).astype(np.float32).astype(bdt)
    x = rng.standard_normal((T, H), dtype=np.float32)
    x = x.astype(ml_dtypes.bfloat16) if x_dtype == "bfloat16" else x
    ids = np.stack([rng.permutation(E)[:topk] for _ in range(T)]).astype(np.int32)
    ids[rng.random((T, topk)) < 0.2] = -1
    if T >= 5:
        ids[2] = -1  # a token routed nowhere: its output row is zero
    if duplicate_ids:
        ids[:, 1] = ids[:, 0]
    wts = rng.random((T, topk)).astype(np.float32) + np.float32(0.05)
    wts /= wts.sum(axis=1, keepdims=True)
    return dict(x=x, topk_ids=ids, topk_weights=wts, w1=w1.data, w1_scale=w1.scales.view(np.uint8), b1=b1,
                w2=w2.data, w2_scale=w2.scales.view(np.uint8), b2=b2), (w1, w2)


def _act_round(v, act):
    """act() of the MLP on the rows of v (float32 [R, C])."""
    v = np.ascontiguousarray(v, dtype=np.float32)
    if act == "bf16":
        return v.astype(ml_dtypes.bfloat16).astype(np.float32)
    return lowbit.dequantize(lowbit.quantize(v, "mxfp8_e4m3"))


def _mlp_tolerance(args, w, act, alpha, limit):
    """Per-element allowance beyond 2 bf16 ulps of |ref|: 2^-14 S + F (module docstring), from a
    NumPy float64 recomputation of the MLP's intermediates.

    F: a pre-activation h computed in fp32 in another order may differ from the reference's by
    dh = 2^-20 * sum_k |act(x)_k W1_k| (+ |b1|); through y = g sigmoid(alpha g) (u + 1) (g, u
    clamped: no dependence) plus 2^-20 |y| for the fp32 epilogue that bounds y's change by w.
    Where act() rounds y - w and y + w (magnitudes) differently from y (an element or, for
    MXFP8, a block scale flips), the larger of the two changes times |W2| and the routing weight
    is allowed."""
    W1, W2 = (lowbit.dequantize(q).astype(np.float64) for q in w)
    x = args["x"].astype(np.float32)
    ids, wts = args["topk_ids"], args["topk_weights"].astype(np.float64)
    b1, b2 = args["b1"].astype(np.float64), args["b2"].astype(np.float64)
    T, H = x.shape
    xr = _act_round(x, act).astype(np.float64)
    S = np.zeros((T, H))
    F = np.zeros((T, H))
    rel = MLP_H_REL
    for j in range(ids.shape[1]):
        for e in np.unique(ids[:, j]):
            if e < 0:
                continue
            t = np.flatnonzero(ids[:, j] == e)
            h = xr[t] @ W1[e].T + b1[e]
            dh = rel * (np.abs(xr[t]) @ np.abs(W1[e]).T + np.abs(b1[e]))
            hg, hu, dg, du = h[:, 0::2], h[:, 1::2], dh[:, 0::2], dh[:, 1::2]
            g = np.minimum(hg, limit)
            u = np.clip(hu, -limit, limit)
            sg = 1.0 / (1.0 + np.exp(-alpha * g))
            y = g * sg * (u + 1.0)
            g_free = hg < limit + dg
            u_free = np.abs(hu) < limit + du
            dy = (rel * np.abs(y) + g_free * np.abs(sg * (1.0 + alpha * g * (1.0 - sg)) * (u + 1.0)) * dg
                  + u_free * np.abs(g * sg) * du)
            yr = _act_round(y, act).astype(np.float64)
            lo = _act_round(y - np.sign(y) * dy, act).astype(np.float64)
            hi = _act_round(y + np.sign(y) * dy, act).astype(np.float64)
            flip = np.maximum(np.abs(hi - yr), np.abs(lo - yr))
            aW2 = np.abs(W2[e])
            S[t] += wts[t, j, None] * (np.abs(yr) @ aW2.T + np.abs(b2[e]))
            F[t] += wts[t, j, None] * (flip @ aW2.T)
    return 2.0 ** -14 * S + F


def _bf16_ulp(v):
    return _ulp(v, "bfloat16")


def _to_host(torch, t):
    """float64 values of a bf16 / fp32 CUDA tensor (syncs the current stream)."""
    if t.dtype == torch.bfloat16:
        return _decode_bits(_host_bits(torch, t), "bfloat16")
    return t.cpu().numpy().astype(np.float64)


def _check_mlp(torch, T, H, act, x_dtype, out_dtype, bias_dtype, *, alpha=1.702, limit=7.0, E=8, I=256, topk=4,
               seed=0, duplicate_ids=False, label="", packed=False):
    args, w = _mlp_operands(T, H, I, E, topk, seed, x_dtype, bias_dtype, duplicate_ids)
    ref = lowbit.gpt_oss_moe_mlp(**args, alpha=alpha, limit=limit, act=act, out_dtype=out_dtype)
    ref = np.asarray(ref).astype(np.float64)
    dev = {k: _dev(torch, v) for k, v in args.items()}
    if packed:  # the weights through group_gemm_mxfp4_prepack on the device
        for wn in ("w1", "w2"):
            dev[wn], dev[wn + "_scale"] = lowbit.group_gemm_mxfp4_prepack(dev[wn], dev[wn + "_scale"],
                                                                          b_scale_layout="row_major")
    out = torch.empty((T, H), dtype=getattr(torch, out_dtype), device="cuda").fill_(float("nan"))
    res = lowbit.gpt_oss_moe_mlp(**dev, alpha=alpha, limit=limit, act=act, out=out, packed=packed)
    assert res is out
    got = _to_host(torch, out)
    stale = np.isnan(got)
    assert not stale.any(), f"{label}: {int(stale.sum())} of {stale.size} outputs still NaN (poison never overwritten)"
    tol = 2 * _bf16_ulp(ref) + _mlp_tolerance(args, w, act, alpha, limit)
    err = np.abs(got - ref)
    bad = err > tol
    i = int((err / tol).argmax())
    t, h = divmod(i, H)
    msg = (f"{label}: {int(bad.sum())} of {bad.size} outputs beyond tolerance; worst at token {t}, h {h}: "
           f"got {got.flat[i]!r}, reference {ref.flat[i]!r}, tolerance {tol.flat[i]:.3g} "
           f"({err.flat[i] / _bf16_ulp(ref.flat[i]):.3g} bf16 ulps)")
    assert not bad.any(), msg
    print(msg)
    routed_nowhere = (args["topk_ids"] < 0).all(axis=1)
    assert (got[routed_nowhere] == 0).all(), f"{label}: tokens with every id -1 must give zero rows"
    return got, ref


# (T, H, act, x dtype, out dtype, bias dtype)
MLP = [
    (1, 256, "bf16", "bfloat16", "bfloat16", "float32"),
    (5, 512, "mxfp8", "float32", "float32", "bfloat16"),
    (64, 256, "mxfp8", "bfloat16", "float32", "float32"),
    (64, 512, "bf16", "float32", "bfloat16", "bfloat16"),
    (300, 256, "bf16", "float32", "float32", "float32"),
    (300, 512, "mxfp8", "bfloat16", "bfloat16", "float32"),
    (5, 256, "bf16", "bfloat16", "float32", "bfloat16"),
    (1, 512, "mxfp8", "float32", "bfloat16", "float32"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,act,x_dtype,out_dtype,bias_dtype", MLP,
                         ids=[f"T{c[0]}-H{c[1]}-{c[2]}-x{c[3]}-out{c[4]}-b{c[5]}" for c in MLP])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_moe_mlp(torch, T, H, act, x_dtype, out_dtype, bias_dtype, packed):
    _check_mlp(torch, T, H, act, x_dtype, out_dtype, bias_dtype, seed=T + H, label=f"T{T} H{H} {act}", packed=packed)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,layout", [(136, 160, "row_major"), (2880, 2880, "blocked128x4"), (8, 32, "row_major"),
                                        (256, 512, "blocked128x4")])
def test_group_gemm_prepack_cuda_matches_cpu(torch, n, k, layout):
    """The device prepack writes the same bytes as the CPU one (padding included)."""
    rng = np.random.default_rng(n + k)
    b = rng.integers(0, 256, (3, n, k // 2), dtype=np.uint8)
    sc = rng.integers(0, 256, (3, n, k // 32), dtype=np.uint8)
    st = sc if layout == "row_major" else lowbit.convert_scale_layout(sc, n, k // 32, "row_major", "blocked128x4")
    pb, ps = lowbit.group_gemm_mxfp4_prepack(b, st, b_scale_layout=layout)
    db, ds = _dev(torch, b), _dev(torch, st)
    gb, gs = lowbit.group_gemm_mxfp4_prepack(db, ds, b_scale_layout=layout)
    assert gb.is_cuda and gs.is_cuda
    np.testing.assert_array_equal(gb.cpu().numpy(), np.asarray(pb))
    np.testing.assert_array_equal(gs.cpu().numpy(), np.asarray(ps))


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["bf16", "mxfp8"])
def test_moe_mlp_alpha_limit(torch, act):
    """Non-default alpha and limit (the clamp is active for most gate / up values)."""
    _check_mlp(torch, 64, 256, act, "bfloat16", "float32", "float32", alpha=1.0, limit=3.0, seed=71,
               label=f"alpha 1 limit 3 {act}")


@pytest.mark.gpu
@pytest.mark.parametrize("T,I", [(3, 96), (200, 2880 + 32)], ids=["T3-I96", "T200-I2912"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_moe_mlp_intermediate_not_a_tile_multiple(torch, T, I, packed):
    """I not a multiple of the K tile: the down GEMM reads act2's zeroed K padding (bf16 mode)."""
    _check_mlp(torch, T, 256, "bf16", "bfloat16", "bfloat16", "float32", I=I, seed=T + I, packed=packed,
               label=f"T{T} I{I} bf16")


@pytest.mark.gpu
def test_moe_mlp_duplicate_expert_ids(torch):
    """A token may name one expert in two slots: both slots add their weighted output."""
    _check_mlp(torch, 32, 256, "bf16", "float32", "float32", "float32", seed=73, duplicate_ids=True,
               label="duplicate ids")


@pytest.mark.gpu
def test_moe_mlp_runs_on_the_current_stream(torch):
    """As test_group_gemm_runs_on_the_current_stream, for the MLP."""
    T, H = 64, 512
    args, w = _mlp_operands(T, H, 256, 8, 4, 81, "bfloat16", "float32")
    ref = np.asarray(lowbit.gpt_oss_moe_mlp(**args, act="mxfp8", out_dtype="float32")).astype(np.float64)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dev = {k: _dev(torch, v) for k, v in args.items()}
        out = torch.empty((T, H), dtype=torch.float32, device="cuda")
        lowbit.gpt_oss_moe_mlp(**dev, act="mxfp8", out=out)
        torch.cuda._sleep(500_000_000)
        out.fill_(float("nan"))
        lowbit.gpt_oss_moe_mlp(**dev, act="mxfp8", out=out)
        got = _to_host(torch, out)
    tol = 2 * _bf16_ulp(ref) + _mlp_tolerance(args, w, "mxfp8", 1.702, 7.0)
    bad = ~(np.abs(got - ref) <= tol)
    assert not bad.any(), f"side stream: {int(bad.sum())} of {bad.size} outputs beyond tolerance (NaN: never written)"


@pytest.mark.gpu
def test_moe_mlp_allocated_out(torch):
    """out=None: the output has x's dtype (or out_dtype) on x's device."""
    args, w = _mlp_operands(5, 256, 256, 8, 4, 91, "bfloat16", "float32")
    dev = {k: _dev(torch, v) for k, v in args.items()}
    out = lowbit.gpt_oss_moe_mlp(**dev)
    assert out.is_cuda and out.dtype == torch.bfloat16 and tuple(out.shape) == (5, 256)
    out32 = lowbit.gpt_oss_moe_mlp(**dev, out_dtype="float32")
    assert out32.dtype == torch.float32
    ref = np.asarray(lowbit.gpt_oss_moe_mlp(**args, out_dtype="float32")).astype(np.float64)
    tol = 2 * _bf16_ulp(ref) + _mlp_tolerance(args, w, "bf16", 1.702, 7.0)
    assert (np.abs(_to_host(torch, out32) - ref) <= tol).all()
    assert (np.abs(_to_host(torch, out) - ref) <= tol + _bf16_ulp(ref)).all()
