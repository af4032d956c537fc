"""`lowbit quantize` into a model directory in the compressed-tensors, gpt-oss or ModelOpt
convention: reads a single file, an index or a model directory, writes sharded safetensors, their
index and config.json with "quantization_config" (ModelOpt: also hf_quant_config.json;
docs/checkpoints.md)."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import lowbit

from .. import safetensors_io as st
from .._formats import Format
from . import compressed_tensors as ct
from . import gpt_oss_convention as go
from . import modelopt_convention as mo
from .device import Backend, make_backend
from .io import TensorReport, _conform
from .model_dir import (
    CONFIG_NAME,
    INDEX_NAME,
    ModelSource,
    StagingDir,
    copy_other_files,
    plan_shards,
    shard_names,
)
from .quantize import Selection, measure, quantize_measured, skip_reason
from .schema import METADATA_KEY, PRODUCER, CheckpointError, QuantConfig


def quantize_model(src: str, dst: str, cfg: QuantConfig, sel: Selection, device: str = "auto",
                   progress: Optional[Callable[[int, int, int, int, str], None]] = None,
                   overwrite: bool = False, warn: Optional[Callable[[str], None]] = None,
                   max_shard_bytes: int = 5 * 1024 ** 3, convention: str = ct.CONVENTION
                   ) -> Tuple[List[TensorReport], Dict[str, Any]]:
    """Quantizes the Linear weights of `src` into the model directory `dst` (convention
    "compressed-tensors"; "gpt-oss": the MXFP4 experts of a gpt-oss model). Returns the per-tensor
    reports and a summary; nothing is left at `dst` unless every tensor succeeded. "modelopt":
    NVFP4 weights in ModelOpt's naming with hf_quant_config.json."""
    if convention == go.CONVENTION:
        go.check_config(cfg)
    elif convention == ct.CONVENTION:
        ct.check_config(cfg)
    elif convention == mo.CONVENTION:
        mo.check_config(cfg)
    else:
        raise CheckpointError(f"--convention {convention}: a model directory is written as compressed-tensors, "
                              f"gpt-oss or modelopt")
    with ModelSource(src) as m:
        return _quantize_model(m, src, dst, cfg, sel, device, progress, overwrite, warn, max_shard_bytes,
                               convention)


def _plan(m: ModelSource, cfg: QuantConfig, sel: Selection, convention: str):
    plan: List[Tuple[str, Optional[str]]] = []
    for n in m.names():
        info = m.info(n)
        if convention == go.CONVENTION:
            why = _selected(n, sel) or go.skip_reason(n, info.dtype, info.shape)
            plan.append((n, why))
            continue
        why = skip_reason(info, cfg, sel)
        if why is None and ct.module_of(n) is None:
            why = "not a .weight tensor (compressed-tensors quantizes module weights)"
        if why is None:
            why = ct.skip_reason(info.shape, cfg)
        plan.append((n, why))
    return plan


def _selected(n: str, sel: Selection) -> Optional[str]:
    if sel._inc and not any(p.search(n) for p in sel._inc):
        return "not matched by --include"
    for p in sel._exc:
        if p.search(n):
            return f"excluded (--exclude {p.pattern})"
    return None


def _shared_amax(m: ModelSource, plan, backend) -> Dict[str, float]:
    """NVFP4: the global amax of each quantized weight, equal across a fused group (q/k/v,
    gate/up): the largest of the group's amaxes."""
    amax: Dict[str, float] = {}
    for n, why in plan:
        if why is None:
            a = lowbit.tensor_amax(backend.put(m.get(n)))
            amax[n] = float(np.asarray(backend.get(a), np.float32).reshape(-1)[0])
    groups: Dict[str, List[str]] = {}
    for n in amax:
        key = ct.fused_group(ct.module_of(n) or "")
        if key:
            groups.setdefault(key, []).append(n)
    for members in groups.values():
        shared = max(amax[n] for n in members)
        for n in members:
            amax[n] = shared
    return amax


