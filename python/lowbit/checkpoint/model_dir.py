"""Hugging Face model directories: reading one (config.json, model.safetensors or the shards of
model.safetensors.index.json) and writing one (shards, their index, config.json, the other files
copied) through a staging directory renamed into place when complete."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import safetensors_io as st
from .schema import CheckpointError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
DEFAULT_SHARD_BYTES = 5 * 1024 ** 3
# files of the input directory not copied to the output (rewritten, or the weights themselves)
_NOT_COPIED = (INDEX_NAME, CONFIG_NAME)


class ModelSource:
    """The tensors of a model given as a safetensors file, an index file or a directory.

    names(): every tensor name in file order (shards in index order); info(name) / get(name) as
    SafetensorsFile; config: config.json of the directory (None when there is none); root: the
    directory whose other files are copied (None for a single file given by itself)."""

    def __init__(self, path: str):
        self.path = path
        self.config: Optional[Dict[str, Any]] = None
        self.root: Optional[str] = None
        self.index_metadata: Dict[str, Any] = {}
        try:
            s = os.stat(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such file or directory") from None
        if stat.S_ISDIR(s.st_mode):
            self.root = path
            idx = os.path.join(path, INDEX_NAME)
            single = os.path.join(path, SINGLE_NAME)
            if os.path.exists(idx):
                files = self._read_index(idx)
            elif os.path.exists(single):
                files = [single]
            else:
                cands = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
                if len(cands) != 1:
                    raise CheckpointError(f"{path}: a model directory needs {INDEX_NAME} or {SINGLE_NAME} "
                                          f"(found {len(cands)} .safetensors files and no index)")
                files = [os.path.join(path, cands[0])]
            cfg = os.path.join(path, CONFIG_NAME)
            if os.path.exists(cfg):
                self.config = _read_json(cfg, "config.json")
        elif path.endswith(".index.json"):
            self.root = os.path.dirname(path) or "."
            files = self._read_index(path)
            cfg = os.path.join(self.root, CONFIG_NAME)
            if os.path.exists(cfg):
                self.config = _read_json(cfg, "config.json")
        else:
            st.check_input_path(path, "input")
            files = [path]
        self.files = files
        self._open: Dict[str, st.SafetensorsFile] = {}
        self._where: Dict[str, str] = {}
        self._order: List[str] = []
        try:
            for fp in files:
                st.check_input_path(fp, "input shard")
                f = st.SafetensorsFile(fp)
                self._open[fp] = f
                for n in f.names():
                    if n in self._where:
                        raise CheckpointError(f"{fp}: tensor {n!r} is also in {self._where[n]}")
                    self._where[n] = fp
                    self._order.append(n)
        except BaseException:
            self.close()
            raise
        if self._index_map is not None:
            for n, shard in self._index_map.items():
                fp = os.path.join(self.root or ".", shard)
                if self._where.get(n) != fp:
                    raise CheckpointError(f"{INDEX_NAME}: tensor {n!r} is listed in {shard} but "
                                          f"{'is in ' + self._where[n] if n in self._where else 'is in no shard'}")

    _index_map: Optional[Dict[str, str]] = None

    def _read_index(self, idx: str) -> List[str]:
        doc = _read_json(idx, INDEX_NAME)
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise CheckpointError(f"{idx}: not a safetensors index (no \"weight_map\" object of tensor name -> "
                                  f"shard file name)")
        for v in wm.values():
            if os.path.basename(v) != v or v in ("", ".", ".."):
                raise CheckpointError(f"{idx}: shard name {v!r} is not a file name in the directory")
        self._index_map = wm
        self.index_metadata = doc.get("metadata") or {}
        root = os.path.dirname(idx) or "."
        seen: List[str] = []
        for v in wm.values():
            if v not in seen:
                seen.append(v)
        return [os.path.join(root, v) for v in seen]

    def names(self) -> List[str]:
        return list(self._order)

    def file_of(self, name: str) -> st.SafetensorsFile:
        return self._open[self._where[name]]

    def info(self, name: str) -> st.TensorInfo:
        return self.file_of(name).info(name)

    def get(self, name: str):
        return self.file_of(name).get(name)

    def metadata(self) -> Dict[str, str]:
        """The __metadata__ of the first file (what a single-file writer keeps)."""
        return dict(self._open[self.files[0]].metadata) if self.files else {}

    def total_bytes(self) -> int:
        return sum(f.total_bytes() for f in self._open.values())

    def file_bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.files)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open = {}

    def __enter__(self) -> "ModelSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_json(path: str, what: str) -> Any:
    st.check_input_path(path, what)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(64 * 1024 * 1024 + 1)
        if len(raw) > 64 * 1024 * 1024:
            raise CheckpointError(f"{path}: {what} is larger than 64 MiB")
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None


def is_model_path(path: str) -> bool:
    """Whether `path` names a directory or a safetensors index (the directory mode)."""
    return os.path.isdir(path) or path.endswith(".index.json")


def check_output_dir(path: str, overwrite: bool) -> None:
    """The output directory: its parent must exist; it must be absent, an empty directory, or
    (with --force) a directory, never a file."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CheckpointError(f"{path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise CheckpointError(f"{path}: the directory {parent} is not writable")
    if os.path.lexists(path):
        if not os.path.isdir(path) or os.path.islink(path):
            raise CheckpointError(f"{path}: the output exists and is not a directory")
        if os.listdir(path) and not overwrite:
            raise CheckpointError(f"{path}: the output directory is not empty (use --force to replace it)")


def plan_shards(specs: Sequence[Tuple[str, str, Tuple[int, ...]]], max_bytes: int) -> List[List[int]]:
    """Splits the tensor specs (in order) into shards of at most max_bytes (a larger tensor alone)."""
    shards: List[List[int]] = [[]]
    size = 0
    for i, (_, dtype, shape) in enumerate(specs):
        n = st.dtype_to_numpy(dtype).itemsize
        for d in shape:
            n *= int(d)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(i)
        size += n
    return shards


def shard_names(count: int) -> List[str]:
    if count == 1:
        return [SINGLE_NAME]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


class StagingDir:
    """A new hidden directory beside `path`, renamed over it by commit(); removed on abort()."""

    def __init__(self, path: str, overwrite: bool):
        self.path = os.path.abspath(path)
        self.overwrite = overwrite
        parent, base = os.path.split(self.path)
        self.tmp = os.path.join(parent, f".{base}.{secrets.token_hex(8)}.tmp")
        os.mkdir(self.tmp, 0o777)

    def join(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def commit(self) -> None:
        if os.path.lexists(self.path):
            if os.listdir(self.path) and not self.overwrite:
                raise CheckpointError(f"{self.path}: the output directory was filled meanwhile")
            old = self.tmp + ".old"
            os.rename(self.path, old)
            os.rename(self.tmp, self.path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(self.tmp, self.path)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def copy_other_files(src_root: Optional[str], dst: StagingDir, weight_files: Sequence[str]) -> List[str]:
    """Copies the regular files of the input directory other than the weights, the index and
    config.json (tokenizer, generation config, ...); returns their names."""
    if not src_root:
        return []
    skip = {os.path.basename(p) for p in weight_files} | set(_NOT_COPIED)
    copied = []
    for name in sorted(os.listdir(src_root)):
        p = os.path.join(src_root, name)
        if name in skip or name.endswith(".safetensors") or name.startswith("."):
            continue
        if os.path.isfile(p):
            shutil.copyfile(p, dst.join(name))
            copied.append(name)
    return copied
