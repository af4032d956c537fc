"""bench_conversions.py's peer kernels (sgl_kernel, vllm, flashinfer, bitsandbytes), each tried
only where its package imports; a failure lands in the row."""

from __future__ import annotations

import torch

from .conversion_refs import FP8_MAX


# --- peers (tried only where the package imports; failures land in the row) ------------------

def _peer_sgl_ptgq(ue8m0=False, col_major=False):
    def make(x):
        from sgl_kernel import sgl_per_token_group_quant_fp8  # type: ignore

        m, k = x.shape
        q = torch.empty(m, k, device=x.device, dtype=torch.float8_e4m3fn)
        if col_major:
            s = torch.empty(k // 128, m, device=x.device, dtype=torch.float32).t()
        else:
            s = torch.empty(m, k // 128, device=x.device, dtype=torch.float32)

        def fn(x):
            sgl_per_token_group_quant_fp8(x, q, s, 128, 1e-10, -FP8_MAX, FP8_MAX, ue8m0)
            return q, s
        return fn, (x,)
    return make


def _peer_vllm_ptgq(col_major=False):
    def make(x):
        from vllm.model_executor.layers.quantization.utils.fp8_utils import per_token_group_quant_fp8  # type: ignore

        return (lambda x: per_token_group_quant_fp8(x, 128, column_major_scales=col_major)), (x,)
    return make


def _peer_flashinfer_mxfp8(swizzled):
    def make(x):
        import flashinfer  # type: ignore

        return (lambda x: flashinfer.mxfp8_quantize(x, is_sf_swizzled_layout=swizzled)), (x,)
    return make


def _peer_flashinfer_mxfp4():
    def make(x):
        import flashinfer  # type: ignore

        return (lambda x: flashinfer.mxfp4_quantize(x)), (x,)
    return make


def _peer_flashinfer_nvfp4():
    def make(x):
        import flashinfer  # type: ignore

        gsf = (2688.0 / x.abs().amax().float()).reshape(1)
        return (lambda x, g: flashinfer.fp4_quantize(x, g, 16, False, False)), (x, gsf)
    return make


def _peer_bnb_nf4_quant():
    def make(x):
        import bitsandbytes.functional as bnbf  # type: ignore

        return (lambda x: bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4")), (x,)
    return make


def _peer_bnb_nf4_dequant():
    def make(x):
        import bitsandbytes.functional as bnbf  # type: ignore

        packed, state = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4")
        return (lambda p, st: bnbf.dequantize_4bit(p, st)), (packed, state)
    return make


PEER_MODULES = ["sgl_kernel", "vllm", "flashinfer", "bitsandbytes", "transformer_engine", "torchao", "deep_gemm"]
