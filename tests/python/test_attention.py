"""MXFP8 flash attention on the CPU (lowbit.flash_attn_mxfp8_func, the varlen form,
quantize_mxfp8_attn): the library's reference against an independent NumPy attention (ml_dtypes
decoding, fp64), argument errors, the NaN rules of docs/attention.md, the quantize step's bytes and
round trip. The GPU tests are in test_attention_gpu.py."""

import math

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import _C

from npref import mx_quantize
from attention_common import (E4M3, assert_close, check_nan_rules, check_varlen_rows, make_inputs, nan_rule_inputs,
                              np_dequant, np_reference, varlen_case)

CPU_SHAPES = [  # b, sq, sk, h, hk, d, causal
    (1, 1, 5, 1, 1, 64, False), (2, 3, 7, 4, 2, 64, True), (1, 7, 3, 2, 1, 128, True),
    (1, 9, 13, 8, 8, 256, True), (2, 4, 9, 4, 1, 64, False), (1, 17, 6, 2, 2, 128, False),
    (1, 1, 1, 1, 1, 64, True),
]


@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: "b%d_sq%d_sk%d_h%d-%d_d%d_%s" % (*s[:6], "causal" if s[6] else "full"))
@pytest.mark.parametrize("spread", [0, 40])
def test_reference_matches_numpy(shape, spread):
    b, sq, sk, h, hk, d, causal = shape
    q, k, v, qs, ks, vs = make_inputs(b, sq, sk, h, hk, d, seed=sq * 31 + sk, spread=spread)
    out, lse = lowbit.flash_attn_mxfp8_func(q.view(E4M3), k, v, qs.view(ml_dtypes.float8_e8m0fnu), ks, vs, causal=causal)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (b, sq, h, d)
    assert lse.dtype == np.float32 and lse.shape == (b, h, sq)
    assert_close(out, lse, *np_reference(q, k, v, qs, ks, vs, 1 / math.sqrt(d), causal))


def test_softmax_scale_and_masked_rows():
    q, k, v, qs, ks, vs = make_inputs(1, 6, 2, 2, 1, 64, seed=3)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, softmax_scale=0.3, causal=True)
    ref = np_reference(q, k, v, qs, ks, vs, np.float64(np.float32(0.3)), True)
    assert_close(out, lse, *ref)
    # s_q - s_k = 4: rows 0..3 see no key
    assert (out[0, :4].view(np.uint16) == 0).all() and (lse[0, :, :4] == -np.inf).all()
    assert np.isfinite(lse[0, :, 4:]).all()


def test_varlen_matches_fixed_length():
    h, d = 4, 64
    case = varlen_case(h, 2, d, seed=10)
    for causal in (False, True):
        out, lse = lowbit.flash_attn_mxfp8_varlen_func(*case.packed, case.cq, list(case.ck), case.max_q, case.max_k,
                                                       causal=causal)
        assert out.shape == (case.cq[-1], h, d) and lse.shape == (h, case.cq[-1])
        check_varlen_rows(case, out, lse, lambda *s: lowbit.flash_attn_mxfp8_func(*s, causal=causal))


def test_strided_codes_are_read_by_index():
    q, k, v, qs, ks, vs = make_inputs(2, 5, 6, 4, 2, 64, seed=4)
    want = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs)
    wide = np.full((2, 5, 4, 128), 0x7F, np.uint8)  # NaN padding that must never be read
    wide[..., :64] = q
    got = lowbit.flash_attn_mxfp8_func(wide[..., :64], k, v, qs, ks, vs)
    np.testing.assert_array_equal(got[0].view(np.uint16), want[0].view(np.uint16))
    np.testing.assert_array_equal(got[1], want[1])


def test_nan_rules():
    q, k, v, qs, ks, vs = nan_rule_inputs()
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True)
    check_nan_rules(out, lse)
    assert_close(out, lse, *np_reference(q, k, v, qs, ks, vs, 0.125, True))


# ---------------------------------------------------------------------------------------------
# the quantize step

