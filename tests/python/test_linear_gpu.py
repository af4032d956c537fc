"""CUDA results of the dense linears. Every test is marked gpu (skipped without torch, a CUDA device
or a CUDA build of lowbit).

mxfp4_gemm runs the grouped MXFP4 GEMM's sm_90a kernel with one group. Each result is checked
against the float64 reference of the quantized operands (linear_common.py) under the library's
GEMM rule |out - ref| <= 1e-3 + 1e-3 |ref| per element, widened by one output ulp for the final
rounding to bf16 / fp16 (assert_gemm_rule), and against lowbit's CPU reference on the same bytes
under the same rule. Outputs are poisoned (NaN bits) before every call, so an element the kernel
never writes fails. M in {1, 7, 64, 256, 1000}; plain and prepacked weights; W4A16 and W4A8.

nvfp4_gemm runs the NVFP4 dual GEMM's mainloop (N a multiple of 128, K of 64; other shapes raise
NotImplementedError naming the constraint), checked the same way against the float64 reference of
the quantized operands and against lowbit's CPU reference.
"""

import numpy as np
import pytest

import lowbit
from linear_common import MxOps, NvOps, assert_gemm_rule, stored
from moe_gpu_common import POISON_NAN, _decode_bits, _dev, _host_bits

MS = [1, 7, 64, 256, 1000]
# (N, K, act, a_layout, b_layout, bias, out dtype)
CONFIGS = [
    (256, 512, "bf16", "row_major", "row_major", False, "bfloat16"),
    (264, 544, "e4m3", "row_major", "blocked128x4", True, "bfloat16"),
    (2880, 2880, "e4m3", "blocked128x4", "blocked128x4", True, "float16"),
    (136, 4096, "bf16", "row_major", "blocked128x4", True, "float16"),
    (512, 256, "e5m2", "blocked128x4", "row_major", False, "bfloat16"),
]


def _cfg_id(c):
    n, k, act, la, lb, bias, out = c
    return f"n{n}-k{k}-{act}-a{la[:3]}-b{lb[:3]}{'-bias' if bias else ''}-{out}"


def _run(torch, ops, la, lb, out_dtype, packed, stream=None):
    """mxfp4_gemm on CUDA copies of ops into a poisoned output; returns (host bits, host CPU reference
    bits of the same call)."""
    a = _dev(torch, ops.a)
    a_sc = None if ops.a_sc is None else _dev(torch, stored(ops.a_sc, la))
    b, b_sc = _dev(torch, ops.b), _dev(torch, stored(ops.b_sc, lb))
    hb, hs = ops.b, stored(ops.b_sc, lb)
    kw = {}
    if packed:
        b, b_sc = lowbit.mxfp4_gemm_prepack(b, b_sc, b_scale_layout=lb)
        hb, hs = lowbit.mxfp4_gemm_prepack(hb, hs, b_scale_layout=lb)
        kw = {"b_packed": True, "n": ops.N}
    tdt = getattr(torch, out_dtype)
    out = torch.empty((ops.M, ops.N), dtype=tdt, device="cuda")
    out.view(torch.int16).fill_(POISON_NAN)
    bias = None if ops.bias is None else _dev(torch, ops.bias)
    lowbit.mxfp4_gemm(a, b, b_sc, a_scale=a_sc, bias=bias, a_scale_layout=la, b_scale_layout=lb, out=out,
                      b_packed=packed)
    got = _host_bits(torch, out)
    cpu = lowbit.mxfp4_gemm(ops.a, hb, hs, a_scale=None if ops.a_sc is None else stored(ops.a_sc, la), bias=ops.bias,
                            a_scale_layout=la, b_scale_layout=lb, out_dtype=out_dtype, **kw)
    return got, cpu.view(np.uint16)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=[_cfg_id(c) for c in CONFIGS])
def test_mxfp4_gemm_cuda_matches_reference(torch, cfg, M, packed):
    N, K, act, la, lb, bias, out_dtype = cfg
    ops = MxOps(M, N, K, act, bias=bias, seed=M * 31 + N + K)
    got, cpu = _run(torch, ops, la, lb, out_dtype, packed)
    label = f"{_cfg_id(cfg)} M={M} {'packed' if packed else 'plain'}"
    ref = ops.reference()
    assert_gemm_rule(_decode_bits(got, out_dtype), ref, out_dtype, label)
    assert_gemm_rule(_decode_bits(cpu, out_dtype), ref, out_dtype, label + " (CPU reference)")


