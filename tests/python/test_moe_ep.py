"""lowbit.moe.ExpertParallelMoE (docs/moe_ep.md) against the single-process gpt_oss_moe_mlp on the
same tokens, routing ids and weights.

CPU (every CI run): 2 and 4 ranks spawned on 127.0.0.1 with the gloo backend (its
all_to_all_single, with and without split sizes, on uint8 rows), the experts on lowbit's CPU
reference; one spawn per world size runs every scenario (moe_ep_common.CONFIGS x ROUTINGS, and the
capacity overflows). The agreement rule: with combine_dtype="float32" bit for bit (the layer
computes every rounding of gpt_oss_moe_mlp in its order; MXFP8 dispatch against act="mxfp8");
with combine_dtype="bfloat16" |out - ref| <= 2^-8 sum_j |w_j o_j| + one ulp of bf16 at ref (each
expert term rounded to bf16 before the weighting). Overflows: exactly the tokens that lose a pair
are NaN (the expected drops recomputed here from every rank's routing), the others bit for bit,
and the group's drop count equals the expected one.

GPU (-m gpu): the same scenarios over NCCL on 2, 4 and 8 GPUs (skipped where fewer are visible),
against the single-GPU gpt_oss_moe_mlp: within the bf16-term rule above (the expert GEMMs' fp32
sums run in an order that depends on the rows of each call), the bit-identical share reported.

Also in-process: one rank without a process group (bit for bit, every mode), the router against
transformers' GptOssTopKRouter, the NVLink-multicast environment, argument errors."""

import os

import numpy as np
import pytest

import moe_ep_common as C

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import lowbit  # noqa: E402
from lowbit.moe import NVLS_ENV, ExpertParallelMoE, expert_range, route, set_nvls_env, shard_experts  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

SCENARIOS = [f"{c}/{r}" for c, r, _ in C.scenarios()]
# 4 ranks on the CPU: a subset (4 processes share CI's 2 cores), every layout, mode and dispatch
SCENARIOS_4 = [s for s in SCENARIOS if s.split("/")[1] in ("random", "one_expert", "empty_rank")
               and not s.startswith(("exact-contig-bf16-bf16", "cap-contig-x32"))]
_RUNS = {}


def _results(world, backend, gpu, tmp_path_factory, names=None):
    key = (world, backend)
    if key not in _RUNS:  # one spawn per world size; a failed run fails every test of it at once
        d = tmp_path_factory.mktemp(f"ep_{backend}_{world}")
        try:
            _RUNS[key] = C.run(world, backend, str(d), seed=11, gpu=gpu, names=names)
        except Exception as e:  # noqa: BLE001
            _RUNS[key] = e
    if isinstance(_RUNS[key], Exception):
        raise AssertionError(f"the {world}-rank {backend} run failed: {_RUNS[key]}")
    return _RUNS[key]


def _check(results, scenario, gpu):
    per_rank = results[scenario]
    cname = scenario.split("/")[0]
    kw = dict(C.CONFIGS + C.OVERFLOWS)[cname]
    overflow = "capacity" in kw or "expert_capacity" in kw
    assert sum(r["tokens"] for r in per_rank) > 0 or scenario.endswith("empty_rank")
    for rank, r in enumerate(per_rank):
        where = f"{scenario} rank {rank}"
        if overflow:
            assert r["nan_rows_ok"], f"{where}: NaN rows are not exactly the tokens that lost a pair"
            assert r["dropped"] == r["expected_dropped"] > 0, f"{where}: dropped {r['dropped']}, expected " \
                                                              f"{r['expected_dropped']}"
        else:
            assert r["dropped"] == 0, f"{where}: {r['dropped']} pairs dropped"
        exact = kw.get("combine_dtype", "float32") == "float32" and not gpu
        if exact:
            assert r["bitwise"] == 0, f"{where}: {r['bitwise']} of {r['elements']} outputs differ from " \
                                      f"gpt_oss_moe_mlp (bit for bit expected)"
        else:
            assert r["err"] <= 1.0, f"{where}: error {r['err']:.3g} x the tolerance (bitwise equal: " \
                                    f"{r['elements'] - r['bitwise']} of {r['elements']})"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ep_gloo_2_ranks(scenario, tmp_path_factory):
    _check(_results(2, "gloo", False, tmp_path_factory), scenario, gpu=False)


