"""The random cases of the file fuzzer (fuzzfiles.py): small valid checkpoints, the mutations of
their bytes, header JSON and "lowbit" metadata, and running one case through the reader and the
command line."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

import fuzzlib


CLI_FORMATS = ["nvfp4", "mxfp4", "mxfp8", "mxfp8-e5m2", "fp8-group", "int4", "uint4", "nf4"]
CLI_EVERY = int(os.environ.get("LOWBIT_FUZZ_CLI_EVERY", "25"))


def _lowbit_env():
    """The environment of a `python -m lowbit` subprocess: the lowbit package this process
    imported (a sanitized build included) first on PYTHONPATH."""
    import lowbit

    env = dict(os.environ)
    pp = os.path.dirname(os.path.dirname(os.path.abspath(lowbit.__file__)))
    env["PYTHONPATH"] = pp + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("LOWBIT_TRACEBACK", None)
    return env


# ---------------------------------------------------------------------------------------------
# Files

def sha(path):
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def split(raw: bytes):
    """(header JSON text, data bytes) of a valid file's bytes."""
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n].decode("utf-8"), raw[8 + n:]


def join(header_text, data: bytes, pad=True):
    h = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def float_checkpoint(rng, path, nan=False):
    """A small checkpoint with 2-D float tensors every format quantizes, plus a bias and ints."""
    from lowbit import safetensors_io as st

    tensors = []
    for j in range(int(rng.integers(1, 4))):
        M, K = int(rng.integers(1, 9)), 64 * int(rng.integers(1, 3))
        dt = fuzzlib.pick(rng, [np.float32, np.float16, ml_dtypes.bfloat16])
        w = (rng.standard_normal((M, K)) * 0.05).astype(np.float32)
        if nan and j == 0:
            w[0, 1] = np.nan
        tensors.append((f"layers.{j}.weight", w.astype(dt)))
    if rng.random() < 0.6:
        tensors.append(("layers.0.bias", rng.standard_normal(int(rng.integers(1, 9))).astype(np.float32)))
    if rng.random() < 0.3:
        tensors.append(("step", np.array([int(rng.integers(100))], np.int64)))
    meta = {"format": "pt"} if rng.random() < 0.5 else None
    st.save(path, tensors, meta)
    return [n for n, _ in tensors]


def quantized_checkpoint(rng, src, dst):
    """`lowbit quantize` of a float checkpoint (in-process), for the dequantize cases."""
    from lowbit import checkpoint as ck

    fmt = fuzzlib.pick(rng, CLI_FORMATS)
    layout = fuzzlib.pick(rng, list(ck.LAYOUTS))
    cfg = ck.make_config(fmt, layout=layout)
    ck.quantize_checkpoint(src, dst, cfg, ck.Selection(), device="cpu")
    return fmt


# ---------------------------------------------------------------------------------------------
# Mutations: (new bytes, must_refuse_reader, must_refuse_cli, note)

def mutate_bytes(rng, raw):
    hlen = struct.unpack("<Q", raw[:8])[0]
    how = int(rng.integers(7))
    b = bytearray(raw)
    if how == 0:
        cut = int(rng.integers(0, len(raw)))
        return bytes(b[:cut]), cut < 8 + hlen, cut < 8 + hlen, f"truncated to {cut} of {len(raw)} bytes"
    if how == 1:
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(8, 8 + hlen))
            b[i] ^= 1 << int(rng.integers(8))
        return bytes(b), False, False, "header bytes flipped"
    if how == 2:
        if len(raw) > 8 + hlen:
            for _ in range(int(rng.integers(1, 8))):
                i = int(rng.integers(8 + hlen, len(raw)))
                b[i] = int(rng.integers(256))
        return bytes(b), False, False, "data bytes changed"
    if how == 3:
        v = int(fuzzlib.pick(rng, [0, 1, hlen - 1, hlen + 1, 2 ** 63, 2 ** 64 - 1, len(raw), 100 * 2 ** 20 + 1]))
        b[:8] = struct.pack("<Q", v)
        bad = v != hlen
        return bytes(b), bad and v > len(raw) - 8, False, f"header length field {v} (real {hlen})"
    if how == 4:
        return bytes(b) + bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)), False, False, \
            "garbage appended"
    if how == 5:
        return bytes(b[:8 + hlen]), False, False, "data region removed"
    b[:8] = bytes(rng.integers(0, 256, 8, dtype=np.uint8))
    return bytes(b), False, False, "random header length field"


