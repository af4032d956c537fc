"""The triton_kernels anchor's weights, shared by bench_moe.py (lowbit_bench.moe) and
bench_linear.py: lowbit's MXFP4 codes and scales in the layout vLLM gives OpenAI triton_kernels'
matmul_ogs on Hopper. Imports torch and triton_kernels when called (a GPU run with them installed)."""

from __future__ import annotations


def tk_weights(codes, scales):
    """OpenAI triton_kernels' MXFP4 expert weights from lowbit's [G, N, K/2] codes and [G, N, K/32]
    UE8M0 scales, as vLLM prepares them on Hopper (split_k pinned to 1 on sm_90, scale K groups
    padded to a multiple of 4): (w, precision config). What vLLM runs for gpt-oss on Hopper (MXFP4
    upcast to bf16 in the kernel, bf16 activations); a dense weight is one expert (G = 1)."""
    import torch
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details import layout
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags

    if torch.cuda.get_device_capability(0) == (9, 0):
        opt_flags.update_opt_flags_constraints({"split_k": 1})
    scales = scales.view(torch.uint8)
    pad = -scales.shape[-1] % 4
    if pad:
        scales = torch.nn.functional.pad(scales, (0, pad))
    vl, vo = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    sl, so = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = convert_layout(wrap_torch_tensor(codes.transpose(-2, -1), dtype=FP4), vl, **vo)
    s = convert_layout(wrap_torch_tensor(scales.transpose(-2, -1)), sl, **so)
    return w, PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))
