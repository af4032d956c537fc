"""The expert-parallel row layouts of the grouped GEMM (m_counts: contiguous rows sorted by group,
and masked batches [G, max_tokens, K]) and gpt_oss_expert_mlp on the CPU reference, against an
independent NumPy float64 evaluation of the decoded operands (docs/moe_ep.md): empty groups, full
batches, rows beyond the counts (poisoned inputs never leak into results, poisoned outputs stay
poisoned), bit-for-bit agreement with the m_indptr layout and with gpt_oss_moe_mlp, the host
refusals (counts above max_tokens, negative, summing past the rows) naming the argument and
leaving the output untouched, and the torch custom ops with their fakes."""

import importlib
import re

import ml_dtypes
import numpy as np
import pytest

import lowbit

BF16 = ml_dtypes.bfloat16
OP = "group_gemm_mxfp4_nt_groupwise"


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def _weights(rng, G, N, K, packed=False):
    w = (rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    qb = lowbit.quantize(w, "mxfp4", "row_major")
    B = lowbit.dequantize(qb).astype(np.float64)
    b, bs = qb.data, np.asarray(qb.scales).view(np.uint8)
    if packed:
        b, bs = lowbit.group_gemm_mxfp4_prepack(b, bs, b_scale_layout="row_major")
    return b, bs, B


def _acts(rng, rows, K, act):
    """(a, a_scale, A float64) of `rows` rows: bf16, or MXFP8 E4M3 with row-major scales."""
    x = rng.standard_normal((rows, K)).astype(np.float32)
    if act == "bf16":
        a = x.astype(BF16)
        return a, None, a.astype(np.float64)
    q = lowbit.quantize(x, "mxfp8_e4m3", "row_major")
    return q.data, np.asarray(q.scales).view(np.uint8), lowbit.dequantize(q).astype(np.float64)


def _expect(A_rows, B_g):
    """The reference's rule: the exact (float64) sum rounded to fp32, then to bf16."""
    return (A_rows @ B_g.T).astype(np.float32).astype(BF16)


def _poison_nan(a):
    """a with NaN written over it (bf16: 0x7FC0; fp8 codes: 0x7F)."""
    a = np.array(a, copy=True)
    a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)[...] = 0x7FC0 if a.dtype.itemsize == 2 else 0x7F
    return a


