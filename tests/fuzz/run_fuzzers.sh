#!/usr/bin/env bash
# Builds kvcached's libFuzzer targets (clang-14, ASan+UBSan) in their own
# folder and runs each one: for a set time or a set number of runs, starting
# from the saved corpus. New inputs that reach new code (new edges) are
# merged into tests/fuzz/corpus/<target> (-merge=1 -use_counters=0, capped by
# --max-len), crashes are copied to tests/fuzz/reproducers/<target>, and a
# table of executions per target is printed. Exits 1 when any target
# crashed. See tests/fuzz/README.md.
#
#   tests/fuzz/run_fuzzers.sh [--seconds N | --runs N] [--max-len BYTES]
#                             [--parallel P] [--no-merge] [TARGET...]
#     --seconds N   run each target N seconds (default 60)
#     --runs N      run each target N inputs instead
#     --max-len B   longest input tried and merged (default 4096)
#     --parallel P  targets run at once (default 1)
#     --no-merge    leave the saved corpus as it is
#     TARGET        append_decoder block_codec config calibration safetensors
#                   checkpoint checkpoint_restore checkpoint_records principals (default: all)
#   KVCACHE_FUZZ_BUILD_DIR  build folder (default: build-fuzz)
#   KVCACHE_FUZZ_JOBS       build jobs (default 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KVCACHE_FUZZ_BUILD_DIR:-$root/build-fuzz}
all=(append_decoder block_codec config calibration safetensors checkpoint checkpoint_restore checkpoint_records principals http_query shm_frame ssd_extent)
seconds=60
runs=""
max_len=4096
parallel=1
merge=1
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --max-len) max_len=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --no-merge) merge=0; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "run_fuzzers: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=("${all[@]}")

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 "${launcher[@]}" \
  -DKVCACHE_FUZZ=ON -DKVCACHE_ENABLE_CUDA=OFF -DKVCACHE_BUILD_TESTS=OFF \
  -DKVCACHE_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j"${KVCACHE_FUZZ_JOBS:-2}" --target "${targets[@]/%/_fuzzer}"

# run_one TARGET: fuzz, merge, collect crashes; writes TARGET's row to $work/result.
run_one() {
  local t=$1 work="$build/fuzz-work/$1"
  local corpus="$here/corpus/$t" repro="$here/reproducers/$t"
  rm -rf "$work" && mkdir -p "$work/new" "$work/artifacts" "$corpus" "$repro"
  local limit=(-max_total_time="$seconds")
  [[ -n $runs ]] && limit=(-runs="$runs")
  local before start rc=0
  before=$(find "$corpus" -type f | wc -l)
  start=$(date +%s)
  # New inputs go to the first folder ($work/new); the saved corpus is only read.
  "$build/tests/fuzz/${t}_fuzzer" "${limit[@]}" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/new" "$corpus" \
    >"$work/log" 2>&1 || rc=$?
  local elapsed=$(($(date +%s) - start))
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  local crashes=0
  for f in "$work"/artifacts/*; do
    [[ -e $f ]] || continue
    cp "$f" "$repro/" && crashes=$((crashes + 1))
  done
  if ((merge)) && ((crashes == 0)); then
    # Only inputs that reach new code (edges, not hit counts): the corpus stays small.
    "$build/tests/fuzz/${t}_fuzzer" -merge=1 -use_counters=0 -max_len="$max_len" \
      -rss_limit_mb=4096 "$corpus" "$work/new" \
      >"$work/merge.log" 2>&1 || true
  fi
  local after
  after=$(find "$corpus" -type f | wc -l)
  local verdict=ok
  ((crashes > 0 || rc != 0)) && verdict="FAILED (exit $rc, $crashes saved to reproducers/$t; log $work/log)"
  printf '%-20s %12s %8s %10s %7s -> %-5s %s\n' "$t" "${execs:-?}" "$elapsed" \
    "$(( ${execs:-0} / (elapsed > 0 ? elapsed : 1) ))" "$before" "$after" "$verdict" >"$work/result"
}

pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
done
wait
printf '%-20s %12s %8s %10s %16s %s\n' target executions seconds exec/s corpus result
failed=0
for t in "${targets[@]}"; do
  cat "$build/fuzz-work/$t/result"
  grep -q FAILED "$build/fuzz-work/$t/result" && failed=1
done
exit $failed
