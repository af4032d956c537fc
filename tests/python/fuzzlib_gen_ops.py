"""Generators of valid calls (fuzzlib.py): NF4 K cache, checkpoint entries, amax, the GEMMs, the
MoE MLP and formats; the weighted table GENERATORS (attention: fuzzlib_gen_attention.py; NF4
decode attention and K encode: fuzzlib_gen_decode.py; the expert-parallel row layouts:
fuzzlib_gen_moe_ep.py) and make_call."""

from __future__ import annotations

import numpy as np

from fuzzlib_core import BF16, Call, E2M1, E4M3, FLOAT_IN, FORMAT_INFO, NF4
from fuzzlib_checks import (compare, decode, odd_dim, out_tolerance, pick, rand_x, _round_to, round_up,
                            same_bytes, to_layout, unpack)
from fuzzlib_specs import mutate, Spec
from fuzzlib_gen_formats import (gen_cast, gen_convert_layout, gen_convert_raw, gen_dequantize,
                                 gen_interleave, gen_quantize, gen_quantize_special, gen_scale_shape,
                                 gen_transcode, _lb, random_format_kwargs)
from fuzzlib_gen_attention import gen_attention
from fuzzlib_gen_decode import gen_decode_attention, gen_kproj_encode, gen_vcache_quantize
from fuzzlib_gen_linear import gen_mxfp4_gemm, gen_nvfp4_gemm, gen_nvfp4_prepack
from fuzzlib_gen_moe_ep import gen_expert_mlp, gen_group_gemm_counts


def gen_nf4k(rng):
    lb = _lb()
    B, T, H, D = int(rng.integers(1, 3)), odd_dim(rng, 20), int(rng.integers(1, 4)), 2 * int(rng.integers(1, 20))
    k = rand_x(rng, (B, T, H, D), pick(rng, FLOAT_IN))
    rdt = pick(rng, ["float8_e5m2", "float8_e4m3fn"])
    nib = pick(rng, ["low", "high"])
    special = rng.random() < 0.2
    if special:
        k = np.asarray(k, np.float32)
        k[0, int(rng.integers(T)), 0, 0] = pick(rng, [np.inf, -np.inf, 3e38])

    def check(res):
        codes, scale, residual = res
        kf = np.asarray(k, np.float64)
        y = np.asarray(lb.nf4_kcache_dequantize(codes, scale, residual, "float32", nib), np.float64)
        y0 = np.asarray(lb.nf4_kcache_dequantize(codes, scale, None, "float32", nib), np.float64)
        finite_ch = np.isfinite(kf).all(axis=1, keepdims=True)  # per (b, h, d) channel over T
        fin = np.broadcast_to(finite_ch, kf.shape)
        amax = np.max(np.abs(np.where(np.isfinite(kf), kf, 0)), axis=1, keepdims=True)
        if special:
            # the finite tokens of a channel holding +-Inf / NaN stay finite; +Inf keeps its sign
            pos_inf = np.isposinf(kf)
            # docs/formats.md "NaN, Inf and overflow", NF4 K cache: the +-Inf residual is stored
            # without saturation: E5M2 keeps +Inf (the token decodes to +Inf); E4M3 has no Inf and
            # stores NaN (the token decodes to NaN)
            inf_ok = np.isnan(y[pos_inf]) if rdt == "float8_e4m3fn" else np.isposinf(y[pos_inf])
            if pos_inf.any() and not inf_ok.all():
                return ("precision_loss", f"nf4 K cache ({rdt} residual): +Inf comes back as "
                                          f"{y[pos_inf][~inf_ok][0]}")
            bad = np.isfinite(kf) & ~np.isfinite(y)
            if bad.any():
                i = tuple(int(v) for v in np.argwhere(bad)[0])
                return ("precision_loss", f"nf4 K cache: finite token {kf[i]:.4g} at {i} decodes to {y[i]} "
                                          f"(a non-finite value in its channel)")
            return None
        if not np.isfinite(y[fin]).all():
            return ("precision_loss", "nf4 K cache: finite input decodes to NaN/Inf")
        e0 = np.abs(y0 - kf)
        if (e0 > 0.16 * amax + 1e-30).any():
            return ("precision_loss", f"nf4 K cache without residual: error {e0.max():.3g} beyond 0.16 x amax")
        e = np.abs(y - kf)
        # the residual is rounded to fp8: relative 2^-3 / 2^-4, absolute half the smallest subnormal
        bound = 0.16 * amax * (2.0 ** -2 if rdt == "float8_e5m2" else 2.0 ** -3) + \
            (2.0 ** -17 if rdt == "float8_e5m2" else 2.0 ** -10)
        if (e > bound + 1e-6 * amax).any():
            return f"nf4 K cache with residual: error {e.max():.3g} beyond the residual's precision"
        want_scale = np.max(np.abs(kf), axis=1)  # [B, H, D]
        return compare(scale, want_scale, 0.0, "nf4 K cache scale")

    return Spec("nf4_kcache_quantize", lambda k, residual_dtype, nibble_order:
                lb.nf4_kcache_quantize(k, residual_dtype, nibble_order),
                {"k": k, "residual_dtype": rdt, "nibble_order": nib},
                {"k": "in", "residual_dtype": "dtype", "nibble_order": "choice"}, check, required={"k"},
                choices={"residual_dtype": ("float8_e5m2", "float8_e4m3fn"), "nibble_order": ("low", "high")})


