"""Small random-initialised transformers models with lowbit modules put in by
lowbit.nn.quantize_model, beside the same model holding the dequantized weights in bfloat16:
used by tests/python/test_nn.py (CPU and CUDA) and bench/bench_nn.py.

    case = build_case("llama", "nvfp4", "cuda")   # case.model (lowbit modules), case.ref (bf16)
    y, r = case.run(case.model), case.run(case.ref)

Models (bfloat16, 2 layers, dims that every lowbit CUDA kernel takes: NVFP4 N % 128 == 0 and
K % 64 == 0, MXFP4 N % 8 == 0 and K % 32 == 0, gpt-oss experts H and I multiples of 32):
    llama     LlamaForCausalLM, hidden 256, intermediate 512, 4 heads of 64 (2 KV heads), vocab 512
    gpt-oss   GptOssForCausalLM, hidden 256, intermediate 256, 4 experts (top 2), 4 heads of 64
              (2 KV heads), vocab 512; experts -> lowbit GptOssExperts, attention -> MXFP4Linear
    bert      BertModel (MiniLM-like), hidden 384, intermediate 1536, 12 heads of 32, vocab 1024
Needs torch and transformers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List

import torch

from lowbit import nn as lnn

MODEL_CASES = [("llama", "nvfp4"), ("llama", "mxfp4"), ("gpt-oss", "mxfp4"), ("bert", "nvfp4")]
# Per-token relative L2 error of the output allowed (test_nn.py says why). Measured on the CPU
# (seed 0): llama nvfp4 0.0099 max, llama mxfp4 0 (bit-equal), gpt-oss mxfp4 0.0092, bert nvfp4 0.0044.
TOL = {"nvfp4": 3e-2, "mxfp4": 2e-2}
# gpt-oss, whole model: 90% of the tokens within TOL (a nearly tied router can pick another expert
# in one model than in the other, and attention carries that token's change to later ones); its
# expert modules, fed the reference's own inputs and routing: every token within TOL.
ROUTED_QUANTILE = 0.9


def _config(name: str):
    import transformers

    if name == "llama":
        return transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                        max_position_embeddings=256, tie_word_embeddings=False)
    if name == "gpt-oss":
        return transformers.GptOssConfig(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                         num_local_experts=4, num_experts_per_tok=2, sliding_window=128,
                                         layer_types=["sliding_attention", "full_attention"],
                                         max_position_embeddings=131072, tie_word_embeddings=False)
    if name == "bert":
        return transformers.BertConfig(vocab_size=1024, hidden_size=384, intermediate_size=1536, num_hidden_layers=2,
                                       num_attention_heads=12, max_position_embeddings=256)
    raise ValueError(f"unknown model {name!r}")


def build_model(name: str, seed: int = 0):
    import transformers

    cfg = _config(name)
    cls = {"llama": transformers.LlamaForCausalLM, "gpt-oss": transformers.GptOssForCausalLM,
           "bert": transformers.BertModel}[name]
    torch.manual_seed(seed)
    model = cls(cfg)
    if name == "gpt-oss":  # transformers initialises the expert tensors with zeros / empty
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if ".experts." in n or ".router." in n or n.endswith("sinks"):
                    p.copy_(torch.randn(p.shape, generator=g) * (0.02 if "bias" not in n else 0.01))
    return model.to(torch.bfloat16).eval(), cfg


@dataclass
class Case:
    name: str
    fmt: str
    model: Any
    ref: Any
    report: Any
    inputs: Dict[str, torch.Tensor]
    out_key: str
    errors: List[float] = field(default_factory=list)

    def run(self, m, **override) -> torch.Tensor:
        out = m(**{**self.inputs, **override})
        return getattr(out, self.out_key)

    def check(self, errs: torch.Tensor) -> None:
        errs = errs.double()
        what = f"{self.name}/{self.fmt}: per-token relative errors max {errs.max().item():.3g}, " \
               f"median {errs.median().item():.3g}"
        tol = TOL[self.fmt]
        if self.name == "gpt-oss":
            assert bool(torch.isfinite(errs).all()), what
            assert torch.quantile(errs, ROUTED_QUANTILE).item() <= tol, what
            e = expert_rel_errors(self)
            assert e.numel() > 0, f"{self.name}: no expert call was seen"
            assert e.max().item() <= tol, f"{self.name}/{self.fmt}: expert modules on the reference's inputs and " \
                f"routing: per-token relative errors max {e.max().item():.3g} > {tol:g}"
        else:
            assert errs.max().item() <= tol, what


def _dequantized_into(ref, model, replaced) -> None:
    """ref's layers named in `replaced` get the dequantized weights of model's lowbit modules."""
    with torch.no_grad():
        for name, _ in replaced:
            q, r = model.get_submodule(name), ref.get_submodule(name)
            if isinstance(q, lnn.GptOssExperts):
                def deq(w, s):
                    return torch.ops.lowbit.dequantize(w, s, None, None, "mxfp4")
                r.gate_up_proj.copy_(deq(q.w1, q.w1_scale).transpose(1, 2))
                r.down_proj.copy_(deq(q.w2, q.w2_scale).transpose(1, 2))
            else:
                r.weight.copy_(q.dequantized_weight())


def build_case(name: str, fmt: str, device: str, batch: int = 2, seq: int = 16, seed: int = 0) -> Case:
    """The model with lowbit modules (quantize_model) and its dequantized bf16 twin on `device`."""
    model, cfg = build_model(name, seed)
    model = model.to(device)
    ref = copy.deepcopy(model)
    report = lnn.quantize_model(model, fmt)
    _dequantized_into(ref, model, report.replaced)
    g = torch.Generator().manual_seed(seed + 2)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    out_key = "last_hidden_state" if name == "bert" else "logits"
    inputs = {"input_ids": ids} if name == "bert" else {"input_ids": ids, "use_cache": False}
    return Case(name, fmt, model, ref, report, inputs, out_key)


def token_rel_errors(case: Case) -> torch.Tensor:
    """||y_t - ref_t|| / ||ref_t|| per token t (float64, on the CPU)."""
    with torch.no_grad():
        y = case.run(case.model).double().cpu()
        r = case.run(case.ref).double().cpu()
    y, r = y.reshape(-1, y.shape[-1]), r.reshape(-1, r.shape[-1])
    return (y - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)


def expert_rel_errors(case: Case) -> torch.Tensor:
    """gpt-oss: every expert-module call of the reference forward (transformers' bf16 expert loop)
    replayed on the lowbit module of the same name with the same inputs (hidden states, router
    indices and weights); ||y_t - ref_t|| / ||ref_t|| per token of every call (float64, CPU)."""
    calls = []
    hooks = []
    for name, _ in case.report.replaced:
        if not isinstance(case.model.get_submodule(name), lnn.GptOssExperts):
            continue
        mod = case.ref.get_submodule(name)

        def hook(m, args, kwargs, out, name=name):
            calls.append((name, args, kwargs, out))
        hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            case.run(case.ref)
    finally:
        for h in hooks:
            h.remove()
    errs = []
    with torch.no_grad():
        for name, args, kwargs, out in calls:
            r = (out[0] if isinstance(out, tuple) else out).double().cpu()
            y = case.model.get_submodule(name)(*args, **kwargs)
            y = (y[0] if isinstance(y, tuple) else y).double().cpu()
            y, r = y.reshape(-1, y.shape[-1]), r.reshape(-1, r.shape[-1])
            errs.append((y - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30))
    return torch.cat(errs) if errs else torch.zeros(0, dtype=torch.float64)


def forward_fn(case: Case, which: str) -> Callable[[], torch.Tensor]:
    m = case.model if which == "lowbit" else case.ref

    def fn():
        with torch.no_grad():
            return case.run(m)
    return fn