@pytest.mark.gpu
def test_mxfp4_gemm_cuda_graph_replay(torch):
    """Captured once, replayed with new activations: the one group's bounds come from a device
    constant (no host copy in the captured work), so the replay computes the new product."""
    M, N, K = 48, 256, 512
    ops = MxOps(M, N, K, "bf16", bias=True, seed=11)
    a = _dev(torch, ops.a)
    b, b_sc, bias = _dev(torch, ops.b), _dev(torch, ops.b_sc), _dev(torch, ops.bias)
    out = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    lowbit.mxfp4_gemm(a, b, b_sc, bias=bias, out=out)  # warm-up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            lowbit.mxfp4_gemm(a, b, b_sc, bias=bias, out=out)
    ops2 = MxOps(M, N, K, "bf16", bias=True, seed=12)
    ops2.b, ops2.b_sc, ops2.bias = ops.b, ops.b_sc, ops.bias
    a.copy_(_dev(torch, ops2.a))
    out.view(torch.int16).fill_(POISON_NAN)
    g.replay()
    torch.cuda.synchronize()
    assert_gemm_rule(_decode_bits(_host_bits(torch, out), "bfloat16"), ops2.reference(), "bfloat16", "graph replay")


@pytest.mark.gpu
def test_mxfp4_gemm_torch_custom_op(torch):
    from lowbit import torch_ops  # noqa: F401

    ops = MxOps(7, 64, 128, "e4m3", bias=True, seed=5)
    a, a_sc, b, b_sc, bias = (_dev(torch, ops.a), _dev(torch, ops.a_sc), _dev(torch, ops.b), _dev(torch, ops.b_sc),
                              _dev(torch, ops.bias))
    c = torch.ops.lowbit.mxfp4_gemm(a, b, b_sc, a_sc, bias)
    assert c.shape == (7, 64) and c.dtype == torch.bfloat16 and c.is_cuda
    direct = lowbit.mxfp4_gemm(a, b, b_sc, a_scale=a_sc, bias=bias)
    assert torch.equal(c.view(torch.int16), direct.view(torch.int16))


@pytest.mark.gpu
def test_mxfp4_gemm_cuda_refuses_misaligned_weights(torch):
    ops = MxOps(4, 16, 64, "bf16", seed=6)
    a = _dev(torch, ops.a)
    b = torch.zeros(16 * 32 + 1, dtype=torch.uint8, device="cuda")[1:].view(16, 32)
    with pytest.raises(ValueError, match="mxfp4_gemm: argument 'b'.*16-byte"):
        lowbit.mxfp4_gemm(a, b, _dev(torch, ops.b_sc))


NV_CONFIGS = [  # (N, K, nvfp4 activations, amaxes, bias, out dtype)
    (128, 64, True, False, False, "bfloat16"),
    (256, 512, False, False, True, "bfloat16"),
    (384, 1024, True, True, True, "float16"),
    (1024, 4096, False, True, False, "bfloat16"),
    (4352, 512, False, False, True, "bfloat16"),  # 34 CTA columns: the launch order in groups of 32
]


@pytest.mark.gpu
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("cfg", NV_CONFIGS, ids=lambda c: f"n{c[0]}-k{c[1]}-{'nvfp4' if c[2] else 'bf16'}"
                         f"{'-amax' if c[3] else ''}{'-bias' if c[4] else ''}-{c[5]}")
def test_nvfp4_gemm_matches_reference(torch, M, cfg):
    n, k, nvfp4_a, amax, bias, out_dtype = cfg
    ops = NvOps(M, n, k, nvfp4_a=nvfp4_a, amax=amax, bias=bias, seed=M + n + k)
    dev = {name: None if getattr(ops, name) is None else _dev(torch, getattr(ops, name))
           for name in ("a", "a_sc", "b", "b_sc", "amax_a", "amax_b", "bias")}
    out = torch.empty((M, n), dtype=getattr(torch, out_dtype), device="cuda")
    out.view(torch.int16).fill_(POISON_NAN)
    lowbit.nvfp4_gemm(dev["a"], dev["b"], dev["b_sc"], a_scale=dev["a_sc"], amax_a=dev["amax_a"],
                      amax_b=dev["amax_b"], bias=dev["bias"], out=out)
    got = _decode_bits(_host_bits(torch, out), out_dtype)
    ref = ops.reference()
    assert_gemm_rule(got, ref, out_dtype)
    cpu = lowbit.nvfp4_gemm(ops.a, ops.b, ops.b_sc, a_scale=ops.a_sc, amax_a=ops.amax_a, amax_b=ops.amax_b,
                            bias=ops.bias, out_dtype=out_dtype)
    assert_gemm_rule(got, _decode_bits(np.asarray(cpu).view(np.uint16), out_dtype), out_dtype)


