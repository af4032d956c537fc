"""The safetensors header: TensorInfo and the validating parser (every check runs before any
tensor is returned)."""

from __future__ import annotations

import json
from typing import Dict, Tuple

import numpy as np

from .common import DTYPES, MAX_TENSORS, MAX_HEADER_DEPTH, SafetensorsError


class TensorInfo:
    """Header entry of one tensor: dtype (safetensors name), shape, byte range in the data region."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], begin: int, end: int):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def __repr__(self) -> str:
        return f"TensorInfo({self.name!r}, {self.dtype}, {list(self.shape)})"


def _header_depth(raw: bytes) -> int:
    """Deepest nesting of [ and { outside JSON strings, in linear time and bounded memory
    (the JSON parser itself recurses once per level)."""
    # Escapes: a run of backslashes pairs up from its left end, so dropping every "\\\\" pair and
    # then every remaining '\\"' leaves exactly the quotes that open or close a string.
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    a = np.frombuffer(s, dtype=np.uint8)
    depth, deepest, in_string = 0, 0, 0
    chunk = 1 << 22
    for i in range(0, a.size, chunk):
        c = a[i:i + chunk]
        quotes = np.cumsum(c == 0x22, dtype=np.int32)
        outside = ((quotes + in_string) & 1) == 0
        step = (c == 0x7B).astype(np.int8) + (c == 0x5B) - (c == 0x7D) - (c == 0x5D)
        step[~outside] = 0
        d = np.cumsum(step, dtype=np.int32)
        if d.size:
            deepest = max(deepest, depth + int(d.max()))
            depth += int(d[-1])
            in_string = (in_string + int(quotes[-1])) & 1
    return deepest


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _parse_header(raw: bytes, data_len: int, where: str) -> Tuple[Dict[str, TensorInfo], Dict[str, str]]:
    # Bounded work before the JSON parser runs: the tensor count (every entry has a
    # "data_offsets" key, so this count bounds it from above) and the nesting depth.
    if raw.count(b'"data_offsets"') > MAX_TENSORS:
        raise SafetensorsError(f"{where}: the header lists more than {MAX_TENSORS} tensors (lowbit reads at most "
                               f"{MAX_TENSORS} tensors per file)")
    depth = _header_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        raise SafetensorsError(f"{where}: not a safetensors file (header JSON nested {depth} levels deep; "
                               f"at most {MAX_HEADER_DEPTH})")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        raise SafetensorsError(f"{where}: not a valid safetensors file (key {e.args[0]!r} appears twice in the "
                               f"header)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}: not a safetensors file (header is not valid JSON: {e})") from None
    except RecursionError:
        raise SafetensorsError(f"{where}: not a safetensors file (header JSON nested too deeply)") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: not a safetensors file (header is not a JSON object)")

    metadata: Dict[str, str] = {}
    if "__metadata__" in header:
        meta = header.pop("__metadata__")
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in meta.items()):
            raise SafetensorsError(f"{where}: __metadata__ must be an object of string values")
        metadata = meta
    if len(header) > MAX_TENSORS:
        raise SafetensorsError(f"{where}: the header lists {len(header)} tensors (lowbit reads at most "
                               f"{MAX_TENSORS} tensors per file)")

    infos: Dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise SafetensorsError(f"{where}: tensor {name!r}: header entry is not an object")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
        if missing:
            raise SafetensorsError(f"{where}: tensor {name!r}: header entry lacks {', '.join(missing)}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise SafetensorsError(f"{where}: tensor {name!r}: dtype must be a string")
        if dtype not in DTYPES:
            raise SafetensorsError(f"{where}: tensor {name!r}: unsupported dtype {dtype!r} "
                                   f"(supported: {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise SafetensorsError(f"{where}: tensor {name!r}: shape must be a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int for o in offsets)):
            raise SafetensorsError(f"{where}: tensor {name!r}: data_offsets must be [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise SafetensorsError(f"{where}: tensor {name!r}: data_offsets [{begin}, {end}] outside "
                                   f"the data region of {data_len} bytes (truncated file?)")
        numel = 1
        for d in shape:
            numel *= d
        expected = numel * DTYPES[dtype].itemsize
        if end - begin != expected:
            raise SafetensorsError(f"{where}: tensor {name!r}: {end - begin} bytes for a {dtype} tensor of "
                                   f"shape {shape} (expected {expected})")
        infos[name] = TensorInfo(name, dtype, tuple(shape), begin, end)

    ranges = sorted((i.begin, i.end, i.name) for i in infos.values() if i.end > i.begin)
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{where}: tensors {n0!r} [{b0}, {e0}) and {n1!r} [{b1}, {e1}) overlap")
    return infos, metadata
