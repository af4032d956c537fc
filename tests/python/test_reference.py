"""lowbit against the independent NumPy implementation of tests/python/npref.py, byte for byte:
MXFP8 / MXFP4 (RCEIL and FLOOR), NVFP4 (TransformerEngine formula, with and without a global
amax), FP8 / INT4 groups (float32 and UE8M0 scales), UINT4, and the scale layouts (row-major,
column-major, 128x4, 8x4, grouped 128x4).
"""

import ml_dtypes
import numpy as np
import pytest

import lowbit
import npref

SHAPES = [(1, 64), (7, 128), (129, 96), (3, 5, 64)]
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.integers(-12, 12, size=shape[:-1] + (1,))).astype(np.float32)  # per-row dynamic range
    x[..., 3] = 0.0
    return x.astype(dtype)


def u8(a):
    return np.asarray(a).view(np.uint8)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "e2m1"])
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
def test_mx_matches_reference(shape, dtype, elem, rounding):
    x = rand(shape, dtype, seed=len(shape) * 100 + shape[-2])
    name = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m1": "mxfp4"}[elem]
    qt = lowbit.quantize(x, name, rounding=rounding)
    q_ref, s_ref = npref.mx_quantize(x.astype(np.float32), elem, rounding)
    np.testing.assert_array_equal(u8(qt.scales), s_ref)
    np.testing.assert_array_equal(u8(qt.data), q_ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_amax", [False, True])
def test_nvfp4_matches_transformer_engine_formula(shape, dtype, with_amax):
    x = rand(shape, dtype, seed=7 + shape[-2])
    xf = x.astype(np.float32)
    if with_amax:
        qt = lowbit.quantize(x, "nvfp4", compute_global_amax=True)
        gam = float(np.max(np.abs(xf)))
        assert qt.global_amax.dtype == np.float32 and qt.global_amax[0] == np.float32(gam)
        q_ref, s_ref = npref.nvfp4_quantize(xf, gam)
        qt2 = lowbit.quantize(x, "nvfp4", global_amax=gam)  # given as a Python float
        np.testing.assert_array_equal(u8(qt2.data), q_ref)
    else:
        qt = lowbit.quantize(x, "nvfp4", compute_global_amax=False)  # no per-tensor scale: S_enc = 1
        q_ref, s_ref = npref.nvfp4_quantize(xf, None)
    np.testing.assert_array_equal(u8(qt.scales), s_ref)
    np.testing.assert_array_equal(u8(qt.data), q_ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "int4"])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("block", [16, 32])
def test_group_quant_matches_reference(shape, dtype, elem, ue8m0, block):
    x = rand(shape, dtype, seed=11)
    name = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "int4": "int4"}[elem]
    qt = lowbit.quantize(x, name, block=block, scale_dtype="ue8m0" if ue8m0 else "float32")
    q_ref, s_ref = npref.group_quantize(x.astype(np.float32), elem, block, ue8m0)
    if ue8m0:
        np.testing.assert_array_equal(u8(qt.scales), s_ref)
    else:
        np.testing.assert_array_equal(qt.scales.view(np.uint32), s_ref.view(np.uint32))
    np.testing.assert_array_equal(u8(qt.data), q_ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_uint4_matches_reference(shape, dtype):
    x = rand(shape, dtype, seed=5) + np.float32(0.3)
    x = x.astype(dtype)
    qt = lowbit.quantize(x, "uint4", block=32)
    q_ref, s_ref, z_ref = npref.uint4_quantize(x.astype(np.float32), 32)
    np.testing.assert_array_equal(qt.scales.view(np.uint32), s_ref.view(np.uint32))
    np.testing.assert_array_equal(qt.zeros, z_ref)
    np.testing.assert_array_equal(qt.data, q_ref)


@pytest.mark.parametrize("M", [1, 7, 129, 300])
@pytest.mark.parametrize("layout,row_align", [("col_major", 1), ("col_major", 4), ("blocked128x4", 1),
                                              ("blocked8x4", 1)])
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "nvfp4", "fp8_e4m3"])
def test_scale_layouts_match_reference(M, layout, row_align, name):
    x = rand((M, 32 * 7), np.float32, seed=M)
    kw = {"block": 32} if name == "fp8_e4m3" else {}
    rm = lowbit.quantize(x, name, **kw)
    qt = lowbit.quantize(x, name, layout, row_align=row_align, **kw)
    np.testing.assert_array_equal(u8(qt.data), u8(rm.data))
    want = npref.to_layout(u8(rm.scales) if rm.scales.dtype.itemsize == 1 else rm.scales, layout, row_align)
    got = u8(qt.scales) if qt.scales.dtype.itemsize == 1 else qt.scales
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert tuple(qt.scales.shape) == lowbit.scale_shape(name, layout, 1, M, x.shape[1], row_align=row_align,
                                                        **kw)[1:]
    # the converters agree with quantize
    conv = lowbit.convert_scale_layout(rm.scales, M, rm.scales.shape[1], "row_major", layout, dst_row_align=row_align)
    np.testing.assert_array_equal(u8(conv) if conv.dtype.itemsize == 1 else conv, got)
    back = lowbit.convert_scale_layout(qt.scales, M, rm.scales.shape[1], layout, "row_major", src_row_align=row_align)
    np.testing.assert_array_equal(u8(back) if back.dtype.itemsize == 1 else back,
                                  u8(rm.scales) if rm.scales.dtype.itemsize == 1 else rm.scales)