@pytest.mark.parametrize("scenario", SCENARIOS_4)
def test_ep_gloo_4_ranks(scenario, tmp_path_factory):
    _check(_results(4, "gloo", False, tmp_path_factory, SCENARIOS_4), scenario, gpu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_ep_nccl_matches_single_gpu(world, scenario, tmp_path_factory):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, {torch.cuda.device_count()} visible")
    _check(_results(world, "nccl", True, tmp_path_factory), scenario, gpu=True)


# ---------------------------------------------------------------------------------------------
# in-process

def _full(seed=3, routing="random"):
    w, ranks = C.operands(1, seed, C.SHAPES, routing)
    full = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in w.items() if k != "quantized"}
    x, ids, wts = (torch.from_numpy(a) for a in ranks[0])
    return full, x.bfloat16(), ids, wts


def _layer(full, **kw):
    kw.setdefault("max_tokens_per_rank", 64)
    return ExpertParallelMoE(full["w1"], full["w1_scale"], full["b1"], full["w2"], full["w2_scale"], full["b2"],
                             num_experts=C.SHAPES["E"], **kw)


def _ref(full, x, ids, wts, act="bf16"):
    return lowbit.gpt_oss_moe_mlp(x, ids, wts, full["w1"], full["w1_scale"], full["b1"], full["w2"],
                                  full["w2_scale"], full["b2"], act=act)


@pytest.mark.parametrize("kw", [dict(), dict(expert_layout="masked"), dict(mode="exact"),
                                dict(act="mxfp8", quantize_dispatch=True),
                                dict(expert_layout="masked", act="mxfp8", quantize_dispatch=True, expected_m=2)],
                         ids=["contig", "masked", "exact", "mxfp8", "masked-mxfp8"])
def test_one_rank_bit_for_bit(kw):
    """Without a process group the layer runs every expert on its rank; fp32 combine: the bits of
    gpt_oss_moe_mlp, int64 ids too."""
    assert not dist.is_initialized()
    full, x, ids, wts = _full()
    layer = _layer(full, **kw)
    out = layer(x, ids.long(), wts)
    ref = _ref(full, x, ids, wts, kw.get("act", "bf16"))
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert layer.check() == 0


def test_router_matches_transformers():
    """route() is transformers' GptOssTopKRouter: the same ids, the same weights (bf16 softmax)."""
    mod = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    cfg = type("Cfg", (), dict(num_experts_per_tok=4, num_local_experts=8, hidden_size=64))()
    router = mod.GptOssTopKRouter(cfg).to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 64, generator=g))
        router.bias.copy_(torch.randn(8, generator=g))
        x = torch.randn(13, 64, generator=g).bfloat16()
        _, scores, idx = router(x)
    ids, w = route(x, router.weight.detach(), router.bias.detach(), 4)
    assert torch.equal(ids.long(), idx) and ids.dtype == torch.int32
    assert torch.equal(w, scores.float())


def test_router_in_the_layer():
    full, x, _, _ = _full()
    g = torch.Generator().manual_seed(9)
    rw, rb = torch.randn(8, 64, generator=g).bfloat16(), torch.randn(8, generator=g).bfloat16()
    out = _layer(full, router_weight=rw, router_bias=rb)(x)
    ids, w = route(x, rw, rb, 4)
    assert torch.equal(out.view(torch.int16), _ref(full, x, ids, w).view(torch.int16))