def gen_nf4k_dequant(rng):
    lb = _lb()
    B, T, H, D = int(rng.integers(1, 3)), odd_dim(rng, 20), int(rng.integers(1, 4)), 2 * int(rng.integers(1, 20))
    k = rand_x(rng, (B, T, H, D), np.float32)
    codes, scale, residual = lb.nf4_kcache_quantize(k)
    with_res = rng.random() < 0.5
    out_dtype = pick(rng, ["float32", "float16", "bfloat16"])

    def check(res):
        c = unpack(codes).astype(np.int64)  # [B, T, H, D]
        v = NF4[c] * np.asarray(scale, np.float64)[:, None, :, :]
        if with_res:
            v = v + np.asarray(residual).astype(np.float64)
        return compare(res, _round_to(v, out_dtype), out_tolerance(out_dtype) * 2, "nf4_kcache_dequantize",
                       atol=1e-30)

    return Spec("nf4_kcache_dequantize", lambda codes, scale, residual, out_dtype:
                lb.nf4_kcache_dequantize(codes, scale, residual, out_dtype),
                {"codes": codes, "scale": scale, "residual": residual if with_res else None, "out_dtype": out_dtype},
                {"codes": "in_bytes", "scale": "in", "residual": "in_bytes", "out_dtype": "dtype"}, check,
                required={"codes", "scale"}, choices={"out_dtype": ("float32", "float16", "bfloat16")})