@pytest.mark.gpu
def test_nvfp4_gemm_cuda_refuses_partial_tiles(torch):
    ops = NvOps(8, 16, 64, nvfp4_a=True, seed=1)
    out = torch.full((8, 16), 7.0, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match="nvfp4_gemm: the CUDA kernel needs N a multiple of 128"):
        lowbit.nvfp4_gemm(_dev(torch, ops.a), _dev(torch, ops.b), _dev(torch, ops.b_sc), a_scale=_dev(torch, ops.a_sc),
                          out=out)
    assert bool((out == 7.0).all())


@pytest.mark.gpu
def test_build_info_lists_the_cuda_linears():
    info = lowbit.build_info()
    if info["sm"] >= 90 and "group_gemm_mxfp4_nt_groupwise" in info["cuda_ops"]:
        assert "mxfp4_gemm" in info["cuda_ops"]
        assert "nvfp4_gemm" in info["cuda_ops"]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 64, 1000])
@pytest.mark.parametrize("layout", ["row_major", "blocked128x4"])
def test_nvfp4_gemm_prepacked_weights(torch, M, layout):
    """nvfp4_gemm_prepack on CUDA writes the CPU prepack's bytes, and the call with them gives the
    bits of the call without (the same kernel on the same fragments), also through the torch ops."""
    import lowbit.torch_ops  # noqa: F401

    n, k = 384, 1024
    ops = NvOps(M, n, k, nvfp4_a=False, amax=True, bias=True, seed=M + 3)
    b, b_sc = _dev(torch, ops.b), _dev(torch, stored(ops.b_sc, layout))
    packed = lowbit.nvfp4_gemm_prepack(b, b_sc, b_scale_layout=layout)
    cpu_packed = lowbit.nvfp4_gemm_prepack(ops.b, stored(ops.b_sc, layout), b_scale_layout=layout)
    assert packed.is_cuda and np.array_equal(packed.cpu().numpy(), cpu_packed)
    a, amax_b, bias = _dev(torch, ops.a), _dev(torch, ops.amax_b), _dev(torch, ops.bias)
    plain = lowbit.nvfp4_gemm(a, b, b_sc, b_scale_layout=layout, amax_b=amax_b, bias=bias)
    out = torch.empty((M, n), dtype=torch.bfloat16, device="cuda")
    out.view(torch.int16).fill_(POISON_NAN)
    lowbit.nvfp4_gemm(a, packed, None, amax_b=amax_b, bias=bias, b_packed=True, out=out)
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16))
    op_packed = torch.ops.lowbit.nvfp4_gemm_prepack(b, b_sc, layout)
    y = torch.ops.lowbit.nvfp4_gemm(a, op_packed, None, None, None, amax_b, bias, "row_major", layout,
                                    torch.bfloat16, True, n)
    assert torch.equal(y.view(torch.int16), plain.view(torch.int16))


@pytest.mark.gpu
def test_nvfp4_gemm_activation_paths(torch):
    """Contiguous 16-byte aligned bf16 activations are read as they are; strided or misaligned rows
    go through the activation pass: the same bits either way."""
    n, k, M = 256, 512, 37
    ops = NvOps(M, n, k, nvfp4_a=False, amax=True, seed=9)
    b, b_sc = _dev(torch, ops.b), _dev(torch, ops.b_sc)
    a = _dev(torch, ops.a)
    want = lowbit.nvfp4_gemm(a, b, b_sc, amax_b=_dev(torch, ops.amax_b))
    for off in (0, 4):  # row stride k + 24; the second 8 bytes off 16-byte alignment
        wide = torch.zeros((M, k + 24), dtype=a.dtype, device="cuda")
        wide[:, off:off + k] = a
        got = lowbit.nvfp4_gemm(wide[:, off:off + k], b, b_sc, amax_b=_dev(torch, ops.amax_b))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
