"""Element casts and 4-bit packing, bit for bit against ml_dtypes (an independent reference).

E4M3/E5M2: every one of the 65536 bf16 (and fp16) bit patterns; saturating casts are compared
with ml_dtypes after clipping to the finite range (ml_dtypes itself does not saturate); NaN
compares as NaN. E2M1: every bf16 pattern in [-6, 6] through MXFP4 with a unit block scale.
"""

import ml_dtypes
import numpy as np
import pytest

import lowbit

BF16 = ml_dtypes.bfloat16
E4M3, E5M2, E2M1 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

MAXF = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
ML = {"float8_e4m3fn": E4M3, "float8_e5m2": E5M2}


def all_bf16():
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(256, 256)


def all_fp16():
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)


def assert_same_fp8(got, want):
    assert got.dtype == want.dtype
    g, w = got.astype(np.float32), want.astype(np.float32)
    gn, wn = np.isnan(g), np.isnan(w)
    np.testing.assert_array_equal(gn, wn)
    gb, wb = got.view(np.uint8), want.view(np.uint8)
    bad = (gb != wb) & ~gn
    assert not bad.any(), f"{bad.sum()} mismatches, first at {np.argwhere(bad)[:5].tolist()}: " \
                          f"{g[bad][:5]} vs {w[bad][:5]}"


@pytest.mark.parametrize("src", ["bfloat16", "float16"])
@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e5m2"])
def test_cast_saturating_all_16bit_patterns(src, dst):
    x = all_bf16() if src == "bfloat16" else all_fp16()
    got = lowbit.cast(x, dst, saturate=True)
    want = np.clip(x.astype(np.float32), -MAXF[dst], MAXF[dst]).astype(ML[dst])
    assert got.shape == x.shape
    assert_same_fp8(got, want)


@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e5m2"])
def test_cast_non_saturating_matches_ml_dtypes(dst):
    x = all_bf16()
    got = lowbit.cast(x, dst, saturate=False)
    want = x.astype(np.float32).astype(ML[dst])
    assert_same_fp8(got, want)


@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e5m2"])
def test_cast_float32_random_bits(dst):
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=(512, 512), dtype=np.uint64).astype(np.uint32)
    # concentrate on the fp8 range as well: exponents around 2^-20 .. 2^17
    near = (rng.integers(107, 144, size=bits.shape).astype(np.uint32) << 23) | (bits & 0x807FFFFF)
    for b in (bits, near):
        x = b.view(np.float32)
        got = lowbit.cast(x, dst)
        want = np.clip(x, -MAXF[dst], MAXF[dst]).astype(ML[dst])
        assert_same_fp8(got, want)


@pytest.mark.parametrize("src", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dst", ["float32", "float16", "bfloat16"])
def test_cast_fp8_to_wide_all_codes(src, dst):
    x = np.arange(256, dtype=np.uint8).view(ML[src]).reshape(16, 16)
    got = lowbit.cast(x, dst)
    want = x.astype(np.float32).astype({"float32": np.float32, "float16": np.float16, "bfloat16": BF16}[dst])
    assert got.dtype == want.dtype
    g, w = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    m = ~np.isnan(w)
    np.testing.assert_array_equal(g[m], w[m])
    np.testing.assert_array_equal(np.signbit(g[m]), np.signbit(w[m]))


def test_cast_float32_to_bf16_fp16_rne():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**32, size=(256, 256), dtype=np.uint64).astype(np.uint32).view(np.float32)
    for dst, t in (("bfloat16", BF16), ("float16", np.float16)):
        got = lowbit.cast(x, dst)
        with np.errstate(over="ignore", invalid="ignore"):
            want = x.astype(t)
        g, w = got.astype(np.float32), want.astype(np.float32)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        m = ~np.isnan(w)
        np.testing.assert_array_equal(got.view(np.uint16)[m], want.view(np.uint16)[m])


def test_cast_strided_input():
    x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32) * 100
    got = lowbit.cast(x[::2, ::3], "float8_e4m3fn")
    want = lowbit.cast(np.ascontiguousarray(x[::2, ::3]), "float8_e4m3fn")
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert got.flags.c_contiguous


def test_e2m1_all_bf16_in_range_via_mxfp4():
    """MXFP4 with a block holding 6.0 has the unit scale (RCEIL: 6/6 = 2^0): codes are E2M1(x)."""
    x = all_bf16().reshape(-1).astype(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) <= 6.0)]
    n = (-len(x)) % 31
    x = np.concatenate([x, np.zeros(n, np.float32)]).reshape(-1, 31)
    x = np.concatenate([np.full((x.shape[0], 1), 6.0, np.float32), x], axis=1)  # [rows, 32]
    q, s = lowbit.mxfp4_quantize(x)
    assert (s.view(np.uint8) == 127).all()
    lo, hi = q & 0xF, q >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(x.shape)
    want = x.astype(E2M1).view(np.uint8) & 0xF
    np.testing.assert_array_equal(codes, want)
    # FLOOR: floor(log2 6) - 2 = 0, also the unit scale
    q2, s2 = lowbit.mxfp4_quantize(x, rounding="floor")
    assert (s2.view(np.uint8) == 127).all()
    np.testing.assert_array_equal(q2, q)


def test_e2m1_decode_all_codes():
    codes = np.arange(16, dtype=np.uint8)
    packed = np.tile(codes[0::2] | (codes[1::2] << 4), 2).reshape(1, 16)  # 32 elements
    s = np.full((1, 1), 127, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    qt = lowbit.Quantized(packed, s, format="mxfp4", shape=(1, 32))
    got = lowbit.dequantize(qt)
    want = np.tile(codes, 2).view(E2M1).astype(np.float32).reshape(1, 32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_torchao_packing_vector():
    """torchao: [[0, 0.5, 4, -0], [-0, 1, -6, 3]] packs to [[0x10, 0x86], [0x28, 0x5F]]."""
    x = np.zeros((2, 32), np.float32)
    x[:, :4] = [[0, 0.5, 4, -0.0], [-0.0, 1, -6, 3]]
    q, s = lowbit.mxfp4_quantize(x)
    assert s.view(np.uint8).tolist() == [[127], [127]]
    assert q[:, :2].tolist() == [[0x10, 0x86], [0x28, 0x5F]]
    assert (q[:, 2:] == 0).all()
    qh = lowbit.quantize(x, "mxfp4", nibble_order="high").data
    assert qh[:, :2].tolist() == [[0x01, 0x68], [0x82, 0xF5]]
    # and back
    y = lowbit.dequantize(lowbit.Quantized(q, s, format="mxfp4"))
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(x))