@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_quantize_bytes_and_round_trip(rounding):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 5, 3, 64)) * np.exp2(rng.integers(-20, 20, (2, 5, 3, 1)))).astype(np.float32)
    codes, scales = lowbit.quantize_mxfp8_attn(x, rounding=rounding)
    assert codes.dtype == E4M3 and codes.shape == (2, 5, 3, 64)
    assert scales.dtype == ml_dtypes.float8_e8m0fnu and scales.shape == (2, 3, 5, 2) and scales.flags.c_contiguous
    want_c, want_s = mx_quantize(x, "e4m3", rounding)  # independent NumPy recipe, [.., d] / [.., d/32]
    np.testing.assert_array_equal(codes.view(np.uint8), want_c)
    np.testing.assert_array_equal(scales.view(np.uint8), want_s.transpose(0, 2, 1, 3))
    deq = np_dequant(codes, scales.view(np.uint8).transpose(0, 2, 1, 3))
    amax = np.repeat(np.abs(x).reshape(2, 5, 3, 2, 32).max(-1), 32, -1)
    assert (np.abs(deq - x) <= amax * 2.0 ** -2).all()  # E4M3: 3 mantissa bits (FLOOR may saturate at 448)


def test_quantize_layouts():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 128)).astype(np.float32)  # [b, h, s, d]
    c1, s1 = lowbit.quantize_mxfp8_attn(x, layout="bhsd")
    c2, s2 = lowbit.quantize_mxfp8_attn(np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
    assert c1.shape == (2, 5, 3, 128) and s1.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(c1.view(np.uint8), c2.view(np.uint8))
    np.testing.assert_array_equal(s1.view(np.uint8), s2.view(np.uint8))
    t = x.reshape(6, 5, 128)  # [total, h, d]
    c3, s3 = lowbit.quantize_mxfp8_attn(t, layout="thd")
    assert c3.shape == (6, 5, 128) and s3.shape == (5, 6, 4)
    c4, s4 = lowbit.quantize_mxfp8_attn(t.reshape(1, 6, 5, 128))
    np.testing.assert_array_equal(c3.view(np.uint8), c4[0].view(np.uint8))
    np.testing.assert_array_equal(s3.view(np.uint8), s4[0].view(np.uint8))
    xb = x.astype(ml_dtypes.bfloat16)
    out, lse = lowbit.flash_attn_mxfp8_quantized(xb, xb, xb, layout="bhsd", causal=True)
    assert out.shape == (2, 5, 3, 128) and lse.shape == (2, 3, 5)


def test_quantize_nan_block():
    x = np.ones((1, 2, 1, 64), np.float32)
    x[0, 1, 0, 40] = np.nan
    _, s = lowbit.quantize_mxfp8_attn(x)
    assert s.view(np.uint8)[0, 0, 1, 1] == 255 and s.view(np.uint8)[0, 0, 1, 0] != 255


# ---------------------------------------------------------------------------------------------
# argument errors

def _ok():
    return make_inputs(1, 3, 5, 4, 2, 64, seed=8)


@pytest.mark.parametrize("arg, change, match", [
    ("q", lambda a: a.astype(np.float32), "argument 'q': expected dtype float8_e4m3fn or uint8, got float32 .quantize"),
    ("q", lambda a: a[0], "argument 'q': expected a 4-D array"),
    ("q", lambda a: np.zeros((1, 3, 4, 96), np.uint8), "argument 'q': head dim d = 96"),
    ("k", lambda a: a[:, :, :1].repeat(3, 2), "argument 'k': the query heads h = 4 must be a multiple"),
    ("k", lambda a: a.astype(np.int8), "argument 'k': expected dtype"),
    ("v", lambda a: a[:, :4], "argument 'v': expected shape"),
    ("q_scale", lambda a: a.transpose(0, 2, 1, 3), "argument 'q_scale': expected shape"),
    ("k_scale", lambda a: a.astype(np.float32), "argument 'k_scale': expected dtype float8_e8m0fnu or uint8"),
    ("v_scale", lambda a: a[..., :1], "argument 'v_scale': expected shape"),
    ("q", lambda a: None, "argument 'q': is required"),
    ("softmax_scale", lambda a: 0.0, "argument 'softmax_scale': expected a finite value > 0"),
    ("softmax_scale", lambda a: float("inf"), "argument 'softmax_scale'"),
    ("softmax_scale", lambda a: "x", "argument 'softmax_scale': expected a number"),
    ("causal", lambda a: 1, "argument 'causal': expected a bool"),
])
def test_argument_errors(arg, change, match):
    names = ["q", "k", "v", "q_scale", "k_scale", "v_scale"]
    args = dict(zip(names, _ok()), softmax_scale=None, causal=False)
    args[arg] = change(args.get(arg))
    with pytest.raises(ValueError, match=match):
        lowbit.flash_attn_mxfp8_func(**args)


def test_varlen_argument_errors():
    q, k, v, qs, ks, vs = _ok()
    q, k, v = q[0], k[0], v[0]
    qs, ks, vs = qs[0], ks[0], vs[0]
    op = lowbit.flash_attn_mxfp8_varlen_func
    with pytest.raises(ValueError, match="argument 'cu_seqlens_q': must start at 0"):
        op(q, k, v, qs, ks, vs, [1, 3], [0, 5], 3, 5)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_q': the last boundary"):
        op(q, k, v, qs, ks, vs, [0, 2], [0, 5], 3, 5)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_k': must start at 0 and be non-decreasing"):
        op(q, k, v, qs, ks, vs, [0, 1, 3], [0, 4, 3], 3, 5)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_k': expected dtype int32"):
        op(q, k, v, qs, ks, vs, [0, 3], np.array([0, 5], np.int64), 3, 5)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_k': expected shape"):
        op(q, k, v, qs, ks, vs, [0, 3], [0, 2, 5], 3, 5)
    with pytest.raises(ValueError, match="argument 'max_seqlen_q': expected >= 1"):
        op(q, k, v, qs, ks, vs, [0, 3], [0, 5], 0, 5)
    with pytest.raises(ValueError, match="argument 'max_seqlen_k': expected an integer"):
        op(q, k, v, qs, ks, vs, [0, 3], [0, 5], 3, 5.0)
    with pytest.raises(ValueError, match="argument 'cu_seqlens_q': expected an int32 array"):
        op(q, k, v, qs, ks, vs, "0,3", [0, 5], 3, 5)
    with pytest.raises(ValueError, match="argument 'q_scale': expected shape"):
        op(q, k, v, qs.transpose(1, 0, 2), ks, vs, [0, 3], [0, 5], 3, 5)
    with pytest.raises(ValueError, match="argument 'q': expected a 3-D array"):
        op(q[None], k, v, qs, ks, vs, [0, 3], [0, 5], 3, 5)


def test_quantize_argument_errors():
    x = np.zeros((1, 2, 3, 64), np.float32)
    with pytest.raises(ValueError, match="quantize_mxfp8_attn: argument 'layout'"):
        lowbit.quantize_mxfp8_attn(x, layout="bsdh")
    with pytest.raises(ValueError, match="argument 'x': expected a 3-D"):
        lowbit.quantize_mxfp8_attn(x, layout="thd")
    with pytest.raises(ValueError, match="argument 'x': the head dim d = 48"):
        lowbit.quantize_mxfp8_attn(np.zeros((1, 2, 3, 48), np.float32))
    with pytest.raises(ValueError, match="argument 'x': expected dtype float32, float16 or bfloat16"):
        lowbit.quantize_mxfp8_attn(np.zeros((1, 2, 3, 64), np.uint8))
    with pytest.raises(ValueError, match="argument 'rounding'"):
        lowbit.quantize_mxfp8_attn(x, rounding="up")


def test_binding_refuses_read_only_outputs():
    q, k, v, qs, ks, vs = _ok()
    out = np.zeros((1, 3, 4, 64), np.uint16)
    lse = np.zeros((1, 4, 3), np.float32)
    out.flags.writeable = False
    D = _C.DType
    args = (q, D.float8_e4m3fn, k, D.uint8, v, D.uint8, qs, D.uint8, ks, D.uint8, vs, D.float8_e8m0fnu)
    with pytest.raises(ValueError, match="flash_attn_mxfp8: argument 'out': is read-only"):
        _C.flash_attn_mxfp8(*args, out, lse, float("nan"), False)
    assert (out == 0).all() and (lse == 0).all()
    out.flags.writeable = True
    _C.flash_attn_mxfp8(*args, out, lse, float("nan"), False)
    assert not (out == 0).all()


def test_build_info_lists_attention_where_it_runs():
    info = lowbit.build_info()
    if info["cuda_built"] and info["device_count"] and info["sm"] >= 90 and "nvfp4_dual_gemm_silu" in info["cuda_ops"]:
        assert {"flash_attn_mxfp8", "flash_attn_mxfp8_varlen"} <= set(info["cuda_ops"])
    else:
        assert "flash_attn_mxfp8" not in info["cuda_ops"]
