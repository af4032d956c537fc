"""pytest configuration of the Python tests.

Tests marked `gpu` need torch with a usable CUDA device and lowbit built with its CUDA kernels;
they are skipped (never failed) elsewhere. The marker is registered here and in pyproject.toml
(--strict-markers).
"""

import importlib.util
import sys

import pytest

sys.dont_write_bytecode = True


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and torch with CUDA (skipped otherwise)")


def _gpu_skip_reason():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    import lowbit

    info = lowbit.build_info()
    if not info["cuda_built"]:
        return "lowbit was built without CUDA kernels"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason:
        for it in gpu_items:
            it.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def torch():
    """The torch module, or skip."""
    return pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _poison_cuda_free_memory(request):
    """Before each gpu test: fill the blocks that torch's CUDA caching allocator will hand out next
    with 0xFF bytes (NaN in every float format), so an output element a kernel never writes reads
    0xFF instead of a value left by an earlier, correct call. Outputs allocated inside lowbit come
    from the same allocator. Small requests (<= 1 MiB) are carved from 2 MiB segments, requests
    below 10 MiB from 20 MiB segments, so whole segments of both pools are filled, plus two large
    blocks."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    sizes = [1 << 20] * 16 + [5 << 20] * 8 + [64 << 20] * 2
    blocks = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    del blocks
    yield
