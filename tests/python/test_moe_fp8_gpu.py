"""CUDA results of the opt-in FP8 tensor-core path of the grouped MXFP4 GEMM
(group_gemm_mxfp4_nt_groupwise(..., precision="fp8")) against lowbit's fp64 CPU reference and the
exact CUDA path. Every test is marked gpu (skipped without torch, a CUDA device or a CUDA build).

The path is not bit-exact: each K block of 32 is one FP8 wgmma whose partial sum Hopper's tensor
cores accumulate with about 13 fraction bits and truncation (round toward zero), then the fp32
total gets partial * multiplier with one FFMA. The bound checked per output element
(docs/design/moe_grouped_gemm.md, "FP8 tensor-core path", derives it):

    |out - ref| <= ULPS * ulp_out(max(|out|, |ref|)) + (2^-7 + (K/32) * 2^-24) * sum_k |a_k b_k|

  - 2^-7 sum_k |a_k b_k| covers the tensor-core accumulation of every block: a block's 32 exact
    products (and the zero accumulator) aligned to the largest with >= 13 fraction bits kept lose
    < 2^-13 * 2^e each (2^e <= the largest term <= the block's sum of |terms|), the normalization
    another 2^-13 of the sum: < (33 + 1) * 2^-13 < 2^-7.9 of the block's sum of |terms|, with a
    factor ~1.9 of margin for a two-step (16 + 16) summation inside the instruction;
  - (K/32) * 2^-24 sum |a b|: one fp32 rounding per promotion (the running total is bounded by the
    sum of |terms|);
  - ULPS = 1 against the fp64 reference rounded to the output dtype (the two roundings of out and
    ref), 2 against the exact CUDA path (one more rounding inside).
Typical errors are far below the bound (relative L2 ~1e-4): every comparison also prints and bounds
the relative L2 error (REL_L2 = 2^-9), which catches a block or row lost even when the elementwise
bound is loose, and the exactness properties below must hold bit for bit:
  - integer data (E2M1 codes and E4M3 codes of magnitude 0, 1, 2, 4 with scale bytes in a narrow
    window): every block's products are small integers times one power of two, so the tensor cores
    add them exactly and the promotion is exact too: the FP8 path gives the exact path's bits;
  - one-hot activations (one nonzero element per row): each output is one product: exact.
These catch layout bugs (a K position, a row, a token in the wrong place) under any tolerance.
Outputs are poisoned before every call (NaN bits, and a finite sentinel where the reference has NaNs).
"""

import ml_dtypes
import numpy as np
import pytest

import lowbit

from moe_gpu_common import (_decode_bits, _dequant_a, _dequant_b, _dev, _host_bits, _indptr, Operands, POISON_NAN,
                            _randn_operands, _reference, _run_checked, _run_cuda, _stored_scales, _uneven_sizes, _ulp,
                            _where, _check_recipe_a)

TC_REL = 2.0 ** -7   # tensor-core accumulation, relative to the sum of |terms| (see the docstring)
FP32_REL = 2.0 ** -24
REL_L2 = 2.0 ** -9


def _lay(layout):
    return "blk" if layout == "blocked128x4" else "rm"


def _abs_sums(ops):
    """sum_k |A[m, k] B[g, n, k]| for every output element (float64 [M, N])."""
    A = np.abs(_dequant_a(ops).astype(np.float64))
    out = np.zeros((ops.M, ops.N))
    for g in range(ops.G):
        r0, r1 = int(ops.ind[g]), int(ops.ind[g + 1])
        if r1 > r0:
            out[r0:r1] = np.nan_to_num(A[r0:r1]) @ np.nan_to_num(np.abs(_dequant_b(ops, g).astype(np.float64))).T
    return out


