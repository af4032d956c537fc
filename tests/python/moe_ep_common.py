"""Shared pieces of the expert-parallel MoE tests (test_moe_ep.py: gloo on the CPU, and NCCL on 2 /
4 / 8 GPUs): the scenarios (layer configurations x routings), the operands every rank builds from
one seed, the spawned worker and the expected drops of a capacity overflow.

Every rank builds the same full operands (E experts, every rank's tokens and routing) from the
seed, runs lowbit.moe.ExpertParallelMoE on its own tokens with its slice of the experts, and
compares with the single-process lowbit.gpt_oss_moe_mlp on the same tokens with all the experts
(on its CPU, or its GPU for the NCCL run). Results go to one JSON file per rank."""

from __future__ import annotations

import json
import os
import socket

import numpy as np

# (name, layer keyword arguments); x dtype bf16 unless "x_dtype" is given
CONFIGS = [
    ("cap-contig-bf16-f32", dict(mode="capacity", expert_layout="contiguous")),
    ("cap-masked-bf16-f32", dict(mode="capacity", expert_layout="masked")),
    ("exact-contig-bf16-f32", dict(mode="exact")),
    ("cap-contig-mxfp8-f32", dict(mode="capacity", act="mxfp8", quantize_dispatch=True)),
    ("cap-masked-mxfp8-bf16", dict(mode="capacity", expert_layout="masked", act="mxfp8", quantize_dispatch=True,
                                   combine_dtype="bfloat16")),
    ("exact-contig-bf16-bf16", dict(mode="exact", combine_dtype="bfloat16")),
    ("cap-contig-x32-f32", dict(mode="capacity", x_dtype="float32", act="mxfp8")),
]
# routings: random (some -1 slots), everything to rank 0's experts (the other ranks receive nothing;
# ids repeat within a token), every slot to the last expert, rank 1 without tokens
ROUTINGS = ["random", "to_rank0", "one_expert", "empty_rank"]
# capacity overflows: (name, layer keyword arguments)
OVERFLOWS = [
    ("overflow-pairs", dict(mode="capacity", expert_layout="contiguous", capacity=9)),
    ("overflow-expert", dict(mode="capacity", expert_layout="masked", expert_capacity=4)),
]

SHAPES = dict(H=64, I=32, E=8, topk=4, T=6)  # CPU (gloo); E divisible by 2 and 4
GPU_SHAPES = dict(H=512, I=256, E=16, topk=4, T=96)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def operands(world, seed, shapes, routing):
    """Full operands: weights of all E experts (lowbit MXFP4, row-major scales), biases, and for
    every rank its tokens x (float32) and routing (ids int32, weights float32)."""
    import lowbit

    H, I, E, k, T = shapes["H"], shapes["I"], shapes["E"], shapes["topk"], shapes["T"]
    rng = np.random.default_rng(seed)
    w1 = lowbit.quantize(rng.standard_normal((E, 2 * I, H), dtype=np.float32) * np.float32(0.25), "mxfp4")
    w2 = lowbit.quantize(rng.standard_normal((E, H, I), dtype=np.float32) * np.float32(0.1), "mxfp4")
    b1 = (rng.standard_normal((E, 2 * I)) * 0.5).astype(np.float32)
    b2 = (rng.standard_normal((E, H)) * 0.5).astype(np.float32)
    ranks = []
    El = E // world
    for r in range(world):
        Tr = T + (r % 3) if not (routing == "empty_rank" and r == 1) else 0
        x = rng.standard_normal((Tr, H), dtype=np.float32)
        perms = np.array([rng.permutation(E)[:k] for _ in range(Tr)], dtype=np.int32).reshape(Tr, k)
        if routing == "random":
            ids = perms
            ids[rng.random((Tr, k)) < 0.2] = -1
        elif routing == "to_rank0":
            ids = rng.integers(0, El, size=(Tr, k)).astype(np.int32)
        elif routing == "one_expert":
            ids = np.full((Tr, k), E - 1, np.int32)
        else:  # empty_rank: random elsewhere
            ids = perms
        wts = rng.random((Tr, k)).astype(np.float32) + np.float32(0.05)
        wts /= wts.sum(axis=1, keepdims=True) if Tr else 1
        ranks.append((x, ids, wts))
    weights = dict(w1=np.asarray(w1.data), w1_scale=np.asarray(w1.scales).view(np.uint8), b1=b1,
                   w2=np.asarray(w2.data), w2_scale=np.asarray(w2.scales).view(np.uint8), b2=b2, quantized=(w1, w2))
    return weights, ranks


