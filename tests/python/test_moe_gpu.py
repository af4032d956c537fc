"""CUDA results of the MoE ops against lowbit's CPU reference: the MXFP4 grouped GEMM
(group_gemm_mxfp4_nt_groupwise) and the gpt-oss expert MLP (gpt_oss_moe_mlp). Every test is
marked gpu (skipped without torch, a CUDA device or a CUDA build of lowbit).

Operands are built on the host (NumPy, lowbit's CPU quantize or raw bytes), copied to the device
as torch tensors, and the CPU reference runs on the host copies of the same bytes.

Grouped GEMM, two rules:
  recipe A (FlashInfer's test): a = randn, b = randn / sqrt(k), both quantized with FLOOR-scaled
    MX (rounding="floor"); reference = fp32 dequantize-then-matmul in NumPy, rounded to the
    output dtype; |out - ref| <= 1e-2 + 1e-2 |ref|.
  recipe B (strict): every element within one ulp of the output dtype (the spacing at the
    reference value) of the CPU reference on the same quantized operands; NaN exactly where the
    reference is NaN, equal infinities. The failure message gives the worst error in ulps.
    Where a sum cancels, the output spacing can be finer than any fp32 accumulation resolves
    (fp16 subnormal results of O(1) terms: spacing 2^-24): an element beyond one ulp passes only
    within 2^-20 * sum_k |a_k b_k|, and the message counts those elements.
Outputs are poisoned before every call (NaN bits 0x7FFF; where the reference has NaNs a second
call poisons with a finite sentinel), so an element the kernel never writes fails.

MLP: |out - ref| <= 2 bf16 ulps of |ref| + 2^-14 S + F per element, where S is the sum of the
absolute terms of that output (fp32 accumulation in another order moves a sum by a few fp32
ulps of S, not of the result) and F bounds the effect of an act() rounding (bf16 or MXFP8) that
an activation within fp32 accumulation error of a rounding boundary may take either way
(computed from the data: each such element's two possible roundings, times |W2| and the
routing weight; see _mlp_tolerance).
"""

import ml_dtypes
import numpy as np
import pytest

import lowbit

from moe_gpu_common import (ACT, _assert_within_ulps, _check_gemm, _decode_bits, _dev, _host_bits, _indptr,
                            Operands, POISON_NAN, _randn_operands, _reference, _run_checked, _run_cuda,
                            _stored_scales, _uneven_sizes)


# ---------------------------------------------------------------------------------------------
# grouped GEMM: shapes (recipes A and B)

G1000 = [0, 1, 4, 50, 1000, 0, 3, 0]

# (N, K, group sizes, activation, a_scale_layout, b_scale_layout, out dtype, m_indptr dtype, group_pad)
SHAPES = [
    (128, 128, G1000, "e4m3", "blocked128x4", "blocked128x4", "bfloat16", np.int32, "flashinfer"),
    (256, 512, _uneven_sizes(128, 5, seed=1), "e5m2", "row_major", "blocked128x4", "float16", np.int64, "flashinfer"),
    (2880, 2880, [0, 37, 0, 90], "e4m3", "blocked128x4", "blocked128x4", "float16", np.int64, "cumsum"),
    (4096, 4096, [64, 1], "bf16", "blocked128x4", "blocked128x4", "float16", np.int32, "flashinfer"),
    (5760, 2880, [100, 0, 28], "e5m2", "blocked128x4", "row_major", "bfloat16", np.int64, "flashinfer"),
    (128, 4096, [1000, 0, 0, 17, 0, 3], "e5m2", "row_major", "row_major", "float16", np.int32, "flashinfer"),
    (4096, 128, [300], "bf16", "row_major", "row_major", "bfloat16", np.int64, "flashinfer"),
    (256, 2880, [0, 0, 129, 0, 2], "e4m3", "row_major", "row_major", "bfloat16", np.int32, "flashinfer"),
    (5760, 512, _uneven_sizes(16, 40, seed=2), "e4m3", "blocked128x4", "row_major", "float16", np.int64, "flashinfer"),
    (2880, 128, _uneven_sizes(32, 10, seed=3), "bf16", "row_major", "blocked128x4", "float16", np.int32, "flashinfer"),
    (128, 512, [257, 0, 130, 1], "e5m2", "blocked128x4", "blocked128x4", "bfloat16", np.int64, "cumsum"),
]


