"""Regression tests of the command line's file handling and of the safetensors reader's limits.

Each test is the repro of one defect: outputs that are not regular files, a --report that names
the input, planted temporary-file symlinks, signals in the middle of a write, silent overwrites,
inputs truncated while read, malformed or huge headers, metadata entries that share tensors or
lack the NVFP4 global amax, NaN in the error table, and the README's way of running the command.
"""

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import checkpoint
from lowbit import safetensors_io as st
from lowbit.cli import main

RNG = np.random.default_rng(77)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(lowbit.__file__)))


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def leftovers(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmp") or p.startswith("."))


def raw_file(path, header_bytes, data=b""):
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return path


@pytest.fixture
def ckpt(tmp_path):
    t = {
        "a.weight": RNG.standard_normal((32, 128)).astype(np.float32),
        "b.weight": RNG.standard_normal((16, 64)).astype(ml_dtypes.bfloat16),
        "norm": np.ones(64, np.float32),
    }
    path = tmp_path / "in.safetensors"
    st.save(path, t)
    return path, t


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if any tensor is quantized (the refusal must come before the work)."""
    calls = []

    def quantize(*a, **k):
        calls.append(1)
        raise AssertionError("quantize was called: the refusal came after the work started")

    monkeypatch.setattr(lowbit, "quantize", quantize)
    return calls


def _mode(p):
    return os.lstat(p).st_mode


# ---------------------------------------------------------------------------------------------
# 1. outputs and inputs that are not regular files


def _make_node(kind, path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(str(path))
        except OSError as e:  # e.g. a temporary directory path too long for AF_UNIX
            s.close()
            pytest.skip(f"cannot bind a unix socket here ({e})")
        return s
    elif kind == "chardev":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except (PermissionError, OSError) as e:
            pytest.skip(f"cannot create a device node here ({e})")
    return None


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "chardev"])
@pytest.mark.parametrize("option", ["output", "report"])
def test_output_not_a_regular_file_is_refused_before_work(capsys, ckpt, no_work, kind, option):
    src, _ = ckpt
    d = tempfile.mkdtemp(prefix="lb")  # short path: AF_UNIX names are limited to ~100 bytes
    try:
        node = os.path.join(d, "node")
        sock = _make_node(kind, node)
        mode = _mode(node)
        out = os.path.join(d, "out.safetensors")
        args = ["quantize", src, node, "-f", "int4", "--force"] if option == "output" else \
            ["quantize", src, out, "-f", "int4", "--report", node, "--force"]
        rc, _, err = run(capsys, *args)
        line = one_line_error(err)
        assert rc == 1 and line.startswith("lowbit quantize: error:") and node in line
        assert "not a regular file" in line or "only a regular file is replaced" in line
        assert no_work == []
        assert _mode(node) == mode  # still the same kind of node
        assert not os.path.exists(out) and leftovers(d) == []
        if sock is not None:
            sock.close()
    finally:
        for p in os.listdir(d):
            q = os.path.join(d, p)
            os.rmdir(q) if os.path.isdir(q) else os.unlink(q)
        os.rmdir(d)


def test_dev_null_output_is_refused_and_left_alone(capsys, ckpt, no_work):
    """The original repro: `lowbit quantize in.safetensors /dev/null` as root replaced the device."""
    try:
        before = os.stat("/dev/null")
    except OSError:
        pytest.skip("no /dev/null")
    if not stat.S_ISCHR(before.st_mode):
        pytest.skip("/dev/null is not a character device here")
    src, _ = ckpt
    rc, _, err = run(capsys, "quantize", src, "/dev/null", "-f", "nvfp4", "--force")
    assert rc == 1 and "/dev/null" in one_line_error(err) and "character device" in err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert no_work == []


@pytest.mark.parametrize("kind", ["fifo", "directory", "chardev"])
def test_input_not_a_regular_file_is_refused_without_blocking(tmp_path, kind):
    node = tmp_path / "in.safetensors"
    if kind == "chardev":
        node = "/dev/zero"
        if not os.path.exists(node):
            pytest.skip("no /dev/zero")
    else:
        _make_node(kind, node)
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "lowbit", "quantize", str(node), str(tmp_path / "o.safetensors"),
                        "-f", "int4"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1, r.stderr
    line = one_line_error(r.stderr)
    assert "not a regular file" in line and str(node) in line
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "o.safetensors").exists()
    if kind == "fifo":
        with pytest.raises(st.SafetensorsError, match="FIFO"):
            st.SafetensorsFile(node)  # the reader refuses it as well (never opened for reading)


# ---------------------------------------------------------------------------------------------
# 2. --report equal to the input or output, a missing directory, planted symlinks


@pytest.mark.parametrize("which", ["input", "output", "input-symlink", "input-hardlink"])
def test_report_that_names_the_input_or_output_is_refused(tmp_path, capsys, ckpt, no_work, which):
    src, _ = ckpt
    blob = src.read_bytes()
    out = tmp_path / "out.safetensors"
    report = {"input": src, "output": out}.get(which)
    if which == "input-symlink":
        report = tmp_path / "link.json"
        os.symlink(src, report)
    elif which == "input-hardlink":
        report = tmp_path / "hard.json"
        os.link(src, report)
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--report", report, "--force")
    line = one_line_error(err)
    assert rc == 1 and "--report" in line and "would replace the" in line
    assert src.read_bytes() == blob and not out.exists() and no_work == []
    assert leftovers(tmp_path) == []


def test_output_that_is_the_input_is_refused(tmp_path, capsys, ckpt, no_work):
    src, _ = ckpt
    blob = src.read_bytes()
    link = tmp_path / "link.safetensors"
    os.symlink(src, link)
    for out in (src, link):
        rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--force")
        assert rc == 1 and "is the input" in one_line_error(err)
    assert src.read_bytes() == blob and no_work == []


def test_report_in_a_missing_directory_is_refused_before_work(tmp_path, capsys, ckpt, no_work):
    src, _ = ckpt
    out = tmp_path / "out.safetensors"
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--report", tmp_path / "nodir" / "r.json")
    line = one_line_error(err)
    assert rc == 1 and "nodir" in line and "does not exist" in line
    assert not out.exists() and no_work == [] and leftovers(tmp_path) == []
    (tmp_path / "file").write_text("x")
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--report", tmp_path / "file" / "r.json")
    assert rc == 1 and "not a directory" in one_line_error(err) and not out.exists()


def test_planted_temp_symlinks_are_not_followed(tmp_path, capsys, ckpt):
    src, _ = ckpt
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out, report = tmp_path / "q.safetensors", tmp_path / "r.json"
    planted = [tmp_path / n for n in ("r.json.tmp", "q.safetensors.tmp", ".r.json.tmp", ".q.safetensors.tmp")]
    for p in planted:
        os.symlink(victim, p)
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--device", "cpu", "--report", report)
    assert rc == 0, err
    assert victim.read_bytes() == b"precious"
    assert all(os.path.islink(p) for p in planted)
    assert json.loads(report.read_text())["command"] == "quantize"
    assert st.SafetensorsFile(out).metadata["lowbit"]


def test_temp_files_are_exclusive_and_beside_the_target(tmp_path, capsys, ckpt, monkeypatch):
    src, _ = ckpt
    out = tmp_path / "q.safetensors"
    seen = []
    real = lowbit.quantize

    def spy(*a, **k):
        seen.append(st.live_temporary_files())
        return real(*a, **k)

    monkeypatch.setattr(lowbit, "quantize", spy)
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--device", "cpu")
    assert rc == 0, err
    (tmp,) = seen[0]
    assert os.path.dirname(tmp) == str(tmp_path)
    assert os.path.basename(tmp).startswith(".q.safetensors.") and tmp.endswith(".tmp")
    assert os.path.basename(tmp) != ".q.safetensors.tmp"  # a random part: not a guessable name
    assert st.live_temporary_files() == [] and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 3. SIGTERM / SIGHUP / SIGINT in the middle of the write remove the temporary file


def _full_pipe():
    """A pipe whose buffer is full: the child's first write to it blocks until the reader drains it."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"." * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def _drain(r):
    chunks = []
    while True:
        b = os.read(r, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    return b"".join(chunks).lstrip(b".").decode(errors="replace")


def _start_stalled_quantize(src, out, preexec_fn=None):
    """Starts `lowbit quantize SRC OUT --progress --force` in a subprocess and returns (process,
    read end of its stderr) once it is stalled mid-write: --progress writes a line to stderr before
    each tensor, after the temporary file and its header exist, and stderr is a full pipe, so the
    child waits in that write until the pipe is drained."""
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    r, w = _full_pipe()
    proc = subprocess.Popen([sys.executable, "-m", "lowbit", "quantize", str(src), str(out), "-f", "int4",
                             "--device", "cpu", "--progress", "--force"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=w, env=env,
                            preexec_fn=preexec_fn)
    os.close(w)
    directory = os.path.dirname(str(out))
    deadline = time.monotonic() + 60
    try:
        while not [p for p in os.listdir(directory) if p.endswith(".tmp")]:
            assert proc.poll() is None, "the command ended before it wrote anything"
            assert time.monotonic() < deadline, "no temporary file appeared"
            time.sleep(0.01)
    except BaseException:
        proc.kill()
        proc.wait()
        os.close(r)
        raise
    return proc, r


def _finish(proc, r, signum):
    try:
        proc.send_signal(signum)
        err = _drain(r)
        return proc.wait(timeout=60), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_signal_mid_write_removes_the_temp_file(tmp_path, ckpt, signame):
    if not hasattr(signal, signame):
        pytest.skip(f"no {signame} here")
    signum = getattr(signal, signame)
    src, _ = ckpt
    out = tmp_path / "q.safetensors"
    out.write_bytes(b"old output")
    os.chmod(out, 0o640)
    proc, r = _start_stalled_quantize(src, out)
    (tmp,) = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert tmp.startswith(".q.safetensors.")
    rc, err = _finish(proc, r, signum)
    assert rc == 128 + signum, err
    assert f"interrupted by {signame}" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors", "q.safetensors"]
    assert out.read_bytes() == b"old output" and stat.S_IMODE(os.stat(out).st_mode) == 0o640


def test_ignored_sighup_stays_ignored(tmp_path, ckpt):
    """Under nohup (SIGHUP ignored) a hangup does not stop the command."""
    if not hasattr(signal, "SIGHUP"):
        pytest.skip("no SIGHUP here")
    src, _ = ckpt
    out = tmp_path / "q.safetensors"
    proc, r = _start_stalled_quantize(src, out, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert proc.poll() is None and len(leftovers(tmp_path)) == 1
    rc, err = _finish(proc, r, signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]


def test_signal_handlers_are_restored(tmp_path, capsys, ckpt):
    src, _ = ckpt
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    rc, _, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "int4", "--device", "cpu", "-q")
    assert rc == 0, err
    assert {s: signal.getsignal(s) for s in before} == before


# ---------------------------------------------------------------------------------------------
# 4. an existing output needs --force; a replaced file keeps its mode


@pytest.mark.parametrize("option", ["output", "report"])
def test_existing_output_needs_force_and_keeps_its_mode(tmp_path, capsys, ckpt, option):
    src, _ = ckpt
    out, report = tmp_path / "q.safetensors", tmp_path / "r.json"
    target = out if option == "output" else report
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--device", "cpu", "--report", report)
    line = one_line_error(err)
    assert rc == 1 and str(target) in line and "already exists" in line and "--force" in line
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []
    assert option == "report" or not report.exists()
    assert option == "output" or not out.exists()
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--device", "cpu", "--report", report, "--force")
    assert rc == 0, err
    assert target.read_bytes() != b"old"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_new_output_gets_the_umask_mode(tmp_path, capsys, ckpt, umask):
    src, _ = ckpt
    old = os.umask(umask)
    try:
        rc, _, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "int4", "--device", "cpu",
                         "--report", tmp_path / "r.json")
    finally:
        os.umask(old)
    assert rc == 0, err
    for p in ("q.safetensors", "r.json"):
        assert stat.S_IMODE(os.stat(tmp_path / p).st_mode) == 0o666 & ~umask


def test_symlinked_output_replaces_the_file_it_points_at(tmp_path, capsys, ckpt):
    src, _ = ckpt
    real = tmp_path / "real.safetensors"
    real.write_bytes(b"old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.safetensors"
    os.symlink(real, link)
    rc, _, err = run(capsys, "quantize", src, link, "-f", "int4", "--device", "cpu", "--force")
    assert rc == 0, err
    assert os.path.islink(link) and st.SafetensorsFile(real).metadata["lowbit"]
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640


def test_library_writer_refuses_non_regular_targets(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(st.SafetensorsError, match="FIFO"):
        st.save(tmp_path / "fifo", {"a": np.zeros(2, np.float32)})
    (tmp_path / "x").write_bytes(b"old")
    with pytest.raises(st.SafetensorsError, match="already exists"):
        st.save(tmp_path / "x", {"a": np.zeros(2, np.float32)}, overwrite=False)
    assert (tmp_path / "x").read_bytes() == b"old"
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# 5. inputs shorter than their header says, or truncated while read


def test_header_promising_more_bytes_than_the_file_has(tmp_path, capsys):
    h = json.dumps({"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 64 * 64 * 4]}}).encode()
    src = raw_file(tmp_path / "short.safetensors", h, b"\0" * 1000)
    rc, _, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "int4", "--device", "cpu")
    line = one_line_error(err)
    assert rc == 1 and "outside the data region" in line and "'w'" in line
    assert not (tmp_path / "q.safetensors").exists() and leftovers(tmp_path) == []


def test_reader_detects_truncation_after_open(tmp_path):
    p = tmp_path / "t.safetensors"
    st.save(p, {"a": np.arange(4096, dtype=np.float32), "b": np.arange(4096, dtype=np.float32)})
    f = st.SafetensorsFile(p)
    np.testing.assert_array_equal(f.get("a"), np.arange(4096))
    os.truncate(p, os.path.getsize(p) - 8192)
    with pytest.raises(st.SafetensorsError, match="changed size"):
        f.get("b")
    f.close()


@pytest.mark.parametrize("change", ["truncate", "grow"])
def test_input_changed_while_quantizing_gives_a_clean_error(tmp_path, capsys, ckpt, monkeypatch, change):
    src, _ = ckpt
    out = tmp_path / "q.safetensors"
    real = lowbit.quantize

    def changing(*a, **k):  # the input changes size right after the first tensor was read
        if change == "truncate":
            os.truncate(src, os.path.getsize(src) // 2)
        else:
            with open(src, "ab") as fh:
                fh.write(b"\0" * 4096)
        return real(*a, **k)

    monkeypatch.setattr(lowbit, "quantize", changing)
    rc, _, err = run(capsys, "quantize", src, out, "-f", "int4", "--device", "cpu")
    line = one_line_error(err)
    assert rc == 1 and "changed size while it was read" in line and str(src) in line
    assert not out.exists() and leftovers(tmp_path) == []


def test_truncated_input_in_a_subprocess_never_crashes(tmp_path):
    """The SIGBUS repro: the file shrinks between the header read and the data read."""
    p = tmp_path / "t.safetensors"
    st.save(p, {"a": np.ones((512, 1024), np.float32)})
    code = ("import os, sys\n"
            "from lowbit import safetensors_io as st\n"
            "f = st.SafetensorsFile(sys.argv[1])\n"
            "os.truncate(sys.argv[1], 4096)\n"
            "try:\n"
            "    f.get('a')\n"
            "except st.SafetensorsError as e:\n"
            "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PKG_PARENT))
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "refused:" in r.stdout and "changed size" in r.stdout


# ---------------------------------------------------------------------------------------------
# 6. duplicate names, deep nesting, huge headers


@pytest.mark.parametrize("header,key", [
    (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
     "a"),
    (b'{"a":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}}', "dtype"),
    (b'{"__metadata__":{"k":"1","k":"2"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "k"),
])
def test_duplicate_keys_are_refused(tmp_path, header, key):
    p = raw_file(tmp_path / "d.safetensors", header, b"\0\0")
    with pytest.raises(st.SafetensorsError, match=f"key '{key}' appears twice"):
        st.SafetensorsFile(p)


@pytest.mark.parametrize("where", ["array", "object", "entry"])
def test_deep_nesting_is_refused_without_recursion_error(tmp_path, where):
    n = 200000
    if where == "array":
        h = b'{"a":' + b"[" * n + b"]" * n + b"}"
    elif where == "object":
        h = b'{"a":' + b'{"x":' * n + b"1" + b"}" * n + b"}"
    else:
        h = b'{"a":{"dtype":"U8","shape":' + b"[" * n + b"]" * n + b',"data_offsets":[0,0]}}'
    p = raw_file(tmp_path / "deep.safetensors", h)
    t0 = time.monotonic()
    with pytest.raises(st.SafetensorsError, match=f"nested .* levels deep; at most {st.MAX_HEADER_DEPTH}"):
        st.SafetensorsFile(p)
    assert time.monotonic() - t0 < 5


def test_brackets_and_escapes_inside_strings_are_not_nesting(tmp_path):
    value = '\\"' + "[" * 100 + "{" * 100 + "\\\\"
    h = json.dumps({"__metadata__": {"k": value, "q\\": "]]]"},
                    "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}).encode()
    p = raw_file(tmp_path / "s.safetensors", h, b"\1\2")
    f = st.SafetensorsFile(p)
    assert f.metadata == {"k": value, "q\\": "]]]"} and f.get("a").tolist() == [1, 2]


def test_huge_header_of_empty_tensors_is_refused_quickly(tmp_path):
    """The repro: a 100 MiB header of 1.8 M empty tensors took 219 s and 2.3 GB."""
    n = 1_800_000
    h = b"{" + b",".join(b'"%x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(n)) + b"}"
    h += b" " * (100 * 2 ** 20 - len(h)) if len(h) < 100 * 2 ** 20 else b""
    p = raw_file(tmp_path / "huge.safetensors", h)
    del h
    t0 = time.monotonic()
    with pytest.raises(st.SafetensorsError, match=f"at most {st.MAX_HEADER_BYTES} bytes"):
        st.SafetensorsFile(p)
    assert time.monotonic() - t0 < 2


def test_too_many_tensors_are_refused_with_the_limit(tmp_path, capsys):
    n = st.MAX_TENSORS + 1
    h = b"{" + b",".join(b'"%x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i for i in range(n)) + b"}"
    assert len(h) < st.MAX_HEADER_BYTES
    p = raw_file(tmp_path / "many.safetensors", h)
    t0 = time.monotonic()
    rc, _, err = run(capsys, "quantize", p, tmp_path / "q.safetensors", "-f", "int4")
    assert rc == 1 and f"at most {st.MAX_TENSORS} tensors" in one_line_error(err)
    assert time.monotonic() - t0 < 5


def test_header_size_limit_is_checked_before_reading(tmp_path):
    p = tmp_path / "big.safetensors"
    n = st.MAX_HEADER_BYTES + 8
    with open(p, "wb") as fh:  # sparse: the header bytes are never read
        fh.write(struct.pack("<Q", n) + b"{")
        fh.truncate(8 + n)
    with pytest.raises(st.SafetensorsError, match=f"header of {n} bytes; lowbit reads headers of at most"):
        st.SafetensorsFile(p)


# ---------------------------------------------------------------------------------------------
# 7. metadata entries that share tensors, NVFP4 without its global amax


def _quantized(tmp_path, capsys, fmt):
    t = {"w1": RNG.standard_normal((16, 128)).astype(np.float32),
         "w2": RNG.standard_normal((16, 128)).astype(np.float32) * 3}
    src = tmp_path / "plain.safetensors"
    st.save(src, t)
    q = tmp_path / f"{fmt}.safetensors"
    rc, _, err = run(capsys, "quantize", src, q, "-f", fmt, "--device", "cpu", "-q")
    assert rc == 0, err
    return q


def _edit_metadata(src, dst, edit=None, raw=None):
    tensors, meta = st.load(src)
    tensors["extra"] = np.zeros(2, np.float32)
    m = json.loads(meta["lowbit"])
    if edit:
        edit(m["tensors"])
    meta["lowbit"] = raw if raw is not None else json.dumps(m)
    st.save(dst, tensors, meta)


def test_two_entries_sharing_qdata_are_refused(tmp_path, capsys):
    q = _quantized(tmp_path, capsys, "int4")
    bad = tmp_path / "bad.safetensors"

    def share(entries):
        entries["w2"]["qdata"] = entries["w1"]["qdata"]
    _edit_metadata(q, bad, share)
    rc, _, err = run(capsys, "dequantize", bad, tmp_path / "o.safetensors")
    line = one_line_error(err)
    assert rc == 1 and "'w2'" in line and "'w1.qdata'" in line and "also the qdata of 'w1'" in line
    assert not (tmp_path / "o.safetensors").exists()

    def self_share(entries):
        entries["w1"]["scale"] = entries["w1"]["qdata"]
    _edit_metadata(q, bad, self_share)
    rc, _, err = run(capsys, "dequantize", bad, tmp_path / "o.safetensors")
    assert rc == 1 and "the same entry" in one_line_error(err)


def test_duplicate_entries_in_the_lowbit_metadata_are_refused(tmp_path, capsys):
    q = _quantized(tmp_path, capsys, "int4")
    meta = st.SafetensorsFile(q).metadata["lowbit"]
    entry = json.dumps(json.loads(meta)["tensors"]["w1"])
    raw = meta.replace('"tensors":{', '"tensors":{"w1":' + entry + ",", 1)
    bad = tmp_path / "bad.safetensors"
    _edit_metadata(q, bad, raw=raw)
    rc, _, err = run(capsys, "dequantize", bad, tmp_path / "o.safetensors")
    assert rc == 1 and "key 'w1' appears twice" in one_line_error(err)


def test_nvfp4_entry_without_global_amax_is_refused(tmp_path, capsys):
    q = _quantized(tmp_path, capsys, "nvfp4")
    bad = tmp_path / "bad.safetensors"

    def drop(entries):
        entries["w2"]["global_amax"] = None
    _edit_metadata(q, bad, drop)
    rc, _, err = run(capsys, "dequantize", bad, tmp_path / "o.safetensors")
    line = one_line_error(err)
    assert rc == 1 and "'w2'" in line and "global_amax" in line
    assert not (tmp_path / "o.safetensors").exists()
    f = st.SafetensorsFile(bad)
    with pytest.raises(checkpoint.CheckpointError, match="'w2'.*global_amax"):
        checkpoint.dequantize_entry(f, "w2", json.loads(f.metadata["lowbit"])["tensors"]["w2"], "float32")


@pytest.mark.parametrize("fmt,key,value,msg", [
    ("uint4", "zero", None, "names no zero tensor"),
    ("int4", "global_amax", "w1.scale", "int4 has none"),
    ("nvfp4", "global_amax", "extra", "expected one float value"),
    ("int4", "qdata", "missing.qdata", "is missing"),
])
def test_inconsistent_entries_are_refused(tmp_path, capsys, fmt, key, value, msg):
    q = _quantized(tmp_path, capsys, fmt)
    bad = tmp_path / "bad.safetensors"

    def edit(entries):
        entries["w2"][key] = value
    _edit_metadata(q, bad, edit)
    rc, _, err = run(capsys, "dequantize", bad, tmp_path / "o.safetensors")
    line = one_line_error(err)
    assert rc == 1 and "'w2'" in line and msg in line


# ---------------------------------------------------------------------------------------------
# 8 and 16. NaN in the table; tensors that hold NaN / Inf are named


def test_nanmax_propagates_nan():
    nan = float("nan")
    assert max(0.0, nan) == 0.0  # why a plain max was wrong
    for a, b in ((0.0, nan), (nan, 0.0), (nan, None), (None, nan)):
        assert np.isnan(checkpoint.nanmax(a, b))
    assert checkpoint.nanmax(1.0, 2.0) == 2.0 and checkpoint.nanmax(None, 1.5) == 1.5
    x = np.ones((3, 64), np.float32)
    xh = x.copy()
    xh[2, 5] = np.nan  # the NaN error comes last, after a finite maximum
    xh[0, 0] = 0.5
    _, maxerr, _, _, _ = checkpoint.Backend().error_stats(x, xh)
    assert np.isnan(maxerr)


def test_nan_tensor_is_named_and_its_error_printed_as_nan(tmp_path, capsys):
    t = {"good": RNG.standard_normal((16, 128)).astype(np.float32),
         "has_nan": RNG.standard_normal((16, 128)).astype(np.float32),
         "has_inf": RNG.standard_normal((16, 128)).astype(np.float32)}
    t["has_nan"][3, 7] = np.nan
    t["has_nan"][9, 1] = np.nan
    t["has_inf"][0, 0] = np.inf
    src = tmp_path / "nan.safetensors"
    st.save(src, t)
    report = tmp_path / "r.json"
    rc, out, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "int4", "--device", "cpu",
                       "--report", report)
    assert rc == 0, err
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert any("'has_nan'" in ln and "2 NaN values" in ln for ln in warnings), err
    assert any("'has_inf'" in ln and "1 Inf value" in ln for ln in warnings), err
    assert not any("'good'" in ln for ln in warnings)
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.strip()}
    assert rows["has_nan"][-1] == "nan"  # max abs err column
    assert rows["total"][-1] == "nan"
    assert rows["good"][-1] != "nan"
    rep = {r["name"]: r for r in json.loads(report.read_text())["tensors"]}
    assert rep["has_nan"]["max_abs_err"] == "nan" and rep["has_nan"]["nan"] == 2
    assert rep["has_inf"]["inf"] == 1 and rep["good"]["nan"] == 0
    # the warning is printed with --quiet too
    rc, out, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "int4", "--device", "cpu",
                       "-q", "--force")
    assert rc == 0 and out == "" and "'has_nan'" in err


# ---------------------------------------------------------------------------------------------
# 19. the README's way of running the command works from a fresh shell


def test_readme_runs_the_installed_command_by_its_path():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    commands = [ln.strip() for ln in section.splitlines() if ln.startswith("    ") and "lowbit" in ln
                and not ln.strip().startswith("[")]
    assert commands, section
    for c in commands:
        assert c.startswith(".venv/bin/lowbit ") or c.startswith(".venv/bin/python -m lowbit "), c
    assert ".venv/bin/lowbit info" in section
    main_sh = open(os.path.join(ROOT, "scripts", "main.sh")).read()
    assert 'LOWBIT_VENV:-$root/.venv' in main_sh and 'lowbit="$venv/bin/lowbit"' in main_sh
    assert "--force" in main_sh  # re-running the script replaces its own outputs
    assert 'run it as $lowbit' in main_sh  # the script says where the command is
