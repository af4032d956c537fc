"""lowbit.moe: the gpt-oss MoE layer with expert parallelism over torch.distributed
(docs/moe_ep.md).

Each rank of a process group holds E / world of the experts (rank r: experts
r * E_local .. (r + 1) * E_local - 1). A step on each rank's own tokens:

  1. route     router top-k (route(): softmax over the k largest logits, as gpt-oss does), or
               the caller's topk_ids / topk_weights;
  2. dispatch  every (token, slot) pair is sent to the rank of its expert with
               dist.all_to_all_single: one row per pair holding the local expert id and the
               token's activations (bf16 / fp32 bytes, or MXFP8 E4M3 codes + UE8M0 scales when
               quantize_dispatch=True: 0.52x the bytes of bf16 at H = 2880);
  3. experts   the receiving rank sorts its rows by local expert and runs
               lowbit.gpt_oss_expert_mlp on them, in the contiguous layout (rows sorted by
               expert + counts) or the masked one ([E_local, expert_capacity, H] + counts); MXFP8
               rows go to the kernels' MXFP8 path as they arrived;
  4. combine   the unweighted expert outputs o travel back (all_to_all_single, combine_dtype) and
               each token's output is  out[t] = sum_j topk_weights[t, j] * o[t, j]  in fp32,
               j = 0 .. k-1 in order, skipped slots (id -1) adding nothing, rounded once to the
               output dtype: gpt_oss_moe_mlp's order.

Agreement with the single-process gpt_oss_moe_mlp on the same tokens, ids and weights: with
combine_dtype="float32" the layer computes every rounding step of that op's definition in the
same order (act() of x, the two GEMMs per (row, expert), the weighted sum), so on the CPU
reference it is bit for bit equal to it (tested with gloo, every mode); with MXFP8 dispatch too,
against gpt_oss_moe_mlp(act="mxfp8") (the dispatched MXFP8 values are exactly act(x)). With
combine_dtype="bfloat16" each o is rounded to bf16 before the weighting:
|out - ref| <= 2^-8 sum_j |w_j o_j| + one ulp of the output dtype at ref. On the GPU the expert
GEMMs sum in fp32 in an order that depends on the tile and split-K, chosen from the rows of each
call, so the layer and the single-GPU op agree within the MLP tests' fp32 summation rule, not bit
for bit.

Two modes:
  mode="capacity"  every rank pair exchanges a fixed `capacity` rows (default: max_tokens_per_rank
                   x top_k, which no routing can exceed), so every split size is
                   static: no host synchronisation, the step can be captured in a CUDA graph.
                   The default capacity, max_tokens_per_rank x top_k, holds any routing.
                   Pairs beyond the capacity (a smaller capacity given) or beyond the masked
                   layout's expert_capacity are dropped, never silently: each token that loses a
                   pair gets NaN in its whole output row, `dropped` counts them on the device, and
                   on_overflow="raise" checks it after the step (a host synchronisation) and raises.
  mode="exact"     the per-rank counts are exchanged first and read on the host (one
                   synchronisation per step, not capturable); exactly the routed rows travel.

Keep NVLink multicast off in any process that uses NCCL here: set_nvls_env() sets
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (before the process
group is created). The layer also runs on CPU tensors with the gloo backend (the CPU reference
experts), which is how it is tested without GPUs.
"""

from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .gemm import gpt_oss_expert_mlp

__all__ = ["NVLS_ENV", "set_nvls_env", "route", "expert_range", "shard_experts", "ExpertParallelMoE"]

#: The environment that keeps NVLink multicast (NVLS) off: NCCL's NVLS algorithms, torch's
#: symmetric-memory multicast, NVSHMEM's NVLS.
NVLS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_HEADER = 16  # bytes before a dispatched row's payload: the local expert id (int32), padding
_ALIGN = 16   # dispatched rows are padded to a multiple of this many bytes


def set_nvls_env(env=None) -> Dict[str, str]:
    """Sets NVLS_ENV in `env` (default os.environ; a dict given for a child process is updated)
    and returns it. Call it before torch.distributed creates its NCCL communicators."""
    env = os.environ if env is None else env
    env.update(NVLS_ENV)
    return env


