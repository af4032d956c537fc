"""The NaN / Inf policy of every format (docs/formats.md, "NaN, Inf and overflow"), on CPU.

* A block holding NaN or +-Inf decodes to NaN (NaN scale code); every other block is byte for
  byte what it would be without the non-finite values (the NVFP4 global amax ignores them).
* A non-finite value never makes a finite block or token non-finite, and finite input never
  overflows to Inf (UINT4 blocks wider than FLT_MAX).
* NF4 K cache: channel scales over the finite tokens; a NaN token decodes to NaN, +-Inf to
  +-Inf with an E5M2 residual (NaN with E4M3, which has no Inf).

The same inputs run on the GPU against the CPU reference in test_nan_policy_gpu below and in
tests/cpp/gpu_test_conversions.cpp (NanPolicy*).
"""

import ml_dtypes
import numpy as np
import pytest

import lowbit

BF16 = ml_dtypes.bfloat16
FLT_MAX = float(np.finfo(np.float32).max)

# (name, Format kwargs): every format and the scale-rule / scale-type variants
CASES = [
    ("mxfp8_e4m3", {}),
    ("mxfp8_e4m3", {"rounding": "floor"}),
    ("mxfp8_e5m2", {}),
    ("mxfp8_e5m2", {"rounding": "floor"}),
    ("mxfp4", {}),
    ("mxfp4", {"rounding": "floor"}),
    ("nvfp4", {}),
    ("fp8_e4m3", {"block": 32}),
    ("fp8_e4m3", {"block": 32, "scale_dtype": "ue8m0"}),
    ("fp8_e5m2", {"block": 32}),
    ("int4", {"block": 32}),
    ("int4", {"block": 32, "scale_dtype": "ue8m0"}),
    ("uint4", {"block": 32}),
    ("nf4", {"block": 32}),
]
IDS = [n + ("-" + "-".join(f"{k}={v}" for k, v in kw.items()) if kw else "") for n, kw in CASES]
NAN_SCALE = {"float32": None, "float8_e8m0fnu": 0xFF, "float8_e4m3fn": 0x7F}


def _quantize(x, name, kw):
    extra = {"compute_global_amax": True} if name == "nvfp4" else {}
    return lowbit.quantize(x, name, **kw, **extra)


def _scale_bits(qt):
    s = np.ascontiguousarray(qt.scales)
    return s.view(np.uint32) if s.dtype == np.float32 else s.view(np.uint8)


def _is_nan_scale(qt):
    s = np.ascontiguousarray(qt.scales)
    if s.dtype == np.float32:
        return np.isnan(s)
    return s.view(np.uint8) == NAN_SCALE[str(s.dtype)]


