"""`lowbit convert-gpt-oss`: the gpt-oss MXFP4 experts (*_blocks / *_scales) rewritten in the
lowbit checkpoint layout, verified bit for bit against an independent NumPy decode."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import lowbit

from .. import safetensors_io as st
from .._formats import Format
from .io import TensorReport, _check_output
from .schema import LAYOUTS, METADATA_KEY, METADATA_VERSION, PRODUCER, CheckpointError, make_quantized, metadata_entry


# E2M1 code -> value (sign bit 3, then the exponent/mantissa of section 1 of the format notes)
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def decode_gpt_oss(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Independent NumPy decode of gpt-oss MXFP4: blocks uint8 [..., G, 16] (element 2i in the low
    nibble), scales uint8 [..., G] (2^(s-127), 0xFF = NaN) -> float32 [..., G*32]."""
    b = np.asarray(blocks, dtype=np.uint8)
    s = np.asarray(scales, dtype=np.uint8)
    vals = np.empty(b.shape[:-1] + (32,), dtype=np.float32)
    vals[..., 0::2] = _E2M1[b & 0x0F]
    vals[..., 1::2] = _E2M1[b >> 4]
    mult = np.ldexp(np.float32(1.0), np.minimum(s, 254).astype(np.int32) - 127).astype(np.float32)
    mult[s == 0xFF] = np.nan
    with np.errstate(over="ignore"):  # 6 * 2^127 is +-inf in float32, as in any fp32 decode
        vals *= mult[..., None]
    return vals.reshape(b.shape[:-2] + (b.shape[-2] * 32,))


def _reference_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """decode_gpt_oss as the package exports it (lowbit.checkpoint.decode_gpt_oss), looked up at
    call time so that the verification uses the public name."""
    return sys.modules[__package__].decode_gpt_oss(blocks, scales)