def route(x, router_weight, router_bias, top_k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss routing: logits = x @ router_weight^T + router_bias (in x's dtype), the top_k
    largest logits per token (torch.topk), softmax over those k values (in the logits' dtype, as
    transformers' GptOssTopKRouter). Returns (topk_ids int32 [T, k], topk_weights float32 [T, k])."""
    logits = F.linear(x, router_weight, router_bias)
    vals, idx = torch.topk(logits, top_k, dim=-1)
    weights = F.softmax(vals, dim=1, dtype=vals.dtype)
    return idx.to(torch.int32), weights.float()


def expert_range(num_experts: int, rank: int, world: int) -> Tuple[int, int]:
    """The experts [first, last) that rank `rank` of `world` holds (num_experts % world == 0)."""
    if world <= 0 or num_experts % world != 0:
        raise ValueError(f"expert_range: argument 'num_experts': {num_experts} experts do not split evenly over "
                         f"{world} ranks")
    n = num_experts // world
    return rank * n, (rank + 1) * n


def shard_experts(tensors, rank: int, world: int):
    """The slices [first:last] (expert_range over the first dimension) of each tensor in `tensors`
    (expert weights, scales, biases: [E, ...]); a list in the same order."""
    out = []
    for t in tensors:
        a, b = expert_range(int(t.shape[0]), rank, world)
        out.append(t[a:b])
    return out


class _Phases:
    """Per-step times of the phases the layer records (the all-to-alls): CUDA events on CUDA
    tensors (read after a synchronisation: elapsed(), ms), the host clock around them on the CPU."""

    def __init__(self):
        self.marks: List[Tuple[str, object, object]] = []

    def begin(self, cuda: bool):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def end(self, name: str, start, cuda: bool):
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, start, ev))
        else:
            self.marks.append((name, start, time.perf_counter()))

    def elapsed_ms(self) -> Dict[str, float]:
        """Milliseconds per phase name, summed over the marks (CUDA: the caller synchronises)."""
        out: Dict[str, float] = {}
        for name, a, b in self.marks:
            ms = a.elapsed_time(b) if hasattr(a, "elapsed_time") else (b - a) * 1e3
            out[name] = out.get(name, 0.0) + ms
        return out

    def clear(self):
        self.marks.clear()


class ExpertParallelMoE:
    """The gpt-oss MoE layer (experts only, or with its router) with the experts spread over the
    ranks of a torch.distributed process group (module docstring, docs/moe_ep.md).

    w1, w1_scale, b1, w2, w2_scale, b2: THIS rank's experts (shard_experts of the full
    [E, ...] tensors; gpt_oss_expert_mlp's layouts, ``packed`` for prepacked weights).
    num_experts: E over all ranks (E % world == 0). top_k: slots per token.
    act: "bf16" or "mxfp8" (gpt_oss_moe_mlp's act()). quantize_dispatch: send MXFP8 E4M3 codes +
    UE8M0 scales (lowbit.mxfp8_quantize) instead of the activations; needs act="mxfp8", whose
    act(x) is exactly those values. combine_dtype: "float32" (the exact order of
    gpt_oss_moe_mlp) or "bfloat16" (half the combine bytes). mode: "capacity" (static splits,
    CUDA-graph capturable) or "exact" (counts exchanged and read on the host first).
    max_tokens_per_rank: the most tokens a rank passes in one step (capacity mode; required there).
    capacity: rows per rank pair (default max_tokens_per_rank x top_k: never exceeded; with
    distinct ids per token, as top-k routing gives, max_tokens_per_rank x min(top_k, E_local)
    suffices). expert_layout: "contiguous" or "masked" (capacity mode) for the local MLP;
    expert_capacity: the masked layout's rows per local expert (default world x capacity: never
    exceeded). expected_m: the masked layout's tile-size hint. on_overflow: "nan" (dropped pairs
    make their tokens' rows NaN and are counted in `dropped`) or "raise" (also checked after each
    step: a host synchronisation). router_weight / router_bias: the router (gpt-oss: [E, H], [E]),
    used when forward() gets no topk_ids. group: the process group (default: the world; None
    without an initialised process group runs on one rank). out_dtype: default x's dtype.
    """

    def __init__(self, w1, w1_scale, b1, w2, w2_scale, b2, *, num_experts: int, top_k: int = 4, group=None,
                 act: str = "bf16", quantize_dispatch: bool = False, combine_dtype: str = "float32",
                 mode: str = "capacity", max_tokens_per_rank: Optional[int] = None, capacity: Optional[int] = None,
                 expert_layout: str = "contiguous", expert_capacity: Optional[int] = None, expected_m: int = 0,
                 on_overflow: str = "nan", alpha: float = 1.702, limit: float = 7.0, packed: bool = False,
                 router_weight=None, router_bias=None, out_dtype=None):
        op = "ExpertParallelMoE"
        if dist.is_available() and dist.is_initialized():
            self.group = group if group is not None else dist.group.WORLD
            self.world = dist.get_world_size(self.group)
            self.rank = dist.get_rank(self.group)
        else:
            self.group, self.world, self.rank = None, 1, 0
        if num_experts <= 0 or num_experts % self.world != 0:
            raise ValueError(f"{op}: argument 'num_experts': {num_experts} experts do not split evenly over "
                             f"{self.world} ranks")
        self.num_experts = int(num_experts)
        self.e_local = self.num_experts // self.world
        if int(w1.shape[0]) != self.e_local:
            raise ValueError(f"{op}: argument 'w1': expected this rank's {self.e_local} experts "
                             f"(shard_experts of the [{self.num_experts}, ...] weights), got {int(w1.shape[0])}")
        self.top_k = int(top_k)
        if self.top_k <= 0:
            raise ValueError(f"{op}: argument 'top_k': expected a positive count, got {top_k}")
        choices = {"act": (act, ("bf16", "mxfp8")), "combine_dtype": (combine_dtype, ("float32", "bfloat16")),
                   "mode": (mode, ("capacity", "exact")), "expert_layout": (expert_layout, ("contiguous", "masked")),
                   "on_overflow": (on_overflow, ("nan", "raise"))}
        for arg, (v, ok) in choices.items():
            if v not in ok:
                raise ValueError(f"{op}: argument '{arg}': expected one of {', '.join(ok)}, got {v!r}")
        if quantize_dispatch and act != "mxfp8":
            raise ValueError(f"{op}: argument 'quantize_dispatch': MXFP8 dispatch needs act='mxfp8' (the experts "
                             f"then see exactly act(x)); got act={act!r}")
        if mode == "exact" and expert_layout == "masked":
            raise ValueError(f"{op}: argument 'expert_layout': the exact mode runs the contiguous layout (the masked "
                             f"layout's capacity is a static size: mode='capacity')")
        if mode == "capacity":
            if max_tokens_per_rank is None or int(max_tokens_per_rank) < 0:
                raise ValueError(f"{op}: argument 'max_tokens_per_rank': is required in capacity mode (the most "
                                 f"tokens one rank passes in one step)")
            self.max_tokens = int(max_tokens_per_rank)
            default_cap = self.max_tokens * self.top_k  # every slot of every token to one rank
            self.capacity = default_cap if capacity is None else int(capacity)
            if self.capacity < 0:
                raise ValueError(f"{op}: argument 'capacity': expected rows >= 0, got {capacity}")
            self.expert_capacity = self.world * self.capacity if expert_capacity is None else int(expert_capacity)
            if self.expert_capacity < 0:
                raise ValueError(f"{op}: argument 'expert_capacity': expected rows >= 0, got {expert_capacity}")
        else:
            self.max_tokens = self.capacity = self.expert_capacity = None
        self.act, self.quantize_dispatch, self.combine_dtype = act, bool(quantize_dispatch), combine_dtype
        self.mode, self.expert_layout, self.on_overflow = mode, expert_layout, on_overflow
        self.expected_m = int(expected_m)
        self.alpha, self.limit, self.packed = float(alpha), float(limit), bool(packed)
        self.weights = (w1, w1_scale, b1, w2, w2_scale, b2)
        self.router_weight, self.router_bias = router_weight, router_bias
        self.out_dtype = out_dtype
        self.dropped = torch.zeros((), dtype=torch.int64, device=w1.device)
        self.phases: Optional[_Phases] = None  # set to _Phases() to record the all-to-alls' times

    # -- pieces ---------------------------------------------------------------------------------
    def record_phases(self, on: bool = True) -> Optional[_Phases]:
        """Starts (or stops) recording the all-to-alls' times (phases.elapsed_ms() after a sync)."""
        self.phases = _Phases() if on else None
        return self.phases

    def _a2a(self, name, out, inp, out_splits=None, in_splits=None):
        if self.world == 1:
            out.copy_(inp)
            return out
        ph = self.phases
        start = ph.begin(out.is_cuda) if ph is not None else None
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        if ph is not None:
            ph.end(name, start, out.is_cuda)
        return out

    def _payload(self, x):
        """(payload bytes [T, P] uint8, P): the rows a token sends (bf16 / fp32 bytes, or MXFP8
        codes followed by their scale bytes)."""
        T, H = int(x.shape[0]), int(x.shape[1])
        P = H + H // 32 if self.quantize_dispatch else H * x.element_size()
        if T == 0:
            return torch.empty((0, P), dtype=torch.uint8, device=x.device), P
        if self.quantize_dispatch:
            from .ops import mxfp8_quantize

            q, s = mxfp8_quantize(x)  # RCEIL E4M3, row-major scales [T, H/32]
            q8, s8 = q.view(torch.uint8), s.view(torch.uint8).reshape(int(q.shape[0]), -1)
            return torch.cat([q8, s8], dim=1), int(q8.shape[1] + s8.shape[1])
        return x.contiguous().view(torch.uint8).reshape(T, P), P

    def _expert_inputs(self, rows, H, perm):
        """x (and x_scale) of gpt_oss_expert_mlp from received rows [R, row_bytes] (uint8), taken in
        the order perm (one gather per operand, straight out of the received rows)."""
        pay = rows[:, _HEADER:]
        if self.quantize_dispatch:
            codes = pay[:, :H][perm].view(torch.float8_e4m3fn)
            scales = pay[:, H:H + H // 32][perm]
            return codes, scales
        dt = self._x_dtype
        n = H * torch.empty((), dtype=dt).element_size()
        return pay[:, :n][perm].view(dt), None

    def _run_experts(self, x_rows, x_scale, counts):
        w1, w1s, b1, w2, w2s, b2 = self.weights
        odt = torch.float32 if self.combine_dtype == "float32" else torch.bfloat16
        return gpt_oss_expert_mlp(x_rows, counts, w1, w1s, b1, w2, w2s, b2, x_scale=x_scale, alpha=self.alpha,
                                  limit=self.limit, act=self.act, out_dtype=odt, packed=self.packed,
                                  expected_m=self.expected_m)

    # -- the step -------------------------------------------------------------------------------
    def forward(self, x, topk_ids=None, topk_weights=None):
        """out [T, H] for this rank's tokens x [T, H] (bf16 / fp32). topk_ids (int32 / int64,
        -1 skips a slot) and topk_weights (float32) [T, top_k] route the tokens; without them the
        router (router_weight / router_bias) does. Every rank of the group must call it (with its
        own T; capacity mode: T <= max_tokens_per_rank)."""
        op = "ExpertParallelMoE"
        if x.dim() != 2:
            raise ValueError(f"{op}: argument 'x': expected [T, H], got shape {tuple(x.shape)}")
        T, H = int(x.shape[0]), int(x.shape[1])
        dev = x.device
        if topk_ids is None:
            if self.router_weight is None:
                raise ValueError(f"{op}: argument 'topk_ids': is required without a router (router_weight)")
            topk_ids, topk_weights = route(x, self.router_weight, self.router_bias, self.top_k)
        if topk_weights is None:
            raise ValueError(f"{op}: argument 'topk_weights': is required with topk_ids")
        if tuple(topk_ids.shape) != (T, self.top_k) or tuple(topk_weights.shape) != (T, self.top_k):
            raise ValueError(f"{op}: argument 'topk_ids': expected [{T}, {self.top_k}] ids and weights, got "
                             f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
        if self.mode == "capacity" and T > self.max_tokens:
            raise ValueError(f"{op}: argument 'x': {T} tokens exceed max_tokens_per_rank = {self.max_tokens}")
        self._x_dtype = x.dtype
        k, W, El = self.top_k, self.world, self.e_local
        ids = topk_ids.reshape(-1).to(torch.int64)
        if not ids.is_cuda and ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= self.num_experts):
            raise ValueError(f"{op}: argument 'topk_ids': expert ids must lie in [-1, {self.num_experts})")
        valid = (ids >= 0) & (ids < self.num_experts)  # device ids outside the range skip their slot
        e = torch.where(valid, ids, torch.zeros_like(ids))
        dest = torch.where(valid, e // El, torch.full_like(ids, W))  # W: sent nowhere
        local = (e % El).to(torch.int32)

        # send order: pairs by destination rank (stable: token-slot order within a destination)
        order = torch.argsort(dest, stable=True)
        per_dest = torch.zeros(W + 1, dtype=torch.int64, device=dev).scatter_add_(0, dest, torch.ones_like(dest))
        start = torch.cumsum(per_dest, 0) - per_dest
        pos_sorted = torch.arange(order.numel(), device=dev) - start[dest[order]]
        pos = torch.empty_like(pos_sorted).scatter_(0, order, pos_sorted)  # each pair's row within its destination

        payload, P = self._payload(x)
        row_bytes = -(-(_HEADER + P) // _ALIGN) * _ALIGN
        pair_tok = torch.arange(T * k, device=dev) // k

        if self.mode == "capacity":
            C = self.capacity
            sent = valid & (pos < C)
            slot = torch.where(sent, dest * C + pos, torch.full_like(pos, W * C))  # W * C: the discard row
            # rows no pair fills carry expert -1 and are never read past their header (they sort
            # after every expert's rows, beyond the counts), so only the headers are initialised
            send = torch.empty((W * C + 1, row_bytes), dtype=torch.uint8, device=dev)
            send[:, :4].view(torch.int32).fill_(-1)
            send[slot, _HEADER:_HEADER + P] = payload[pair_tok]
            send[slot, :4] = local.view(torch.uint8).reshape(-1, 4)
            send = send[: W * C]
            recv = torch.empty_like(send)
            self._a2a("dispatch", recv, send)
            in_splits = out_splits = None
            back_row = slot
        else:
            n_send = per_dest[:W]
            send = torch.zeros((int(order.numel()), row_bytes), dtype=torch.uint8, device=dev)
            send[:, _HEADER:_HEADER + P] = payload[pair_tok[order]]
            send[:, :4] = local[order].view(torch.uint8).reshape(-1, 4)
            n_recv = torch.empty_like(n_send)
            self._a2a("dispatch_counts", n_recv, n_send)
            in_splits, out_splits = n_send.tolist(), n_recv.tolist()  # the host synchronisation of this mode
            sent = valid
            send = send[: sum(in_splits)]
            recv = torch.empty((sum(out_splits), row_bytes), dtype=torch.uint8, device=dev)
            self._a2a("dispatch", recv, send, out_splits, in_splits)
            back_row = torch.empty_like(pos).scatter_(0, order, torch.arange(order.numel(), device=dev))

        o_recv = self._local_experts(recv, H)
        back = torch.empty_like(o_recv) if self.mode == "capacity" else \
            torch.empty((sum(in_splits), H), dtype=o_recv.dtype, device=dev)
        self._a2a("combine", back.view(torch.uint8), o_recv.view(torch.uint8), in_splits, out_splits)

        # weighted sum in slot order (fp32), as gpt_oss_moe_mlp: acc = ((0 + w0 o0) + w1 o1) + ...
        # with the term of a pair that was dropped (valid, not sent) NaN and of an empty slot 0. The
        # gather takes those from two extra rows (NaN, 0) and the weight of an empty slot is 0, so
        # each term is one product: w NaN = NaN, 0 x 0 = +0, the same values as the selections.
        B = int(back.shape[0])
        # (both rows filled on the device: a tensor made from host data would be a host-to-device
        # copy, which a CUDA-graph capture refuses)
        rows = torch.cat([back, torch.full((1, H), float("nan"), dtype=back.dtype, device=dev),
                          torch.zeros((1, H), dtype=back.dtype, device=dev)])
        src = torch.where(sent, back_row, torch.where(valid, torch.full_like(back_row, B), torch.full_like(back_row, B + 1)))
        o = rows[src].float().reshape(T, k, H)
        w = torch.where(valid.reshape(T, k), topk_weights.float(), torch.zeros((), device=dev))
        acc = torch.zeros((T, H), dtype=torch.float32, device=dev)
        for j in range(k):
            acc += w[:, j:j + 1] * o[:, j, :]
        lost = (valid & ~sent).sum()
        self.dropped += lost
        if self.on_overflow == "raise":
            self.check()
        return acc.to(self.out_dtype if self.out_dtype is not None else x.dtype)

    __call__ = forward

    def _local_experts(self, recv, H):
        """Unweighted expert outputs [R, H] (combine_dtype) of the received rows [R, row_bytes], in
        their received order: rows sorted by local expert, the expert MLP, back to that order.
        Rows without an expert (-1: padding) are left unset (forward reads no such row), rows the
        masked layout could not hold NaN."""
        dev = recv.device
        El = self.e_local
        R = int(recv.shape[0])
        rid = recv[:, :4].view(torch.int32).reshape(-1).to(torch.int64)
        key = torch.where(rid >= 0, rid, torch.full_like(rid, El))
        perm = torch.argsort(key, stable=True)
        per_e = torch.zeros(El + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
        odt = torch.float32 if self.combine_dtype == "float32" else torch.bfloat16
        if R == 0:
            return torch.empty((0, H), dtype=odt, device=dev)
        x_all, s_all = self._expert_inputs(recv, H, perm)
        if self.expert_layout == "contiguous":
            out = self._run_experts(x_all, s_all, per_e[:El].to(torch.int32))
            # the padding rows sort last and are not written by the MLP: their outputs are left
            # unset here too (they travel back, but forward never reads a row no pair was sent in)
            o_recv = torch.empty((R, H), dtype=odt, device=dev)
            o_recv[perm] = out
            return o_recv
        o_recv = torch.empty((R, H), dtype=odt, device=dev)
        # masked: row r of expert e at e * cap + (its rank among expert e's rows)
        cap = self.expert_capacity
        ks = key[perm]
        start = torch.cumsum(per_e, 0) - per_e
        within = torch.arange(R, device=dev) - start[ks]
        held = (ks < El) & (within < cap)
        dst = torch.where(held, ks * cap + within, torch.full_like(within, El * cap))  # El * cap: discard row
        xm = torch.empty((El * cap + 1,) + tuple(x_all.shape[1:]), dtype=x_all.dtype, device=dev)
        xm[dst] = x_all
        sm = None
        if s_all is not None:
            sm = torch.empty((El * cap + 1, int(s_all.shape[1])), dtype=s_all.dtype, device=dev)
            sm[dst] = s_all
            sm = sm[: El * cap].reshape(El, cap, -1)
        counts = torch.minimum(per_e[:El], torch.full_like(per_e[:El], cap)).to(torch.int32)
        out = self._run_experts(xm[: El * cap].reshape(El, cap, -1), sm, counts)
        got = torch.cat([out.reshape(El * cap, H), torch.zeros((1, H), dtype=odt, device=dev)])[dst]
        lost = (ks < El) & ~held
        got = torch.where(lost.unsqueeze(1), torch.full((), float("nan"), dtype=odt, device=dev), got)
        o_recv[perm] = got
        self.dropped += lost.sum()
        return o_recv

    def check(self) -> int:
        """The pairs dropped so far over the group (a host synchronisation); raises RuntimeError
        when any were."""
        n = self.dropped.clone()
        if self.world > 1:
            dist.all_reduce(n, group=self.group)
        n = int(n.item())
        if n:
            raise RuntimeError(f"ExpertParallelMoE: {n} (token, expert) pairs exceeded the capacity "
                               f"(capacity={self.capacity}, expert_capacity={self.expert_capacity}); their tokens' "
                               f"outputs are NaN")
        return n
