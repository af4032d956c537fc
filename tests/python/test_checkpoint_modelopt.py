"""`lowbit quantize MODEL_DIR OUT_DIR --format nvfp4 --convention modelopt`: NVIDIA ModelOpt's
NVFP4 naming. Checked without torch: every tensor name, dtype and shape, hf_quant_config.json and
config.json, a NumPy decode of ModelOpt's arithmetic (w = e2m1 * weight_scale * weight_scale_2,
float32) equal bit for bit to lowbit.dequantize, the shared q/k/v and gate/up weight_scale_2, and
the refusals. The torch side (lowbit.load_quantized of this convention) is in test_nn.py.

    PYTHONPATH=python python -m pytest -q tests/python/test_checkpoint_modelopt.py
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest

import lowbit
from test_checkpoint_dir import E2M1, _load, model_dir, run  # noqa: F401  (model_dir is a fixture)

F32 = np.float32


def modelopt_decode(t, module):
    """ModelOpt's decode of one module's NVFP4 weight in float32: e2m1 * weight_scale, then times
    weight_scale_2 (the order vLLM's emulation and TensorRT-LLM's dequantize use)."""
    p = t[f"{module}.weight"]
    q = E2M1[np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)]
    s = t[f"{module}.weight_scale"].astype(F32)
    blocks = q.reshape(q.shape[0], s.shape[1], -1) * s[..., None]
    return (blocks * t[f"{module}.weight_scale_2"]).astype(F32).reshape(q.shape)


def _shared_amax(t, name):
    """The global amax the command uses for `name`: the largest of its q/k/v or gate/up group."""
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        for g in group:
            if name.endswith(f".{g}.weight"):
                return max(F32(np.abs(t[name.replace(g, o)].astype(F32)).max()) for o in group)
    return F32(np.abs(t[name].astype(F32)).max())


def test_modelopt_directory(tmp_path, capsys, model_dir):  # noqa: F811
    src, t = model_dir
    out = tmp_path / "out"
    rc, stdout, err = run(capsys, "quantize", src, out, "-f", "nvfp4", "--convention", "modelopt", "--device", "cpu",
                          "--max-shard-size", "100KB")
    assert rc == 0, err
    assert "modelopt NVFP4" in stdout
    files = sorted(os.listdir(out))
    assert {"tokenizer.json", "config.json", "hf_quant_config.json", "model.safetensors.index.json"} <= set(files)
    hq = json.loads((out / "hf_quant_config.json").read_text())
    assert hq["producer"]["name"] == "modelopt"
    q = hq["quantization"]
    assert q["quant_algo"] == "NVFP4" and q["group_size"] == 16 and q["kv_cache_quant_algo"] is None
    assert {"lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"} <= set(q["exclude_modules"])
    assert not any("_proj" in m for m in q["exclude_modules"])
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert cfg["model_type"] == "llama"
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "NVFP4" and qc["group_size"] == 16
    assert qc["ignore"] == q["exclude_modules"] and qc["producer"]["name"] == "modelopt"
    g0 = qc["config_groups"]["group_0"]
    assert g0["targets"] == ["Linear"] and g0["weights"]["num_bits"] == 4 and g0["weights"]["group_size"] == 16
    got = _load(out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(got)
    linear = [n for n in t if n.endswith("_proj.weight")]
    for n in t:
        if n not in linear:  # copied unchanged
            assert got[n].dtype == t[n].dtype and np.array_equal(got[n].view(np.uint8), t[n].view(np.uint8)), n
    for n in linear:
        mod = n[: -len(".weight")]
        m, k = t[n].shape
        want = {"weight": (np.uint8, (m, k // 2)), "weight_scale": (ml_dtypes.float8_e4m3fn, (m, k // 16)),
                "weight_scale_2": (F32, ()), "input_scale": (F32, ())}
        for suffix, (dt, shape) in want.items():
            a = got[f"{mod}.{suffix}"]
            assert a.dtype == np.dtype(dt) and a.shape == shape, (n, suffix, a.dtype, a.shape)
        assert float(got[f"{mod}.input_scale"]) == 1.0
        amax = _shared_amax(t, n)
        ws2 = got[f"{mod}.weight_scale_2"]
        # lowbit's S_dec = 1 / (2688 / amax), float32: amax / (6 * 448) up to the last bit
        assert ws2 == F32(F32(1.0) / F32(F32(2688.0) / amax))
        np.testing.assert_allclose(ws2, amax / F32(2688.0), rtol=2 ** -22, atol=0)
        qt = lowbit.quantize(t[n], "nvfp4", global_amax=float(amax))
        assert np.array_equal(got[f"{mod}.weight"], np.asarray(qt.data).view(np.uint8))
        ref = np.asarray(lowbit.dequantize(qt, out_dtype="float32"))
        np.testing.assert_array_equal(modelopt_decode(got, mod), ref)  # bit for bit


def test_modelopt_fused_groups_share_weight_scale_2(tmp_path, capsys, model_dir):  # noqa: F811
    src, t = model_dir
    assert run(capsys, "quantize", src, tmp_path / "o", "-f", "nvfp4", "--convention", "modelopt",
               "--device", "cpu", "-q")[0] == 0
    got = _load(tmp_path / "o")
    for i in range(2):
        p = f"model.layers.{i}."
        qkv = {float(got[p + f"self_attn.{x}_proj.weight_scale_2"]) for x in "qkv"}
        gu = {float(got[p + f"mlp.{x}_proj.weight_scale_2"]) for x in ("gate", "up")}
        assert len(qkv) == 1 and len(gu) == 1
        assert float(got[p + "self_attn.o_proj.weight_scale_2"]) not in qkv


def test_modelopt_matches_compressed_tensors_codes(tmp_path, capsys, model_dir):  # noqa: F811
    """The same codes and block scales as the compressed-tensors output; weight_scale_2 is the
    inverse of its weight_global_scale (S_dec = 1 / S_enc, float32)."""
    src, t = model_dir
    assert run(capsys, "quantize", src, tmp_path / "mo", "-f", "nvfp4", "--convention", "modelopt",
               "--device", "cpu", "-q")[0] == 0
    assert run(capsys, "quantize", src, tmp_path / "ct", "-f", "nvfp4", "--device", "cpu", "-q")[0] == 0
    mo, ct = _load(tmp_path / "mo"), _load(tmp_path / "ct")
    for n in (x for x in t if x.endswith("_proj.weight")):
        mod = n[: -len(".weight")]
        assert np.array_equal(mo[f"{mod}.weight"], ct[f"{mod}.weight_packed"])
        assert np.array_equal(mo[f"{mod}.weight_scale"].view(np.uint8), ct[f"{mod}.weight_scale"].view(np.uint8))
        assert mo[f"{mod}.weight_scale_2"] == F32(1.0) / ct[f"{mod}.weight_global_scale"][0]


@pytest.mark.parametrize("args,match", [
    (("-f", "mxfp4"), "--convention modelopt stores nvfp4"),
    (("-f", "int4"), "--convention modelopt stores nvfp4"),
    (("-f", "nvfp4", "--scale-layout", "blocked128x4"), "row_major"),
    (("-f", "nvfp4", "--nibble-order", "high"), "low nibble"),
])
def test_modelopt_refusals(tmp_path, capsys, model_dir, args, match):  # noqa: F811
    src, _ = model_dir
    rc, _, err = run(capsys, "quantize", src, tmp_path / "o", "--convention", "modelopt", "--device", "cpu", *args)
    assert rc == 1 and match in err, err
    assert not os.path.exists(tmp_path / "o")


def test_modelopt_output_is_not_requantized(tmp_path, capsys, model_dir):  # noqa: F811
    src, _ = model_dir
    assert run(capsys, "quantize", src, tmp_path / "o", "-f", "nvfp4", "--convention", "modelopt", "--device", "cpu",
               "-q")[0] == 0
    rc, _, err = run(capsys, "quantize", tmp_path / "o", tmp_path / "o2", "-f", "nvfp4", "--device", "cpu")
    assert rc == 1 and "quantization_config" in err