def expected_drops(ranks, world, E, capacity=None, expert_capacity=None):
    """Per rank: the boolean [T, k] of pairs a capacity overflow drops (the layer's send order:
    pairs by destination, in token-slot order; receive order: by source rank, then the sender's
    order; rows sorted stably by local expert)."""
    El = E // world
    drop = [np.zeros(ids.shape, bool) for _, ids, _ in ranks]
    arrived = [[] for _ in range(world)]  # per receiver: (src, t, j, local) in arrival order
    for s, (_, ids, _) in enumerate(ranks):
        flat = ids.reshape(-1)
        for d in range(world):
            n = 0
            for p in range(flat.size):
                e = int(flat[p])
                if e < 0 or e // El != d:
                    continue
                t, j = divmod(p, ids.shape[1])
                if capacity is not None and n >= capacity:
                    drop[s][t, j] = True
                else:
                    arrived[d].append((s, t, j, e % El))
                n += 1
    if expert_capacity is not None:
        for d in range(world):
            for le in range(El):
                rows = [a for a in arrived[d] if a[3] == le]
                for s, t, j, _ in rows[expert_capacity:]:
                    drop[s][t, j] = True
    return drop


def _torch_of(torch, a, dev):
    import ml_dtypes

    a = np.ascontiguousarray(a)
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(dev)
    return torch.from_numpy(a.copy()).to(dev)


def scenarios(names=None):
    """[(config name, routing, layer keyword arguments)] of every scenario, or of those named
    "config/routing"."""
    out = [(c, r, kw) for c, kw in CONFIGS for r in ROUTINGS] + [(n, "random", kw) for n, kw in OVERFLOWS]
    return out if names is None else [s for s in out if f"{s[0]}/{s[1]}" in names]


