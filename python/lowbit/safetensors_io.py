"""Reading and writing safetensors files with NumPy (no dependency on the `safetensors` package).

File layout (https://github.com/huggingface/safetensors, "Format"):

    8 bytes     N, unsigned little-endian 64-bit: size of the header
    N bytes     JSON object, UTF-8: {"name": {"dtype": "F32", "shape": [2, 3],
                "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}
    rest        the tensor bytes; offsets are relative to the start of this region

Reading maps the file with numpy.memmap and hands out read-only views, so a tensor is only
read from disk when it is used. Every header is validated before any tensor is returned:
known dtype, non-negative integer shape, offsets inside the data region, byte size equal to
prod(shape) * itemsize, no two tensors overlapping.

Writing goes to a temporary file in the output directory that replaces the destination
(os.replace) only once it is complete: a failure never leaves a partial output behind.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import ml_dtypes
import numpy as np

__all__ = [
    "SafetensorsError",
    "SafetensorsFile",
    "SafetensorsWriter",
    "TensorInfo",
    "DTYPES",
    "dtype_to_numpy",
    "numpy_to_dtype",
    "load",
    "save",
]

# safetensors dtype name -> NumPy dtype (little-endian)
DTYPES: Dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    DTYPES["F8_E8M0"] = np.dtype(ml_dtypes.float8_e8m0fnu)

_NUMPY_TO_DTYPE: Dict[str, str] = {}
for _name, _dt in DTYPES.items():
    _NUMPY_TO_DTYPE[_dt.name] = _name

# A header larger than this is not a header (the reference implementation uses 100 MB).
MAX_HEADER_BYTES = 100 * 1024 * 1024
_WRITE_CHUNK = 64 * 1024 * 1024


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, or a tensor that cannot be stored."""


def dtype_to_numpy(name: str) -> np.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise SafetensorsError(
            f"unsupported dtype {name!r} (supported: {', '.join(DTYPES)})") from None


def numpy_to_dtype(dtype) -> str:
    dt = np.dtype(dtype)
    name = _NUMPY_TO_DTYPE.get(dt.name)
    if name is None:
        raise SafetensorsError(f"NumPy dtype {dt} has no safetensors equivalent")
    return name


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


def _parse_header(raw: bytes, data_len: int, where: str) -> Tuple[Dict[str, TensorInfo], Dict[str, str]]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{where}: not a safetensors file (header is not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{where}: not a safetensors file (header is not a JSON object)")

    metadata: Dict[str, str] = {}
    if "__metadata__" in header:
        meta = header.pop("__metadata__")
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in meta.items()):
            raise SafetensorsError(f"{where}: __metadata__ must be an object of string values")
        metadata = meta

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


class SafetensorsFile:
    """A safetensors file opened for reading.

        f = SafetensorsFile("model.safetensors")
        f.names(); f.info("w").shape; w = f.get("w"); f.metadata
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.fspath(path)
        where = self.path
        if os.path.isdir(self.path):
            raise SafetensorsError(f"{where}: is a directory, not a safetensors file")
        with open(self.path, "rb") as fh:  # FileNotFoundError / PermissionError propagate
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise SafetensorsError(f"{where}: not a safetensors file ({size} bytes, too short for a header)")
            (n,) = struct.unpack("<Q", fh.read(8))
            if n < 2 or n > MAX_HEADER_BYTES or n > size - 8:
                raise SafetensorsError(f"{where}: not a safetensors file (header length {n} does not fit "
                                       f"a file of {size} bytes)")
            raw = fh.read(n)
        if not raw.lstrip().startswith(b"{"):
            raise SafetensorsError(f"{where}: not a safetensors file (header does not start with '{{')")
        self.header_size = n
        self.data_start = 8 + n
        self.data_size = size - self.data_start
        self._tensors, self.metadata = _parse_header(raw, self.data_size, where)
        self._map: Optional[np.memmap] = None

    def _buffer(self) -> np.ndarray:
        if self._map is None:
            if self.data_size == 0:
                self._map = np.zeros(0, np.uint8)
            else:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start,
                                      shape=(self.data_size,))
        return self._map

    def names(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        return [i.name for i in sorted(self._tensors.values(), key=lambda i: (i.begin, i.name))]

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def info(self, name: str) -> TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor named {name!r}") from None

    def get(self, name: str) -> np.ndarray:
        """A read-only NumPy view of the tensor (mapped from the file, not copied)."""
        info = self.info(name)
        raw = self._buffer()[info.begin:info.end]
        arr = raw.view(DTYPES[info.dtype]) if info.nbytes else np.zeros(0, DTYPES[info.dtype])
        arr = arr.reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._tensors.values())

    def close(self) -> None:
        if self._map is not None and isinstance(self._map, np.memmap):
            mm = getattr(self._map, "_mmap", None)
            self._map = None
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # views still alive: let the GC close it
                    pass

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: Union[str, os.PathLike]) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """All tensors (as memory-mapped views) and the metadata of a file."""
    f = SafetensorsFile(path)
    return {n: f.get(n) for n in f.names()}, dict(f.metadata)


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

    Memory stays at one tensor whatever the size of the file. The data goes to a temporary file
    in the output directory that replaces `path` (os.replace) only when every tensor was written.
    """

    def __init__(self, path: Union[str, os.PathLike], specs: Sequence[Tuple[str, str, Sequence[int]]],
                 metadata: Optional[Mapping[str, str]] = None):
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
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, self._tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(self.path) + ".",
                                         suffix=".tmp")
        try:
            self._fh = os.fdopen(fd, "wb")
            self._fh.write(struct.pack("<Q", len(raw)))
            self._fh.write(raw)
        except BaseException:
            self.abort()
            raise

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
                self._fh.write(memoryview(flat[i:i + _WRITE_CHUNK]))
        self._next += 1

    def commit(self) -> int:
        """Renames the complete file over `path`; returns its size."""
        if self._next != len(self._specs):
            missing = [n for n, _, _ in self._specs[self._next:]]
            self.abort()
            raise SafetensorsError(f"{len(missing)} tensors were never written (first: {missing[0]!r})")
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.chmod(self._tmp, 0o666 & ~_umask())
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self._tmp = None
        return self.size

    def abort(self) -> None:
        """Removes the temporary file (the destination is left as it was)."""
        fh = getattr(self, "_fh", None)
        if fh is not None and not fh.closed:
            try:
                fh.close()
            except OSError:
                pass
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def save(path: Union[str, os.PathLike],
         tensors: Union[Mapping[str, np.ndarray], Iterable[Tuple[str, np.ndarray]]],
         metadata: Optional[Mapping[str, str]] = None) -> int:
    """Writes the tensors (in the given order) and metadata; returns the file size.

    The file is written next to `path` under a temporary name and renamed over `path` when
    complete; on any error the temporary file is removed and `path` is left untouched.
    """
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    arrays = [(name, np.asarray(arr)) for name, arr in items]
    specs = [(name, numpy_to_dtype(arr.dtype), arr.shape) for name, arr in arrays]
    with SafetensorsWriter(path, specs, metadata) as w:
        for name, arr in arrays:
            w.write(name, arr)
    return w.size


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
