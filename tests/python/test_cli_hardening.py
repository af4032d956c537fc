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
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import lowbit
from lowbit import safetensors_io as st

from cli_hardening_common import (  # noqa: F401, F811 (ckpt, no_work: fixtures)
    ckpt, leftovers, _mode, no_work, one_line_error, PKG_PARENT, run
)


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
    if signal.getsignal(signum) is signal.SIG_IGN:  # inherited (nohup): the command keeps ignoring it
        pytest.skip(f"{signame} is ignored by this process, and so by the command it starts")
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