def worker(rank, world, port, backend, out_dir, seed, gpu, names=None):
    """One rank of a run over every scenario: writes out_dir/rank{rank}.json with per scenario
    {bitwise: mismatching elements, err: worst |out - ref| / tolerance, nan_rows_ok, dropped}."""
    import lowbit
    from lowbit.moe import ExpertParallelMoE, set_nvls_env, shard_experts
    import torch
    import torch.distributed as dist

    set_nvls_env()
    dev = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    shapes = GPU_SHAPES if gpu else SHAPES
    E = shapes["E"]
    results = {}
    try:
        for i, (cname, routing, kw) in enumerate(scenarios(names)):
            kw = dict(kw)
            x_dtype = getattr(torch, kw.pop("x_dtype", "bfloat16"))
            weights, ranks = operands(world, seed + i, shapes, routing)
            full = {k: _torch_of(torch, v, dev) for k, v in weights.items() if k != "quantized"}
            local = dict(zip(("w1", "w1_scale", "b1", "w2", "w2_scale", "b2"),
                             shard_experts([full[k] for k in ("w1", "w1_scale", "b1", "w2", "w2_scale", "b2")],
                                           rank, world)))
            x_np, ids_np, wts_np = ranks[rank]
            x = torch.from_numpy(x_np).to(dev).to(x_dtype)
            ids, wts = torch.from_numpy(ids_np).to(dev), torch.from_numpy(wts_np).to(dev)
            T = max(int(r[0].shape[0]) for r in ranks)
            layer = ExpertParallelMoE(local["w1"], local["w1_scale"], local["b1"], local["w2"], local["w2_scale"],
                                      local["b2"], num_experts=E, top_k=shapes["topk"], max_tokens_per_rank=T, **kw)
            out = layer(x, ids, wts)
            act = kw.get("act", "bf16")
            ref = lowbit.gpt_oss_moe_mlp(x, ids, wts, full["w1"], full["w1_scale"], full["b1"], full["w2"],
                                         full["w2_scale"], full["b2"], act=act)
            dropped = layer.check() if "capacity" not in kw and "expert_capacity" not in kw else None
            if dropped is None:
                n = layer.dropped.clone()
                dist.all_reduce(n)
                dropped = int(n.item())
            got = out.float().cpu().numpy().astype(np.float64)
            want = ref.float().cpu().numpy().astype(np.float64)
            res = dict(config=cname, routing=routing, tokens=int(x.shape[0]), dropped=dropped)
            drop = None
            if "capacity" in kw or "expert_capacity" in kw:
                drop = expected_drops(ranks, world, E, kw.get("capacity"), kw.get("expert_capacity"))[rank]
                nan_rows = np.isnan(got).all(axis=1)
                res["nan_rows_ok"] = bool((nan_rows == drop.any(axis=1)).all())
                res["expected_dropped"] = int(sum(d.sum() for d in
                                                  expected_drops(ranks, world, E, kw.get("capacity"),
                                                                 kw.get("expert_capacity"))))
                keep = ~drop.any(axis=1)
                got, want = got[keep], want[keep]
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            res["bitwise"] = int((~same).sum())
            res["elements"] = int(same.size)
            res["err"] = 0.0
            if res["bitwise"]:  # the bf16-term bound: 2^-8 sum_j |w_j o_j| + one ulp of the output at ref
                o_abs = _term_bound(lowbit, torch, x, ids, wts, full, act, drop, dev)
                tol = 2.0 ** -8 * o_abs + _ulp(want, out.dtype == torch.bfloat16)
                if gpu:  # both sides' fp32 summation-order deviations (test_moe_gpu_mlp's rule, twice)
                    from test_moe_gpu_mlp import _mlp_tolerance

                    args = dict(x=x.float().cpu().numpy(), topk_ids=ids_np, topk_weights=wts_np, b1=weights["b1"],
                                b2=weights["b2"])
                    mt = 2 * _mlp_tolerance(args, weights["quantized"], act, 1.702, 7.0)
                    tol = tol + (mt if drop is None else mt[~drop.any(axis=1)])
                res["err"] = float(np.max(np.abs(got - want) / tol))
            results[f"{cname}/{routing}"] = res
    except BaseException:  # the other ranks are stopped by the spawner (a barrier here would hang)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        raise
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _ulp(v, bf16):
    r = np.abs(v)
    e = np.frexp(np.where(np.isfinite(r) & (r > 0), r, 1.0))[1] - 1
    p, emin = (7, -126) if bf16 else (23, -126)
    return np.ldexp(1.0, np.maximum(e, emin) - p)


def _term_bound(lowbit, torch, x, ids, wts, full, act, drop, dev):
    """sum_j |w_j o_j| per output element, o_j the unweighted expert term (gpt_oss_moe_mlp of one
    slot at weight 1)."""
    T, k = ids.shape
    acc = np.zeros((T, x.shape[1]))
    for j in range(k):
        one = torch.ones((T, 1), dtype=torch.float32, device=dev)
        o = lowbit.gpt_oss_moe_mlp(x, ids[:, j:j + 1], one, full["w1"], full["w1_scale"], full["b1"], full["w2"],
                                   full["w2_scale"], full["b2"], act=act, out_dtype="float32")
        acc += np.abs(wts[:, j:j + 1].cpu().numpy().astype(np.float64) * o.cpu().numpy().astype(np.float64))
    if drop is not None:
        acc = acc[~drop.any(axis=1)]
    return acc


def run(world, backend, out_dir, seed=0, gpu=False, names=None):
    """Spawns the `world` ranks (torch.multiprocessing, NVLink multicast off in their environment)
    and returns {scenario: [per-rank results]} (names: the scenarios to run, default all)."""
    import torch.multiprocessing as mp

    from lowbit.moe import set_nvls_env

    set_nvls_env()  # inherited by the spawned ranks
    mp.spawn(worker, args=(world, free_port(), backend, out_dir, seed, gpu, names), nprocs=world, join=True)
    merged = {}
    for r in range(world):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            for k, v in json.load(f).items():
                merged.setdefault(k, []).append(v)
    return merged
