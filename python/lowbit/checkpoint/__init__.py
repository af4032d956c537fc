"""Quantizing, dequantizing and converting whole safetensors checkpoints.

Naming scheme of a quantized checkpoint. A quantized tensor `W` of shape [M, K] (or [L, M, K]
for the converted gpt-oss experts) is replaced by:

    W.qdata        codes: uint8 [M, K/2] for the 4-bit formats (two codes per byte, element 2i in
                   the low nibble unless nibble_order is "high"); float8_e4m3fn / float8_e5m2
                   [M, K] for the 8-bit formats
    W.scale        the block scales, stored as the layout stores them (row_major [M, K/block];
                   col_major / blocked128x4 / blocked8x4: the padded matrix of lowbit.scale_shape);
                   float32, float8_e8m0fnu / uint8 (UE8M0) or float8_e4m3fn (NVFP4)
    W.zero         uint4 only: uint8 zero points, same layout and shape as W.scale
    W.global_amax  nvfp4 only: float32 [1], the per-tensor amax (S_dec = global_amax / 2688)

and the safetensors `__metadata__` gets one key, "lowbit", whose value is a JSON object

    {"version": 1, "producer": "lowbit <version>",
     "tensors": {"W": {"format": "nvfp4", "block": 16, "layout": "row_major", "row_align": 1,
                       "nibble_order": "low", "rounding": null, "scale_dtype": "float8_e4m3fn",
                       "zero_scale": "zero", "shape": [M, K], "dtype": "BF16",
                       "qdata": "W.qdata", "scale": "W.scale", "zero": null,
                       "global_amax": "W.global_amax",
                       "format_kwargs": {"block": 16, "nibble_order": "low", "zero_scale": "zero"}}}}

`format` is a lowbit.Format name and `format_kwargs` its keyword arguments
(lowbit.Format(format, **format_kwargs) rebuilds it; the fields before it say the same for a
reader without lowbit); `rounding` is the MX scale rule (null otherwise), `nibble_order` null for
the 8-bit formats; `shape` and `dtype` (safetensors name) are those of the original tensor. The
value decodes as lowbit.dequantize(lowbit.Quantized(qdata, scale, zero, global_amax, format,
layout, shape)). Every other tensor is copied byte for byte, and existing metadata keys are kept.
Converted gpt-oss experts use the same scheme with a 3-D shape [experts, rows, K] (one matrix per
expert; "source": "gpt-oss"); "producer" names the lowbit.__version__ that wrote the file.

Modules: schema (command-line formats, output names, the metadata entries), device (CPU / CUDA
backends and error statistics), io (reports, output checks), quantize, dequantize, gpt_oss;
model_dir, compressed_tensors and quantize_model write Hugging Face model directories in the
compressed-tensors convention instead (docs/checkpoints.md).
The modules call the package's ops as attributes of `lowbit` (lowbit.quantize, ...), so that
the functions the package exports are the ones used.
"""

from .device import Backend, TorchCudaBackend, _sqnr, cuda_status, make_backend, nanmax
from .dequantize import _OUT_DTYPES, _dequantize_checkpoint, _dtype_name, dequantize_checkpoint, dequantize_entry
from .gpt_oss import (
    _E2M1,
    _convert_gpt_oss,
    _convert_gpt_oss_tensors,
    _same_bits,
    convert_gpt_oss,
    decode_gpt_oss,
    find_gpt_oss_pairs,
)
from .io import TensorReport, _check_output, _conform, _nonfinite_words
from .quantize import DEFAULT_EXCLUDES, Selection, _quantize_checkpoint, quantize_checkpoint, skip_reason
from .quantize_model import quantize_model
from .schema import (
    _ENTRY_TENSORS,
    FLOAT_DTYPES,
    FORMAT_ALIASES,
    FORMATS,
    LAYOUTS,
    METADATA_KEY,
    METADATA_VERSION,
    CheckpointError,
    FormatSpec,
    QuantConfig,
    _unique_keys,
    check_entries,
    format_from_entry,
    make_config,
    make_quantized,
    metadata_entry,
    output_names,
    quantized_specs,
    read_lowbit_metadata,
)

__all__ = [
    "METADATA_KEY", "METADATA_VERSION", "LAYOUTS", "FLOAT_DTYPES", "FORMATS", "FORMAT_ALIASES", "CheckpointError",
    "FormatSpec", "DEFAULT_EXCLUDES", "quantize_model",
    "QuantConfig", "make_config", "output_names", "quantized_specs", "metadata_entry", "read_lowbit_metadata",
    "check_entries", "format_from_entry", "make_quantized", "cuda_status", "Backend", "TorchCudaBackend",
    "nanmax", "make_backend", "TensorReport", "Selection", "skip_reason", "quantize_checkpoint",
    "dequantize_entry", "dequantize_checkpoint", "decode_gpt_oss", "find_gpt_oss_pairs", "convert_gpt_oss",
]
