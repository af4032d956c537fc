"""Reading and writing safetensors files with NumPy (no dependency on the `safetensors` package).

File layout (https://github.com/huggingface/safetensors, "Format"):

    8 bytes     N, unsigned little-endian 64-bit: size of the header
    N bytes     JSON object, UTF-8: {"name": {"dtype": "F32", "shape": [2, 3],
                "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}
    rest        the tensor bytes; offsets are relative to the start of this region

Reading. Only a regular file is opened (a FIFO, device or socket is refused before it is
opened for reading, so it cannot block). Every header is validated before any tensor is
returned: at most MAX_HEADER_BYTES bytes and MAX_TENSORS tensors, JSON nested at most
MAX_HEADER_DEPTH levels (checked before parsing, in linear time), no key given twice, known
dtype, non-negative integer shape, offsets inside the data region, byte size equal to
prod(shape) * itemsize, no two tensors overlapping. Tensors are read with pread (no memory
mapping): a file truncated or resized while it is read gives a SafetensorsError, never a
SIGBUS.

Writing goes to a temporary file created exclusively (O_EXCL, a random name) beside the destination, which
replaces the destination (os.replace) only once it is complete: a failure never leaves a partial
output behind. Only a regular file (or a name that does not exist yet) is ever replaced; a
replaced file keeps its permission bits, a new one gets 0666 & ~umask. Temporary files still
being written are listed by live_temporary_files() and removed by remove_temporary_files() (the
command line calls it from its SIGTERM / SIGHUP / SIGINT handlers).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import struct
import threading
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import ml_dtypes
import numpy as np

__all__ = [
    "SafetensorsError",
    "SafetensorsFile",
    "MAX_HEADER_BYTES",
    "MAX_TENSORS",
    "MAX_HEADER_DEPTH",
    "check_input_path",
    "check_output_path",
    "remove_temporary_files",
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

# Limits of what the reader accepts. The header size limit is the reference implementation's
# (100,000,000 bytes); the tensor count keeps the time and memory of reading a header (and of
# processing its tensors) to seconds: 2^18 tensors is far more than any real checkpoint file holds.
# A valid header nests 3 levels deep (header, entry, shape list).
MAX_HEADER_BYTES = 100_000_000
MAX_TENSORS = 1 << 18
MAX_HEADER_DEPTH = 16
_WRITE_CHUNK = 64 * 1024 * 1024
_READ_CHUNK = 64 * 1024 * 1024


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file, a path that cannot be read or written as one,
    or a tensor that cannot be stored."""


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


# ---------------------------------------------------------------------------------------------
# Paths: only regular files are read, only regular files (or new names) are replaced


def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO', ... for an st_mode."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def check_input_path(path: Union[str, os.PathLike], what: str = "input") -> os.stat_result:
    """os.stat of `path` (symbolic links followed) after checking that it is a regular file.

    Raises FileNotFoundError / PermissionError as os.stat does, SafetensorsError for anything that
    is not a regular file (a FIFO is never opened, so it cannot block)."""
    p = os.fspath(path)
    s = os.stat(p)
    if not stat.S_ISREG(s.st_mode):
        raise SafetensorsError(f"{p}: the {what} is {file_kind(s.st_mode)}, not a regular file")
    return s