def _quantize_model(m, src, dst, cfg, sel, device, progress, overwrite, warn, max_shard_bytes, convention):
    if METADATA_KEY in m.metadata():
        raise CheckpointError(f"{src}: already a lowbit-quantized checkpoint (metadata key {METADATA_KEY!r})")
    if m.config and "quantization_config" in m.config:
        raise CheckpointError(f"{src}: config.json already has a quantization_config")
    if m.root and os.path.exists(os.path.join(m.root, mo.HF_QUANT_CONFIG)):
        raise CheckpointError(f"{src}: already a quantized checkpoint ({mo.HF_QUANT_CONFIG})")
    backend = make_backend(device)
    fmt = Format(cfg.spec.api, **cfg.format_kwargs())
    plan = _plan(m, cfg, sel, convention)
    gpt_oss = convention == go.CONVENTION
    modelopt = convention == mo.CONVENTION

    specs: List[Tuple[str, str, Tuple[int, ...]]] = []
    owner: Dict[str, str] = {}
    for n, why in plan:
        info = m.info(n)
        if why:
            outs = [(n, info.dtype, info.shape)]
        elif gpt_oss:
            outs = go.output_specs(n, info.shape)
        elif modelopt:
            outs = mo.output_specs(ct.module_of(n), info.shape)
        else:
            outs = ct.output_specs(ct.module_of(n), cfg, info.shape)
        for o in outs:
            if o[0] in owner:
                raise CheckpointError(f"output tensor name {o[0]!r} of {n!r} clashes with the one of {owner[o[0]]!r}")
            owner[o[0]] = n
            specs.append(o)
    quantized = [n for n, why in plan if why is None]
    # Linear-like weights left in float: compressed-tensors must be told to ignore their modules
    ignore = sorted({ct.module_of(n) for n, why in plan if why is not None and ct.module_of(n)
                     and len(m.info(n).shape) == 2})
    t_start = time.perf_counter()
    amax = _shared_amax(m, plan, backend) if cfg.spec.api == "nvfp4" else {}

    shards = plan_shards(specs, max_shard_bytes)
    names = shard_names(len(shards))
    by_source: Dict[str, List[str]] = {}
    for name, _, _ in specs:
        by_source.setdefault(owner[name], []).append(name)
    reports: List[TensorReport] = []
    total, done = m.total_bytes(), 0
    cache: Dict[str, np.ndarray] = {}  # output tensors produced before their shard is written
    stage = StagingDir(dst, overwrite)
    weight_map: Dict[str, str] = {}
    out_bytes = 0
    try:
        src_order = [n for n, _ in plan]
        why_of = dict(plan)
        next_src = 0
        for si, idxs in enumerate(shards):
            shard_specs = [specs[i] for i in idxs]
            dtypes = {name: st.dtype_to_numpy(dt) for name, dt, _ in shard_specs}
            shapes = {name: tuple(shape) for name, _, shape in shard_specs}
            path = stage.join(names[si])
            with st.SafetensorsWriter(path, shard_specs, {"format": "pt"}, overwrite=False) as writer:
                for oname, _, _ in shard_specs:
                    while oname not in cache:
                        n = src_order[next_src]
                        next_src += 1
                        if progress:
                            progress(next_src - 1, len(src_order), done, total, n)
                        one = _one_gpt_oss if gpt_oss else _one
                        rep, outs = one(m, n, why_of[n], cfg, fmt, backend, amax.get(n), warn, convention)
                        reports.append(rep)
                        done += rep.bytes_before
                        cache.update(outs)
                    a = _conform(cache.pop(oname), dtypes[oname])
                    writer.write(oname, a.reshape(()) if shapes[oname] == () else a)  # ModelOpt's scalars
                    weight_map[oname] = names[si]
            out_bytes += writer.size
        if progress:
            progress(len(src_order), len(src_order), total, total, "")
        index = {"metadata": {"total_size": sum(_nbytes(s) for s in specs)}, "weight_map": weight_map}
        if len(shards) > 1:
            st.write_text_atomic(stage.join(INDEX_NAME), json.dumps(index, indent=2) + "\n", overwrite=False)
        copied = copy_other_files(m.root, stage, m.files)
        config = dict(m.config or {})
        if gpt_oss:
            config["quantization_config"] = go.quantization_config()
        elif modelopt:
            config["quantization_config"] = mo.quantization_config(ignore)
            st.write_text_atomic(stage.join(mo.HF_QUANT_CONFIG), json.dumps(mo.hf_quant_config(ignore), indent=2)
                                 + "\n", overwrite=False)
        else:
            config["quantization_config"] = ct.quantization_config(cfg, ignore, PRODUCER)
        st.write_text_atomic(stage.join(CONFIG_NAME), json.dumps(config, indent=2) + "\n", overwrite=False)
        stage.commit()
    except BaseException:
        stage.abort()
        raise
    summary = {"input": src, "output": dst, "device": backend.name, "format": cfg.describe(),
               "convention": convention,
               "scheme": "gpt-oss mxfp4" if gpt_oss else ("modelopt NVFP4" if modelopt else ct.CT_FORMATS[cfg.spec.api]),
               "tensors": len(plan), "quantized": len(quantized), "copied": len(plan) - len(quantized),
               "shards": len(shards), "ignore": ignore, "copied_files": copied,
               "bytes_before": sum(r.bytes_before for r in reports),
               "bytes_after": sum(r.bytes_after for r in reports),
               "file_bytes_in": m.file_bytes(), "file_bytes_out": out_bytes,
               "seconds": time.perf_counter() - t_start}
    return reports, summary