@pytest.mark.parametrize("act", ["bf16", "mxfp8"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("counts_dtype", [np.int32, np.int64])
def test_contiguous_counts_match_numpy(act, packed, counts_dtype):
    rng = np.random.default_rng(1)
    counts = np.array([3, 0, 17, 1, 0], counts_dtype)
    M, N, K, G = int(counts.sum()) + 5, 40, 96, len(counts)  # 5 rows beyond the counts
    b, bs, B = _weights(rng, G, N, K, packed)
    a, asc, A = _acts(rng, M, K, act)
    tail = int(counts.sum())
    a[tail:] = _poison_nan(a[tail:])  # rows beyond the counts: never read for results
    out = np.full((M, N), 0x7FC1, np.uint16).view(BF16)
    res = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, asc, bs, m_counts=counts, out=out, a_scale_layout="row_major",
                                               b_scale_layout="row_major", b_packed=packed, n=N)
    assert res is out
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for g in range(G):
        r0, r1 = bounds[g], bounds[g + 1]
        np.testing.assert_array_equal(_bits(out[r0:r1]), _bits(_expect(A[r0:r1], B[g])))
    assert (_bits(out[tail:]) == 0x7FC1).all(), "rows beyond the counts must not be written"
    # the same rows through m_indptr: the same bits
    ref = lowbit.group_gemm_mxfp4_nt_groupwise(a[:tail], b, None if asc is None else asc[:tail], bs, bounds,
                                               a_scale_layout="row_major", b_scale_layout="row_major",
                                               b_packed=packed, n=N)
    np.testing.assert_array_equal(_bits(out[:tail]), _bits(ref))


@pytest.mark.parametrize("act", ["bf16", "mxfp8"])
def test_masked_batches_match_numpy(act):
    """Empty groups, a full batch (count = max_tokens), partial ones; rows at or beyond each count
    are neither read (NaN there changes nothing) nor written (poison stays)."""
    rng = np.random.default_rng(2)
    G, T, N, K = 4, 6, 24, 64
    counts = np.array([2, 0, 6, 5], np.int32)
    b, bs, B = _weights(rng, G, N, K)
    a, asc, A = _acts(rng, G * T, K, act)
    a = a.reshape(G, T, K)
    A = A.reshape(G, T, K)
    asc = None if asc is None else asc.reshape(G, T, K // 32)
    for g in range(G):
        a[g, counts[g]:] = _poison_nan(a[g, counts[g]:])
    out = np.full((G, T, N), 0x7FC1, np.uint16).view(BF16)
    lowbit.group_gemm_mxfp4_nt_groupwise(a, b, asc, bs, m_counts=counts, out=out, a_scale_layout="row_major",
                                         b_scale_layout="row_major", expected_m=2)
    for g in range(G):
        c = counts[g]
        np.testing.assert_array_equal(_bits(out[g, :c]), _bits(_expect(A[g, :c], B[g])))
        assert (_bits(out[g, c:]) == 0x7FC1).all(), f"group {g}: rows at or beyond the count were written"
    # contiguous layout of the same rows: the same bits
    rows = np.concatenate([a[g, :counts[g]] for g in range(G)])
    srows = None if asc is None else np.concatenate([asc[g, :counts[g]] for g in range(G)])
    ref = lowbit.group_gemm_mxfp4_nt_groupwise(rows, b, srows, bs, m_counts=counts, a_scale_layout="row_major",
                                               b_scale_layout="row_major")
    got = np.concatenate([out[g, :counts[g]] for g in range(G)])
    np.testing.assert_array_equal(_bits(got), _bits(ref))


def test_layouts_torch_cpu_and_custom_op():
    torch = pytest.importorskip("torch")
    importlib.import_module("lowbit.torch_ops")  # registers torch.ops.lowbit

    rng = np.random.default_rng(3)
    G, T, N, K = 3, 4, 16, 64
    b, bs, B = _weights(rng, G, N, K)
    x = torch.from_numpy(rng.standard_normal((G, T, K)).astype(np.float32)).bfloat16()
    counts = torch.tensor([4, 1, 0], dtype=torch.int64)
    tb, tbs = torch.from_numpy(np.asarray(b)), torch.from_numpy(bs)
    out = torch.ops.lowbit.group_gemm_mxfp4_nt_groupwise(x, tb, None, tbs, m_counts=counts, b_scale_layout="row_major")
    assert out.shape == (G, T, N) and out.dtype == torch.bfloat16
    A = x.float().numpy().astype(np.float64)
    for g, c in enumerate(counts.tolist()):
        np.testing.assert_array_equal(out[g, :c].view(torch.int16).numpy().view(np.uint16),
                                      _bits(_expect(A[g, :c], B[g])))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx = mode.from_tensor(x)
        fo = torch.ops.lowbit.group_gemm_mxfp4_nt_groupwise(fx, mode.from_tensor(tb), None, mode.from_tensor(tbs),
                                                            m_counts=mode.from_tensor(counts),
                                                            b_scale_layout="row_major")
        assert fo.shape == (G, T, N) and fo.dtype == torch.bfloat16


def test_layout_refusals_name_the_argument():
    rng = np.random.default_rng(4)
    G, T, N, K = 3, 4, 16, 64
    b, bs, _ = _weights(rng, G, N, K)
    a = rng.standard_normal((G * T, K)).astype(BF16)
    kw = dict(b_scale_layout="row_major")
    cases = [
        (dict(a=a.reshape(G, T, K), m_counts=[1, 5, 0]), "m_counts", "exceeds max_tokens"),
        (dict(a=a.reshape(G, T, K), m_counts=np.array([1, -1, 0], np.int64)), "m_counts", "negative"),
        (dict(a=a, m_counts=[4, 5, 4]), "m_counts", "add up to more than"),
        (dict(a=a, m_counts=[1, 1]), "m_counts", "expected a contiguous [3]"),
        (dict(a=a, m_counts=[1, 1, 1], m_indptr=[0, 1, 2, 3]), "m_counts", "either"),
        (dict(a=a), "m_indptr", "required"),
        (dict(a=a.reshape(G, T, K), m_indptr=[0, 1, 2, 3]), "m_counts", "required"),
        (dict(a=a.reshape(2, 6, K), m_counts=[1, 1, 1]), "a", "one batch per group"),
        (dict(a=a, m_counts=[1, 1, 1], expected_m=-1), "expected_m", ""),
    ]
    for extra, arg, what in cases:
        args = dict(extra)
        aa = args.pop("a")
        out = np.full(aa.shape[:-1] + (N,), 0x1234, np.uint16).view(BF16)
        with pytest.raises(ValueError, match=f"argument '{arg}'.*{re.escape(what)}"):
            lowbit.group_gemm_mxfp4_nt_groupwise(aa, b, None, bs, out=out, **args, **kw)
        assert (_bits(out) == 0x1234).all(), f"{arg}: the output was touched by a refused call"
    # MXFP8 activations with m_counts take row-major scales only
    q = lowbit.quantize(a.astype(np.float32), "mxfp8_e4m3", "blocked128x4", m_indptr=np.array([0, 4, 8, 12]))
    with pytest.raises(ValueError, match="argument 'a_scale_layout'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(q.data, b, q.scales, bs, m_counts=[4, 4, 4], a_scale_layout="blocked128x4",
                                             **kw)


# ---------------------------------------------------------------------------------------------
# gpt_oss_expert_mlp

def _mlp(rng, E, H, I):
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    return w1, w2, b1, b2


def _numpy_expert(x, e, W1, W2, b1, b2, act):
    """float64 gpt-oss expert term of rows x (act() as the op defines it: bf16 / MXFP8 rounding)."""
    def rnd(v):
        v = np.asarray(v, np.float32)
        if act == "bf16":
            return v.astype(BF16).astype(np.float64)
        return lowbit.dequantize(lowbit.quantize(v, "mxfp8_e4m3")).astype(np.float64)

    h = rnd(x) @ W1[e].T + b1[e]
    g, u = np.minimum(h[:, 0::2], 7.0), np.clip(h[:, 1::2], -7.0, 7.0)
    y = rnd(g / (1 + np.exp(-1.702 * g)) * (u + 1))
    return y @ W2[e].T + b2[e]


@pytest.mark.parametrize("act", ["bf16", "mxfp8"])
@pytest.mark.parametrize("masked", [False, True], ids=["contiguous", "masked"])
def test_expert_mlp_matches_numpy_and_routed_op(act, masked):
    rng = np.random.default_rng(5)
    E, H, I, T = 3, 64, 32, 5
    w1, w2, b1, b2 = _mlp(rng, E, H, I)
    W1, W2 = (lowbit.dequantize(q).astype(np.float64) for q in (w1, w2))
    counts = np.array([2, 0, 5], np.int32)
    if masked:
        x = rng.standard_normal((E, T, H)).astype(np.float32)
        for e in range(E):
            x[e, counts[e]:] = np.nan
        rows = [x[e, :counts[e]] for e in range(E)]
        out = np.full((E, T, H), -7.0, np.float32)
    else:
        x = rng.standard_normal((int(counts.sum()) + 2, H)).astype(np.float32)
        x[-2:] = np.nan
        bnd = np.concatenate([[0], np.cumsum(counts)])
        rows = [x[bnd[e]:bnd[e + 1]] for e in range(E)]
        out = np.full(x.shape, -7.0, np.float32)
    lowbit.gpt_oss_expert_mlp(x, counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2, act=act, out=out)
    got_rows = [out[e, :counts[e]] for e in range(E)] if masked else \
        [out[bnd[e]:bnd[e + 1]] for e in range(E)]
    for e in range(E):
        if counts[e]:
            ref = _numpy_expert(rows[e], e, W1, W2, b1, b2, act)
            np.testing.assert_allclose(got_rows[e], ref, rtol=2e-3, atol=2e-3)
    if masked:
        for e in range(E):
            assert (out[e, counts[e]:] == -7.0).all(), "rows beyond the counts must not be written"
    else:
        assert (out[-2:] == -7.0).all()
    # bit for bit gpt_oss_moe_mlp's unweighted term: one slot per row at weight 1
    flat = np.concatenate([r for r in rows])
    ids = np.concatenate([np.full(c, e, np.int32) for e, c in enumerate(counts)])[:, None]
    routed = lowbit.gpt_oss_moe_mlp(flat, ids, np.ones_like(ids, np.float32), w1.data, w1.scales, b1, w2.data,
                                    w2.scales, b2, act=act, out_dtype="float32")
    np.testing.assert_array_equal(np.concatenate(got_rows).view(np.uint32), np.asarray(routed).view(np.uint32))


def test_expert_mlp_mxfp8_input_equals_dequantized():
    """x as MXFP8 codes + scales (a quantized dispatch): act="mxfp8" gives the bits of the same
    values given in float32 (act() of an MXFP8 row is that row)."""
    rng = np.random.default_rng(6)
    E, H, I = 2, 64, 32
    w1, w2, b1, b2 = _mlp(rng, E, H, I)
    x = rng.standard_normal((7, H)).astype(np.float32)
    q = lowbit.quantize(x, "mxfp8_e4m3", "row_major")
    counts = np.array([3, 4], np.int64)
    got = lowbit.gpt_oss_expert_mlp(q.data, counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2,
                                    x_scale=q.scales, act="mxfp8", out_dtype="float32")
    ref = lowbit.gpt_oss_expert_mlp(lowbit.dequantize(q), counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2,
                                    act="mxfp8", out_dtype="float32")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(ref).view(np.uint32))
    ref_x = lowbit.gpt_oss_expert_mlp(x, counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2, act="mxfp8",
                                      out_dtype="float32")
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(ref_x).view(np.uint32))
    with pytest.raises(ValueError, match="argument 'x_scale'"):
        lowbit.gpt_oss_expert_mlp(q.data, counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2)
    with pytest.raises(ValueError, match="argument 'x_scale'"):
        lowbit.gpt_oss_expert_mlp(x, counts, w1.data, w1.scales, b1, w2.data, w2.scales, b2, x_scale=q.scales)


