#!/usr/bin/env bash
# Expert-parallel MoE on a multi-GPU machine (2, 4 or 8 H100 / H200, no network), unattended:
# builds lowbit, runs the GPU tests of the m_counts layouts and of gpt_oss_expert_mlp, the grouped
# GEMM / MLP GPU tests they touch, the expert-parallel layer against the single-GPU op over NCCL on
# 2 / 4 / 8 GPUs (as many as are visible), then the scaling benchmark at 1, 2, 4, 8 GPUs.
#
#   bash scripts/gpu_ep_check.sh OUT_DIR                 # everything
#   bash scripts/gpu_ep_check.sh OUT_DIR --no-build      # reuse the installed package and build-gpu/
#   bash scripts/gpu_ep_check.sh OUT_DIR --tests-only    # build + tests
#   bash scripts/gpu_ep_check.sh OUT_DIR --bench-only    # (no build) the benchmark only
#   bash scripts/gpu_ep_check.sh OUT_DIR -- --tokens 256,4096   # arguments for every benchmark run
#
# Writes OUT_DIR/logs/*.log (one per step), OUT_DIR/bench_moe_ep_<N>gpu_<dispatch>.json (all of it also
# in OUT_DIR/all_logs.tar.gz at exit), and prints
# a summary table last. Exit status 0 when every step that ran passed.
#
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
# NVSHMEM_DISABLE_NVLS=1 are exported here (every process started below inherits them; the test
# and benchmark ranks also set them themselves: lowbit.moe.set_nvls_env).
#
# Environment: PYTHON (default python3), JOBS (default 16), EP_CHECK_LIMIT_S (wall-clock budget of
# the whole script, default 570: the device tool stops a command at 600 s; a step that would start
# after the budget is skipped and said so), EP_BENCH_DISPATCH (default "bf16 mxfp8").
# CUTLASS headers come from .deps/cutlass (scripts/fetch_cutlass.sh on a machine with PyPI access,
# then carry .deps along) unless the nvidia-cutlass wheel is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
t_start=$(date +%s)

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
export OUT
logs="$OUT/logs"
mkdir -p "$logs"
# One archive of every log and report, written at exit (also when the run is stopped by a time
# limit or a signal): a machine that hands back only a few files still returns all of them.
bundle() { tar -czf "$OUT/all_logs.tar.gz" -C "$OUT" --exclude=all_logs.tar.gz . 2>/dev/null || true; }
trap bundle EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
LIMIT_S=${EP_CHECK_LIMIT_S:-570}
DISPATCH=${EP_BENCH_DISPATCH:-"bf16 mxfp8"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PIP_BREAK_SYSTEM_PACKAGES=1 CMAKE_BUILD_PARALLEL_LEVEL=$JOBS

do_build=1; do_tests=1; do_bench=1
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) do_build=0 ;;
    --tests-only) do_bench=0 ;;
    --bench-only) do_tests=0; do_build=0 ;;
    --) shift; bench_args+=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

elapsed() { echo $(( $(date +%s) - t_start )); }
names=(); states=(); secs=()
failed=0
# step NAME LOG CMD...: runs CMD (output to LOG) unless the budget is spent.
step() {
  local name=$1 log=$2 t0 rc; shift 2
  if [ "$(elapsed)" -ge "$LIMIT_S" ]; then
    names+=("$name"); states+=("skipped: time budget (${LIMIT_S}s) spent"); secs+=(0); return 1
  fi
  echo "== $name ($(elapsed)s) -> ${log#$OUT/}"
  t0=$(date +%s)
  "$@" > "$log" 2>&1
  rc=$?
  names+=("$name"); secs+=($(( $(date +%s) - t0 )))
  if [ $rc -eq 0 ]; then states+=(ok); else states+=("FAILED($rc)"); failed=1; tail -n 20 "$log" | sed 's/^/   | /'; fi
  return $rc
}

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv 2>&1 || true
  nvidia-smi topo -m 2>&1 || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" 2>&1
  git -C "$root" log -1 --format='commit %h %s' 2>/dev/null
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} > "$logs/env.log" 2>&1
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "   $gpus GPU(s) visible; NVLink multicast off (NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE)"

