"""Regression tests of the safetensors reader's limits as the command line meets them: inputs
shorter than their header says or truncated while read, malformed or huge headers, metadata
entries that share tensors or lack the NVFP4 global amax, NaN in the error table, and the
README's way of running the command. Each test is the repro of one defect."""

import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

import lowbit
from lowbit import checkpoint
from lowbit import safetensors_io as st

from cli_hardening_common import (  # noqa: F401, F811 (ckpt: a fixture)
    ckpt, leftovers, one_line_error, PKG_PARENT, raw_file, RNG, ROOT, run
)


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
