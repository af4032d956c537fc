"""The FP8 V cache of the decode attention on the CPU (lowbit.fp8_vcache_quantize,
fp8_vcache_append; lowbit/vcache.hpp, docs/decode_attention.md): the library's codes and scales
bit for bit against an independent NumPy implementation (np.frexp for the power-of-two scale,
ml_dtypes for the FP8 rounding), special values, the append policy, argument errors. The CUDA
kernels against this reference: test_decode_attention_gpu.py."""

import math

import ml_dtypes
import numpy as np
import pytest

import lowbit

from decode_attention_common import FP8, np_quantize, np_scale, same_codes


@pytest.mark.parametrize("dtype", list(FP8))
@pytest.mark.parametrize("vdt", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_quantize_matches_numpy(dtype, vdt):
    rng = np.random.default_rng(3)
    B, T, H, D = 2, 37, 3, 64
    v = (rng.standard_normal((B, T, H, D)) * np.exp2(rng.integers(-12, 12, (1, 1, H, D)))).astype(vdt)
    codes, scale = lowbit.fp8_vcache_quantize(v, dtype)
    assert codes.dtype == FP8[dtype][0] and codes.shape == v.shape and scale.dtype == np.float32
    assert scale.shape == (B, H, D)
    want_c, want_s = np_quantize(v, dtype)
    np.testing.assert_array_equal(scale, want_s)
    assert same_codes(codes, want_c)
    # every value within half an FP8 step of its decode (no saturation anywhere)
    dec = codes.astype(np.float64) * scale[:, None]
    ref = np.asarray(v).astype(np.float64)
    mbits = 3 if dtype == "float8_e4m3fn" else 2
    step = np.ldexp(1.0, (np.floor(np.log2(np.maximum(np.abs(ref), 1e-300))) - mbits).astype(np.int32))
    tiny = FP8[dtype][1] * scale[:, None] * 2.0 ** -20  # below the smallest subnormals
    assert (np.abs(dec - ref) <= np.maximum(step / 2, tiny)).all()


@pytest.mark.parametrize("dtype", list(FP8))
def test_quantize_special_values(dtype):
    v = np.zeros((1, 4, 1, 8), np.float32)
    v[0, :, 0, 1] = [1e-40, -3e-41, 0, 1e-45]        # subnormal amax
    v[0, :, 0, 2] = [3.3e38, -1e38, 1, 0]             # near FLT_MAX
    v[0, :, 0, 3] = [np.nan, 2.0, -np.inf, np.inf]    # non-finite values beside a finite one
    v[0, :, 0, 4] = [np.nan, np.inf, -np.inf, np.nan]  # no finite value at all
    v[0, :, 0, 5] = [-0.0, 0.0, -0.0, 0.0]            # signed zeros
    v[0, :, 0, 6] = [448.0, -448.0, 224.0, 1.0]       # amax a power of two times the FP8 maximum
    v[0, :, 0, 7] = [57344.0, 1.0, 2.0, 3.0]
    codes, scale = lowbit.fp8_vcache_quantize(v, dtype)
    want_c, want_s = np_quantize(v, dtype)
    np.testing.assert_array_equal(scale, want_s)
    assert same_codes(codes, want_c)
    f = codes.astype(np.float32)
    assert scale[0, 0, 0] == 0 and scale[0, 0, 4] == 0 and scale[0, 0, 5] == 0
    assert (codes.view(np.uint8)[0, :, 0, 5] == [0x80, 0, 0x80, 0]).all()
    assert np.isnan(f[0, 0, 0, 3]) and np.isnan(f[0, :, 0, 4]).all()
    if dtype == "float8_e5m2":
        assert f[0, 2, 0, 3] == -np.inf and f[0, 3, 0, 3] == np.inf
    else:
        assert np.isnan(f[0, 2, 0, 3]) and np.isnan(f[0, 3, 0, 3])
    assert scale[0, 0, 2] > 0 and np.isfinite(scale[0, 0, 2]) and scale[0, 0, 1] > 0


def test_quantize_strided_and_empty():
    rng = np.random.default_rng(4)
    v = rng.standard_normal((2, 9, 4, 32)).astype(np.float32)
    view = v[:, ::2, 1:3, :]  # token and head strides
    codes, scale = lowbit.fp8_vcache_quantize(view)
    c2, s2 = lowbit.fp8_vcache_quantize(np.ascontiguousarray(view))
    assert np.array_equal(codes.view(np.uint8), c2.view(np.uint8)) and np.array_equal(scale, s2)
    codes, scale = lowbit.fp8_vcache_quantize(np.zeros((1, 0, 2, 8), np.float32))
    assert codes.shape == (1, 0, 2, 8) and (scale == 0).all()


@pytest.mark.parametrize("dtype", list(FP8))
def test_append_policy(dtype):
    rng = np.random.default_rng(5)
    B, T, H, D = 2, 30, 2, 16
    full = rng.standard_normal((B, T, H, D)).astype(np.float32)
    full[:, 0] = 8.0  # the first token bounds every channel: later N(0, 1) values fit its scale
    full[:, 20:, :, :4] *= 50  # late tokens outgrow the first channels' scales
    # an empty cache (zero scales) grown by appends equals the quantize of what was appended
    codes = np.zeros((B, T, H, D), FP8[dtype][0])
    scale = np.zeros((B, H, D), np.float32)
    lowbit.fp8_vcache_append(full[:, :12], codes, scale, [0, 0])
    c12, s12 = lowbit.fp8_vcache_quantize(full[:, :12], dtype)
    assert np.array_equal(codes[:, :12].view(np.uint8), c12.view(np.uint8)) and np.array_equal(scale, s12)
    # a step that fits: the scales stay, the cached codes stay, the new codes use the stored scale
    before = codes.copy()
    lowbit.fp8_vcache_append(full[:, 12:20] * np.float32(0.5), codes, scale, [12, 12])
    assert np.array_equal(scale, s12) and np.array_equal(codes[:, :12].view(np.uint8), before[:, :12].view(np.uint8))
    want = (full[:, 12:20] * np.float32(0.5) / scale[:, None]).astype(FP8[dtype][0])
    assert np.array_equal(codes[:, 12:20].view(np.uint8), want.view(np.uint8))
    # a step that outgrows: the grown channels rescaled, their cached codes re-encoded from their values
    old_codes, old_scale = codes.copy(), scale.copy()
    lowbit.fp8_vcache_append(full[:, 20:25], codes, scale, [20, 20])
    grown = np.abs(full[:, 20:25]).max(axis=1) > FP8[dtype][1] * old_scale
    assert grown[:, :, :4].all() and not grown[:, :, 4:].any()
    np.testing.assert_array_equal(scale[~grown], old_scale[~grown])
    np.testing.assert_array_equal(scale[grown], np_scale(np.abs(full[:, 20:25]).max(axis=1)[grown], FP8[dtype][1]))
    re = (old_codes[:, :20].astype(np.float32) * old_scale[:, None] / scale[:, None]).astype(FP8[dtype][0])
    assert np.array_equal(codes[:, :20].view(np.uint8), re.view(np.uint8))
    assert np.array_equal(codes[:, 25:].view(np.uint8), np.zeros((B, 5, H, D), np.uint8))  # untouched


def test_append_ragged_lengths_and_untouched_tail():
    rng = np.random.default_rng(6)
    codes, scale = lowbit.fp8_vcache_quantize(rng.standard_normal((2, 10, 1, 8)).astype(np.float32))
    before = codes.copy()
    new = rng.standard_normal((2, 2, 1, 8)).astype(np.float32) * np.float32(0.1)
    lowbit.fp8_vcache_append(new, codes, scale, np.array([3, 8], np.int32))
    cu, bu = codes.view(np.uint8), before.view(np.uint8)
    assert np.array_equal(cu[0, :3], bu[0, :3]) and np.array_equal(cu[0, 5:], bu[0, 5:])
    assert np.array_equal(cu[1, :8], bu[1, :8])
    want = (new / scale[:, None]).astype(codes.dtype).view(np.uint8)
    assert np.array_equal(cu[0, 3:5], want[0]) and np.array_equal(cu[1, 8:10], want[1])


def test_decode_attention_reads_the_cache():
    """attn_forward_decode_nf4 over fp8_vcache_quantize's cache: the dequantized values' attention."""
    from decode_attention_common import assert_bf16_close, make_cache, np_decode

    q, c, s, r, v = make_cache(2, 50, 4, 2, 64, 64, seed=11)
    codes, scale = lowbit.fp8_vcache_quantize(v.astype(np.float32))
    out = lowbit.attn_forward_decode_nf4(q, c, s, r, codes, v_scale=scale, delta=math.inf)
    assert_bf16_close(out, np_decode(q, c, s, r, codes, v_scale=scale)[0])


def test_argument_errors():
    v = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="fp8_vcache_quantize: argument 'dtype'"):
        lowbit.fp8_vcache_quantize(v, "uint8")
    with pytest.raises(ValueError, match="fp8_vcache_quantize: argument 'v'"):
        lowbit.fp8_vcache_quantize(v[0])
    codes, scale = lowbit.fp8_vcache_quantize(v)
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'lengths'.*0..2"):
        lowbit.fp8_vcache_append(v[:, :2], codes, scale, [3])
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'v_new'.*exceed"):
        lowbit.fp8_vcache_append(np.zeros((1, 5, 2, 8), np.float32), codes, scale, [0])
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'scale'.*shape"):
        lowbit.fp8_vcache_append(v[:, :1], codes, scale[:, :1].copy(), [0])
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'codes'.*float8"):
        lowbit.fp8_vcache_append(v[:, :1], codes.view(np.uint8), scale, [0])
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'codes'.*shape"):
        lowbit.fp8_vcache_append(v[:, :1, :1], codes, scale, [0])
    before = (codes.copy(), scale.copy())
    with pytest.raises(ValueError):
        lowbit.fp8_vcache_append(v[:, :1], codes, scale, [-1])
    assert np.array_equal(codes.view(np.uint8), before[0].view(np.uint8)) and np.array_equal(scale, before[1])