def _lay(layout):
    return "blk" if layout == "blocked128x4" else "rm"


def _shape_id(c):
    n, k, sizes, act, la, lb, out, ind, pad = c
    a = act if act == "bf16" else f"{act}-a{_lay(la)}"
    return (f"n{n}-k{k}-G{len(sizes)}m{sum(sizes)}-{a}-b{_lay(lb)}-{out}-{np.dtype(ind).name}"
            + ("-cumsum" if pad == "cumsum" else ""))


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("case", SHAPES, ids=[_shape_id(c) for c in SHAPES])
def test_group_gemm_shapes(torch, case, packed):
    n, k, sizes, act, la, lb, out, ind, pad = case
    ops = _randn_operands(sizes, n, k, act, seed=n + 7 * k + len(sizes))
    _check_gemm(torch, ops, a_layout=la, b_layout=lb, out_name=out, pad=pad, ind_dtype=ind, recipe_a=True,
                label=_shape_id(case), packed=packed)


# N a multiple of 8 but not of 64 / 128, K = 32 * odd
ODD = [
    (8, 96, "e4m3", "blocked128x4", "blocked128x4", "bfloat16"),
    (24, 160, "e5m2", "row_major", "blocked128x4", "float16"),
    (200, 96, "bf16", "row_major", "row_major", "bfloat16"),
    (200, 160, "e4m3", "blocked128x4", "row_major", "float16"),
    (8, 32, "e5m2", "blocked128x4", "blocked128x4", "bfloat16"),
    (24, 224, "bf16", "row_major", "blocked128x4", "float16"),
    (136, 416, "e4m3", "row_major", "row_major", "bfloat16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,act,la,lb,out", ODD,
                         ids=[f"n{c[0]}-k{c[1]}-{c[2]}-a{_lay(c[3])}-b{_lay(c[4])}-{c[5]}" for c in ODD])
@pytest.mark.parametrize("ind_dtype", [np.int32, np.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_group_gemm_odd_shapes(torch, n, k, act, la, lb, out, ind_dtype, packed):
    ops = _randn_operands([3, 0, 129, 1, 0, 60], n, k, act, seed=n * 3 + k)
    _check_gemm(torch, ops, a_layout=la, b_layout=lb, out_name=out, ind_dtype=ind_dtype, recipe_a=True,
                label=f"n{n} k{k} {act} {out}", packed=packed)


# ---------------------------------------------------------------------------------------------
# grouped GEMM: special scales and codes (recipe B), built from raw bytes

SPECIAL_SIZES = [0, 5, 130, 0, 33, 1]


def _special_operands(kind, act, N=256, K=512, sizes=SPECIAL_SIZES, seed=11):
    """Operands whose scale bytes are written directly.

    w_high: weight scales 130..199 in every K block; w_high_mixed: in every other K block (the
    others 124..128); w_low: weight scales 0..5; a_low: activation scales 0..2 (E4M3) / 0..9
    (E5M2); nan: scale 255 in a few activation rows / weight rows, and in the whole expert of an
    empty group; a_span: activation scales over 0..240 (E4M3) / 0..229 (E5M2) mixed within every
    row (K = 8192), so each row is shifted into bf16's range by the pre-pass. Codes are
    FLOOR-quantized randn; the activation side (scale byte or bf16 exponent) compensates the
    weight scale of each K block, so every block contributes to the sums and every intermediate
    stays a finite, exact fp32 (the reference's A and B elements)."""
    if kind == "a_span":
        K = 8192
    ops = _randn_operands(sizes, N, K, act, seed)
    rng = np.random.default_rng(seed + 1)
    Kb = K // 32
    m = np.arange(ops.M)[:, None]
    n = np.arange(N)[None, :, None]
    if kind in ("w_high", "w_high_mixed", "w_low"):
        if kind == "w_low":
            base = rng.integers(0, 4, size=Kb)  # weight scale bytes 0..5 with the n % 3 below
            t = {"e4m3": -16, "e5m2": -24, "bf16": -8}[act]
        else:
            base = rng.integers(130, 198, size=Kb)  # 130..197: bytes 130..199 with the n % 3 below
            if kind == "w_high_mixed":
                base[0::2] = rng.integers(124, 127, size=(Kb + 1) // 2)
            t = {"e4m3": -8, "e5m2": -16, "bf16": -8}[act]
        ops.b_sc = (base[None, None, :] + n % 3 + np.zeros((ops.G, 1, 1), np.int64)).astype(np.uint8)
        # activation exponent per (row, K block): (sa - 127) + (sb - 127) = t + m % 4 + n % 3
        a_exp = t + 127 - base[None, :] + m % 4
        if act == "bf16":
            x = ops.a.astype(np.float32) * np.repeat(np.ldexp(np.float32(1), a_exp), 32, axis=1)
            ops.a = x.astype(ml_dtypes.bfloat16)
        else:
            ops.a_sc = (a_exp + 127).astype(np.uint8)
    elif kind == "a_low":
        assert act != "bf16"
        top = 3 if act == "e4m3" else 10
        abase = np.arange(Kb) % top
        ops.a_sc = np.broadcast_to(abase[None, :], (ops.M, Kb)).astype(np.uint8).copy()
        t = -12 if act == "e4m3" else -20
        ops.b_sc = (254 + t - abase[None, None, :] + n % 3 + np.zeros((ops.G, 1, 1), np.int64)).astype(np.uint8)
    elif kind == "a_span":
        assert act != "bf16"
        top, t = (240, -12) if act == "e4m3" else (229, -20)
        abase = rng.permutation(np.arange(Kb) % (top + 1))
        ops.a_sc = (abase[None, :] + np.zeros((ops.M, 1), np.int64)).astype(np.uint8)
        ops.b_sc = (254 + t - abase[None, None, :] + n % 3 + np.zeros((ops.G, 1, 1), np.int64)).astype(np.uint8)
    elif kind == "w_top":
        # weight scale bytes 253 / 254 in K block 3 of a quarter of the rows, with every code: the
        # elements of 2^128 or more are +-Inf (the fp32 decode's rule) on both sides; the activations
        # of that block are small, so the finite products of those rows stay moderate
        ops.b_sc[:, 1::4, 3] = np.where(np.arange(1, N, 4) % 8 == 1, 253, 254)[None, :]
        if act == "bf16":
            a = ops.a.astype(np.float32)
            a[:, 96:128] = np.ldexp(a[:, 96:128], -110)
            ops.a = a.astype(ml_dtypes.bfloat16)
        else:
            ops.a_sc[:, 3] = 17
    elif kind == "a_overflow":
        # E4M3 rows 2 and M - 1: scale bytes 0 (block 0) and 250 (block 1) with an element 4 in block
        # 1: 2^125, finite, but 2^128 after the pre-pass's shift by 2^3; the weights of block 1 are
        # small so the products stay finite: the rows take the exact recomputation
        assert act == "e4m3"
        for r in (2, ops.M - 1):
            ops.a_sc[r, 0] = 0
            ops.a_sc[r, 1] = 250
            ops.a[r, 32:64] = np.clip(ops.a[r, 32:64].astype(np.float32), -4, 4).astype(ops.a.dtype)
            ops.a[r, 32 + 5] = 4.0
        ops.b_sc[:, :, 1] = 5
    elif kind == "nan":
        if ops.a_sc is not None:
            for r in (0, 7, ops.M - 1):
                ops.a_sc[r, rng.integers(0, Kb)] = 255
        for g in range(ops.G):
            if ops.ind[g + 1] > ops.ind[g]:
                for r in rng.choice(N, size=3, replace=False):
                    ops.b_sc[g, r, rng.integers(0, Kb)] = 255
            else:
                ops.b_sc[g] = 255
    else:
        raise AssertionError(kind)
    return ops


SPECIAL = [
    ("w_high", "e4m3", "blocked128x4", "blocked128x4", "bfloat16"),
    ("w_high", "e5m2", "row_major", "blocked128x4", "float16"),
    ("w_high", "bf16", "row_major", "row_major", "bfloat16"),
    ("w_high_mixed", "e4m3", "row_major", "row_major", "float16"),
    ("w_high_mixed", "e5m2", "blocked128x4", "row_major", "bfloat16"),
    ("w_low", "e4m3", "blocked128x4", "row_major", "bfloat16"),
    ("w_low", "e5m2", "blocked128x4", "blocked128x4", "float16"),
    ("w_low", "bf16", "row_major", "blocked128x4", "float16"),
    ("a_low", "e4m3", "blocked128x4", "blocked128x4", "bfloat16"),
    ("a_low", "e4m3", "row_major", "row_major", "float16"),
    ("a_low", "e5m2", "blocked128x4", "row_major", "bfloat16"),
    ("a_low", "e5m2", "row_major", "blocked128x4", "float16"),
    ("a_span", "e4m3", "blocked128x4", "row_major", "bfloat16"),
    ("a_span", "e5m2", "row_major", "blocked128x4", "float16"),
    ("w_top", "bf16", "row_major", "row_major", "bfloat16"),
    ("w_top", "e4m3", "blocked128x4", "row_major", "float16"),
    ("a_overflow", "e4m3", "row_major", "row_major", "bfloat16"),
    ("a_overflow", "e4m3", "blocked128x4", "blocked128x4", "float16"),
    ("nan", "e4m3", "blocked128x4", "blocked128x4", "bfloat16"),
    ("nan", "e5m2", "row_major", "row_major", "float16"),
    ("nan", "bf16", "row_major", "blocked128x4", "bfloat16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kind,act,la,lb,out", SPECIAL,
                         ids=[f"{c[0]}-{c[1]}-a{_lay(c[2])}-b{_lay(c[3])}-{c[4]}" for c in SPECIAL])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_group_gemm_special_scales(torch, kind, act, la, lb, out, packed):
    ops = _special_operands(kind, act)
    # the scale bytes are in the ranges the case is about
    if kind in ("w_high", "w_high_mixed"):
        assert ops.b_sc.max() >= 130 and (kind == "w_high_mixed" or ops.b_sc.min() >= 130)
    elif kind == "w_low":
        assert ops.b_sc.max() <= 5 and ops.b_sc.min() == 0
    elif kind == "a_low":
        assert ops.a_sc.max() == (2 if act == "e4m3" else 9)
    elif kind == "a_span":
        assert ops.a_sc.min() == 0 and ops.a_sc.max() >= 229
    got, ref = _check_gemm(torch, ops, a_layout=la, b_layout=lb, out_name=out, ind_dtype=np.int64,
                           label=f"{kind} {act} {out}", packed=packed)
    finite = np.isfinite(ref)
    assert np.count_nonzero(ref[finite]) > 0.9 * finite.sum(), "the case is degenerate: mostly zero outputs"
    if kind == "nan":
        assert np.isnan(ref).any() and finite.any()
    if kind == "w_top":
        assert (~finite).any() and finite.any(), "the case needs elements of 2^128 and finite rows"
    if kind == "a_overflow":
        assert finite[[2, ops.M - 1]].all(), "the shifted rows' exact results are finite"



def _full_range_operands(act, N=256, K=8192, sizes=(0, 5, 130, 0, 33, 1), seed=17):
    """Weight scale bytes over the whole finite range [0, 254], mixed within every row's K loop
    (a permutation of 0..252 over the 256 K blocks, plus 0..2 by row) and across the rows of a
    tile (rows n and n + 1 differ). The activation side compensates each K block's weight scale
    (bf16 exponent, or MXFP8 scale byte kept where bf16 holds the element exactly), so every
    block contributes a finite, exact fp32 product."""
    ops = _randn_operands(list(sizes), N, K, act, seed)
    rng = np.random.default_rng(seed + 1)
    Kb = K // 32
    base = rng.permutation(np.arange(Kb) % 253)
    n = np.arange(N)[None, :, None]
    ops.b_sc = (base[None, None, :] + n % 3 + np.zeros((ops.G, 1, 1), np.int64)).astype(np.uint8)
    # bytes 253 / 254: magnitudes up to 3 / 1.5 (codes 5 / 3), so that every weight element is a
    # finite fp32 (the reference decodes elements one by one)
    top = np.repeat(np.where(ops.b_sc == 254, 3, np.where(ops.b_sc == 253, 5, 7)), 16, axis=2).astype(np.uint8)
    lo_n, hi_n = ops.b & 0x0F, ops.b >> 4
    lo_n = (lo_n & 8) | np.minimum(lo_n & 7, top)
    hi_n = (hi_n & 8) | np.minimum(hi_n & 7, top)
    ops.b = (lo_n | (hi_n << 4)).astype(np.uint8)
    m = np.arange(ops.M)[:, None]
    t = {"e4m3": -8, "e5m2": -16, "bf16": -8}[act]  # e5m2 codes reach 2^15: keep fp16 outputs finite
    a_exp = t - (base[None, :] - 127) + m % 4  # scale exponents of a and b add up to t + m % 4 + n % 3
    if act == "bf16":
        x = ops.a.astype(np.float32) * np.repeat(np.ldexp(np.float32(1), a_exp), 32, axis=1)
        ops.a = x.astype(ml_dtypes.bfloat16)
    else:
        # bf16-exact at or above lo; every element a finite fp32 at or below hi
        lo, hi = (3, 246) if act == "e4m3" else (10, 239)
        ops.a_sc = np.clip(a_exp + 127, lo, hi).astype(np.uint8)
    return ops


FULL_RANGE = [  # bf16 outputs: E5M2 scale bytes stop at 10, so its top weight blocks give sums beyond fp16
    ("e4m3", "blocked128x4", "row_major", "bfloat16"),
    ("e5m2", "row_major", "blocked128x4", "bfloat16"),
    ("bf16", "row_major", "row_major", "bfloat16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("act,la,lb,out", FULL_RANGE, ids=[f"{c[0]}-a{_lay(c[1])}-b{_lay(c[2])}-{c[3]}" for c in FULL_RANGE])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_group_gemm_full_weight_scale_range(torch, act, la, lb, out, packed):
    """Every finite weight scale byte (0..254, mixed within one tile and one K loop) gives the
    reference's result on the tensor-core path (recipe B)."""
    ops = _full_range_operands(act)
    assert ops.b_sc.min() == 0 and ops.b_sc.max() == 254
    got, ref = _check_gemm(torch, ops, a_layout=la, b_layout=lb, out_name=out, ind_dtype=np.int64,
                           label=f"full range {act} {out}", packed=packed)
    finite = np.isfinite(ref)
    assert finite.all() and np.count_nonzero(ref) > 0.9 * ref.size


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [[0, 2, 100000], [0, -7, 5], [0, 5, 3], [7, 3, 2**31 - 1], [-2**31, 0, 5]],
                         ids=["past-end", "negative", "non-monotonic", "huge", "int-min"])
@pytest.mark.parametrize("act", ["e4m3", "bf16"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_group_gemm_hostile_device_m_indptr(torch, bad, act, packed):
    """A device m_indptr is not validated (no host sync), but the kernels clamp it: a wrong one
    gives wrong rows, never an access outside the buffers (checked under compute-sanitizer) nor a
    failed launch; the context stays usable and the next correct call is exact."""
    ops = _randn_operands([2, 3], 256, 512, act, seed=5)
    la = "blocked128x4" if act != "bf16" else "row_major"
    a_st, b_st = _stored_scales(ops, la, "row_major", "flashinfer")
    a = _dev(torch, ops.a)
    a_scale = None if a_st is None else _dev(torch, a_st)
    b, b_scale = _dev(torch, ops.b), _dev(torch, b_st)
    if packed:
        b, b_scale = lowbit.group_gemm_mxfp4_prepack(b, b_scale, b_scale_layout="row_major")
    ind = torch.tensor(bad, dtype=torch.int32, device="cuda")
    out = torch.empty((ops.M, ops.N), dtype=torch.bfloat16, device="cuda")
    lowbit.group_gemm_mxfp4_nt_groupwise(a, b, a_scale, b_scale, ind, "bfloat16", a_scale_layout=la,
                                         b_scale_layout="row_major", out=out, b_packed=packed)
    torch.cuda.synchronize()
    # the context survived: a correct call right after is exact
    ref = _reference(ops, a_st, b_st, la, "row_major", "flashinfer", "bfloat16", np.int32)

    def run(poison):
        return _run_cuda(torch, ops, a_st, b_st, la, "row_major", "flashinfer", "bfloat16", np.int32, poison,
                         packed=packed)

    got = _run_checked(run, ref, ops, "bfloat16", "after a hostile m_indptr")
    _assert_within_ulps(got, ref, ops, "bfloat16", "after a hostile m_indptr")


def _all_codes_operands(act, sizes, N, K, seed, nonfinite=False):
    """a with every finite code of its format (bf16: every sign / mantissa pattern over a band of
    exponents, subnormals and zeros), b with every E2M1 code in both nibbles; scale bytes random
    in a band that keeps the sums finite in fp16. nonfinite: a few rows also hold NaN / +-Inf
    codes (one NaN; one +Inf; one -Inf; +Inf and -Inf in one row)."""
    rng = np.random.default_rng(seed)
    ind = _indptr(sizes)
    M, G, Kb = int(ind[-1]), len(sizes), K // 32
    if act == "bf16":
        mant = rng.integers(0, 1 << 7, size=(M, K))
        exp = rng.integers(112, 136, size=(M, K))
        exp[rng.random((M, K)) < 0.05] = 0  # zeros and subnormals
        bits = (rng.integers(0, 2, size=(M, K)) << 15) | (exp << 7) | mant
        bits.flat[:256] = (np.arange(256) % 2) << 15 | (np.arange(256) // 2)  # zero and all subnormal mantissas
        a = bits.astype(np.uint16).view(ml_dtypes.bfloat16)
        a_sc = None
    else:
        dt = ACT[act][0]
        codes = np.arange(256, dtype=np.uint8)
        finite = codes[np.isfinite(codes.view(dt).astype(np.float32))]
        a_bytes = rng.choice(finite, size=(M, K)).astype(np.uint8)
        a_bytes.flat[:finite.size] = finite
        a = a_bytes.view(dt)
        lo, hi = (110, 119) if act == "e4m3" else (100, 108)
        a_sc = rng.integers(lo, hi + 1, size=(M, Kb)).astype(np.uint8)
    b = rng.integers(0, 256, size=(G, N, K // 2)).astype(np.uint8)
    b.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    b_sc = rng.integers(120, 131, size=(G, N, Kb)).astype(np.uint8)
    if nonfinite:
        rows = rng.choice(M, size=4, replace=False)
        if act == "bf16":
            nan, pinf, ninf = 0x7FC1, 0x7F80, 0xFF80
            a16 = a.view(np.uint16)
        else:
            nan = 0x7F if act == "e4m3" else 0x7E
            pinf, ninf = (0x7C, 0xFC) if act == "e5m2" else (0x7F, 0xFF)  # E4M3 has no Inf: NaN codes
            a16 = a.view(np.uint8)
        a16[rows[0], 5] = nan
        a16[rows[1], K - 1] = pinf
        a16[rows[2], K // 2] = ninf
        a16[rows[3], 3], a16[rows[3], K - 3] = pinf, ninf
    return Operands(a, a_sc, b, b_sc, ind, act)


ALL_CODES = [
    ("e4m3", "blocked128x4", "blocked128x4", "bfloat16"),
    ("e4m3", "row_major", "row_major", "float16"),
    ("e5m2", "blocked128x4", "row_major", "bfloat16"),
    ("e5m2", "row_major", "blocked128x4", "float16"),
    ("bf16", "row_major", "blocked128x4", "bfloat16"),
    ("bf16", "row_major", "row_major", "float16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("act,la,lb,out", ALL_CODES,
                         ids=[f"{c[0]}-a{_lay(c[1])}-b{_lay(c[2])}-{c[3]}" for c in ALL_CODES])
def test_group_gemm_all_codes(torch, act, la, lb, out):
    ops = _all_codes_operands(act, [0, 70, 0, 200, 3], N=136, K=256, seed=21)
    b_nibbles = np.concatenate([(ops.b & 0xF).ravel(), (ops.b >> 4).ravel()])
    assert np.unique(b_nibbles).size == 16
    _check_gemm(torch, ops, a_layout=la, b_layout=lb, out_name=out, ind_dtype=np.int32, label=f"all codes {act} {out}")


@pytest.mark.gpu
@pytest.mark.parametrize("act,out", [("e4m3", "bfloat16"), ("e5m2", "float16"), ("bf16", "bfloat16")])
def test_group_gemm_nonfinite_activation_codes(torch, act, out):
    ops = _all_codes_operands(act, [40, 0, 90], N=64, K=128, seed=23, nonfinite=True)
    got, ref = _check_gemm(torch, ops, a_layout="blocked128x4", b_layout="row_major", out_name=out,
                           label=f"non-finite codes {act} {out}")
    assert np.isnan(ref).any()


@pytest.mark.gpu
@pytest.mark.parametrize("pad", ["flashinfer", "cumsum"])
@pytest.mark.parametrize("act,n,k", [("e4m3", 200, 96), ("e5m2", 24, 160), ("bf16", 136, 224)])
def test_group_gemm_ignores_scale_padding(torch, pad, act, n, k):
    """The padding of the 128x4 blocked scales (rows past each group / N, columns past K/32)
    holds 0xFF (NaN): the kernel must not mix it into any output."""
    ops = _randn_operands([0, 3, 0, 129, 1], n, k, act, seed=31 + n)
    _check_gemm(torch, ops, a_layout="blocked128x4", b_layout="blocked128x4", out_name="bfloat16", pad=pad,
                poison_scale_padding=True, label=f"NaN scale padding {act} {pad}")


@pytest.mark.gpu
def test_group_gemm_many_groups_mostly_empty(torch):
    """128 experts, most of them empty, rows spread over the rest (sizes 0..3)."""
    sizes = _uneven_sizes(128, 3, seed=41, zero_frac=0.7)
    ops = _randn_operands(sizes, 128, 128, "e4m3", seed=42)
    _check_gemm(torch, ops, a_layout="blocked128x4", b_layout="blocked128x4", out_name="bfloat16",
                ind_dtype=np.int64, recipe_a=True, label="128 groups, mostly empty")


# ---------------------------------------------------------------------------------------------
# grouped GEMM: calling conventions

@pytest.mark.gpu
@pytest.mark.parametrize("act", ["e4m3", "bf16"])
def test_group_gemm_no_rows(torch, act):
    """cum_m = 0 (every group empty, e.g. an expert-parallel rank that received no tokens): the
    call succeeds and returns an empty [0, N] output."""
    G, N, K = 4, 256, 128
    ind = torch.zeros(G + 1, dtype=torch.int32, device="cuda")
    b = torch.zeros((G, N, K // 2), dtype=torch.uint8, device="cuda")
    b_scale = torch.full((G, N, K // 32), 127, dtype=torch.uint8, device="cuda")
    if act == "bf16":
        a, a_scale = torch.zeros((0, K), dtype=torch.bfloat16, device="cuda"), None
    else:
        a = torch.zeros((0, K), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        rows, cols = lowbit.scale_shape("mxfp8_e4m3", "blocked128x4", 1, 0, K, groups=G)[1:]
        a_scale = torch.zeros((rows, cols), dtype=torch.uint8, device="cuda")
    out = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, a_scale, b_scale, ind, "bfloat16", b_scale_layout="row_major")
    torch.cuda.synchronize()
    assert out.is_cuda and tuple(out.shape) == (0, N)


@pytest.mark.gpu
def test_group_gemm_torch_dtypes_and_allocated_out(torch):
    """Scales as torch.float8_e8m0fnu and weights as torch.float4_e2m1fn_x2 (where torch has
    them); out=None allocates a CUDA tensor of out_dtype [cum_m, N]."""
    ops = _randn_operands([2, 0, 77], 256, 256, "e4m3", seed=51)
    a_st, b_st = _stored_scales(ops, "blocked128x4", "blocked128x4", "flashinfer")
    ref = _reference(ops, a_st, b_st, "blocked128x4", "blocked128x4", "flashinfer", "float16", np.int32)

    def run(poison):
        return _run_cuda(torch, ops, a_st, b_st, "blocked128x4", "blocked128x4", "flashinfer", "float16", np.int32,
                         poison, typed=True)

    got = _run_checked(run, ref, ops, "float16", "typed inputs")
    _assert_within_ulps(got, ref, ops, "float16", "typed inputs")
    out = lowbit.group_gemm_mxfp4_nt_groupwise(_dev(torch, ops.a), _dev(torch, ops.b), _dev(torch, a_st),
                                               _dev(torch, b_st), _dev(torch, ops.ind.astype(np.int32)), "float16")
    assert out.is_cuda and out.dtype == torch.float16 and tuple(out.shape) == (ops.M, ops.N)
    _assert_within_ulps(_decode_bits(_host_bits(torch, out), "float16"), ref, ops, "float16", "allocated out")


@pytest.mark.gpu
def test_group_gemm_runs_on_the_current_stream(torch):
    """Under a non-default (non-blocking) stream the copies, a sleep kernel, the poison fill, the
    GEMM and the read-back are ordered by that stream only: a GEMM launched on another stream
    runs during the sleep and its output is then overwritten by the poison. A first call warms
    up (module loading, workspace pool) so that the timed call's host overhead stays well under
    the sleep (~0.25 s)."""
    ops = _randn_operands([0, 50, 1, 200, 0], 2880, 512, "e4m3", seed=61)
    a_st, b_st = _stored_scales(ops, "blocked128x4", "blocked128x4", "flashinfer")
    ref = _reference(ops, a_st, b_st, "blocked128x4", "blocked128x4", "flashinfer", "bfloat16", np.int64)
    side = torch.cuda.Stream()
    assert side.cuda_stream != torch.cuda.current_stream().cuda_stream
    with torch.cuda.stream(side):

        def run(poison, sleep_cycles=500_000_000):
            return _run_cuda(torch, ops, a_st, b_st, "blocked128x4", "blocked128x4", "flashinfer", "bfloat16",
                             np.int64, poison, sleep_cycles=sleep_cycles)

        run(POISON_NAN, 0)

        got = _run_checked(run, ref, ops, "bfloat16", "side stream")
    _assert_within_ulps(got, ref, ops, "bfloat16", "side stream")
