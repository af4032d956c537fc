"""Independent NumPy decoders and checks of the fuzzer (fuzzlib.py): scale layouts, codes, the
round-trip bound; and the random inputs and storage variants (strided, misaligned, read-only)."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from fuzzlib_core import BF16, E2M1, E4M3, E5M2, E8M0, FORMAT_INFO, NF4


# ---------------------------------------------------------------------------------------------
# Independent decoders (NumPy, float64) for the checks

def round_up(a, m):
    return (a + m - 1) // m * m


def stored_dims(layout, R, C, row_align=1):
    if layout == "row_major":
        return R, C
    if layout == "col_major":
        return C, round_up(R, row_align)
    if layout == "blocked128x4":
        return round_up(R, 128), round_up(C, 4)
    return round_up(R, 8), round_up(C, 4)


def layout_offsets(layout, R, C, row_align=1):
    """Flat offsets [R, C] of (r, c) in one stored matrix."""
    r, c = np.meshgrid(np.arange(R, dtype=np.int64), np.arange(C, dtype=np.int64), indexing="ij")
    Rp, Cp = stored_dims(layout, R, C, row_align)
    if layout == "row_major":
        return r * C + c
    if layout == "col_major":
        return c * Cp + r
    cp4 = round_up(C, 4) // 4
    if layout == "blocked128x4":
        return ((r // 128) * cp4 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return (r // 8) * cp4 * 32 + (c // 4) * 32 + (r % 8) * 4 + c % 4


def unlayout(stored, layout, R, C, row_align=1):
    """Row-major [L?, R, C] from stored scale matrices, read by index (whatever the strides)."""
    st = np.asarray(stored)
    lead = st.shape[:-2] if st.ndim >= 2 else ()
    L = int(np.prod(lead)) if lead else 1
    Rp, Cp = stored_dims(layout, R, C, row_align)
    flat = np.array(st).reshape(L, Rp * Cp)
    off = layout_offsets(layout, R, C, row_align)
    return flat[:, off].reshape(lead + (R, C)) if lead else flat[0, off]


def to_layout(s, layout, row_align=1):
    """Stored matrix of a row-major [R, C] (zero padding)."""
    R, C = s.shape
    Rp, Cp = stored_dims(layout, R, C, row_align)
    flat = np.zeros(Rp * Cp, dtype=s.dtype)
    flat[layout_offsets(layout, R, C, row_align)] = s
    return flat.reshape(Rp, Cp)


def grouped_to_layout(s, ind, rule):
    R, C = s.shape
    G = len(ind) - 1
    rows = (R + G * 127) // 128 * 128 if rule == "flashinfer" else round_up(R + G * 127, 128)
    big = np.zeros((max(rows, 1), C), dtype=s.dtype)
    for g in range(G):
        if rule == "flashinfer":
            start = (int(ind[g]) + g * 127) // 128 * 128
        else:
            start = sum(round_up(int(ind[i + 1]) - int(ind[i]), 128) for i in range(g))
        big[start:start + int(ind[g + 1]) - int(ind[g])] = s[int(ind[g]):int(ind[g + 1])]
    return to_layout(big, "blocked128x4")[:rows]


def grouped_unlayout(stored, ind, rule, R, C):
    st = np.array(stored)
    Rp = st.shape[-2]
    if st.size == 0 or R == 0:
        return np.zeros((R, C), dtype=st.dtype)
    full = unlayout(st.reshape(Rp, -1), "blocked128x4", Rp, C)
    out = np.zeros((R, C), dtype=st.dtype)
    G = len(ind) - 1
    for g in range(G):
        if rule == "flashinfer":
            start = (int(ind[g]) + g * 127) // 128 * 128
        else:
            start = sum(round_up(int(ind[i + 1]) - int(ind[i]), 128) for i in range(g))
        out[int(ind[g]):int(ind[g + 1])] = full[start:start + int(ind[g + 1]) - int(ind[g])]
    return out


def unpack(codes, high_first=False):
    c = np.asarray(codes).view(np.uint8) if np.asarray(codes).dtype.itemsize == 1 else np.asarray(codes)
    lo, hi = c & 0xF, c >> 4
    if high_first:
        lo, hi = hi, lo
    return np.stack([lo, hi], axis=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],))


def scale_values(s, scale_dtype):
    s = np.asarray(s)
    if scale_dtype == "float32":
        return s.astype(np.float64)
    b = s.view(np.uint8).astype(np.int64)
    if scale_dtype == "float8_e8m0fnu":
        v = np.ldexp(1.0, b - 127)
        return np.where(b == 255, np.nan, v)
    return s.view(E4M3).astype(np.float64)


def element_values(qt):
    """float64 element values (before scaling) [.., K] and the zero points of a Quantized."""
    f = qt.format
    elem = FORMAT_INFO[f.name][0]
    d = np.asarray(qt.data)
    if elem in ("e4m3", "e5m2"):
        return d.view(E4M3 if elem == "e4m3" else E5M2).astype(np.float64)
    c = unpack(d, f.nibble_order == "high").astype(np.int64)
    if elem == "e2m1":
        return E2M1[c]
    if elem == "int4":
        return np.where(c >= 8, c - 16, c).astype(np.float64)
    if elem == "nf4":
        return NF4[c]
    return c.astype(np.float64)  # uint4: q, zero point subtracted by the caller


def decode(qt):
    """float64 [L?, M, K] values of a Quantized, read by index (the lowbit.dequantize formulas)."""
    f = qt.format
    shape = tuple(qt.shape)
    L = shape[0] if len(shape) == 3 else None
    M, K = shape[-2], shape[-1]
    C = K // f.block
    q = element_values(qt).reshape(shape)

    def rm(a):
        if a is None:
            return None
        if qt.m_indptr is not None:
            return grouped_unlayout(a, np.asarray(qt.m_indptr), qt.group_pad or "flashinfer", M, C)
        return unlayout(a, qt.layout, M, C, qt.row_align)

    s = scale_values(rm(qt.scales), f.scale_dtype)
    if qt.zeros is not None:
        q = q - np.repeat(rm(qt.zeros).astype(np.float64), f.block, axis=-1)
    v = q * np.repeat(s, f.block, axis=-1)
    if f.name == "nvfp4" and qt.global_amax is not None:
        g = np.float32(np.asarray(qt.global_amax, dtype=np.float32).reshape(-1)[0])
        v = v * (np.float64(g) / 2688.0)
    return v.reshape(shape) if L is not None or True else v


def compare(got, want, rtol, what, atol=0.0):
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    g = got.astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    bad = ~((np.abs(g - w) <= atol + rtol * np.abs(w)) | (np.isnan(g) & np.isnan(w)) | (g == w))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"{what}: {int(bad.sum())} of {bad.size} differ; first at {idx}: got {g[idx]!r}, expected {w[idx]!r}"
    return None


def same_bytes(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    gb = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    wb = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    if gb.size != wb.size:
        return f"{what}: {gb.size} bytes, expected {wb.size}"
    bad = gb != wb
    if bad.any():
        i = int(np.argmax(bad))
        return f"{what}: {int(bad.sum())} of {bad.size} bytes differ; first at byte {i}: {gb[i]} vs {wb[i]}"
    return None


def out_tolerance(dtype_name):
    return {"float32": 2.0 ** -20, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float8_e4m3fn": 2.0 ** -3,
            "float8_e5m2": 2.0 ** -2}.get(dtype_name, 2.0 ** -20)


def _round_to(v, dtype_name):
    """float64 values as the out dtype rounds them (saturating 8-bit)."""
    with np.errstate(all="ignore"):
        if dtype_name == "float8_e4m3fn":
            return np.clip(v, -448, 448).astype(E4M3).astype(np.float64)
        if dtype_name == "float8_e5m2":
            return np.clip(v, -57344, 57344).astype(E5M2).astype(np.float64)
        return v.astype(np.float32).astype({"float32": np.float32, "float16": np.float16,
                                            "bfloat16": BF16}[dtype_name]).astype(np.float64)


def check_dequantized(res, qt, out_dtype):
    want = decode(qt)
    return compare(res, _round_to(want, out_dtype), out_tolerance(out_dtype), "dequantize", atol=1e-30)


def quant_error_bound(f, x):
    """Per element bound on |dequantize(quantize(x)) - x| (loose; finite blocks of x)."""
    xf = np.asarray(x, dtype=np.float64)
    xb = xf.reshape(xf.shape[:-1] + (xf.shape[-1] // f.block, f.block))
    amax = np.max(np.abs(xb), axis=-1)
    frac = {"e4m3": 2.0 ** -3, "e5m2": 2.0 ** -2, "e2m1": 0.5, "int4": 0.1, "uint4": 0.1, "nf4": 0.2}
    b = amax * frac[FORMAT_INFO[f.name][0]] + 1e-30
    if f.scale_dtype != "float32" and f.name.startswith(("fp8", "int4")):
        b = b * 2  # UE8M0 scales are rounded up to a power of two
    return np.repeat(b, f.block, axis=-1).reshape(xf.shape)


def check_roundtrip(x, qt):
    """The decoded values of a quantization of finite x are finite and within the bound."""
    import lowbit

    xf = np.asarray(x, dtype=np.float64)
    if not np.isfinite(xf).all():
        return None
    y = np.asarray(lowbit.dequantize(qt, "float32"), dtype=np.float64)
    if y.shape != xf.shape:
        return ("wrong_result", f"dequantize shape {y.shape}, expected {xf.shape}")
    if not np.isfinite(y).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(y))[0])
        return ("precision_loss", f"{qt.format.name}: finite input decodes to {y[idx]} at {idx} (x = {xf[idx]})")
    err = np.abs(y - xf)
    bound = quant_error_bound(qt.format, xf)
    if qt.format.name == "nvfp4" and qt.global_amax is not None:
        g = float(np.asarray(qt.global_amax, np.float32).reshape(-1)[0])
        if np.isfinite(g) and g > 0:
            # docs/formats.md "NaN, Inf and overflow", NVFP4: a given global amax below a block's
            # amax saturates the block scale to 448, so the block decodes to at most
            # 6 * 448 * g / 2688 = g: elements above g are clipped to +-g (by |x| - g, no more)
            bound = bound + np.maximum(np.abs(xf) - g * (1 + 2.0 ** -20), 0.0)
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return ("precision_loss", f"{qt.format.name}: |error| {err[idx]:.3g} > bound {bound[idx]:.3g} at {idx} "
                                  f"(x = {xf[idx]:.4g}, decoded {y[idx]:.4g}; {int(bad.sum())} elements)")
    return None


# ---------------------------------------------------------------------------------------------
# Random inputs

def pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def odd_dim(rng, hi=150):
    return int(pick(rng, [1, 2, 3, 5, 7, 8, 31, 33, 127, 128, 129, int(rng.integers(1, hi + 1))]))


def rand_x(rng, shape, dtype=np.float32, block=None, spread=8):
    """Normal values, each row scaled by 2^e, e uniform in [-spread, spread]."""
    x = rng.standard_normal(shape).astype(np.float32)
    if len(shape):
        x *= np.exp2(rng.integers(-spread, spread + 1, size=tuple(shape[:-1]) + (1,))).astype(np.float32)
    if block and x.size and rng.random() < 0.3:  # an all-zero block
        x.reshape(-1, block)[int(rng.integers(x.size // block))] = 0
    return x.astype(dtype)


def misaligned_copy(a):
    """A copy of `a` whose data pointer is one byte off its alignment (np.frombuffer offset=1)."""
    a = np.asarray(a)
    buf = bytearray(a.nbytes + 1)
    out = np.frombuffer(buf, dtype=a.dtype, offset=1, count=a.size).reshape(a.shape)
    out[...] = a
    return out


def strided_copy(a):
    """Same values, every other element of a larger buffer along the last axis."""
    a = np.asarray(a)
    if a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def reversed_view(a):
    a = np.asarray(a)
    if a.ndim == 0:
        return a
    return np.flip(np.flip(a, 0).copy(), 0)


def huge_view(v):
    """A read-only stride-0 view of 2^40 rows of v's first element (no memory behind it)."""
    v = np.asarray(v)
    one = (v.reshape(-1)[:1] if v.size else np.zeros(1, v.dtype)).copy()
    base = one.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(one.dtype.itemsize, np.uint8)) \
        if one.dtype.kind == "V" or one.dtype in (BF16, E4M3, E5M2, E8M0) else one
    h = np.lib.stride_tricks.as_strided(base, shape=(2 ** 40,) + tuple(v.shape[1:]), strides=(0,) * max(v.ndim, 1),
                                        writeable=False)
    return h.view(one.dtype) if base.dtype != one.dtype else h


def readonly(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


_MEMMAPS = []


def readonly_memmap(a):
    a = np.ascontiguousarray(a)
    fd, path = tempfile.mkstemp(prefix="lowbit-fuzz-", suffix=".bin")
    with os.fdopen(fd, "wb") as fh:
        fh.write(a.tobytes() or b"\0")
    mm = np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape) if a.size else readonly(a)
    os.unlink(path)  # the mapping stays valid
    _MEMMAPS.append(mm)
    del _MEMMAPS[:-8]
    return mm


STORAGE = {
    "fortran": lambda a: np.asfortranarray(a),
    "strided": strided_copy,
    "misaligned": misaligned_copy,
    "negative_strides": reversed_view,
    "readonly": readonly,
}
