"""NF4 K-cache decode attention on the CPU (lowbit.attn_forward_decode_nf4,
kproj_rope_nf4_encode, nf4_kcache_append): the library's reference against the independent
NumPy implementation of decode_attention_common.py (pruned and unpruned, GQA, ragged lengths,
NaN), the encode against a NumPy projection + RoPE, the append policy, argument errors. The GPU
tests are in test_decode_attention_gpu.py."""

import math

import ml_dtypes
import numpy as np
import pytest

import lowbit

from decode_attention_common import BF16, assert_bf16_close, make_cache, make_v8, np_decode, np_keys

SHAPES = [  # B, T, H_q, H_kv, D, Dv, block_size, sub_block_size
    (1, 1, 4, 1, 64, 64, 64, 16), (2, 100, 8, 2, 128, 64, 64, 16), (2, 300, 8, 2, 128, 64, 32, 16),
    (3, 90, 4, 4, 64, 128, 16, 4), (1, 170, 8, 1, 256, 256, 16, 8), (2, 200, 4, 2, 64, 64, 8, 8),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_t%d_h%d-%d_d%d-%d_bs%d-%d" % s)
@pytest.mark.parametrize("delta", [math.inf, 2.0, 0.0])
def test_reference_matches_numpy(shape, delta):
    B, T, H, HK, D, DV, bs, sbs = shape
    q, c, s, r, v = make_cache(B, T, H, HK, D, DV, seed=T * 7 + H, sinks=True)
    lens = [max(1, T - 13 * b) for b in range(B)]
    out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, seq_lens=lens, block_size=bs, sub_block_size=sbs,
                                                delta=delta, return_skip_ratio=True)
    assert out.dtype == BF16 and out.shape == (B, H, DV) and ratio.dtype == np.float32 and ratio.shape == (B, HK)
    ref, ref_ratio = np_decode(q, c, s, r, v, lens, bs, delta)
    assert_bf16_close(out, ref)
    np.testing.assert_array_equal(ratio, ref_ratio.astype(np.float32))
    if delta == math.inf:
        assert (ratio == 0).all()


@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: "b%d_t%d_h%d-%d_d%d-%d_bs%d-%d" % s)
@pytest.mark.parametrize("vdt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("delta", [math.inf, 2.0])
def test_fp8_v_matches_numpy(shape, vdt, delta):
    B, T, H, HK, D, DV, bs, sbs = shape
    q, c, s, r, _ = make_cache(B, T, H, HK, D, DV, seed=T + 3, sinks=True)
    v8, vs = make_v8(B, T, HK, DV, seed=T + 4, dtype=vdt)
    lens = [max(1, T - 11 * b) for b in range(B)]
    out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v8, v_scale=vs, seq_lens=lens, block_size=bs,
                                                sub_block_size=sbs, delta=delta, return_skip_ratio=True)
    ref, ref_ratio = np_decode(q, c, s, r, v8, lens, bs, delta, v_scale=vs)
    assert_bf16_close(out, ref)
    np.testing.assert_array_equal(ratio, ref_ratio.astype(np.float32))
    # the scales are applied: doubling one channel's scale doubles that channel only
    vs2 = vs.copy()
    vs2[:, :, 5] *= 2
    out2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v8, v_scale=vs2, seq_lens=lens, block_size=bs,
                                          sub_block_size=sbs, delta=delta)
    o, o2 = out.astype(np.float64), out2.astype(np.float64)
    np.testing.assert_array_equal(o2[..., 5], 2 * o[..., 5])
    np.testing.assert_array_equal(np.delete(o2, 5, axis=-1), np.delete(o, 5, axis=-1))


def test_fp8_v_broadcast_scale_and_nan_code():
    B, T, H, HK, D = 2, 40, 4, 2, 64
    q, c, s, r, _ = make_cache(B, T, H, HK, D, D, seed=8)
    v8, vs = make_v8(B, T, HK, D, seed=9)
    shared = np.broadcast_to(vs[:1], vs.shape)  # one scale tensor for the batch (batch stride 0)
    out = lowbit.attn_forward_decode_nf4(q, c, s, r, v8, v_scale=shared, delta=math.inf)
    assert_bf16_close(out, np_decode(q, c, s, r, v8, v_scale=np.ascontiguousarray(shared))[0])
    v8[1, 7, 1, 3] = np.float32(np.nan).astype(v8.dtype)  # a NaN code: channel 3 of KV head 1's heads
    out = lowbit.attn_forward_decode_nf4(q, c, s, r, v8, v_scale=vs, delta=math.inf).astype(np.float32)
    assert np.isnan(out[1, 2:, 3]).all() and np.isfinite(np.delete(out[1, 2:], 3, axis=-1)).all()
    assert np.isfinite(out[0]).all() and np.isfinite(out[1, :2]).all()


