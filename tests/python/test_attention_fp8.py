"""The FP8 tensor-core path of the MXFP8 attention (precision="fp8") on the CPU: the argument, the
default left unchanged, the library's CPU model of the FP8 arithmetic against an independent NumPy
model, FlashAttention-3's accuracy rule for that arithmetic on the sweep's data (O_pt emulated in
NumPy), the exactness property the GPU test relies on, varlen, NaN rules and the torch op schema.
The GPU tests of the kernel itself are in test_attention_gpu.py."""

import math

import numpy as np
import pytest

import lowbit

from attention_common import (E4M3, FP8_P_DTYPE, assert_close, check_nan_rules, check_varlen_rows, exact_fp8_inputs,
                              make_inputs, nan_rule_inputs, np_base2_reference, np_fp8_model, np_o_pt, np_reference,
                              rule_ratio, varlen_case)

SHAPES = [  # b, sq, sk, h, hk, d, causal
    (1, 1, 5, 1, 1, 64, False), (2, 3, 7, 4, 2, 64, True), (1, 7, 3, 2, 1, 128, True), (1, 9, 13, 8, 8, 256, True),
    (2, 4, 9, 4, 1, 64, False), (1, 17, 6, 2, 2, 128, False), (1, 1, 1, 1, 1, 64, True), (1, 40, 150, 2, 1, 128, True),
]
_ids = lambda s: "b%d_sq%d_sk%d_h%d-%d_d%d_%s" % (*s[:6], "causal" if s[6] else "full")  # noqa: E731


def test_default_is_the_exact_path():
    q, k, v, qs, ks, vs = make_inputs(1, 9, 13, 4, 2, 128, seed=1, spread=10)
    o0, l0 = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True)
    o1, l1 = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True, precision="exact")
    np.testing.assert_array_equal(o0.view(np.uint16), o1.view(np.uint16))
    np.testing.assert_array_equal(l0, l1)
    assert_close(o0, l0, *np_reference(q, k, v, qs, ks, vs, 1 / math.sqrt(128), True))
    o2, _ = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True, precision="fp8")
    assert not np.array_equal(o0.view(np.uint16), o2.view(np.uint16))  # the model rounds P to E4M3


@pytest.mark.parametrize("bad", ["FP8", "bf16", "", None, 1, True])
def test_precision_argument_errors(bad):
    q, k, v, qs, ks, vs = make_inputs(1, 3, 5, 2, 1, 64, seed=2)
    with pytest.raises(ValueError, match="flash_attn_mxfp8: argument 'precision': expected one of 'exact', 'fp8'"):
        lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, precision=bad)
    with pytest.raises(ValueError, match="flash_attn_mxfp8_varlen: argument 'precision'"):
        lowbit.flash_attn_mxfp8_varlen_func(q[0], k[0], v[0], qs[0], ks[0], vs[0], [0, 3], [0, 5], 3, 5, precision=bad)
    with pytest.raises(ValueError, match="flash_attn_mxfp8_quantized: argument 'precision'"):
        lowbit.flash_attn_mxfp8_quantized(np.zeros((1, 3, 2, 64), np.float32), np.zeros((1, 5, 1, 64), np.float32),
                                          np.zeros((1, 5, 1, 64), np.float32), precision=bad)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("spread", [0, 40])
def test_cpu_model_matches_numpy_model(shape, spread):
    b, sq, sk, h, hk, d, causal = shape
    q, k, v, qs, ks, vs = make_inputs(b, sq, sk, h, hk, d, seed=sq * 17 + sk, spread=spread)
    out, lse = lowbit.flash_attn_mxfp8_func(q.view(E4M3), k, v, qs, ks, vs, causal=causal, precision="fp8")
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq)
    ref_o, ref_l = np_fp8_model(q, k, v, qs, ks, vs, 1 / math.sqrt(d), causal)
    assert_close(out, lse, ref_o, ref_l)


# FlashAttention-3's rule for the FP8 arithmetic (the kernel adds fp32 accumulation and the running
# maximum of its key tiles, which the GPU test covers): the sweep's shapes that the CPU runs quickly
RULE_SHAPES = [(1, 239), (3, 799), (113, 203), (127, 512), (128, 217), (108, 256), (799, 3)]


