"""Generators of valid calls (fuzzlib.py) of the expert-parallel row layouts: the grouped GEMM with
m_counts (contiguous rows + counts, or masked batches [G, max_tokens, K]) and gpt_oss_expert_mlp,
checked against NumPy float64 products of the decoded operands on the rows inside the counts (rows
outside them: a given NaN `out` keeps its NaN there); their layout-specific invalid calls (counts
negative, above max_tokens, summing past the rows, both m_indptr and m_counts)."""

from __future__ import annotations

import numpy as np

from fuzzlib_core import BF16
from fuzzlib_checks import compare, decode, pick
from fuzzlib_specs import Spec
from fuzzlib_gen_formats import _lb

_COUNT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _counts(rng, G, cap):
    return np.array([int(pick(rng, [0, cap, 1, int(rng.integers(0, cap + 1))])) for _ in range(G)],
                    pick(rng, [np.int32, np.int64]))


def _rows(counts, masked, T):
    """Row indices (of the flattened rows) inside the counts, per group."""
    if masked:
        return [np.arange(g * T, g * T + int(c)) for g, c in enumerate(counts)]
    b = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [np.arange(b[g], b[g + 1]) for g in range(len(counts))]


def gen_group_gemm_counts(rng):
    lb = _lb()
    G, masked = int(rng.integers(1, 4)), bool(rng.random() < 0.5)
    T = int(pick(rng, [1, 3, 8, int(rng.integers(1, 20))]))
    N, K = 8 * int(rng.integers(1, 5)), 32 * int(rng.integers(1, 4))
    counts = _counts(rng, G, T if masked else 6)
    M = G * T if masked else int(counts.sum()) + int(rng.integers(0, 3))
    act = pick(rng, ["bf16", "mxfp8"])
    x = rng.standard_normal((M, K)).astype(np.float32)
    qb = lb.quantize((rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32), "mxfp4", "row_major")
    B = decode(qb)
    lead = (G, T) if masked else (M,)
    if act == "bf16":
        a, a_sc = x.astype(BF16), None
        A = a.astype(np.float64)
    else:
        qa = lb.quantize(x, "mxfp8_e4m3", "row_major")
        a, a_sc = qa.data, qa.scales
        A = decode(qa)
        a_sc = np.asarray(a_sc).reshape(lead + (K // 32,))
    params = {"a": np.asarray(a).reshape(lead + (K,)), "b": qb.data, "a_scale": a_sc, "b_scale": qb.scales,
              "m_counts": counts, "a_scale_layout": "row_major", "b_scale_layout": "row_major"}
    kinds = {"a": "in_bytes" if act == "mxfp8" else "in", "b": "in_bytes", "b_scale": "in_bytes", "m_counts": "in",
             "a_scale_layout": "fixed", "b_scale_layout": "fixed"}
    if a_sc is not None:
        kinds["a_scale"] = "in_bytes"
    outputs = set()
    if rng.random() < 0.4:
        params["out"] = np.full(lead + (N,), np.nan, BF16)
        kinds["out"] = "out"
        outputs.add("out")
    if masked and rng.random() < 0.5:
        params["expected_m"] = int(rng.integers(0, T + 2))
        kinds["expected_m"] = "size"
    rows = _rows(counts, masked, T)

    def check(res):
        got = np.asarray(res).astype(np.float64).reshape(M, N)
        for g, r in enumerate(rows):
            if r.size:
                bad = compare(got[r], A[r] @ B[g].T, 2.0 ** -6, "grouped gemm (m_counts)", atol=1e-3)
                if bad:
                    return bad
        if "out" in params:
            inside = np.zeros(M, bool)
            for r in rows:
                inside[r] = True
            if not np.isnan(got[~inside]).all():
                return "grouped gemm (m_counts): a row outside the counts was written"
        return None

    room = T if masked else M
    extra = [("a count above the rows", {"m_counts": np.array([room + 1] + [0] * (G - 1), np.int64)}, "refuse"),
             ("a negative count", {"m_counts": np.array([-1] + [0] * (G - 1), np.int32)}, "refuse"),
             ("m_indptr and m_counts", {"m_indptr": np.zeros(G + 1, np.int32)}, "refuse"),
             ("counts of G + 1 groups", {"m_counts": np.zeros(G + 1, np.int32)}, "refuse")]
    spec = Spec("group_gemm_mxfp4_nt_groupwise", lambda **p: lb.group_gemm_mxfp4_nt_groupwise(**p), params, kinds,
                check, outputs, required={"a", "b", "b_scale", "m_counts"}, extra=extra)
    spec.dtype_ok = {"m_counts": _COUNT_DTYPES}
    return spec


def gen_expert_mlp(rng):
    lb = _lb()
    E, masked = int(rng.integers(1, 4)), bool(rng.random() < 0.5)
    H, I, T = 32 * int(rng.integers(1, 4)), 32 * int(rng.integers(1, 3)), int(rng.integers(1, 6))
    counts = _counts(rng, E, T if masked else 4)
    M = E * T if masked else int(counts.sum()) + int(rng.integers(0, 3))
    w1 = lb.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lb.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((M, H)).astype(np.float32)
    act = pick(rng, ["bf16", "mxfp8"])
    W1, W2 = decode(w1), decode(w2)
    lead = (E, T) if masked else (M,)
    rows = _rows(counts, masked, T)

    def check(res):
        got = np.asarray(res, np.float64).reshape(M, H)
        for e, r in enumerate(rows):
            if not r.size:
                continue
            if act != "bf16":
                if not np.isfinite(got[r]).all():
                    return "non-finite expert MLP output"
                continue
            xb = x[r].astype(BF16).astype(np.float64)
            h = xb @ W1[e].T + b1[e]
            g, u = np.minimum(h[:, 0::2], 7.0), np.clip(h[:, 1::2], -7.0, 7.0)
            y = (g / (1 + np.exp(-1.702 * g)) * (u + 1)).astype(np.float32).astype(BF16).astype(np.float64)
            bad = compare(got[r], y @ W2[e].T + b2[e], 5e-3, "gpt_oss_expert_mlp", atol=5e-3)
            if bad:
                return bad
        return None

    params = {"x": x.reshape(lead + (H,)), "m_counts": counts, "w1": w1.data, "w1_scale": w1.scales, "b1": b1,
              "w2": w2.data, "w2_scale": w2.scales, "b2": b2, "act": act, "out_dtype": "float32"}
    kinds = {"x": "in", "m_counts": "in", "w1": "in_bytes", "w1_scale": "in_bytes", "b1": "in", "w2": "in_bytes",
             "w2_scale": "in_bytes", "b2": "in", "act": "choice", "out_dtype": "dtype"}
    room = T if masked else M
    extra = [("a count above the rows", {"m_counts": np.array([room + 1] + [0] * (E - 1), np.int64)}, "refuse"),
             ("a negative count", {"m_counts": np.array([-2] + [0] * (E - 1), np.int32)}, "refuse"),
             ("x_scale with float x", {"x_scale": np.full(lead + (H // 32,), 127, np.uint8)}, "refuse")]
    spec = Spec("gpt_oss_expert_mlp", lambda **p: lb.gpt_oss_expert_mlp(**p), params, kinds, check,
                required={"x", "m_counts", "w1", "w1_scale", "b1", "w2", "w2_scale", "b2"}, extra=extra,
                choices={"act": ("bf16", "mxfp8"), "out_dtype": ("float32", "bfloat16")})
    spec.dtype_ok = {"m_counts": _COUNT_DTYPES}
    return spec
