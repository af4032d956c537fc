"""CUDA results of the grouped GEMM's m_counts layouts (contiguous and masked) and of
gpt_oss_expert_mlp against lowbit's CPU reference on the same bytes (docs/moe_ep.md). The rules are
those of test_moe_gpu.py (GEMM: one ulp of the output dtype, or the fp32 sum floor) and
test_moe_gpu_mlp.py (MLP). Counts live on the device; outputs are poisoned first and every row
outside the counts must still hold the poison. Device counts outside their range are clamped
(negative -> 0, masked: above max_tokens -> max_tokens, contiguous: the groups end at row M), which
the reference reproduces with the clamped counts. A masked call with max_tokens far above the
counts runs the capped grid whose CTAs loop over their work items; one call is captured in a CUDA
graph and replayed with other counts written into the same device tensor. Every test is marked gpu."""

import ml_dtypes
import numpy as np
import pytest

import lowbit

from moe_gpu_common import MAX_ULPS, _decode_bits, _dev, _host_bits, _ulp

BF16 = ml_dtypes.bfloat16
POISON = 0x7FFF  # NaN in bf16 and fp16


def _weights(rng, G, N, K, packed):
    w = (rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    qb = lowbit.quantize(w, "mxfp4", "row_major", rounding="floor")
    return qb.data, np.asarray(qb.scales).view(np.uint8)


def _acts(rng, rows, K, act):
    x = rng.standard_normal((rows, K)).astype(np.float32)
    if act == "bf16":
        return x.astype(BF16), None
    q = lowbit.quantize(x, "mxfp8_e4m3", "row_major", rounding="floor")
    return q.data, np.asarray(q.scales).view(np.uint8)


def _clamped(counts, M, max_tokens):
    c = np.maximum(np.asarray(counts, np.int64), 0)
    if max_tokens:
        return np.minimum(c, max_tokens)
    ends = np.minimum(np.cumsum(c), M)
    return np.diff(np.concatenate([[0], ends]))


def _row_sets(counts, max_tokens):
    """Rows (of the flattened [M, ..] view) inside the counts, per group."""
    if max_tokens:
        return [np.arange(g * max_tokens, g * max_tokens + c) for g, c in enumerate(counts)]
    b = np.concatenate([[0], np.cumsum(counts)])
    return [np.arange(b[g], b[g + 1]) for g in range(len(counts))]


def _run_gemm(torch, a, asc, b, bs, counts_dev, N, packed, expected_m, out=None):
    da, db, dbs = _dev(torch, a), _dev(torch, b), _dev(torch, bs)
    dsc = None if asc is None else _dev(torch, asc)
    if packed:
        db, dbs = lowbit.group_gemm_mxfp4_prepack(db, dbs, b_scale_layout="row_major")
    if out is None:
        out = torch.empty(tuple(a.shape[:-1]) + (N,), dtype=torch.bfloat16, device="cuda")
        out.view(torch.int16).fill_(POISON)
    lowbit.group_gemm_mxfp4_nt_groupwise(da, db, dsc, dbs, m_counts=counts_dev, out=out, a_scale_layout="row_major",
                                         b_scale_layout="row_major", b_packed=packed, n=N, expected_m=expected_m)
    return out


# (name, G, rows: M or max_tokens, N, K, counts, masked, act, packed, expected_m)
CASES = [
    ("contig-empty-groups", 5, 300, 256, 512, [0, 37, 0, 200, 1], False, "bf16", False, 0),
    ("contig-sum-below-M", 4, 400, 136, 224, [3, 129, 0, 50], False, "e4m3", True, 0),
    ("contig-past-M-clamped", 3, 100, 128, 128, [60, 70, -5], False, "e4m3", False, 0),
    ("masked-full-and-empty", 4, 64, 256, 512, [64, 0, 17, 1], True, "bf16", True, 0),
    ("masked-clamped", 3, 40, 128, 256, [50, -3, 40], True, "e4m3", False, 0),
    ("masked-capped-grid", 8, 1024, 256, 512, [1024, 3, 0, 17, 2, 0, 9, 1], True, "e4m3", True, 4),
    ("masked-capped-grid-plain", 8, 1024, 256, 512, [5, 1024, 0, 1, 33, 2, 0, 7], True, "bf16", False, 8),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("counts_dtype", ["int32", "int64"])
def test_group_gemm_layouts_cuda(torch, case, counts_dtype):
    name, G, rows, N, K, counts, masked, act, packed, expected_m = case
    rng = np.random.default_rng(G * 7 + rows + N)
    b, bs = _weights(rng, G, N, K, packed)
    M = G * rows if masked else rows
    a, asc = _acts(rng, M, K, act)
    if masked:
        a = a.reshape(G, rows, K)
        asc = None if asc is None else asc.reshape(G, rows, K // 32)
    cnt = np.asarray(counts, getattr(np, counts_dtype))
    ok = _clamped(cnt, M, rows if masked else 0)
    # the CPU reference on the clamped (valid) counts
    ref = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, asc, bs, m_counts=ok.astype(np.int64), a_scale_layout="row_major",
                                               b_scale_layout="row_major")
    ref = _decode_bits(np.ascontiguousarray(ref).view(np.uint16).reshape(M, N), "bfloat16")
    out = _run_gemm(torch, a, asc, b, bs, _dev(torch, cnt), N, packed, expected_m)
    bits = _host_bits(torch, out).reshape(M, N)
    inside = np.zeros(M, bool)
    for r in _row_sets(ok, rows if masked else 0):
        inside[r] = True
    assert (bits[~inside] == POISON).all(), f"{name}: rows outside the counts were written"
    got = _decode_bits(bits[inside], "bfloat16")
    want = ref[inside]
    assert not np.isnan(got).any(), f"{name}: rows inside the counts left unwritten (poison)"
    err = np.abs(got - want) / _ulp(want, "bfloat16")
    assert (err <= MAX_ULPS).all(), f"{name}: worst {err.max():.3g} ulps"


@pytest.mark.gpu
def test_masked_layout_in_a_cuda_graph(torch):
    """The counts are read on the device: a captured call replays with new counts (no host sync)."""
    rng = np.random.default_rng(17)
    G, T, N, K = 4, 256, 128, 256
    b, bs = _weights(rng, G, N, K, True)
    a, asc = _acts(rng, G * T, K, "e4m3")
    a3, s3 = a.reshape(G, T, K), asc.reshape(G, T, K // 32)
    db, dbs = lowbit.group_gemm_mxfp4_prepack(_dev(torch, b), _dev(torch, bs), b_scale_layout="row_major")
    da, dsc = _dev(torch, a3), _dev(torch, s3)
    counts = torch.tensor([3, 0, 256, 40], dtype=torch.int32, device="cuda")
    out = torch.empty((G, T, N), dtype=torch.bfloat16, device="cuda")

    def call():
        lowbit.group_gemm_mxfp4_nt_groupwise(da, db, dsc, dbs, m_counts=counts, out=out, a_scale_layout="row_major",
                                             b_packed=True, n=N, expected_m=16)

    call()  # warm-up outside the capture (workspace pool, kernel attributes)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    for new in ([1, 2, 3, 4], [256, 0, 0, 255], [0, 0, 0, 0]):
        counts.copy_(torch.tensor(new, dtype=torch.int32))
        out.view(torch.int16).fill_(POISON)
        g.replay()
        bits = _host_bits(torch, out).reshape(G * T, N)
        ref = lowbit.group_gemm_mxfp4_nt_groupwise(a3, b, s3, bs, m_counts=np.array(new), a_scale_layout="row_major",
                                                   b_scale_layout="row_major")
        ref = _decode_bits(np.ascontiguousarray(ref).view(np.uint16).reshape(G * T, N), "bfloat16")
        for gi, c in enumerate(new):
            rows = slice(gi * T, gi * T + c)
            assert (bits[gi * T + c:(gi + 1) * T] == POISON).all()
            got = _decode_bits(bits[rows], "bfloat16")
            assert (np.abs(got - ref[rows]) <= MAX_ULPS * _ulp(ref[rows], "bfloat16")).all(), f"counts {new}"


# ---------------------------------------------------------------------------------------------
# gpt_oss_expert_mlp

MLP_CASES = [  # (name, E, rows, H, I, counts, masked, act, x kind, packed, expected_m)
    ("contig-bf16", 4, 300, 256, 256, [0, 100, 3, 150], False, "bf16", "bfloat16", False, 0),
    ("contig-mxfp8-x", 4, 200, 512, 256, [50, 50, 0, 60], False, "mxfp8", "mxfp8", True, 0),
    ("masked-mxfp8", 4, 64, 256, 256, [64, 0, 5, 17], True, "mxfp8", "float32", False, 0),
    ("masked-capped-grid", 8, 512, 256, 256, [2, 512, 0, 7, 1, 0, 30, 3], True, "bf16", "bfloat16", True, 4),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", MLP_CASES, ids=[c[0] for c in MLP_CASES])
def test_expert_mlp_cuda(torch, case):
    from test_moe_gpu_mlp import _bf16_ulp, _mlp_tolerance

    name, E, rows, H, I, counts, masked, act, xkind, packed, expected_m = case
    rng = np.random.default_rng(E + rows + H)
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H), dtype=np.float32) * np.float32(0.25), "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I), dtype=np.float32) * np.float32(0.1), "mxfp4")
    b1 = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32)
    b2 = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
    M = E * rows if masked else rows
    x = rng.standard_normal((M, H), dtype=np.float32)
    x_scale = None
    if xkind == "bfloat16":
        x = x.astype(BF16)
    elif xkind == "mxfp8":
        q = lowbit.quantize(x, "mxfp8_e4m3", "row_major")
        x, x_scale = q.data, np.asarray(q.scales).view(np.uint8)
    shape = (E, rows, H) if masked else (M, H)
    cnt = np.asarray(counts, np.int32)
    wargs = dict(w1=w1.data, w1_scale=np.asarray(w1.scales).view(np.uint8), b1=b1, w2=w2.data,
                 w2_scale=np.asarray(w2.scales).view(np.uint8), b2=b2)
    xs = None if x_scale is None else x_scale.reshape(shape[:-1] + (H // 32,))
    ref = lowbit.gpt_oss_expert_mlp(x.reshape(shape), cnt, **wargs, x_scale=xs, act=act, out_dtype="float32")
    ref = np.asarray(ref).reshape(M, H).astype(np.float64)
    dev = {k: _dev(torch, v) for k, v in wargs.items()}
    if packed:
        for wn in ("w1", "w2"):
            dev[wn], dev[wn + "_scale"] = lowbit.group_gemm_mxfp4_prepack(dev[wn], dev[wn + "_scale"],
                                                                          b_scale_layout="row_major")
    out = torch.full(shape, float("nan"), dtype=torch.float32, device="cuda")
    lowbit.gpt_oss_expert_mlp(_dev(torch, x.reshape(shape)), _dev(torch, cnt), **dev,
                              x_scale=None if xs is None else _dev(torch, xs), act=act, out=out, packed=packed,
                              expected_m=expected_m)
    got = out.reshape(M, H).cpu().numpy().astype(np.float64)
    inside = np.zeros(M, bool)
    for r in _row_sets(cnt, rows if masked else 0):
        inside[r] = True
    assert np.isnan(got[~inside]).all(), f"{name}: rows outside the counts were written"
    assert not np.isnan(got[inside]).any(), f"{name}: rows inside the counts left unwritten"
    # the tolerance of test_moe_gpu_mlp: each row as one routed slot of weight 1
    xr = x.astype(np.float32) if x_scale is None else lowbit.dequantize(q)
    ids = np.concatenate([np.full(c, e, np.int32) for e, c in enumerate(cnt)])[:, None]
    rows_in = xr.reshape(M, H)[inside]
    targs = dict(x=rows_in, topk_ids=ids, topk_weights=np.ones_like(ids, np.float32), b1=b1, b2=b2)
    tol = 2 * _bf16_ulp(ref[inside]) + _mlp_tolerance(targs, (w1, w2), act, 1.702, 7.0)
    err = np.abs(got[inside] - ref[inside])
    assert (err <= tol).all(), f"{name}: {int((err > tol).sum())} of {err.size} outputs beyond tolerance"
