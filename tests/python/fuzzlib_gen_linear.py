"""Generators of valid dense-linear calls (fuzzlib.py): mxfp4_gemm (bf16 / MXFP8 activations, both
scale layouts, prepacked weights, bias) and nvfp4_gemm (bf16 / NVFP4 activations, per-tensor
amaxes, bias), checked against NumPy float64 products of the decoded operands; nvfp4_gemm_prepack
checked against the independent NumPy packer of linear_common.py."""

from __future__ import annotations

import numpy as np

from fuzzlib_core import BF16, E4M3
from fuzzlib_checks import compare, decode, odd_dim, pick
from fuzzlib_specs import Spec
from fuzzlib_gen_formats import _lb

_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
_LAYOUTS = ("row_major", "blocked128x4")


def _out_params(rng, M, N, params, kinds):
    """Either an `out` array (NaN-filled) or an out_dtype; returns the set of outputs."""
    if rng.random() < 0.3:
        params["out"] = np.full((M, N), np.nan, pick(rng, [np.float16, BF16]))
        kinds["out"] = "out"
        return {"out"}
    params["out_dtype"] = pick(rng, ["bfloat16", "float16"])
    kinds["out_dtype"] = "dtype"
    return set()


def _bias(rng, N, params, kinds):
    if rng.random() < 0.5:
        return None
    params["bias"] = rng.standard_normal(N).astype(pick(rng, [np.float32, BF16]))
    kinds["bias"] = "in"
    return params["bias"].astype(np.float64)


