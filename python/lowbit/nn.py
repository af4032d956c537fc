"""torch modules over lowbit's dense linears (docs/nn.md).

    NVFP4Linear    y = x @ W^T (+ b), W NVFP4 (E2M1 codes, E4M3 block scales per 16, a per-tensor
                   amax): torch.ops.lowbit.nvfp4_gemm
    MXFP4Linear    the same with W MXFP4 (UE8M0 block scales per 32): torch.ops.lowbit.mxfp4_gemm;
                   act="mxfp8" quantizes the activations to MXFP8 on the fly (W4A8)
    GptOssExperts  the gpt-oss expert MLP, MXFP4 weights: torch.ops.lowbit.gpt_oss_moe_mlp
    quantize_model(model, "nvfp4" | "mxfp4")   replaces nn.Linear layers in place
    load_quantized(path, model=None)            reads a checkpoint written by `lowbit quantize`

The modules call the torch custom ops (lowbit.torch_ops), so torch.compile traces them and CUDA
graphs capture them; CPU tensors run the ops' CPU reference. Dtypes: x is bfloat16, float16 or
float32 [..., K]; the activations enter the GEMM as bfloat16 (W4A16: float16 / float32 inputs
are rounded to bfloat16 first); y has x's dtype (float32 inputs: the bfloat16 GEMM output
widened to float32). Tests: tests/python/test_nn.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import ops as _ops
from . import torch_ops as _torch_ops  # noqa: F401  (registers torch.ops.lowbit.*)

__all__ = ["NVFP4Linear", "MXFP4Linear", "GptOssExperts", "QuantizeReport", "DEFAULT_EXCLUDES", "quantize_model", "load_quantized",
           "cuda_skip_reason"]

_FLOAT = (torch.bfloat16, torch.float16, torch.float32)

# Layers left in high precision by default: embeddings, the output head, norms and MoE routers
# (a module named exactly "gate", not Llama's gate_proj). Regular expressions, re.search on the
# module's qualified name.
DEFAULT_EXCLUDES: Tuple[str, ...] = (r"embed", r"lm_head", r"norm", r"(^|\.)router($|\.)", r"(^|\.)gate$")


def _gemm_in(x: torch.Tensor, K: int, op: str) -> Tuple[torch.Tensor, torch.dtype]:
    if x.dtype not in _FLOAT:
        raise TypeError(f"{op}: expected bfloat16 / float16 / float32 input, got {x.dtype}")
    if x.shape[-1] != K:
        raise ValueError(f"{op}: input's last dimension is {x.shape[-1]}, expected in_features = {K}")
    a = x.reshape(-1, K).to(torch.bfloat16).contiguous()
    return a, (x.dtype if x.dtype != torch.float32 else torch.bfloat16)


class _QuantLinear(nn.Module):
    fmt = ""
    block = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None, prepack: bool = True):
        super().__init__()
        if in_features <= 0 or in_features % self.block:
            raise ValueError(f"{type(self).__name__}: in_features = {in_features} must be a positive multiple of "
                             f"{self.block}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scale", torch.zeros(out_features, in_features // self.block,
                                                         dtype=self._scale_dtype, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float32, device=device) if bias else None)
        # the CUDA kernels' layout of the weights, made once (prepack()); not in the state_dict
        self.prepacked = bool(prepack)
        self.register_buffer("packed_weight", torch.zeros(0, dtype=torch.uint8, device=device), persistent=False)
        self.register_buffer("packed_scale", torch.zeros(0, dtype=torch.uint8, device=device), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.prepack())

    def prepack(self) -> None:
        """Lays qweight / weight_scale out once in the CUDA kernel's layout (nvfp4_gemm_prepack /
        mxfp4_gemm_prepack) into the non-persistent buffers packed_weight (and packed_scale), which
        forward uses on CUDA tensors: the same bits as the plain call, without the per-call prepack
        (NVFP4) or with the kernel's faster packed path (MXFP4). The packed bytes take about as much
        memory as qweight + weight_scale. Called by from_linear, quantize_model, load_quantized and
        after load_state_dict; call it again after changing qweight / weight_scale in place. Clears
        the buffers when the layer was made with prepack=False or the kernel does not take its shape
        (cuda_skip_reason)."""
        empty = torch.zeros(0, dtype=torch.uint8, device=self.qweight.device)
        self.packed_weight, self.packed_scale = empty, empty
        if self.prepacked and cuda_skip_reason(self.fmt, self.in_features, self.out_features) is None:
            with torch.no_grad():
                self._prepack()

    def _use_packed(self, x: torch.Tensor) -> bool:
        return x.is_cuda and self.packed_weight.numel() > 0

    def _set_bias(self, bias):
        if bias is not None:
            self.bias = bias.detach().to(device=self.qweight.device, dtype=torch.float32).clone()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.fmt}{self._extra()}")

    def _extra(self) -> str:
        return ""

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight [N, K] the layer computes with (lowbit.dequantize of its buffers)."""
        qt = _ops.Quantized(self.qweight, self.weight_scale, None, self._amax(), self.fmt, "row_major",
                            (self.out_features, self.in_features))
        return _ops.dequantize(qt, "float32")

    def _amax(self):
        return None

    def _quantize_weight(self, w: torch.Tensor):
        w = w.detach()
        if w.dtype not in _FLOAT:
            w = w.float()
        return _ops.quantize(w.contiguous(), self.fmt, compute_global_amax=True if self.fmt == "nvfp4" else None)


