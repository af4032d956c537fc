"""Bad arguments raise ValueError naming the argument (lowbit::ArgumentError translated by the
binding, or the Python layer's own checks), before any output is written."""

import numpy as np
import pytest

import lowbit
from lowbit import _C

X = np.ones((4, 64), np.float32)


@pytest.mark.parametrize("call,arg", [
    (lambda: lowbit.Format("mxfp5"), "name"),
    (lambda: lowbit.Format("mxfp4", block=16), "block"),
    (lambda: lowbit.Format("int4", block=0), "block"),
    (lambda: lowbit.Format("int4", block=7), "format"),          # odd 4-bit block: C++ validate_format
    (lambda: lowbit.Format("int4", rounding="floor"), "rounding"),
    (lambda: lowbit.Format("mxfp8_e4m3", rounding="up"), "rounding"),
    (lambda: lowbit.Format("uint4", scale_dtype="ue8m0"), "scale_dtype"),
    (lambda: lowbit.Format("fp8_e4m3", scale_dtype="bf16"), "scale_dtype"),
    (lambda: lowbit.Format("mxfp4", nibble_order="middle"), "nibble_order"),
    (lambda: lowbit.Format("mxfp4", zero_scale="one"), "zero_scale"),
    (lambda: lowbit.Format("fp8_e4m3", eps=-1.0), "eps"),
    (lambda: lowbit.quantize(X, "mxfp4", "diagonal"), "layout"),
    (lambda: lowbit.quantize(np.ones((4, 48), np.float32), "mxfp4"), "x"),
    (lambda: lowbit.quantize(np.ones(64, np.float32), "mxfp4"), "x"),
    (lambda: lowbit.quantize(np.ones((4, 64)), "mxfp4"), "x"),                       # float64
    (lambda: lowbit.quantize(np.ones((64, 4), np.float32).T, "mxfp4"), "x"),         # last dim strided
    (lambda: lowbit.quantize(X, "mxfp4", global_amax=1.0), "global_amax"),
    (lambda: lowbit.quantize(X, "mxfp4", "blocked128x4", m_indptr=[0, 3]), "m_indptr"),   # must end at M
    (lambda: lowbit.quantize(X, "mxfp4", "row_major", m_indptr=[0, 4]), "layout"),
    (lambda: lowbit.quantize(X, "mxfp4", "blocked128x4", m_indptr=[0, 4], group_pad="x"), "group_pad"),
    (lambda: lowbit.quantize(X, "mxfp4", "col_major", row_align=0), "row_align"),
    (lambda: lowbit.dequantize(lowbit.quantize(X, "mxfp4"), "int8"), "out"),
    (lambda: lowbit.dequantize(X), "qt"),
    (lambda: lowbit.dequantize(lowbit.Quantized(np.zeros((4, 32), np.uint8), np.zeros((4, 3), np.uint8),
                                                format="mxfp4")), "scales"),
    (lambda: lowbit.transcode(lowbit.quantize(X, "mxfp8_e4m3")), "format"),
    (lambda: lowbit.transcode(lowbit.quantize(X, "uint4", block=32), "float8_e5m2"), "out"),
    (lambda: lowbit.cast(X, "int32"), "out"),
    (lambda: lowbit.cast(X, "float7"), "dtype"),
    (lambda: lowbit.convert_scale_layout(np.zeros((5, 3), np.uint8), 4, 3), "scales"),
    (lambda: lowbit.convert_scale_layout(np.zeros((4, 3), np.uint8), 4, 3, src="nope"), "src"),
    (lambda: lowbit.nf4_kcache_quantize(np.ones((2, 3, 4, 5), np.float32)), "k"),
    (lambda: lowbit.nf4_kcache_quantize(np.ones((2, 3, 4), np.float32)), "k"),
    (lambda: lowbit.nf4_kcache_quantize(np.ones((1, 2, 1, 4), np.float32), "int8"), "residual"),
    (lambda: lowbit.nf4_kcache_dequantize(np.zeros((1, 2, 1, 2), np.uint8), np.ones((1, 1, 4), np.float32),
                                          out_dtype="int8"), "out"),
    (lambda: lowbit.per_token_group_quant(X, 48), "x"),
    (lambda: lowbit.per_token_group_quant(X, 32, "float16"), "dtype"),
    (lambda: lowbit.mxfp8_quantize(X, dtype="int8"), "dtype"),
    (lambda: lowbit.scale_shape("mxfp4", "row_major", 1, 4, 48), "K"),
])
def test_value_error_names_argument(call, arg):
    with pytest.raises(ValueError, match=f"argument '{arg}'"):
        call()


def test_binding_checks_declared_dtype_size():
    q = np.zeros((4, 64), np.uint8)
    s = np.zeros((4, 2), np.uint8)
    args = (*lowbit.Format("mxfp8_e4m3").c_args(), _C.ScaleLayoutKind.row_major, 1, _C.GroupPad.none)
    with pytest.raises(ValueError, match="argument 'x'.*element size"):
        _C.quantize(X, _C.DType.bfloat16, q, _C.DType.float8_e4m3fn, s, _C.DType.float8_e8m0fnu, *args)
    with pytest.raises(ValueError, match="quantize: argument 'q': expected shape"):
        _C.quantize(X, _C.DType.float32, q[:, :32], _C.DType.float8_e4m3fn, s, _C.DType.float8_e8m0fnu, *args)
    with pytest.raises(ValueError, match="argument 'scales'"):
        _C.quantize(X, _C.DType.float32, q, _C.DType.float8_e4m3fn, s, _C.DType.int8, *args)
    with pytest.raises(ValueError, match="argument 'q': overlaps"):
        buf = np.zeros(4 * 64 * 4, np.uint8)
        xa = buf.view(np.float32).reshape(4, 64)
        _C.quantize(xa, _C.DType.float32, buf[:256].reshape(4, 64), _C.DType.float8_e4m3fn, s,
                    _C.DType.float8_e8m0fnu, *args)


def test_wrong_library_mix():
    qt = lowbit.quantize(X, "mxfp4")
    torch = pytest.importorskip("torch")
    bad = lowbit.Quantized(qt.data, torch.from_numpy(qt.scales.view(np.uint8)), format="mxfp4")
    with pytest.raises(ValueError, match="argument 'scales'"):
        lowbit.dequantize(bad)


def test_per_token_group_quant_refuses_fractional_group_size():
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    with pytest.raises(ValueError, match="argument 'group_size'"):
        lowbit.per_token_group_quant(x, group_size=128.9)


def test_dequantize_accepts_a_float_global_amax():
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    qt = lowbit.quantize(x, "nvfp4", global_amax=float(np.abs(x).max()))
    qt_float = lowbit.Quantized(qt.data, qt.scales, None, float(np.abs(x).max()), format=qt.format,
                                layout=qt.layout, shape=qt.shape)
    np.testing.assert_array_equal(lowbit.dequantize(qt), lowbit.dequantize(qt_float))