def _codes(qt, block):
    """One row of codes per block: [M, C, block] (4-bit formats: two nibbles per byte)."""
    d = np.ascontiguousarray(qt.data).view(np.uint8)
    M = d.shape[0]
    return d.reshape(M, -1, block // 2 if qt.format.packed else block)


def _data(rng, M, K, scale=1.0):
    return (rng.standard_normal((M, K)) * scale).astype(np.float32)


def _specials(x, block):
    """NaN in block (1, 0), +Inf in block (2, 1), -Inf in (3, 2), NaN and Inf in (4, 0); returns
    the dirty copy and the mask of the blocks that hold them."""
    y = x.copy()
    y[1, 0 * block + 3] = np.nan
    y[2, 1 * block + 5] = np.inf
    y[3, 2 * block + 0] = -np.inf
    y[4, 0 * block + 1] = np.nan
    y[4, 0 * block + 2] = -np.inf
    bad = np.zeros((x.shape[0], x.shape[1] // block), bool)
    for m, c in [(1, 0), (2, 1), (3, 2), (4, 0)]:
        bad[m, c] = True
    return y, bad


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16])
def test_finite_blocks_unchanged_by_nonfinite_elsewhere(name, kw, dtype):
    f = lowbit.Format(name, **kw)
    B = f.block
    M, K = 6, 4 * B
    rng = np.random.default_rng(7)
    x = _data(rng, M, K, 3.0)
    dirty, bad = _specials(x, B)
    clean = np.where(np.isfinite(dirty), dirty, 0.0).astype(np.float32)
    xd, xc = dirty.astype(dtype), clean.astype(dtype)
    qd, qc = _quantize(xd, name, kw), _quantize(xc, name, kw)
    if name == "nvfp4":  # the global amax is the finite amax: the same for both tensors
        assert np.isfinite(qd.global_amax[0])
        assert qd.global_amax[0] == qc.global_amax[0] == np.max(np.abs(clean.astype(dtype).astype(np.float32)))
    sd, sc = _scale_bits(qd), _scale_bits(qc)
    np.testing.assert_array_equal(sd[~bad], sc[~bad])
    assert _is_nan_scale(qd)[bad].all()
    assert not _is_nan_scale(qc).any()
    cd, cc = _codes(qd, B), _codes(qc, B)
    np.testing.assert_array_equal(cd[~bad], cc[~bad])
    if qd.zeros is not None:
        np.testing.assert_array_equal(qd.zeros[~bad], qc.zeros[~bad])
        assert (qd.zeros[bad] == 0).all()
    yd, yc = lowbit.dequantize(qd), lowbit.dequantize(qc)
    ebad = np.repeat(bad, B, axis=1)
    np.testing.assert_array_equal(yd[~ebad].view(np.uint32), yc[~ebad].view(np.uint32))
    assert np.isnan(yd[ebad]).all()
    assert np.isfinite(yc).all()


def test_nvfp4_one_nan_keeps_every_finite_value():
    """Regression: one NaN with compute_global_amax=True made the global amax NaN and every
    finite value about +-7.9e-36."""
    rng = np.random.default_rng(0)
    x = _data(rng, 64, 256)
    ref = lowbit.dequantize(lowbit.quantize(x, "nvfp4", compute_global_amax=True))
    x[17, 33] = np.nan
    qt = lowbit.quantize(x, "nvfp4", compute_global_amax=True)
    assert qt.global_amax[0] == np.max(np.abs(np.nan_to_num(x, nan=0.0)))
    y = lowbit.dequantize(qt)
    nan_block = np.zeros(x.shape, bool)
    nan_block[17, 32:48] = True
    assert np.isnan(y[nan_block]).all()
    np.testing.assert_array_equal(y[~nan_block], ref[~nan_block])
    err = y[~nan_block] - x[~nan_block]
    assert 10 * np.log10(np.sum(x[~nan_block] ** 2) / np.sum(err ** 2)) > 17
    # an Inf does not enter the global amax either
    x[3, 3] = -np.inf
    qt = lowbit.quantize(x, "nvfp4", compute_global_amax=True)
    assert np.isfinite(qt.global_amax[0])
    # tensor_amax is the same finite amax
    np.testing.assert_array_equal(lowbit.tensor_amax(x), qt.global_amax)


def test_tensor_amax_ignores_nonfinite():
    x = np.array([[1.0, -3.0, np.nan, np.inf], [-np.inf, 2.0, 0.5, -0.0]], np.float32)
    assert lowbit.tensor_amax(x)[0] == 3.0
    for dt in (BF16, np.float16):
        assert lowbit.tensor_amax(x.astype(dt))[0] == 3.0
    assert lowbit.tensor_amax(np.full((2, 4), np.nan, np.float32))[0] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_uint4_block_wider_than_flt_max(dtype):
    """Regression: a UINT4 block holding +-2e38 got an Inf scale ((max - min) / 15 overflows) and
    decoded to NaN."""
    top = float(ml_dtypes.finfo(dtype).max)  # the largest finite value of the input dtype
    x = np.zeros((3, 32), np.float32)
    x[0, :] = np.linspace(-2e38, 2e38, 32)
    x[1, 0], x[1, 1] = 2e38, -2e38
    x[2, :] = np.where(np.arange(32) % 2 == 0, top, -top)
    x = x.astype(dtype).astype(np.float32)
    xd = x.astype(dtype)
    qt = lowbit.quantize(xd, "uint4", block=32)
    s = qt.scales.reshape(-1)
    assert np.isfinite(s).all()
    # s = max / 15 - min / 15 in fp32 where max - min overflows
    mx, mn = x.max(axis=1), x.min(axis=1)
    want = (mx / np.float32(15)).astype(np.float32) - (mn / np.float32(15)).astype(np.float32)
    np.testing.assert_array_equal(s, want)
    y = lowbit.dequantize(qt)
    assert np.isfinite(y).all()
    # within one step of the grid (rounding of the element and of the zero point)
    assert (np.abs(y.astype(np.float64) - x) <= s[:, None].astype(np.float64) * 1.0001).all()
    # the extreme codes whose value would overflow are not used: (q - zp) * s stays finite
    codes = np.stack([qt.data & 0xF, qt.data >> 4], -1).reshape(3, 32).astype(np.float64)
    assert (np.abs((codes - qt.zeros.reshape(-1, 1)) * s[:, None]) <= FLT_MAX).all()


def _rceil_pow2(name, kw):
    """Power-of-two scales rounded up (MX RCEIL, UE8M0 group scales): the element grid of a block
    near FLT_MAX reaches 2^128."""
    return (name.startswith("mx") and kw.get("rounding", "rceil") == "rceil") or kw.get("scale_dtype") == "ue8m0"


SAFE = [(c, i) for c, i in zip(CASES, IDS) if not _rceil_pow2(*c)]


@pytest.mark.parametrize("name,kw", [c for c, _ in SAFE], ids=[i for _, i in SAFE])
def test_finite_input_never_decodes_to_inf(name, kw):
    """Blocks up to +-FLT_MAX decode to finite values (UINT4: regression, the scale overflowed)."""
    f = lowbit.Format(name, **kw)
    rng = np.random.default_rng(11)
    rows = [np.full(f.block, FLT_MAX), np.where(np.arange(f.block) % 2 == 0, FLT_MAX, -FLT_MAX),
            np.linspace(-FLT_MAX, 1e38, f.block), rng.uniform(-1, 1, f.block) * FLT_MAX,
            np.full(f.block, -FLT_MAX), rng.uniform(0.9, 1.0, f.block) * FLT_MAX]
    x = np.stack(rows).astype(np.float32)
    y = lowbit.dequantize(_quantize(x, name, kw))
    assert np.isfinite(y).all(), y[~np.isfinite(y)]


@pytest.mark.parametrize("name,kw", [c for c in CASES if _rceil_pow2(*c)],
                         ids=[i for c, i in zip(CASES, IDS) if _rceil_pow2(*c)])
def test_rceil_pow2_scales_reach_inf_only_next_to_2_pow_128(name, kw):
    """RCEIL / UE8M0 scales: the codes are the OCP / TransformerEngine codes, whose value is
    2^128 (+-Inf in fp32) only for elements that round to it: |x| >= 1.75 * 2^127 at the least
    (E2M1, INT4; E5M2 1.875, E4M3 1.9375). Everything below decodes finite."""
    f = lowbit.Format(name, **kw)
    rng = np.random.default_rng(5)
    below = np.float32(1.75 * 2.0 ** 127 * (1 - 2 ** -20))
    x = (rng.uniform(-1, 1, (64, 4 * f.block)) * below).astype(np.float32)
    x[:, 0] = below
    assert np.isfinite(lowbit.dequantize(_quantize(x, name, kw))).all()
    y = lowbit.dequantize(_quantize(np.full((1, f.block), FLT_MAX, np.float32), name, kw))
    assert np.isinf(y).all() and (y > 0).all()  # FLT_MAX rounds to the element value 2^128


def test_nf4_block_with_tiny_absmax_keeps_zeros():
    """absmax < 2^-128: 1 / absmax overflows; the elements are divided by absmax so a zero stays
    0 (code 7) instead of 0 * Inf = NaN -> code 0 -> -absmax."""
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = np.float32(1e-40)
    x[0, 1] = -np.float32(5e-41)
    qt = lowbit.quantize(x, "nf4")
    y = lowbit.dequantize(qt)
    assert y[0, 0] == x[0, 0]
    assert (y[0, 2:] == 0).all()
    assert y[0, 1] < 0


@pytest.mark.parametrize("res", ["float8_e5m2", "float8_e4m3fn"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16])
def test_nf4_kcache_nonfinite_tokens(res, dtype):
    """Regression: +Inf came back as -Inf and the finite tokens of its channel as NaN."""
    B, T, H, D = 2, 9, 3, 32
    rng = np.random.default_rng(2)
    k = rng.standard_normal((B, T, H, D)).astype(np.float32)
    dirty = k.copy()
    dirty[0, 3, 1, 5] = np.inf
    dirty[0, 4, 1, 5] = np.nan  # same channel
    dirty[1, 0, 2, 6] = -np.inf
    dirty[1, 2, 0, 7] = np.nan
    clean = np.where(np.isfinite(dirty), dirty, 0.0).astype(np.float32)
    cd, sd, rd = lowbit.nf4_kcache_quantize(dirty.astype(dtype), res)
    cc, sc, rc = lowbit.nf4_kcache_quantize(clean.astype(dtype), res)
    np.testing.assert_array_equal(sd, sc)  # scales: the finite amax of each channel
    assert np.isfinite(sd).all()
    finite = np.isfinite(dirty)
    np.testing.assert_array_equal(rd.view(np.uint8)[finite], rc.view(np.uint8)[finite])
    pair_ok = finite[..., 0::2] & finite[..., 1::2]
    np.testing.assert_array_equal(cd[pair_ok], cc[pair_ok])
    yd = lowbit.nf4_kcache_dequantize(cd, sd, rd)
    yc = lowbit.nf4_kcache_dequantize(cc, sc, rc)
    np.testing.assert_array_equal(yd[finite].view(np.uint32), yc[finite].view(np.uint32))
    if res == "float8_e5m2":
        assert yd[0, 3, 1, 5] == np.inf
        assert yd[1, 0, 2, 6] == -np.inf
    else:  # E4M3 has no Inf
        assert np.isnan(yd[0, 3, 1, 5]) and np.isnan(yd[1, 0, 2, 6])
    assert np.isnan(yd[0, 4, 1, 5]) and np.isnan(yd[1, 2, 0, 7])


def test_nf4_kcache_channel_of_only_nonfinite_tokens():
    k = np.zeros((1, 4, 1, 2), np.float32)
    k[0, :, 0, 0] = [np.inf, np.nan, -np.inf, np.inf]
    k[0, :, 0, 1] = [1.0, -2.0, 0.5, 0.0]
    codes, scale, res = lowbit.nf4_kcache_quantize(k)
    assert scale[0, 0, 0] == 0.0 and scale[0, 0, 1] == 2.0
    y = lowbit.nf4_kcache_dequantize(codes, scale, res)
    np.testing.assert_array_equal(y[0, :, 0, 0], k[0, :, 0, 0])  # inf, nan, -inf, inf
    assert np.isnan(y[0, 1, 0, 0])
    assert np.isfinite(y[0, :, 0, 1]).all()


# ---------------------------------------------------------------------------------------------
# the same inputs on the GPU, byte for byte against the CPU reference

def _cuda(a):
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(a).cuda()


def _raw(a):
    """Bytes of a NumPy array or a torch tensor (any device) as a NumPy uint8 array."""
    import torch

    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return a.detach().contiguous().cpu().view(torch.uint8).numpy()
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.gpu
@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_nan_policy_gpu(name, kw, dtype):
    f = lowbit.Format(name, **kw)
    rng = np.random.default_rng(7)
    x, _ = _specials(_data(rng, 6, 4 * f.block, 3.0), f.block)
    x[0, :f.block] = np.linspace(-2e38, 2e38, f.block)  # UINT4: wider than FLT_MAX
    x[5, :f.block] = np.where(np.arange(f.block) % 2 == 0, 3.3e38, -3.3e38)
    x = x.astype(dtype)
    qc, qg = _quantize(x, name, kw), _quantize(_cuda(x), name, kw)
    for field in ("data", "scales", "zeros", "global_amax"):
        a, b = getattr(qc, field), getattr(qg, field)
        assert (a is None) == (b is None), field
        if a is not None:
            np.testing.assert_array_equal(_raw(a), _raw(b), err_msg=field)
    for out in ("float32", "bfloat16"):
        np.testing.assert_array_equal(_raw(lowbit.dequantize(qc, out)), _raw(lowbit.dequantize(qg, out)))
    np.testing.assert_array_equal(_raw(lowbit.tensor_amax(x)), _raw(lowbit.tensor_amax(_cuda(x))))


@pytest.mark.gpu
@pytest.mark.parametrize("res", ["float8_e5m2", "float8_e4m3fn"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_nf4_kcache_nonfinite_gpu(res, dtype):
    rng = np.random.default_rng(2)
    k = rng.standard_normal((2, 9, 3, 32)).astype(np.float32)
    k[0, 3, 1, 5], k[0, 4, 1, 5], k[1, 0, 2, 6], k[1, 2, 0, 7] = np.inf, np.nan, -np.inf, np.nan
    k[1, :, 1, 9] = np.inf  # a channel without a finite token: scale 0
    k = k.astype(dtype)
    cpu = lowbit.nf4_kcache_quantize(k, res)
    gpu = lowbit.nf4_kcache_quantize(_cuda(k), res)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(_raw(a), _raw(b))
    np.testing.assert_array_equal(_raw(lowbit.nf4_kcache_dequantize(*cpu)), _raw(lowbit.nf4_kcache_dequantize(*gpu)))