def _run_fp8(torch, ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype, poison, counts=False):
    """The FP8 path on device copies of the operands: weights through the FP8-path prepack on the
    device, m_indptr (or, counts=True, m_counts) on the device, into an output filled with
    `poison`. Returns the output's bits (host uint16 [M, N])."""
    a = _dev(torch, ops.a)
    a_scale = _dev(torch, a_st)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(_dev(torch, ops.b), _dev(torch, b_st), b_scale_layout=b_layout,
                                             precision="fp8")
    out = torch.empty((ops.M, ops.N), dtype=getattr(torch, out_name), device="cuda")
    out.view(torch.int16).fill_(poison)
    rows = dict(m_counts=_dev(torch, np.diff(ops.ind).astype(ind_dtype))) if counts else \
        dict(m_indptr=_dev(torch, ops.ind.astype(ind_dtype)))
    res = lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, a_scale, ps, out_dtype=out_name, a_scale_layout=a_layout,
                                               group_pad=pad, out=out, b_packed=True, precision="fp8", **rows)
    assert res is out
    return _host_bits(torch, out)


def _assert_fp8_bound(got, ref, ops, out_name, label, ulps=1.0, sums=None):
    """The elementwise bound of the docstring, NaN / Inf positions equal, and the relative L2
    error; returns the relative L2 error."""
    nan_r, nan_g = np.isnan(ref), np.isnan(got)
    if (nan_r != nan_g).any():
        i = int(np.flatnonzero((nan_r != nan_g).ravel())[0])
        raise AssertionError(f"{label}: NaN positions differ ({int(nan_r.sum())} in the reference, "
                             f"{int(nan_g.sum())} in the output); first at {_where(ops, i)}: got {got.flat[i]!r}, "
                             f"want {ref.flat[i]!r}")
    inf_r = np.isinf(ref)
    assert (got[inf_r] == ref[inf_r]).all(), f"{label}: infinite reference values not matched"
    fin = np.isfinite(ref)
    S = _abs_sums(ops) if sums is None else sums
    bound = ulps * _ulp(np.maximum(np.abs(ref), np.abs(np.nan_to_num(got))), out_name) + \
        (TC_REL + (ops.K // 32) * FP32_REL) * S
    err = np.where(fin, np.abs(got - ref), 0.0)
    over = fin & ~(err <= bound)
    den = np.linalg.norm(ref[fin])
    rl2 = float(np.linalg.norm(err[fin]) / den) if den > 0 else 0.0
    rel_sum = err[fin] / np.maximum(S[fin], 1e-300)
    msg = (f"{label}: rel L2 {rl2:.2e}, worst |err| / sum|ab| {float(rel_sum.max()) if rel_sum.size else 0:.2e} "
           f"(bound {TC_REL:.1e} + fp32), {int(over.sum())} of {over.size} elements beyond the bound")
    if over.any():
        i = int(np.flatnonzero(over.ravel())[np.argmax((err / np.maximum(bound, 1e-300))[over])])
        raise AssertionError(f"{msg}; worst at {_where(ops, i)}: got {got.flat[i]!r}, want {ref.flat[i]!r}, "
                             f"bound {bound.flat[i]:.3g}")
    assert rl2 <= REL_L2, msg
    print(msg)
    return rl2


def _check_fp8(torch, ops, *, a_layout, b_layout, out_name, pad="flashinfer", ind_dtype=np.int32, recipe_a=False,
               label="", against_exact=True):
    a_st, b_st = _stored_scales(ops, a_layout, b_layout, pad)
    ref = _reference(ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype)

    def run(poison):
        return _run_fp8(torch, ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype, poison)

    got = _run_checked(run, ref, ops, out_name, label)
    sums = _abs_sums(ops)
    _assert_fp8_bound(got, ref, ops, out_name, label + " vs fp64 reference", sums=sums)
    if against_exact:  # the exact CUDA path (packed weights) on the same operands
        exact = _decode_bits(_run_cuda(torch, ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype,
                                       POISON_NAN, packed=True), out_name)
        _assert_fp8_bound(got, exact, ops, out_name, label + " vs exact path", ulps=2.0, sums=sums)
    if recipe_a:
        _check_recipe_a(got, ops, out_name, label)
    return got, ref


# ---------------------------------------------------------------------------------------------
# FlashInfer's recipe (randn activations and randn / sqrt(K) weights, FLOOR-quantized)

# (N, K, group sizes, activation, a_scale_layout, b_scale_layout, out dtype, m_indptr dtype, group_pad)
SHAPES = [
    (128, 128, [0, 1, 4, 50, 1000, 0, 3, 0], "e4m3", "blocked128x4", "blocked128x4", "bfloat16", np.int32,
     "flashinfer"),
    (256, 512, _uneven_sizes(64, 5, seed=1), "e5m2", "row_major", "blocked128x4", "float16", np.int64, "flashinfer"),
    (2880, 2880, [0, 37, 0, 300], "e4m3", "blocked128x4", "blocked128x4", "float16", np.int64, "cumsum"),
    (5760, 2880, [200, 0, 28, 129], "e5m2", "blocked128x4", "row_major", "bfloat16", np.int64, "flashinfer"),
    (136, 160, [0, 0, 129, 0, 2], "e4m3", "row_major", "row_major", "bfloat16", np.int32, "flashinfer"),
    (200, 96, [3, 0, 260, 1], "e4m3", "blocked128x4", "row_major", "float16", np.int32, "flashinfer"),
    (8, 32, [5, 0, 70], "e5m2", "row_major", "blocked128x4", "bfloat16", np.int32, "flashinfer"),
    (5760, 512, _uneven_sizes(16, 200, seed=2), "e4m3", "blocked128x4", "row_major", "float16", np.int64,
     "flashinfer"),
]


def _shape_id(c):
    n, k, sizes, act, la, lb, out, ind, pad = c
    return (f"n{n}-k{k}-G{len(sizes)}m{sum(sizes)}-{act}-a{_lay(la)}-b{_lay(lb)}-{out}-{np.dtype(ind).name}"
            + ("-cumsum" if pad == "cumsum" else ""))


@pytest.mark.gpu
@pytest.mark.parametrize("case", SHAPES, ids=[_shape_id(c) for c in SHAPES])
def test_fp8_flashinfer_recipe(torch, case):
    n, k, sizes, act, la, lb, out, ind, pad = case
    ops = _randn_operands(sizes, n, k, act, seed=n + 7 * k + len(sizes))
    _check_fp8(torch, ops, a_layout=la, b_layout=lb, out_name=out, pad=pad, ind_dtype=ind, recipe_a=True,
               label=_shape_id(case))


# ---------------------------------------------------------------------------------------------
# gpt-oss-like weights: every E2M1 code in use, scale bytes per row around 118..127 with slowly
# varying row levels and a few outlier rows (what a converted gpt-oss checkpoint looks like)

def _gpt_oss_like(sizes, N, K, seed, act="e4m3"):
    rng = np.random.default_rng(seed)
    ops = _randn_operands(sizes, N, K, act, seed)
    G = len(sizes)
    ops.b = rng.integers(0, 256, (G, N, K // 2), dtype=np.uint8)
    level = rng.integers(118, 125, (G, N, 1))
    level[:, rng.integers(0, N, max(1, N // 64)), :] += 4  # outlier rows
    ops.b_sc = np.clip(level + rng.integers(0, 4, (G, N, K // 32)), 0, 254).astype(np.uint8)
    return ops


@pytest.mark.gpu
@pytest.mark.parametrize("gemm,act,la,out", [("gate_up", "e4m3", "blocked128x4", "bfloat16"),
                                              ("down", "e4m3", "row_major", "bfloat16"),
                                              ("gate_up", "e5m2", "row_major", "float16")])
def test_fp8_gpt_oss_like_weights(torch, gemm, act, la, out):
    N, K = (5760, 2880) if gemm == "gate_up" else (2880, 2880)
    sizes = _uneven_sizes(32, 40, seed=3)  # 20b: 32 experts, a few hundred routed rows
    ops = _gpt_oss_like(sizes, N, K, seed=4, act=act)
    _check_fp8(torch, ops, a_layout=la, b_layout="row_major", out_name=out, label=f"gpt-oss-like {gemm} {act}")


@pytest.mark.gpu
def test_fp8_prefill_many_items(torch):
    """Far more (row block x token tile) items than SMs: every CTA of the persistent kernel walks
    many items and its pipeline runs across item boundaries. Checked against the exact CUDA path
    with the bound's sums from torch (the fp64 CPU reference would take minutes here)."""
    G, N, K = 8, 2880, 2880
    sizes = [600, 0, 513, 1, 300, 257, 0, 900]
    ops = _gpt_oss_like(sizes, N, K, seed=6)
    a_st, b_st = _stored_scales(ops, "blocked128x4", "row_major", "flashinfer")
    got = _decode_bits(_run_fp8(torch, ops, a_st, b_st, "blocked128x4", "row_major", "flashinfer", "bfloat16",
                                np.int32, POISON_NAN), "bfloat16")
    exact = _decode_bits(_run_cuda(torch, ops, a_st, b_st, "blocked128x4", "row_major", "flashinfer", "bfloat16",
                                   np.int32, POISON_NAN, packed=True), "bfloat16")
    A = torch.from_numpy(np.abs(_dequant_a(ops))).cuda()
    sums = np.zeros((ops.M, N))
    for g in range(G):
        r0, r1 = int(ops.ind[g]), int(ops.ind[g + 1])
        if r1 > r0:
            B = torch.from_numpy(np.abs(_dequant_b(ops, g))).cuda()
            sums[r0:r1] = (A[r0:r1].double() @ B.double().T).cpu().numpy()
    assert not np.isnan(got).any()
    _assert_fp8_bound(got, exact, ops, "bfloat16", "prefill vs exact path", ulps=2.0, sums=sums)


# ---------------------------------------------------------------------------------------------
# the slow form, NaN scale bytes, zero blocks

@pytest.mark.gpu
@pytest.mark.parametrize("act", ["e4m3", "e5m2"])
def test_fp8_slow_form_wide_scale_spread(torch, act):
    """Row tiles whose weight scale bytes spread beyond the fold's window (14) in some blocks:
    rows 0..63 of every tile 20 below rows 64..127 in the odd blocks, in every block of expert 1,
    and one row with a byte of 252 (kFoldMaxScale, its outputs overflow float16 like the
    reference's) in an even block: those blocks take the slow form (two multiplies per element), the
    others fold. Within the bound, and exact on integer data (test_fp8_integer_data_is_exact covers
    the slow form bit for bit). Bytes 253 and 254 (single decoded weights overflow fp32) lie outside
    the FP8 path's range (docs/design/moe_grouped_gemm.md): its slow form multiplies the block's sum,
    not each weight, so it does not reproduce the reference's Inf - Inf = NaN there."""
    N, K = 256, 512
    ops = _randn_operands([0, 70, 130, 1], N, K, act, seed=8)
    sc = ops.b_sc.astype(np.int64)
    rows = np.arange(N) % 128 < 64
    sc[:, rows, 1::2] -= 20
    sc[1, rows, :] -= 20
    sc[2, 5, 2] = 252
    ops.b_sc = np.clip(sc, 0, 254).astype(np.uint8)
    _check_fp8(torch, ops, a_layout="row_major", b_layout="row_major", out_name="float16", label=f"slow form {act}")


@pytest.mark.gpu
def test_fp8_nan_scale_bytes(torch):
    """Scale byte 255 (NaN) in a weight row's block and in an activation row's block: NaN exactly
    where the reference has NaN (every output of that weight row in the group, every output of that
    token row), every other element within the bound."""
    ops = _randn_operands([0, 40, 0, 200], 256, 512, "e4m3", seed=9)
    ops.b_sc[1, 17, 3] = 255      # weight row 17 of expert 1
    ops.b_sc[3, 200, 0] = 255     # weight row 200 of expert 3
    ops.a_sc[45, 7] = 255         # token row 45 (expert 3)
    ops.a_sc[3, 0] = 255          # token row 3 (expert 1)
    got, ref = _check_fp8(torch, ops, a_layout="row_major", b_layout="row_major", out_name="bfloat16", label="NaN")
    assert np.isnan(ref).sum() > 0


@pytest.mark.gpu
def test_fp8_zero_blocks(torch):
    """All-zero activation blocks with scale byte 0 (what the quantizers write), all-zero weight
    blocks, a whole zero token row and a whole zero weight row: exact zeros where the reference is
    zero, the rest within the bound."""
    ops = _randn_operands([3, 0, 150], 136, 288, "e4m3", seed=10)
    ops.a[:, 32:96] = 0
    ops.a_sc[:, 1:3] = 0
    ops.a[7] = 0
    ops.a_sc[7] = 0
    ops.b[:, :, 64:80] = 0
    ops.b[2, 9] = 0
    got, ref = _check_fp8(torch, ops, a_layout="row_major", b_layout="row_major", out_name="bfloat16",
                          label="zero blocks")
    assert (got[ref == 0] == 0).all()
    assert (got[7] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["e4m3", "e5m2"])
def test_fp8_nan_activation_codes(torch, act):
    """NaN activation codes (E4M3 0x7F / 0xFF, E5M2 0x7F / 0xFE) in a few rows: the FP8 tensor cores
    propagate them, NaN exactly where the reference is NaN."""
    ops = _randn_operands([0, 40, 90], 256, 288, act, seed=18)
    raw = ops.a.view(np.uint8).copy()
    nan = (0x7F, 0xFF) if act == "e4m3" else (0x7F, 0xFE)
    raw[3, 17], raw[60, 250], raw[129, 0] = nan[0], nan[1], nan[0]
    ops.a = raw.view(ops.a.dtype)
    got, ref = _check_fp8(torch, ops, a_layout="row_major", b_layout="row_major", out_name="bfloat16",
                          label=f"NaN codes {act}")
    assert np.isnan(ref[[3, 60, 129]]).all()


# ---------------------------------------------------------------------------------------------
# exactness properties: any layout bug breaks them

E2M1_POW2_CODES = np.array([0, 2, 4, 6, 8, 10, 12, 14], np.uint8)  # 0, 1, 2, 4 and their negatives
E4M3_POW2_CODES = np.array([0x00, 0x38, 0x40, 0x48, 0x80, 0xB8, 0xC0, 0xC8], np.uint8)  # 0, +-1, +-2, +-4


def _integer_operands(sizes, N, K, seed, spread_rows=False):
    """Integer data: E2M1 codes of 0, +-1, +-2, +-4 and E4M3 codes of 0, +-1, +-2, +-4; weight scale
    bytes 120..123, activation scale bytes 124..127 (so that every partial sum and every running
    fp32 total is exact); spread_rows: rows 0..63 of every row tile 20 lower (blocks in the slow form)."""
    rng = np.random.default_rng(seed)
    ops = _randn_operands(sizes, N, K, "e4m3", seed)
    G = len(sizes)
    lo = E2M1_POW2_CODES[rng.integers(0, 8, (G, N, K // 2))]
    hi = E2M1_POW2_CODES[rng.integers(0, 8, (G, N, K // 2))]
    ops.b = (lo | (hi << 4)).astype(np.uint8)
    sc = rng.integers(120, 124, (G, N, K // 32))
    if spread_rows:
        sc[:, np.arange(N) % 128 < 64, :] -= 20
    ops.b_sc = sc.astype(np.uint8)
    ops.a = E4M3_POW2_CODES[rng.integers(0, 8, (ops.M, K))].view(ml_dtypes.float8_e4m3fn)
    ops.a_sc = rng.integers(124, 128, (ops.M, K // 32)).astype(np.uint8)
    return ops


def _fp8_bits_equal_exact(torch, ops, la, out_name, label, counts=False):
    a_st, b_st = _stored_scales(ops, la, "row_major", "flashinfer")
    ref = _reference(ops, a_st, b_st, la, "row_major", "flashinfer", out_name, np.int64)
    got = _run_fp8(torch, ops, a_st, b_st, la, "row_major", "flashinfer", out_name, np.int64, POISON_NAN, counts=counts)
    exact = _run_cuda(torch, ops, a_st, b_st, la, "row_major", "flashinfer", out_name, np.int64, POISON_NAN,
                      packed=True)
    got_v = _decode_bits(got, out_name)
    bad = got != exact
    assert not bad.any(), (f"{label}: {int(bad.sum())} of {bad.size} elements differ from the exact path; first at "
                           f"{_where(ops, int(np.flatnonzero(bad.ravel())[0]))}")
    np.testing.assert_array_equal(got_v, ref, err_msg=label)


@pytest.mark.gpu
@pytest.mark.parametrize("spread", [False, True], ids=["fold", "slow-form"])
@pytest.mark.parametrize("la", ["row_major", "blocked128x4"])
def test_fp8_integer_data_is_exact(torch, spread, la):
    ops = _integer_operands([0, 5, 130, 0, 300, 1], 264, 2880, seed=12, spread_rows=spread)
    _fp8_bits_equal_exact(torch, ops, la, "bfloat16", f"integer data ({'slow' if spread else 'fold'}, {la})")


@pytest.mark.gpu
@pytest.mark.parametrize("counts", [False, True], ids=["m_indptr", "m_counts"])
def test_fp8_one_hot_activations_are_exact(torch, counts):
    """One nonzero activation element per row (random position, sign, code and scale), randn
    weights: every output is one product, exact on the FP8 path."""
    rng = np.random.default_rng(13)
    sizes = [0, 17, 200, 3]
    N, K = 384, 1024
    ops = _randn_operands(sizes, N, K, "e4m3", seed=13)
    a = np.zeros((ops.M, K), np.uint8)
    k = rng.integers(0, K, ops.M)
    a[np.arange(ops.M), k] = rng.integers(0x08, 0x7E, ops.M) | (rng.integers(0, 2, ops.M) << 7)
    ops.a = a.view(ml_dtypes.float8_e4m3fn)
    ops.a_sc = rng.integers(118, 130, (ops.M, K // 32)).astype(np.uint8)
    _fp8_bits_equal_exact(torch, ops, "row_major", "float16", "one-hot", counts=counts)


@pytest.mark.gpu
def test_fp8_row_layouts_give_the_same_bits(torch):
    """m_indptr, contiguous m_counts and the masked layout [G, max_tokens, K] run the same
    arithmetic per element: identical bits."""
    G, T, N, K = 4, 150, 256, 512
    counts = np.array([150, 0, 37, 129], np.int64)
    rng = np.random.default_rng(14)
    x = rng.standard_normal((G * T, K)).astype(np.float32)
    qa = lowbit.quantize(x, "mxfp8_e4m3", "row_major")
    qb = lowbit.quantize((rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32), "mxfp4", "row_major")
    pb, ps = lowbit.group_gemm_mxfp4_prepack(_dev(torch, qb.data), _dev(torch, np.asarray(qb.scales).view(np.uint8)),
                                             b_scale_layout="row_major", precision="fp8")
    a3 = _dev(torch, qa.data).view(G, T, K)
    s3 = _dev(torch, np.asarray(qa.scales).view(np.uint8)).view(G, T, K // 32)
    masked = torch.empty((G, T, N), dtype=torch.bfloat16, device="cuda")
    masked.view(torch.int16).fill_(POISON_NAN)
    lowbit.group_gemm_mxfp4_nt_groupwise(a3, pb, s3, ps, m_counts=_dev(torch, counts), a_scale_layout="row_major",
                                         out=masked, b_packed=True, precision="fp8")
    # the same rows compacted: contiguous counts and m_indptr
    rows = np.concatenate([np.arange(g * T, g * T + c) for g, c in enumerate(counts)])
    ac = a3.reshape(G * T, K)[torch.from_numpy(rows).cuda()].contiguous()
    sc = s3.reshape(G * T, K // 32)[torch.from_numpy(rows).cuda()].contiguous()
    ind = _dev(torch, _indptr(counts).astype(np.int32))
    by_ind = lowbit.group_gemm_mxfp4_nt_groupwise(ac, pb, sc, ps, ind, a_scale_layout="row_major", b_packed=True, n=N,
                                                  precision="fp8")
    by_counts = lowbit.group_gemm_mxfp4_nt_groupwise(ac, pb, sc, ps, m_counts=_dev(torch, counts),
                                                     a_scale_layout="row_major", b_packed=True, n=N, precision="fp8")
    want = masked.reshape(G * T, N)[torch.from_numpy(rows).cuda()]
    assert torch.equal(by_ind.view(torch.int16), want.view(torch.int16))
    assert torch.equal(by_counts.view(torch.int16), want.view(torch.int16))
    # rows outside the counts are not written
    for g, c in enumerate(counts):
        assert (masked[g, c:].view(torch.int16) == POISON_NAN).all()


# ---------------------------------------------------------------------------------------------
# prepack, refusals, no rows

@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row_major", "blocked128x4"])
def test_fp8_prepack_device_equals_host(torch, layout):
    rng = np.random.default_rng(15)
    G, N, K = 3, 264, 288
    b = rng.integers(0, 256, (G, N, K // 2), dtype=np.uint8)
    sc = rng.integers(0, 256, (G, N, K // 32), dtype=np.uint8)
    st = sc if layout == "row_major" else lowbit.convert_scale_layout(sc, N, K // 32, "row_major", "blocked128x4")
    hb, hs = lowbit.group_gemm_mxfp4_prepack(b, st, b_scale_layout=layout, precision="fp8")
    db, ds = lowbit.group_gemm_mxfp4_prepack(_dev(torch, b), _dev(torch, st), b_scale_layout=layout, precision="fp8")
    np.testing.assert_array_equal(db.cpu().numpy(), hb)
    np.testing.assert_array_equal(ds.cpu().numpy(), hs)


@pytest.mark.gpu
def test_fp8_cuda_refusals(torch):
    ops = _randn_operands([4, 4], 128, 128, "e4m3", seed=16)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(_dev(torch, ops.b), _dev(torch, ops.b_sc), b_scale_layout="row_major",
                                             precision="fp8")
    ind = _dev(torch, ops.ind.astype(np.int32))
    wide = torch.zeros((ops.M, ops.K + 8), dtype=torch.uint8, device="cuda")
    wide[:, :ops.K] = _dev(torch, ops.a).view(torch.uint8)
    a_strided = wide[:, :ops.K].view(torch.float8_e4m3fn)  # row stride K + 8: not a multiple of 16 bytes
    with pytest.raises(NotImplementedError, match="16 bytes"):
        lowbit.group_gemm_mxfp4_nt_groupwise(a_strided, pb, _dev(torch, ops.a_sc), ps, ind,
                                             a_scale_layout="row_major", b_packed=True, n=128, precision="fp8")
    a16 = torch.zeros((ops.M, ops.K), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="argument 'precision'"):
        lowbit.group_gemm_mxfp4_nt_groupwise(a16, pb, None, ps, ind, b_packed=True, n=128, precision="fp8")


@pytest.mark.gpu
def test_fp8_no_rows(torch):
    ops = _randn_operands([0, 0], 128, 256, "e4m3", seed=17)
    pb, ps = lowbit.group_gemm_mxfp4_prepack(_dev(torch, ops.b), _dev(torch, ops.b_sc), b_scale_layout="row_major",
                                             precision="fp8")
    a = torch.empty((0, 256), dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty((0, 8), dtype=torch.uint8, device="cuda")
    out = lowbit.group_gemm_mxfp4_nt_groupwise(a, pb, s, ps, torch.zeros(3, dtype=torch.int32, device="cuda"),
                                               a_scale_layout="row_major", b_packed=True, n=128, precision="fp8")
    torch.cuda.synchronize()
    assert out.shape == (0, 128)
