"""Decode-attention inputs with the structure of a real KV cache, for bench_decode_attention.py
and decode_pruning_study.py.

One query token per sequence, GQA groups of H_q / H_kv query heads. In softmax-scaled score units
(natural log, scores s = q . k / sqrt(D)), token t of KV group g scores about

    s[h, t] = sigma * N(0, 1) + boost[t] * cos(q_h, u_g)

where u_g is the group's direction (each query head of the group is u_g plus its own
perturbation, cos about 0.9), sigma the spread of the background and boost[t] the structure:

    sinks      the first `n_sinks` tokens, boost `sink`
    recency    boost `recent * exp(-(L - 1 - t) / recent_len)` for the most recent tokens
    retrieved  `n_retrieved` tokens at random positions of the middle, boosts drawn in
               [retrieved_lo, retrieved_hi] (a different set per KV group)

Keys also carry `n_outlier_channels` channels with a large constant offset (the outlier channels
of real K caches): they shift every score of a head by the same amount (no effect on the
softmax) but set the NF4 scale of those channels, as in a real cache. Keys and values are
rounded to bfloat16. Arrays are NumPy (float32 values, bf16-representable) or torch tensors on a
given device (the GPU bench draws the large caches on the device).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ["Pattern", "PATTERNS", "structure", "make_qkv_numpy", "make_qkv_torch"]


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str
    sigma: float = 1.0            # background score spread
    n_sinks: int = 4
    sink: float = 6.0
    recent: float = 5.0
    recent_len: float = 64.0
    n_retrieved: int = 0
    retrieved_lo: float = 5.0
    retrieved_hi: float = 7.0
    n_outlier_channels: int = 4
    outlier: float = 8.0
    description: str = ""


PATTERNS: Dict[str, Pattern] = {p.name: p for p in (
    Pattern("sinks_recency", sink=10.0, recent=8.0, recent_len=64.0,
            description="4 sinks (+10), recency +8 e^(-d/64), background sigma 1"),
    Pattern("sinks_recency_retrieval", sink=10.0, recent=8.0, recent_len=64.0, n_retrieved=8, retrieved_lo=7.0,
            retrieved_hi=9.0, description="as sinks_recency + 8 retrieved tokens (+7..+9) per KV group"),
    Pattern("retrieval_heavy", sink=8.0, recent=6.0, recent_len=32.0, n_retrieved=64, retrieved_lo=4.0,
            retrieved_hi=9.0, sigma=1.2,
            description="4 sinks (+8), recency +6 e^(-d/32), 64 retrieved tokens (+4..+9), sigma 1.2"),
    Pattern("diffuse", sink=5.0, recent=4.0, recent_len=256.0, sigma=1.5,
            description="weak structure: 4 sinks (+5), recency +4 e^(-d/256), sigma 1.5"),
)}


def structure(p: Pattern, L: int, H_kv: int, rng: np.random.Generator) -> np.ndarray:
    """boost[g, t] (float64 [H_kv, L]) of one sequence of L tokens."""
    t = np.arange(L, dtype=np.float64)
    boost = np.zeros((H_kv, L))
    boost[:, : min(p.n_sinks, L)] = p.sink
    boost += p.recent * np.exp(-(L - 1 - t) / p.recent_len)[None, :]
    lo, hi = min(p.n_sinks, L), max(min(p.n_sinks, L), L - int(4 * p.recent_len))
    if p.n_retrieved and hi - lo > p.n_retrieved:
        for g in range(H_kv):
            pos = rng.choice(np.arange(lo, hi), size=p.n_retrieved, replace=False)
            boost[g, pos] = np.maximum(boost[g, pos], rng.uniform(p.retrieved_lo, p.retrieved_hi, p.n_retrieved))
    return boost


def _directions(H_q: int, H_kv: int, D: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """(u [H_kv, D] unit group directions, q [H_q, D] queries with |q| = sqrt(D))."""
    u = rng.standard_normal((H_kv, D))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    G = H_q // H_kv
    n = rng.standard_normal((H_q, D))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    q = np.repeat(u, G, axis=0) + 0.45 * n
    q *= math.sqrt(D) / np.linalg.norm(q, axis=1, keepdims=True)
    return u, q


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return r.view(np.float32)


def make_qkv_numpy(p: Pattern, B: int, L: int, H_q: int, H_kv: int, D: int, Dv: int, seed: int = 0):
    """(q [B, 1, H_q, D], k [B, L, H_kv, D], v [B, L, H_kv, Dv]) float32 NumPy arrays holding
    bfloat16 values, with the structure of pattern p (module docstring)."""
    rng = np.random.default_rng(seed)
    q = np.empty((B, 1, H_q, D), np.float32)
    k = np.empty((B, L, H_kv, D), np.float32)
    v = np.empty((B, L, H_kv, Dv), np.float32)
    for b in range(B):
        u, qb = _directions(H_q, H_kv, D, rng)
        boost = structure(p, L, H_kv, rng)  # [H_kv, L]
        off = np.zeros(D)
        ch = rng.choice(D, size=min(p.n_outlier_channels, D), replace=False)
        off[ch] = p.outlier * rng.choice([-1.0, 1.0], size=ch.size)
        kb = p.sigma * rng.standard_normal((L, H_kv, D)) + boost.T[:, :, None] * u[None, :, :] + off
        q[b, 0] = qb
        k[b] = kb
        v[b] = rng.standard_normal((L, H_kv, Dv))
    return _bf16_round(q), _bf16_round(k), _bf16_round(v)


def make_qkv_torch(torch, p: Pattern, B: int, L: int, H_q: int, H_kv: int, D: int, Dv: int, seed: int = 0,
                   device: str = "cuda", layout: Optional[str] = None):
    """As make_qkv_numpy, as bfloat16 torch tensors on `device`; the large noise is drawn there
    (the structure, directions and offsets in NumPy: they are small)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.empty(B, 1, H_q, D, dtype=torch.bfloat16, device=device)
    k = torch.empty(B, L, H_kv, D, dtype=torch.bfloat16, device=device)
    v = torch.randn(B, L, H_kv, Dv, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
    for b in range(B):
        u, qb = _directions(H_q, H_kv, D, rng)
        boost = structure(p, L, H_kv, rng)
        off = np.zeros(D)
        ch = rng.choice(D, size=min(p.n_outlier_channels, D), replace=False)
        off[ch] = p.outlier * rng.choice([-1.0, 1.0], size=ch.size)
        kb = torch.randn(L, H_kv, D, generator=gen, device=device, dtype=torch.float32) * p.sigma
        kb += torch.from_numpy(boost.T.astype(np.float32)).to(device)[:, :, None] \
            * torch.from_numpy(u.astype(np.float32)).to(device)[None, :, :]
        kb += torch.from_numpy(off.astype(np.float32)).to(device)
        k[b] = kb.to(torch.bfloat16)
        q[b, 0] = torch.from_numpy(qb.astype(np.float32)).to(device).to(torch.bfloat16)
    return q, k, v
