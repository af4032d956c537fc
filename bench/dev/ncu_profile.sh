#!/usr/bin/env bash
# Nsight Compute profiles of the kernels named in bench/dev/ncu_targets.py (GPU machine; lowbit
# installed). For each TARGET: DIR/TARGET.ncu-rep (--set full, clocks left alone), its details page
# and its per-SASS-instruction source page (stall samples) as text.
#
#   bash bench/dev/ncu_profile.sh DIR TARGET[:KERNEL_REGEX[:ENV=VALUE]] ...
# NCU_SKIP / NCU_COUNT (default 1 / 1): matching launches skipped, then profiled.
# e.g. bash bench/dev/ncu_profile.sh out/ncu attn_fp8:attn_mxfp8_fp8 decode:split_kernel:LOWBIT_DECODE_K_STAGES=2
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$1; shift
mkdir -p "$dir"
PY=${PYTHON:-python3}
NCU=${NCU:-ncu}
for spec in "$@"; do
  IFS=: read -r target regex envset <<< "$spec"
  name=$target${envset:+_${envset##*=}}
  rep="$dir/$name"
  kfilter=()
  [ -n "$regex" ] && kfilter=(--kernel-name "regex:$regex")
  echo "== $name ($(date +%T))"
  env ${envset:+"$envset"} timeout -k 5 240 "$NCU" --clock-control none --set full --import-source no \
    "${kfilter[@]}" --launch-skip "${NCU_SKIP:-1}" --launch-count "${NCU_COUNT:-1}" -f -o "$rep" \
    "$PY" bench/dev/ncu_targets.py "$target" --iters 3 > "$rep.log" 2>&1 || { echo "   failed: $(tail -n 3 "$rep.log")"; continue; }
  "$NCU" --import "$rep.ncu-rep" --page details --print-units base > "$rep.details.txt" 2>&1
  "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 || true
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy" "$rep.details.txt" | head -n 8 | sed 's/^/   /'
done
