"""Generator of valid attention calls (fuzzlib.py): flash_attn_mxfp8_func and
flash_attn_mxfp8_varlen_func on small random MXFP8 operands, checked against a NumPy attention
(docs/attention.md's rules)."""

from __future__ import annotations

import math

import numpy as np

from fuzzlib_core import BF16, E4M3, E8M0
from fuzzlib_checks import pick
from fuzzlib_specs import Spec
from fuzzlib_gen_formats import _lb


def _attn_ref(q, k, v, qs, ks, vs, scale, causal):
    """fp64 attention of one (sequence, head): codes [s, d] (uint8), scale bytes [s, d/32];
    docs/attention.md's rules (no key: 0 / -inf; NaN score: NaN row)."""
    def deq(c, sb):
        s = np.asarray(sb).view(np.uint8).astype(np.int64)
        sv = np.where(s == 255, np.nan, np.ldexp(1.0, (s - 127).astype(np.int32)))
        return np.asarray(c).view(np.uint8).view(E4M3).astype(np.float64) * np.repeat(sv, 32, axis=-1)

    qd, kd, vd = deq(q, qs), deq(k, ks), deq(v, vs)
    sq, sk = qd.shape[0], kd.shape[0]
    out, lse = np.zeros(qd.shape), np.full(sq, -np.inf)
    for i in range(sq):
        n = max(0, min(sk, i + sk - sq + 1)) if causal else sk
        if n == 0:
            continue
        sc = (qd[i][None, :] * kd[:n]).sum(-1) * scale
        if np.isnan(sc).any():
            out[i], lse[i] = np.nan, np.nan
            continue
        m = sc.max()
        pr = np.exp(sc - m)
        out[i] = (pr[:, None] * vd[:n]).sum(0) / pr.sum()
        lse[i] = m + math.log(pr.sum())
    return out, lse


def _attn_compare(res, out_ref, lse_ref, what):
    o, lse = (np.asarray(a).astype(np.float64) for a in res)
    if o.shape != out_ref.shape or lse.shape != lse_ref.shape:
        return f"{what}: shapes {o.shape} / {lse.shape}, expected {out_ref.shape} / {lse_ref.shape}"
    if not np.array_equal(np.isnan(o), np.isnan(out_ref)) or not np.array_equal(np.isnan(lse), np.isnan(lse_ref)):
        return f"{what}: NaN positions differ"
    fin = np.isfinite(out_ref)
    ulp = np.ldexp(1.0, (np.floor(np.log2(np.maximum(np.abs(out_ref[fin]), 2.0 ** -126))) - 7).astype(np.int32))
    if (np.abs(o[fin] - out_ref[fin]) > ulp).any():
        return f"{what}: out beyond one bf16 ulp of the reference"
    lf = np.isfinite(lse_ref)
    if not np.array_equal(lse[~lf & ~np.isnan(lse_ref)], lse_ref[~lf & ~np.isnan(lse_ref)]) or \
            (np.abs(lse[lf] - lse_ref[lf]) > 1e-5 * np.maximum(1, np.abs(lse_ref[lf]))).any():
        return f"{what}: lse differs from the reference"
    return None