@pytest.mark.parametrize("m_indptr", [[0, 5, 5, 140], [0, 127, 254], [0, 1], [0, 128, 129, 300]])
@pytest.mark.parametrize("rule", ["flashinfer", "cumsum"])
@pytest.mark.parametrize("as_array", [False, True])
def test_grouped_layout_matches_reference(m_indptr, rule, as_array):
    M = m_indptr[-1]
    x = rand((M, 64), np.float32, seed=M)
    rm = lowbit.quantize(x, "mxfp4")
    ind = np.asarray(m_indptr, np.int32) if as_array else m_indptr
    qt = lowbit.quantize(x, "mxfp4", "blocked128x4", m_indptr=ind, group_pad=rule)
    want = npref.grouped_blocked(u8(rm.scales), m_indptr, rule)
    np.testing.assert_array_equal(u8(qt.scales), want)
    np.testing.assert_array_equal(qt.data, rm.data)
    np.testing.assert_array_equal(lowbit.dequantize(qt), lowbit.dequantize(rm))
    back = lowbit.convert_scale_layout(qt.scales, M, 2, "blocked128x4", "row_major", m_indptr=ind, group_pad=rule)
    np.testing.assert_array_equal(u8(back), u8(rm.scales))
    fwd = lowbit.convert_scale_layout(rm.scales, M, 2, "row_major", "blocked128x4", m_indptr=ind, group_pad=rule)
    np.testing.assert_array_equal(u8(fwd), want)


def test_nonfinite_blocks():
    x = np.ones((2, 64), np.float32)
    x[0, 5] = np.nan
    x[1, 40] = np.inf
    qt = lowbit.quantize(x, "mxfp8_e4m3")
    assert u8(qt.scales).tolist() == [[0xFF, 127 - 8], [127 - 8, 0xFF]]
    y = lowbit.dequantize(qt)
    assert np.isnan(y[0, :32]).all() and np.isnan(y[1, 32:]).all()
    assert (y[0, 32:] == 1).all() and (y[1, :32] == 1).all()


def test_zero_blocks():
    x = np.zeros((1, 64), np.float32)
    for name in ("mxfp8_e4m3", "mxfp4"):
        qt = lowbit.quantize(x, name)
        assert (u8(qt.scales) == 0).all() and (u8(qt.data) == 0).all()
    for zs, code in (("zero", 0x00), ("min", 0x01), ("one", 0x38)):
        qt = lowbit.quantize(x, "nvfp4", zero_scale=zs)
        assert (u8(qt.scales) == code).all()
        assert (lowbit.dequantize(qt) == 0).all()
