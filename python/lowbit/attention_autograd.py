"""The MXFP8 flash-attention forward with a backward, for training and fine-tuning (torch only;
docs/attention.md "Training").

    out = lowbit.flash_attn_mxfp8_autograd(q, k, v, softmax_scale=None, causal=False, rounding="rceil",
                                           precision="exact")

q [b, s_q, h, d], k and v [b, s_k, h_kv, d], float32 / float16 / bfloat16 torch tensors, d in
{64, 128, 256}, h % h_kv == 0. Forward: q, k and v are quantized to MXFP8 (torch.ops.lowbit.
quantize_mxfp8_attn, one UE8M0 scale per 32 channels) and the MXFP8 forward runs
(torch.ops.lowbit.flash_attn_mxfp8: the sm_90a kernel on CUDA tensors, the CPU reference on CPU
tensors); out [b, s_q, h, d] bfloat16, the same bits as lowbit.flash_attn_mxfp8_quantized.

Backward (the kernel is forward-only): the gradient of attention taken at the dequantized inputs,
straight through the quantization. With qd, kd, vd the dequantized values (exact in bf16), dq, dk,
dv are the gradients of softmax(softmax_scale * qd kd^T + mask) vd, computed in fp32 the way
FlashAttention's backward does: P recomputed from the forward's lse, D = rowsum(dout * out),
query rows in chunks of 1024 (memory b * h * 1024 * s_k floats); the causal mask is aligned
bottom-right as in the forward and query rows that see no key get zero gradients; GQA gradients
are summed over the query heads of each KV head. Returned in the dtypes of q, k, v. Saved for the
backward: the FP8 codes and their scales (about half the bytes of bf16 inputs), out and lse. Plain
torch operations, no autograd call inside: torch.compile traces forward and backward.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import torch_ops as _torch_ops  # noqa: F401  (registers torch.ops.lowbit.*)

__all__ = ["flash_attn_mxfp8_autograd"]


def _dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 [b, s, h, d] values of E4M3 codes [b, s, h, d] with UE8M0 scales [b, h, s, d/32]
    (code * 2^(scale - 127): exact in bf16; scale byte 255 is NaN)."""
    sb = scales.view(torch.uint8).to(torch.int32)
    f = torch.exp2((sb - 127).to(torch.float32))
    f = torch.where(sb == 255, torch.full_like(f, float("nan")), f)
    f = f.permute(0, 2, 1, 3).repeat_interleave(32, dim=-1)  # [b, s, h, d]
    return (codes.to(torch.float32) * f).to(torch.bfloat16)


def _attention_backward(qd, kd, vd, out, lse, dout, scale: float, causal: bool, chunk: int = 1024):
    """(dq, dk, dv) of attention at the bf16 inputs qd [b, s_q, h, d], kd / vd [b, s_k, h_kv, d],
    FlashAttention's backward in fp32: P recomputed as exp(S - lse) from the forward's lse (rows
    that see no key: lse -inf, P 0), D = rowsum(dout * out), dS = P (dout V^T - D), dq = scale dS K,
    dk = scale dS^T Q, dv = P^T dout; query rows in chunks of `chunk` (memory b h chunk s_k)."""
    b, s_q, h, d = qd.shape
    s_k, hk = kd.shape[1], kd.shape[2]
    g = h // hk
    q = qd.float().transpose(1, 2)                                  # [b, h, s_q, d]
    k = kd.float().transpose(1, 2).repeat_interleave(g, dim=1)      # [b, h, s_k, d]
    v = vd.float().transpose(1, 2).repeat_interleave(g, dim=1)
    do = dout.float().transpose(1, 2)
    dsum = (do * out.float().transpose(1, 2)).sum(-1)               # [b, h, s_q]
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    j = torch.arange(s_k, device=qd.device)
    for i0 in range(0, s_q, chunk):
        i1 = min(s_q, i0 + chunk)
        sc = (q[:, :, i0:i1] @ k.transpose(-1, -2)) * scale        # [b, h, rows, s_k]
        if causal:
            i = torch.arange(i0, i1, device=qd.device)[:, None]
            sc = sc.masked_fill(~(j[None, :] <= i + (s_k - s_q)), float("-inf"))
        l = lse[:, :, i0:i1, None]
        p = torch.where(l == float("-inf"), torch.zeros_like(sc), torch.exp(sc - l))
        dv += p.transpose(-1, -2) @ do[:, :, i0:i1]
        ds = p * (do[:, :, i0:i1] @ v.transpose(-1, -2) - dsum[:, :, i0:i1, None])
        dq[:, :, i0:i1] = (ds @ k) * scale
        dk += (ds.transpose(-1, -2) @ q[:, :, i0:i1]) * scale
    dk = dk.reshape(b, hk, g, s_k, d).sum(2)
    dv = dv.reshape(b, hk, g, s_k, d).sum(2)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


class _Mxfp8Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale: Optional[float], causal: bool, rounding: str, precision: str):
        qc, qs = torch.ops.lowbit.quantize_mxfp8_attn(q, "bshd", rounding)
        kc, ks = torch.ops.lowbit.quantize_mxfp8_attn(k, "bshd", rounding)
        vc, vs = torch.ops.lowbit.quantize_mxfp8_attn(v, "bshd", rounding)
        out, lse = torch.ops.lowbit.flash_attn_mxfp8(qc, kc, vc, qs, ks, vs, softmax_scale, causal, precision)
        ctx.save_for_backward(qc, qs, kc, ks, vc, vs, out, lse)
        ctx.scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        ctx.causal = causal
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        qc, qs, kc, ks, vc, vs, out, lse = ctx.saved_tensors
        qd, kd, vd = (_dequantize(c, s) for c, s in ((qc, qs), (kc, ks), (vc, vs)))
        dq, dk, dv = _attention_backward(qd, kd, vd, out, lse, dout, ctx.scale, ctx.causal)
        return dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1]), dv.to(ctx.dtypes[2]), None, None, None, None


def flash_attn_mxfp8_autograd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: Optional[float] = None,
                              causal: bool = False, rounding: str = "rceil", precision: str = "exact") -> torch.Tensor:
    """MXFP8 attention of float q, k, v with a bf16 backward (module docstring): returns out
    [b, s_q, h, d] bfloat16. ``softmax_scale`` None: 1/sqrt(d). ``precision`` chooses the forward
    ("exact" or "fp8", as flash_attn_mxfp8_func); the backward is the same for both. Arguments are
    checked by the quantize and attention ops, which name them."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        bad = next(n for n, t in (("q", q), ("k", k), ("v", v)) if not isinstance(t, torch.Tensor))
        raise ValueError(f"flash_attn_mxfp8_autograd: argument '{bad}': expected a torch tensor")
    out, _ = _Mxfp8Attention.apply(q, k, v, softmax_scale, bool(causal), rounding, precision)
    return out
