"""lowbit: low-precision formats (MXFP8, MXFP4, NVFP4, FP8 / INT4 / UINT4 groups, NF4) and
their conversion kernels, GEMMs, MXFP8 flash attention and NF4 K-cache decode attention.

Arrays in, arrays out: every function accepts NumPy arrays (bfloat16 / fp8 through ml_dtypes)
and torch tensors (CPU or CUDA) and returns results of the same library on the same device.
CUDA tensors run the sm_90a kernels on the current torch stream; host arrays run the CPU
reference. See lowbit.Format for the recipes and docs/python_api.md for an overview.

    import lowbit
    qt = lowbit.quantize(x, "mxfp4", "blocked128x4")
    x2 = lowbit.dequantize(qt, "bfloat16")
"""

import sys as _sys

from . import _C
from .attention import (
    flash_attn_mxfp8_func,
    flash_attn_mxfp8_quantized,
    flash_attn_mxfp8_varlen_func,
    quantize_mxfp8_attn,
)
from .decode_attention import (attn_forward_decode_nf4, fp8_vcache_append, fp8_vcache_quantize, kproj_rope_nf4_encode,
                               nf4_kcache_append)
from ._formats import FORMAT_NAMES, LAYOUTS, Format, Quantized
from .gemm import (
    custom_kernel,
    gpt_oss_expert_mlp,
    gpt_oss_moe_mlp,
    group_gemm_mxfp4_nt_groupwise,
    group_gemm_mxfp4_prepack,
    nvfp4_dual_gemm_prepack,
    nvfp4_dual_gemm_silu,
)
from .linear import mxfp4_gemm, mxfp4_gemm_prepack, nvfp4_gemm, nvfp4_gemm_prepack
from .ops import (
    build_info,
    cast,
    dequantize,
    mxfp4_quantize,
    mxfp8_quantize,
    nf4_kcache_dequantize,
    nf4_kcache_quantize,
    nvfp4_quantize,
    per_token_group_quant,
    quantize,
    scale_shape,
    tensor_amax,
    transcode,
)
from .scale_layouts import block_scale_deinterleave, block_scale_interleave, convert_scale_layout

__version__ = _C.__version__

__all__ = [
    "__version__", "Format", "Quantized", "FORMAT_NAMES", "LAYOUTS",
    "build_info", "scale_shape", "quantize", "dequantize", "transcode", "cast", "convert_scale_layout",
    "tensor_amax", "nf4_kcache_quantize", "nf4_kcache_dequantize",
    "mxfp8_quantize", "mxfp4_quantize", "nvfp4_quantize", "per_token_group_quant",
    "block_scale_interleave", "block_scale_deinterleave",
    "nvfp4_dual_gemm_silu", "nvfp4_dual_gemm_prepack", "custom_kernel", "group_gemm_mxfp4_nt_groupwise",
    "group_gemm_mxfp4_prepack", "gpt_oss_moe_mlp", "gpt_oss_expert_mlp",
    "flash_attn_mxfp8_func", "flash_attn_mxfp8_varlen_func", "quantize_mxfp8_attn", "flash_attn_mxfp8_quantized",
    "attn_forward_decode_nf4", "kproj_rope_nf4_encode", "nf4_kcache_append", "fp8_vcache_quantize",
    "fp8_vcache_append",
    "mxfp4_gemm", "mxfp4_gemm_prepack", "nvfp4_gemm", "nvfp4_gemm_prepack",
]


def __getattr__(name):
    # `lowbit.torch_ops` / `lowbit.nn` (and nn's load_quantized) / `lowbit.moe` /
    # flash_attn_mxfp8_autograd import torch on first use only
    import importlib

    if name in ("torch_ops", "nn", "load_quantized", "moe"):
        mod = importlib.import_module({"torch_ops": ".torch_ops", "moe": ".moe"}.get(name, ".nn"), __name__)
        return mod.load_quantized if name == "load_quantized" else mod
    if name == "flash_attn_mxfp8_autograd":
        return importlib.import_module(".attention_autograd", __name__).flash_attn_mxfp8_autograd
    raise AttributeError(f"module 'lowbit' has no attribute {name!r}")


if "torch" in _sys.modules:  # torch already loaded: register the lowbit:: custom ops now
    from . import torch_ops  # noqa: F401
