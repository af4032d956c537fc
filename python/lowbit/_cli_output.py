"""The output of the `lowbit` command (lowbit.cli): its long --help texts, tables, sizes and the
progress display."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import List, Optional, Sequence

QUANTIZE_EPILOG = """\
formats (one vocabulary with lowbit.Format; former spellings mxfp8, mxfp8-e5m2, fp8-group are
still accepted):
  nvfp4        E2M1 codes, E4M3 scale per 16 elements, per-tensor float32 global amax
  mxfp4        E2M1 codes, UE8M0 scale per 32 elements (OCP MX)
  mxfp8_e4m3   E4M3 codes, UE8M0 scale per 32 elements (OCP MX)
  mxfp8_e5m2   E5M2 codes, UE8M0 scale per 32 elements (OCP MX; --convention lowbit only)
  fp8_e4m3     E4M3 codes, float32 (or UE8M0) scale per --group-size (default 128)
  fp8_e5m2     E5M2 codes, as fp8_e4m3 (--convention lowbit only)
  int4         symmetric INT4, float32 (or UE8M0) scale per --group-size (default 128)
  uint4        asymmetric UINT4, float32 scale + uint8 zero point per --group-size (default 128)
  nf4          NF4 codebook (bitsandbytes), float32 absmax per --group-size (default 64; lowbit only)

conventions (--convention; default: compressed-tensors when IN is a model directory or an index
file and OUT does not end in .safetensors, else lowbit):
  compressed-tensors  OUT is a model directory: model.safetensors or model-0000i-of-0000n.safetensors
                      + model.safetensors.index.json, config.json with "quantization_config", the
                      input directory's other files copied. Schemes: nvfp4 -> nvfp4-pack-quantized,
                      mxfp4 -> mxfp4-pack-quantized, mxfp8_e4m3 -> mxfp8-quantized, fp8_e4m3 ->
                      float-quantized (group), int4 / uint4 -> pack-quantized. NVFP4 global scales
                      are shared by q/k/v and by gate/up. Only X.weight tensors are quantized.
  gpt-oss             --format mxfp4 only: the expert weights of a gpt-oss model (X.gate_up_proj,
                      X.down_proj [E, K, N]) as X.*_blocks U8 [E, N, K/32, 16] + X.*_scales U8
                      [E, N, K/32], quant_method "mxfp4"; everything else copied.
  modelopt            --format nvfp4 only: NVIDIA ModelOpt's NVFP4 naming (vLLM, TensorRT-LLM): X.weight
                      U8 [M, K/2], X.weight_scale F8_E4M3 [M, K/16], X.weight_scale_2 F32 (the decode
                      scale, amax / 2688), X.input_scale F32 (1.0: no calibration), hf_quant_config.json
                      and config.json's quant_method "modelopt", quant_algo "NVFP4"; shards as above.
  lowbit              OUT.safetensors from one input file, with the tensors and metadata below.

default excludes (--no-default-excludes turns them off): embeddings, lm_head, norms, MoE routers
and gates (X.gate.weight, X.router.weight), biases; and always: tensors that are not 2-D floats.

lowbit convention: output tensors, for each quantized tensor W [M, K]:
  W.qdata        codes: uint8 [M, K/2] for 4-bit formats (element 2i in the low nibble unless
                 --nibble-order high), F8_E4M3 / F8_E5M2 [M, K] for 8-bit formats
  W.scale        scales in --scale-layout (row_major: [M, K/block]; the other layouts: the
                 padded matrix of lowbit.scale_shape)
  W.zero         uint4 only: uint8 zero points (same layout as W.scale)
  W.global_amax  nvfp4 only: float32 [1]
metadata: __metadata__["lowbit"] = JSON {"version": 1, "producer": "lowbit X.Y.Z",
  "tensors": {"W": {"format", "block", "layout", "row_align", "nibble_order", "rounding",
  "scale_dtype", "zero_scale", "shape", "dtype", "qdata", "scale", "zero", "global_amax",
  "format_kwargs"}}}: "format" + "format_kwargs" rebuild the lowbit.Format, "shape"/"dtype" are
  the original tensor's; other metadata keys are kept. `lowbit dequantize` reverses it.

Only 2-D F32/F16/BF16 tensors whose last dimension is a multiple of the block are quantized;
every other tensor is copied unchanged and the table lists why.
"""

GPT_OSS_EPILOG = """\
input: gpt-oss MXFP4 expert tensors X_blocks (or X.blocks) uint8 [experts, rows, K/32, 16] and
X_scales (X.scales) uint8 [experts, rows, K/32] (UE8M0, 2^(s-127)), element 2i in the low nibble.
output, for each pair:
  X.qdata  uint8 [experts, rows, K/2]   packed E2M1 codes, element 2i in the low nibble
  X.scale  uint8 [experts, rows, K/32]  UE8M0 scales (row_major), or per expert the padded
           matrix of the chosen --layout (e.g. blocked128x4: [experts, round_up(rows,128),
           round_up(K/32,4)])
plus a "lowbit" metadata entry (format mxfp4, block 32, the layout, shape [experts, rows, K]).
Every expert is decoded twice, from the original blocks/scales (an independent NumPy decode)
and from the converted tensors (lowbit.dequantize); the values must agree bit for bit.
Biases and all other tensors are copied unchanged.
"""


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} TiB"


def _fmt_float(v: Optional[float], spec: str) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"


def render_table(headers: Sequence[str], rows: List[Sequence[str]], right: Sequence[bool]) -> str:
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]

    def line(cells):
        out = []
        for c, w, rj in zip(cells, widths, right):
            out.append(c.rjust(w) if rj else c.ljust(w))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


class Progress:
    """Per-tensor progress on stderr with the rate (input bytes per second) and the time left: a
    bar redrawn in place on a terminal, else one line per tensor."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_len = 0
        self._t0: Optional[float] = None

    def _rate_eta(self, done: int, total: int) -> str:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        dt = now - self._t0
        if dt <= 0 or done <= 0:
            return ""
        rate = done / dt
        eta = max(0.0, (total - done) / rate) if total else 0.0
        return f" {human_bytes(rate)}/s ETA {_hms(eta)}"

    def __call__(self, i: int, n: int, done: int, total: int, name: str) -> None:
        if not self.enabled:
            return
        frac = done / total if total else (i / n if n else 1.0)
        speed = self._rate_eta(done, total)
        if self.tty:
            width = 24
            fill = int(round(frac * width))
            msg = (f"[{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% {human_bytes(done)}/"
                   f"{human_bytes(total)}{speed}  {i}/{n} {name}")
            msg = msg[:max(20, _term_width() - 1)]
            pad = " " * max(0, self._last_len - len(msg))
            self.stream.write("\r" + msg + pad)
            self._last_len = len(msg)
            if i >= n:
                self.stream.write("\r" + " " * self._last_len + "\r")
            self.stream.flush()
        elif i < n:
            self.stream.write(f"[{i + 1}/{n}] {frac * 100:5.1f}%{speed} {name}\n")
            self.stream.flush()


def _hms(sec: float) -> str:
    sec = int(sec + 0.5)
    return f"{sec // 3600}:{sec % 3600 // 60:02d}:{sec % 60:02d}" if sec >= 3600 else f"{sec // 60}:{sec % 60:02d}"


def _term_width() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 100