def test_expert_mlp_refusals_and_custom_op():
    rng = np.random.default_rng(7)
    E, H, I = 2, 64, 32
    w1, w2, b1, b2 = _mlp(rng, E, H, I)
    args = (w1.data, w1.scales, b1, w2.data, w2.scales, b2)
    x3 = rng.standard_normal((E, 3, H)).astype(np.float32)
    for x, counts, arg in [(x3, [1, 4], "m_counts"), (x3, [-1, 0], "m_counts"), (x3[0], [2, 2], "m_counts"),
                           (x3[:1], [1, 1], "x"), (x3, [1], "m_counts")]:
        out = np.full(x.shape, 3.0, np.float32)
        with pytest.raises(ValueError, match=f"argument '{arg}'"):
            lowbit.gpt_oss_expert_mlp(x, np.array(counts, np.int32), *args, out=out)
        assert (out == 3.0).all()
    torch = pytest.importorskip("torch")
    importlib.import_module("lowbit.torch_ops")  # registers torch.ops.lowbit

    tx = torch.from_numpy(x3).bfloat16()
    targs = [torch.from_numpy(np.ascontiguousarray(np.asarray(a)).view(np.uint8) if np.asarray(a).dtype.itemsize == 1
                              else np.ascontiguousarray(np.asarray(a))) for a in args]
    counts = torch.tensor([3, 1], dtype=torch.int32)
    out = torch.ops.lowbit.gpt_oss_expert_mlp(tx, counts, *targs, act="mxfp8")
    ref = lowbit.gpt_oss_expert_mlp(tx, counts, *targs, act="mxfp8")
    assert out.dtype == torch.bfloat16 and out.shape == tx.shape
    assert torch.equal(out[0].view(torch.int16), ref[0].view(torch.int16))
    assert torch.equal(out[1, :1].view(torch.int16), ref[1, :1].view(torch.int16))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fo = torch.ops.lowbit.gpt_oss_expert_mlp(mode.from_tensor(tx), mode.from_tensor(counts),
                                                 *[mode.from_tensor(t) for t in targs], out_dtype=torch.float32)
        assert fo.shape == tx.shape and fo.dtype == torch.float32


def test_build_info_lists_the_expert_mlp_on_cuda():
    """gpt_oss_expert_mlp has a CUDA path (and the grouped GEMM's, which takes the m_counts
    layouts): in cuda_ops exactly when the sm_90a kernels are built and a device is there."""
    info = lowbit.build_info()
    ops = {"gpt_oss_expert_mlp", "group_gemm_mxfp4_nt_groupwise"}
    assert not ops & set(info["cpu_only_ops"])
    if info["cuda_built"] and info["device_count"] and info["sm"] >= 90 and "nvfp4_dual_gemm_silu" in info["cuda_ops"]:
        assert ops <= set(info["cuda_ops"])
    else:
        assert not ops & set(info["cuda_ops"])