class NVFP4Linear(_QuantLinear):
    """y = x @ W^T (+ bias) with an NVFP4 weight (W4A16).

    Buffers: qweight uint8 [N, K/2] (E2M1 codes, element 2k in the low nibble), weight_scale
    float8_e4m3fn [N, K/16] (row_major), weight_global_amax float32 [1] (the per-tensor amax:
    S_dec = amax / 2688), bias float32 [N] or None. K % 16 == 0; CUDA tensors need N % 128 == 0
    and K % 64 == 0 (the kernel's constraint; cuda_skip_reason says it)."""
    fmt, block = "nvfp4", 16
    _scale_dtype = torch.float8_e4m3fn

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None, prepack: bool = True):
        super().__init__(in_features, out_features, bias, device, prepack)
        self.register_buffer("weight_global_amax", torch.ones(1, dtype=torch.float32, device=device))

    def _prepack(self):
        from .linear import nvfp4_gemm_prepack
        self.packed_weight = nvfp4_gemm_prepack(self.qweight, self.weight_scale)

    def _amax(self):
        return self.weight_global_amax

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "NVFP4Linear":
        """Quantizes linear.weight with lowbit.quantize(w, "nvfp4", compute_global_amax=True)."""
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, device=linear.weight.device)
        qt = m._quantize_weight(linear.weight)
        m.qweight.copy_(qt.data)
        m.weight_scale.copy_(qt.scales)
        m.weight_global_amax.copy_(qt.global_amax.reshape(1))
        m._set_bias(linear.bias)
        m.prepack()
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, out_dtype = _gemm_in(x, self.in_features, "NVFP4Linear")
        if self._use_packed(x):
            y = torch.ops.lowbit.nvfp4_gemm(a, self.packed_weight, None, None, None, self.weight_global_amax, self.bias,
                                            "row_major", "row_major", out_dtype, True, self.out_features)
        else:
            y = torch.ops.lowbit.nvfp4_gemm(a, self.qweight, self.weight_scale, None, None, self.weight_global_amax,
                                            self.bias, "row_major", "row_major", out_dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class MXFP4Linear(_QuantLinear):
    """y = x @ W^T (+ bias) with an MXFP4 weight.

    Buffers: qweight uint8 [N, K/2] (E2M1 codes, element 2k in the low nibble), weight_scale
    float8_e8m0fnu [N, K/32] (UE8M0, row_major), bias float32 [N] or None. K % 32 == 0 and
    N % 8 == 0. act="bf16" (default): W4A16. act="mxfp8": W4A8, the bfloat16 activations are
    quantized per 32 elements to MXFP8 E4M3 (torch.ops.lowbit.mxfp8_quantize, RCEIL) at every
    call."""
    fmt, block = "mxfp4", 32
    _scale_dtype = torch.float8_e8m0fnu

    def __init__(self, in_features: int, out_features: int, bias: bool = False, device=None, act: str = "bf16",
                 prepack: bool = True):
        if act not in ("bf16", "mxfp8"):
            raise ValueError(f"MXFP4Linear: act must be 'bf16' or 'mxfp8', got {act!r}")
        if out_features % 8:
            raise ValueError(f"MXFP4Linear: out_features = {out_features} must be a multiple of 8")
        super().__init__(in_features, out_features, bias, device, prepack)
        self.act = act

    def _prepack(self):
        from .linear import mxfp4_gemm_prepack
        self.packed_weight, self.packed_scale = mxfp4_gemm_prepack(self.qweight, self.weight_scale)

    def _extra(self) -> str:
        return f", act={self.act}"

    @classmethod
    def from_linear(cls, linear: nn.Linear, act: str = "bf16") -> "MXFP4Linear":
        """Quantizes linear.weight with lowbit.quantize(w, "mxfp4") (RCEIL scales)."""
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, device=linear.weight.device,
                act=act)
        qt = m._quantize_weight(linear.weight)
        m.qweight.copy_(qt.data)
        m.weight_scale.copy_(qt.scales.view(torch.float8_e8m0fnu) if qt.scales.dtype == torch.uint8 else qt.scales)
        m._set_bias(linear.bias)
        m.prepack()
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, out_dtype = _gemm_in(x, self.in_features, "MXFP4Linear")
        a_scale = None
        if self.act == "mxfp8":
            a, a_scale = torch.ops.lowbit.mxfp8_quantize(a)
        if self._use_packed(x):
            y = torch.ops.lowbit.mxfp4_gemm(a, self.packed_weight, self.packed_scale, a_scale, self.bias, "row_major",
                                            "row_major", True, self.out_features, out_dtype)
        else:
            y = torch.ops.lowbit.mxfp4_gemm(a, self.qweight, self.weight_scale, a_scale, self.bias, "row_major",
                                            "row_major", False, None, out_dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class GptOssExperts(nn.Module):
    """The gpt-oss expert MLP with MXFP4 weights (torch.ops.lowbit.gpt_oss_moe_mlp), a drop-in
    for transformers' GptOssExperts: forward(hidden_states [T, H], router_indices [T, k],
    routing_weights [T, k]) -> [T, H] in hidden_states' dtype. Per token t and expert
    e = router_indices[t, j]: h = x @ W1[e]^T + b1[e] (gate = h[0::2], up = h[1::2]),
    y = min(gate, limit) * sigmoid(alpha min(gate, limit)) * (clamp(up, -limit, limit) + 1),
    out[t] += routing_weights[t, j] * (y @ W2[e]^T + b2[e]).

    Buffers: w1 uint8 [E, 2I, H/2], w1_scale float8_e8m0fnu [E, 2I, H/32], b1 float32 [E, 2I],
    w2 uint8 [E, H, I/2], w2_scale float8_e8m0fnu [E, H, I/32], b2 float32 [E, H] (the layout of
    `lowbit convert-gpt-oss`). act "bf16" (W4A16) or "mxfp8" (W4A8). H and I multiples of 32.
    prepack (default True): the weights are also laid out once for the kernel's packed path
    (prepack(), non-persistent buffers, as the linears do), which forward takes on CUDA tensors."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, alpha: float = 1.702,
                 limit: float = 7.0, act: str = "bf16", device=None, prepack: bool = True):
        super().__init__()
        E, H, I = int(num_experts), int(hidden_size), int(intermediate_size)
        if H <= 0 or I <= 0 or H % 32 or I % 32:
            raise ValueError(f"GptOssExperts: hidden_size = {H} and intermediate_size = {I} must be positive "
                             f"multiples of 32")
        if act not in ("bf16", "mxfp8"):
            raise ValueError(f"GptOssExperts: act must be 'bf16' or 'mxfp8', got {act!r}")
        self.num_experts, self.hidden_size, self.intermediate_size = E, H, I
        self.alpha, self.limit, self.act = float(alpha), float(limit), act
        u8, e8 = torch.uint8, torch.float8_e8m0fnu
        for name, shape, dt in (("w1", (E, 2 * I, H // 2), u8), ("w1_scale", (E, 2 * I, H // 32), e8),
                                ("b1", (E, 2 * I), torch.float32), ("w2", (E, H, I // 2), u8),
                                ("w2_scale", (E, H, I // 32), e8), ("b2", (E, H), torch.float32)):
            self.register_buffer(name, torch.zeros(shape, dtype=dt, device=device))
        self.prepacked = bool(prepack)
        for name in ("w1_packed", "w1_scale_packed", "w2_packed", "w2_scale_packed"):
            self.register_buffer(name, torch.zeros(0, dtype=u8, device=device), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.prepack())

    def prepack(self) -> None:
        """w1 / w2 and their scales laid out once by group_gemm_mxfp4_prepack (lossless, the same
        results) into the non-persistent *_packed buffers; called by from_experts and after
        load_state_dict; call it again after changing the weights in place."""
        from .gemm import group_gemm_mxfp4_prepack
        empty = torch.zeros(0, dtype=torch.uint8, device=self.w1.device)
        self.w1_packed = self.w1_scale_packed = self.w2_packed = self.w2_scale_packed = empty
        if self.prepacked:
            with torch.no_grad():
                self.w1_packed, self.w1_scale_packed = group_gemm_mxfp4_prepack(self.w1, self.w1_scale,
                                                                                b_scale_layout="row_major")
                self.w2_packed, self.w2_scale_packed = group_gemm_mxfp4_prepack(self.w2, self.w2_scale,
                                                                                b_scale_layout="row_major")

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, format=mxfp4, act={self.act}")

    @classmethod
    def from_experts(cls, experts: nn.Module, act: str = "bf16") -> "GptOssExperts":
        """Quantizes a transformers GptOssExperts (gate_up_proj [E, H, 2I], down_proj [E, I, H],
        their biases, alpha, limit) with lowbit.quantize(w, "mxfp4")."""
        gu, dn = experts.gate_up_proj.detach(), experts.down_proj.detach()
        E, H, I2 = gu.shape
        m = cls(E, H, I2 // 2, getattr(experts, "alpha", 1.702), getattr(experts, "limit", 7.0), act,
                device=gu.device)
        for w, b, names in ((gu, experts.gate_up_proj_bias, ("w1", "w1_scale", "b1")),
                            (dn, experts.down_proj_bias, ("w2", "w2_scale", "b2"))):
            w = w.transpose(1, 2).contiguous()
            qt = _ops.quantize(w if w.dtype in _FLOAT else w.float(), "mxfp4")
            getattr(m, names[0]).copy_(qt.data)
            getattr(m, names[1]).copy_(qt.scales.view(torch.float8_e8m0fnu))
            getattr(m, names[2]).copy_(b.detach().float())
        m.prepack()
        return m

    def forward(self, hidden_states: torch.Tensor, router_indices: torch.Tensor,
                routing_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        if x.dtype not in _FLOAT:
            raise TypeError(f"GptOssExperts: expected bfloat16 / float16 / float32 input, got {x.dtype}")
        x2 = x.reshape(-1, self.hidden_size).contiguous()
        ids = router_indices.reshape(x2.shape[0], -1).to(torch.int32)
        wts = routing_weights.reshape(x2.shape[0], -1).float().contiguous()
        if x.is_cuda and self.w1_packed.numel() > 0:
            y = torch.ops.lowbit.gpt_oss_moe_mlp(x2, ids, wts, self.w1_packed, self.w1_scale_packed, self.b1,
                                                 self.w2_packed, self.w2_scale_packed, self.b2, self.alpha, self.limit,
                                                 self.act, True)
        else:
            y = torch.ops.lowbit.gpt_oss_moe_mlp(x2, ids, wts, self.w1, self.w1_scale, self.b1, self.w2,
                                                 self.w2_scale, self.b2, self.alpha, self.limit, self.act, False)
        return y.reshape(x.shape)


_CLASSES = {"nvfp4": NVFP4Linear, "mxfp4": MXFP4Linear}


def cuda_skip_reason(fmt: str, in_features: int, out_features: int) -> Optional[str]:
    """Why the CUDA kernel of ``fmt`` refuses an [out_features, in_features] weight (None: it runs)."""
    N, K = out_features, in_features
    if fmt == "nvfp4":
        if N % 128 or K % 64:
            return f"N={N}, K={K}: nvfp4_gemm on CUDA needs N % 128 == 0 and K % 64 == 0"
    elif fmt == "mxfp4":
        if N % 8 or K % 32:
            return f"N={N}, K={K}: mxfp4_gemm needs N % 8 == 0 and K % 32 == 0"
    return None


@dataclass
class QuantizeReport:
    """What quantize_model did: replaced [(name, "N x K")], skipped [(name, reason)]."""
    format: str
    replaced: List[Tuple[str, str]] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.format}: {len(self.replaced)} replaced, {len(self.skipped)} skipped"]
        lines += [f"  replaced {n} [{s}]" for n, s in self.replaced]
        lines += [f"  skipped  {n}: {r}" for n, r in self.skipped]
        return "\n".join(lines)


def _compile(patterns, what):
    if isinstance(patterns, str):
        patterns = (patterns,)
    try:
        return [re.compile(p) for p in patterns]
    except re.error as e:
        raise ValueError(f"quantize_model: bad {what} regular expression {e.pattern!r}: {e}") from None


def _select(name: str, inc, exc) -> Optional[str]:
    if inc and not any(p.search(name) for p in inc):
        return "not matched by include"
    for p in exc:
        if p.search(name):
            return f"excluded ({p.pattern})"
    return None


def _set_child(model: nn.Module, name: str, module: nn.Module):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def quantize_model(model: nn.Module, format: str = "nvfp4", exclude: Sequence[str] = DEFAULT_EXCLUDES,
                   include: Sequence[str] = (), act: str = "bf16", cuda_shapes: bool = True) -> QuantizeReport:
    """Replaces the model's nn.Linear layers in place by NVFP4Linear / MXFP4Linear (``format``),
    quantizing their weights (from_linear). A layer is skipped when ``include`` (regular
    expressions, re.search on the qualified module name) is given and none matches, when an
    ``exclude`` pattern matches (default DEFAULT_EXCLUDES: embeddings, lm_head, norms, routers),
    when K is not a multiple of the format's block, or (``cuda_shapes=True``, the default) when
    the CUDA kernel refuses the shape (cuda_skip_reason). ``act`` is MXFP4Linear's activation
    format ("bf16" or "mxfp8"). transformers' GptOssExperts modules (by class name) become
    GptOssExperts (format "mxfp4" only; else reported as skipped). Returns a QuantizeReport."""
    if format not in _CLASSES:
        raise ValueError(f"quantize_model: format must be one of {sorted(_CLASSES)}, got {format!r}")
    cls = _CLASSES[format]
    inc, exc = _compile(include, "include"), _compile(exclude, "exclude")
    report = QuantizeReport(format)
    for name, mod in [(n, m) for n, m in model.named_modules() if type(m).__name__ == "GptOssExperts"
                      and not isinstance(m, GptOssExperts)]:
        why = _select(name, inc, exc)
        shape = f"{mod.gate_up_proj.shape[0]} experts, H={mod.gate_up_proj.shape[1]}, I={mod.down_proj.shape[1]}"
        if why is None and format != "mxfp4":
            why = "gpt-oss experts run as MXFP4 only (gpt_oss_moe_mlp)"
        if why is None and (mod.gate_up_proj.shape[1] % 32 or mod.down_proj.shape[1] % 32):
            why = f"{shape}: H and I must be multiples of 32"
        if why is not None:
            report.skipped.append((name, why))
            continue
        _set_child(model, name, GptOssExperts.from_experts(mod, act=act))
        report.replaced.append((name, shape))
    targets = [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear]
    for name, lin in targets:
        N, K = lin.out_features, lin.in_features
        why = _select(name, inc, exc)
        if why is None and K % cls.block:
            why = f"K={K} not a multiple of the block {cls.block}"
        if why is None and format == "mxfp4" and N % 8:
            why = f"N={N} not a multiple of 8 (mxfp4_gemm)"
        if why is None and cuda_shapes:
            why = cuda_skip_reason(format, K, N)
        if why is not None:
            report.skipped.append((name, why))
            continue
        q = cls.from_linear(lin, act=act) if format == "mxfp4" else cls.from_linear(lin)
        _set_child(model, name, q)
        report.replaced.append((name, f"{N} x {K}"))
    return report


# ---------------------------------------------------------------------------------------------
# checkpoints written by `lowbit quantize`

def _to_torch(a) -> torch.Tensor:
    import numpy as np
    a = np.array(a, copy=True, order="C")  # writable: torch.from_numpy shares the memory
    name = a.dtype.name
    special = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
               "float8_e8m0fnu": torch.float8_e8m0fnu}
    if name in special:
        return torch.from_numpy(a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)).view(special[name])
    return torch.from_numpy(a)


def _files(path: str) -> List[str]:
    if os.path.isdir(path):
        fs = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if not fs:
            raise FileNotFoundError(f"load_quantized: no .safetensors file in {path}")
        return fs
    return [path]


def _module_state(f, name: str, e) -> Tuple[str, Dict[str, torch.Tensor]]:
    """(module name, its buffers) of one quantized weight entry."""
    from .checkpoint import CheckpointError, format_from_entry
    fmt, layout = format_from_entry(e, name)
    if fmt.name not in _CLASSES or layout != "row_major" or len(e["shape"]) != 2 or not name.endswith(".weight"):
        raise CheckpointError(f"{f.path}: {name!r} ({fmt.name}, {layout}, shape {e['shape']}): load_quantized "
                              f"takes row_major nvfp4 / mxfp4 2-D '.weight' tensors")
    if fmt.nibble_order != "low":
        raise CheckpointError(f"{f.path}: {name!r}: the linears decode low-nibble-first codes only")
    cls = _CLASSES[fmt.name]
    st = {"qweight": _to_torch(f.get(e["qdata"])).view(torch.uint8),
          "weight_scale": _to_torch(f.get(e["scale"])).view(cls._scale_dtype)}
    if fmt.name == "nvfp4":
        st["weight_global_amax"] = _to_torch(f.get(e["global_amax"])).float().reshape(1)
    return name[: -len(".weight")], st


def load_quantized(path: str, model: Optional[nn.Module] = None, act: str = "bf16",
                   device=None) -> Dict[str, torch.Tensor]:
    """Reads a checkpoint written by `lowbit quantize` (one .safetensors file, or a directory of
    them), one in the compressed-tensors convention (nvfp4- / mxfp4-pack-quantized
    "X.weight_packed", "X.weight_scale" and NVFP4's "X.weight_global_scale"), or one in ModelOpt's
    NVFP4 convention ("X.weight" uint8, "X.weight_scale", "X.weight_scale_2"), and returns its state as a flat dict in the modules' naming: a quantized weight
    "<m>.weight" becomes "<m>.qweight", "<m>.weight_scale" (and "<m>.weight_global_amax" for
    NVFP4); other tensors keep their names. Given ``model``, each nn.Linear named <m> is replaced
    by an NVFP4Linear / MXFP4Linear holding the checkpoint's weight (``act``: MXFP4Linear's
    activations), a quantized weight of another module (an embedding) is loaded decoded
    (lowbit.dequantize), and every tensor is copied into the model (load_state_dict, strict: a missing or
    unexpected key raises). ``device`` places the tensors (default: the model's device or CPU)."""
    from . import safetensors_io as st
    from .checkpoint import read_lowbit_metadata
    state: Dict[str, torch.Tensor] = {}
    quantized: Dict[str, str] = {}
    for fn in _files(path):
        with st.SafetensorsFile(fn) as f:
            entries = read_lowbit_metadata(f) if "lowbit" in f.metadata else {}
            owned = set()
            for name, e in entries.items():
                mod, bufs = _module_state(f, name, e)
                quantized[mod] = _format_of(e)
                state.update({f"{mod}.{k}": v for k, v in bufs.items()})
                owned.update(n for n in (e.get("qdata"), e.get("scale"), e.get("zero"), e.get("global_amax")) if n)
            for mod, fmt, bufs, names in (*_compressed_tensors_modules(f), *_modelopt_modules(f)):
                quantized[mod] = fmt
                state.update({f"{mod}.{k}": v for k, v in bufs.items()})
                owned.update(names)
            for n in f.names():
                if n not in owned:
                    state[n] = _to_torch(f.get(n))
    if device is None and model is not None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else None
    if device is not None:
        state = {k: v.to(device) for k, v in state.items()}
    if model is None:
        return state
    for mod, fmt in quantized.items():
        lin = model.get_submodule(mod)
        if not isinstance(lin, (nn.Linear, _QuantLinear)):  # e.g. an embedding: its float weight, decoded
            if not isinstance(getattr(lin, "weight", None), torch.Tensor):
                raise TypeError(f"load_quantized: {mod!r} ({type(lin).__name__}) has no weight to load into")
            bufs = {k: state.pop(f"{mod}.{k}") for k in ("qweight", "weight_scale", "weight_global_amax")
                    if f"{mod}.{k}" in state}
            qt = _ops.Quantized(bufs["qweight"], bufs["weight_scale"], None, bufs.get("weight_global_amax"), fmt,
                                "row_major", tuple(lin.weight.shape))
            state[f"{mod}.weight"] = _ops.dequantize(qt, "float32")
            continue
        has_bias = f"{mod}.bias" in state
        kw = {"act": act} if fmt == "mxfp4" else {}
        q = _CLASSES[fmt](lin.in_features, lin.out_features, has_bias, device=device, **kw)
        if has_bias:
            state[f"{mod}.bias"] = state[f"{mod}.bias"].float()
        _set_child(model, mod, q)
    sd = model.state_dict()
    for k, v in state.items():
        if k in sd and sd[k].dtype != v.dtype and v.is_floating_point() and sd[k].is_floating_point():
            state[k] = v.to(sd[k].dtype)
    model.load_state_dict(state, strict=True)
    return state


def _format_of(e) -> str:
    return e["format"]


def _amax_from_global_scale(gs: torch.Tensor) -> torch.Tensor:
    """The float32 amax whose S_enc = 2688 / amax (computed in float32, as the kernels do) is the
    compressed-tensors global scale gs, where one exists within a few ulps of 2688 / gs."""
    gs = gs.float().reshape(1)
    amax = torch.tensor([2688.0]) / gs
    best = amax
    for _ in range(4):
        err = torch.tensor([2688.0]) / amax - gs
        if err.item() == 0:
            return amax
        amax = torch.nextafter(amax, amax + err.sign() * amax)
    return best


def _compressed_tensors_modules(f):
    """(module, format, buffers, tensor names) of each "X.weight_packed" of a compressed-tensors
    file: nvfp4-pack-quantized (X.weight_scale E4M3 per 16, X.weight_global_scale = S_enc) or
    mxfp4-pack-quantized (X.weight_scale UE8M0 bytes per 32); codes low nibble first."""
    from .checkpoint import CheckpointError
    names = set(f.names())
    for n in sorted(names):
        if not n.endswith(".weight_packed"):
            continue
        mod = n[: -len(".weight_packed")]
        sc, gsn = f"{mod}.weight_scale", f"{mod}.weight_global_scale"
        if sc not in names or f"{mod}.weight_zero_point" in names:
            raise CheckpointError(f"{f.path}: {mod!r}: a weight_packed without weight_scale, or with zero points "
                                  f"(only nvfp4- / mxfp4-pack-quantized load)")
        q, scale = _to_torch(f.get(n)).view(torch.uint8), _to_torch(f.get(sc))
        block = 2 * q.shape[-1] // max(1, scale.shape[-1])
        fmt = "nvfp4" if gsn in names else "mxfp4"
        if q.dim() != 2 or block != _CLASSES[fmt].block:
            raise CheckpointError(f"{f.path}: {mod!r}: weight_packed {list(q.shape)} with weight_scale "
                                  f"{list(scale.shape)} is not {fmt} (one scale per {_CLASSES[fmt].block})")
        bufs = {"qweight": q, "weight_scale": scale.view(_CLASSES[fmt]._scale_dtype)}
        used = [n, sc]
        if fmt == "nvfp4":
            bufs["weight_global_amax"] = _amax_from_global_scale(_to_torch(f.get(gsn)))
            used += [gsn] + [x for x in (f"{mod}.input_global_scale",) if x in names]  # W4A16: unused
        yield mod, fmt, bufs, used


def _amax_from_decode_scale(ws2: torch.Tensor) -> torch.Tensor:
    """The float32 amax whose S_dec = 1 / (2688 / amax) (float32, as the kernels compute it) is
    ModelOpt's weight_scale_2, searched within 16 ulps of 2688 * ws2; where none is exact
    (a weight_scale_2 written as amax / 2688 by another program), the nearest."""
    import numpy as np
    from .checkpoint.compressed_tensors import global_scale
    w = np.float32(ws2.float().reshape(-1)[0].item())
    if not (np.isfinite(w) and w > 0):
        return torch.tensor([float(w)], dtype=torch.float32)  # S_enc = S_dec = 1, as lowbit decodes it
    def s_dec(a):
        return np.float32(np.float32(1.0) / global_scale(a))
    a0 = np.float32(np.float32(2688.0) * w)
    cands, up, down = [a0], a0, a0
    for _ in range(16):  # nearest to 2688 * ws2 first
        up = np.nextafter(up, np.float32(np.inf), dtype=np.float32)
        down = np.nextafter(down, np.float32(0), dtype=np.float32)
        cands += [up, down]
    exact = [a for a in cands if s_dec(a) == w]
    best = exact[0] if exact else min(cands, key=lambda a: abs(float(s_dec(a)) - float(w)))
    return torch.tensor([float(best)], dtype=torch.float32)


def _modelopt_modules(f):
    """(module, "nvfp4", buffers, tensor names) of each "X.weight_scale_2" of a ModelOpt NVFP4
    file: X.weight uint8 [N, K/2] (low nibble first), X.weight_scale E4M3 [N, K/16],
    X.weight_scale_2 the per-tensor decode scale; X.input_scale (W4A4 activations) is unused."""
    from .checkpoint import CheckpointError
    names = set(f.names())
    for n in sorted(names):
        if not n.endswith(".weight_scale_2"):
            continue
        mod = n[: -len(".weight_scale_2")]
        wn, sc = f"{mod}.weight", f"{mod}.weight_scale"
        if wn not in names or sc not in names:
            raise CheckpointError(f"{f.path}: {mod!r}: a weight_scale_2 without weight and weight_scale")
        q, scale = _to_torch(f.get(wn)), _to_torch(f.get(sc))
        if (q.dtype != torch.uint8 or q.dim() != 2 or scale.dim() != 2 or scale.element_size() != 1
                or scale.shape[0] != q.shape[0] or 2 * q.shape[1] != 16 * scale.shape[1]):
            raise CheckpointError(f"{f.path}: {mod!r}: weight {q.dtype} {list(q.shape)} with weight_scale "
                                  f"{list(scale.shape)} is not ModelOpt NVFP4 (uint8 [N, K/2], E4M3 [N, K/16])")
        bufs = {"qweight": q, "weight_scale": scale.view(torch.float8_e4m3fn),
                "weight_global_amax": _amax_from_decode_scale(_to_torch(f.get(n)))}
        yield mod, "nvfp4", bufs, [wn, sc, n] + [x for x in (f"{mod}.input_scale",) if x in names]
