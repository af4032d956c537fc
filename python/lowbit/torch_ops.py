"""torch custom ops (namespace ``lowbit``) over the lowbit format ops, for torch.compile and
CUDA graphs.

Importing this module registers (torch >= 2.4):

    torch.ops.lowbit.quantize(x, fmt, layout="row_major", block=0, rounding="", scale_dtype="",
                              nibble_order="low", zero_scale="", eps=1e-10, row_align=1)
        -> (q, scales, zeros)          zeros is an empty uint8 tensor unless fmt is "uint4"
    torch.ops.lowbit.dequantize(q, scales, zeros, global_amax, fmt, layout="row_major", block=0,
                                rounding="", scale_dtype="", nibble_order="low", zero_scale="",
                                eps=1e-10, row_align=1, out_dtype=torch.float32) -> x
    torch.ops.lowbit.mxfp8_quantize(x, swizzled=False, rounding="rceil") -> (q, scales)
    torch.ops.lowbit.mxfp4_quantize(x, swizzled=False, rounding="rceil") -> (q, scales)
    torch.ops.lowbit.nvfp4_quantize(x, global_amax=None, swizzled=False) -> (q, scales)
    torch.ops.lowbit.per_token_group_quant(x, group_size=128, dtype="float8_e4m3fn",
        scale_ue8m0=False, column_major_scales=False, tma_aligned=False, eps=1e-10) -> (q, scales)
    torch.ops.lowbit.cast(x, dtype=torch.float8_e4m3fn, saturate=True) -> y
    torch.ops.lowbit.block_scale_interleave(scales) -> scales_128x4
    torch.ops.lowbit.block_scale_deinterleave(scales, rows, cols) -> scales_row_major
    torch.ops.lowbit.flash_attn_mxfp8(q, k, v, q_scale, k_scale, v_scale, softmax_scale=None,
                                      causal=False, precision="exact") -> (out, lse)
    torch.ops.lowbit.flash_attn_mxfp8_varlen(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q,
        cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False,
        precision="exact") -> (out, lse)
    torch.ops.lowbit.quantize_mxfp8_attn(x, layout="bshd", rounding="rceil") -> (codes, scales)
    torch.ops.lowbit.attn_forward_decode_nf4(q, k_nf4, k_scale, k_residual, v, seq_lens=None,
        precomputed_threshold=None, block_size=64, sub_block_size=16, delta=8.0,
        use_fp8_residual=True, softmax_scale=None, v_scale=None, block_table=None) -> (out, skip_ratio)
    torch.ops.lowbit.kproj_rope_nf4_encode(x, w_k, positions, head_dim, rope_theta=10000.0,
        residual_dtype="float8_e5m2") -> (k_nf4, k_scale, k_residual)
    torch.ops.lowbit.nf4_kcache_append(k_new, k_nf4, k_scale, k_residual, lengths, block_table=None) -> ()
        (mutates k_nf4, k_scale and k_residual)
    torch.ops.lowbit.fp8_vcache_quantize(v, dtype="float8_e4m3fn") -> (codes, scale)
    torch.ops.lowbit.fp8_vcache_append(v_new, codes, scale, lengths, block_table=None) -> ()
        (mutates codes and scale)
    torch.ops.lowbit.mxfp4_gemm / nvfp4_gemm (the dense linears), gpt_oss_moe_mlp (the gpt-oss
        expert MLP), group_gemm_mxfp4_nt_groupwise (the grouped GEMM, its three row layouts) and
        gpt_oss_expert_mlp (the expert MLP over expert-grouped rows): signatures at their
        definitions below

The NF4 K-cache decode ops (lowbit.decode_attention) run their sm_90a kernels on CUDA tensors;
nf4_kcache_append and fp8_vcache_append copy their lengths to the host to validate them: a host
synchronisation, the one exception to the graph capture below.

Arguments, formulas and output dtypes are those of the lowbit functions of the same names
(lowbit.quantize etc.; 0 / "" select a format's default block / rule / scale dtype). Every op
allocates its outputs and launches on the current CUDA stream without a host synchronisation,
so it can be captured in a CUDA graph; the fake (meta) implementations give the exact output
shapes, dtypes and strides for torch.compile.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _C
from . import attention as _attn
from . import decode_attention as _dec
from . import ops as _ops
from ._formats import Format, stored_scale_shape

Tensor = torch.Tensor

_CODE_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "uint8": torch.uint8}


def _scale_torch_dtype(f: Format) -> torch.dtype:
    return {"float32": torch.float32, "float8_e8m0fnu": torch.float8_e8m0fnu,
            "float8_e4m3fn": torch.float8_e4m3fn}[f.scale_dtype]


def _fmt(fmt: str, block: int, rounding: str, scale_dtype: str, nibble_order: str, zero_scale: str,
         eps: float) -> Format:
    kw = {"nibble_order": nibble_order, "eps": eps}
    if block:
        kw["block"] = block
    if rounding:
        kw["rounding"] = rounding
    if scale_dtype:
        kw["scale_dtype"] = scale_dtype
    if zero_scale:
        kw["zero_scale"] = zero_scale
    return Format.of(fmt, **kw)


def _fake_quant(x: Tensor, f: Format, layout: str, row_align: int = 1):
    M, K = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-1])
    q = x.new_empty(lead + ((K // 2,) if f.packed else (K,)), dtype=_CODE_DTYPES[f.code_dtype])
    rows, cols = stored_scale_shape(layout, M, K // f.block, row_align)
    batch = tuple(x.shape[:-2])
    s = x.new_empty(batch + (rows, cols), dtype=_scale_torch_dtype(f))
    return q, s


# ---------------------------------------------------------------------------------------------
# generic quantize / dequantize

@torch.library.custom_op("lowbit::quantize", mutates_args=())
def quantize(x: Tensor, fmt: str, layout: str = "row_major", block: int = 0, rounding: str = "",
             scale_dtype: str = "", nibble_order: str = "low", zero_scale: str = "", eps: float = 1e-10,
             row_align: int = 1) -> Tuple[Tensor, Tensor, Tensor]:
    f = _fmt(fmt, block, rounding, scale_dtype, nibble_order, zero_scale, eps)
    # no per-tensor amax here: the op returns no global_amax, so NVFP4 keeps S_enc = 1 (the
    # result must decode with torch.ops.lowbit.dequantize(..., global_amax=None))
    qt = _ops.quantize(x, f, layout, row_align=row_align, compute_global_amax=False)
    zeros = qt.zeros if qt.zeros is not None else x.new_empty((0,), dtype=torch.uint8)
    return qt.data, qt.scales, zeros


@quantize.register_fake
def _(x, fmt, layout="row_major", block=0, rounding="", scale_dtype="", nibble_order="low", zero_scale="",
      eps=1e-10, row_align=1):
    f = _fmt(fmt, block, rounding, scale_dtype, nibble_order, zero_scale, eps)
    q, s = _fake_quant(x, f, layout, row_align)
    zeros = torch.empty_like(s, dtype=torch.uint8) if f.has_zero_point else x.new_empty((0,), dtype=torch.uint8)
    return q, s, zeros


@torch.library.custom_op("lowbit::dequantize", mutates_args=())
def dequantize(q: Tensor, scales: Tensor, zeros: Optional[Tensor], global_amax: Optional[Tensor], fmt: str,
               layout: str = "row_major", block: int = 0, rounding: str = "", scale_dtype: str = "",
               nibble_order: str = "low", zero_scale: str = "", eps: float = 1e-10, row_align: int = 1,
               out_dtype: torch.dtype = torch.float32) -> Tensor:
    f = _fmt(fmt, block, rounding, scale_dtype, nibble_order, zero_scale, eps)
    if zeros is not None and zeros.numel() == 0:
        zeros = None
    qt = _ops.Quantized(q, scales, zeros, global_amax, f, layout, None, row_align)
    return _ops.dequantize(qt, out_dtype)


@dequantize.register_fake
def _(q, scales, zeros, global_amax, fmt, layout="row_major", block=0, rounding="", scale_dtype="",
      nibble_order="low", zero_scale="", eps=1e-10, row_align=1, out_dtype=torch.float32):
    f = _fmt(fmt, block, rounding, scale_dtype, nibble_order, zero_scale, eps)
    shape = tuple(q.shape[:-1]) + ((q.shape[-1] * 2,) if f.packed else (q.shape[-1],))
    return q.new_empty(shape, dtype=out_dtype)


# ---------------------------------------------------------------------------------------------
# familiar entry points

@torch.library.custom_op("lowbit::mxfp8_quantize", mutates_args=())
def mxfp8_quantize(x: Tensor, swizzled: bool = False, rounding: str = "rceil") -> Tuple[Tensor, Tensor]:
    return _ops.mxfp8_quantize(x, swizzled, rounding)


@mxfp8_quantize.register_fake
def _(x, swizzled=False, rounding="rceil"):
    return _fake_quant(x, Format("mxfp8_e4m3", rounding=rounding), "blocked128x4" if swizzled else "row_major")


@torch.library.custom_op("lowbit::mxfp4_quantize", mutates_args=())
def mxfp4_quantize(x: Tensor, swizzled: bool = False, rounding: str = "rceil") -> Tuple[Tensor, Tensor]:
    return _ops.mxfp4_quantize(x, swizzled, rounding)


@mxfp4_quantize.register_fake
def _(x, swizzled=False, rounding="rceil"):
    return _fake_quant(x, Format("mxfp4", rounding=rounding), "blocked128x4" if swizzled else "row_major")


@torch.library.custom_op("lowbit::nvfp4_quantize", mutates_args=())
def nvfp4_quantize(x: Tensor, global_amax: Optional[Tensor] = None, swizzled: bool = False) -> Tuple[Tensor, Tensor]:
    return _ops.nvfp4_quantize(x, global_amax, swizzled)


@nvfp4_quantize.register_fake
def _(x, global_amax=None, swizzled=False):
    return _fake_quant(x, Format("nvfp4"), "blocked128x4" if swizzled else "row_major")


@torch.library.custom_op("lowbit::per_token_group_quant", mutates_args=())
def per_token_group_quant(x: Tensor, group_size: int = 128, dtype: str = "float8_e4m3fn", scale_ue8m0: bool = False,
                          column_major_scales: bool = False, tma_aligned: bool = False,
                          eps: float = 1e-10) -> Tuple[Tensor, Tensor]:
    return _ops.per_token_group_quant(x, group_size, dtype, scale_ue8m0, column_major_scales, tma_aligned, eps)


@per_token_group_quant.register_fake
def _(x, group_size=128, dtype="float8_e4m3fn", scale_ue8m0=False, column_major_scales=False, tma_aligned=False,
      eps=1e-10):
    f = _ops.ptg_format(dtype, group_size, scale_ue8m0, eps)
    if not column_major_scales:
        return _fake_quant(x, f, "row_major")
    row_align = (16 // (1 if scale_ue8m0 else 4)) if tma_aligned else 1
    q, s = _fake_quant(x, f, "col_major", row_align)
    return q, s[..., : x.shape[-2]].transpose(-1, -2)


@torch.library.custom_op("lowbit::cast", mutates_args=())
def cast(x: Tensor, dtype: torch.dtype = torch.float8_e4m3fn, saturate: bool = True) -> Tensor:
    return _ops.cast(x, dtype, saturate)


@cast.register_fake
def _(x, dtype=torch.float8_e4m3fn, saturate=True):
    return x.new_empty(x.shape, dtype=dtype)


@torch.library.custom_op("lowbit::block_scale_interleave", mutates_args=())
def block_scale_interleave(scales: Tensor) -> Tensor:
    return _ops.block_scale_interleave(scales)


@block_scale_interleave.register_fake
def _(scales):
    rows, cols = stored_scale_shape("blocked128x4", scales.shape[-2], scales.shape[-1])
    return scales.new_empty(tuple(scales.shape[:-2]) + (rows, cols))


@torch.library.custom_op("lowbit::block_scale_deinterleave", mutates_args=())
def block_scale_deinterleave(scales: Tensor, rows: int, cols: int) -> Tensor:
    return _ops.block_scale_deinterleave(scales, rows, cols)


@block_scale_deinterleave.register_fake
def _(scales, rows, cols):
    rp, cp = stored_scale_shape("blocked128x4", rows, cols)
    L = scales.numel() // (rp * cp)
    batched = scales.dim() == 3 or L > 1
    return scales.new_empty(((L,) if batched else ()) + (rows, cols))


# ---------------------------------------------------------------------------------------------
# MXFP8 flash attention (lowbit.attention)

@torch.library.custom_op("lowbit::flash_attn_mxfp8", mutates_args=())
def flash_attn_mxfp8(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor, k_scale: Tensor, v_scale: Tensor,
                     softmax_scale: Optional[float] = None, causal: bool = False,
                     precision: str = "exact") -> Tuple[Tensor, Tensor]:
    return _attn.flash_attn_mxfp8_func(q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, precision)


@flash_attn_mxfp8.register_fake
def _(q, k, v, q_scale, k_scale, v_scale, softmax_scale=None, causal=False, precision="exact"):
    b, s, h, d = q.shape
    return q.new_empty((b, s, h, d), dtype=torch.bfloat16), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("lowbit::flash_attn_mxfp8_varlen", mutates_args=())
def flash_attn_mxfp8_varlen(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor, k_scale: Tensor, v_scale: Tensor,
                            cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            precision: str = "exact") -> Tuple[Tensor, Tensor]:
    return _attn.flash_attn_mxfp8_varlen_func(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k,
                                              max_seqlen_q, max_seqlen_k, softmax_scale, causal, precision)


@flash_attn_mxfp8_varlen.register_fake
def _(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
      causal=False, precision="exact"):
    t, h, d = q.shape
    return q.new_empty((t, h, d), dtype=torch.bfloat16), q.new_empty((h, t), dtype=torch.float32)


@torch.library.custom_op("lowbit::quantize_mxfp8_attn", mutates_args=())
def quantize_mxfp8_attn(x: Tensor, layout: str = "bshd", rounding: str = "rceil") -> Tuple[Tensor, Tensor]:
    return _attn.quantize_mxfp8_attn(x, layout=layout, rounding=rounding)


@quantize_mxfp8_attn.register_fake
def _(x, layout="bshd", rounding="rceil"):
    e8m0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
    if layout == "thd":
        t, h, d = x.shape
        return x.new_empty((t, h, d), dtype=torch.float8_e4m3fn), x.new_empty((h, t, d // 32), dtype=e8m0)
    if layout == "bhsd":
        b, h, s, d = x.shape
        codes = x.new_empty((b, h, s, d), dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
        return codes, x.new_empty((b, h, s, d // 32), dtype=e8m0)
    b, s, h, d = x.shape
    return x.new_empty((b, s, h, d), dtype=torch.float8_e4m3fn), x.new_empty((b, h, s, d // 32), dtype=e8m0)


# ---------------------------------------------------------------------------------------------
# NF4 K-cache decode attention (lowbit.decode_attention)

@torch.library.custom_op("lowbit::attn_forward_decode_nf4", mutates_args=())
def attn_forward_decode_nf4(q: Tensor, k_nf4: Tensor, k_scale: Tensor, k_residual: Optional[Tensor], v: Tensor,
                            seq_lens: Optional[Tensor] = None, precomputed_threshold: Optional[Tensor] = None,
                            block_size: int = 64, sub_block_size: int = 16, delta: float = 8.0,
                            use_fp8_residual: bool = True, softmax_scale: Optional[float] = None,
                            v_scale: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _dec.attn_forward_decode_nf4(q, k_nf4, k_scale, k_residual, v, v_scale=v_scale, seq_lens=seq_lens,
                                        block_table=block_table,
                                        block_size=block_size, sub_block_size=sub_block_size, delta=delta,
                                        precomputed_threshold=precomputed_threshold,
                                        use_fp8_residual=use_fp8_residual, return_skip_ratio=True,
                                        softmax_scale=softmax_scale)


@attn_forward_decode_nf4.register_fake
def _(q, k_nf4, k_scale, k_residual, v, seq_lens=None, precomputed_threshold=None, block_size=64, sub_block_size=16,
      delta=8.0, use_fp8_residual=True, softmax_scale=None, v_scale=None, block_table=None):
    b, _, h, _ = q.shape
    return (q.new_empty((b, h, v.shape[3]), dtype=torch.bfloat16),
            q.new_empty((b, k_nf4.shape[2]), dtype=torch.float32))


@torch.library.custom_op("lowbit::kproj_rope_nf4_encode", mutates_args=())
def kproj_rope_nf4_encode(x: Tensor, w_k: Tensor, positions: Tensor, head_dim: int, rope_theta: float = 10000.0,
                          residual_dtype: str = "float8_e5m2") -> Tuple[Tensor, Tensor, Tensor]:
    return _dec.kproj_rope_nf4_encode(x, w_k, positions, head_dim=head_dim, rope_theta=rope_theta,
                                      residual_dtype=residual_dtype)


@kproj_rope_nf4_encode.register_fake
def _(x, w_k, positions, head_dim, rope_theta=10000.0, residual_dtype="float8_e5m2"):
    b, t, _ = x.shape
    hk = w_k.shape[0] // head_dim
    return (x.new_empty((b, t, hk, head_dim // 2), dtype=torch.uint8),
            x.new_empty((b, hk, head_dim), dtype=torch.float32),
            x.new_empty((b, t, hk, head_dim), dtype=_CODE_DTYPES[residual_dtype]))


@torch.library.custom_op("lowbit::nf4_kcache_append", mutates_args=("k_nf4", "k_scale", "k_residual"))
def nf4_kcache_append(k_new: Tensor, k_nf4: Tensor, k_scale: Tensor, k_residual: Tensor, lengths: Tensor,
                      block_table: Optional[Tensor] = None) -> None:
    _dec.nf4_kcache_append(k_new, k_nf4, k_scale, k_residual, lengths, block_table=block_table)


@nf4_kcache_append.register_fake
def _(k_new, k_nf4, k_scale, k_residual, lengths, block_table=None):
    return None


@torch.library.custom_op("lowbit::fp8_vcache_quantize", mutates_args=())
def fp8_vcache_quantize(v: Tensor, dtype: str = "float8_e4m3fn") -> Tuple[Tensor, Tensor]:
    return _dec.fp8_vcache_quantize(v, dtype)


@fp8_vcache_quantize.register_fake
def _(v, dtype="float8_e4m3fn"):
    b, t, h, d = v.shape
    return v.new_empty((b, t, h, d), dtype=_CODE_DTYPES[dtype]), v.new_empty((b, h, d), dtype=torch.float32)


@torch.library.custom_op("lowbit::fp8_vcache_append", mutates_args=("codes", "scale"))
def fp8_vcache_append(v_new: Tensor, codes: Tensor, scale: Tensor, lengths: Tensor,
                      block_table: Optional[Tensor] = None) -> None:
    _dec.fp8_vcache_append(v_new, codes, scale, lengths, block_table=block_table)


@fp8_vcache_append.register_fake
def _(v_new, codes, scale, lengths, block_table=None):
    return None


# ---------------------------------------------------------------------------------------------
# dense linears (lowbit.linear): mxfp4_gemm (CUDA: the grouped MXFP4 kernel with one group),
# nvfp4_gemm (CUDA: the NVFP4 dual GEMM's mainloop; docs/linear.md)
#
#   torch.ops.lowbit.mxfp4_gemm(a, b, b_scale, a_scale=None, bias=None, a_scale_layout="row_major",
#       b_scale_layout="row_major", b_packed=False, n=None, out_dtype=torch.bfloat16) -> c [M, N]
#   torch.ops.lowbit.nvfp4_gemm(a, b, b_scale, a_scale=None, amax_a=None, amax_b=None, bias=None,
#       a_scale_layout="row_major", b_scale_layout="row_major", out_dtype=torch.bfloat16, b_packed=False,
#       n=None) -> c [M, N]
#   torch.ops.lowbit.nvfp4_gemm_prepack(b, b_scale, b_scale_layout="row_major") -> packed uint8

from . import linear as _linear  # noqa: E402


@torch.library.custom_op("lowbit::mxfp4_gemm", mutates_args=())
def mxfp4_gemm(a: Tensor, b: Tensor, b_scale: Tensor, a_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               a_scale_layout: str = "row_major", b_scale_layout: str = "row_major", b_packed: bool = False,
               n: Optional[int] = None, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return _linear.mxfp4_gemm(a, b, b_scale, a_scale=a_scale, bias=bias, a_scale_layout=a_scale_layout,
                              b_scale_layout=b_scale_layout, b_packed=b_packed, n=n, out_dtype=out_dtype)


@mxfp4_gemm.register_fake
def _(a, b, b_scale, a_scale=None, bias=None, a_scale_layout="row_major", b_scale_layout="row_major", b_packed=False,
      n=None, out_dtype=torch.bfloat16):
    if b_packed and n is None:
        raise ValueError("mxfp4_gemm: argument 'n': is required with b_packed=True")
    return a.new_empty((a.shape[0], n if b_packed else b.shape[0]), dtype=out_dtype)


@torch.library.custom_op("lowbit::nvfp4_gemm", mutates_args=())
def nvfp4_gemm(a: Tensor, b: Tensor, b_scale: Optional[Tensor], a_scale: Optional[Tensor] = None,
               amax_a: Optional[Tensor] = None, amax_b: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               a_scale_layout: str = "row_major", b_scale_layout: str = "row_major",
               out_dtype: torch.dtype = torch.bfloat16, b_packed: bool = False, n: Optional[int] = None) -> Tensor:
    return _linear.nvfp4_gemm(a, b, b_scale, a_scale=a_scale, amax_a=amax_a, amax_b=amax_b, bias=bias,
                              a_scale_layout=a_scale_layout, b_scale_layout=b_scale_layout, b_packed=b_packed, n=n,
                              out_dtype=out_dtype)


@nvfp4_gemm.register_fake
def _(a, b, b_scale, a_scale=None, amax_a=None, amax_b=None, bias=None, a_scale_layout="row_major",
      b_scale_layout="row_major", out_dtype=torch.bfloat16, b_packed=False, n=None):
    return a.new_empty((a.shape[0], n if b_packed else b.shape[0]), dtype=out_dtype)


@torch.library.custom_op("lowbit::nvfp4_gemm_prepack", mutates_args=())
def nvfp4_gemm_prepack(b: Tensor, b_scale: Tensor, b_scale_layout: str = "row_major") -> Tensor:
    return _linear.nvfp4_gemm_prepack(b, b_scale, b_scale_layout=b_scale_layout)


@nvfp4_gemm_prepack.register_fake
def _(b, b_scale, b_scale_layout="row_major"):
    return b.new_empty((_C.nvfp4_gemm_packed_bytes(b.shape[0], 2 * b.shape[1]),), dtype=torch.uint8)


# ---------------------------------------------------------------------------------------------
# the gpt-oss expert MLP (lowbit.gpt_oss_moe_mlp)
#
#   torch.ops.lowbit.gpt_oss_moe_mlp(x, topk_ids, topk_weights, w1, w1_scale, b1, w2, w2_scale, b2,
#       alpha=1.702, limit=7.0, act="bf16", packed=False) -> out (x's shape and dtype)

from .gemm import gpt_oss_moe_mlp as _moe_mlp  # noqa: E402


@torch.library.custom_op("lowbit::gpt_oss_moe_mlp", mutates_args=())
def gpt_oss_moe_mlp(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, w1: Tensor, w1_scale: Tensor, b1: Tensor,
                    w2: Tensor, w2_scale: Tensor, b2: Tensor, alpha: float = 1.702, limit: float = 7.0,
                    act: str = "bf16", packed: bool = False) -> Tensor:
    return _moe_mlp(x, topk_ids, topk_weights, w1, w1_scale, b1, w2, w2_scale, b2, alpha=alpha, limit=limit, act=act,
                    packed=packed)


@gpt_oss_moe_mlp.register_fake
def _(x, topk_ids, topk_weights, w1, w1_scale, b1, w2, w2_scale, b2, alpha=1.702, limit=7.0, act="bf16",
      packed=False):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------
# the grouped GEMM and the expert MLP over expert-grouped rows (expert parallelism; docs/moe_ep.md)
#
#   torch.ops.lowbit.group_gemm_mxfp4_nt_groupwise(a, b, a_scale, b_scale, m_indptr=None, m_counts=None,
#       out_dtype=torch.bfloat16, a_scale_layout="blocked128x4", b_scale_layout="blocked128x4",
#       group_pad="flashinfer", b_packed=False, n=None, expected_m=0, precision="exact") -> out [.., N]
#       (a's leading shape; precision "fp8": the opt-in FP8 tensor-core path, see gemm.py)
#   torch.ops.lowbit.gpt_oss_expert_mlp(x, m_counts, w1, w1_scale, b1, w2, w2_scale, b2, x_scale=None,
#       alpha=1.702, limit=7.0, act="bf16", packed=False, expected_m=0, out_dtype=None) -> out (x's shape)
# Rows outside m_counts are left uninitialised in the returned tensors (docs/moe_ep.md).

from .gemm import gpt_oss_expert_mlp as _expert_mlp  # noqa: E402
from .gemm import group_gemm_mxfp4_nt_groupwise as _group_gemm  # noqa: E402


@torch.library.custom_op("lowbit::group_gemm_mxfp4_nt_groupwise", mutates_args=())
def group_gemm_mxfp4_nt_groupwise(a: Tensor, b: Tensor, a_scale: Optional[Tensor], b_scale: Tensor,
                                  m_indptr: Optional[Tensor] = None, m_counts: Optional[Tensor] = None,
                                  out_dtype: torch.dtype = torch.bfloat16, a_scale_layout: str = "blocked128x4",
                                  b_scale_layout: str = "blocked128x4", group_pad: str = "flashinfer",
                                  b_packed: bool = False, n: Optional[int] = None, expected_m: int = 0,
                                  precision: str = "exact") -> Tensor:
    return _group_gemm(a, b, a_scale, b_scale, m_indptr, out_dtype, a_scale_layout=a_scale_layout,
                       b_scale_layout=b_scale_layout, group_pad=group_pad, b_packed=b_packed, n=n, m_counts=m_counts,
                       expected_m=expected_m, precision=precision)


@group_gemm_mxfp4_nt_groupwise.register_fake
def _(a, b, a_scale, b_scale, m_indptr=None, m_counts=None, out_dtype=torch.bfloat16, a_scale_layout="blocked128x4",
      b_scale_layout="blocked128x4", group_pad="flashinfer", b_packed=False, n=None, expected_m=0, precision="exact"):
    if b_packed and n is None:
        raise ValueError("group_gemm_mxfp4_nt_groupwise: argument 'n': is required with b_packed=True")
    return a.new_empty(tuple(a.shape[:-1]) + (n if b_packed else b.shape[1],), dtype=out_dtype)


@torch.library.custom_op("lowbit::gpt_oss_expert_mlp", mutates_args=())
def gpt_oss_expert_mlp(x: Tensor, m_counts: Tensor, w1: Tensor, w1_scale: Tensor, b1: Tensor, w2: Tensor,
                       w2_scale: Tensor, b2: Tensor, x_scale: Optional[Tensor] = None, alpha: float = 1.702,
                       limit: float = 7.0, act: str = "bf16", packed: bool = False, expected_m: int = 0,
                       out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return _expert_mlp(x, m_counts, w1, w1_scale, b1, w2, w2_scale, b2, x_scale=x_scale, alpha=alpha, limit=limit,
                       act=act, packed=packed, expected_m=expected_m, out_dtype=out_dtype)


@gpt_oss_expert_mlp.register_fake
def _(x, m_counts, w1, w1_scale, b1, w2, w2_scale, b2, x_scale=None, alpha=1.702, limit=7.0, act="bf16",
      packed=False, expected_m=0, out_dtype=None):
    if out_dtype is None:
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float32) else torch.bfloat16
    return x.new_empty(tuple(x.shape), dtype=out_dtype)
