"""NF4 K-cache decode attention on the GPU (lowbit.attn_forward_decode_nf4,
kproj_rope_nf4_encode, nf4_kcache_append and the lowbit:: torch ops); the CPU tests are in
test_decode_attention.py.

Marked gpu (skipped without torch + CUDA + a CUDA build). The sm_90a kernels do not exist yet:
every test calls the op and is marked xfail exactly when the op raises NotImplementedError (any
other error, or a wrong result, fails). The accuracy rule, unpruned (delta = inf):

    max|O - O_ref| <= 3 max|O_bf16 - O_ref| + 2^-9

O_ref the fp64 attention of the dequantized cache (nf4 * scale + residual, fp32 rule), O_bf16
the same attention in bf16 (bf16 copies of q, the dequantized keys and v; bf16 scores; softmax
in fp32; bf16 P @ V), both computed with torch on the GPU. Outputs are poisoned: an explicit
`out` filled with NaN, plus allocator memory filled with 0xFF (conftest.py).
"""

import math

import pytest

import lowbit

from decode_attention_common import NF4

NO_KERNEL = "no CUDA kernel yet for the NF4 decode ops (CPU reference only; docs/decode_attention.md)"

# (B, T, H_q, H_kv, D, Dv): B up to 64, GQA 32/8 and 64/8 and MHA 8/8, T = 1, odd and long
SHAPES = [(1, 1, 32, 8, 128, 128), (1, 4097, 32, 8, 128, 128), (3, 1000, 64, 8, 128, 128), (64, 257, 32, 8, 128, 128),
          (7, 63, 8, 8, 64, 64), (2, 777, 8, 8, 256, 256), (5, 129, 32, 8, 64, 128), (64, 33, 64, 8, 256, 64)]


def _torch():
    import torch

    return torch


def call_or_xfail(fn, *args, **kwargs):
    """fn(*args, **kwargs), or xfail when the op has no CUDA kernel (NotImplementedError)."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        assert "no CUDA kernel yet" in str(e), str(e)
        pytest.xfail(NO_KERNEL)


def t_cache(B, T, H, HK, D, DV, seed, sinks=False):
    """q, the cache (lowbit.nf4_kcache_quantize on the CPU, then moved), v on the GPU."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((B, T, HK, D), generator=g)
    if sinks:
        k[:, 8:T - 8] *= 0.1
    c, s, r = lowbit.nf4_kcache_quantize(k)
    q = torch.randn((B, 1, H, D), generator=g).to(torch.bfloat16)
    v = torch.randn((B, T, HK, DV), generator=g).to(torch.bfloat16)
    return tuple(t.cuda() for t in (q, c, s, r, v))


def t_keys(c, s, r):
    """fp64 keys [B, T, H_kv, D]: fp32 nf4 * scale + residual, element 2i in the low nibble."""
    torch = _torch()
    codes = torch.stack([c & 0xF, c >> 4], dim=-1).reshape(c.shape[:-1] + (2 * c.shape[-1],)).long()
    table = torch.tensor(NF4, device=c.device)
    return (table[codes] * s[:, None] + r.float()).double()


