"""The ModelOpt NVFP4 convention (`--convention modelopt --format nvfp4`): the tensor names and
the config files of NVIDIA TensorRT Model Optimizer's NVFP4 export, which vLLM
(`--quantization modelopt`, quant_algo "NVFP4") and TensorRT-LLM load. Per quantized `X.weight`
[M, K] (module `X`):

    X.weight          U8 [M, K/2]      E2M1 codes, two per byte, element 2i in the low nibble
    X.weight_scale    F8_E4M3 [M, K/16] the per-16 block scales
    X.weight_scale_2  F32 []           the per-tensor DECODE scale: lowbit's S_dec = 1 / S_enc
                                       (S_enc = 2688 / global_amax in float32), i.e. global_amax /
                                       (6 * 448) up to float32 rounding
    X.input_scale     F32 []           the per-tensor activation decode scale; lowbit has no
                                       calibration data and writes 1.0 (DEFAULT_INPUT_SCALE)

Decode: w = e2m1 * weight_scale * weight_scale_2 (multiplied, in float32, left to right), which
is lowbit's dequantize bit for bit. hf_quant_config.json: {"producer": {"name": "modelopt", ...},
"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": null,
"exclude_modules": [...]}}; config.json's "quantization_config" is the same in the form ModelOpt
writes there (quant_method "modelopt", quant_algo, config_groups, ignore). See docs/checkpoints.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .compressed_tensors import global_scale
from .schema import PRODUCER, CheckpointError, QuantConfig

CONVENTION = "modelopt"
QUANT_METHOD = "modelopt"
QUANT_ALGO = "NVFP4"
GROUP_SIZE = 16
HF_QUANT_CONFIG = "hf_quant_config.json"
# The activation decode scale written without calibration: 1.0, no per-tensor activation scale
# (the activations' E4M3 block scales then cover block amaxes up to 6 * 448 = 2688), as lowbit's
# own NVFP4 recipe uses S_enc = 1 when no global amax is given (docs/formats.md).
DEFAULT_INPUT_SCALE = 1.0


def check_config(cfg: QuantConfig) -> None:
    """Refuses the options the ModelOpt convention cannot express."""
    if cfg.spec.api != "nvfp4":
        raise CheckpointError(f"--convention modelopt stores nvfp4 weights (got --format {cfg.spec.api})")
    if cfg.layout != "row_major":
        raise CheckpointError(f"--scale-layout {cfg.layout}: ModelOpt checkpoints store row_major scales")
    if cfg.nibble_order not in (None, "low"):
        raise CheckpointError("--nibble-order high: ModelOpt packs element 2i in the low nibble")


def output_specs(module: str, shape: Sequence[int]) -> List[Tuple[str, str, Tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of the tensors that replace `module`.weight."""
    m, k = (int(d) for d in shape)
    return [(f"{module}.weight", "U8", (m, k // 2)), (f"{module}.weight_scale", "F8_E4M3", (m, k // GROUP_SIZE)),
            (f"{module}.weight_scale_2", "F32", ()), (f"{module}.input_scale", "F32", ())]


def decode_scale(global_amax: float) -> np.float32:
    """lowbit's S_dec = 1 / S_enc in float32 (include/lowbit/block_quant.hpp
    nvfp4_global_decode_scale): the weight_scale_2 that decodes bit for bit as lowbit does."""
    return np.float32(np.float32(1.0) / global_scale(global_amax))


def convert(module: str, qt, get) -> Dict[str, np.ndarray]:
    """The ModelOpt tensors of one NVFP4 weight; get(a) brings a backend array to NumPy."""
    gam = float(np.asarray(get(qt.global_amax), np.float32).reshape(-1)[0])
    return {f"{module}.weight": np.asarray(get(qt.data)).view(np.uint8),
            f"{module}.weight_scale": np.asarray(get(qt.scales)).view(np.uint8),
            f"{module}.weight_scale_2": np.array(decode_scale(gam), np.float32).reshape(()),
            f"{module}.input_scale": np.array(DEFAULT_INPUT_SCALE, np.float32).reshape(())}


def hf_quant_config(exclude: Sequence[str]) -> Dict[str, Any]:
    """hf_quant_config.json. The producer name is "modelopt": vLLM recognises the file's layout
    by it; "written_by" says which program wrote this one."""
    return {"producer": {"name": "modelopt", "written_by": PRODUCER},
            "quantization": {"quant_algo": QUANT_ALGO, "kv_cache_quant_algo": None, "group_size": GROUP_SIZE,
                             "exclude_modules": sorted(exclude)}}


def quantization_config(exclude: Sequence[str]) -> Dict[str, Any]:
    """config.json's "quantization_config", in the form ModelOpt writes into config.json."""
    args = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE}
    return {"config_groups": {"group_0": {"input_activations": dict(args), "weights": dict(args),
                                          "targets": ["Linear"]}},
            "ignore": sorted(exclude), "quant_algo": QUANT_ALGO, "group_size": GROUP_SIZE,
            "producer": {"name": "modelopt", "written_by": PRODUCER}, "quant_method": QUANT_METHOD}
