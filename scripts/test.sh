#!/usr/bin/env bash
# Sets up a fresh Debian machine (2 cores, no GPU needed) and runs the whole lowbit test suite:
# the C++ tests (ctest, GPU-labelled tests excluded unless a GPU is usable) and the Python tests
# (pytest; GPU-marked tests skip without a device).
#
#   bash scripts/test.sh
#
# Environment: LOWBIT_VENV (default .venv), LOWBIT_BUILD_DIR (default build/test),
# LOWBIT_ENABLE_CUDA=OFF to skip the CUDA kernels even where nvcc exists, LOWBIT_CLIENT_DEPS=0 to
# leave out torch / transformers / compressed-tensors (their tests then skip). Without a network
# those three are left out with a message, except in CI (CI=true), where that fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv=${LOWBIT_VENV:-$root/.venv}
build=${LOWBIT_BUILD_DIR:-$root/build/test}
cuda=${LOWBIT_ENABLE_CUDA:-ON}

# 1. Debian packages (only what is missing; needs root or sudo).
source "$root/scripts/lib/debian_deps.sh"
ensure_build_tools gtest

# 2. Python environment (PyPI): build tools, test deps, pinned CUTLASS headers.
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "numpy" "ml_dtypes>=0.5" "pytest" "nanobind>=2.10" "scikit-build-core>=0.10"

# 2b. The real-client tests' dependencies, pinned: torch (CPU), transformers, compressed-tensors
# (before the CUTLASS wheel, whose dependencies are left out on purpose: pip would list them).
source "$root/scripts/lib/client_deps.sh"
install_client_deps "$py"
"$py" -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"

# 3. One CMake build serves the Python module and the C++ tests.
echo "== building lowbit (CUDA kernels: $cuda, build dir $build)"
"$py" -m pip install -q --no-build-isolation . \
  -Cbuild-dir="$build" \
  -Ccmake.define.LOWBIT_BUILD_TESTS=ON \
  -Ccmake.define.LOWBIT_ENABLE_CUDA="$cuda" \
  -Ccmake.define.Python3_EXECUTABLE="$py"

# 4. C++ tests. GPU tests only where a GPU is usable.
echo "== C++ tests"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  ctest --test-dir "$build" --output-on-failure -j2
else
  ctest --test-dir "$build" --output-on-failure -j2 -LE gpu
fi

# 5. Python tests (from the repo root, against the installed package).
echo "== Python tests"
cd "$root/tests/python"
"$py" -m pytest -q -p no:cacheprovider "$root/tests/python"
