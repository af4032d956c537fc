"""quantize -> dequantize round trips for every format and layout on NumPy inputs (float32,
float16, bfloat16) with odd shapes, SQNR lower bounds, and the other ops (transcode, casts of
the outputs, NF4 K cache, amax, convenience entry points, scale layout helpers)."""

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit._formats import stored_scale_shape

BF16 = ml_dtypes.bfloat16
DTYPES = [np.float32, np.float16, BF16]
LAYOUTS = ["row_major", "col_major", "blocked128x4", "blocked8x4"]
# gaussian data, lower bounds on the SQNR (dB) with some margin
SQNR_MIN = {"mxfp8_e4m3": 29, "mxfp8_e5m2": 23, "mxfp4": 16, "nvfp4": 17.5, "fp8_e4m3": 29, "fp8_e5m2": 23,
            "int4": 15, "uint4": 15, "nf4": 17}


def fmt_kwargs(name):
    return {"block": 32} if name in ("fp8_e4m3", "fp8_e5m2", "int4", "uint4", "nf4") else {}


def sqnr(x, y):
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    return 10 * np.log10(np.sum(x * x) / max(np.sum((x - y) ** 2), 1e-300))


@pytest.mark.parametrize("name", lowbit.FORMAT_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (129, 128), (2, 7, 64)])
def test_roundtrip_sqnr(name, layout, dtype, shape):
    rng = np.random.default_rng(shape[-2])
    x = rng.standard_normal(shape).astype(np.float32).astype(dtype)
    qt = lowbit.quantize(x, name, layout, **fmt_kwargs(name))
    f = lowbit.Format(name, **fmt_kwargs(name))
    assert qt.format == f and qt.layout == layout and qt.shape == shape
    assert qt.data.dtype == np.dtype({"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2,
                                      "uint8": np.uint8}[f.code_dtype])
    assert qt.data.shape == shape[:-1] + ((shape[-1] // 2,) if f.packed else (shape[-1],))
    L = shape[0] if len(shape) == 3 else 1
    want = lowbit.scale_shape(f, layout, L, shape[-2], shape[-1])
    assert tuple(qt.scales.shape) == (want if len(shape) == 3 else want[1:])
    assert tuple(want[1:]) == stored_scale_shape(layout, shape[-2], shape[-1] // f.block)
    assert (qt.zeros is not None) == f.has_zero_point
    y = lowbit.dequantize(qt)
    assert y.dtype == np.float32 and y.shape == shape
    assert sqnr(x.astype(np.float32), y) >= SQNR_MIN[name]
    # narrower outputs are the float32 result rounded to nearest even
    for out in ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"):
        z = lowbit.dequantize(qt, out)
        np.testing.assert_array_equal(z.view(np.uint8), lowbit.cast(y, out).view(np.uint8))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "int4", "nf4"])
def test_strided_rows_and_batch(name):
    rng = np.random.default_rng(3)
    big = rng.standard_normal((3, 9, 200)).astype(np.float32)
    x = big[::2, 1::2, :128]  # row and batch strides, last dim contiguous
    a = lowbit.quantize(x, name, **fmt_kwargs(name))
    b = lowbit.quantize(np.ascontiguousarray(x), name, **fmt_kwargs(name))
    np.testing.assert_array_equal(a.data.view(np.uint8), b.data.view(np.uint8))
    np.testing.assert_array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))


def test_nvfp4_global_scale_roundtrip():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((33, 256)) * 1e4).astype(np.float32)
    qt = lowbit.quantize(x, "nvfp4", compute_global_amax=True)
    assert qt.global_amax[0] == np.abs(x).max()
    assert sqnr(x, lowbit.dequantize(qt)) >= SQNR_MIN["nvfp4"]
    np.testing.assert_array_equal(lowbit.tensor_amax(x), np.abs(x).max(keepdims=True).reshape(1))


@pytest.mark.parametrize("name,out", [("mxfp4", "float8_e4m3fn"), ("mxfp4", "float8_e5m2"), ("int4", "float8_e4m3fn"),
                                      ("int4", "float8_e5m2"), ("uint4", "float8_e4m3fn")])
@pytest.mark.parametrize("layout", ["row_major", "blocked128x4"])
def test_transcode_exact(name, out, layout):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 128)).astype(np.float32)
    qt = lowbit.quantize(x, name, layout, **fmt_kwargs(name))
    codes = lowbit.transcode(qt, out)
    assert codes.shape == (7, 128) and codes.dtype == np.dtype(getattr(ml_dtypes, out))
    if name == "mxfp4":
        f8 = lowbit.Format("mxfp8_e4m3" if out == "float8_e4m3fn" else "mxfp8_e5m2")
    else:
        f8 = lowbit.Format("fp8_e4m3" if out == "float8_e4m3fn" else "fp8_e5m2", block=32)
    q8 = lowbit.Quantized(codes, qt.scales, format=f8, layout=layout)
    np.testing.assert_array_equal(lowbit.dequantize(q8), lowbit.dequantize(qt))


