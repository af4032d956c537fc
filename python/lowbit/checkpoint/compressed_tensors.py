"""The compressed-tensors convention: the tensor names, dtypes and shapes, and the
`quantization_config` of config.json, that transformers (with the compressed-tensors package)
and vLLM load. See docs/checkpoints.md for the table; the rules, per quantized `X.weight`
[M, K] (module `X`):

    nvfp4       "nvfp4-pack-quantized": X.weight_packed U8 [M, K/2] (element 2i in the low nibble),
                X.weight_scale F8_E4M3 [M, K/16], X.weight_global_scale F32 [1] = lowbit's
                S_enc = 448*6/global_amax (decode: e2m1 * weight_scale / weight_global_scale)
    mxfp4       "mxfp4-pack-quantized": X.weight_packed U8 [M, K/2], X.weight_scale U8 [M, K/32]
                (UE8M0 bytes, 2^(s-127))
    mxfp8_e4m3  "mxfp8-quantized": X.weight F8_E4M3 [M, K], X.weight_scale U8 [M, K/32]
    fp8_e4m3    "float-quantized", strategy group: X.weight F8_E4M3 [M, K], X.weight_scale F32
                [M, K/G] (UE8M0 scales are written as their float32 values)
    int4        "pack-quantized", symmetric: X.weight_packed I32 [M, K/8] (eight codes per word,
                element i at bits 4i, stored as q + 8), X.weight_scale F32 [M, K/G],
                X.weight_shape I64 [2]
    uint4       "pack-quantized", asymmetric: as int4 with the stored nibble = lowbit's UINT4 code
                (q - 8 in [-8, 7] is the signed code), plus X.weight_zero_point I32 [ceil(M/8),
                K/G]: the zero points zp - 8, packed along the rows (dimension 0)

Decode (compressed-tensors): (q - zp) * scale, which is lowbit's arithmetic for every scheme
but NVFP4 (a division by the global scale instead of lowbit's multiplication by its inverse).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .schema import CheckpointError, QuantConfig

CONVENTION = "compressed-tensors"
QUANT_METHOD = "compressed-tensors"

# lowbit format -> compressed-tensors format name
CT_FORMATS = {
    "nvfp4": "nvfp4-pack-quantized",
    "mxfp4": "mxfp4-pack-quantized",
    "mxfp8_e4m3": "mxfp8-quantized",
    "fp8_e4m3": "float-quantized",
    "int4": "pack-quantized",
    "uint4": "pack-quantized",
}

# Module name patterns whose weights are grouped into one fused GEMM by the inference engines:
# their NVFP4 global scales are made equal (the largest amax of the group), as vLLM and
# TensorRT-LLM use one per-tensor scale for the fused weight.
FUSED_GROUPS = (
    (re.compile(r"^(.*)\.(q_proj|k_proj|v_proj)$"), "qkv"),
    (re.compile(r"^(.*)\.(gate_proj|up_proj)$"), "gate_up"),
    (re.compile(r"^(.*)\.(w1|w3)$"), "w13"),
)


def check_config(cfg: QuantConfig) -> None:
    """Refuses the options the compressed-tensors convention cannot express."""
    api = cfg.spec.api
    if api not in CT_FORMATS:
        raise CheckpointError(f"--format {api}: compressed-tensors has no scheme for it (supported: "
                              f"{', '.join(CT_FORMATS)}); use --convention lowbit")
    if cfg.layout != "row_major":
        raise CheckpointError(f"--scale-layout {cfg.layout}: compressed-tensors stores row_major scales")
    if cfg.nibble_order not in (None, "low"):
        raise CheckpointError("--nibble-order high: compressed-tensors packs element 2i in the low nibble")
    # --rounding floor is fine: its scales are UE8M0 powers of two as well


def module_of(name: str) -> Optional[str]:
    """`X` of a tensor `X.weight` (None for any other name)."""
    return name[: -len(".weight")] if name.endswith(".weight") else None


def skip_reason(shape: Sequence[int], cfg: QuantConfig) -> Optional[str]:
    """A reason the convention cannot store this tensor (None: it can)."""
    if cfg.spec.api in ("int4", "uint4") and shape[-1] % 8:
        return f"K={shape[-1]} not a multiple of 8 (int32 packing of compressed-tensors)"
    return None


def output_specs(module: str, cfg: QuantConfig, shape: Sequence[int]) -> List[Tuple[str, str, Tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of the tensors that replace `module`.weight."""
    m, k = (int(d) for d in shape)
    g = k // cfg.block
    api = cfg.spec.api
    if api == "nvfp4":
        return [(f"{module}.weight_packed", "U8", (m, k // 2)), (f"{module}.weight_scale", "F8_E4M3", (m, g)),
                (f"{module}.weight_global_scale", "F32", (1,))]
    if api == "mxfp4":
        return [(f"{module}.weight_packed", "U8", (m, k // 2)), (f"{module}.weight_scale", "U8", (m, g))]
    if api == "mxfp8_e4m3":
        return [(f"{module}.weight", "F8_E4M3", (m, k)), (f"{module}.weight_scale", "U8", (m, g))]
    if api == "fp8_e4m3":
        return [(f"{module}.weight", "F8_E4M3", (m, k)), (f"{module}.weight_scale", "F32", (m, g))]
    out = [(f"{module}.weight_packed", "I32", (m, k // 8)), (f"{module}.weight_scale", "F32", (m, g)),
           (f"{module}.weight_shape", "I64", (2,))]
    if api == "uint4":
        out.append((f"{module}.weight_zero_point", "I32", ((m + 7) // 8, g)))
    return out


def _nibbles_to_int32(packed: np.ndarray) -> np.ndarray:
    """uint8 [R, C/2] of low-first nibbles -> int32 [R, C/8], element i at bits 4i (little endian)."""
    b = np.ascontiguousarray(packed, dtype=np.uint8)
    words = b.reshape(b.shape[0], -1, 4).astype(np.uint32)
    w = words[..., 0] | (words[..., 1] << 8) | (words[..., 2] << 16) | (words[..., 3] << 24)
    return w.astype(np.uint32).view(np.int32)


def _pack_rows(zp: np.ndarray) -> np.ndarray:
    """uint8 codes [M, G] (0..15) -> int32 [ceil(M/8), G]: row m at bits 4*(m%8) of word row m//8."""
    m, g = zp.shape
    rows = (m + 7) // 8
    padded = np.zeros((rows * 8, g), np.uint32)
    padded[:m] = zp
    p = padded.reshape(rows, 8, g)
    w = np.zeros((rows, g), np.uint32)
    for i in range(8):
        w |= p[:, i, :] << np.uint32(4 * i)
    return w.view(np.int32)


def _scale_values(scales: np.ndarray, fmt) -> np.ndarray:
    """float32 values of float32 or UE8M0 scales."""
    if fmt.scale_dtype == "float32":
        return np.asarray(scales, np.float32)
    e = np.asarray(scales).view(np.uint8).astype(np.int32)
    out = np.ldexp(np.float32(1.0), e - 127).astype(np.float32)
    out[e == 255] = np.nan
    return out


def global_scale(global_amax: float) -> np.float32:
    """lowbit's S_enc for a global amax (include/lowbit/block_quant.hpp nvfp4_global_encode_scale)."""
    flt_max = np.finfo(np.float32).max
    a = np.float32(global_amax)
    if not (a >= 0 and a <= flt_max):
        return np.float32(1.0)
    with np.errstate(divide="ignore", over="ignore"):
        s = np.float32(np.float32(2688.0) / a)
    s = s if s < flt_max else flt_max
    if a == 0 or s == 0:
        return np.float32(1.0)
    return np.float32(s)


def convert(module: str, cfg: QuantConfig, qt, shape: Sequence[int], get) -> Dict[str, np.ndarray]:
    """The compressed-tensors tensors of one quantized weight; get(a) brings a backend array to NumPy."""
    m, k = (int(d) for d in shape)
    api = cfg.spec.api
    data, scales = get(qt.data), get(qt.scales)
    if api in ("nvfp4", "mxfp4"):
        out = {f"{module}.weight_packed": np.asarray(data).view(np.uint8),
               f"{module}.weight_scale": np.asarray(scales).view(np.uint8)}
        if api == "nvfp4":
            gam = float(np.asarray(get(qt.global_amax), np.float32).reshape(-1)[0])
            out[f"{module}.weight_global_scale"] = np.array([global_scale(gam)], np.float32)
        return out
    if api == "mxfp8_e4m3":
        return {f"{module}.weight": np.asarray(data).view(np.uint8),
                f"{module}.weight_scale": np.asarray(scales).view(np.uint8)}
    if api == "fp8_e4m3":
        return {f"{module}.weight": np.asarray(data).view(np.uint8),
                f"{module}.weight_scale": _scale_values(scales, qt.format)}
    codes = np.asarray(data).view(np.uint8)
    if api == "int4":  # two's complement nibble -> q + 8: flip the top bit of each nibble
        codes = codes ^ np.uint8(0x88)
    out = {f"{module}.weight_packed": _nibbles_to_int32(codes),
           f"{module}.weight_scale": _scale_values(scales, qt.format),
           f"{module}.weight_shape": np.array([m, k], np.int64)}
    if api == "uint4":
        out[f"{module}.weight_zero_point"] = _pack_rows(np.asarray(get(qt.zeros)).view(np.uint8))
    return out


def weights_args(cfg: QuantConfig) -> Dict[str, Any]:
    """The "weights" QuantizationArgs of the scheme, as compressed-tensors serializes them."""
    api = cfg.spec.api
    if api == "nvfp4":
        return {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
                "dynamic": False, "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": "torch.float8_e4m3fn"}
    if api in ("mxfp4", "mxfp8_e4m3"):
        return {"num_bits": 4 if api == "mxfp4" else 8, "type": "float", "symmetric": True, "group_size": 32,
                "strategy": "group", "dynamic": False, "scale_dtype": "torch.uint8", "zp_dtype": "torch.uint8"}
    if api == "fp8_e4m3":
        return {"num_bits": 8, "type": "float", "symmetric": True, "group_size": cfg.block, "strategy": "group",
                "dynamic": False}
    args = {"num_bits": 4, "type": "int", "symmetric": api == "int4", "group_size": cfg.block, "strategy": "group",
            "dynamic": False}
    if api == "uint4":
        args["zp_dtype"] = "torch.int8"
    return args


def quantization_config(cfg: QuantConfig, ignore: Sequence[str], version: str) -> Dict[str, Any]:
    """config.json's "quantization_config": one scheme for every Linear, the others in "ignore"."""
    fmt = CT_FORMATS[cfg.spec.api]
    return {
        "quant_method": QUANT_METHOD,
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights_args(cfg),
                                      "input_activations": None, "output_activations": None, "format": fmt}},
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
    }


def fused_group(module: str) -> Optional[str]:
    """The key of the fused group a module belongs to (None: not fused)."""
    for pat, kind in FUSED_GROUPS:
        mt = pat.match(module)
        if mt:
            return f"{mt.group(1)}:{kind}"
    return None
