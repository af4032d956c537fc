"""The gpt-oss MXFP4 convention (`--convention gpt-oss --format mxfp4`): the expert weights of a
gpt-oss model in float (transformers' GptOssExperts parameters `X.gate_up_proj` [E, hidden,
2*intermediate] and `X.down_proj` [E, intermediate, hidden], used as `x @ W[e]`) are written as
the original gpt-oss checkpoints store them, which transformers' Mxfp4 quantizer and vLLM load:

    X.gate_up_proj_blocks  U8 [E, N, K/32, 16]   E2M1 codes of W[e]^T [N, K], element 2i in the low nibble
    X.gate_up_proj_scales  U8 [E, N, K/32]       UE8M0 exponents, 2^(s - 127)

(the same for down_proj), config.json's "quantization_config" = {"quant_method": "mxfp4",
"modules_to_not_convert": [...]}; every other tensor (attention, router, embeddings, biases)
is copied, as in the released checkpoints. `lowbit convert-gpt-oss` reads this naming back.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .schema import CheckpointError, QuantConfig

CONVENTION = "gpt-oss"
_EXPERTS = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def check_config(cfg: QuantConfig) -> None:
    if cfg.spec.api != "mxfp4":
        raise CheckpointError(f"--convention gpt-oss stores mxfp4 experts (got --format {cfg.spec.api})")
    if cfg.layout != "row_major":
        raise CheckpointError(f"--scale-layout {cfg.layout}: gpt-oss checkpoints store row_major scales")
    if cfg.nibble_order not in (None, "low"):
        raise CheckpointError("--nibble-order high: gpt-oss packs element 2i in the low nibble")


def skip_reason(name: str, dtype: str, shape: Sequence[int]) -> Optional[str]:
    if not _EXPERTS.match(name):
        return "not an expert weight (gate_up_proj / down_proj; gpt-oss keeps the rest in float)"
    if dtype not in ("F32", "F16", "BF16"):
        return f"not float ({dtype})"
    if len(shape) != 3:
        return f"not 3-D ({len(shape)}-D) [experts, K, N]"
    if shape[1] % 32 or shape[1] == 0 or shape[2] == 0:
        return f"K={shape[1]} not a positive multiple of 32"
    return None


def output_specs(name: str, shape: Sequence[int]) -> List[Tuple[str, str, Tuple[int, ...]]]:
    e, k, n = (int(d) for d in shape)
    return [(f"{name}_blocks", "U8", (e, n, k // 32, 16)), (f"{name}_scales", "U8", (e, n, k // 32))]


def quantize_experts(name: str, x: np.ndarray, fmt, quantize, dequantize, get
                     ) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """(the two output tensors, lowbit's float32 decode of W[e]^T stacked [E, N, K])."""
    e, k, n = x.shape
    blocks = np.empty((e, n, k // 32, 16), np.uint8)
    scales = np.empty((e, n, k // 32), np.uint8)
    dec = np.empty((e, n, k), np.float32)
    for i in range(e):
        wt = np.ascontiguousarray(np.asarray(x[i]).T)
        qt = quantize(wt, fmt)
        blocks[i] = np.asarray(get(qt.data)).view(np.uint8).reshape(n, k // 32, 16)
        scales[i] = np.asarray(get(qt.scales)).view(np.uint8).reshape(n, k // 32)
        dec[i] = np.asarray(get(dequantize(qt, out_dtype="float32")))
    return {f"{name}_blocks": blocks, f"{name}_scales": scales}, dec


def quantization_config() -> Dict[str, Any]:
    return {"quant_method": "mxfp4", "modules_to_not_convert": list(NOT_CONVERTED)}
