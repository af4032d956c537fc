#!/usr/bin/env bash
# The main job: install lowbit into a virtual environment and quantize a checkpoint.
#
#   bash scripts/main.sh                         # demo: generate ./out/demo.safetensors (one bf16
#                                                # transformer layer) and quantize it to NVFP4 and MXFP4
#   bash scripts/main.sh IN.safetensors [FORMAT] # quantize IN to IN-minus-.safetensors.FORMAT.safetensors
#                                                # FORMAT: nvfp4 (default) mxfp4 mxfp8_e4m3 mxfp8_e5m2
#                                                #         fp8_e4m3 fp8_e5m2 int4 uint4 nf4
#                                                #         (former spellings mxfp8, mxfp8-e5m2,
#                                                #         fp8-group still accepted)
#
# The outputs of a previous run are replaced (`lowbit quantize --force`). The `lowbit` command is
# installed in the virtual environment, not on PATH: the script ends by saying how to run it
# ($LOWBIT_VENV/bin/lowbit, or `source $LOWBIT_VENV/bin/activate` first).
#
# Works on a fresh Debian/Ubuntu machine with python3, pip, cmake, ninja and g++ (missing Debian
# packages are installed with apt-get when possible); the Python packages come from PyPI. Where
# nvidia-smi sees a GPU, CMake looks for nvcc and builds the CUDA kernels, torch is installed and
# `lowbit quantize` runs on the device; without a GPU lowbit is built CPU-only and the CPU
# reference runs. Should the CUDA build fail, the script falls back to a CPU-only build.
#
# Environment: LOWBIT_VENV (default .venv), LOWBIT_BUILD_DIR (default build/main),
# LOWBIT_ENABLE_CUDA=ON|OFF (default: ON where a GPU is seen, else OFF),
# LOWBIT_WITH_TORCH=auto|1|0 (install torch: auto = only when nvidia-smi sees a GPU),
# LOWBIT_QUANTIZE_ARGS (extra arguments of `lowbit quantize`, e.g. "--scale-layout blocked128x4").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
venv=${LOWBIT_VENV:-$root/.venv}
build=${LOWBIT_BUILD_DIR:-$root/build/main}
with_torch=${LOWBIT_WITH_TORCH:-auto}
extra_args=${LOWBIT_QUANTIZE_ARGS:-}

input=${1:-}
format=${2:-nvfp4}
if [ -n "$input" ]; then
  case "$input" in
    *.safetensors) ;;
    *) echo "main.sh: error: $input: expected a .safetensors file" >&2; exit 2 ;;
  esac
  if [ ! -f "$input" ]; then echo "main.sh: error: $input: no such file" >&2; exit 2; fi
  input=$(cd "$(dirname "$input")" && pwd)/$(basename "$input")
fi
case "$format" in
  nvfp4|mxfp4|mxfp8_e4m3|mxfp8_e5m2|fp8_e4m3|fp8_e5m2|int4|uint4|nf4|mxfp8|mxfp8-e5m2|fp8-group) ;;
  *) echo "main.sh: error: unknown format '$format' (nvfp4 mxfp4 mxfp8_e4m3 mxfp8_e5m2 fp8_e4m3 fp8_e5m2 int4 uint4 nf4)" >&2
     exit 2 ;;
esac

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
if [ "$gpu" = "1" ]; then cuda=${LOWBIT_ENABLE_CUDA:-ON}; else cuda=${LOWBIT_ENABLE_CUDA:-OFF}; fi

# 1. Debian packages (only what is missing; needs root or sudo).
source "$root/scripts/lib/debian_deps.sh"
ensure_build_tools

# 2. Python environment (PyPI).
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q "numpy" "ml_dtypes>=0.5" "nanobind>=2.10" "scikit-build-core>=0.10"
if [ "$cuda" = "ON" ] && command -v nvcc >/dev/null 2>&1; then
  "$py" -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"   # CuTe headers for the kernels
fi
if [ "$with_torch" = "1" ] || { [ "$with_torch" = "auto" ] && [ "$gpu" = "1" ]; }; then
  "$py" -c "import torch" 2>/dev/null || { echo "== installing torch"; "$py" -m pip install -q torch; }
fi

# 3. Build and install lowbit.
build_lowbit() {  # build_lowbit CUDA_ON_OFF BUILD_DIR
  "$py" -m pip install -q --no-build-isolation "$root" \
    -Cbuild-dir="$2" \
    -Ccmake.define.LOWBIT_ENABLE_CUDA="$1" \
    -Ccmake.define.Python3_EXECUTABLE="$py"
}
if [ "$cuda" = "ON" ]; then
  echo "== building lowbit with the CUDA kernels where nvcc is found (build dir $build)"
  if ! build_lowbit ON "$build"; then
    echo "main.sh: warning: the CUDA build failed; building lowbit CPU-only" >&2
    build_lowbit OFF "$build-cpu"
  fi
else
  echo "== building lowbit CPU-only (no GPU seen; LOWBIT_ENABLE_CUDA=ON to build the kernels; build dir $build)"
  build_lowbit OFF "$build"
fi
lowbit="$venv/bin/lowbit"
how_to_run() {  # the command is in the virtual environment, not on PATH
  echo
  echo "== the lowbit command is not on PATH: run it as $lowbit (e.g. $lowbit info),"
  echo "   or 'source $venv/bin/activate' first and type 'lowbit ...'"
}

# 4. The job. Run from outside the source tree so the installed package is the one imported.
cd "$root"
mkdir -p out
echo
echo "== lowbit info"
(cd out && "$lowbit" info)

if [ -n "$input" ]; then
  output="${input%.safetensors}.$format.safetensors"
  echo
  echo "== lowbit quantize $input -> $output ($format)"
  # shellcheck disable=SC2086
  (cd out && "$lowbit" quantize "$input" "$output" --format "$format" --force $extra_args)
  how_to_run
  exit 0
fi

demo="$root/out/demo.safetensors"
if [ ! -f "$demo" ]; then
  echo
  echo "== generating $demo (one bf16 transformer layer: hidden 2048, MLP 5632)"
  (cd out && "$py" - "$demo" <<'EOF'
import sys

import ml_dtypes
import numpy as np

from lowbit import safetensors_io

H, I = 2048, 5632
rng = np.random.default_rng(0)


def weight(rows, cols):
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    w *= np.float32(cols ** -0.5)
    w[:, rng.integers(0, cols, 8)] *= np.float32(8.0)  # a few outlier input channels
    return w.astype(ml_dtypes.bfloat16)


p = "model.layers.0."
tensors = {p + "input_layernorm.weight": np.ones(H, ml_dtypes.bfloat16)}
for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
    tensors[p + "self_attn." + name + ".weight"] = weight(H, H)
tensors[p + "post_attention_layernorm.weight"] = np.ones(H, ml_dtypes.bfloat16)
tensors[p + "mlp.gate_proj.weight"] = weight(I, H)
tensors[p + "mlp.up_proj.weight"] = weight(I, H)
tensors[p + "mlp.down_proj.weight"] = weight(H, I)
size = safetensors_io.save(sys.argv[1], tensors, {"format": "pt"})
print(f"wrote {sys.argv[1]} ({size / 2**20:.1f} MiB, {len(tensors)} tensors)")
EOF
  )
fi

for fmt in nvfp4 mxfp4; do
  echo
  echo "== lowbit quantize out/demo.safetensors -> out/demo.$fmt.safetensors ($fmt)"
  # shellcheck disable=SC2086
  (cd out && "$lowbit" quantize "$demo" "$root/out/demo.$fmt.safetensors" --format "$fmt" --force $extra_args)
done
how_to_run
