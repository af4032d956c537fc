"""torch tensors in, torch tensors out; the lowbit:: custom ops; and (marked gpu) CUDA results
compared byte for byte with the CPU reference for every op, format and layout. Everything here
skips without torch; the gpu tests skip without a CUDA device or a CUDA build of lowbit."""

import ml_dtypes
import numpy as np
import pytest

import lowbit

torch = pytest.importorskip("torch")

FORMATS = lowbit.FORMAT_NAMES
LAYOUTS = ["row_major", "col_major", "blocked128x4", "blocked8x4"]
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def fmt_kwargs(name):
    return {"block": 32} if name in ("fp8_e4m3", "fp8_e5m2", "int4", "uint4", "nf4") else {}


def raw(a):
    """Bytes of a NumPy array or torch tensor (any device) as a NumPy uint8 array."""
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        a = a.detach().contiguous().cpu()
        return a.view(torch.uint8).numpy() if a.element_size() == 1 else a.view(torch.uint8).numpy()
    return np.ascontiguousarray(a).view(np.uint8)


def to_numpy(t):
    """A CPU NumPy copy of a float32 / float16 / bfloat16 tensor (bf16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def rand(shape, dtype="float32", device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape[:-1] + (1,), generator=g).float())
    return x.to(TORCH_DTYPES[dtype]).to(device)


def assert_same_quantized(a, b):
    np.testing.assert_array_equal(raw(a.data), raw(b.data))
    np.testing.assert_array_equal(raw(a.scales), raw(b.scales))
    np.testing.assert_array_equal(raw(a.zeros), raw(b.zeros))
    np.testing.assert_array_equal(raw(a.global_amax), raw(b.global_amax))


# ---------------------------------------------------------------------------------------------
# torch CPU tensors

@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_torch_cpu_matches_numpy(name, dtype):
    x = rand((7, 64), dtype, seed=1)
    qt = lowbit.quantize(x, name, "blocked128x4", **fmt_kwargs(name))
    ref = lowbit.quantize(to_numpy(x), name, "blocked128x4", **fmt_kwargs(name))
    assert isinstance(qt.data, torch.Tensor) and isinstance(qt.scales, torch.Tensor)
    f = qt.format
    assert qt.data.dtype == {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
                             "uint8": torch.uint8}[f.code_dtype]
    assert qt.scales.dtype == {"float32": torch.float32, "float8_e8m0fnu": torch.float8_e8m0fnu,
                               "float8_e4m3fn": torch.float8_e4m3fn}[f.scale_dtype]
    assert_same_quantized(qt, ref)
    y = lowbit.dequantize(qt, "bfloat16")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and tuple(y.shape) == (7, 64)
    np.testing.assert_array_equal(raw(y), raw(lowbit.dequantize(ref, "bfloat16")))
    y2 = lowbit.dequantize(qt, torch.float16)
    assert y2.dtype == torch.float16


def test_torch_cpu_cast_and_amax():
    x = rand((5, 33), "bfloat16", seed=2) * 100
    y = lowbit.cast(x, torch.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(raw(y), raw(x.float().clamp(-448, 448).to(torch.float8_e4m3fn)))
    a = lowbit.tensor_amax(x)
    assert a.dtype == torch.float32 and a.item() == x.abs().max().float().item()


def test_torch_cpu_requires_grad_and_fp4_x2_input():
    x = rand((4, 64), seed=3).requires_grad_()
    qt = lowbit.quantize(x, "mxfp4")
    if hasattr(torch, "float4_e2m1fn_x2"):
        q2 = qt.data.view(torch.float4_e2m1fn_x2)
        y = lowbit.dequantize(lowbit.Quantized(q2, qt.scales, format="mxfp4"))
        np.testing.assert_array_equal(y.numpy(), lowbit.dequantize(qt).numpy())


def test_torch_cpu_per_token_group_quant_column_major():
    x = rand((9, 256), "bfloat16", seed=4)
    q, s = lowbit.per_token_group_quant(x, 128, column_major_scales=True, tma_aligned=True)
    assert tuple(s.shape) == (9, 2) and s.stride() == (1, 12)
    q0, s0 = lowbit.per_token_group_quant(x, 128)
    assert torch.equal(s.contiguous(), s0)


# ---------------------------------------------------------------------------------------------
# custom ops

def _ops_cases(device):
    x = rand((7, 128), "bfloat16", device, seed=5)
    xf = rand((3, 5, 64), "float32", device, seed=6)
    amax = x.abs().max().float().reshape(1)
    qt = lowbit.quantize(x, "mxfp4", "blocked128x4")
    q8 = lowbit.quantize(x, "uint4", block=32)
    return [
        (torch.ops.lowbit.mxfp8_quantize.default, (x, False, "rceil")),
        (torch.ops.lowbit.mxfp8_quantize.default, (xf, True, "floor")),
        (torch.ops.lowbit.mxfp4_quantize.default, (x, True, "rceil")),
        (torch.ops.lowbit.nvfp4_quantize.default, (x, amax, False)),
        (torch.ops.lowbit.nvfp4_quantize.default, (xf, None, True)),
        (torch.ops.lowbit.per_token_group_quant.default, (x, 64, "float8_e4m3fn", False, True, True, 1e-10)),
        (torch.ops.lowbit.per_token_group_quant.default, (x, 32, "int4", True, False, False, 1e-10)),
        (torch.ops.lowbit.quantize.default, (x, "uint4", "col_major", 32, "", "", "low", "", 1e-10, 4)),
        (torch.ops.lowbit.quantize.default, (xf, "nf4", "blocked8x4", 32)),
        (torch.ops.lowbit.dequantize.default, (qt.data, qt.scales, None, None, "mxfp4", "blocked128x4")),
        (torch.ops.lowbit.dequantize.default, (q8.data, q8.scales, q8.zeros, None, "uint4", "row_major", 32, "", "",
                                               "low", "", 1e-10, 1, torch.bfloat16)),
        (torch.ops.lowbit.cast.default, (x, torch.float8_e5m2, False)),
        (torch.ops.lowbit.block_scale_interleave.default, (qt.scales[:7, :4].contiguous(),)),
        (torch.ops.lowbit.block_scale_deinterleave.default, (qt.scales, 7, 4)),
    ]


def test_custom_ops_registered_and_match_functions():
    import lowbit.torch_ops  # noqa: F401  registers torch.ops.lowbit.*

    x = rand((7, 128), "bfloat16", seed=7)
    q, s = torch.ops.lowbit.mxfp8_quantize(x)
    q2, s2 = lowbit.mxfp8_quantize(x)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s.view(torch.uint8),
                                                                                   s2.view(torch.uint8))
    q, s, z = torch.ops.lowbit.quantize(x, "int4", block=64)
    assert z.numel() == 0 and q.shape == (7, 64) and s.shape == (7, 2)


def test_custom_ops_opcheck_cpu():
    import lowbit.torch_ops  # noqa: F401

    for op, args in _ops_cases("cpu"):
        torch.library.opcheck(op, args, test_utils=("test_faketensor",))  # fp8 outputs: no arithmetic checks


def test_custom_ops_fake_shapes():
    import lowbit.torch_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    for op, args in _ops_cases("cpu"):
        real = op(*args)
        with FakeTensorMode() as mode:
            fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fargs)
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        for r, f in zip(real, fake):
            assert (tuple(r.shape), r.dtype, r.stride()) == (tuple(f.shape), f.dtype, f.stride()), op


def test_decode_custom_ops_cpu():
    """The NF4 K-cache decode ops (CPU reference): fakes match, results equal the functions'."""
    import lowbit.torch_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(3)
    c, s, r = lowbit.nf4_kcache_quantize(torch.randn((2, 40, 2, 64), generator=g))
    q = torch.randn((2, 1, 4, 64), generator=g).to(torch.bfloat16)
    v = torch.randn((2, 40, 2, 64), generator=g).to(torch.bfloat16)
    x = torch.randn((2, 5, 16), generator=g)
    w = torch.randn((128, 16), generator=g)
    pos = torch.arange(5, dtype=torch.int32).expand(2, 5).contiguous()
    cases = [(torch.ops.lowbit.attn_forward_decode_nf4.default, (q, c, s, r, v, None, None, 16, 8, 2.0)),
             (torch.ops.lowbit.kproj_rope_nf4_encode.default, (x, w, pos, 64))]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_faketensor",))
        real = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        for rt, ft in zip(real, fake):
            assert (tuple(rt.shape), rt.dtype, rt.stride()) == (tuple(ft.shape), ft.dtype, ft.stride()), op
    out, ratio = torch.ops.lowbit.attn_forward_decode_nf4(q, c, s, r, v, None, None, 16, 8, 2.0)
    out2, ratio2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v, block_size=16, sub_block_size=8, delta=2.0,
                                                  return_skip_ratio=True)
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16)) and torch.equal(ratio, ratio2)
    c2, s2, r2 = c.clone(), s.clone(), r.clone()
    new = torch.randn((2, 1, 2, 64), generator=g) * 4
    lens = torch.tensor([10, 39], dtype=torch.int32)
    torch.ops.lowbit.nf4_kcache_append(new, c, s, r, lens)
    lowbit.nf4_kcache_append(new, c2, s2, r2, lens)
    assert torch.equal(c, c2) and torch.equal(s, s2) and torch.equal(r.view(torch.uint8), r2.view(torch.uint8))


