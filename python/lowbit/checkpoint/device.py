"""Where `lowbit quantize` runs: NumPy arrays on the CPU reference, or torch tensors on a CUDA
device (torch is imported only when the CUDA backend is asked for: it is optional), and the error
statistics of a quantized tensor."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

import lowbit

from .._arrays import ml_dtypes_storage
from .schema import CheckpointError


def cuda_status() -> Tuple[bool, str]:
    """(usable, reason): whether quantize can run on a CUDA device through torch."""
    info = lowbit.build_info()
    if not info.get("cuda_built"):
        return False, "lowbit was built without CUDA kernels"
    if not info.get("device_count"):
        return False, "no CUDA device is usable"
    ops = set(info.get("cuda_ops") or ())
    if ops and not {"quantize", "dequantize"} <= ops:
        return False, "quantize/dequantize do not run on the device in this build"
    try:
        import torch  # noqa: F401
    except ImportError:
        return False, "torch is not installed (CUDA arrays are passed as torch tensors)"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, f"{info.get('device_name', 'CUDA device')} (sm_{info.get('sm', '?')})"


class Backend:
    """Moves NumPy arrays to where the kernels run and back."""

    name = "cpu"

    def put(self, a: np.ndarray):
        # A private, writable, contiguous copy (memory-mapped inputs are read-only).
        return np.array(a, order="C", copy=True)

    def get(self, t) -> Optional[np.ndarray]:
        return None if t is None else np.asarray(t)

    def error_stats(self, x, xh) -> Tuple[float, float, float, float, float]:
        """(SQNR dB, max |x - xh|, max |x|, sum x^2, sum (x - xh)^2), in float64 by chunks of rows."""
        x2 = np.asarray(x).reshape(-1, np.asarray(x).shape[-1]) if np.ndim(x) else np.asarray(x).reshape(1, 1)
        y2 = np.asarray(xh).reshape(x2.shape)
        sig = noise = 0.0
        maxerr = maxabs = 0.0
        rows = max(1, (1 << 22) // max(1, x2.shape[1]))
        for i in range(0, x2.shape[0], rows):
            a = x2[i:i + rows].astype(np.float64)
            d = a - y2[i:i + rows].astype(np.float64)
            sig += float(np.sum(a * a))
            noise += float(np.sum(d * d))
            if d.size:
                maxerr = nanmax(maxerr, float(np.max(np.abs(d))))
                maxabs = nanmax(maxabs, float(np.max(np.abs(a))))
        return _sqnr(sig, noise), maxerr, maxabs, sig, noise

    def nonfinite(self, x) -> Tuple[int, int]:
        """(number of NaN, number of +-Inf) values of x."""
        a = np.asarray(x)
        nan = inf = 0
        flat = a.reshape(-1)
        step = 1 << 24
        for i in range(0, flat.size, step):
            c = flat[i:i + step]
            nan += int(np.count_nonzero(np.isnan(c)))
            inf += int(np.count_nonzero(np.isinf(c)))
        return nan, inf


class TorchCudaBackend(Backend):
    name = "cuda"

    def __init__(self):
        import torch

        self.torch = torch
        # NumPy dtypes torch.from_numpy cannot take (the ml_dtypes types): a same-itemsize integer
        # view on both sides
        bits = {1: (np.uint8, torch.uint8), 2: (np.int16, torch.int16)}
        self._np_views = {}
        self._torch_views = {}
        for name, npd in ml_dtypes_storage():
            tdt = getattr(torch, name, None)
            if tdt is None:
                continue
            np_bits, t_bits = bits[npd.itemsize]
            self._np_views[npd] = (np_bits, tdt)
            self._torch_views[tdt] = (t_bits, npd)

    def put(self, a: np.ndarray):
        torch = self.torch
        a = np.ascontiguousarray(a)
        view = self._np_views.get(a.dtype)
        if view is not None:
            t = torch.from_numpy(np.array(a.view(view[0]), copy=True)).view(view[1])
        else:
            t = torch.from_numpy(np.array(a, copy=True))
        return t.to("cuda", non_blocking=False)

    def get(self, t) -> Optional[np.ndarray]:
        if t is None:
            return None
        torch = self.torch
        if not isinstance(t, torch.Tensor):
            return np.asarray(t)
        t = t.detach().contiguous().cpu()
        view = self._torch_views.get(t.dtype)
        if view is not None:
            return t.view(view[0]).numpy().view(view[1])
        return t.numpy()

    def error_stats(self, x, xh) -> Tuple[float, float, float, float, float]:
        torch = self.torch
        a = x.double()
        d = a - xh.double()
        sig = float(torch.sum(a * a))
        noise = float(torch.sum(d * d))
        maxerr = float(d.abs().max()) if d.numel() else 0.0
        maxabs = float(a.abs().max()) if a.numel() else 0.0
        return _sqnr(sig, noise), maxerr, maxabs, sig, noise

    def nonfinite(self, x) -> Tuple[int, int]:
        torch = self.torch
        return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def nanmax(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """max of two floats that is NaN when either is NaN (Python's max(0.0, nan) is 0.0); None is
    ignored."""
    if a is None:
        return b
    if b is None:
        return a
    if math.isnan(a) or math.isnan(b):
        return float("nan")
    return a if a >= b else b


def _sqnr(sig: float, noise: float) -> float:
    if math.isnan(sig) or math.isnan(noise):
        return float("nan")
    if noise == 0.0:
        return float("inf")
    if sig == 0.0:
        return float("-inf")
    return 10.0 * math.log10(sig / noise)


def make_backend(device: str) -> Backend:
    if device == "cpu":
        return Backend()
    usable, why = cuda_status()
    if device == "cuda":
        if not usable:
            raise CheckpointError(f"--device cuda: {why}")
        return TorchCudaBackend()
    if device == "auto":
        return TorchCudaBackend() if usable else Backend()
    raise CheckpointError(f"unknown device {device!r} (auto, cpu or cuda)")