def _same_bits(a: np.ndarray, b: np.ndarray) -> int:
    """Number of elements whose float32 bits differ (NaN equals NaN)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return max(a.size, b.size)
    diff = a.view(np.uint32) != b.view(np.uint32)
    diff &= ~(np.isnan(a) & np.isnan(b))
    return int(np.count_nonzero(diff))


def find_gpt_oss_pairs(f: st.SafetensorsFile) -> Tuple[Dict[str, Tuple[str, str]], Dict[str, str]]:
    """{base: (blocks name, scales name)} of the MXFP4 expert tensors, and {name: why not} of
    `*blocks` tensors that do not form a valid pair."""
    pairs: Dict[str, Tuple[str, str]] = {}
    bad: Dict[str, str] = {}
    for n in f.names():
        for sep in ("_", "."):
            if not n.endswith(sep + "blocks"):
                continue
            base = n[: -len(sep + "blocks")]
            sn = base + sep + "scales"
            if sn not in f:
                bad[n] = f"no matching {sn}"
                break
            bi, si = f.info(n), f.info(sn)
            if bi.dtype != "U8" or si.dtype != "U8":
                bad[n] = f"dtypes {bi.dtype}/{si.dtype}, expected U8/U8"
            elif len(bi.shape) != 4 or bi.shape[-1] != 16:
                bad[n] = f"shape {list(bi.shape)}, expected (experts, rows, K/32, 16)"
            elif tuple(si.shape) != tuple(bi.shape[:3]):
                bad[n] = f"scales shape {list(si.shape)} does not match blocks {list(bi.shape)}"
            else:
                pairs[base] = (n, sn)
            break
    return pairs, bad


def convert_gpt_oss(src: str, dst: str, layout: str = "row_major", verify: bool = True,
                    progress: Optional[Callable[[int, int, int, int, str], None]] = None,
                    overwrite: bool = True) -> Tuple[List[TensorReport], Dict[str, Any]]:
    """Converts the gpt-oss MXFP4 experts of `src` into `dst`; overwrite=False refuses an
    existing `dst`."""
    if layout not in LAYOUTS:
        raise CheckpointError(f"unknown scale layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    with st.SafetensorsFile(src) as f:
        return _convert_gpt_oss(f, src, dst, layout, verify, progress, overwrite)


def _convert_gpt_oss(f, src, dst, layout, verify, progress, overwrite):
    _check_output(src, dst, overwrite)
    pairs, bad = find_gpt_oss_pairs(f)
    if not pairs:
        why = "; ".join(f"{n}: {r}" for n, r in bad.items())
        raise CheckpointError(f"{src}: no gpt-oss MXFP4 tensors (*_blocks uint8 [E, rows, K/32, 16] with "
                              f"*_scales uint8 [E, rows, K/32]) found" + (f" ({why})" if why else ""))
    fmt = Format("mxfp4")
    by_name = {b: base for base, (b, s) in pairs.items()}
    scale_names = {s for (b, s) in pairs.values()}
    for base in pairs:
        for o in (base + ".qdata", base + ".scale"):
            if o in f:
                raise CheckpointError(f"{src}: output tensor name {o!r} already exists in the input")

    # header first (streamed output): every output's name, dtype and shape
    names = f.names()
    specs: List[Tuple[str, str, Tuple[int, ...]]] = []
    entries: Dict[str, Any] = {}
    for n in names:
        if n in scale_names:
            continue
        info = f.info(n)
        if n not in by_name:
            specs.append((n, info.dtype, info.shape))
            continue
        base = by_name[n]
        E, R, G, _ = info.shape
        K = G * 32
        sshape = (E, R, G) if layout == "row_major" else \
            (E,) + tuple(int(d) for d in lowbit.scale_shape(fmt, layout, 1, R, K))[1:]
        qn, sn = base + ".qdata", base + ".scale"
        specs += [(qn, "U8", (E, R, K // 2)), (sn, "U8", sshape)]
        entries[base] = metadata_entry(fmt, layout, (E, R, K), "BF16",
                                       {"qdata": qn, "scale": sn, "zero": None, "global_amax": None},
                                       rounding=None, source="gpt-oss", source_tensors=[n, pairs[base][1]])
    meta = dict(f.metadata)
    meta[METADATA_KEY] = json.dumps({"version": METADATA_VERSION, "producer": PRODUCER,
                                     "tensors": entries}, separators=(",", ":"))
    with st.SafetensorsWriter(dst, specs, meta, overwrite=overwrite) as writer:
        reports = _convert_gpt_oss_tensors(f, writer, pairs, by_name, scale_names, bad, layout, verify, progress)
    summary = {"input": src, "output": dst, "converted": len(entries), "layout": layout,
               "copied": sum(r.action == "copied" for r in reports),
               "bytes_before": sum(r.bytes_before for r in reports),
               "bytes_after": sum(r.bytes_after for r in reports), "file_bytes_out": writer.size,
               "verified": verify, "seconds": sum(r.seconds for r in reports)}
    return reports, summary


def _convert_gpt_oss_tensors(f, writer, pairs, by_name, scale_names, bad, layout, verify, progress):
    fmt = Format("mxfp4")
    reports: List[TensorReport] = []
    names = f.names()
    total, done = f.total_bytes(), 0
    for i, n in enumerate(names):
        if progress:
            progress(i, len(names), done, total, n)
        info = f.info(n)
        done += info.nbytes
        if n in scale_names:
            continue
        if n not in by_name:
            t0 = time.perf_counter()
            writer.write(n, f.get(n))
            reports.append(TensorReport(n, info.shape, info.dtype, "copied",
                                        reason=bad.get(n, "not an MXFP4 expert tensor"),
                                        bytes_before=info.nbytes, bytes_after=info.nbytes, outputs=[n],
                                        seconds=time.perf_counter() - t0))
            continue
        t0 = time.perf_counter()
        base = by_name[n]
        sname = pairs[base][1]
        blocks, scales = f.get(n), f.get(sname)
        E, R, G, _ = blocks.shape
        K = G * 32
        qdata = np.ascontiguousarray(blocks).reshape(E, R, K // 2)  # already low-nibble first
        if layout == "row_major":
            sc = np.array(scales, dtype=np.uint8, copy=True)
        else:
            shp = [int(d) for d in lowbit.scale_shape(fmt, layout, 1, R, K)][1:]
            sc = np.empty([E] + shp, dtype=np.uint8)
            for e in range(E):
                conv = lowbit.convert_scale_layout(np.array(scales[e], copy=True), R, G, src="row_major", dst=layout)
                sc[e] = np.asarray(conv).view(np.uint8).reshape(shp)
        mismatched = 0
        nan_blocks = int(np.count_nonzero(scales == 0xFF))
        maxabs = 0.0
        if verify:
            for e in range(E):
                ref = _reference_decode(blocks[e], scales[e])
                qt = make_quantized(np.array(qdata[e], copy=True), np.array(sc[e], copy=True), None, None, fmt,
                                    layout, (R, K))
                got = np.asarray(lowbit.dequantize(qt, out_dtype="float32"))
                mismatched += _same_bits(ref, got)
                finite = ref[np.isfinite(ref)]
                if finite.size:
                    maxabs = max(maxabs, float(np.max(np.abs(finite))))
            if mismatched:
                raise CheckpointError(f"{n}: {mismatched} of {E * R * K} decoded values differ between the "
                                      f"gpt-oss blocks and the converted tensors; nothing written")
        qn, sn = base + ".qdata", base + ".scale"
        writer.write(qn, qdata)
        writer.write(sn, sc)
        before = info.nbytes + f.info(sname).nbytes
        reports.append(TensorReport(base, (E, R, K), "U8", "converted", fmt="mxfp4", bytes_before=before,
                                    bytes_after=qdata.nbytes + sc.nbytes, max_abs=maxabs if verify else None,
                                    outputs=[qn, sn], seconds=time.perf_counter() - t0,
                                    extra={"experts": E, "rows": R, "K": K, "layout": layout,
                                           "verified": "bit-exact" if verify else "skipped",
                                           "nan_blocks": nan_blocks}))
    if progress:
        progress(len(names), len(names), total, total, "")
    return reports