def t_references(q, c, s, r, v, lens):
    """(O_ref fp64, O_bf16) [B, H_q, Dv] over tokens t < lens[b]."""
    torch = _torch()
    K = t_keys(c, s, r)
    B, T, HK, D = K.shape
    H = q.shape[2]
    kk = K.repeat_interleave(H // HK, dim=2).permute(0, 2, 1, 3)  # [B, H, T, D]
    vv = v.double().repeat_interleave(H // HK, dim=2).permute(0, 2, 1, 3)
    qq = q.double()[:, 0, :, None, :]  # [B, H, 1, D]
    mask = torch.arange(T, device=q.device)[None, :] >= torch.as_tensor(lens, device=q.device)[:, None]  # [B, T]
    scale = 1 / math.sqrt(D)
    sc = (qq @ kk.transpose(-1, -2)) * scale
    sc = sc.masked_fill(mask[:, None, None, :], -math.inf)
    o_ref = (torch.softmax(sc, -1) @ vv)[:, :, 0]
    sb = ((qq.bfloat16() @ kk.bfloat16().transpose(-1, -2)) * scale).float()
    sb = sb.masked_fill(mask[:, None, None, :], -math.inf)
    o_bf = (torch.softmax(sb, -1).bfloat16() @ vv.bfloat16()).double()[:, :, 0]
    return o_ref, o_bf


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_t%d_h%d-%d_d%d-%d" % s)
@pytest.mark.parametrize("ragged", [False, True])
def test_gpu_unpruned_accuracy(shape, ragged):
    torch = _torch()
    B, T, H, HK, D, DV = shape
    q, c, s, r, v = t_cache(B, T, H, HK, D, DV, seed=T + B)
    lens = [max(1, T - (37 * b) % T) for b in range(B)] if ragged else [T] * B
    out = torch.full((B, H, DV), math.nan, dtype=torch.bfloat16, device="cuda")
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v, seq_lens=lens_t, delta=math.inf, out=out)
    torch.cuda.synchronize()
    o_ref, o_bf = t_references(q, c, s, r, v, lens)
    err = (out.double() - o_ref).abs().max().item()
    bound = 3 * (o_bf - o_ref).abs().max().item() + 2 ** -9
    assert torch.isfinite(out).all() and err <= bound, (err, bound)


@pytest.mark.gpu
@pytest.mark.parametrize("delta", [0.0, 2.0])
def test_gpu_pruning_matches_cpu_reference(delta):
    """Pruned: the skip ratio equal to the CPU reference's, the output within the rule of the
    reference over the same kept blocks (sinks make the middle blocks prunable)."""
    torch = _torch()
    B, T, H, HK, D = 4, 1000, 32, 8, 128
    q, c, s, r, v = t_cache(B, T, H, HK, D, D, seed=3, sinks=True)
    kw = dict(block_size=64, sub_block_size=16, delta=delta, return_skip_ratio=True)
    out, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q, c, s, r, v, **kw)
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(*(t.cpu() for t in (q, c, s, r, v)), **kw)
    # NOTE: block maxima near the threshold may round either way in fp32: allow a few blocks
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= 2 / 16
    assert (out.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6


@pytest.mark.gpu
def test_gpu_encode_and_append_match_cpu():
    torch = _torch()
    g = torch.Generator().manual_seed(9)
    x = torch.randn((2, 300, 256), generator=g).to(torch.bfloat16)
    w = (torch.randn((8 * 128, 256), generator=g) * 0.05).to(torch.bfloat16)
    pos = torch.arange(300, dtype=torch.int32)
    got = call_or_xfail(lowbit.kproj_rope_nf4_encode, x.cuda(), w.cuda(), pos.cuda(), head_dim=128, rope_theta=1e6)
    want = lowbit.kproj_rope_nf4_encode(x, w, pos, head_dim=128, rope_theta=1e6)
    assert torch.equal(got[1].cpu(), want[1])  # scales: the fp32 amax of the same fp32 keys
    new = torch.randn((2, 1, 8, 128), generator=g) * 3
    c, s, r = (t.clone() for t in want)
    cg, sg, rg = (t.cuda() for t in want)
    lens = torch.tensor([200, 299], dtype=torch.int32)
    call_or_xfail(lowbit.nf4_kcache_append, new.cuda(), cg, sg, rg, lens.cuda())
    lowbit.nf4_kcache_append(new, c, s, r, lens)
    assert torch.equal(cg.cpu(), c) and torch.equal(sg.cpu(), s)
    assert torch.equal(rg.cpu().view(torch.uint8), r.view(torch.uint8))


@pytest.mark.gpu
def test_gpu_torch_ops():
    torch = _torch()
    import lowbit.torch_ops  # noqa: F401  registers torch.ops.lowbit.*

    q, c, s, r, v = t_cache(2, 100, 8, 2, 64, 64, seed=1)
    out, ratio = call_or_xfail(torch.ops.lowbit.attn_forward_decode_nf4, q, c, s, r, v, None, None, 16, 16, math.inf)
    assert out.shape == (2, 8, 64) and ratio.shape == (2, 2)


def t_cache_variant(B, T, H, HK, D, seed, residual_dtype, nibble_order):
    """Like t_cache, with the residual dtype and nibble order of the cache chosen (sinks on)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((B, T, HK, D), generator=g)
    k[:, 8:T - 8] *= 0.1
    c, s, r = lowbit.nf4_kcache_quantize(k, residual_dtype=residual_dtype, nibble_order=nibble_order)
    q = torch.randn((B, 1, H, D), generator=g).to(torch.bfloat16)
    v = torch.randn((B, T, HK, D), generator=g).to(torch.bfloat16)
    return q, c, s, r, v


# (B, T, H_q, H_kv, D, block_size, residual dtype, nibble order, residual used): the fused kernel's
# block sizes (divisors of its 128-token tile), the generic kernels' (256, 100), MQA with 16 query
# heads per KV head (two head chunks scoring all heads), both residual dtypes, both nibble orders
PRUNED = [(2, 1000, 32, 8, 128, 16, "float8_e5m2", "low", True), (2, 1000, 32, 8, 128, 32, "float8_e4m3fn", "high", True),
          (3, 777, 64, 8, 64, 128, "float8_e5m2", "low", True), (1, 700, 16, 1, 128, 64, "float8_e4m3fn", "low", True),
          (2, 1500, 32, 8, 256, 64, "float8_e5m2", "high", False), (2, 1000, 32, 8, 128, 256, "float8_e5m2", "low", True),
          (2, 1000, 8, 8, 128, 100, "float8_e5m2", "low", True), (4, 130, 4, 4, 64, 1, "float8_e5m2", "low", True)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", PRUNED, ids=lambda c: "b%d_t%d_h%d-%d_d%d_bs%d_%s_%s_res%d" % c)
def test_gpu_pruned_paths_match_cpu_reference(case):
    """Every pruning path (fused and generic kernels) against the CPU reference: skip ratio within
    a few blocks (block maxima near the threshold round either way in fp32), output within 2^-6."""
    torch = _torch()
    B, T, H, HK, D, bs, rdt, nib, use_res = case
    q, c, s, r, v = t_cache_variant(B, T, H, HK, D, seed=T + bs, residual_dtype=rdt, nibble_order=nib)
    lens = torch.tensor([T - (91 * b) % (T // 2) for b in range(B)], dtype=torch.int32)
    delta = 0.0 if H // HK > 8 else 1.0  # a block is skipped only when all H / H_kv heads are below
    kw = dict(block_size=bs, sub_block_size=1, delta=delta, return_skip_ratio=True, use_fp8_residual=use_res)
    r_arg = r if use_res else None
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(q, c, s, r_arg, v, seq_lens=lens, **kw)
    out = torch.full((B, H, D), math.nan, dtype=torch.bfloat16, device="cuda")
    got, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q.cuda(), c.cuda(), s.cuda(),
                               r_arg.cuda() if use_res else None, v.cuda(), seq_lens=lens.cuda(), out=out, **kw)
    torch.cuda.synchronize()
    n_blocks = (lens.max().item() + bs - 1) // bs
    assert ref_ratio.max().item() > 0.05  # the sinks make middle blocks prunable
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= max(2, n_blocks // 50) / n_blocks
    assert torch.isfinite(out).all()
    assert (out.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6


@pytest.mark.gpu
def test_gpu_precomputed_threshold_and_unaligned_rows():
    """A given threshold (no threshold kernel) and rows that do not start 16-byte aligned (codes
    viewed out of a wider buffer: the generic kernels) match the CPU reference."""
    torch = _torch()
    B, T, H, HK, D = 2, 600, 32, 8, 128
    q, c, s, r, v = t_cache_variant(B, T, H, HK, D, seed=5, residual_dtype="float8_e5m2", nibble_order="low")
    thr = torch.full((B, H), -0.5, dtype=torch.float32)
    kw = dict(precomputed_threshold=thr, return_skip_ratio=True)
    ref, ref_ratio = lowbit.attn_forward_decode_nf4(q, c, s, r, v, **kw)
    got, ratio = call_or_xfail(lowbit.attn_forward_decode_nf4, q.cuda(), c.cuda(), s.cuda(), r.cuda(), v.cuda(),
                               precomputed_threshold=thr.cuda(), return_skip_ratio=True)
    assert (ratio.cpu() - ref_ratio).abs().max().item() <= 2 / 10
    assert (got.cpu().double() - ref.double()).abs().max().item() <= 2 ** -6
    wide = torch.zeros((B, T, HK, D // 2 + 1), dtype=torch.uint8)
    wide[..., 1:] = c
    cu = wide.cuda()[..., 1:]  # last dim contiguous, rows 65 bytes apart
    got2 = lowbit.attn_forward_decode_nf4(q.cuda(), cu, s.cuda(), r.cuda(), v.cuda(), delta=math.inf)
    ref2 = lowbit.attn_forward_decode_nf4(q, c, s, r, v, delta=math.inf)
    assert (got2.cpu().double() - ref2.double()).abs().max().item() <= 2 ** -6
