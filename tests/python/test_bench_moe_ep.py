"""The CPU smoke run of bench/bench_moe_ep.py (2 ranks spawned with gloo, tiny shapes, the CPU
reference experts): every row runs without error, carries tokens/s and the all-to-all times, and
its single-process anchor; the NVLink-multicast variables are set in the report."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_moe_ep_cpu_smoke(tmp_path):
    out = tmp_path / "ep.json"
    from lowbit.moe import NVLS_ENV

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(NVLS_ENV)  # NVLink multicast off in the process started here (the bench sets it too)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_moe_ep.py"), "--device", "cpu",
                        "--backend", "gloo", "--nproc", "2", "--quick", "--warmup", "1", "--iters", "5",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(out.read_text())
    rows = rep["rows"]
    assert [row["shape"] for row in rows] == ["T16", "T32"]
    for row in rows:
        assert not row["error"], row["error"]
        assert row["op"] == "moe_ep_2cpu_bf16" and row["lowbit_us"] > 0
        assert "tokens/s" in row["note"] and "dispatch" in row["note"] and "dropped 0" in row["note"]
        assert row["anchor"] == "gpt_oss_moe_mlp_1cpu" and row["anchor_us"] > 0
    nv = rep["meta"]["nvlink_multicast"]
    for kv in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"):
        assert kv in nv