def test_overflow_nan_and_raise():
    """A capacity below the routing's needs: the tokens that lost a pair are NaN, the others exact,
    `dropped` counts the pairs; on_overflow="raise" raises after the step."""
    full, x, ids, wts = _full(routing="one_expert")
    layer = _layer(full, capacity=5)
    out = layer(x, ids, wts)
    lost = C.expected_drops([(None, ids.numpy(), None)], 1, C.SHAPES["E"], capacity=5)[0]
    nan_rows = torch.isnan(out.float()).all(dim=1).numpy()
    assert (nan_rows == lost.any(axis=1)).all() and lost.any()
    keep = torch.from_numpy(~lost.any(axis=1))
    assert torch.equal(out[keep].view(torch.int16), _ref(full, x, ids, wts)[keep].view(torch.int16))
    assert int(layer.dropped) == int(lost.sum())
    with pytest.raises(RuntimeError, match="exceeded the capacity"):
        layer.check()
    with pytest.raises(RuntimeError, match="exceeded the capacity"):
        _layer(full, capacity=5, on_overflow="raise")(x, ids, wts)


def test_nvls_env():
    env = {"NCCL_NVLS_ENABLE": "1"}
    assert set_nvls_env(env) is env and env == {**NVLS_ENV}
    assert NVLS_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    old = {k: os.environ.get(k) for k in NVLS_ENV}
    try:
        set_nvls_env()
        assert all(os.environ[k] == v for k, v in NVLS_ENV.items())
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_sharding():
    assert expert_range(128, 3, 8) == (48, 64)
    a = torch.arange(8 * 3).reshape(8, 3)
    assert torch.equal(shard_experts([a], 1, 4)[0], a[2:4])
    with pytest.raises(ValueError, match="argument 'num_experts'"):
        expert_range(10, 0, 4)


def test_argument_errors():
    full, x, ids, wts = _full()
    cases = [
        (dict(mode="bogus"), "argument 'mode'"),
        (dict(act="mxfp8", quantize_dispatch=False, combine_dtype="f16"), "argument 'combine_dtype'"),
        (dict(quantize_dispatch=True), "argument 'quantize_dispatch'"),
        (dict(mode="exact", expert_layout="masked"), "argument 'expert_layout'"),
        (dict(max_tokens_per_rank=None), "argument 'max_tokens_per_rank'"),
        (dict(top_k=0), "argument 'top_k'"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            _layer(full, **kw)
    with pytest.raises(ValueError, match="argument 'w1'"):
        ExpertParallelMoE(full["w1"][:3], full["w1_scale"][:3], full["b1"][:3], full["w2"][:3], full["w2_scale"][:3],
                          full["b2"][:3], num_experts=8, max_tokens_per_rank=4)
    layer = _layer(full, max_tokens_per_rank=2)
    with pytest.raises(ValueError, match="argument 'x'"):
        layer(x, ids, wts)
    with pytest.raises(ValueError, match="argument 'topk_ids'"):
        _layer(full)(x)
    bad = ids.clone()
    bad[0, 0] = 8
    with pytest.raises(ValueError, match="argument 'topk_ids'"):
        _layer(full)(x, bad, wts)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(), dict(expert_layout="masked", expected_m=2),
                                dict(act="mxfp8", quantize_dispatch=True, combine_dtype="bfloat16")],
                         ids=["contig", "masked", "mxfp8"])
def test_capacity_step_in_a_cuda_graph(kw):
    """Capacity mode has no host synchronisation: one rank's step (all experts, no process group)
    is captured in a CUDA graph and replayed on new tokens and routing written into the captured
    inputs; each replay equals the eager step, bit for bit."""
    full, x, ids, wts = _full(seed=21)
    dev = torch.device("cuda")
    full = {k: v.to(dev) for k, v in full.items()}
    layer = _layer(full, max_tokens_per_rank=int(x.shape[0]), **kw)
    xs, idss, wtss = x.to(dev), ids.to(dev), wts.to(dev)
    layer(xs, idss, wtss)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = layer(xs, idss, wtss)
    for seed in (22, 23):
        _, x2, ids2, wts2 = _full(seed=seed)
        xs.copy_(x2.to(dev))
        idss.copy_(ids2.to(dev))
        wtss.copy_(wts2.to(dev))
        g.replay()
        eager = layer(xs, idss, wtss)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), eager.view(torch.int16)), f"replay {seed} differs from eager"
    assert layer.check() == 0