def gen_entry(rng):
    lb = _lb()
    import npref

    which = pick(rng, ["mxfp8_quantize", "mxfp4_quantize", "nvfp4_quantize", "per_token_group_quant"])
    M = odd_dim(rng, 200)
    if which == "per_token_group_quant":
        gs = int(pick(rng, [32, 64, 128]))
        K = gs * int(rng.integers(1, 4))
        x = rand_x(rng, (M, K), pick(rng, FLOAT_IN))
        dtype = pick(rng, ["float8_e4m3fn", "float8_e5m2", "int4"])
        ue = bool(rng.random() < 0.4)
        cm = bool(rng.random() < 0.4)
        tma = bool(rng.random() < 0.5)
        eps = 1e-10
        params = {"x": x, "group_size": gs, "dtype": dtype, "scale_ue8m0": ue, "column_major_scales": cm,
                  "tma_aligned": tma, "eps": eps}
        kinds = {"x": "in", "group_size": "int", "dtype": "dtype", "scale_ue8m0": "bool",
                 "column_major_scales": "bool", "tma_aligned": "bool", "eps": "eps"}
        elem = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "int4": "int4"}[dtype]

        def check(res):
            q, s = res
            q_ref, s_ref = npref.group_quantize(np.asarray(x, np.float32), elem, gs, ue8m0=ue, eps=eps)
            p = same_bytes(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8), "codes")
            if p:
                return p
            s = np.asarray(s)
            return same_bytes(np.ascontiguousarray(s).view(np.uint8) if ue else np.ascontiguousarray(s),
                              np.asarray(s_ref), "scales")

        fn = lambda **p: lb.per_token_group_quant(**p)  # noqa: E731
        return Spec(which, fn, params, kinds, check, required={"x"},
                    choices={"dtype": ("float8_e4m3fn", "float8_e5m2", "int4")},
                    extra=[("eps=inf", {"eps": float("inf")}, "refuse"), ("eps=0", {"eps": 0.0}, "refuse"),
                           ("group_size=1.5", {"group_size": 1.5}, "refuse")])
    block = 16 if which == "nvfp4_quantize" else 32
    K = block * int(rng.integers(1, 5))
    x = rand_x(rng, (M, K), pick(rng, FLOAT_IN))
    sw = bool(rng.random() < 0.4)
    params = {"x": x, "swizzled": sw}
    kinds = {"x": "in", "swizzled": "bool"}
    extra = []
    if which == "nvfp4_quantize":
        if rng.random() < 0.5:
            params["global_amax"] = float(np.max(np.abs(np.asarray(x, np.float32))))
            kinds["global_amax"] = "amax"
        extra.append(("zero_scale=0", {"zero_scale": 0}, "refuse"))
        extra.append(("global_amax=-3", {"global_amax": -3.0}, "refuse"))
    else:
        params["rounding"] = pick(rng, ["rceil", "floor"])
        kinds["rounding"] = "choice"
    if which == "mxfp8_quantize" and rng.random() < 0.3:
        params["dtype"] = "float8_e5m2"
        kinds["dtype"] = "dtype"

    def check(res):
        q, s = res
        xf = np.asarray(x, np.float32)
        if which == "nvfp4_quantize":
            q_ref, s_ref = npref.nvfp4_quantize(xf, params.get("global_amax"))
        else:
            elem = "e2m1" if which == "mxfp4_quantize" else ("e5m2" if params.get("dtype") == "float8_e5m2" else "e4m3")
            q_ref, s_ref = npref.mx_quantize(xf, elem, params["rounding"])
        if sw:
            s_ref = to_layout(np.asarray(s_ref), "blocked128x4")
        p = same_bytes(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8), "codes")
        return p or same_bytes(np.asarray(s).view(np.uint8), np.asarray(s_ref).view(np.uint8), "scales")

    fn = getattr(lb, which)
    return Spec(which, lambda **p: fn(**p), params, kinds, check, required={"x"}, extra=extra,
                choices={"rounding": ("rceil", "floor"), "dtype": ("float8_e4m3fn", "float8_e5m2")})


def gen_amax(rng):
    lb = _lb()
    shape = (odd_dim(rng, 60), odd_dim(rng, 60)) if rng.random() < 0.7 else (2, odd_dim(rng, 30), odd_dim(rng, 30))
    x = rand_x(rng, shape, pick(rng, FLOAT_IN))
    if rng.random() < 0.2:
        x = np.asarray(x, np.float32)
        x.reshape(-1)[0] = pick(rng, [np.nan, np.inf, -np.inf])

    def check(res):  # the finite amax: NaN / Inf are ignored (docs/formats.md), 0 if none is left
        a = np.abs(np.asarray(x, np.float64))
        a = a[np.isfinite(a)]
        return compare(res, np.array([a.max() if a.size else 0.0]), 0.0, "tensor_amax")

    spec = Spec("tensor_amax", lambda x: lb.tensor_amax(x), {"x": x}, {"x": "in"}, check, required={"x"})
    spec.no_huge = True  # amax over 2^40 elements runs, it is not refused
    return spec


def _e2m1_codes(rng, shape, mask=0xBB):
    return (rng.integers(0, 256, size=shape, dtype=np.uint8) & mask).astype(np.uint8)