def test_without_residual_e4m3_bf16_scale_and_softmax_scale():
    q, c, s, r, v = make_cache(2, 50, 4, 2, 64, 64, seed=1, residual_dtype="float8_e4m3fn")
    out = lowbit.attn_forward_decode_nf4(q, c, s, None, v, use_fp8_residual=False, delta=math.inf, softmax_scale=0.2)
    assert_bf16_close(out, np_decode(q, c, s, None, v, softmax_scale=0.2)[0])
    # the residual passed but not used: the same bytes
    out2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v, use_fp8_residual=False, delta=math.inf, softmax_scale=0.2)
    assert np.array_equal(out.view(np.uint16), out2.view(np.uint16))
    sb = s.astype(BF16)  # a bfloat16 scale tensor is read as it is
    out3 = lowbit.attn_forward_decode_nf4(q, c, sb, r, v, delta=math.inf)
    assert_bf16_close(out3, np_decode(q, c, sb.astype(np.float32), r, v)[0])


def test_crafted_pruning_and_precomputed_threshold():
    B, T, H, HK, D = 1, 80, 2, 1, 64
    q, _, _, _, v = make_cache(B, T, H, HK, D, D, seed=2)
    k = np.full((B, T, HK, D), 0.5, np.float32)
    k[0, 3, 0, 0] = k[0, 79, 0, 0] = 10  # head 0: first and last blocks
    k[0, 40, 0, 0] = 8                   # head 0: block 2 above 10 - 4
    k[0, 2, 0, 1] = k[0, 70, 0, 1] = 10  # head 1: first and last blocks
    k[0, 20, 0, 1] = 9                   # head 1: block 1 above its threshold
    c, s, r = lowbit.nf4_kcache_quantize(k)
    q[:] = 0
    q[0, 0, 0, 0] = 1
    q[0, 0, 1, 1] = 1
    kw = dict(block_size=16, sub_block_size=4, softmax_scale=1.0, return_skip_ratio=True)
    out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, delta=4.0, **kw)
    assert ratio[0, 0] == np.float32(1 / 5)  # only block 3 is below for both heads
    assert_bf16_close(out, np_decode(q, c, s, r, v, None, 16, 4.0, softmax_scale=1.0)[0])
    thr = np.array([[100.0, -np.inf]], np.float32)  # head 1 never below: nothing skipped
    _, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, precomputed_threshold=thr, **kw)
    assert ratio[0, 0] == 0
    thr = np.array([[100.0, 100.0]], np.float32)  # only the first and last blocks stay
    out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, precomputed_threshold=thr, **kw)
    assert ratio[0, 0] == np.float32(3 / 5)
    assert_bf16_close(out, np_decode(q, c, s, r, v, None, 16, threshold=thr, softmax_scale=1.0)[0])
    # a NaN value in a skipped block is never read
    v[0, 50, 0, 3] = np.nan
    out2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v, precomputed_threshold=thr, block_size=16, softmax_scale=1.0)
    assert np.array_equal(out.view(np.uint16), out2.view(np.uint16))


def test_nan_rules():
    q, c, s, r, v = make_cache(1, 48, 4, 2, 64, 64, seed=4)
    q[0, 0, 1, 7] = np.nan  # head 1: its row only
    r[0, 20, 1, 5] = np.float32(np.nan).astype(r.dtype)  # KV head 1 (heads 2, 3): a NaN key in a middle block
    v[0, 30, 0, 9] = np.nan  # KV head 0: channel 9 of heads 0, 1
    out, ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, block_size=16, delta=0.0, return_skip_ratio=True)
    ref, ref_ratio = np_decode(q, c, s, r, v, None, 16, 0.0)
    assert_bf16_close(out, ref)
    np.testing.assert_array_equal(ratio, ref_ratio.astype(np.float32))
    o = out.astype(np.float32)
    assert np.isnan(o[0, 1]).all() and np.isnan(o[0, 2:]).all() and ratio[0, 1] == 0


