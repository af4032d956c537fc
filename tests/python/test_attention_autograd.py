"""lowbit.flash_attn_mxfp8_autograd on the CPU (torch): the forward equals
flash_attn_mxfp8_quantized bit for bit, the backward is the gradient of attention at the
dequantized inputs (against torch autograd of an fp64 attention, within bf16 rounding), causal
rows that see no key get zero gradients, GQA gradients have the KV shapes, torch.compile traces
it. The GPU test is in test_attention_gpu.py."""

import math

import pytest

torch = pytest.importorskip("torch")

import lowbit  # noqa: E402
from lowbit.attention_autograd import _dequantize  # noqa: E402


def _ref_attention(q, k, v, scale, causal):
    """fp64 attention [b, s_q, h, d] (GQA by repetition, causal bottom-right, blind rows 0)."""
    b, s_q, h, d = q.shape
    s_k, hk = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(h // hk, dim=2)
    vv = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    if causal:
        i = torch.arange(s_q)[:, None]
        j = torch.arange(s_k)[None, :]
        s = s.masked_fill(~(j <= i + s_k - s_q), -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no key: 0
    return torch.einsum("bhij,bjhd->bihd", p, vv)


def _inputs(b, s_q, s_k, h, hk, d, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((b, s_q, h, d), generator=g).to(dtype).requires_grad_(True)
    k = torch.randn((b, s_k, hk, d), generator=g).to(dtype).requires_grad_(True)
    v = torch.randn((b, s_k, hk, d), generator=g).to(dtype).requires_grad_(True)
    return q, k, v


@pytest.mark.parametrize("shape", [(1, 37, 37, 4, 4, 64), (2, 50, 80, 8, 2, 64), (1, 90, 40, 4, 1, 128)],
                         ids=lambda s: "b%d_sq%d_sk%d_h%d-%d_d%d" % s)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_gradients(shape, causal):
    b, s_q, s_k, h, hk, d = shape
    q, k, v = _inputs(b, s_q, s_k, h, hk, d, seed=s_q + s_k)
    out = lowbit.flash_attn_mxfp8_autograd(q, k, v, causal=causal)
    want, _ = lowbit.flash_attn_mxfp8_quantized(q.detach(), k.detach(), v.detach(), causal=causal)
    assert out.dtype == torch.bfloat16 and torch.equal(out.view(torch.int16), want.view(torch.int16))
    g = torch.Generator().manual_seed(7)
    dout = torch.randn(out.shape, generator=g).to(torch.bfloat16)
    out.backward(dout)
    # the reference gradient: fp64 attention of the dequantized inputs
    deq = [_dequantize(*torch.ops.lowbit.quantize_mxfp8_attn(t.detach(), "bshd", "rceil")).double().requires_grad_(True)
           for t in (q, k, v)]
    ref = _ref_attention(*deq, 1 / math.sqrt(d), causal)
    rq, rk, rv = torch.autograd.grad(ref, deq, dout.double())
    for name, got, want_g, src in (("dq", q.grad, rq, q), ("dk", k.grad, rk, k), ("dv", v.grad, rv, v)):
        assert got.shape == src.shape and got.dtype == src.dtype, name
        assert torch.isfinite(got).all(), name
        err = (got.double() - want_g).abs().max().item()
        # out and lse enter the backward in bf16 / fp32 (about 2^-9 relative): measured <= 3.4e-3
        assert err <= 1e-2 * want_g.abs().max().item(), (name, err, want_g.abs().max().item())
    if causal and s_q > s_k:  # query rows that see no key: no gradient, output 0
        blind = s_q - s_k
        assert (q.grad[:, :blind] == 0).all() and (out[:, :blind] == 0).all()


def test_float32_inputs_softmax_scale_and_partial_grads():
    q, k, v = _inputs(1, 20, 30, 2, 2, 64, seed=3, dtype=torch.float32)
    k.requires_grad_(False)
    out = lowbit.flash_attn_mxfp8_autograd(q, k, v, softmax_scale=0.3)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and v.grad.dtype == torch.float32 and k.grad is None
    want, _ = lowbit.flash_attn_mxfp8_quantized(q.detach(), k, v.detach(), softmax_scale=0.3)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_errors_name_the_argument():
    q, k, v = _inputs(1, 8, 8, 2, 2, 64, seed=4)
    with pytest.raises(ValueError, match="argument 'k'"):
        lowbit.flash_attn_mxfp8_autograd(q, [1], v)
    with pytest.raises(ValueError, match="argument 'x'.*multiple of 32"):
        lowbit.flash_attn_mxfp8_autograd(q[..., :40], k[..., :40], v[..., :40])


def test_torch_compile_traces_it():
    q, k, v = _inputs(1, 16, 16, 2, 2, 64, seed=5)
    f = torch.compile(lambda a, b, c: lowbit.flash_attn_mxfp8_autograd(a, b, c, causal=True), backend="aot_eager",
                      fullgraph=True)
    out = f(q, k, v)
    out.float().sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out2 = lowbit.flash_attn_mxfp8_autograd(q2, k2, v2, causal=True)
    out2.float().sum().backward()
    assert torch.equal(out.view(torch.int16), out2.view(torch.int16))
    assert torch.equal(q.grad, q2.grad) and torch.equal(v.grad, v2.grad)


def test_fp8_forward():
    # precision="fp8": the forward is flash_attn_mxfp8_quantized(precision="fp8") bit for bit, the
    # backward the same as the exact forward's (the gradient at the dequantized inputs)
    q, k, v = _inputs(1, 12, 20, 2, 1, 64, seed=6)
    out = lowbit.flash_attn_mxfp8_autograd(q, k, v, causal=True, precision="fp8")
    want, _ = lowbit.flash_attn_mxfp8_quantized(q.detach(), k.detach(), v.detach(), causal=True, precision="fp8")
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and k.grad.shape == k.shape
    with pytest.raises(ValueError, match="argument 'precision'"):
        lowbit.flash_attn_mxfp8_autograd(q.detach(), k.detach(), v.detach(), precision="int8")