def test_transcode_nvfp4_codes_are_e2m1_values():
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    qt = lowbit.quantize(x, "nvfp4")
    codes = lowbit.transcode(qt)
    nib = np.stack([qt.data & 0xF, qt.data >> 4], -1).reshape(4, 64)
    np.testing.assert_array_equal(codes.astype(np.float32), nib.view(ml_dtypes.float4_e2m1fn).astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", ["float8_e5m2", "float8_e4m3fn"])
@pytest.mark.parametrize("order", ["low", "high"])
def test_nf4_kcache(dtype, residual, order):
    rng = np.random.default_rng(7)
    k = rng.standard_normal((2, 9, 3, 64)).astype(np.float32).astype(dtype)
    codes, scale, res = lowbit.nf4_kcache_quantize(k, residual, nibble_order=order)
    assert codes.shape == (2, 9, 3, 32) and codes.dtype == np.uint8
    assert scale.shape == (2, 3, 64) and scale.dtype == np.float32
    assert res.shape == k.shape and res.dtype == np.dtype(getattr(ml_dtypes, residual))
    kf = k.astype(np.float32)
    np.testing.assert_array_equal(scale, np.abs(kf).max(axis=1))
    k0 = lowbit.nf4_kcache_dequantize(codes, scale, None, nibble_order=order)
    k1 = lowbit.nf4_kcache_dequantize(codes, scale, res, nibble_order=order)
    assert sqnr(kf, k0) >= 15
    assert sqnr(kf, k1) >= sqnr(kf, k0) + 10
    k2 = lowbit.nf4_kcache_dequantize(codes, scale, res, "bfloat16", nibble_order=order)
    assert k2.dtype == BF16


def test_mxfp8_quantize_swizzled_is_interleaved():
    x = np.random.default_rng(8).standard_normal((130, 96)).astype(np.float32)
    q, s = lowbit.mxfp8_quantize(x)
    qs, ss = lowbit.mxfp8_quantize(x, swizzled=True)
    assert s.shape == (130, 3) and ss.shape == (256, 4) and s.dtype == ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(q.view(np.uint8), qs.view(np.uint8))
    inter = lowbit.block_scale_interleave(s)
    np.testing.assert_array_equal(inter.view(np.uint8), ss.view(np.uint8))
    np.testing.assert_array_equal(lowbit.block_scale_deinterleave(ss, 130, 3).view(np.uint8), s.view(np.uint8))
    # batched scales: L matrices one after the other
    s3 = np.stack([s, s]).view(np.uint8)
    i3 = lowbit.block_scale_interleave(s3)
    assert i3.shape == (2, 256, 4) and (i3[1] == ss.view(np.uint8)).all()
    np.testing.assert_array_equal(lowbit.block_scale_deinterleave(i3, 130, 3), s3)


def test_mxfp4_nvfp4_entry_points():
    x = np.random.default_rng(9).standard_normal((5, 64)).astype(np.float32)
    q, s = lowbit.mxfp4_quantize(x)
    assert q.shape == (5, 32) and q.dtype == np.uint8 and s.shape == (5, 2)
    q, s = lowbit.nvfp4_quantize(x, global_amax=np.abs(x).max(), swizzled=True)
    assert q.shape == (5, 32) and s.shape == (128, 4) and s.dtype == ml_dtypes.float8_e4m3fn
    qt = lowbit.quantize(x, "nvfp4", "blocked128x4", global_amax=np.abs(x).max())
    np.testing.assert_array_equal(s.view(np.uint8), qt.scales.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4"])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("M", [1, 7, 129])
def test_per_token_group_quant(dtype, ue8m0, tma, M):
    x = np.random.default_rng(M).standard_normal((M, 256)).astype(BF16)
    q, s = lowbit.per_token_group_quant(x, 128, dtype, scale_ue8m0=ue8m0)
    assert s.shape == (M, 2)
    assert s.dtype == (ml_dtypes.float8_e8m0fnu if ue8m0 else np.float32)
    qc, sc = lowbit.per_token_group_quant(x, 128, dtype, scale_ue8m0=ue8m0, column_major_scales=True,
                                          tma_aligned=tma)
    np.testing.assert_array_equal(q.view(np.uint8), qc.view(np.uint8))
    assert sc.shape == (M, 2)
    Mp = M if not tma else (M + (15 if ue8m0 else 3)) // (16 if ue8m0 else 4) * (16 if ue8m0 else 4)
    assert sc.strides == (sc.itemsize, Mp * sc.itemsize)
    np.testing.assert_array_equal(np.ascontiguousarray(sc).view(np.uint8), s.view(np.uint8))
    f = lowbit.Format({"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "int4": "int4"}[dtype], block=128,
                      scale_dtype="ue8m0" if ue8m0 else "float32")
    y = lowbit.dequantize(lowbit.Quantized(q, s, format=f))
    assert sqnr(x.astype(np.float32), y) >= 15


def test_format_objects():
    f = lowbit.Format("mxfp4", rounding="floor")
    assert f.block == 32 and f.rounding == "floor" and f.scale_dtype == "float8_e8m0fnu" and f.packed
    assert f == lowbit.Format.of("mxfp4", rounding="floor") and f != lowbit.Format("mxfp4")
    assert f.replace(rounding="rceil") == "mxfp4"
    assert lowbit.Format("nf4").block == 64 and lowbit.Format("int4").block == 128
    g = lowbit.Format("int4", block=64, scale_dtype="ue8m0")
    assert eval(repr(g), {"Format": lowbit.Format}) == g
    assert lowbit.Format("nvfp4").has_global_scale and lowbit.Format("uint4").has_zero_point
    assert hash(lowbit.Format("nvfp4")) == hash(lowbit.Format("nvfp4", zero_scale="zero"))
    with pytest.raises(AttributeError):
        f.block = 16


def test_build_info_and_version():
    info = lowbit.build_info()
    assert set(info) == {"version", "cuda_built", "cuda_runtime_version", "device_count", "device_name", "sm",
                         "cuda_ops", "cpu_only_ops"}
    assert info["version"] == lowbit.__version__
    if not info["cuda_built"]:
        assert info["device_count"] == 0 and info["cuda_ops"] == []


def test_quantized_unpacks_and_accepts_lists():
    qt = lowbit.quantize([[1.0] * 32], "mxfp8_e4m3")
    q, s = qt
    assert q.shape == (1, 32) and s.shape == (1, 1)
    assert "mxfp8_e4m3" in repr(qt)
