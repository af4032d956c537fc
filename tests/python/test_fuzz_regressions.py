"""Regression tests of the defects the fuzz harness (fuzzlib.py, fuzzfiles.py) found: each is
refused with lowbit's ValueError naming the argument, before any output is written."""

import json

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import safetensors_io as st
from lowbit.cli import main

RNG = np.random.default_rng(99)
X = RNG.standard_normal((8, 64)).astype(np.float32)


def _raises(call, op, arg, also=""):
    with pytest.raises(ValueError, match=f"{op}: argument '{arg}'") as e:
        call()
    assert also in str(e.value), str(e.value)
    return e.value


def _huge(shape_tail, dtype):
    """A read-only stride-0 view of 2^40 rows (no memory behind it)."""
    one = np.zeros(1, np.uint8 if np.dtype(dtype).itemsize == 1 else dtype)
    h = np.lib.stride_tricks.as_strided(one, (2 ** 40,) + tuple(shape_tail), (0,) * (1 + len(shape_tail)),
                                        writeable=False)
    return h.view(dtype) if h.dtype != np.dtype(dtype) else h


# --- huge stride-0 views: no MemoryError from a contiguous copy -------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.float8_e8m0fnu, np.float32])
def test_huge_view_scales_block_scale_interleave(dtype):
    s = _huge((5,), dtype)
    _raises(lambda: lowbit.block_scale_interleave(s), "block_scale_interleave", "scales", "physical memory")
    s3 = _huge((3, 8), dtype)
    _raises(lambda: lowbit.block_scale_interleave(s3), "block_scale_interleave", "scales")


def test_huge_view_scales_block_scale_deinterleave():
    s = _huge((8,), np.uint8)
    _raises(lambda: lowbit.block_scale_deinterleave(s, 3, 8), "block_scale_deinterleave", "scales")


@pytest.mark.parametrize("src,dst,tail,R,C", [("row_major", "col_major", (7, 5), 7, 5),
                                              ("blocked128x4", "row_major", (256, 8), 129, 5),
                                              ("col_major", "blocked8x4", (1, 7), 7, 1)])
def test_huge_view_scales_convert_scale_layout(src, dst, tail, R, C):
    s = _huge(tail, np.uint8)
    _raises(lambda: lowbit.convert_scale_layout(s, R, C, src, dst), "convert_scale_layout", "scales",
            "physical memory")


# --- row_align must be an integer >= 1, for every layout --------------------------------------

@pytest.mark.parametrize("bad", [0, -1, -5])
@pytest.mark.parametrize("layout", ["row_major", "col_major", "blocked128x4", "blocked8x4"])
def test_row_align_below_one_is_refused(bad, layout):
    _raises(lambda: lowbit.scale_shape("mxfp4", layout, 1, 8, 64, row_align=bad), "scale_shape", "row_align",
            ">= 1")
    _raises(lambda: lowbit.quantize(X, "mxfp4", layout, row_align=bad), "quantize", "row_align", ">= 1")
    qt = lowbit.quantize(X, "mxfp4", layout)
    bad_qt = lowbit.Quantized(qt.data, qt.scales, format=qt.format, layout=layout, shape=qt.shape, row_align=bad)
    _raises(lambda: lowbit.dequantize(bad_qt), "dequantize", "row_align", ">= 1")
    _raises(lambda: lowbit.transcode(bad_qt), "transcode", "row_align", ">= 1")
    s = np.zeros((8, 2), np.uint8)
    _raises(lambda: lowbit.convert_scale_layout(s, 8, 2, "row_major", layout, src_row_align=bad),
            "convert_scale_layout", "src_row_align", ">= 1")
    _raises(lambda: lowbit.convert_scale_layout(s, 8, 2, "row_major", layout, dst_row_align=bad),
            "convert_scale_layout", "dst_row_align", ">= 1")


def test_row_align_one_and_more_still_accepted():
    assert lowbit.scale_shape("mxfp4", "col_major", 1, 5, 64, row_align=4) == (1, 2, 8)
    qt = lowbit.quantize(X, "mxfp4", "col_major", row_align=16)
    assert np.array_equal(lowbit.dequantize(qt), lowbit.dequantize(lowbit.quantize(X, "mxfp4")))