def test_out_argument_and_list_lengths():
    q, c, s, r, v = make_cache(2, 20, 2, 1, 64, 64, seed=5)
    out = np.full((2, 2, 64), np.nan, BF16)
    got = lowbit.attn_forward_decode_nf4(q, c, s, r, v, seq_lens=np.array([20, 3], np.int32), out=out)
    assert got is out
    assert_bf16_close(out, np_decode(q, c, s, r, v, [20, 3])[0])


def test_argument_errors():
    q, c, s, r, v = make_cache(1, 8, 2, 1, 64, 64, seed=6)
    call = lowbit.attn_forward_decode_nf4
    with pytest.raises(ValueError, match="argument 'q'.*bfloat16"):
        call(q.astype(np.float32), c, s, r, v)
    with pytest.raises(ValueError, match="argument 'k_residual'.*required"):
        call(q, c, s, None, v)
    with pytest.raises(ValueError, match="argument 'seq_lens'.*1..8"):
        call(q, c, s, r, v, seq_lens=[9])
    with pytest.raises(ValueError, match="argument 'seq_lens'.*1..8"):
        call(q, c, s, r, v, seq_lens=[0])
    with pytest.raises(ValueError, match="argument 'delta'"):
        call(q, c, s, r, v, delta=-1.0)
    with pytest.raises(ValueError, match="argument 'sub_block_size'.*divisor"):
        call(q, c, s, r, v, block_size=64, sub_block_size=48)
    with pytest.raises(ValueError, match="argument 'q'.*64, 128 or 256"):
        call(q[..., :32].copy(), c[..., :16].copy(), s[..., :32].copy(), r[..., :32].copy(), v)
    with pytest.raises(ValueError, match="argument 'precomputed_threshold'.*shape"):
        call(q, c, s, r, v, precomputed_threshold=np.zeros((1, 1), np.float32))
    v8, vs = make_v8(1, 8, 1, 64, seed=7)
    with pytest.raises(ValueError, match="argument 'v_scale'.*only taken with FP8 v"):
        call(q, c, s, r, v, v_scale=vs)
    with pytest.raises(ValueError, match="argument 'v_scale'.*required"):
        call(q, c, s, r, v8)
    with pytest.raises(ValueError, match="argument 'v_scale'.*shape"):
        call(q, c, s, r, v8, v_scale=vs[:, :, :32].copy())
    with pytest.raises(ValueError, match="argument 'v_scale'.*float32"):
        call(q, c, s, r, v8, v_scale=vs.astype(np.float16))
    with pytest.raises(ValueError, match="argument 'v'.*bfloat16 or float8"):
        call(q, c, s, r, v.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# encode and append

def np_rope_keys(x, w, pos, D, theta):
    p = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32).astype(np.float64)
    B, T, _ = x.shape
    p = p.reshape(B, T, -1, D)
    f = theta ** (-2.0 * np.arange(D // 2) / D)
    a = np.asarray(pos, np.float64).reshape(B if np.ndim(pos) == 2 else 1, T, 1, 1) * f
    x0, x1 = p[..., : D // 2], p[..., D // 2:]
    return np.concatenate([x0 * np.cos(a) - x1 * np.sin(a), x1 * np.cos(a) + x0 * np.sin(a)], axis=-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_encode_matches_numpy_and_quantize(dtype):
    rng = np.random.default_rng(7)
    B, T, E, HK, D = 2, 9, 48, 2, 64
    x = rng.standard_normal((B, T, E)).astype(np.float32)
    w = (rng.standard_normal((HK * D, E)) * 0.1).astype(np.float32)
    if dtype == "bfloat16":
        x, w = x.astype(BF16), w.astype(BF16)
    pos = np.arange(T, dtype=np.int32) * 37
    c, s, r, k = lowbit.kproj_rope_nf4_encode(x, w, pos, head_dim=D, rope_theta=1e6, return_k=True)
    assert c.shape == (B, T, HK, D // 2) and s.shape == (B, HK, D) and r.dtype == ml_dtypes.float8_e5m2
    np.testing.assert_allclose(k, np_rope_keys(x.astype(np.float32), w.astype(np.float32), pos, D, 1e6),
                               rtol=1e-5, atol=1e-5)
    c2, s2, r2 = lowbit.nf4_kcache_quantize(k)
    assert np.array_equal(c, c2) and np.array_equal(s, s2) and np.array_equal(r.view(np.uint8), r2.view(np.uint8))
    # per-sequence positions [B, T] and an E4M3 residual
    pos2 = np.stack([pos, pos + 5]).astype(np.int64)
    c3, s3, r3 = lowbit.kproj_rope_nf4_encode(x, w, pos2, head_dim=D, rope_theta=1e6, residual_dtype="float8_e4m3fn")
    keys = np_keys(c3, s3, r3)
    ref = np_rope_keys(x.astype(np.float32), w.astype(np.float32), pos2, D, 1e6)
    assert np.abs(keys - ref).max() <= 0.02 * np.abs(ref).max()


def test_encode_argument_errors():
    x = np.zeros((1, 2, 8), np.float32)
    w = np.zeros((128, 8), np.float32)
    with pytest.raises(ValueError, match="head_dim"):
        lowbit.kproj_rope_nf4_encode(x, w, [0, 1], head_dim=63)
    with pytest.raises(ValueError, match="argument 'positions'"):
        lowbit.kproj_rope_nf4_encode(x, w, np.zeros((3,), np.int32), head_dim=64)
    with pytest.raises(ValueError, match="argument 'w_k'"):
        lowbit.kproj_rope_nf4_encode(x, w[:, :7], [0, 1], head_dim=64)


def test_append_policy():
    rng = np.random.default_rng(8)
    B, T, HK, D = 2, 16, 2, 64
    lens = np.array([5, 11], np.int32)
    k = rng.standard_normal((B, T, HK, D)).astype(np.float32)
    for b in range(B):
        k[b, lens[b]:] = 0
    c, s, r = lowbit.nf4_kcache_quantize(k)
    s0, c0, r0 = s.copy(), c.copy(), r.copy()
    new = (rng.standard_normal((B, 2, HK, D)) * 0.2).astype(np.float32)
    new[:, 0, :, ::4] = 4 * s0[:, :, ::4]  # every fourth channel outgrows its scale
    lowbit.nf4_kcache_append(new, c, s, r, lens)
    grown = np.zeros((B, HK, D), bool)
    grown[:, :, ::4] = True
    np.testing.assert_array_equal(s, np.where(grown, 4 * s0, s0))
    keys = np_keys(c, s, r)
    for b in range(B):
        L = lens[b]
        old, old0 = keys[b, :L], np_keys(c0, s0, r0)[b, :L]
        assert np.array_equal(old[..., ~grown[b]], old0[..., ~grown[b]])  # untouched channels
        assert np.abs(old - k[b, :L]).max() <= 0.04 * s.max()             # rewritten ones stay close
        assert np.abs(keys[b, L:L + 2] - new[b]).max() <= 0.02 * s.max()
        assert np.array_equal(c[b, L + 2:], c0[b, L + 2:])                 # past the new tokens: untouched
    with pytest.raises(ValueError, match="argument 'lengths'.*0..14"):
        lowbit.nf4_kcache_append(new, c, s, r, [15, 0])


def test_build_info_lists_the_decode_ops_on_cuda():
    """Every decode op has a CUDA path: none is in cpu_only_ops, and all three are in cuda_ops
    exactly when the sm_90a kernels are built (CUDA + CUTLASS, an sm_90 device)."""
    info = lowbit.build_info()
    ops = {"attn_forward_decode_nf4", "kproj_rope_nf4_encode", "nf4_kcache_append"}
    assert not ops & set(info["cpu_only_ops"])
    assert info["cpu_only_ops"] == []  # no op is CPU only any more
    if info["cuda_built"] and info["device_count"] and info["sm"] >= 90 and "nvfp4_dual_gemm_silu" in info["cuda_ops"]:
        assert ops <= set(info["cuda_ops"])  # the sm_90a kernels
    else:
        assert not ops & set(info["cuda_ops"])
