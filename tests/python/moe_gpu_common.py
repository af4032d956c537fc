"""Shared pieces of the MoE GPU tests (test_moe_gpu.py, test_moe_gpu_mlp.py): host operands of
the grouped GEMM, running it on CUDA and on the CPU reference, and the comparisons (the rules
are in test_moe_gpu.py's docstring)."""

import ml_dtypes
import numpy as np

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
