"""Reading safetensors files: SafetensorsFile (pread, no memory mapping) and load()."""

from __future__ import annotations

import os
import struct
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from .common import DTYPES, MAX_HEADER_BYTES, _READ_CHUNK, SafetensorsError
from .files import _open_regular, close_quietly
from .header import TensorInfo, _parse_header


def _pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Reads up to len(buf) bytes at `offset` into buf; returns the count (0 at the end of file)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    data = os.pread(fd, len(buf), offset)
    buf[:len(data)] = data
    return len(data)


class SafetensorsFile:
    """A safetensors file opened for reading.

        f = SafetensorsFile("model.safetensors")
        f.names(); f.info("w").shape; w = f.get("w"); f.metadata

    The file stays open until close() (or the end of a `with` block). Tensors are read on demand
    with pread, not memory-mapped: if the file changes size, or ends early, while it is read,
    get() raises SafetensorsError.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.fspath(path)
        where = self.path
        self._fd: Optional[int] = None
        fd = _open_regular(self.path, "input")  # FileNotFoundError / PermissionError propagate
        self._fd = fd
        try:
            self.file_size = size = os.fstat(fd).st_size
            if size < 8:
                raise SafetensorsError(f"{where}: not a safetensors file ({size} bytes, too short for a header)")
            (n,) = struct.unpack("<Q", self._read_exact(0, 8, "the header length"))
            if n < 2 or n > size - 8:
                raise SafetensorsError(f"{where}: not a safetensors file (header length {n} does not fit "
                                       f"a file of {size} bytes)")
            if n > MAX_HEADER_BYTES:
                raise SafetensorsError(f"{where}: header of {n} bytes; lowbit reads headers of at most "
                                       f"{MAX_HEADER_BYTES} bytes (the safetensors limit)")
            raw = self._read_exact(8, n, "the header")
            if not raw.lstrip().startswith(b"{"):
                raise SafetensorsError(f"{where}: not a safetensors file (header does not start with '{{')")
            self.header_size = n
            self.data_start = 8 + n
            self.data_size = size - self.data_start
            self._tensors, self.metadata = _parse_header(raw, self.data_size, where)
            self._names: Optional[List[str]] = None
        except BaseException:
            self.close()
            raise

    def _check_size(self) -> None:
        if self._fd is None:
            raise SafetensorsError(f"{self.path}: the file is closed")
        size = os.fstat(self._fd).st_size
        if size != self.file_size:
            raise SafetensorsError(f"{self.path}: the file changed size while it was read ({self.file_size} -> "
                                   f"{size} bytes)")

    def _read_into(self, buf: np.ndarray, offset: int, what: str) -> None:
        self._check_size()
        mv = memoryview(buf).cast("B")
        pos = 0
        while pos < len(mv):
            got = _pread_into(self._fd, mv[pos:pos + _READ_CHUNK], offset + pos)
            if got == 0:
                raise SafetensorsError(f"{self.path}: the file ended {pos} bytes into {what} ({len(mv)} bytes "
                                       f"expected at offset {offset}); was it truncated while it was read?")
            pos += got
        self._check_size()

    def _read_exact(self, offset: int, n: int, what: str) -> bytes:
        buf = bytearray(n)
        self._read_into(buf, offset, what)
        return bytes(buf)

    def names(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        if self._names is None:
            self._names = [i.name for i in sorted(self._tensors.values(), key=lambda i: (i.begin, i.name))]
        return list(self._names)

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
        """The tensor, read from the file into a new read-only NumPy array."""
        info = self.info(name)
        dt = DTYPES[info.dtype]
        if info.nbytes == 0:
            arr = np.zeros(info.shape, dt)
        else:
            buf = np.empty(info.nbytes, np.uint8)
            self._read_into(buf, self.data_start + info.begin, f"tensor {name!r}")
            arr = buf.view(dt).reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._tensors.values())

    def close(self) -> None:
        fd, self._fd = self._fd, None
        close_quietly(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: Union[str, os.PathLike]) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """All tensors (read into memory) and the metadata of a file."""
    with SafetensorsFile(path) as f:
        return {n: f.get(n) for n in f.names()}, dict(f.metadata)
