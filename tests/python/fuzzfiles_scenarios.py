"""The fixed scenarios of the file fuzzer (fuzzfiles.py, KNOWN_FILES): paths that are not
regular files, --report clashes, existing outputs, signals, truncation while reading, large
headers, inconsistent "lowbit" entries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from fuzzfiles_cases import (check_nan_table, join, judge_cli, _lowbit_env, run_cli_inprocess, run_reader,
                             sha, split)


# ---------------------------------------------------------------------------------------------
# Fixed scenarios (items of the hardening issue); each returns [(category, message)]

def _small_input(d, name="in.safetensors", big=False, shape=(8, 64)):
    from lowbit import safetensors_io as st

    rng = np.random.default_rng(7)
    path = os.path.join(d, name)
    if big:
        ts = [(f"w{i}", rng.standard_normal((1024, 2048)).astype(np.float32)) for i in range(6)]
    else:
        ts = [("w", rng.standard_normal(shape).astype(np.float32))]
    st.save(path, ts)
    return path


def _cli(argv, d, timeout=60):
    try:
        p = subprocess.run([sys.executable, "-m", "lowbit"] + argv, capture_output=True, text=True,
                           timeout=timeout, env=_lowbit_env(), cwd=d)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", "", ""


def sc_output_fifo(d):
    src = _small_input(d)
    fifo = os.path.join(d, "out.fifo")
    os.mkfifo(fifo)
    rc, out, err = run_cli_inprocess(["quantize", src, fifo, "--format", "mxfp4", "-q"])
    f = judge_cli(rc, out, err, True, "output is a FIFO")
    import stat

    if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
        f.append(("stray_file", "the FIFO given as output was replaced by a regular file"))
    return f


def sc_output_symlink_devnull(d):
    src = _small_input(d)
    link = os.path.join(d, "out.safetensors")
    os.symlink("/dev/null", link)
    rc, out, err = run_cli_inprocess(["quantize", src, link, "--format", "mxfp4", "-q"])
    f = judge_cli(rc, out, err, True, "output is a symlink to /dev/null")
    if not os.path.islink(link):
        f.append(("stray_file", "the symlink to the device node was replaced by a regular file"))
    return f


def sc_input_fifo(d):
    fifo = os.path.join(d, "in.fifo")
    os.mkfifo(fifo)
    rc, out, err = _cli(["quantize", fifo, os.path.join(d, "o.safetensors"), "--format", "mxfp4", "-q"], d,
                        timeout=10)
    if rc == "timeout":
        return [("hang", "a FIFO given as input: the CLI waits forever (killed after 10 s)")]
    return judge_cli(rc, out, err, True, "input is a FIFO")


def sc_report_is_input(d):
    src = _small_input(d)
    h0 = sha(src)
    rc, out, err = run_cli_inprocess(["quantize", src, os.path.join(d, "o.safetensors"), "--format", "mxfp4", "-q",
                                      "--report", src])
    f = judge_cli(rc, out, err, True, "--report equal to the input")
    if sha(src) != h0:
        f.append(("input_changed", "--report equal to the input replaced the input checkpoint"))
    return f


def sc_report_is_output(d):
    src = _small_input(d)
    dst = os.path.join(d, "o.safetensors")
    rc, out, err = run_cli_inprocess(["quantize", src, dst, "--format", "mxfp4", "-q", "--report", dst])
    return judge_cli(rc, out, err, True, "--report equal to the output")


def sc_report_missing_dir(d):
    src = _small_input(d)
    dst = os.path.join(d, "o.safetensors")
    rc, out, err = run_cli_inprocess(["quantize", src, dst, "--format", "mxfp4", "-q", "--report",
                                      os.path.join(d, "missing", "r.json")])
    f = judge_cli(rc, out, err, True, "--report in a missing directory")
    if os.path.exists(dst):
        f.append(("stray_file", "--report in a missing directory failed only after the output was written"))
    return f


def sc_report_tmp_symlink(d):
    src = _small_input(d)
    victim = os.path.join(d, "victim.txt")
    with open(victim, "w") as fh:
        fh.write("keep me\n")
    rep = os.path.join(d, "r.json")
    os.symlink(victim, rep + ".tmp")
    run_cli_inprocess(["quantize", src, os.path.join(d, "o.safetensors"), "--format", "mxfp4", "-q",
                       "--report", rep])
    with open(victim) as fh:
        if fh.read() != "keep me\n":
            return [("stray_file", "the report's fixed temp name followed a planted symlink and overwrote "
                                   "its target")]
    return []


def sc_existing_output(d):
    src = _small_input(d)
    dst = os.path.join(d, "o.safetensors")
    with open(dst, "wb") as fh:
        fh.write(b"precious")
    os.chmod(dst, 0o600)
    rc, out, err = run_cli_inprocess(["quantize", src, dst, "--format", "mxfp4", "-q"])
    f = judge_cli(rc, out, err, True, "existing output without --force")
    with open(dst, "rb") as fh:
        if fh.read() != b"precious" and rc == 0:
            f = [("accepted_invalid", "an existing output was overwritten without --force")]
    rc2, out2, err2 = run_cli_inprocess(["quantize", src, dst, "--format", "mxfp4", "-q", "--force"])
    if rc2 == 0:
        mode = os.stat(dst).st_mode & 0o777
        if mode != 0o600:
            f.append(("wrong_result", f"--force replaced a 0600 output with mode {oct(mode)}"))
    return f


def _signal_case(d, sig):
    src = _small_input(d, big=True)
    dst = os.path.join(d, "o.safetensors")
    p = subprocess.Popen([sys.executable, "-m", "lowbit", "quantize", src, dst, "--format", "nvfp4", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_lowbit_env(), cwd=d)
    deadline = time.time() + 60
    # wait until the temporary output exists (the run is under way), then signal
    while time.time() < deadline and p.poll() is None:
        if any(n.startswith(".o.safetensors") for n in os.listdir(d)):
            break
        time.sleep(0.01)
    time.sleep(0.05)
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return [("hang", f"{signal.Signals(sig).name}: the CLI did not exit")]
    left = [n for n in os.listdir(d) if ".tmp" in n]
    if left:
        return [("temp_file_left", f"{signal.Signals(sig).name} left {left} "
                                   f"({sum(os.path.getsize(os.path.join(d, n)) for n in left)} bytes)")]
    return []


def sc_sigterm(d):
    return _signal_case(d, signal.SIGTERM)


def sc_sighup(d):
    return _signal_case(d, signal.SIGHUP)


def sc_truncated_while_reading(d):
    """The file shrinks between opening and reading (reader and CLI paths read memory-mapped)."""
    from lowbit import safetensors_io as st

    src = _small_input(d, shape=(256, 1024))  # 1 MiB: pages wholly past the new end of the file
    f = st.SafetensorsFile(src)
    f.get("w")  # the data is mapped now
    with open(src, "r+b") as fh:
        fh.truncate(f.data_start + 8)
    try:
        a = f.get("w")
        float(np.asarray(a, dtype=np.float64).sum())  # SIGBUS here kills the worker: recorded as a crash
    except (st.SafetensorsError, OSError):
        return []
    return [("accepted_invalid", "a tensor of a file truncated after opening was read without an error")]


def sc_large_header(d):
    """A header of 400k empty tensors (about 24 MiB) is read within 10 s or refused with a limit."""
    from lowbit import safetensors_io as st

    n = 400_000
    h = {f"t{i}": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    path = os.path.join(d, "big.safetensors")
    with open(path, "wb") as fh:
        fh.write(join(json.dumps(h), b""))
    t0 = time.time()
    try:
        f = st.SafetensorsFile(path)
        f.names()
    except st.SafetensorsError:
        pass
    except MemoryError:
        return [("foreign_error", "MemoryError for a 24 MiB header")]
    dt = time.time() - t0
    return [("slow", f"a header of {n} empty tensors took {dt:.1f} s to read")] if dt > 10 else []


def sc_duplicate_names(d):
    src = _small_input(d)
    with open(src, "rb") as fh:
        text, data = split(fh.read())
    h = json.loads(text)
    t = text.rstrip()[:-1] + "," + json.dumps({"w": h["w"]})[1:-1] + "}"
    with open(src, "wb") as fh:
        fh.write(join(t, data))
    from lowbit import safetensors_io as st

    e = run_reader(src, (st.SafetensorsError,))
    if e is None:
        return [("accepted_invalid", "the reader accepted a header with the tensor name 'w' twice")]
    return [] if isinstance(e, st.SafetensorsError) else [("foreign_error", f"{type(e).__name__}: {e}")]


def sc_nested_json(d):
    src = _small_input(d)
    with open(src, "rb") as fh:
        text, data = split(fh.read())
    t = text.rstrip()[:-1] + ',"x":' + "[" * 100000 + "]" * 100000 + "}"
    with open(src, "wb") as fh:
        fh.write(join(t, data))
    from lowbit import safetensors_io as st

    e = run_reader(src, (st.SafetensorsError,))
    if e is None:
        return [("accepted_invalid", "the reader accepted JSON nested 100000 deep")]
    return [] if isinstance(e, st.SafetensorsError) else [("foreign_error", f"{type(e).__name__}: "
                                                                             f"{str(e)[:120]}")]


def _quantized(d, fmt):
    from lowbit import checkpoint as ck

    src = _small_input(d)
    q = os.path.join(d, "q.safetensors")
    ck.quantize_checkpoint(src, q, ck.make_config(fmt), ck.Selection(), device="cpu")
    return q


def _edit_lowbit(path, fn):
    with open(path, "rb") as fh:
        text, data = split(fh.read())
    h = json.loads(text)
    meta = json.loads(h["__metadata__"]["lowbit"])
    fn(meta["tensors"])
    h["__metadata__"]["lowbit"] = json.dumps(meta)
    with open(path, "wb") as fh:
        fh.write(join(json.dumps(h), data))


def sc_shared_qdata(d):
    q = _quantized(d, "mxfp4")
    _edit_lowbit(q, lambda t: t.__setitem__("w2", dict(t["w"])))
    rc, out, err = run_cli_inprocess(["dequantize", q, os.path.join(d, "o.safetensors"), "-q"])
    return judge_cli(rc, out, err, True, "two entries own the same qdata")


def sc_null_global_amax(d):
    q = _quantized(d, "nvfp4")
    _edit_lowbit(q, lambda t: t["w"].__setitem__("global_amax", None))
    rc, out, err = run_cli_inprocess(["dequantize", q, os.path.join(d, "o.safetensors"), "-q"])
    return judge_cli(rc, out, err, True, "nvfp4 entry with a null global amax")


def sc_nan_table(d):
    from lowbit import safetensors_io as st

    src = os.path.join(d, "in.safetensors")
    w = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    w[2, 3] = np.nan
    st.save(src, [("layers.0.weight", w)])
    rc, out, err = run_cli_inprocess(["quantize", src, os.path.join(d, "o.safetensors"), "--format", "mxfp4"])
    if rc == 0:
        return check_nan_table(out)
    return judge_cli(rc, out, err, False, "a NaN in a weight")


KNOWN_FILES = [
    ("output is a FIFO (item 1)", sc_output_fifo),
    ("output is a symlink to /dev/null (item 1)", sc_output_symlink_devnull),
    ("input is a FIFO (item 1)", sc_input_fifo),
    ("--report equal to the input (item 2)", sc_report_is_input),
    ("--report equal to the output (item 2)", sc_report_is_output),
    ("--report in a missing directory (item 2)", sc_report_missing_dir),
    ("--report temp name is a planted symlink (item 2)", sc_report_tmp_symlink),
    ("SIGTERM during quantize (item 3)", sc_sigterm),
    ("SIGHUP during quantize (item 3)", sc_sighup),
    ("existing output, --force, mode (item 4)", sc_existing_output),
    ("file truncated while being read (item 5)", sc_truncated_while_reading),
    ("duplicate tensor names (item 6)", sc_duplicate_names),
    ("JSON nested 100000 deep (item 6)", sc_nested_json),
    ("large header (item 6)", sc_large_header),
    ("two entries own the same qdata (item 7)", sc_shared_qdata),
    ("nvfp4 entry with a null global amax (item 7)", sc_null_global_amax),
    ("max abs err of a tensor holding NaN (item 8)", sc_nan_table),
]