def mutate_header(rng, raw):
    """Structured mutations of the header JSON; most make the file invalid."""
    text, data = split(raw)
    h = json.loads(text)
    names = [k for k in h if k != "__metadata__"]
    name = fuzzlib.pick(rng, names)
    e = h[name]
    how = int(rng.integers(16))
    if how == 0:  # duplicate name: a second entry, same key, other bytes (raw JSON text)
        other = fuzzlib.pick(rng, names)
        dup = json.dumps({name: h[other]})[1:-1]
        t = text.rstrip()
        t = t[:-1] + "," + dup + "}"
        return join(t, data), True, True, f"duplicate tensor name {name!r}"
    if how == 1:
        depth = int(fuzzlib.pick(rng, [1000, 5000, 100000]))
        e["extra"] = "@@NEST@@"
        t = json.dumps(h).replace('"@@NEST@@"', "[" * depth + "]" * depth)
        return join(t, data), True, True, f"nested JSON of depth {depth}"
    if how == 2:
        b0, b1 = e["data_offsets"]
        e["data_offsets"] = [b0, b1 + int(fuzzlib.pick(rng, [1, 8, 2 ** 40, 2 ** 63]))]
        return join(json.dumps(h), data), True, True, "end offset past the data"
    if how == 3:
        e["data_offsets"] = [int(fuzzlib.pick(rng, [-8, -1])), e["data_offsets"][1]]
        return join(json.dumps(h), data), True, True, "negative offset"
    if how == 4:
        e["data_offsets"] = [e["data_offsets"][1], e["data_offsets"][0]]
        bad = e["data_offsets"][0] != e["data_offsets"][1]
        return join(json.dumps(h), data), bad, bad, "begin > end"
    if how == 5 and len(names) > 1:  # overlapping ranges: another tensor's offsets, sizes permitting
        other = fuzzlib.pick(rng, [n for n in names if n != name])
        o = h[other]
        ob, oe = o["data_offsets"]
        isz = fuzzlib_itemsize(e["dtype"])
        if (oe - ob) % isz == 0 and oe > ob:
            e["shape"] = [(oe - ob) // isz]
            e["data_offsets"] = [ob, oe]
            return join(json.dumps(h), data), True, True, f"{name!r} overlaps {other!r}"
    if how == 6:
        e["shape"] = fuzzlib.pick(rng, [[2 ** 40, 2 ** 40], [2 ** 62, 4], [-1, 4], [1.5], [True, 2], "x", [[2]], None])
        return join(json.dumps(h), data), True, True, f"shape {e['shape']!r}"
    if how == 7:
        e["dtype"] = fuzzlib.pick(rng, ["F4", "f32", "", 5, None, ["F32"], "F8_E4M3FNUZ", "C64"])
        return join(json.dumps(h), data), True, True, f"dtype {e['dtype']!r}"
    if how == 8:  # same itemsize, other dtype: a valid file
        same = {"F32": "I32", "I32": "F32", "F16": "BF16", "BF16": "F16", "I64": "F64", "U8": "I8",
                "F8_E4M3": "F8_E5M2", "F8_E8M0": "U8"}
        e["dtype"] = same.get(e["dtype"], e["dtype"])
        return join(json.dumps(h), data), False, False, f"dtype relabelled {e['dtype']}"
    if how == 9:
        return join(json.dumps(fuzzlib.pick(rng, [[h], "x", 1, None])), data), True, True, "header not an object"
    if how == 10:
        h["__metadata__"] = fuzzlib.pick(rng, [{"a": 1}, {"a": {"b": "c"}}, [1], "x", {"a": None}])
        return join(json.dumps(h), data), True, True, "metadata values not strings"
    if how == 11:
        del e[fuzzlib.pick(rng, ["dtype", "shape", "data_offsets"])]
        return join(json.dumps(h), data), True, True, "entry lacks a field"
    if how == 12:
        e["data_offsets"] = fuzzlib.pick(rng, [[0], [0, 1, 2], ["0", "4"], [0.0, 4.0], None, {"a": 1}])
        return join(json.dumps(h), data), True, True, f"data_offsets {e['data_offsets']!r}"
    if how == 13:  # valid: whitespace padding, key order
        t = " " * int(rng.integers(0, 4096)) + json.dumps(dict(reversed(list(h.items()))))
        return join(t, data), False, False, "leading whitespace, keys reversed"
    if how == 14:
        h[""] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
        return join(json.dumps(h), data), False, False, "empty tensor name"
    t = text.encode("utf-8")
    t = t[:len(t) // 2] + b"\xff\xfe" + t[len(t) // 2:]
    return join(t, data, pad=False), True, True, "invalid UTF-8 in the header"


def fuzzlib_itemsize(dtype):
    from lowbit import safetensors_io as st

    return st.DTYPES[dtype].itemsize if dtype in st.DTYPES else 1


def mutate_lowbit_meta(rng, raw):
    """Mutations of the "lowbit" metadata of a quantized checkpoint (the reader accepts them)."""
    text, data = split(raw)
    h = json.loads(text)
    meta = json.loads(h["__metadata__"]["lowbit"])
    ents = meta["tensors"]
    if not ents:
        return mutate_header(rng, raw)
    name = fuzzlib.pick(rng, list(ents))
    e = ents[name]
    how = int(rng.integers(11))
    must = True
    if how == 0:  # a second entry owning the same qdata
        ents[name + ".twin"] = dict(e)
        note = "two entries own the same qdata"
    elif how == 1 and e.get("format") == "nvfp4":
        e["global_amax"] = None
        note = "nvfp4 entry with a null global amax"
    elif how == 1 or how == 2:
        e["format"] = fuzzlib.pick(rng, ["nvfp5", "", 7, None])
        e.pop("format_kwargs", None)
        note = f"format {e['format']!r}"
    elif how == 3:
        e["shape"] = fuzzlib.pick(rng, [[-1, 64], [2 ** 62, 64], [1, 2, 3, 4], "x", [3.5, 64], []])
        note = f"shape {e['shape']!r}"
    elif how == 4:
        e["layout"] = fuzzlib.pick(rng, ["diagonal", None, 3])
        e.pop("format_kwargs", None) if rng.random() < 0.5 else None
        note = f"layout {e['layout']!r}"
    elif how == 5:
        kw = e.get("format_kwargs") or {}
        kw["block"] = fuzzlib.pick(rng, [0, -32, 3, "32", 2 ** 40])
        e["format_kwargs"] = kw
        note = f"block {kw['block']!r}"
    elif how == 6:
        meta["version"] = fuzzlib.pick(rng, [99, "1", None, -1])
        must = meta["version"] == 99
        note = f"version {meta['version']!r}"
    elif how == 7:
        e["qdata"] = fuzzlib.pick(rng, ["missing.qdata", None, 5])
        note = f"qdata {e['qdata']!r}"
    elif how == 8:
        e["scale"] = e["qdata"]
        note = "scale names the qdata tensor"
    elif how == 9:
        h["__metadata__"]["lowbit"] = fuzzlib.pick(rng, ["{", "[]", '{"tensors": 5}', "null"])
        return join(json.dumps(h), data), False, True, "lowbit metadata not a JSON object"
    else:
        e["dtype"] = fuzzlib.pick(rng, ["I8", "F64", "x"])
        # the original dtype is one of F32 / F16 / BF16 (what quantize takes; docs/cli.md): any
        # other is refused naming the tensor, never written as float32 in silence
        must = True
        note = f"original dtype {e['dtype']!r}"
    h["__metadata__"]["lowbit"] = json.dumps(meta)
    return join(json.dumps(h), data), False, must, note


# ---------------------------------------------------------------------------------------------
# Running a file through the reader and the command line

class Case:
    def __init__(self, note, raw, refuse_reader, refuse_cli, command, fmt=None, nan=False):
        self.note, self.raw, self.refuse_reader, self.refuse_cli = note, raw, refuse_reader, refuse_cli
        self.command, self.fmt, self.nan = command, fmt, nan

    def describe(self):
        return (f"{self.command} of a mutated file ({self.note}; {len(self.raw)} bytes"
                f"{'; --format ' + self.fmt if self.fmt else ''})")


def make_case(seed, i):
    rng = np.random.default_rng([seed, i])
    d = tempfile.mkdtemp(prefix="lowbit-fuzz-gen-")
    try:
        src = os.path.join(d, "in.safetensors")
        nan = rng.random() < 0.02
        float_checkpoint(rng, src, nan=nan)
        quant = rng.random() < 0.4 and not nan
        if quant:
            q = os.path.join(d, "q.safetensors")
            quantized_checkpoint(rng, src, q)
            src = q
        with open(src, "rb") as fh:
            raw = fh.read()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    r = rng.random()
    if nan:
        raw2, rr, rc, note = raw, False, False, "a NaN in a weight"
    elif r < 0.08:
        raw2, rr, rc, note = raw, False, False, "unchanged"
    elif r < 0.4:
        raw2, rr, rc, note = mutate_bytes(rng, raw)
    elif quant and r < 0.7:
        raw2, rr, rc, note = mutate_lowbit_meta(rng, raw)
    else:
        raw2, rr, rc, note = mutate_header(rng, raw)
    command = "dequantize" if quant else "quantize"
    fmt = None if quant else fuzzlib.pick(rng, CLI_FORMATS)
    return Case(note, raw2, rr, rr or rc, command, fmt, nan)


def _listing(d):
    return sorted(os.listdir(d))


def run_reader(path, errors):
    """None when the file was read, else the exception."""
    from lowbit import safetensors_io as st

    try:
        f = st.SafetensorsFile(path)
        for n in f.names():
            a = f.get(n)
            if a.size:
                np.asarray(a).view(np.uint8).sum() if a.dtype.itemsize == 1 else np.asarray(a).tobytes()
        f.close()
    except errors as e:
        return e
    except RecursionError as e:
        return e
    return None


def run_cli_inprocess(argv):
    from lowbit import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # noqa: BLE001 - main() must not raise
            rc = f"raised {type(e).__name__}: {e}"
    return rc, out.getvalue(), err.getvalue()


def judge_cli(rc, out, err, must_refuse, what):
    """Findings of one CLI run (exit status, stderr) as [(category, message)]."""
    f = []
    if isinstance(rc, str):
        return [("foreign_error", f"{what}: main() {rc}")]
    if rc is None or rc < 0:
        return [("crash", f"{what}: killed by signal {-rc if rc else '?'}; stderr: {err.strip()[-200:]}")]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if "Traceback" in err:
        f.append(("foreign_error", f"{what}: traceback on stderr: {lines[-1][:200] if lines else ''}"))
    elif rc != 0:
        if len(lines) != 1:
            f.append(("unnamed_refusal", f"{what}: exit {rc} with {len(lines)} lines on stderr: "
                                         f"{' | '.join(lines)[:200]}"))
        elif "LOWBIT_TRACEBACK" in err:
            f.append(("foreign_error", f"{what}: unexpected exception: {lines[0][:240]}"))
    if rc == 0 and must_refuse:
        f.append(("accepted_invalid", f"{what}: exit 0"))
    return f


def check_dir(d, before, allowed_new, what):
    now = set(_listing(d))
    new = sorted(now - set(before) - set(allowed_new))
    fs = []
    tmp = [n for n in now if n.endswith(".tmp") or ".tmp" in n]
    if tmp:
        fs.append(("temp_file_left", f"{what}: temporary file(s) left: {tmp}"))
    elif new:
        fs.append(("stray_file", f"{what}: unexpected file(s) written: {new}"))
    return fs


def cli_argv(case, src, dst):
    if case.command == "quantize":
        return ["quantize", src, dst, "--format", case.fmt] + ([] if case.nan else ["-q"])
    return ["dequantize", src, dst, "-q"]


def run_case(case, errors=None, subprocess_cli=False):
    """[(category, message)] for one mutated file."""
    from lowbit import safetensors_io as st

    errors = errors or (st.SafetensorsError,)
    findings = []
    d = tempfile.mkdtemp(prefix="lowbit-fuzz-")
    try:
        src = os.path.join(d, "in.safetensors")
        with open(src, "wb") as fh:
            fh.write(case.raw)
        h0 = sha(src)
        # 1. the reader
        t0 = time.time()
        e = run_reader(src, (st.SafetensorsError,))
        dt = time.time() - t0
        if dt > 10:
            findings.append(("slow", f"reader took {dt:.1f} s"))
        if e is None and case.refuse_reader:
            findings.append(("accepted_invalid", "reader accepted the file"))
        elif e is not None and not isinstance(e, st.SafetensorsError):
            findings.append(("foreign_error", f"reader raised {type(e).__name__}: {str(e)[:200]}"))
        # 2. the command line, in-process
        dst = os.path.join(d, "out.safetensors")
        before = _listing(d)
        argv = cli_argv(case, src, dst)
        rc, out, err = run_cli_inprocess(argv)
        findings += judge_cli(rc, out, err, case.refuse_cli, "lowbit " + case.command)
        findings += check_dir(d, before, ["out.safetensors"] if rc == 0 else [], "lowbit " + case.command)
        if sha(src) != h0:
            findings.append(("input_changed", "the input file was changed"))
        if rc == 0 and case.nan:
            findings += check_nan_table(out)
        if rc == 0 and os.path.exists(dst):
            e2 = run_reader(dst, (st.SafetensorsError,))
            if e2 is not None:
                findings.append(("wrong_result", f"the output does not read back: {e2}"))
        # 3. the command line in a subprocess (sampled)
        if subprocess_cli:
            for n in _listing(d):
                if n != "in.safetensors":
                    os.unlink(os.path.join(d, n))
            try:
                p = subprocess.run([sys.executable, "-m", "lowbit"] + argv, capture_output=True, text=True,
                                   timeout=120, env=_lowbit_env(), cwd=d)
                findings += [(c, "subprocess: " + m) for c, m in
                             judge_cli(p.returncode, p.stdout, p.stderr, case.refuse_cli, "python -m lowbit")]
                findings += check_dir(d, ["in.safetensors"], ["out.safetensors"] if p.returncode == 0 else [],
                                      "python -m lowbit")
            except subprocess.TimeoutExpired:
                findings.append(("hang", "python -m lowbit ran for 120 s"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return findings


def check_nan_table(out):
    """The per-tensor table of a tensor holding NaN must not say max abs err 0."""
    for line in out.splitlines():
        if line.startswith("layers.0.weight"):
            last = line.split()[-1]
            if last in ("0", "0.0"):
                return [("wrong_result", f"table prints max abs err {last} for a tensor holding NaN: {line.strip()}")]
    return []
