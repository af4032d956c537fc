"""Shared pieces of the dense-linear tests (test_linear.py on the CPU, test_linear_gpu.py on CUDA):
random operands of mxfp4_gemm / nvfp4_gemm built from raw bytes in NumPy, their stored scale
layouts, and float64 references decoded here from the format tables (independent of lowbit)."""

import ml_dtypes
import numpy as np

from npref import to_layout

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)
ACT_DTYPES = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
OUT_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def codes_f64(q, K):
    """[R, K/2] packed E2M1 bytes (element 2k in the low nibble) -> float64 [R, K]."""
    q = np.asarray(q, dtype=np.uint8)
    return E2M1[np.stack([q & 0xF, q >> 4], axis=-1).reshape(q.shape[0], K)]


def ue8m0_f64(s, block):
    return np.repeat(np.ldexp(1.0, np.asarray(s, dtype=np.int64) - 127), block, axis=1)


def e4m3_f64(s, block):
    return np.repeat(np.asarray(s, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64), block, axis=1)


class MxOps:
    """mxfp4_gemm operands: a [M, K] (bf16 or fp8 codes), a_sc [M, K/32] UE8M0 bytes (None for
    bf16), b [N, K/2] E2M1 bytes, b_sc [N, K/32] UE8M0 bytes, bias float32 [N] or None."""

    def __init__(self, M, N, K, act="bf16", bias=False, seed=0):
        rng = np.random.default_rng(seed)
        self.M, self.N, self.K, self.act = M, N, K, act
        self.b = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
        # scales keep sum_k |a_k b_k| moderate (well below 2^10 at K = 4096), so an fp32
        # accumulation stays far inside the rule's 1e-3 absolute term
        self.b_sc = rng.integers(116, 123, size=(N, K // 32), dtype=np.uint8)
        if act == "bf16":
            self.a = rng.standard_normal((M, K), dtype=np.float32).astype(ml_dtypes.bfloat16)
            self.a_sc = None
        else:
            x = rng.standard_normal((M, K), dtype=np.float32) * 4
            self.a = x.astype(ACT_DTYPES[act])  # |x| far below 448 / 57344: no saturation, no NaN
            self.a_sc = rng.integers(121, 129, size=(M, K // 32), dtype=np.uint8)
        self.bias = rng.standard_normal(N).astype(np.float32) if bias else None

    def reference(self):
        """float64 C of the quantized operands (no output rounding)."""
        A = self.a.astype(np.float64)
        if self.a_sc is not None:
            A = A * ue8m0_f64(self.a_sc, 32)
        B = codes_f64(self.b, self.K) * ue8m0_f64(self.b_sc, 32)
        C = A @ B.T
        return C + self.bias if self.bias is not None else C


class NvOps:
    """nvfp4_gemm operands: a bf16 [M, K] or NVFP4 codes [M, K/2] with a_sc [M, K/16] E4M3 bytes,
    b [N, K/2] with b_sc [N, K/16], optional per-tensor amaxes and bias."""

    def __init__(self, M, N, K, nvfp4_a=True, amax=False, bias=False, seed=0):
        rng = np.random.default_rng(seed)
        self.M, self.N, self.K, self.nvfp4_a = M, N, K, nvfp4_a

        def e4m3(shape):
            return rng.random(shape, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)

        self.b = rng.integers(0, 256, size=(N, K // 2), dtype=np.uint8)
        self.b_sc = e4m3((N, K // 16))
        if nvfp4_a:
            self.a = rng.integers(0, 256, size=(M, K // 2), dtype=np.uint8)
            self.a_sc = e4m3((M, K // 16))
        else:
            self.a = rng.standard_normal((M, K), dtype=np.float32).astype(ml_dtypes.bfloat16)
            self.a_sc = None
        self.amax_a = np.array([3.0], np.float32) if amax and nvfp4_a else None
        self.amax_b = np.array([700.0], np.float32) if amax else None
        self.bias = rng.standard_normal(N).astype(np.float32) if bias else None

    def reference(self):
        """float64 C (the per-tensor decode scales as the library's fp32 formula gives them)."""
        if self.nvfp4_a:
            A = codes_f64(self.a, self.K) * e4m3_f64(self.a_sc, 16)
        else:
            A = self.a.astype(np.float64)
        B = codes_f64(self.b, self.K) * e4m3_f64(self.b_sc, 16)
        C = A @ B.T

        def sdec(amax):  # 1 / (448 * 6 / amax), each step in fp32
            return np.float32(1) / (np.float32(2688) / np.float32(amax[0]))

        s = np.float32(1)
        if self.amax_a is not None:
            s = sdec(self.amax_a)
        if self.amax_b is not None:
            s = np.float32(s * sdec(self.amax_b))
        C = C * np.float64(s)
        return C + self.bias if self.bias is not None else C


def stored(sc, layout):
    """A row-major [R, C] scale matrix in `layout` ("row_major" or "blocked128x4")."""
    return sc if layout == "row_major" else to_layout(sc, "blocked128x4")


def out_ulp(ref, out_dtype):
    """The spacing of `out_dtype` at |ref| (bf16: 8 significant bits, fp16: 11; fp16 subnormals)."""
    mant, emin = (7, -126) if out_dtype == "bfloat16" else (10, -14)
    e = np.floor(np.log2(np.maximum(np.abs(ref), 2.0 ** emin)))
    return np.ldexp(1.0, (e - mant).astype(np.int64))


def assert_gemm_rule(got, ref, out_dtype, label=""):
    """The library's GEMM rule: |got - ref| <= 1e-3 + 1e-3 |ref| per element against the float64
    reference of the quantized operands, widened by one output ulp at ref for the rounding to the
    output dtype (a bf16 ulp is 2^-8 relative, larger than the rule's 1e-3). No NaN may remain."""
    got = np.asarray(got).astype(np.float64)
    assert not np.isnan(got).any(), f"{label}: {int(np.isnan(got).sum())} NaN outputs (unwritten elements?)"
    err = np.abs(got - ref)
    tol = 1e-3 + 1e-3 * np.abs(ref) + out_ulp(ref, out_dtype)
    bad = err > tol
    assert not bad.any(), (f"{label}: {int(bad.sum())} of {bad.size} elements outside the GEMM rule; worst at "
                           f"{np.unravel_index(np.argmax(err - tol), err.shape)}: got "
                           f"{got.flat[np.argmax(err - tol)]}, ref {ref.flat[np.argmax(err - tol)]}")


def np_nvfp4_pack(b, b_sc):
    """The prepacked chunks, independently: chunk (rb, kt) of 2304 bytes holds rows 64 rb.. and
    K 64 kt..: thread tid = 32 w + 4 g + t of the CUDA kernel gets, per 16-deep step s, a 32-bit
    word of the codes of rows 16 w + g (+8) at K 16 s + 2 t (+1, +8, +9): code (row + 8 hi,
    k0 + 8 kh + odd) at bit 4 (2 kh + hi) + 16 odd; then row r's four E4M3 scales at 2048 + 4 r."""
    N, K = b.shape[0], 2 * b.shape[1]
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(N, K).astype(np.uint32)
    out = np.zeros((N // 64, K // 64, 2304), np.uint8)
    for rb in range(N // 64):
        for kt in range(K // 64):
            words = np.zeros((128, 4), np.uint32)
            for tid in range(128):
                w, lane = divmod(tid, 32)
                g, t = divmod(lane, 4)
                for s in range(4):
                    for hi in range(2):
                        for kh in range(2):
                            for odd in range(2):
                                row = 64 * rb + 16 * w + g + 8 * hi
                                k = 64 * kt + 16 * s + 2 * t + 8 * kh + odd
                                words[tid, s] |= codes[row, k] << np.uint32(4 * (2 * kh + hi) + 16 * odd)
            out[rb, kt, :2048] = words.astype("<u4").view(np.uint8).reshape(-1)
            out[rb, kt, 2048:] = b_sc[64 * rb:64 * rb + 64, 4 * kt:4 * kt + 4].reshape(-1)
    return out.reshape(-1)
