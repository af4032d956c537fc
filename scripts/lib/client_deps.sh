# scripts/lib/client_deps.sh: sourced by scripts/test.sh.
# install_client_deps PY: installs, pinned, into the environment of the Python PY, what the
# real-client tests need (tests/python/test_checkpoint_ct_client.py, the torch tests of
# tests/python/test_nn.py): torch on the CPU, transformers and compressed-tensors.
#
# torch comes from the PyTorch CPU index (about 200 MB, no CUDA libraries) where that index can be
# reached; where it cannot, from PyPI, whose Linux x86_64 torch is the CUDA build (about 4 GB with
# its nvidia-* libraries; it runs on the CPU all the same). transformers and compressed-tensors come
# from PyPI.
#
# Without a network the tests that need them skip: outside CI this prints why and returns 0; with
# CI=true a failed install fails (returns 1). LOWBIT_CLIENT_DEPS=0 skips the step (the tests skip).
LOWBIT_TORCH_VERSION=2.15.0
LOWBIT_TRANSFORMERS_VERSION=5.24.0
LOWBIT_COMPRESSED_TENSORS_VERSION=0.20.0
LOWBIT_TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

install_client_deps() {
  local py=$1 t0 torch_src
  if [ "${LOWBIT_CLIENT_DEPS:-1}" = "0" ]; then
    echo "== real-client test dependencies: skipped (LOWBIT_CLIENT_DEPS=0); those tests will skip"
    return 0
  fi
  if "$py" - "$LOWBIT_TORCH_VERSION" "$LOWBIT_TRANSFORMERS_VERSION" "$LOWBIT_COMPRESSED_TENSORS_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
want = dict(zip(("torch", "transformers", "compressed-tensors"), sys.argv[1:]))
sys.exit(0 if all(version(k).split("+")[0] == v for k, v in want.items()) else 1)
EOF
  then
    echo "== real-client test dependencies: torch $LOWBIT_TORCH_VERSION, transformers $LOWBIT_TRANSFORMERS_VERSION, compressed-tensors $LOWBIT_COMPRESSED_TENSORS_VERSION already installed"
    return 0
  fi
  t0=$(date +%s)
  if "$py" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)" \
       "$LOWBIT_TORCH_CPU_INDEX/torch/" >/dev/null 2>&1; then
    echo "== real-client test dependencies: torch $LOWBIT_TORCH_VERSION (CPU build) from the PyTorch CPU index"
    "$py" -m pip install -q --retries 2 --index-url "$LOWBIT_TORCH_CPU_INDEX" "torch==$LOWBIT_TORCH_VERSION" \
      || { _client_deps_failed "torch from the PyTorch CPU index"; return $?; }
  else
    echo "== real-client test dependencies: the PyTorch CPU index cannot be reached; torch $LOWBIT_TORCH_VERSION from PyPI (the CUDA build: about 4 GB with its nvidia-* libraries; it runs on the CPU too)"
    "$py" -m pip install -q --retries 2 "torch==$LOWBIT_TORCH_VERSION" || { _client_deps_failed "torch from PyPI"; return $?; }
  fi
  "$py" -m pip install -q --retries 2 "transformers==$LOWBIT_TRANSFORMERS_VERSION" \
    "compressed-tensors==$LOWBIT_COMPRESSED_TENSORS_VERSION" \
    || { _client_deps_failed "transformers / compressed-tensors from PyPI"; return $?; }
  echo "== real-client test dependencies installed in $(( $(date +%s) - t0 )) s"
}

# _client_deps_failed WHAT: says why; returns 1 in CI (CI=true), else 0 (the tests skip).
_client_deps_failed() {
  if [ "${CI:-}" = "true" ]; then
    echo "== real-client test dependencies: installing $1 failed (CI=true: the run fails)" >&2
    return 1
  fi
  echo "== real-client test dependencies: installing $1 failed (no network?); the tests that need torch, transformers or compressed-tensors will skip" >&2
  return 0
}
