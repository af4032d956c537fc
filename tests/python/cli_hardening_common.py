"""Shared pieces of the command line's hardening tests (test_cli_hardening.py,
test_cli_hardening_reader.py): running main in-process, the one-line error check, files left
behind, raw files, and the fixtures ckpt (a small float checkpoint) and no_work (fails a test
whose refusal comes after the work started)."""

import os
import struct

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import safetensors_io as st
from lowbit.cli import main


RNG = np.random.default_rng(77)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(lowbit.__file__)))


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def leftovers(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmp") or p.startswith("."))


def raw_file(path, header_bytes, data=b""):
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return path


@pytest.fixture
def ckpt(tmp_path):
    t = {
        "a.weight": RNG.standard_normal((32, 128)).astype(np.float32),
        "b.weight": RNG.standard_normal((16, 64)).astype(ml_dtypes.bfloat16),
        "norm": np.ones(64, np.float32),
    }
    path = tmp_path / "in.safetensors"
    st.save(path, t)
    return path, t


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if any tensor is quantized (the refusal must come before the work)."""
    calls = []

    def quantize(*a, **k):
        calls.append(1)
        raise AssertionError("quantize was called: the refusal came after the work started")

    monkeypatch.setattr(lowbit, "quantize", quantize)
    return calls


def _mode(p):
    return os.lstat(p).st_mode
