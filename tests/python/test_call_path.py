"""The per-call fast paths of the Python layer: shared (cached) Formats and scale shapes, dtype
look-up tables, DLPack export of torch tensors. Caching must never change a result or turn an
error into a success, on the first call or on a later one."""

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import _arrays

X = np.random.default_rng(0).standard_normal((5, 256)).astype(np.float32)


def test_format_of_shares_equal_formats():
    a = lowbit.Format.of("mxfp4", rounding="floor")
    b = lowbit.Format.of("mxfp4", rounding="floor")
    assert a is b and a == lowbit.Format("mxfp4", rounding="floor")
    assert lowbit.Format.of("mxfp4") is not a
    c = lowbit.Format.of(a, rounding="rceil")
    assert c.rounding == "rceil" and a.rounding == "floor"
    assert lowbit.Format.of(a) is a
    assert hash(a) == hash(lowbit.Format("mxfp4", rounding="floor"))
    # derived fields of the immutable Format
    assert (a.packed, a.code_dtype, a.scale_dtype, a.has_zero_point, a.bits) == (True, "uint8", "float8_e8m0fnu",
                                                                                 False, 4)
    u = lowbit.Format("uint4", block=32)
    assert (u.packed, u.code_dtype, u.scale_dtype, u.has_zero_point) == (True, "uint8", "float32", True)
    with pytest.raises(AttributeError):
        a.packed = False


@pytest.mark.parametrize("bad", [True, 32.0, np.int64(32)])
def test_format_cache_keeps_types_apart(bad):
    lowbit.Format.of("int4", block=32)  # a valid entry with an equal key value
    for _ in range(2):
        with pytest.raises(ValueError, match="argument 'block'"):
            lowbit.Format.of("int4", block=bad)


def test_errors_raise_on_every_call():
    for _ in range(3):
        with pytest.raises(ValueError, match="argument 'row_align'"):
            lowbit.quantize(X, "mxfp4", "col_major", row_align=0)
        with pytest.raises(ValueError, match="argument 'rounding'"):
            lowbit.mxfp8_quantize(X, rounding="up")
        with pytest.raises(ValueError, match="argument 'zero_scale'"):
            lowbit.nvfp4_quantize(X, zero_scale="half")
        with pytest.raises(ValueError, match="argument 'block'"):
            lowbit.per_token_group_quant(X, 0)
        with pytest.raises(ValueError, match="argument 'dtype'"):
            lowbit.cast(X, ["float16"])
        with pytest.raises(ValueError, match="argument 'dtype'"):
            lowbit.cast(X, np.bool_)
    with pytest.raises(ValueError, match="argument 'row_align'"):
        lowbit.quantize(X, "mxfp4", "col_major", row_align=[4])


def test_per_token_group_quant_formats_follow_arguments():
    x = X * 1e-12
    _, s1 = lowbit.per_token_group_quant(x, 128, eps=1e-10)
    _, s2 = lowbit.per_token_group_quant(x, 128, eps=1e-20)
    assert not np.array_equal(s1, s2)
    _, s3 = lowbit.per_token_group_quant(x, 64, eps=1e-10)
    assert s3.shape == (5, 4) and s1.shape == (5, 2)
    _, s4 = lowbit.per_token_group_quant(x, 128, scale_ue8m0=True)
    assert s4.dtype == ml_dtypes.float8_e8m0fnu


def test_scale_shapes_follow_the_input():
    for M in (1, 5, 130):
        x = np.ones((M, 256), np.float32)
        q, s = lowbit.mxfp8_quantize(x, swizzled=True)
        assert s.shape == (-(-M // 128) * 128, 8)
        q, s = lowbit.per_token_group_quant(x, 128, column_major_scales=True, tma_aligned=True)
        assert s.shape == (M, 2) and s.strides == (1 * 4, (-(-M // 4) * 4) * 4)
    x3 = np.ones((2, 3, 64), np.float32)
    qt = lowbit.quantize(x3, "nvfp4", "blocked8x4")
    assert qt.data.shape == (2, 3, 32) and qt.scales.shape == (2, 8, 4)


def test_dtype_names_of_every_spelling():
    for spelling in ("bf16", "bfloat16", np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16):
        assert _arrays.dtype_name(spelling) == "bfloat16"
    assert _arrays.dtype_name(np.float32) == "float32"
    assert _arrays.dtype_name("e8m0") == "float8_e8m0fnu"
    with pytest.raises(ValueError, match="op: argument 'arg': unsupported dtype"):
        _arrays.dtype_name({}, "op", "arg")


def test_byte_swapped_input_rejected():
    with pytest.raises(ValueError, match="argument 'x'"):
        lowbit.quantize(X.astype(">f4"), "mxfp4")


# ---------------------------------------------------------------------------------------------
# torch

def _torch():
    return pytest.importorskip("torch")


def test_torch_outputs_are_separate_tensors():
    torch = _torch()
    x = torch.from_numpy(X).to(torch.bfloat16)
    q, s = lowbit.mxfp8_quantize(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
    assert q.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
    assert not q.requires_grad and q.device == x.device
    q2, s2 = lowbit.mxfp8_quantize(x)
    assert q2.data_ptr() != q.data_ptr()
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


def test_torch_tensor_subclass_and_grad_inputs():
    torch = _torch()
    x = torch.from_numpy(X)
    p = torch.nn.Parameter(x.clone())
    ref = lowbit.nvfp4_quantize(x)
    for inp in (p, x.clone().requires_grad_()):
        q, s = lowbit.nvfp4_quantize(inp)
        assert type(q) is torch.Tensor and not q.requires_grad
        assert torch.equal(q, ref[0]) and torch.equal(s.view(torch.uint8), ref[1].view(torch.uint8))


def test_torch_without_dlpack_capsules(monkeypatch):
    """Tensors handed to _C as they are (torch without torch._C._to_dlpack) give the same bytes."""
    torch = _torch()
    x = torch.from_numpy(X).to(torch.bfloat16)
    ref = lowbit.mxfp8_quantize(x)
    ref_d = lowbit.dequantize(lowbit.quantize(x, "mxfp8_e4m3"), "bfloat16")
    monkeypatch.setattr(_arrays, "_to_dlpack", None)
    q, s = lowbit.mxfp8_quantize(x)
    assert torch.equal(q.view(torch.uint8), ref[0].view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), ref[1].view(torch.uint8))
    d = lowbit.dequantize(lowbit.quantize(x, "mxfp8_e4m3"), "bfloat16")
    assert torch.equal(d, ref_d)


def test_torch_fp8_inputs_exported():
    torch = _torch()
    x = torch.from_numpy(X)
    y = lowbit.cast(x, torch.float8_e4m3fn)
    z = lowbit.cast(y, "float32")
    np.testing.assert_array_equal(z.numpy(), lowbit.cast(lowbit.cast(X, "float8_e4m3fn"), "float32"))
    s = lowbit.mxfp8_quantize(x)[1]
    b = lowbit.block_scale_interleave(s)
    assert b.dtype == torch.float8_e8m0fnu and tuple(b.shape) == (128, 8)
    np.testing.assert_array_equal(b.view(torch.uint8).numpy(),
                                  lowbit.block_scale_interleave(s.view(torch.uint8).numpy()))
