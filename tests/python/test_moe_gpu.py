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

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
# activation kind -> (NumPy dtype, MX format name)
ACT = {
    "e4m3": (np.dtype(ml_dtypes.float8_e4m3fn), "mxfp8_e4m3"),
    "e5m2": (np.dtype(ml_dtypes.float8_e5m2), "mxfp8_e5m2"),
    "bf16": (np.dtype(ml_dtypes.bfloat16), None),
}
# output dtype -> (mantissa bits, exponent of the smallest normal)
OUT = {"bfloat16": (7, -126), "float16": (10, -14)}
POISON_NAN = 0x7FFF      # NaN in bf16 and in fp16
POISON_FINITE = 0x3A5A   # finite in both (bf16 ~8.3e-4, fp16 ~0.794)
MAX_ULPS = 1.0
# an element beyond MAX_ULPS passes within SUM_FLOOR * sum_k |a_k b_k| (see _assert_within_ulps);
# 0 gives the pure ulp rule
SUM_FLOOR = 2.0 ** -20
# MLP: bound on an fp32 pre-activation's difference from the reference, relative to the sum of
# the absolute terms of its dot product (see _mlp_tolerance)
MLP_H_REL = 2.0 ** -20


# ---------------------------------------------------------------------------------------------
# host operands

class Operands:
    """One grouped GEMM on the host: a [M, K] (fp8 codes or bf16), a_sc [M, K/32] row-major
    UE8M0 bytes (None for bf16), b [G, N, K/2] packed E2M1, b_sc [G, N, K/32] row-major UE8M0
    bytes, ind [G+1] int64 group boundaries, act the activation kind."""

    def __init__(self, a, a_sc, b, b_sc, ind, act):
        self.a, self.a_sc, self.b, self.b_sc, self.ind, self.act = a, a_sc, b, b_sc, ind, act
        self.M, self.K = int(a.shape[0]), int(a.shape[1])
        self.G, self.N = int(b.shape[0]), int(b.shape[1])
        assert self.ind[-1] == self.M and b.shape[2] * 2 == self.K

    def group_of_rows(self):
        return np.searchsorted(self.ind, np.arange(self.M), side="right") - 1