def _open_regular(path: str, what: str) -> int:
    """A read-only descriptor of the regular file `path`. O_NONBLOCK: should the path be swapped
    for a FIFO between the check and the open, the open does not wait for a writer, and the
    fstat check below refuses it."""
    check_input_path(path, what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        s = os.fstat(fd)
        if not stat.S_ISREG(s.st_mode):
            raise SafetensorsError(f"{path}: the {what} is {file_kind(s.st_mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_output_path(path: Union[str, os.PathLike], what: str = "output", overwrite: bool = True) -> str:
    """Checks that `path` can receive a new file; returns its resolved path (symbolic links
    followed: the file a link points at is the one replaced, the link stays).

    Refused (SafetensorsError naming the path): an empty path, a parent that does not exist or is
    not a directory, an existing target that is not a regular file (directory, FIFO, socket,
    device node), an existing regular file when overwrite is False."""
    p = os.fspath(path)
    if not p:
        raise SafetensorsError(f"the {what} path is empty")
    real = os.path.realpath(p)
    parent = os.path.dirname(real) or "."
    try:
        ps = os.stat(parent)
    except FileNotFoundError:
        raise SafetensorsError(f"{p}: the {what} directory {parent} does not exist") from None
    except NotADirectoryError:
        raise SafetensorsError(f"{p}: a component of the {what} directory {parent} is not a directory") from None
    if not stat.S_ISDIR(ps.st_mode):
        raise SafetensorsError(f"{p}: the {what} directory {parent} is {file_kind(ps.st_mode)}, "
                               f"not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SafetensorsError(f"{p}: the {what} directory {parent} is not writable")
    try:
        ts = os.stat(real)
    except FileNotFoundError:
        return real
    if not stat.S_ISREG(ts.st_mode):
        raise SafetensorsError(f"{p}: the {what} exists and is {file_kind(ts.st_mode)}; only a regular "
                               f"file is replaced")
    if not overwrite:
        raise SafetensorsError(f"{p}: the {what} already exists (--force replaces it)")
    return real


def same_file(a: Union[str, os.PathLike], b: Union[str, os.PathLike]) -> bool:
    """Whether two paths name the same file: os.path.samefile when both exist (hard and symbolic
    links included), else the same resolved path."""
    a, b = os.fspath(a), os.fspath(b)
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


# Temporary files being written (path -> None), for remove_temporary_files(). A name is recorded
# before the file is created, so a signal handler that runs at any point finds every temporary
# file this process may have created. Re-entrant lock: a signal handler may call
# remove_temporary_files() while the same thread holds it.
_LIVE_TEMPS: Dict[str, None] = {}
_LIVE_LOCK = threading.RLock()


def live_temporary_files() -> List[str]:
    """Temporary files this process is writing now (removed on completion or failure)."""
    with _LIVE_LOCK:
        return list(_LIVE_TEMPS)


def remove_temporary_files() -> None:
    """Removes every temporary file this process is writing (for signal handlers: the outputs
    they were to become are left as they were)."""
    for p in live_temporary_files():
        try:
            os.unlink(p)
        except OSError:
            pass
        with _LIVE_LOCK:
            _LIVE_TEMPS.pop(p, None)


def _forget(tmp: str) -> None:
    with _LIVE_LOCK:
        _LIVE_TEMPS.pop(tmp, None)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_TEMP_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


class AtomicFile:
    """A new file written under an exclusive temporary name beside `path`, renamed over `path` by
    commit() and removed by abort().

    The temporary file is `.NAME.<16 random hex digits>.tmp` in the target's directory, created
    with O_CREAT | O_EXCL | O_NOFOLLOW (mode 0600): never a planted file or symbolic link. path is
    checked first (check_output_path): its directory must exist and an existing target must be a
    regular file (and is refused when overwrite is False). A replaced file keeps its permission
    bits; a new one gets 0666 & ~umask.
    """

    def __init__(self, path: Union[str, os.PathLike], what: str = "output", overwrite: bool = True):
        self.path = os.fspath(path)
        self.what = what
        self.overwrite = overwrite
        self.target = check_output_path(self.path, what, overwrite)
        self._tmp: Optional[str] = None
        self._fd: Optional[int] = None
        directory, base = os.path.split(self.target)
        for _ in range(100):
            tmp = os.path.join(directory, f".{base}.{secrets.token_hex(8)}.tmp")
            with _LIVE_LOCK:
                _LIVE_TEMPS[tmp] = None
            self._tmp = tmp
            try:
                self._fd = os.open(tmp, _TEMP_FLAGS, 0o600)
                return
            except FileExistsError:
                _forget(tmp)
                self._tmp = None
            except BaseException:
                _forget(tmp)
                self._tmp = None
                raise
        raise SafetensorsError(f"{self.path}: could not create a temporary file beside the {what}")

    @property
    def temp_path(self) -> Optional[str]:
        return self._tmp

    def fileno(self) -> int:
        if self._fd is None:
            raise SafetensorsError(f"{self.path}: the temporary file is closed")
        return self._fd

    def write(self, data) -> None:
        """Writes all of `data` (bytes-like)."""
        mv = memoryview(data).cast("B")
        fd = self.fileno()
        while len(mv):
            n = os.write(fd, mv)
            mv = mv[n:]

    def commit(self) -> None:
        """Flushes the data to disk and renames the temporary file over the target."""
        if self._tmp is None or self._fd is None:
            raise SafetensorsError(f"{self.path}: nothing to commit (already committed or aborted)")
        try:
            os.fsync(self._fd)
            try:
                old = os.stat(self.target)
            except FileNotFoundError:
                old = None
            if old is not None and not stat.S_ISREG(old.st_mode):
                raise SafetensorsError(f"{self.path}: the {self.what} became {file_kind(old.st_mode)} while it "
                                       f"was written; not replaced")
            if old is not None and not self.overwrite:
                raise SafetensorsError(f"{self.path}: the {self.what} appeared while it was written; not replaced "
                                       f"(--force replaces it)")
            mode = stat.S_IMODE(old.st_mode) & 0o777 if old is not None else 0o666 & ~_umask()
            if hasattr(os, "fchmod"):
                os.fchmod(self._fd, mode)
            else:
                os.chmod(self._tmp, mode)
            fd, self._fd = self._fd, None
            os.close(fd)
            if self.overwrite:
                os.replace(self._tmp, self.target)
            else:
                self._link_no_clobber()
            tmp, self._tmp = self._tmp, None
            _forget(tmp)
        except BaseException:
            self.abort()
            raise

    def _link_no_clobber(self) -> None:
        # link(2) fails with EEXIST instead of replacing a file created meanwhile
        try:
            os.link(self._tmp, self.target)
        except FileExistsError:
            raise SafetensorsError(f"{self.path}: the {self.what} appeared while it was written; not "
                                   f"replaced (--force replaces it)") from None
        except OSError:  # no hard links on this file system
            if os.path.lexists(self.target):
                raise SafetensorsError(f"{self.path}: the {self.what} appeared while it was written; not "
                                       f"replaced (--force replaces it)") from None
            os.replace(self._tmp, self.target)
            return
        os.unlink(self._tmp)

    def abort(self) -> None:
        """Removes the temporary file (the target is left as it was)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            _forget(tmp)

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def write_text_atomic(path: Union[str, os.PathLike], text: str, what: str = "output",
                      overwrite: bool = True) -> None:
    """Writes `text` (UTF-8) to `path` through an AtomicFile."""
    with AtomicFile(path, what, overwrite) as af:
        af.write(text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Reading


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
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

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


# ---------------------------------------------------------------------------------------------
# Writing


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