# --- float32 arguments given as 4-byte integers are refused, not reinterpreted ----------------

@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.float16, ml_dtypes.bfloat16])
def test_nf4_kcache_dequantize_refuses_non_float32_scale(dtype):
    k = RNG.standard_normal((1, 8, 1, 4)).astype(np.float32)
    codes, scale, residual = lowbit.nf4_kcache_quantize(k)
    _raises(lambda: lowbit.nf4_kcache_dequantize(codes, scale.astype(dtype), residual), "nf4_kcache_dequantize",
            "scale")
    y = lowbit.nf4_kcache_dequantize(codes, scale, residual)
    assert np.abs(y - k).max() <= 0.1 * np.abs(k).max()


def _moe(rng):
    T, H, I, E, k = 3, 32, 32, 2, 1
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    return dict(x=rng.standard_normal((T, H)).astype(np.float32),
                topk_ids=np.array([[0], [1], [-1]], np.int32), topk_weights=np.full((T, k), 0.5, np.float32),
                w1=w1.data, w1_scale=w1.scales, b1=np.zeros((E, 2 * I), np.float32), w2=w2.data,
                w2_scale=w2.scales, b2=np.zeros((E, H), np.float32))


def test_gpt_oss_moe_mlp_refuses_integer_topk_weights():
    p = _moe(np.random.default_rng(5))
    for dt in (np.int32, np.uint32):
        _raises(lambda: lowbit.gpt_oss_moe_mlp(**{**p, "topk_weights": p["topk_weights"].astype(dt)}),
                "gpt_oss_moe_mlp", "topk_weights")
    ref = lowbit.gpt_oss_moe_mlp(**p)
    # int64 topk_ids (torch.topk's dtype) are accepted and give the int32 result
    got = lowbit.gpt_oss_moe_mlp(**{**p, "topk_ids": p["topk_ids"].astype(np.int64)})
    assert np.array_equal(np.asarray(ref), np.asarray(got))


# --- checkpoint metadata: an unknown original dtype is refused naming the tensor --------------

@pytest.mark.parametrize("bad", ["x", "F64", None, 3])
def test_dequantize_checkpoint_refuses_unknown_metadata_dtype(tmp_path, capsys, bad):
    src = tmp_path / "m.safetensors"
    st.save(src, {"layer.weight": RNG.standard_normal((32, 64)).astype(np.float32)}, {"format": "pt"})
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(src), str(q), "--format", "mxfp8", "--quiet"]) == 0
    f = st.SafetensorsFile(q)
    tensors = {n: np.array(f.get(n), copy=True) for n in f.names()}
    meta = dict(f.metadata)
    f.close()
    lm = json.loads(meta["lowbit"])
    assert list(lm["tensors"]) == ["layer.weight"]
    lm["tensors"]["layer.weight"]["dtype"] = bad
    meta["lowbit"] = json.dumps(lm)
    bad_file = tmp_path / "bad.safetensors"
    st.save(bad_file, tensors, meta)
    capsys.readouterr()
    out = tmp_path / "out.safetensors"
    assert main(["dequantize", str(bad_file), str(out)]) == 1
    err = capsys.readouterr().err
    assert "'layer.weight'" in err and "dtype" in err, err
    assert not out.exists()


def test_cpp_api_refuses_row_align_below_one_for_every_layout():
    """The C++ checks too (for callers of the C++ API), not only the Python wrappers."""
    from lowbit import _C
    from lowbit.ops import _PLAIN_FMT

    for kind in (_C.ScaleLayoutKind.row_major, _C.ScaleLayoutKind.col_major, _C.ScaleLayoutKind.blocked128x4,
                 _C.ScaleLayoutKind.blocked8x4):
        with pytest.raises(ValueError, match="scale_shape: argument 'layout': .*row_align must be >= 1"):
            _C.scale_shape(*_PLAIN_FMT.c_args(), kind, 0, _C.GroupPad.none, 1, 4, 64, 0)
        assert len(_C.scale_shape(*_PLAIN_FMT.c_args(), kind, 1, _C.GroupPad.none, 1, 4, 64, 0)) == 3
