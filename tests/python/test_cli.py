"""Tests of the `lowbit` command line and its safetensors reader/writer.

Tiny checkpoints are built in tmp_path, both with lowbit.safetensors_io.save and from
hand-assembled bytes (so the reader is tested independently of the writer).
"""

import json
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import checkpoint
from lowbit import safetensors_io as st
from lowbit.cli import main

RNG = np.random.default_rng(1234)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def raw_file(path, header, data=b"", pad=True):
    """Writes a safetensors file from a header dict and raw data bytes, by hand."""
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + data)
    return path


def leftovers(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmp") or p.startswith("."))


@pytest.fixture
def ckpt(tmp_path):
    """A small transformer-like checkpoint with tensors that must be skipped."""
    t = {
        "layers.0.attn.q_proj.weight": RNG.standard_normal((64, 256)).astype(ml_dtypes.bfloat16),
        "layers.0.attn.o_proj.weight": RNG.standard_normal((96, 128)).astype(np.float16),
        "layers.0.mlp.up_proj.weight": (RNG.standard_normal((130, 256)) * 0.02).astype(np.float32),
        "layers.0.mlp.up_proj.bias": RNG.standard_normal(130).astype(np.float32),
        "layers.0.norm.weight": np.ones(256, ml_dtypes.bfloat16),
        "odd.weight": RNG.standard_normal((8, 40)).astype(np.float32),
        "position_ids": np.arange(16, dtype=np.int64),
        "experts.weight": RNG.standard_normal((2, 16, 128)).astype(np.float32),
    }
    path = tmp_path / "model.safetensors"
    st.save(path, t, {"format": "pt"})
    return path, t


# ---------------------------------------------------------------------------------------------
# safetensors reader / writer


def test_reader_hand_assembled(tmp_path):
    a = np.array([[1.5, -2.0], [0.25, 3.0]], dtype="<f4")
    b = np.array([7, 8, 9], dtype=np.uint8)
    bf = np.array([0x3F80, 0xC000], dtype="<u2")  # bf16 1.0, -2.0
    data = a.tobytes() + b.tobytes() + bf.tobytes()
    header = {
        "__metadata__": {"format": "pt"},
        "b": {"dtype": "U8", "shape": [3], "data_offsets": [16, 19]},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "h": {"dtype": "BF16", "shape": [2], "data_offsets": [19, 23]},
        "e": {"dtype": "F16", "shape": [0, 3], "data_offsets": [23, 23]},
    }
    path = raw_file(tmp_path / "hand.safetensors", header, data, pad=False)
    f = st.SafetensorsFile(path)
    assert f.metadata == {"format": "pt"}
    assert f.names() == ["a", "b", "h", "e"]
    np.testing.assert_array_equal(f.get("a"), a)
    np.testing.assert_array_equal(f.get("b"), b)
    assert f.get("h").dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(f.get("h").astype(np.float32), [1.0, -2.0])
    assert f.get("e").shape == (0, 3)
    assert not f.get("a").flags.writeable


def test_writer_layout_and_all_dtypes(tmp_path):
    tensors = {}
    for name, dt in st.DTYPES.items():
        raw = RNG.integers(0, 256, size=6 * dt.itemsize, dtype=np.uint8)
        if name == "BOOL":
            raw = raw & 1
        tensors[name.lower()] = raw.view(dt).reshape(2, 3)
    tensors["scalar"] = np.array(3.5, np.float32)
    path = tmp_path / "all.safetensors"
    size = st.save(path, tensors, {"k": "v"})
    blob = path.read_bytes()
    assert size == len(blob)
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(blob[8:8 + n])
    assert header.pop("__metadata__") == {"k": "v"}
    data = blob[8 + n:]
    for name, arr in tensors.items():
        e = header[name]
        assert e["shape"] == list(arr.shape)
        b0, b1 = e["data_offsets"]
        assert data[b0:b1] == np.ascontiguousarray(arr).tobytes(), name
        assert e["dtype"] == st.numpy_to_dtype(arr.dtype)
    back, meta = st.load(path)
    assert meta == {"k": "v"} and list(back) == list(tensors)
    for name, arr in tensors.items():
        assert back[name].dtype == arr.dtype
        assert back[name].tobytes() == arr.tobytes()


@pytest.mark.parametrize("header,data,msg", [
    ({"a": {"dtype": "F4X", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0", "unsupported dtype"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, b"\0" * 8, "outside the data region"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "expected 12"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, b"\0" * 8, "overlap"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "non-negative"),
    ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "lacks data_offsets"),
    ({"__metadata__": {"k": 1}}, b"", "__metadata__"),
    ([1, 2], b"", "does not start with"),
])
def test_reader_rejects_bad_headers(tmp_path, header, data, msg):
    path = raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(st.SafetensorsError, match=msg):
        st.SafetensorsFile(path)


def test_reader_rejects_non_safetensors(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"abc")
    with pytest.raises(st.SafetensorsError, match="too short"):
        st.SafetensorsFile(p)
    p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(st.SafetensorsError, match="header length"):
        st.SafetensorsFile(p)
    p.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(st.SafetensorsError, match="not valid JSON"):
        st.SafetensorsFile(p)


def test_writer_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out.safetensors"
    with pytest.raises(st.SafetensorsError):
        st.save(out, {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.complex64)})
    assert not out.exists() and leftovers(tmp_path) == []
    out.write_bytes(b"old")

    # an error while the data is being written: the old file stays, no temporary file is left
    specs = [("a", "F32", (4,)), ("b", "U8", (3,))]
    with pytest.raises(RuntimeError):
        with st.SafetensorsWriter(out, specs) as w:
            w.write("a", np.zeros(4, np.float32))
            assert len(leftovers(tmp_path)) == 1
            raise RuntimeError("boom")
    assert out.read_bytes() == b"old" and leftovers(tmp_path) == []
    with pytest.raises(st.SafetensorsError, match="header says"):
        with st.SafetensorsWriter(out, specs) as w:
            w.write("a", np.zeros(5, np.float32))
    with pytest.raises(st.SafetensorsError, match="never written"):
        with st.SafetensorsWriter(out, specs) as w:
            w.write("a", np.zeros(4, np.float32))
    assert out.read_bytes() == b"old" and leftovers(tmp_path) == []
    with st.SafetensorsWriter(out, specs, {"m": "1"}) as w:
        w.write("a", np.arange(4, dtype=np.float32))
        w.write("b", np.arange(3, dtype=np.uint8))
    back, meta = st.load(out)
    assert meta == {"m": "1"} and back["a"].tolist() == [0, 1, 2, 3] and back["b"].tolist() == [0, 1, 2]


def test_quantize_failure_midway_leaves_nothing(tmp_path, capsys, ckpt, monkeypatch):
    src, _ = ckpt
    out = tmp_path / "q.safetensors"
    real = lowbit.quantize
    calls = []

    def flaky(x, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("quantize: argument 'x': simulated failure")
        return real(x, *a, **k)

    monkeypatch.setattr(lowbit, "quantize", flaky)
    before = sorted(os.listdir(tmp_path))
    rc, _, err = run(capsys, "quantize", src, out, "-f", "mxfp8", "--device", "cpu")
    assert rc == 1 and "simulated failure" in _one_line_error(err)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == before


# ---------------------------------------------------------------------------------------------
# quantize / dequantize

# (cli args, lowbit.Format name, Format kwargs, layout, min SQNR dB on N(0,1) data)
CASES = {
    "nvfp4": (["--format", "nvfp4"], "nvfp4", {}, "row_major", 15.0),
    "nvfp4-blocked": (["--format", "nvfp4", "--scale-layout", "blocked128x4"], "nvfp4", {}, "blocked128x4", 15.0),
    "mxfp4": (["--format", "mxfp4"], "mxfp4", {"rounding": "rceil"}, "row_major", 14.0),
    "mxfp4-floor-8x4": (["--format", "mxfp4", "--rounding", "floor", "--scale-layout", "blocked8x4"], "mxfp4",
                        {"rounding": "floor"}, "blocked8x4", 12.0),
    "mxfp8": (["--format", "mxfp8"], "mxfp8_e4m3", {"rounding": "rceil"}, "row_major", 25.0),
    "mxfp8-e5m2": (["--format", "mxfp8-e5m2", "--scale-layout", "col_major"], "mxfp8_e5m2", {"rounding": "rceil"},
                   "col_major", 20.0),
    "fp8-group": (["--format", "fp8-group", "--group-size", "64", "--scale-dtype", "ue8m0"], "fp8_e4m3",
                  {"block": 64, "scale_dtype": "ue8m0"}, "row_major", 25.0),
    "int4": (["--format", "int4"], "int4", {"block": 128, "scale_dtype": "float32"}, "row_major", 14.0),
    "uint4": (["--format", "uint4", "--group-size", "32"], "uint4", {"block": 32}, "row_major", 14.0),
    "nf4": (["--format", "nf4", "--nibble-order", "high"], "nf4", {"block": 64, "nibble_order": "high"},
            "row_major", 14.0),
}


def _direct(x, api, kw, layout):
    extra = {"compute_global_amax": True} if api == "nvfp4" else {}
    return lowbit.quantize(np.array(x), lowbit.Format(api, **kw), layout=layout, **extra)


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_round_trip(tmp_path, capsys, ckpt, case):
    src, tensors = ckpt
    args, api, kw, layout, min_sqnr = CASES[case]
    out = tmp_path / "q.safetensors"
    report = tmp_path / "r.json"
    rc, stdout, err = run(capsys, "quantize", src, out, *args, "--device", "cpu", "--report", report)
    assert rc == 0, err
    f = st.SafetensorsFile(out)
    meta = json.loads(f.metadata["lowbit"])
    assert f.metadata["format"] == "pt" and meta["version"] == 1
    entries = meta["tensors"]
    quantized = {"layers.0.attn.q_proj.weight", "layers.0.attn.o_proj.weight", "layers.0.mlp.up_proj.weight"}
    assert set(entries) == quantized
    rep = {t["name"]: t for t in json.loads(report.read_text())["tensors"]}
    for name in quantized:
        x = tensors[name]
        e = entries[name]
        assert e["format"] == api and e["layout"] == layout
        assert e["shape"] == list(x.shape) and e["dtype"] == st.numpy_to_dtype(x.dtype)
        assert name not in f and e["qdata"] == name + ".qdata" and e["scale"] == name + ".scale"
        assert (e["zero"] is not None) == (api == "uint4")
        assert (e["global_amax"] is not None) == (api == "nvfp4")
        # the stored tensors are exactly what lowbit.quantize produces
        qt = _direct(x, api, kw, layout)
        assert f.get(e["qdata"]).tobytes() == np.asarray(qt.data).tobytes()
        assert f.get(e["scale"]).tobytes() == np.asarray(qt.scales).tobytes()
        if e["zero"]:
            assert f.get(e["zero"]).tobytes() == np.asarray(qt.zeros).tobytes()
        if e["global_amax"]:
            assert f.get(e["global_amax"]).tobytes() == np.asarray(qt.global_amax, np.float32).tobytes()
        packed = api not in ("mxfp8_e4m3", "mxfp8_e5m2", "fp8_e4m3")
        assert f.get(e["qdata"]).shape == (x.shape[0], x.shape[1] // 2 if packed else x.shape[1])
        # reversing from the metadata alone gives lowbit.dequantize's values, bit for bit
        y = checkpoint.dequantize_entry(f, name, e, "float32")
        ref = np.asarray(lowbit.dequantize(qt, out_dtype="float32"))
        assert y.tobytes() == ref.tobytes()
        # the report's error columns match a NumPy recomputation
        x64 = x.astype(np.float64)
        d = x64 - ref.astype(np.float64)
        sqnr = 10 * np.log10(np.sum(x64 ** 2) / np.sum(d ** 2))
        assert rep[name]["sqnr_db"] == pytest.approx(sqnr, rel=1e-9)
        assert rep[name]["max_abs_err"] == pytest.approx(np.max(np.abs(d)), rel=1e-12)
        assert rep[name]["bytes_after"] == sum(f.info(e[k]).nbytes for k in ("qdata", "scale", "zero",
                                                                               "global_amax") if e[k])
        assert sqnr > min_sqnr, (name, sqnr)
        assert name in stdout
    # untouched tensors are byte-identical
    for name in ("layers.0.mlp.up_proj.bias", "layers.0.norm.weight", "position_ids", "experts.weight"):
        assert f.get(name).tobytes() == tensors[name].tobytes() and f.get(name).dtype == tensors[name].dtype

    # dequantize subcommand: back to the original dtypes (or f32)
    back = tmp_path / "back.safetensors"
    rc, stdout, err = run(capsys, "dequantize", out, back)
    assert rc == 0, err
    g = st.SafetensorsFile(back)
    assert "lowbit" not in g.metadata and g.metadata["format"] == "pt"
    assert set(g.names()) == set(tensors)
    for name, x in tensors.items():
        assert g.info(name).shape == x.shape and g.get(name).dtype == x.dtype
    name = "layers.0.attn.q_proj.weight"
    ref = np.asarray(lowbit.dequantize(_direct(tensors[name], api, kw, layout), out_dtype="bfloat16"))
    assert g.get(name).tobytes() == ref.tobytes()
    rc, _, err = run(capsys, "dequantize", out, back, "--dtype", "f32", "-q")
    assert rc == 1 and "already exists" in _one_line_error(err)  # an existing output needs --force
    rc, _, err = run(capsys, "dequantize", out, back, "--dtype", "f32", "-q", "--force")
    assert rc == 0 and st.SafetensorsFile(back).get(name).dtype == np.float32


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8", "fp8-group", "int4", "uint4", "nf4"])
def test_quantize_cuda_matches_cpu(tmp_path, capsys, ckpt, fmt):
    usable, why = checkpoint.cuda_status()
    if not usable:
        pytest.skip(why)
    src, _ = ckpt
    outs = {}
    for device in ("cpu", "cuda"):
        outs[device] = tmp_path / f"{device}.safetensors"
        rc, stdout, err = run(capsys, "quantize", src, outs[device], "-f", fmt, "--device", device,
                              "--scale-layout", "blocked128x4")
        assert rc == 0, err
        assert f"device {device}" in stdout
    a, b = st.SafetensorsFile(outs["cpu"]), st.SafetensorsFile(outs["cuda"])
    assert a.names() == b.names() and a.metadata == b.metadata
    for n in a.names():
        assert a.get(n).dtype == b.get(n).dtype and a.get(n).tobytes() == b.get(n).tobytes(), n


def test_quantize_table_and_skips(tmp_path, capsys, ckpt):
    src, tensors = ckpt
    out = tmp_path / "q.safetensors"
    rc, stdout, err = run(capsys, "quantize", src, out, "--format", "mxfp4", "--device", "cpu",
                          "--exclude", r"o_proj", "--min-size", "10000")
    assert rc == 0, err
    for col in ("tensor", "shape", "format", "before", "after", "SQNR dB", "max abs err", "total"):
        assert col in stdout
    lines = {ln.split()[0]: ln for ln in stdout.splitlines() if ln.strip()}
    assert "not 2-D (1-D)" in lines["layers.0.mlp.up_proj.bias"]
    assert "not 2-D (3-D)" in lines["experts.weight"]
    assert "not float (I64" in lines["position_ids"]
    assert "K=40 not a multiple of the block 32" in lines["odd.weight"]
    assert "excluded" in lines["layers.0.attn.o_proj.weight"]
    assert "64x256" in lines["layers.0.attn.q_proj.weight"]
    assert "mxfp4" in lines["layers.0.attn.q_proj.weight"]
    entries = json.loads(st.SafetensorsFile(out).metadata["lowbit"])["tensors"]
    assert set(entries) == {"layers.0.attn.q_proj.weight", "layers.0.mlp.up_proj.weight"}

    rc, stdout, err = run(capsys, "quantize", src, out, "--format", "int4", "--device", "cpu",
                          "--include", r"q_proj", "--min-size", "20000", "--force")
    assert rc == 0, err
    assert "smaller than --min-size 20000" in stdout and "not matched by --include" in stdout
    assert json.loads(st.SafetensorsFile(out).metadata["lowbit"])["tensors"] == {}
    assert "no tensor was quantized" in stdout


def test_progress_lines(tmp_path, capsys, ckpt):
    src, tensors = ckpt
    rc, stdout, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "nvfp4", "--device", "cpu",
                          "--progress")
    assert rc == 0
    assert err.count("\n") == len(tensors) and "[1/" in err
    rc, stdout, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", "nvfp4", "--device", "cpu",
                          "-q", "--force")
    assert rc == 0 and stdout == "" and err == ""


def _one_line_error(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("what", [
    "missing", "not-safetensors", "bad-dtype", "size-mismatch", "bad-format", "group-size-mx", "rounding-int4",
    "nibbles-fp8", "scale-dtype-nvfp4", "bad-regex", "no-outdir", "same-file", "cuda-unusable", "bad-group",
    "already-quantized",
])
def test_bad_inputs(tmp_path, capsys, ckpt, what):
    src, _ = ckpt
    out = tmp_path / "out.safetensors"
    args = ["quantize", src, out, "--format", "nvfp4"]
    if what == "missing":
        args[1] = tmp_path / "nope.safetensors"
    elif what == "not-safetensors":
        args[1] = tmp_path / "junk.safetensors"
        args[1].write_bytes(os.urandom(64))
    elif what == "bad-dtype":
        args[1] = raw_file(tmp_path / "d.safetensors", {"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}},
                           b"\0" * 8)
    elif what == "size-mismatch":
        args[1] = raw_file(tmp_path / "d.safetensors", {"w": {"dtype": "F32", "shape": [3, 16],
                                                              "data_offsets": [0, 128]}}, b"\0" * 128)
    elif what == "bad-format":
        args[4] = "fp5"
    elif what == "group-size-mx":
        args[4:] = ["mxfp4", "--group-size", "64"]
    elif what == "rounding-int4":
        args[4:] = ["int4", "--rounding", "floor"]
    elif what == "nibbles-fp8":
        args[4:] = ["mxfp8", "--nibble-order", "high"]
    elif what == "scale-dtype-nvfp4":
        args[4:] = ["nvfp4", "--scale-dtype", "float32"]
    elif what == "bad-regex":
        args += ["--exclude", "("]
    elif what == "no-outdir":
        out = tmp_path / "nodir" / "out.safetensors"
        args[2] = out
    elif what == "same-file":
        out = src
        args[2] = src
    elif what == "cuda-unusable":
        if checkpoint.cuda_status()[0]:
            pytest.skip("a CUDA device is usable here")
        args += ["--device", "cuda"]
    elif what == "bad-group":
        args[4:] = ["int4", "--group-size", "7"]
    elif what == "already-quantized":
        assert main(["quantize", str(src), str(tmp_path / "q.safetensors"), "-f", "int4", "-q"]) == 0
        args[1] = tmp_path / "q.safetensors"
    before = sorted(os.listdir(tmp_path))
    rc, stdout, err = run(capsys, *args)
    assert rc != 0
    line = _one_line_error(err)
    assert line.startswith("lowbit quantize: error:"), line
    if what != "same-file":
        assert not out.exists()
    assert sorted(os.listdir(tmp_path)) == before and leftovers(tmp_path) == []


def test_dequantize_rejects_plain_checkpoint(tmp_path, capsys, ckpt):
    src, _ = ckpt
    rc, _, err = run(capsys, "dequantize", src, tmp_path / "o.safetensors")
    assert rc == 1 and "not a lowbit-quantized checkpoint" in _one_line_error(err)
    assert not (tmp_path / "o.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# gpt-oss


def _fp4_decode(blocks, scales):
    """Test-local decode, written from the format tables: sign bit 3, exponent bits 2-1, mantissa bit 0."""
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    e = (codes >> 1) & 3
    m = (codes & 1).astype(np.float64)
    mag = np.where(e == 0, m * 0.5, (1 + m / 2) * 2.0 ** (e.astype(np.float64) - 1))
    val = np.where(codes & 8, -mag, mag) * 2.0 ** (scales.astype(np.float64)[..., None] - 127)
    val = np.where(scales[..., None] == 255, np.nan, val)
    with np.errstate(over="ignore"):  # 6 * 2^127 -> inf in float32
        return val.reshape(blocks.shape[:-2] + (-1,)).astype(np.float32)


@pytest.fixture
def gpt_oss(tmp_path):
    E, R1, R2, K = 3, 130, 64, 128
    t = {}
    layer = "model.layers.0.mlp.experts."
    t[layer + "gate_up_proj_blocks"] = RNG.integers(0, 256, (E, R1, K // 32, 16), dtype=np.uint8)
    s1 = RNG.integers(110, 135, (E, R1, K // 32)).astype(np.uint8)
    s1[0, 0, 0], s1[1, 2, 1], s1[2, 5, 3] = 0, 255, 254
    t[layer + "gate_up_proj_scales"] = s1
    t[layer + "gate_up_proj_bias"] = RNG.standard_normal((E, R1)).astype(ml_dtypes.bfloat16)
    t[layer + "down_proj_blocks"] = RNG.integers(0, 256, (E, R2, 64 // 32, 16), dtype=np.uint8)
    t[layer + "down_proj_scales"] = RNG.integers(118, 130, (E, R2, 64 // 32)).astype(np.uint8)
    t[layer + "down_proj_bias"] = RNG.standard_normal((E, R2)).astype(ml_dtypes.bfloat16)
    t["model.layers.0.self_attn.q_proj.weight"] = RNG.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    path = tmp_path / "gpt-oss.safetensors"
    st.save(path, t, {"format": "pt"})
    return path, t


@pytest.mark.parametrize("layout", ["row_major", "blocked128x4", "col_major", "blocked8x4"])
def test_convert_gpt_oss(tmp_path, capsys, gpt_oss, layout):
    src, t = gpt_oss
    out = tmp_path / "conv.safetensors"
    rc, stdout, err = run(capsys, "convert-gpt-oss", src, out, "--layout", layout)
    assert rc == 0, err
    rows = [ln for ln in stdout.splitlines() if ln.startswith("model.layers.0.mlp.experts.") and "_bias" not in ln]
    assert len(rows) == 2 and all(ln.endswith("bit-exact") for ln in rows)
    assert "2 converted (verified bit-exact)" in stdout
    f = st.SafetensorsFile(out)
    entries = json.loads(f.metadata["lowbit"])["tensors"]
    layer = "model.layers.0.mlp.experts."
    assert set(entries) == {layer + "gate_up_proj", layer + "down_proj"}
    for base in entries:
        blocks, scales = t[base + "_blocks"], t[base + "_scales"]
        E, R, G, _ = blocks.shape
        e = entries[base]
        assert e["format"] == "mxfp4" and e["block"] == 32 and e["layout"] == layout
        assert e["shape"] == [E, R, G * 32] and e["nibble_order"] == "low"
        q = f.get(base + ".qdata")
        assert q.shape == (E, R, G * 16) and q.dtype == np.uint8
        assert q.tobytes() == blocks.tobytes()  # gpt-oss is already element 2i in the low nibble
        s = f.get(base + ".scale")
        if layout == "row_major":
            assert s.shape == (E, R, G) and s.tobytes() == scales.tobytes()
        elif layout == "col_major":
            assert s.shape == (E, G, R) and (s == scales.transpose(0, 2, 1)).all()
        elif layout == "blocked128x4":
            Rp, Cp = -(-R // 128) * 128, -(-G // 4) * 4
            assert s.shape == (E, Rp, Cp)
            flat = s.reshape(E, -1)
            for r in range(R):  # cuBLAS 128x4 offset formula
                for c in range(G):
                    off = ((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
                    assert (flat[:, off] == scales[:, r, c]).all()
        for name in (base + "_blocks", base + "_scales"):
            assert name not in f
    for name in (layer + "gate_up_proj_bias", layer + "down_proj_bias", "model.layers.0.self_attn.q_proj.weight"):
        assert f.get(name).tobytes() == t[name].tobytes()

    # dequantizing the converted checkpoint gives the gpt-oss values (test-local decode)
    back = tmp_path / "back.safetensors"
    rc, _, err = run(capsys, "dequantize", out, back, "--dtype", "f32", "-q")
    assert rc == 0, err
    g = st.SafetensorsFile(back)
    for base in entries:
        ref = _fp4_decode(t[base + "_blocks"], t[base + "_scales"])
        got = g.get(base)
        assert got.shape == ref.shape
        same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
        assert same.all()
    # the CLI's own decode agrees with the test-local one
    ref = _fp4_decode(t[layer + "down_proj_blocks"], t[layer + "down_proj_scales"])
    mine = checkpoint.decode_gpt_oss(t[layer + "down_proj_blocks"], t[layer + "down_proj_scales"])
    assert mine.tobytes() == ref.tobytes()


def test_convert_gpt_oss_detects_mismatch(tmp_path, capsys, gpt_oss, monkeypatch):
    src, _ = gpt_oss
    out = tmp_path / "conv.safetensors"
    real = checkpoint.decode_gpt_oss
    monkeypatch.setattr(checkpoint, "decode_gpt_oss", lambda b, s: -real(b, s))
    rc, _, err = run(capsys, "convert-gpt-oss", src, out)
    assert rc == 1 and "differ" in _one_line_error(err)
    assert not out.exists() and leftovers(tmp_path) == []


def test_convert_gpt_oss_rejects_other_checkpoints(tmp_path, capsys, ckpt):
    src, _ = ckpt
    rc, _, err = run(capsys, "convert-gpt-oss", src, tmp_path / "o.safetensors")
    assert rc == 1 and "no gpt-oss MXFP4 tensors" in _one_line_error(err)
    assert not (tmp_path / "o.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# info and entry points


def test_info(capsys):
    rc, out, err = run(capsys, "info")
    assert rc == 0 and out.startswith("lowbit ") and "CUDA kernels compiled in" in out
    rc, out, err = run(capsys, "info", "--json")
    info = json.loads(out)
    assert rc == 0 and info["version"] == lowbit.__version__ and "cuda_ops" in info


def test_python_m_and_usage(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lowbit", "info"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "lowbit" in r.stdout
    r = subprocess.run([sys.executable, "-m", "lowbit", "quantize", "--help"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0
    for word in ("W.qdata", "W.scale", "W.zero", "W.global_amax", "__metadata__", "nvfp4", "blocked128x4"):
        assert word in r.stdout
    r = subprocess.run([sys.executable, "-m", "lowbit", "quantize", "a", "b"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--format" in r.stderr
