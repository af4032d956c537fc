"""Paged caches (block tables) in the NF4 K-cache decode ops on the CPU: attn_forward_decode_nf4
over a cache scattered into pages gives the bits of the dense call (bf16 and FP8 V, pruned and
not), nf4_kcache_append / fp8_vcache_append into pages write the bytes of the dense appends,
argument errors. The GPU forms are in test_decode_attention_gpu.py."""

import math

import numpy as np
import pytest

import lowbit

from decode_attention_common import make_cache, make_v8


def paginate(x, page, table, pages):
    """[B, T, ...] -> [pages, page, ...]: token t of sequence b to row t % page of page
    table[b, t // page] (unused pages filled with 0xEE bytes)."""
    x = np.asarray(x)
    out = np.full((pages, page) + x.shape[2:], 0xEE, np.uint8).view(x.dtype) if x.dtype.itemsize == 1 else \
        np.full((pages, page) + x.shape[2:], np.nan, x.dtype)
    B, T = x.shape[:2]
    for b in range(B):
        for j in range(-(-T // page)):
            n = min(page, T - j * page)
            out[table[b, j], :n] = x[b, j * page:j * page + n]
    return out


def gather(xp, page, table, B, T):
    """The inverse of paginate: [pages, page, ...] -> [B, T, ...]."""
    out = np.empty((B, T) + xp.shape[2:], xp.dtype)
    for b in range(B):
        for j in range(-(-T // page)):
            n = min(page, T - j * page)
            out[b, j * page:j * page + n] = xp[table[b, j], :n]
    return out


def random_table(B, T, page, rng, spare=3):
    """A block table of distinct pages in random order (and a few pages nobody uses)."""
    per = -(-T // page)
    pages = B * per + spare
    ids = rng.permutation(pages)[: B * per].reshape(B, per).astype(np.int32)
    return ids, pages


@pytest.mark.parametrize("page", [1, 16, 64, 256])
@pytest.mark.parametrize("v8", [False, True])
@pytest.mark.parametrize("delta", [math.inf, 1.0])
def test_paged_attention_is_the_dense_one(page, v8, delta):
    rng = np.random.default_rng(page + 7 * v8)
    B, T, H, HK, D = 3, 300, 8, 2, 64
    q, c, s, r, v = make_cache(B, T, H, HK, D, D, seed=page, sinks=True)
    vs = None
    if v8:
        v, vs = make_v8(B, T, HK, D, seed=page + 1)
    lens = np.array([T, 1, 177], np.int32)
    kw = dict(seq_lens=lens, block_size=16, delta=delta, return_skip_ratio=True, v_scale=vs)
    dense, dr = lowbit.attn_forward_decode_nf4(q, c, s, r, v, **kw)
    table, pages = random_table(B, T, page, rng)
    pc, pr, pv = (paginate(x, page, table, pages) for x in (c, r, v))
    paged, pratio = lowbit.attn_forward_decode_nf4(q, pc, s, pr, pv, block_table=table, **kw)
    assert np.array_equal(paged.view(np.uint16), dense.view(np.uint16)) and np.array_equal(pratio, dr)


@pytest.mark.parametrize("page", [4, 32])
def test_paged_appends_write_the_dense_bytes(page):
    rng = np.random.default_rng(page)
    B, T, H, D, N = 2, 40, 2, 32, 3
    k = rng.standard_normal((B, T, H, D)).astype(np.float32)
    vals = rng.standard_normal((B, T, H, D)).astype(np.float32)
    c, s, r = lowbit.nf4_kcache_quantize(k)
    vc, vsc = lowbit.fp8_vcache_quantize(vals)
    table, pages = random_table(B, T, page, rng)
    pc, pr, pvc = (paginate(x, page, table, pages) for x in (c, r, vc))
    ps, pvs = s.copy(), vsc.copy()
    lens = np.array([10, 37], np.int32)
    new = rng.standard_normal((B, N, H, D)).astype(np.float32) * np.float32(3)  # outgrows some channels
    lowbit.nf4_kcache_append(new, c, s, r, lens)
    lowbit.nf4_kcache_append(new, pc, ps, pr, lens, block_table=table)
    lowbit.fp8_vcache_append(new, vc, vsc, lens)
    lowbit.fp8_vcache_append(new, pvc, pvs, lens, block_table=table)
    assert np.array_equal(ps, s) and np.array_equal(pvs, vsc)
    for dense, paged in ((c, pc), (r, pr), (vc, pvc)):
        got = gather(paged, page, table, B, T)
        for b in range(B):  # the tokens each sequence holds after the append
            n = lens[b] + N
            assert np.array_equal(got[b, :n].view(np.uint8), dense[b, :n].view(np.uint8))


def test_paged_argument_errors():
    rng = np.random.default_rng(1)
    q, c, s, r, v = make_cache(2, 32, 4, 2, 64, 64, seed=3)
    table, pages = random_table(2, 32, 8, rng)
    pc, pr, pv = (paginate(x, 8, table, pages) for x in (c, r, v))
    call = lowbit.attn_forward_decode_nf4
    lens = np.array([32, 5], np.int32)
    with pytest.raises(ValueError, match="argument 'seq_lens'.*required with a block_table"):
        call(q, pc, s, pr, pv, block_table=table)
    bad = table.copy()
    bad[1, 0] = pages
    with pytest.raises(ValueError, match=r"argument 'block_table'.*entry \[1, 0\].*page id in 0\.\.%d" % (pages - 1)):
        call(q, pc, s, pr, pv, seq_lens=lens, block_table=bad)
    bad[1, 0], bad[1, 3] = table[1, 0], -1  # an unused entry (sequence 1 holds 5 tokens: page 0 only)
    call(q, pc, s, pr, pv, seq_lens=lens, block_table=bad)
    with pytest.raises(ValueError, match="argument 'block_table'.*one row per sequence"):
        call(q, pc, s, pr, pv, seq_lens=lens, block_table=table[:1].copy())
    with pytest.raises(ValueError, match="argument 'block_table'.*int32"):
        call(q, pc, s, pr, pv, seq_lens=lens, block_table=table.astype(np.int64))
    with pytest.raises(ValueError, match="argument 'k_nf4'.*power of two"):
        call(q, pc[:, :6].copy(), s, pr[:, :6].copy(), pv[:, :6].copy(), seq_lens=np.array([5, 5], np.int32),
             block_table=table)
    with pytest.raises(ValueError, match="argument 'seq_lens'.*1..32"):
        call(q, pc, s, pr, pv, seq_lens=np.array([33, 1], np.int32), block_table=table)
    with pytest.raises(ValueError, match="argument 'v'.*shape"):
        call(q, pc, s, pr, v, seq_lens=lens, block_table=table)
    new = np.zeros((2, 1, 2, 64), np.float32)
    with pytest.raises(ValueError, match=r"nf4_kcache_append: argument 'block_table'.*entry \[0, 1\]"):
        t2 = table.copy()
        t2[0, 1] = 99
        lowbit.nf4_kcache_append(new, pc, s.copy(), pr, np.array([8, 0], np.int32), block_table=t2)
    vc, vsc = lowbit.fp8_vcache_quantize(np.zeros((2, 30, 2, 64), np.float32))
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'codes'.*power of two"):
        lowbit.fp8_vcache_append(new, vc, vsc, np.array([0, 0], np.int32), block_table=table)
    with pytest.raises(ValueError, match="fp8_vcache_append: argument 'codes'.*shape"):
        lowbit.fp8_vcache_append(new, vc[..., :32].copy(), vsc, np.array([0, 0], np.int32), block_table=table)