def gen_mxfp4_gemm(rng):
    lb = _lb()
    M, N, K = odd_dim(rng, 40), 8 * int(rng.integers(1, 9)), 32 * int(rng.integers(1, 5))
    act = pick(rng, ["bf16", "mxfp8"])
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    bl = pick(rng, list(_LAYOUTS))
    qb = lb.quantize(w, "mxfp4", bl)
    B = decode(qb)
    params = {"a": None, "b": qb.data, "b_scale": qb.scales, "b_scale_layout": bl}
    kinds = {"b": "in_bytes", "b_scale": "in_bytes", "b_scale_layout": "choice"}
    if act == "bf16":
        params["a"] = x.astype(BF16)
        kinds["a"] = "in"
        A = params["a"].astype(np.float64)
    else:
        al = pick(rng, list(_LAYOUTS))
        qa = lb.quantize(x, "mxfp8_e4m3", al)
        params.update(a=qa.data, a_scale=qa.scales, a_scale_layout=al)
        kinds.update(a="in_bytes", a_scale="in_bytes", a_scale_layout="choice")
        A = decode(qa)
    if rng.random() < 0.3:  # prepacked weights
        params["b"], params["b_scale"] = lb.mxfp4_gemm_prepack(qb.data, qb.scales, b_scale_layout=bl)
        params.update(b_packed=True, n=N)
        kinds.update(b_packed="fixed", n="fixed")
    bias = _bias(rng, N, params, kinds)
    outputs = _out_params(rng, M, N, params, kinds)
    ref = A @ B.T + (bias if bias is not None else 0.0)

    def check(res):
        return compare(np.asarray(res).astype(np.float64), ref, 2.0 ** -6, "mxfp4_gemm", atol=1e-3)

    extra = [("K not a multiple of 32", {"a": np.zeros((M, 48), BF16), "a_scale": None}, "refuse"),
             ("bias of N + 1", {"bias": np.zeros(N + 1, np.float32)}, "refuse")]
    if act == "bf16":
        extra.append(("a_scale with bf16 activations", {"a_scale": np.full((M, K // 32), 127, np.uint8)}, "refuse"))
    return Spec("mxfp4_gemm", lambda **p: lb.mxfp4_gemm(**p), params, kinds, check, outputs,
                required={"a", "b", "b_scale"}, extra=extra,
                choices={"out_dtype": ("bfloat16", "float16"), "a_scale_layout": _LAYOUTS, "b_scale_layout": _LAYOUTS})


def gen_nvfp4_gemm(rng):
    lb = _lb()
    M, N, K = odd_dim(rng, 40), int(rng.integers(1, 40)), 16 * int(rng.integers(1, 9))
    nv_a = rng.random() < 0.6

    def fp4(rows):
        q = rng.integers(0, 256, (rows, K // 2), dtype=np.uint8)
        s = rng.random((rows, K // 16)).astype(np.float32).astype(E4M3)
        v = _E2M1[np.stack([q & 0xF, q >> 4], axis=-1).reshape(rows, K)] * np.repeat(s.astype(np.float64), 16, axis=1)
        return q, s, v

    bq, bs, B = fp4(N)
    bl = pick(rng, list(_LAYOUTS))
    params = {"a": None, "b": bq, "b_scale": bs if bl == "row_major" else lb.block_scale_interleave(bs),
              "b_scale_layout": bl}
    kinds = {"b": "in_bytes", "b_scale": "in_bytes", "b_scale_layout": "choice"}
    scale = 1.0
    if nv_a:
        aq, as_, A = fp4(M)
        al = pick(rng, list(_LAYOUTS))
        params.update(a=aq, a_scale=as_ if al == "row_major" else lb.block_scale_interleave(as_), a_scale_layout=al)
        kinds.update(a="in_bytes", a_scale="in_bytes", a_scale_layout="choice")
        if rng.random() < 0.4:
            params["amax_a"] = float(rng.uniform(0.5, 4))
            kinds["amax_a"] = "amax"
            scale *= params["amax_a"] / 2688.0
    else:
        params["a"] = rng.standard_normal((M, K)).astype(BF16)
        kinds["a"] = "in"
        A = params["a"].astype(np.float64)
    if rng.random() < 0.4:
        params["amax_b"] = float(rng.uniform(0.5, 4))
        kinds["amax_b"] = "amax"
        scale *= params["amax_b"] / 2688.0
    bias = _bias(rng, N, params, kinds)
    outputs = _out_params(rng, M, N, params, kinds)
    ref = (A @ B.T) * scale + (bias if bias is not None else 0.0)

    def check(res):
        return compare(np.asarray(res).astype(np.float64), ref, 2.0 ** -6, "nvfp4_gemm", atol=1e-3)

    extra = [("amax_b=-3", {"amax_b": -3.0}, "refuse"), ("bias of N + 1", {"bias": np.zeros(N + 1, np.float32)}, "refuse")]
    if not nv_a:
        extra.append(("a_scale with bf16 activations", {"a_scale": np.full((M, K // 16), 56, np.uint8)}, "refuse"))
    return Spec("nvfp4_gemm", lambda **p: lb.nvfp4_gemm(**p), params, kinds, check, outputs,
                required={"a", "b", "b_scale"} | ({"a_scale"} if nv_a else set()), extra=extra,
                choices={"out_dtype": ("bfloat16", "float16"), "a_scale_layout": _LAYOUTS, "b_scale_layout": _LAYOUTS})


def gen_nvfp4_prepack(rng):
    """nvfp4_gemm_prepack of random codes and E4M3 scales (N % 128, K % 64), both scale layouts:
    the bytes of linear_common.np_nvfp4_pack."""
    from linear_common import np_nvfp4_pack, stored

    lb = _lb()
    N, K = 128 * int(rng.integers(1, 3)), 64 * int(rng.integers(1, 4))
    b = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
    sc = rng.integers(0, 256, (N, K // 16), dtype=np.uint8)
    layout = pick(rng, list(_LAYOUTS))
    want = np_nvfp4_pack(b, sc)

    def check(res):
        return None if np.array_equal(np.asarray(res), want) else "nvfp4_gemm_prepack: bytes differ from the NumPy packer"

    extra = [("N = 64", {"b": b[:64], "b_scale": stored(sc[:64], layout)}, "refuse"),
             ("b_scale of the wrong size", {"b_scale": np.zeros((N, 3), np.uint8)}, "refuse")]
    return Spec("nvfp4_gemm_prepack", lambda **p: lb.nvfp4_gemm_prepack(**p),
                {"b": b, "b_scale": stored(sc, layout), "b_scale_layout": layout},
                {"b": "in_bytes", "b_scale": "in_bytes", "b_scale_layout": "fixed"}, check,
                required={"b", "b_scale"}, extra=extra)