@pytest.mark.parametrize("sq, sk", RULE_SHAPES)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_rule_of_the_fp8_arithmetic(sq, sk, d, causal):
    h, hk = (4, 1) if sq * sk < 50000 else (1, 1)
    spread = 40 if (sq + d + causal) % 3 == 0 else 0
    q, k, v, qs, ks, vs = make_inputs(1, sq, sk, h, hk, d, seed=sq * 7919 + sk * 31 + d + causal, spread=spread)
    scale = 1 / math.sqrt(d)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=causal, precision="fp8")
    o_ref, lse_ref = np_reference(q, k, v, qs, ks, vs, np.float64(np.float32(scale)), causal)
    o_pt = np_o_pt(q, k, v, qs, ks, vs, scale, causal, FP8_P_DTYPE)
    assert rule_ratio(out, o_ref, o_pt) <= 1.0
    fin = np.isfinite(lse_ref)
    assert (np.abs(lse.astype(np.float64)[fin] - lse_ref[fin]) <= 1e-3 * np.maximum(1, np.abs(lse_ref[fin]))).all()
    assert (lse[~fin] == -np.inf).all() and (out.view(np.uint16)[np.broadcast_to(~fin.transpose(0, 2, 1)[..., None], out.shape)] == 0).all()


@pytest.mark.parametrize("shape", SHAPES + [(1, 130, 300, 4, 2, 64, True), (2, 77, 129, 2, 2, 256, False)], ids=_ids)
def test_exact_inputs_are_exact(shape):
    # the inputs of the GPU's layout-catching test: the FP8 arithmetic is exact up to out's bf16
    # rounding (a wrong token order, channel, scale or fragment would change values by O(1))
    b, sq, sk, h, hk, d, causal = shape
    q, k, v, qs, ks, vs, scale = exact_fp8_inputs(b, sq, sk, h, hk, d, seed=sq + sk + d)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, softmax_scale=scale, causal=causal, precision="fp8")
    assert_close(out, lse, *np_base2_reference(q, k, v, qs, ks, vs, causal))


def test_varlen_matches_fixed_length():
    case = varlen_case(4, 2, 128, seed=20)
    for causal in (False, True):
        out, lse = lowbit.flash_attn_mxfp8_varlen_func(*case.packed, case.cq, case.ck, case.max_q, case.max_k,
                                                       causal=causal, precision="fp8")
        check_varlen_rows(case, out, lse, lambda *s: lowbit.flash_attn_mxfp8_func(*s, causal=causal, precision="fp8"))


def test_nan_rules():
    # the rules of the exact path (docs/attention.md, "NaN policy")
    q, k, v, qs, ks, vs = nan_rule_inputs(v_scale_nan=True)
    out, lse = lowbit.flash_attn_mxfp8_func(q, k, v, qs, ks, vs, causal=True, precision="fp8")
    check_nan_rules(out, lse, v_scale_nan=True)


def test_torch_op_takes_precision(torch):
    import lowbit.torch_ops  # noqa: F401

    q, k, v, qs, ks, vs = (torch.from_numpy(np.ascontiguousarray(a)) for a in make_inputs(1, 5, 9, 2, 1, 64, seed=6))
    out, lse = torch.ops.lowbit.flash_attn_mxfp8(q, k, v, qs, ks, vs, None, True, "fp8")
    want, _ = lowbit.flash_attn_mxfp8_func(q.numpy(), k.numpy(), v.numpy(), qs.numpy(), ks.numpy(), vs.numpy(),
                                           causal=True, precision="fp8")
    assert torch.equal(out.view(torch.int16), torch.from_numpy(want.view(np.int16)))
    fake = torch.ops.lowbit.flash_attn_mxfp8.default._schema
    assert "precision" in str(fake)
    with pytest.raises(ValueError, match="argument 'precision'"):
        torch.ops.lowbit.flash_attn_mxfp8(q, k, v, qs, ks, vs, None, True, "int8")
