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

The code lives in lowbit._safetensors: common (dtypes, limits, SafetensorsError), files (paths,
AtomicFile, temporary files), header (TensorInfo, header validation), reader (SafetensorsFile,
load) and writer (SafetensorsWriter, save); this module is the one to import.
"""

from __future__ import annotations

from ._safetensors.common import (_NUMPY_TO_DTYPE, _READ_CHUNK, _WRITE_CHUNK, DTYPES, MAX_HEADER_BYTES,  # noqa: F401
                                  MAX_HEADER_DEPTH, MAX_TENSORS, SafetensorsError, dtype_to_numpy, numpy_to_dtype)
from ._safetensors.files import (_LIVE_LOCK, _LIVE_TEMPS, _TEMP_FLAGS, AtomicFile, _forget, _open_regular,  # noqa: F401
                                 _umask, check_input_path, check_output_path, file_kind, live_temporary_files,
                                 remove_temporary_files, same_file, write_text_atomic)
from ._safetensors.header import TensorInfo, _DuplicateKey, _header_depth, _parse_header, _unique_keys  # noqa: F401
from ._safetensors.reader import SafetensorsFile, _pread_into, load  # noqa: F401
from ._safetensors.writer import SafetensorsWriter, _as_bytes, save  # noqa: F401

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
