#!/usr/bin/env bash
# Long fuzz run on an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU only).
#
#   bash scripts/fuzz.sh                 # build build/asan, C++ tests under ASan, then the fuzzers
#   LOWBIT_FUZZ_CALLS=10000 LOWBIT_FUZZ_FILES=5000 LOWBIT_FUZZ_SEED=1 bash scripts/fuzz.sh
#
# 1. Configures and builds the library, the C++ tests and the Python module in build/asan with
#    -fsanitize=address,undefined -fno-sanitize-recover=undefined (g++; clang works the same).
# 2. Runs the C++ tests (ctest -LE gpu) under the sanitizers.
# 3. Runs tests/python/fuzzlib.py (API calls) and tests/python/fuzzfiles.py (mutated safetensors
#    files through the reader and the CLI) with the sanitized module, the interpreter started
#    with LD_PRELOAD="libasan libstdc++" (ASAN_OPTIONS: detect_leaks=0, allocator_may_return_null=1 so that a
#    huge allocation is a MemoryError as without ASan).
# 4. Prints one summary line:
#    calls=N files=N crashes=N sanitizer=N wrong_results=N outputs_changed=N unnamed_refusals=N ...
#    and writes the findings to build/asan/fuzz-api.json and build/asan/fuzz-files.json.
#
# Environment: LOWBIT_PYTHON (interpreter with numpy, ml_dtypes, nanobind, pytest; default
# .venv/bin/python), LOWBIT_FUZZ_CALLS (default 10000), LOWBIT_FUZZ_FILES (default 5000),
# LOWBIT_FUZZ_SEED (default 1), LOWBIT_FUZZ_SKIP_BUILD=1 (reuse build/asan), LOWBIT_FUZZ_SKIP_CTEST=1,
# JOBS (build parallelism, default 2).
# Exit status: 0 when every count is zero, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${LOWBIT_PYTHON:-$root/.venv/bin/python}
build=$root/build/asan
calls=${LOWBIT_FUZZ_CALLS:-10000}
files=${LOWBIT_FUZZ_FILES:-5000}
seed=${LOWBIT_FUZZ_SEED:-1}
jobs=${JOBS:-2}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# the interpreter does not link libstdc++: preload it with libasan, or ASan's __cxa_throw
# interceptor finds no real __cxa_throw and every C++ exception of the module aborts
libasan=$(${CXX:-g++} -print-file-name=libasan.so)
libstdcxx=$(${CXX:-g++} -print-file-name=libstdc++.so)
if [ ! -e "$libasan" ] || [ ! -e "$libstdcxx" ]; then
  echo "fuzz.sh: libasan.so / libstdc++.so not found (g++ -print-file-name gave '$libasan', '$libstdcxx')" >&2
  exit 2
fi

if [ "${LOWBIT_FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  echo "== configuring and building $build (ASan + UBSan, CPU)"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DLOWBIT_ENABLE_CUDA=OFF -DLOWBIT_BUILD_TESTS=ON -DLOWBIT_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$py" \
    -DCMAKE_CXX_FLAGS="$san -O1 -g" -DCMAKE_C_FLAGS="$san -O1 -g" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" -DCMAKE_MODULE_LINKER_FLAGS="$san" \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 2; }
  cmake --build "$build" -j"$jobs" || exit 2
fi

# the package with the sanitized module: the sources of python/lowbit plus build/asan's _C
pkg=$build/pkg/lowbit
rm -rf "$build/pkg" && mkdir -p "$pkg"
for f in "$root"/python/lowbit/*.py; do ln -s "$f" "$pkg/"; done
cp "$build"/python/_C*.so "$pkg/" || { echo "fuzz.sh: no module in $build/python" >&2; exit 2; }

export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0:handle_segv=1:handle_sigbus=1:handle_sigfpe=1:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

ctest_failed=0
if [ "${LOWBIT_FUZZ_SKIP_CTEST:-0}" != 1 ]; then
  echo "== C++ tests under ASan + UBSan"
  if ctest --test-dir "$build" -LE gpu -j"$jobs" --output-on-failure >"$build/ctest.log" 2>&1; then
    tail -n 3 "$build/ctest.log"
  else
    ctest_failed=1
    grep -E "tests passed|Failed|ERROR: AddressSanitizer|runtime error" "$build/ctest.log" | head -n 40
  fi
fi

echo "== fuzzing the API ($calls calls) and the files ($files files), seed $seed"
export PYTHONPATH="$build/pkg"
export LD_PRELOAD="$libasan $libstdcxx"
export LOWBIT_FUZZ_SEED=$seed
"$py" -c "import lowbit, sys; sys.exit(0 if lowbit.__file__.startswith('$build/pkg') else 1)" || {
  echo "fuzz.sh: the sanitized module does not import" >&2; exit 2; }
nice -n 10 "$py" "$root/tests/python/fuzzlib.py" --seed "$seed" --calls "$calls" --json "$build/fuzz-api.json" \
  >"$build/fuzz-api.txt" 2>&1
nice -n 10 "$py" "$root/tests/python/fuzzfiles.py" --seed "$seed" --files "$files" --json "$build/fuzz-files.json" \
  >"$build/fuzz-files.txt" 2>&1
unset LD_PRELOAD
head -n 200 "$build/fuzz-api.txt"
head -n 200 "$build/fuzz-files.txt"

"$py" - "$build/fuzz-api.json" "$build/fuzz-files.json" "$ctest_failed" <<'EOF'
import collections, json, sys
api, fil = (json.load(open(p)) for p in sys.argv[1:3])
c = collections.Counter(f["cat"] for f in api["findings"] + fil["findings"])
keys = [("crashes", "crash"), ("sanitizer", "sanitizer"), ("hangs", "hang"), ("wrong_results", "wrong_result"),
        ("precision_loss", "precision_loss"), ("outputs_changed", "output_changed"),
        ("readonly_written", "readonly_written"), ("inputs_changed", "input_changed"),
        ("unnamed_refusals", "unnamed_refusal"), ("foreign_errors", "foreign_error"),
        ("accepted_invalid", "accepted_invalid"), ("refused_valid", "refused_valid"),
        ("temp_files_left", "temp_file_left"), ("stray_files", "stray_file"), ("slow", "slow"),
        ("harness_errors", "harness_error")]
line = f"calls={api['calls']} files={fil['files']} " + \
       " ".join(f"{k}={c.get(v, 0)}" for k, v in keys) + f" ctest_failed={sys.argv[3]}"
print("== summary: " + line)
sys.exit(0 if sum(c.values()) == 0 and sys.argv[3] == "0" else 1)
EOF
