"""`lowbit quantize MODEL_DIR OUT_DIR`: model directories in, compressed-tensors directories out.

Checked without torch: the tensor names, dtypes and shapes of each scheme, a NumPy decode of the
compressed-tensors tensors (its documented arithmetic) against lowbit.dequantize, the index,
config.json, the default excludes, the shared NVFP4 global scales, the format-name aliases and
the refusals. The real-client test (transformers + compressed-tensors) is
test_checkpoint_ct_client.py.

    PYTHONPATH=python python -m pytest -q tests/python/test_checkpoint_dir.py
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import safetensors_io as st
from lowbit.cli import main

RNG = np.random.default_rng(17)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def run(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _tensors():
    t = {"model.embed_tokens.weight": RNG.standard_normal((64, 128)).astype(np.float32),
         "model.norm.weight": np.ones(128, np.float32),
         "lm_head.weight": RNG.standard_normal((64, 128)).astype(np.float32)}
    for i in range(2):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(128, np.float32)
        for name, rows, scale in (("q_proj", 128, 1.0), ("k_proj", 40, 3.0), ("v_proj", 40, 0.5), ("o_proj", 128, 1)):
            t[p + f"self_attn.{name}.weight"] = (RNG.standard_normal((rows, 128)) * scale).astype(np.float32)
        t[p + "mlp.gate_proj.weight"] = RNG.standard_normal((256, 128)).astype(np.float32)
        t[p + "mlp.up_proj.weight"] = (RNG.standard_normal((256, 128)) * 0.1).astype(np.float32)
        t[p + "mlp.down_proj.weight"] = RNG.standard_normal((128, 256)).astype(ml_dtypes.bfloat16)
        t[p + "mlp.gate.weight"] = RNG.standard_normal((8, 128)).astype(np.float32)  # a MoE router
        t[p + "self_attn.o_proj.bias"] = RNG.standard_normal(128).astype(np.float32)
    return t


@pytest.fixture
def model_dir(tmp_path):
    """A Hugging Face style directory: config.json, two shards, their index, a tokenizer file."""
    d = tmp_path / "model"
    d.mkdir()
    t = _tensors()
    names = list(t)
    half = len(names) // 2
    wm = {}
    for i, part in enumerate((names[:half], names[half:])):
        fn = f"model-0000{i + 1}-of-00002.safetensors"
        st.save(d / fn, {n: t[n] for n in part}, {"format": "pt"})
        wm.update({n: fn for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 128}))
    (d / "tokenizer.json").write_text("{}")
    return str(d), t


def _load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(st.load(os.path.join(d, f))[0])
    return out


def _unpack_int32(words, rows, cols):
    b = np.ascontiguousarray(words).view(np.uint8).reshape(rows, -1)
    return np.stack([b & 15, b >> 4], axis=-1).reshape(rows, -1)[:, :cols].astype(np.int32) - 8


def ct_decode(t, module, fmt):
    """compressed-tensors' decode of one module's weight, in NumPy (float32)."""
    g = lambda k: t[f"{module}.{k}"]  # noqa: E731
    if fmt in ("nvfp4", "mxfp4"):
        p = g("weight_packed")
        q = E2M1[np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)]
        if fmt == "nvfp4":
            s = g("weight_scale").astype(np.float32) / g("weight_global_scale")[0]
        else:
            s = np.ldexp(np.float32(1), g("weight_scale").astype(np.int32) - 127).astype(np.float32)
        return (q.reshape(q.shape[0], s.shape[1], -1) * s[..., None]).reshape(q.shape)
    if fmt in ("mxfp8_e4m3", "fp8_e4m3"):
        q = g("weight").astype(np.float32)
        s = g("weight_scale")
        if fmt == "mxfp8_e4m3":
            s = np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)
        return (q.reshape(q.shape[0], s.shape[1], -1) * s[..., None]).reshape(q.shape)
    m, k = (int(v) for v in g("weight_shape"))
    q = _unpack_int32(g("weight_packed"), m, k).astype(np.float32)
    s = g("weight_scale")
    if fmt == "uint4":
        zp = _unpack_int32(g("weight_zero_point").T.copy(), s.shape[1], m).T.astype(np.float32)
        q = q.reshape(m, s.shape[1], -1) - zp[..., None]
        return (q * s[..., None]).reshape(m, k)
    return (q.reshape(m, s.shape[1], -1) * s[..., None]).reshape(m, k)


EXPECT = {  # scheme, tensor suffix -> (dtype, shape of [M, K])
    "nvfp4": ("nvfp4-pack-quantized", {"weight_packed": (np.uint8, lambda m, k: (m, k // 2)),
                                       "weight_scale": (ml_dtypes.float8_e4m3fn, lambda m, k: (m, k // 16)),
                                       "weight_global_scale": (np.float32, lambda m, k: (1,))}),
    "mxfp4": ("mxfp4-pack-quantized", {"weight_packed": (np.uint8, lambda m, k: (m, k // 2)),
                                       "weight_scale": (np.uint8, lambda m, k: (m, k // 32))}),
    "mxfp8_e4m3": ("mxfp8-quantized", {"weight": (ml_dtypes.float8_e4m3fn, lambda m, k: (m, k)),
                                       "weight_scale": (np.uint8, lambda m, k: (m, k // 32))}),
    "fp8_e4m3": ("float-quantized", {"weight": (ml_dtypes.float8_e4m3fn, lambda m, k: (m, k)),
                                     "weight_scale": (np.float32, lambda m, k: (m, k // 128))}),
    "int4": ("pack-quantized", {"weight_packed": (np.int32, lambda m, k: (m, k // 8)),
                                "weight_scale": (np.float32, lambda m, k: (m, k // 128)),
                                "weight_shape": (np.int64, lambda m, k: (2,))}),
    "uint4": ("pack-quantized", {"weight_packed": (np.int32, lambda m, k: (m, k // 8)),
                                 "weight_scale": (np.float32, lambda m, k: (m, k // 128)),
                                 "weight_shape": (np.int64, lambda m, k: (2,)),
                                 "weight_zero_point": (np.int32, lambda m, k: ((m + 7) // 8, k // 128))}),
}


@pytest.mark.parametrize("fmt", list(EXPECT))
def test_compressed_tensors_directory(tmp_path, capsys, model_dir, fmt):
    src, t = model_dir
    out = tmp_path / "out"
    rc, stdout, err = run(capsys, "quantize", src, out, "-f", fmt, "--device", "cpu", "--max-shard-size", "100KB")
    assert rc == 0, err
    scheme, want = EXPECT[fmt]
    files = sorted(os.listdir(out))
    assert "tokenizer.json" in files and "config.json" in files and "model.safetensors.index.json" in files
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == scheme
    assert qc["quantization_status"] == "compressed"
    assert qc["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert {"lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"} <= set(qc["ignore"])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    got = _load(out)
    assert set(index["weight_map"]) == set(got)
    assert all(os.path.exists(out / f) for f in index["weight_map"].values())
    linear = [n for n in t if n.endswith("_proj.weight")]
    for n in t:
        if n not in linear:  # copied unchanged, default excludes included
            assert got[n].dtype == t[n].dtype and np.array_equal(got[n].view(np.uint8), t[n].view(np.uint8)), n
    for n in linear:
        mod = n[: -len(".weight")]
        m, k = t[n].shape
        for suffix, (dt, shape) in want.items():
            a = got[f"{mod}.{suffix}"]
            assert a.dtype == np.dtype(dt) and a.shape == shape(m, k), (n, suffix, a.dtype, a.shape)
        assert n not in got or "weight" in want
        kw = {}
        if fmt == "nvfp4":  # the reference with the global amax lowbit derived (S_enc = 2688 / amax)
            kw["global_amax"] = np.float32(2688.0) / got[f"{mod}.weight_global_scale"][0]
        ref = np.asarray(lowbit.dequantize(lowbit.quantize(t[n], fmt, **kw), out_dtype="float32"))
        dec = ct_decode(got, mod, fmt)
        if fmt == "nvfp4":  # division by the global scale vs multiplication by its inverse
            np.testing.assert_allclose(dec, ref, rtol=2 ** -20, atol=0)
        else:
            np.testing.assert_array_equal(dec, ref)
    assert "pack-quantized" in stdout or scheme in stdout


def test_nvfp4_fused_groups_share_the_global_scale(tmp_path, capsys, model_dir):
    src, t = model_dir
    assert run(capsys, "quantize", src, tmp_path / "o", "-f", "nvfp4", "--device", "cpu", "-q")[0] == 0
    got = _load(tmp_path / "o")
    for i in range(2):
        p = f"model.layers.{i}."
        qkv = {float(got[p + f"self_attn.{x}_proj.weight_global_scale"][0]) for x in "qkv"}
        gu = {float(got[p + f"mlp.{x}_proj.weight_global_scale"][0]) for x in ("gate", "up")}
        assert len(qkv) == 1 and len(gu) == 1
        amax = max(np.abs(t[p + f"self_attn.{x}_proj.weight"]).max() for x in "qkv")
        assert qkv == {float(np.float32(2688.0) / np.float32(amax))}
        o = float(got[p + "self_attn.o_proj.weight_global_scale"][0])
        assert o == float(np.float32(2688.0) / np.abs(t[p + "self_attn.o_proj.weight"]).max())


def test_single_shard_and_default_exclude_reasons(tmp_path, capsys, model_dir):
    src, t = model_dir
    rc, stdout, _ = run(capsys, "quantize", os.path.join(src, "model.safetensors.index.json"), tmp_path / "o",
                        "-f", "int4", "--device", "cpu")
    assert rc == 0
    assert sorted(f for f in os.listdir(tmp_path / "o") if "safetensors" in f) == ["model.safetensors"]
    lines = {ln.split()[0]: ln for ln in stdout.splitlines() if ln.strip()}
    assert "embedding: excluded by default" in lines["model.embed_tokens.weight"]
    assert "lm_head: excluded by default" in lines["lm_head.weight"]
    assert "router: excluded by default" in lines["model.layers.0.mlp.gate.weight"]
    rc, stdout, _ = run(capsys, "quantize", src, tmp_path / "o2", "-f", "int4", "--device", "cpu",
                        "--no-default-excludes", "--exclude", "layers\\.1\\.")
    assert rc == 0
    got = _load(tmp_path / "o2")
    assert "lm_head.weight_packed" in got and "model.layers.1.self_attn.q_proj.weight" in got
    cfg = json.loads((tmp_path / "o2" / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.self_attn.q_proj" in cfg["ignore"] and "lm_head" not in cfg["ignore"]


def test_single_file_to_compressed_tensors(tmp_path, capsys):
    src = tmp_path / "w.safetensors"
    st.save(src, {"a.weight": RNG.standard_normal((32, 64)).astype(np.float32)})
    rc, _, err = run(capsys, "quantize", src, tmp_path / "o", "-f", "mxfp4", "--convention", "compressed-tensors",
                     "--device", "cpu", "-q")
    assert rc == 0, err
    got = _load(tmp_path / "o")
    assert set(got) == {"a.weight_packed", "a.weight_scale"}
    assert "quantization_config" in json.loads((tmp_path / "o" / "config.json").read_text())


@pytest.mark.parametrize("alias,name", [("fp8-group", "fp8_e4m3"), ("mxfp8", "mxfp8_e4m3"),
                                        ("mxfp8-e5m2", "mxfp8_e5m2"), ("fp8_e5m2", "fp8_e5m2")])
def test_format_aliases(tmp_path, capsys, alias, name):
    src = tmp_path / "w.safetensors"
    st.save(src, {"w": RNG.standard_normal((8, 128)).astype(np.float32)})
    rc, _, err = run(capsys, "quantize", src, tmp_path / "q.safetensors", "-f", alias, "--device", "cpu", "-q")
    assert rc == 0, err
    meta = json.loads(st.SafetensorsFile(tmp_path / "q.safetensors").metadata["lowbit"])
    assert meta["tensors"]["w"]["format"] == name
    assert lowbit.Format(alias) == lowbit.Format(name)


@pytest.mark.parametrize("extra,msg", [
    (["-f", "nf4"], "compressed-tensors has no scheme"),
    (["-f", "mxfp8_e5m2"], "compressed-tensors has no scheme"),
    (["-f", "nvfp4", "--scale-layout", "blocked128x4"], "row_major"),
    (["-f", "int4", "--nibble-order", "high"], "low nibble"),
])
def test_refused_options(tmp_path, capsys, model_dir, extra, msg):
    src, _ = model_dir
    rc, _, err = run(capsys, "quantize", src, tmp_path / "o", *extra, "--device", "cpu")
    assert rc == 1 and msg in err and not os.path.exists(tmp_path / "o")


def test_refused_inputs_and_outputs(tmp_path, capsys, model_dir):
    src, _ = model_dir
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    rc, _, err = run(capsys, "quantize", src, busy, "-f", "int4", "--device", "cpu")
    assert rc == 1 and "not empty" in err
    assert run(capsys, "quantize", src, busy, "-f", "int4", "--device", "cpu", "-q", "--force")[0] == 0
    assert not os.path.exists(busy / "x") and os.path.exists(busy / "config.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors.index.json").write_text("[]")
    rc, _, err = run(capsys, "quantize", bad, tmp_path / "o", "-f", "int4")
    assert rc == 1 and "not a safetensors index" in err
    idx = json.loads(open(os.path.join(src, "model.safetensors.index.json")).read())
    idx["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps(idx))
    for f in os.listdir(src):
        if f.endswith(".safetensors"):
            os.link(os.path.join(src, f), bad / f)
    rc, _, err = run(capsys, "quantize", bad, tmp_path / "o", "-f", "int4")
    assert rc == 1 and "'ghost.weight'" in err and "is in no shard" in err
    assert not any(n.startswith(".o.") for n in os.listdir(tmp_path))  # no staging directory left


def test_progress_has_rate_and_eta(tmp_path, capsys, model_dir):
    src, t = model_dir
    rc, _, err = run(capsys, "quantize", src, tmp_path / "o", "-f", "int4", "--device", "cpu", "--progress")
    assert rc == 0
    lines = err.splitlines()
    assert len(lines) == len(t) and "/s ETA " in lines[-1]


def test_failure_leaves_nothing(tmp_path, capsys, model_dir, monkeypatch):
    from lowbit.checkpoint import compressed_tensors as ct

    src, _ = model_dir
    calls = []
    real = ct.convert

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return real(*a, **k)

    monkeypatch.setattr(ct, "convert", failing)
    rc, _, err = run(capsys, "quantize", src, tmp_path / "o", "-f", "mxfp4", "--device", "cpu", "--max-shard-size",
                     "50KB")
    assert rc == 1 and "disk on fire" in err
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no output, no staging directory


def test_gpt_oss_convention(tmp_path, capsys):
    """--convention gpt-oss: expert weights [E, K, N] as *_blocks [E, N, K/32, 16] / *_scales
    [E, N, K/32] of W[e]^T; decoded by convert-gpt-oss's independent NumPy decode."""
    from lowbit.checkpoint import decode_gpt_oss

    d = tmp_path / "go"
    d.mkdir()
    p = "model.layers.0."
    t = {p + "mlp.experts.gate_up_proj": RNG.standard_normal((3, 64, 128)).astype(ml_dtypes.bfloat16),
         p + "mlp.experts.gate_up_proj_bias": RNG.standard_normal((3, 128)).astype(ml_dtypes.bfloat16),
         p + "mlp.experts.down_proj": RNG.standard_normal((3, 64, 64)).astype(ml_dtypes.bfloat16),
         p + "mlp.router.weight": RNG.standard_normal((3, 64)).astype(ml_dtypes.bfloat16),
         p + "self_attn.q_proj.weight": RNG.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)}
    st.save(d / "model.safetensors", t)
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    rc, _, err = run(capsys, "quantize", d, tmp_path / "o", "-f", "mxfp4", "--convention", "gpt-oss", "-q",
                     "--device", "cpu")
    assert rc == 0, err
    got = _load(tmp_path / "o")
    qc = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "mxfp4" and "lm_head" in qc["modules_to_not_convert"]
    up = p + "mlp.experts.gate_up_proj"
    assert got[up + "_blocks"].shape == (3, 128, 2, 16) and got[up + "_scales"].shape == (3, 128, 2)
    assert got[p + "mlp.experts.down_proj_blocks"].shape == (3, 64, 2, 16)
    for n in (p + "mlp.experts.gate_up_proj_bias", p + "mlp.router.weight", p + "self_attn.q_proj.weight"):
        assert np.array_equal(got[n].view(np.uint16), t[n].view(np.uint16))
    for n in (up, p + "mlp.experts.down_proj"):
        dec = decode_gpt_oss(got[n + "_blocks"], got[n + "_scales"])
        x = t[n].astype(np.float32)
        for e in range(3):
            ref = np.asarray(lowbit.dequantize(lowbit.quantize(np.ascontiguousarray(x[e].T), "mxfp4")))
            np.testing.assert_array_equal(dec[e], ref)
    rc, _, err = run(capsys, "quantize", d, tmp_path / "o2", "-f", "nvfp4", "--convention", "gpt-oss")
    assert rc == 1 and "mxfp4" in err