cutlass=()
[ -f "$root/.deps/cutlass/include/cute/tensor.hpp" ] && cutlass=("-DLOWBIT_CUTLASS_DIR=$root/.deps/cutlass")

if [ $do_build -eq 1 ]; then
  pip_cutlass=()
  [ ${#cutlass[@]} -gt 0 ] && pip_cutlass=("-Ccmake.define.LOWBIT_CUTLASS_DIR=$root/.deps/cutlass")
  step "pip install (build-gpu-py)" "$logs/pip_install.log" \
    "$PY" -m pip install --no-build-isolation --no-deps -v . -Cbuild-dir=build-gpu-py "${pip_cutlass[@]}"
  if [ $do_tests -eq 1 ]; then
    step "cmake configure (build-gpu)" "$logs/cmake_configure.log" \
      cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOWBIT_BUILD_TESTS=ON "${cutlass[@]}" &&
    step "cmake build (GPU tests)" "$logs/cmake_build.log" cmake --build build-gpu -j "$JOBS" --target lowbit_gpu_tests
  fi
fi
step "import lowbit" "$logs/import.log" "$PY" -c "import json, lowbit; i = lowbit.build_info(); print(json.dumps(i, default=str)); assert 'gpt_oss_expert_mlp' in i['cuda_ops'], 'no CUDA expert MLP in this build'"

if [ $do_tests -eq 1 ]; then
  if [ -x build-gpu/tests/cpp/lowbit_gpu_tests ]; then
    step "C++ GPU tests (layouts, grouped GEMM)" "$logs/gpu_tests_cpp.log" \
      build-gpu/tests/cpp/lowbit_gpu_tests --gtest_filter='*MoeLayoutsGpu*:*GroupGemmGpu*'
  fi
  step "pytest: layouts + expert MLP (GPU)" "$logs/pytest_layouts.log" \
    "$PY" -m pytest -q -rs -m gpu tests/python/test_moe_layouts_gpu.py
  step "pytest: grouped GEMM + MLP (GPU, the paths the layouts share)" "$logs/pytest_moe_gpu.log" \
    "$PY" -m pytest -q -rs -m gpu tests/python/test_moe_gpu.py tests/python/test_moe_gpu_mlp.py
  step "pytest: expert parallelism (gloo CPU, NCCL on 2/4/8 GPUs)" "$logs/pytest_ep.log" \
    "$PY" -m pytest -q -rs tests/python/test_moe_ep.py
fi

if [ $do_bench -eq 1 ]; then
  for n in 1 2 4 8; do
    [ "$n" -le "$gpus" ] || continue
    for d in $DISPATCH; do
      budget=$(( LIMIT_S - $(elapsed) - 20 ))
      [ $budget -gt 30 ] || budget=30
      step "bench_moe_ep ${n} GPU(s), dispatch $d" "$logs/bench_moe_ep_${n}gpu_${d}.log" \
        "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" bench/bench_moe_ep.py \
        --dispatch "$d" --json "$OUT/bench_moe_ep_${n}gpu_${d}.json" --budget-s "$budget" "${bench_args[@]}"
    done
  done
  # the tables again, last
  for f in "$logs"/bench_moe_ep_*.log; do
    [ -f "$f" ] && { echo; echo "## ${f##*/}"; grep -E '^(#|op |moe_ep_)' "$f" | tail -n 12; }
  done
fi

echo
echo "== summary ($(elapsed)s; logs in $logs)"
for i in "${!names[@]}"; do printf '   %-62s %-40s %5ss\n' "${names[$i]}" "${states[$i]}" "${secs[$i]}"; done
exit $failed