# ---------------------------------------------------------------------------------------------
# CUDA (byte for byte against the CPU reference)

@pytest.mark.gpu
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("shape", [(1, 64), (7, 128), (129, 96), (3, 33, 64)])
def test_gpu_quantize_dequantize_match_cpu(name, layout, dtype, shape):
    x = rand(shape, dtype, seed=shape[-2])
    kw = fmt_kwargs(name)
    extra = {"compute_global_amax": True} if name == "nvfp4" else {}
    cpu = lowbit.quantize(x, name, layout, row_align=4, **extra, **kw)
    gpu = lowbit.quantize(x.cuda(), name, layout, row_align=4, **extra, **kw)
    assert gpu.data.is_cuda and gpu.scales.is_cuda
    assert_same_quantized(gpu, cpu)
    for out in ("float32", "bfloat16", "float8_e4m3fn"):
        np.testing.assert_array_equal(raw(lowbit.dequantize(gpu, out)), raw(lowbit.dequantize(cpu, out)))


@pytest.mark.gpu
@pytest.mark.parametrize("rounding", ["rceil", "floor"])
@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
def test_gpu_mx_rounding_and_special_values(rounding, name):
    x = rand((64, 256), seed=9)
    x[0, 0], x[1, 40], x[2, :32], x[3, 5] = float("nan"), float("inf"), 0.0, 1e-40
    x[4] *= 1e30
    cpu = lowbit.quantize(x, name, rounding=rounding)
    gpu = lowbit.quantize(x.cuda(), name, rounding=rounding)
    assert_same_quantized(gpu, cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("zero_scale", ["zero", "min", "one"])
def test_gpu_nvfp4_given_amax_and_zero_scale(zero_scale):
    x = rand((130, 128), "bfloat16", seed=10)
    x[5] = 0
    amax = torch.tensor([3.5], dtype=torch.float32)
    cpu = lowbit.quantize(x, "nvfp4", global_amax=amax, zero_scale=zero_scale)
    gpu = lowbit.quantize(x.cuda(), "nvfp4", global_amax=amax.cuda(), zero_scale=zero_scale)
    assert_same_quantized(gpu, cpu)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["flashinfer", "cumsum"])