def _indptr(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _uneven_sizes(G, max_size, seed, zero_frac=0.3):
    """G group sizes in [0, max_size], about zero_frac of them empty, first and last empty."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_size + 1, size=G)
    sizes[rng.random(G) < zero_frac] = 0
    sizes[0] = sizes[-1] = 0
    return [int(s) for s in sizes]


def _randn_operands(sizes, N, K, act, seed):
    """Recipe A operands: a = randn (MXFP8 FLOOR, or bf16), b = randn / sqrt(K) (MXFP4 FLOOR)."""
    rng = np.random.default_rng(seed)
    ind = _indptr(sizes)
    M, G = int(ind[-1]), len(sizes)
    x = rng.standard_normal((M, K), dtype=np.float32)
    w = rng.standard_normal((G, N, K), dtype=np.float32) / np.float32(np.sqrt(K))
    qb = lowbit.quantize(w, "mxfp4", "row_major", rounding="floor")
    if act == "bf16":
        a, a_sc = x.astype(ml_dtypes.bfloat16), None
    else:
        qa = lowbit.quantize(x, ACT[act][1], "row_major", rounding="floor")
        a, a_sc = qa.data, qa.scales.view(np.uint8)
    return Operands(a, a_sc, qb.data, qb.scales.view(np.uint8), ind, act)


def _stored_scales(ops, a_layout, b_layout, pad, poison_padding=False):
    """(a_scale, b_scale) as the op takes them: row-major, or 128x4 blocked (a: grouped with the
    `pad` rule). poison_padding: the padding bytes of the blocked layouts set to 0xFF (NaN)."""

    def blocked(sc, rows, cols, **kw):
        st = lowbit.convert_scale_layout(sc, rows, cols, "row_major", "blocked128x4", **kw)
        if poison_padding:
            used = lowbit.convert_scale_layout(np.ones_like(sc), rows, cols, "row_major", "blocked128x4", **kw)
            st[used == 0] = 0xFF
        return st

    K32 = ops.K // 32
    a_st = None
    if ops.a_sc is not None:
        a_st = ops.a_sc if a_layout == "row_major" else blocked(ops.a_sc, ops.M, K32, m_indptr=ops.ind, group_pad=pad)
    b_st = ops.b_sc if b_layout == "row_major" else blocked(ops.b_sc, ops.N, K32)
    return a_st, b_st


def _e8m0(s):
    s = np.asarray(s, dtype=np.int32)
    return np.where(s == 255, np.float32(np.nan), np.ldexp(np.float32(1), s - 127)).astype(np.float32)


def _dequant_a(ops):
    v = ops.a.astype(np.float32)
    return v if ops.a_sc is None else v * np.repeat(_e8m0(ops.a_sc), 32, axis=1)


def _dequant_b(ops, g):
    b = ops.b[g]
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(ops.N, ops.K)
    return E2M1[codes] * np.repeat(_e8m0(ops.b_sc[g]), 32, axis=1)


# ---------------------------------------------------------------------------------------------
# running and comparing

def _decode_bits(bits, out_name):
    """float64 values of bf16 / fp16 bit patterns (uint16)."""
    bits = np.asarray(bits, dtype=np.uint16)
    if out_name == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.view(np.float16).astype(np.float64)


def _dev(torch, x):
    """A CUDA copy of the host array x on the current stream (fp8 / bf16 as torch's dtypes,
    UE8M0 bytes and packed E2M1 as uint8, integers as they are)."""
    x = np.ascontiguousarray(x)
    if x.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if x.dtype == np.dtype(getattr(ml_dtypes, name)):
            return torch.from_numpy(x.view(np.uint8).copy()).cuda().view(getattr(torch, name))
    if x.dtype.itemsize == 1:
        x = x.view(np.uint8)
    return torch.from_numpy(x.copy()).cuda()


def _host_bits(torch, t):
    """The bit patterns of a bf16 / fp16 tensor as a host uint16 array (syncs the current stream)."""
    return t.view(torch.int16).cpu().numpy().view(np.uint16)


def _reference(ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype):
    """lowbit's CPU reference on the host operands: float64 values of its out_name output."""
    out = lowbit.group_gemm_mxfp4_nt_groupwise(ops.a, ops.b, a_st, b_st, ops.ind.astype(ind_dtype), out_name,
                                               a_scale_layout=a_layout, b_scale_layout=b_layout, group_pad=pad)
    assert out.shape == (ops.M, ops.N)
    return _decode_bits(np.ascontiguousarray(out).view(np.uint16), out_name)


def _run_cuda(torch, ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype, poison, typed=False,
              sleep_cycles=0, packed=False):
    """The CUDA op on device copies of the operands (m_indptr on the device too), into an output
    filled with the `poison` bit pattern, everything on the current stream; returns the output's
    bits (host uint16 [M, N]). sleep_cycles: a sleep kernel queued before the poison fill.
    packed: the weights go through group_gemm_mxfp4_prepack on the device first (b_packed=True)."""
    a = _dev(torch, ops.a)
    a_scale = None if a_st is None else _dev(torch, a_st)
    b = _dev(torch, ops.b)
    b_scale = _dev(torch, b_st)
    if typed:  # torch's own dtypes for the scale and fp4 bytes, where this torch has them
        if hasattr(torch, "float8_e8m0fnu"):
            b_scale = b_scale.view(torch.float8_e8m0fnu)
            a_scale = None if a_scale is None else a_scale.view(torch.float8_e8m0fnu)
        if hasattr(torch, "float4_e2m1fn_x2"):
            b = b.view(torch.float4_e2m1fn_x2)
    ind = _dev(torch, ops.ind.astype(ind_dtype))
    out = torch.empty((ops.M, ops.N), dtype=getattr(torch, out_name), device="cuda")
    if packed:
        b, b_scale = lowbit.group_gemm_mxfp4_prepack(b, b_scale, b_scale_layout=b_layout)
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    out.view(torch.int16).fill_(poison)
    res = lowbit.group_gemm_mxfp4_nt_groupwise(a, b, a_scale, b_scale, ind, out_name, a_scale_layout=a_layout,
                                               b_scale_layout=b_layout, group_pad=pad, out=out, b_packed=packed)
    assert res is out
    return _host_bits(torch, out)


def _ulp(ref, out_name):
    """Spacing of the output dtype at |ref| (the subnormal spacing below the smallest normal)."""
    p, emin = OUT[out_name]
    r = np.abs(ref)
    e = np.frexp(np.where(np.isfinite(r) & (r > 0), r, 1.0))[1] - 1
    e = np.where(np.isfinite(r) & (r > 0), np.maximum(e, emin), emin)
    return np.ldexp(1.0, e - p)


def _where(ops, i):
    m, n = divmod(int(i), ops.N)
    return f"row {m} (group {int(ops.group_of_rows()[m])}), col {n}"


def _abs_term_sums(ops, flat_idx):
    """sum_k |A[m, k] B[g, n, k]| (float64) at the given flat output positions."""
    A = np.abs(_dequant_a(ops).astype(np.float64))
    m, n = np.divmod(np.asarray(flat_idx), ops.N)
    g = ops.group_of_rows()[m]
    out = np.empty(m.size)
    for gg in np.unique(g):
        sel = g == gg
        B = np.abs(_dequant_b(ops, gg).astype(np.float64))
        out[sel] = np.einsum("ik,ik->i", A[m[sel]], B[n[sel]])
    return out


def _assert_within_ulps(got, ref, ops, out_name, label, max_ulps=MAX_ULPS):
    """Recipe B: |got - ref| <= max_ulps ulps of out_name at ref. An element beyond that passes
    only within SUM_FLOOR * sum_k |a_k b_k| (the resolution of an fp32 sum of those terms, which
    the output spacing undercuts where the sum cancels, e.g. fp16 subnormal results); the message
    counts such elements separately."""
    nan_r, nan_g = np.isnan(ref), np.isnan(got)
    if (nan_r != nan_g).any():
        bad = np.flatnonzero((nan_r != nan_g).ravel())
        i = bad[0]
        raise AssertionError(f"{label}: NaN positions differ at {bad.size} elements (reference NaN at {nan_r.sum()}, "
                             f"output NaN at {nan_g.sum()}); first at {_where(ops, i)}: got {got.flat[i]!r}, "
                             f"want {ref.flat[i]!r}")
    inf_r = np.isinf(ref)
    if (got[inf_r] != ref[inf_r]).any():
        i = np.flatnonzero((inf_r & (got != ref)).ravel())[0]
        raise AssertionError(f"{label}: infinite reference not matched at {_where(ops, i)}: got {got.flat[i]!r}, "
                             f"want {ref.flat[i]!r}")
    fin = np.isfinite(ref)
    err = np.zeros(ref.shape)
    err[fin] = np.abs(got[fin] - ref[fin]) / _ulp(ref[fin], out_name)
    worst = float(err.max()) if err.size else 0.0
    i = int(err.argmax()) if err.size else 0
    over = np.flatnonzero(err.ravel() > max_ulps)
    bad = over
    if over.size and SUM_FLOOR > 0:
        floor = SUM_FLOOR * _abs_term_sums(ops, over)
        bad = over[~(np.abs(got.flat[over] - ref.flat[over]) <= floor)]
    msg = (f"{label}: worst error {worst:.3g} ulps of {out_name} at {_where(ops, i)} (got {got.flat[i]!r}, reference "
           f"{ref.flat[i]!r}); {over.size} of {err.size} elements beyond {max_ulps:g} ulp, "
           f"{over.size - bad.size} of them within the fp32 sum floor {SUM_FLOOR:.3g} * sum|a b|")
    if bad.size:
        j = int(bad[np.argmax(err.flat[bad])])
        raise AssertionError(f"{msg}; {bad.size} elements fail, worst at {_where(ops, j)}: {err.flat[j]:.3g} ulps "
                             f"(got {got.flat[j]!r}, reference {ref.flat[j]!r})")
    print(msg)


def _run_checked(run, ref, ops, out_name, label):
    """Runs `run(poison)` with NaN poison (and with a finite poison when the reference has NaNs)
    and checks that every element was written. Returns the output values (float64)."""
    bits = run(POISON_NAN)
    nan_r = np.isnan(ref)
    stale = (bits == POISON_NAN) & ~nan_r
    assert not stale.any(), (f"{label}: {int(stale.sum())} of {stale.size} elements still hold the poison bits "
                             f"0x{POISON_NAN:04X} where the reference is not NaN (never written, or NaN written); "
                             f"first at {_where(ops, np.flatnonzero(stale.ravel())[0])}")
    got = _decode_bits(bits, out_name)
    if nan_r.any():
        got2 = _decode_bits(run(POISON_FINITE), out_name)
        missing = nan_r & ~np.isnan(got2)
        first = np.flatnonzero(missing.ravel())[:1]
        assert not missing.any(), (f"{label}: {int(missing.sum())} elements whose reference is NaN are not NaN after "
                                   f"a run with finite poison; first at {_where(ops, first[0]) if first.size else ''}")
    return got


def _check_recipe_a(got, ops, out_name, label):
    """FlashInfer's rule: fp32 dequantize-then-matmul, cast to the output dtype, atol = rtol = 1e-2."""
    A = _dequant_a(ops)
    ref = np.zeros((ops.M, ops.N), dtype=np.float32)
    for g in range(ops.G):
        r0, r1 = int(ops.ind[g]), int(ops.ind[g + 1])
        if r1 > r0:
            ref[r0:r1] = A[r0:r1] @ _dequant_b(ops, g).T
    ref = ref.astype(ml_dtypes.bfloat16 if out_name == "bfloat16" else np.float16).astype(np.float64)
    bad = ~(np.abs(got - ref) <= 1e-2 + 1e-2 * np.abs(ref))
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise AssertionError(f"{label}: recipe A: {int(bad.sum())} of {bad.size} elements outside atol = rtol = 1e-2 "
                             f"of the fp32 dequantize-then-matmul; first at {_where(ops, i)}: got {got.flat[i]!r}, "
                             f"want {ref.flat[i]!r}")


def _check_gemm(torch, ops, *, a_layout, b_layout, out_name, pad="flashinfer", ind_dtype=np.int32, recipe_a=False,
                poison_scale_padding=False, typed=False, label="", packed=False):
    a_st, b_st = _stored_scales(ops, a_layout, b_layout, pad, poison_scale_padding)
    ref = _reference(ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype)

    def run(poison):
        return _run_cuda(torch, ops, a_st, b_st, a_layout, b_layout, pad, out_name, ind_dtype, poison, typed,
                         packed=packed)

    got = _run_checked(run, ref, ops, out_name, label)
    _assert_within_ulps(got, ref, ops, out_name, label)
    if recipe_a:
        _check_recipe_a(got, ops, out_name, label)
    return got, ref


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
