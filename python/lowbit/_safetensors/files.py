"""Paths and atomic output for lowbit.safetensors_io: only regular files are read, only regular
files (or new names) are replaced, and an output is written under an exclusive temporary name
that replaces the destination only once complete."""

from __future__ import annotations

import os
import secrets
import stat
import threading
from typing import Dict, List, Optional, Union

from .common import SafetensorsError


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



def close_quietly(fd: Optional[int]) -> None:
    """Closes a file descriptor (None: nothing to close); an error of the close is ignored."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass

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
        close_quietly(fd)
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