@pytest.mark.parametrize("ind_dtype", [torch.int32, torch.int64])
def test_gpu_grouped_layout(rule, ind_dtype):
    ind = torch.tensor([0, 5, 5, 140, 300], dtype=ind_dtype)
    x = rand((300, 128), "bfloat16", seed=11)
    cpu = lowbit.quantize(x, "mxfp4", "blocked128x4", m_indptr=ind, group_pad=rule)
    gpu = lowbit.quantize(x.cuda(), "mxfp4", "blocked128x4", m_indptr=ind.cuda(), group_pad=rule)
    assert_same_quantized(gpu, cpu)
    np.testing.assert_array_equal(raw(lowbit.dequantize(gpu)), raw(lowbit.dequantize(cpu)))
    for src, dst in (("blocked128x4", "row_major"), ("row_major", "blocked128x4")):
        s_cpu = cpu.scales if src == "blocked128x4" else lowbit.quantize(x, "mxfp4").scales
        a = lowbit.convert_scale_layout(s_cpu, 300, 4, src, dst, m_indptr=ind, group_pad=rule)
        b = lowbit.convert_scale_layout(s_cpu.cuda(), 300, 4, src, dst, m_indptr=ind.cuda(), group_pad=rule)
        np.testing.assert_array_equal(raw(b), raw(a))


