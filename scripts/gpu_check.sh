#!/usr/bin/env bash
# Builds, tests and benchmarks lowbit on the GPU machine (H100 / H200, no network), unattended.
#
#   bash scripts/gpu_check.sh                      # build, C++ + Python tests, bench_conversions
#   bash scripts/gpu_check.sh --tests-only         # build + ctest + pytest
#   bash scripts/gpu_check.sh --bench-only         # (incremental) pip install + benchmarks
#   bash scripts/gpu_check.sh --bench dual_gemm    # only bench/bench_dual_gemm.py (repeatable)
#   bash scripts/gpu_check.sh bench/bench_x.py     # bench_conversions and bench_x
#   bash scripts/gpu_check.sh --bench-only -- --ops mxfp8 --shapes 16384x7168   # args for every bench
#
# Steps (each logged under $OUT/logs, default OUT=./out; JSON reports in $OUT; all of it also in
# $OUT/all_logs.tar.gz at exit):
#   1. pip install --no-build-isolation --no-deps -v . -Cbuild-dir=build-gpu-py   (the Python package with
#      the sm_90a kernels; CUTLASS headers from .deps/cutlass, see scripts/fetch_cutlass.sh, which
#      must be run on the developer machine and the folder carried along: nothing can be
#      downloaded on the GPU machine)
#   2. cmake -S . -B build-gpu -G Ninja -DLOWBIT_BUILD_BENCH=ON && cmake --build build-gpu
#   3. ctest --test-dir build-gpu (all labels, gpu included)
#   4. python -m pytest tests/python -q (GPU tests included)
#   5. python bench/bench_*.py --json $OUT/bench_*.json
# A short summary table is printed last. Exit status: 0 when every step that ran passed.
#
# Environment: OUT, PYTHON (default python3), JOBS (default 16), GPU_CHECK_LIMIT_S (wall-clock
# budget of the whole script, default 570: the device tool stops a command at 600 s; the
# benchmarks get what is left via --budget-s unless BENCH_ARGS / the "--" args set it),
# BENCH_ARGS (extra arguments for every benchmark).
# The script reads the GPU's state (nvidia-smi queries) but never changes it.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
t_start=$(date +%s)

OUT=${OUT:-$root/out}
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
LIMIT_S=${GPU_CHECK_LIMIT_S:-570}

do_build=1; do_tests=1; do_bench=1
benches=(conversions)
only_benches=()
bench_args=()
if [ -n "${BENCH_ARGS:-}" ]; then read -r -a bench_args <<< "$BENCH_ARGS"; fi

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --tests-only) do_bench=0 ;;
    --bench-only) do_tests=0 ;;
    --no-build) do_build=0 ;;
    --bench) shift; [ $# -gt 0 ] || { echo "--bench needs a NAME" >&2; exit 2; }; only_benches+=("$1"); do_tests=0 ;;
    --bench=*) only_benches+=("${1#--bench=}"); do_tests=0 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; bench_args+=("$@"); break ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) benches+=("$1") ;;
  esac
  shift