def _nbytes(spec) -> int:
    _, dtype, shape = spec
    n = st.dtype_to_numpy(dtype).itemsize
    for d in shape:
        n *= int(d)
    return n


def _one(m: ModelSource, n: str, why: Optional[str], cfg: QuantConfig, fmt, backend, gamax, warn,
         convention: str = ct.CONVENTION):
    info = m.info(n)
    if why is not None:
        return (TensorReport(n, info.shape, info.dtype, "copied", reason=why, bytes_before=info.nbytes,
                             bytes_after=info.nbytes, outputs=[n]), {n: m.get(n)})
    t0 = time.perf_counter()
    x = backend.put(m.get(n))
    kwargs: Dict[str, Any] = {}
    if gamax is not None:
        kwargs["global_amax"] = float(gamax)
    qt, _, ms = quantize_measured(backend, x, fmt, "row_major", kwargs, n, info.shape, warn)
    if convention == mo.CONVENTION:
        outs = mo.convert(ct.module_of(n), qt, backend.get)
    else:
        outs = ct.convert(ct.module_of(n), cfg, qt, info.shape, backend.get)
    after = sum(a.nbytes for a in outs.values())
    rep = TensorReport(n, info.shape, info.dtype, "quantized", fmt=cfg.spec.cli, bytes_before=info.nbytes,
                       bytes_after=after, outputs=list(outs), seconds=time.perf_counter() - t0,
                       **ms.report_fields())
    return rep, outs


def _one_gpt_oss(m: ModelSource, n: str, why: Optional[str], cfg: QuantConfig, fmt, backend, gamax, warn,
                 convention: str = go.CONVENTION):
    """One tensor of the gpt-oss convention: experts quantized one by one on the CPU reference."""
    info = m.info(n)
    if why is not None:
        return _one(m, n, why, cfg, fmt, backend, None, warn)
    t0 = time.perf_counter()
    x = np.array(m.get(n), copy=True)
    try:
        outs, dec = go.quantize_experts(n, x, fmt, lowbit.quantize, lowbit.dequantize, np.asarray)
    except Exception as e:
        raise CheckpointError(f"tensor {n!r} {list(info.shape)}: {e}") from e
    xt = np.ascontiguousarray(np.transpose(x, (0, 2, 1)))
    ms = measure(Backend(), xt, dec, x, n, info.shape, warn)
    rep = TensorReport(n, info.shape, info.dtype, "quantized", fmt=cfg.spec.cli, bytes_before=info.nbytes,
                       bytes_after=sum(a.nbytes for a in outs.values()), outputs=list(outs),
                       seconds=time.perf_counter() - t0, **ms.report_fields())
    return rep, outs