@pytest.mark.gpu
@pytest.mark.parametrize("src", ["row_major", "col_major", "blocked128x4", "blocked8x4"])
@pytest.mark.parametrize("dst", ["row_major", "col_major", "blocked128x4", "blocked8x4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_gpu_convert_scale_layout(src, dst, dtype):
    R, C = 131, 6
    s = (torch.arange(2 * R * C) % 251).to(dtype).reshape(2, R, C)
    s_src = lowbit.convert_scale_layout(s, R, C, "row_major", src, dst_row_align=4)
    a = lowbit.convert_scale_layout(s_src, R, C, src, dst, src_row_align=4, dst_row_align=16)
    b = lowbit.convert_scale_layout(s_src.cuda(), R, C, src, dst, src_row_align=4, dst_row_align=16)
    np.testing.assert_array_equal(raw(b), raw(a))


@pytest.mark.gpu
@pytest.mark.parametrize("name,out", [("mxfp4", "float8_e4m3fn"), ("nvfp4", "float8_e5m2"), ("int4", "float8_e4m3fn"),
                                      ("uint4", "float8_e4m3fn")])
def test_gpu_transcode(name, out):
    x = rand((33, 128), seed=12)
    cpu = lowbit.quantize(x, name, **fmt_kwargs(name))
    gpu = lowbit.quantize(x.cuda(), name, **fmt_kwargs(name))
    np.testing.assert_array_equal(raw(lowbit.transcode(gpu, out)), raw(lowbit.transcode(cpu, out)))


@pytest.mark.gpu
@pytest.mark.parametrize("src", list(TORCH_DTYPES) + ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dst", list(TORCH_DTYPES) + ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("saturate", [True, False])
def test_gpu_cast_all_patterns(src, dst, saturate):
    if src.startswith("float8"):
        x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(getattr(torch, src)).reshape(16, 16)
    elif src == "float32":
        x = torch.randint(-2**31, 2**31 - 1, (512, 512), dtype=torch.int32).view(torch.float32)
    else:
        x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(TORCH_DTYPES[src]).reshape(256, 256)
    x = x[:, ::2]  # strided
    a = lowbit.cast(x, dst, saturate)
    b = lowbit.cast(x.cuda(), dst, saturate)
    np.testing.assert_array_equal(raw(b), raw(a))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_gpu_amax_and_kcache(dtype):
    x = rand((3, 77, 96), dtype, seed=13)
    np.testing.assert_array_equal(raw(lowbit.tensor_amax(x.cuda())), raw(lowbit.tensor_amax(x)))
    k = rand((2, 37, 4, 64), dtype, seed=14)
    for residual in ("float8_e5m2", "float8_e4m3fn"):
        for order in ("low", "high"):
            a = lowbit.nf4_kcache_quantize(k, residual, order)
            b = lowbit.nf4_kcache_quantize(k.cuda(), residual, order)
            for u, v in zip(a, b):
                np.testing.assert_array_equal(raw(v), raw(u))
            for res in (None, 2):
                ya = lowbit.nf4_kcache_dequantize(a[0], a[1], None if res is None else a[2], dtype, order)
                yb = lowbit.nf4_kcache_dequantize(b[0], b[1], None if res is None else b[2], dtype, order)
                np.testing.assert_array_equal(raw(yb), raw(ya))


@pytest.mark.gpu
def test_gpu_custom_ops_match_cpu_and_opcheck():
    import lowbit.torch_ops  # noqa: F401

    for (op, args_cpu), (_, args_gpu) in zip(_ops_cases("cpu"), _ops_cases("cuda")):
        a, b = op(*args_cpu), op(*args_gpu)
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        for u, v in zip(a, b):
            assert v.is_cuda
            np.testing.assert_array_equal(raw(v), raw(u))
        torch.library.opcheck(op, args_gpu, test_utils=("test_faketensor",))


@pytest.mark.gpu
def test_gpu_current_stream_and_cuda_graph():
    import lowbit.torch_ops  # noqa: F401

    x = rand((256, 512), "bfloat16", "cuda", seed=15)
    ref = lowbit.nvfp4_quantize(x.cpu(), x.abs().max().float().reshape(1).cpu(), True)
    amax = x.abs().max().float().reshape(1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up on a side stream, as graph capture requires
            torch.ops.lowbit.nvfp4_quantize(x, amax, True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, sc = torch.ops.lowbit.nvfp4_quantize(x, amax, True)
        q8, s8 = torch.ops.lowbit.mxfp8_quantize(x, False, "rceil")
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(raw(q), raw(ref[0]))
    np.testing.assert_array_equal(raw(sc), raw(ref[1]))
    r8 = lowbit.mxfp8_quantize(x.cpu())
    np.testing.assert_array_equal(raw(q8), raw(r8[0]))
    np.testing.assert_array_equal(raw(s8), raw(r8[1]))


@pytest.mark.gpu
def test_gpu_torch_compile():
    import lowbit.torch_ops  # noqa: F401

    def f(x):
        q, s = torch.ops.lowbit.mxfp8_quantize(x * 2, False, "rceil")
        y = torch.ops.lowbit.dequantize(q, s, None, None, "mxfp8_e4m3")
        return y + 1

    x = rand((64, 256), "bfloat16", "cuda", seed=16)
    got = torch.compile(f, fullgraph=True)(x)
    want = f(x)
    assert torch.equal(got, want)