def gen_dual_gemm(rng):
    lb = _lb()
    M, N, K = odd_dim(rng, 40), int(pick(rng, [128, 256])), int(pick(rng, [64, 128]))
    three = rng.random() < 0.5
    L = int(rng.integers(1, 3)) if three else 1
    a = _e2m1_codes(rng, (L, M, K // 2))
    b1, b2 = _e2m1_codes(rng, (L, N, K // 2)), _e2m1_codes(rng, (L, N, K // 2))

    def sf(rows):
        return rng.random(size=(L, rows, K // 16)).astype(np.float32).astype(E4M3)

    sfa, sfb1, sfb2 = sf(M), sf(N), sf(N)
    if three:
        T = lambda v: np.transpose(v, (1, 2, 0))  # noqa: E731
    else:
        T = lambda v: v[0]  # noqa: E731
    params = {"a": T(a), "b1": T(b1), "b2": T(b2), "sfa": T(sfa), "sfb1": T(sfb1), "sfb2": T(sfb2)}
    kinds = {k: "in_bytes" for k in params}
    amax = rng.random() < 0.3
    if amax:
        for k in ("amax_a", "amax_b1", "amax_b2"):
            params[k] = float(rng.uniform(0.5, 4))
            kinds[k] = "amax"
    outputs = set()
    if rng.random() < 0.4:
        od = pick(rng, [np.float16, BF16])
        o = np.full((L, M, N), np.nan, od)
        params["out"] = np.transpose(o, (1, 2, 0)) if three else o[0]
        kinds["out"] = "out"
        outputs.add("out")
    else:
        params["out_dtype"] = pick(rng, ["float16", "bfloat16"])
        kinds["out_dtype"] = "dtype"

    def dec(q, s, amx):
        codes = np.stack([q & 0xF, q >> 4], axis=-1).reshape(q.shape[0], q.shape[1], -1)
        v = E2M1[codes] * np.repeat(s.astype(np.float64), 16, axis=-1)
        return v * (amx / 2688.0) if amx is not None else v

    def check(res):
        A = dec(a, sfa, params.get("amax_a"))
        B1, B2 = dec(b1, sfb1, params.get("amax_b1")), dec(b2, sfb2, params.get("amax_b2"))
        g = A @ np.swapaxes(B1, 1, 2)
        u = A @ np.swapaxes(B2, 1, 2)
        ref = g / (1 + np.exp(-g)) * u  # [L, M, N]
        ref = np.transpose(ref, (1, 2, 0)) if three else ref[0]
        got = np.asarray(res)
        odt = got.dtype
        return compare(got, ref.astype(np.float32).astype(odt).astype(np.float64), 2.0 ** -7, "dual gemm",
                       atol=1e-3)

    return Spec("nvfp4_dual_gemm_silu", lambda **p: lb.nvfp4_dual_gemm_silu(**p), params, kinds, check, outputs,
                required={"a", "b1", "b2", "sfa", "sfb1", "sfb2"},
                extra=[("amax_a=-3", {"amax_a": -3.0}, "refuse"),
                       ("bool a", {"a": np.asarray(params["a"]) > 3}, "refuse"),
                       ("prepack on host arrays", {"packed_b": np.zeros(16, np.uint8), "n": 2 ** 62}, "refuse")],
                choices={"out_dtype": ("float16", "bfloat16")})


def gen_prepack(rng):
    lb = _lb()
    N = int(pick(rng, [128, 256, 2 ** 40, -128]))
    K = int(pick(rng, [64, 128]))
    L = int(pick(rng, [1, 2, 2 ** 40]))

    def fn(N, K, L):
        return lb._C.nvfp4_dual_gemm_packed_bytes(N, K, L)

    exact = L * (2 * N // 64) * (K // 64) * (128 * 16 + 64 * 4)

    def check(res):
        if N < 0 or exact < 0 or exact >= 2 ** 63:
            return f"nvfp4_dual_gemm_packed_bytes({N}, {K}, {L}) returned {res} (exact size {exact}: must be refused)"
        if res != exact:
            return f"nvfp4_dual_gemm_packed_bytes({N}, {K}, {L}) returned {res}, expected {exact}"
        return None

    bad = N < 0 or exact < 0 or exact >= 2 ** 63
    return Spec("_C.nvfp4_dual_gemm_packed_bytes", fn, {"N": N, "K": K, "L": L}, {}, None).call(
        expect="refuse" if bad else "ok", check=check, note="negative or overflowing size" if bad else "")


def gen_group_gemm(rng):
    lb = _lb()
    G = int(rng.integers(1, 4))
    sizes = [int(pick(rng, [0, 1, 3, 17, 130, int(rng.integers(0, 40))])) for _ in range(G)]
    ind = np.concatenate([[0], np.cumsum(sizes)]).astype(pick(rng, [np.int32, np.int64]))
    M, N, K = int(ind[-1]), 8 * int(rng.integers(1, 9)), 32 * int(rng.integers(1, 5))
    act = pick(rng, ["bf16", "mxfp8"])
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((G, N, K)) / np.sqrt(K)).astype(np.float32)
    bl = pick(rng, ["row_major", "blocked128x4"])
    qb = lb.quantize(w, "mxfp4", bl)
    if act == "bf16":
        a, a_sc, al = x.astype(BF16), None, "row_major"
        A = a.astype(np.float64)
    else:
        al = pick(rng, ["row_major", "blocked128x4"])
        qa = lb.quantize(x, "mxfp8_e4m3", al, m_indptr=ind if al == "blocked128x4" else None)
        a, a_sc = qa.data, qa.scales
        A = decode(qa)
    B = decode(qb)
    params = {"a": a, "b": qb.data, "a_scale": a_sc, "b_scale": qb.scales, "m_indptr": ind,
              "out_dtype": pick(rng, ["bfloat16", "float16"]), "a_scale_layout": al, "b_scale_layout": bl}
    kinds = {"a": "in_bytes" if act == "mxfp8" else "in", "b": "in_bytes", "b_scale": "in_bytes",
             "m_indptr": "indptr", "out_dtype": "dtype", "a_scale_layout": "choice", "b_scale_layout": "choice"}
    if a_sc is not None:
        kinds["a_scale"] = "in_bytes"
    outputs = set()
    if rng.random() < 0.3:
        params["out"] = np.full((M, N), np.nan, np.float16)
        kinds["out"] = "out"
        kinds["out_dtype"] = "fixed"  # unused when out is given
        outputs.add("out")
    ref = np.concatenate([A[int(ind[g]):int(ind[g + 1])] @ B[g].T for g in range(G)]) if M else np.zeros((0, N))

    def check(res):
        got = np.asarray(res).astype(np.float64)
        return compare(got, ref, 2.0 ** -6, "grouped gemm", atol=1e-3)

    extra = [("float m_indptr", {"m_indptr": [0, M / 2 + 0.7, M] if G == 1 else [0.0] + [float(v) for v in ind[1:]]},
              "refuse")]
    if act == "bf16":
        extra.append(("a_scale with bf16 activations", {"a_scale": np.full((M, K // 32), 127, np.uint8)}, "refuse"))
    return Spec("group_gemm_mxfp4_nt_groupwise", lambda **p: lb.group_gemm_mxfp4_nt_groupwise(**p), params, kinds,
                check, outputs, required={"a", "b", "b_scale", "m_indptr"}, extra=extra,
                choices={"out_dtype": ("bfloat16", "float16"), "a_scale_layout": ("row_major", "blocked128x4"),
                         "b_scale_layout": ("row_major", "blocked128x4")})


def gen_group_prepack(rng):
    lb = _lb()
    G, N, K = int(rng.integers(1, 3)), 8 * int(rng.integers(1, 20)), 32 * int(rng.integers(1, 10))
    b = rng.integers(0, 256, (G, N, K // 2), dtype=np.uint8)
    sc = rng.integers(100, 150, (G, N, K // 32), dtype=np.uint8)
    layout = pick(rng, ["row_major", "blocked128x4"])
    st = sc if layout == "row_major" else lb.convert_scale_layout(sc, N, K // 32, "row_major", "blocked128x4")

    def check(res):
        pb, ps = res
        Np, Kp = round_up(N, 128), round_up(K, 256)
        if pb.shape != (G, Np, Kp // 2) or ps.shape != (G, Np, Kp // 32):
            return f"prepack shapes {pb.shape} {ps.shape}"
        want = np.full((G, Np, Kp // 32), 127, np.uint8)
        want[:, :N, :K // 32] = sc
        return same_bytes(ps, want, "prepacked scales")

    return Spec("group_gemm_mxfp4_prepack", lambda b, b_scale, b_scale_layout:
                lb.group_gemm_mxfp4_prepack(b, b_scale, b_scale_layout=b_scale_layout),
                {"b": b, "b_scale": st, "b_scale_layout": layout},
                {"b": "in_bytes", "b_scale": "in_bytes", "b_scale_layout": "choice"}, check, required={"b", "b_scale"},
                choices={"b_scale_layout": ("row_major", "blocked128x4")})


def gen_moe(rng):
    lb = _lb()
    T, H, I, E, k = int(rng.integers(1, 6)), 32 * int(rng.integers(1, 4)), 32 * int(rng.integers(1, 3)), \
        int(rng.integers(1, 4)), int(rng.integers(1, 3))
    w1 = lb.quantize(rng.standard_normal((E, 2 * I, H)).astype(np.float32) * 0.2, "mxfp4")
    w2 = lb.quantize(rng.standard_normal((E, H, I)).astype(np.float32) * 0.2, "mxfp4")
    b1 = rng.standard_normal((E, 2 * I)).astype(np.float32)
    b2 = rng.standard_normal((E, H)).astype(np.float32)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = rng.integers(-1, E, size=(T, k)).astype(np.int32)
    wts = rng.random((T, k)).astype(np.float32)
    act = pick(rng, ["bf16", "mxfp8"])
    W1, W2 = decode(w1), decode(w2)

    def check(res):
        if act != "bf16":
            return None if np.isfinite(np.asarray(res, np.float64)).all() else "non-finite MoE output"
        xb = x.astype(BF16).astype(np.float64)
        ref = np.zeros((T, H))
        for t in range(T):
            for j in range(k):
                e = int(ids[t, j])
                if e < 0:
                    continue
                h = W1[e] @ xb[t] + b1[e]
                g, u = np.minimum(h[0::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
                y = (g / (1 + np.exp(-1.702 * g)) * (u + 1)).astype(np.float32).astype(BF16)
                ref[t] += wts[t, j] * (W2[e] @ y.astype(np.float64) + b2[e])
        return compare(res, ref, 5e-3, "gpt_oss_moe_mlp", atol=5e-3)

    params = {"x": x, "topk_ids": ids, "topk_weights": wts, "w1": w1.data, "w1_scale": w1.scales, "b1": b1,
              "w2": w2.data, "w2_scale": w2.scales, "b2": b2, "act": act, "out_dtype": "float32"}
    kinds = {"x": "in", "topk_ids": "in", "topk_weights": "in", "w1": "in_bytes", "w1_scale": "in_bytes",
             "b1": "in", "w2": "in_bytes", "w2_scale": "in_bytes", "b2": "in", "act": "choice",
             "alpha": "float", "limit": "float"}
    params.update(alpha=1.702, limit=7.0)
    spec = Spec("gpt_oss_moe_mlp", lambda **p: lb.gpt_oss_moe_mlp(**p), params, kinds, check,
                required=set(params) - {"act", "out_dtype", "alpha", "limit"},
                extra=[("int64 topk_ids (torch.topk's dtype)", {"topk_ids": ids.astype(np.int64)}, "either"),
                       ("ids out of range", {"topk_ids": np.full((T, k), E + 5, np.int32)}, "either")],
                choices={"act": ("bf16", "mxfp8")})
    # int64 topk_ids are accepted on purpose (what torch.topk returns): host values are range-checked
    # and converted to int32 (gpt_oss_moe_mlp's docstring); the result is that of the int32 ids
    spec.dtype_ok = {"topk_ids": (np.dtype(np.int64),)}
    return spec


def gen_format(rng):
    lb = _lb()
    name = pick(rng, list(FORMAT_INFO))
    kw = random_format_kwargs(rng, name)
    if rng.random() < 0.5:
        kw["eps"] = 1e-10
    kinds = {k: ("eps" if k == "eps" else "int" if k == "block" else "choice") for k in kw}  # noqa: E501
    kinds["name"] = "fmt"
    return Spec("Format", lambda name, **k: lb.Format(name, **k), {"name": name, **kw}, kinds, None,
                required={"name"}, choices={"name": tuple(FORMAT_INFO)})


GENERATORS = [  # (weight, generator)
    (14, gen_quantize), (6, gen_quantize_special), (10, gen_dequantize), (3, gen_transcode), (6, gen_cast),
    (5, gen_scale_shape), (6, gen_convert_layout), (1, gen_convert_raw), (4, gen_interleave), (4, gen_nf4k),
    (3, gen_nf4k_dequant), (6, gen_entry), (2, gen_amax), (3, gen_dual_gemm), (1, gen_prepack),
    (4, gen_group_gemm), (2, gen_group_prepack), (2, gen_moe), (2, gen_format), (3, gen_attention),
    (2, gen_decode_attention), (1, gen_kproj_encode), (1, gen_vcache_quantize),
    (3, gen_mxfp4_gemm), (2, gen_nvfp4_gemm), (1, gen_nvfp4_prepack), (2, gen_group_gemm_counts),
    (2, gen_expert_mlp),
]
_WEIGHTS = np.array([w for w, _ in GENERATORS], dtype=np.float64)
_WEIGHTS /= _WEIGHTS.sum()


def make_call(seed, i):
    """Call i of the run with this seed (valid with probability 0.4, else mutated)."""
    rng = np.random.default_rng([seed, i])
    gen = GENERATORS[int(rng.choice(len(GENERATORS), p=_WEIGHTS))][1]
    spec = gen(rng)
    if isinstance(spec, Call):
        return spec
    if rng.random() < 0.4 or not spec.kinds or all(k == "fixed" for k in spec.kinds.values()) and not spec.extra:
        return spec.call(check=spec.check)
    return mutate(spec, rng)