def gen_attention(rng):
    """flash_attn_mxfp8_func / flash_attn_mxfp8_varlen_func on small random MXFP8 operands (a few
    NaN codes and scale bytes 255 included), checked against the NumPy attention above."""
    lb = _lb()
    d = int(pick(rng, [64, 128, 256]))
    hk = int(rng.integers(1, 3))
    h = hk * int(pick(rng, [1, 2, 4]))
    causal = bool(rng.random() < 0.5)
    varlen = rng.random() < 0.35
    nb = int(rng.integers(1, 4)) if varlen else int(rng.integers(1, 3))
    lq = [int(rng.integers(0 if varlen else 1, 7)) for _ in range(nb)]
    lk = [int(rng.integers(0 if varlen else 1, 9)) for _ in range(nb)]
    if not varlen:
        lq, lk = [lq[0]] * nb, [lk[0]] * nb

    def codes(n, heads):
        c = rng.integers(0, 256, (n, heads, d), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x38  # NaN codes only where placed below
        return c

    def scales(n, heads):
        return rng.integers(105, 123, (heads, n, d // 32), dtype=np.uint8)

    TQ, TK = sum(lq), sum(lk)
    q, k, v = codes(TQ, h), codes(TK, hk), codes(TK, hk)
    qs, ks, vs = scales(TQ, h), scales(TK, hk), scales(TK, hk)
    if rng.random() < 0.3 and TK:
        pick(rng, [k, v])[int(rng.integers(TK)), int(rng.integers(hk)), int(rng.integers(d))] = 0x7F
    if rng.random() < 0.2 and TQ:
        qs[int(rng.integers(h)), int(rng.integers(TQ)), int(rng.integers(d // 32))] = 255
    scale = 1.0 / math.sqrt(d)
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    out_ref = np.zeros((TQ, h, d))
    lse_ref = np.zeros((h, TQ))
    for b in range(nb):
        for hh in range(h):
            kh = hh // (h // hk)
            qa, qb_, ka, kb_ = cq[b], cq[b + 1], ck[b], ck[b + 1]
            o, l_ = _attn_ref(q[qa:qb_, hh], k[ka:kb_, kh], v[ka:kb_, kh], qs[hh, qa:qb_], ks[kh, ka:kb_], vs[kh, ka:kb_],
                              scale, causal)
            out_ref[qa:qb_, hh], lse_ref[hh, qa:qb_] = o, l_
    extra = [("softmax_scale NaN", {"softmax_scale": float("nan")}, "refuse"),
             ("softmax_scale 0", {"softmax_scale": 0.0}, "refuse"),
             ("softmax_scale -inf", {"softmax_scale": float("-inf")}, "refuse"),
             ("softmax_scale string", {"softmax_scale": "0.1"}, "refuse"),
             ("q as bf16 values", {"q": q.view(E4M3).astype(BF16)}, "refuse")]
    kinds = {"q": "in_bytes", "k": "in_bytes", "v": "in_bytes", "q_scale": "in_bytes", "k_scale": "in_bytes",
             "v_scale": "in_bytes", "causal": "bool", "softmax_scale": "fixed"}
    if varlen:
        params = {"q": q.view(E4M3), "k": k, "v": v.view(E4M3), "q_scale": qs, "k_scale": ks.view(E8M0),
                  "v_scale": vs, "cu_seqlens_q": cq.astype(np.int32), "cu_seqlens_k": ck.astype(np.int32),
                  "max_seqlen_q": max(max(lq), 1), "max_seqlen_k": max(max(lk), 1), "softmax_scale": None,
                  "causal": causal}
        kinds.update(cu_seqlens_q="indptr", cu_seqlens_k="indptr", max_seqlen_q="size", max_seqlen_k="size")

        def check(res):
            return _attn_compare(res, out_ref, lse_ref, "flash_attn_mxfp8_varlen")

        return Spec("flash_attn_mxfp8_varlen", lambda **p: lb.flash_attn_mxfp8_varlen_func(**p), params, kinds,
                    check, required=set(params) - {"softmax_scale", "causal"}, extra=extra)
    s_q, s_k = lq[0], lk[0]
    # fixed length: [b, s, h, d] codes, [b, h, s, d/32] scales
    f = lambda a, s_: a.reshape(nb, s_, a.shape[1], d)  # noqa: E731
    g = lambda a, s_: a.reshape(a.shape[0], nb, s_, d // 32).transpose(1, 0, 2, 3).copy()  # noqa: E731
    params = {"q": f(q, s_q).view(E4M3), "k": f(k, s_k), "v": f(v, s_k), "q_scale": g(qs, s_q).view(E8M0),
              "k_scale": g(ks, s_k), "v_scale": g(vs, s_k), "softmax_scale": None, "causal": causal}
    o_ref4 = out_ref.reshape(nb, s_q, h, d)
    l_ref3 = lse_ref.reshape(h, nb, s_q).transpose(1, 0, 2)

    def check_fixed(res):
        return _attn_compare(res, o_ref4, l_ref3, "flash_attn_mxfp8")

    return Spec("flash_attn_mxfp8", lambda **p: lb.flash_attn_mxfp8_func(**p), params, kinds, check_fixed,
                required=set(params) - {"softmax_scale", "causal"}, extra=extra)