done
if [ ${#only_benches[@]} -gt 0 ]; then benches=("${only_benches[@]}"); do_bench=1; fi

# bench NAME -> path: conversions | bench_conversions | bench/bench_conversions.py
bench_path() {
  local n=$1
  if [ -f "$n" ]; then echo "$n"; return; fi
  n=${n##*/}; n=${n%.py}; n=${n#bench_}
  echo "bench/bench_$n.py"
}

elapsed() { echo $(( $(date +%s) - t_start )); }

step_names=(); step_status=(); step_secs=(); step_logs=()
any_failed=0
# run_step NAME LOGFILE CMD...: runs CMD with output to LOGFILE, records status and time.
run_step() {
  local name=$1 log=$2; shift 2
  local t0 rc status
  t0=$(date +%s)
  echo "== $name ($(elapsed)s into the run) -> ${log#$root/}"
  "$@" > "$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=ok; else status="FAILED($rc)"; any_failed=1; fi
  step_names+=("$name"); step_status+=("$status"); step_secs+=($(( $(date +%s) - t0 ))); step_logs+=("${log#$root/}")
  if [ $rc -ne 0 ]; then
    echo "   $status; last lines of the log:"
    tail -n 25 "$log" | sed 's/^/   | /'
  fi
  return $rc
}
skip_step() {
  step_names+=("$1"); step_status+=("skipped: $2"); step_secs+=(0); step_logs+=("-")
}

# --- 0. environment (read-only) ------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,power.limit,persistence_mode,mig.mode.current --format=csv 2>&1 || true
  command -v nvcc >/dev/null && nvcc --version | tail -n 2
  cmake --version | head -n 1
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" 2>&1
  git -C "$root" log -1 --format='commit %h %s' 2>/dev/null
  git -C "$root" status --short 2>/dev/null | head -n 20
} > "$logs/env.log" 2>&1
head -n 3 "$logs/env.log" | sed 's/^/   /'
grep -E '^(python|commit)' "$logs/env.log" | sed 's/^/   /'

cutlass_dir=""
if [ -f "$root/.deps/cutlass/include/cute/tensor.hpp" ]; then
  cutlass_dir="$root/.deps/cutlass"
  echo "   CUTLASS headers: .deps/cutlass ($(cat "$cutlass_dir/VERSION" 2>/dev/null || echo 'version unknown'))"
else
  echo "   warning: .deps/cutlass/include/cute missing (run scripts/fetch_cutlass.sh on the developer machine and carry .deps/cutlass);"
  echo "            kernels that need CuTe are left out of this build"
fi
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
# Ubuntu 24.04's system Python refuses pip installs without this (PEP 668); harmless elsewhere.
export PIP_BREAK_SYSTEM_PACKAGES=1
export PYTHONUNBUFFERED=1  # logs stay complete when a step is stopped by its time limit

# --- 1. the Python package -----------------------------------------------------------------
pkg_ok=1
if [ $do_build -eq 1 ] && [ -f pyproject.toml ]; then
  pip_cmd=("$PY" -m pip install --no-build-isolation --no-deps -v . -Cbuild-dir=build-gpu-py)
  [ -n "$cutlass_dir" ] && pip_cmd+=("-Ccmake.define.LOWBIT_CUTLASS_DIR=$cutlass_dir")
  run_step "pip install (build-gpu-py)" "$logs/pip_install.log" "${pip_cmd[@]}" || pkg_ok=0
elif [ $do_build -eq 1 ]; then
  skip_step "pip install" "no pyproject.toml"
  pkg_ok=0
else
  skip_step "pip install" "--no-build"
fi
run_step "import lowbit" "$logs/import.log" \
  "$PY" -c "import json, lowbit; print(json.dumps(lowbit.build_info(), indent=1, default=str))" || pkg_ok=0
[ -f "$logs/import.log" ] && echo "   $(grep -E '"(version|cuda_built|device_name|sm)"' "$logs/import.log" | tr -s ' \n' ' ')"

# --- 2-4. C++ build and tests, Python tests ------------------------------------------------
if [ $do_tests -eq 1 ]; then
  cmake_args=(-S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release)
  if [ -f bench/CMakeLists.txt ]; then cmake_args+=(-DLOWBIT_BUILD_BENCH=ON); fi
  [ -n "$cutlass_dir" ] && cmake_args+=("-DLOWBIT_CUTLASS_DIR=$cutlass_dir")
  if run_step "cmake configure (build-gpu)" "$logs/cmake_configure.log" cmake "${cmake_args[@]}" &&
     run_step "cmake build" "$logs/cmake_build.log" cmake --build build-gpu -j "$JOBS"; then
    run_step "ctest (all labels)" "$logs/ctest.log" ctest --test-dir build-gpu --output-on-failure
  else
    skip_step "ctest" "build failed"
  fi
  if [ $pkg_ok -eq 1 ]; then
    run_step "pytest tests/python" "$logs/pytest.log" "$PY" -m pytest tests/python -q -rs
  else
    skip_step "pytest" "lowbit not importable"
  fi
fi

# --- 5. benchmarks -------------------------------------------------------------------------
bench_jsons=()
if [ $do_bench -eq 1 ]; then
  n_left=${#benches[@]}
  for b in "${benches[@]}"; do
    path=$(bench_path "$b")
    name=$(basename "$path" .py)
    if [ ! -f "$path" ]; then
      skip_step "$name" "no $path"; any_failed=1; n_left=$((n_left - 1)); continue
    fi
    args=("${bench_args[@]}")
    left=$(( LIMIT_S - $(elapsed) - 15 ))
    share=$(( left / (n_left > 0 ? n_left : 1) ))
    [ $share -lt 30 ] && share=30
    if [[ " ${args[*]} " != *" --budget-s "* ]]; then
      # the budget stops new measurements; the rest of the share finishes the one under way
      args+=(--budget-s $(( share * 80 / 100 )))
    fi
    json="$OUT/$name.json"
    rm -f "$json"
    run_step "$name" "$logs/$name.log" timeout -k 10 "$share" "$PY" "$path" --json "$json" "${args[@]}"
    [ -f "$json" ] && bench_jsons+=("$json")
    n_left=$((n_left - 1))
  done
fi

# --- summary (printed last: the end of the output is what gets read) -----------------------
echo
echo "==================== gpu_check summary ($(elapsed)s) ===================="
printf '%-30s %-16s %6s  %s\n' step status secs log
for i in "${!step_names[@]}"; do
  printf '%-30s %-16s %6s  %s\n' "${step_names[$i]}" "${step_status[$i]}" "${step_secs[$i]}" "${step_logs[$i]}"
done
if [ -f "$logs/ctest.log" ]; then
  echo "ctest:  $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -n 1)"
  grep -E '^\s+[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Subprocess aborted|Exception)' "$logs/ctest.log" | head -n 10
fi
if [ -f "$logs/pytest.log" ]; then
  echo "pytest: $(grep -E '(passed|failed|error|skipped|no tests ran)' "$logs/pytest.log" | tail -n 1)"
  grep -E '^(FAILED|ERROR) ' "$logs/pytest.log" | head -n 10
fi
if [ ${#bench_jsons[@]} -gt 0 ]; then
  echo
  "$PY" bench/lowbit_bench/summary.py "${bench_jsons[@]}"
fi
echo "logs: ${logs#$root/}/   reports: ${bench_jsons[*]:-none}"
exit $any_failed
