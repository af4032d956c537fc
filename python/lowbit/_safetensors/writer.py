"""Writing safetensors files: SafetensorsWriter (streamed, atomic) and save()."""

from __future__ import annotations

import json
import os
import struct
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .common import _WRITE_CHUNK, SafetensorsError, dtype_to_numpy, numpy_to_dtype
from .files import AtomicFile


def _as_bytes(arr: np.ndarray) -> np.ndarray:
    dt = arr.dtype
    if dt.byteorder == ">" or (dt.byteorder == "=" and np.little_endian is False):
        arr = arr.astype(dt.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8)


class SafetensorsWriter:
    """Streams tensors into a new safetensors file whose header is known in advance.

        specs = [("w.qdata", "U8", (4096, 2048)), ...]       # every tensor, in file order
        with SafetensorsWriter("out.safetensors", specs, {"k": "v"}) as w:
            for name, arr in produce():                      # same order as specs
                w.write(name, arr)
        # complete: renamed over out.safetensors; on any exception nothing is left behind

    Memory stays at one tensor whatever the size of the file. The data goes to an exclusive
    temporary file beside `path` (AtomicFile) that replaces `path` only when every tensor was
    written. `path` must be a regular file or a new name in an existing directory; with
    overwrite=False an existing file is refused.
    """

    def __init__(self, path: Union[str, os.PathLike], specs: Sequence[Tuple[str, str, Sequence[int]]],
                 metadata: Optional[Mapping[str, str]] = None, overwrite: bool = True, what: str = "output"):
        self.path = os.fspath(path)
        header: Dict[str, object] = {}
        if metadata:
            meta = {}
            for k, v in metadata.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise SafetensorsError(f"metadata must map strings to strings (key {k!r})")
                meta[k] = v
            header["__metadata__"] = meta
        self._specs: List[Tuple[str, np.dtype, Tuple[int, ...]]] = []
        offset = 0
        for name, dtype, shape in specs:
            if not isinstance(name, str) or not name or name == "__metadata__":
                raise SafetensorsError(f"invalid tensor name {name!r}")
            if name in header:
                raise SafetensorsError(f"tensor name {name!r} used twice")
            dt = dtype_to_numpy(dtype)
            shape = tuple(int(d) for d in shape)
            if any(d < 0 for d in shape):
                raise SafetensorsError(f"tensor {name!r}: negative dimension in {list(shape)}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize if shape else dt.itemsize
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            self._specs.append((name, dt, shape))
        raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # data region 8-byte aligned, as the reference writer does
        self.size = 8 + len(raw) + offset
        self._next = 0
        self._file = AtomicFile(self.path, what, overwrite)
        try:
            self._file.write(struct.pack("<Q", len(raw)) + raw)
        except BaseException:
            self.abort()
            raise

    @property
    def _tmp(self) -> Optional[str]:
        return self._file.temp_path

    def write(self, name: str, arr) -> None:
        if self._next >= len(self._specs):
            raise SafetensorsError(f"tensor {name!r} is not in the header (all tensors already written)")
        want, dt, shape = self._specs[self._next]
        arr = np.asarray(arr)
        if name != want:
            raise SafetensorsError(f"tensor {name!r} written out of order (expected {want!r})")
        if arr.dtype != dt or tuple(arr.shape) != shape:
            raise SafetensorsError(f"tensor {name!r}: got {arr.dtype} {list(arr.shape)}, the header says "
                                   f"{dt} {list(shape)}")
        if arr.size:
            flat = _as_bytes(arr)
            for i in range(0, flat.size, _WRITE_CHUNK):
                self._file.write(flat[i:i + _WRITE_CHUNK])
        self._next += 1

    def commit(self) -> int:
        """Renames the complete file over `path`; returns its size."""
        if self._next != len(self._specs):
            missing = [n for n, _, _ in self._specs[self._next:]]
            self.abort()
            raise SafetensorsError(f"{len(missing)} tensors were never written (first: {missing[0]!r})")
        self._file.commit()
        return self.size

    def abort(self) -> None:
        """Removes the temporary file (the destination is left as it was)."""
        self._file.abort()

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def save(path: Union[str, os.PathLike],
         tensors: Union[Mapping[str, np.ndarray], Iterable[Tuple[str, np.ndarray]]],
         metadata: Optional[Mapping[str, str]] = None, overwrite: bool = True) -> int:
    """Writes the tensors (in the given order) and metadata; returns the file size.

    The file is written next to `path` under an exclusive temporary name and renamed over `path`
    when complete; on any error the temporary file is removed and `path` is left untouched.
    `path` must be a regular file or a new name (overwrite=False: a new name only).
    """
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    arrays = [(name, np.asarray(arr)) for name, arr in items]
    specs = [(name, numpy_to_dtype(arr.dtype), arr.shape) for name, arr in arrays]
    with SafetensorsWriter(path, specs, metadata, overwrite=overwrite) as w:
        for name, arr in arrays:
            w.write(name, arr)
    return w.size
