#!/usr/bin/env bash
# What authentication costs on the data path, measured in one sitting
# (docs/benchmarks.md, "Authentication"): kvcache-bench MODE over the Unix
# socket against a daemon with authentication off and one with a principals
# file (the bench sends a token), RUNS interleaved pairs, then the medians.
#
#   bash tests/bench/auth_bench.sh [BUILD_DIR]   # default BUILD_DIR: build
#   MODES="lookup:grpc lookup:shm fetch:shm" RUNS=5 DURATION=4 CLIENTS=2
#
# With BASELINE_BUILD set (another build of kvcached and kvcache-bench, e.g.
# of an earlier commit), the pairs are that build against BUILD_DIR instead,
# both with authentication off: a regression check across versions.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build}
MODES=${MODES:-"lookup:grpc lookup:shm fetch:shm"}
RUNS=${RUNS:-5}
DURATION=${DURATION:-4}
CLIENTS=${CLIENTS:-2}
BASELINE=${BASELINE_BUILD:-}
WORK=$(mktemp -d)
# A daemon left running by an interrupted run is found by its socket path.
trap 'pkill -f -- "--unix-socket $WORK/s.sock" 2>/dev/null; rm -rf "$WORK"' EXIT
TOKEN=bench-token-0123456789abcdef
cat >"$WORK/principals.json" <<JSON
{"principals": [{"name": "bench", "tenant": "bench", "role": "worker", "token": "$TOKEN"}]}
JSON
for b in "$BUILD" ${BASELINE:+"$BASELINE"}; do
  for f in "$b/server/kvcached" "$b/tests/bench/kvcache-bench"; do
    [[ -x $f ]] || { echo "auth_bench: $f is missing (build first)" >&2; exit 2; }
  done
done

# run_one SIDE MODE TRANSPORT: one kvcache-bench run; prints ops/s and GB/s.
run_one() {
  local side=$1 mode=$2 transport=$3 build=$BUILD
  local -a daemon_flags=() bench_flags=()
  if [[ -n $BASELINE && $side == a ]]; then build=$BASELINE; fi
  if [[ -z $BASELINE && $side == b ]]; then
    daemon_flags=(--principals-file "$WORK/principals.json")
    bench_flags=(--token "$TOKEN")
  fi
  rm -f "$WORK/s.sock" "$WORK/s.sock.shm"
  "$build/server/kvcached" --unix-socket "$WORK/s.sock" --listen none --metrics-address none \
    --capacity-bytes 1073741824 "${daemon_flags[@]}" >"$WORK/daemon.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [[ -S $WORK/s.sock ]] && break; sleep 0.1; done
  "$build/tests/bench/kvcache-bench" "$mode" --target "unix://$WORK/s.sock" \
    --transport "$transport" --clients "$CLIENTS" --duration "$DURATION" "${bench_flags[@]}" 2>&1 |
    awk -v m="$mode" '$1 == m { print $3, $4; exit }'
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

if [[ -n $BASELINE ]]; then labels=("baseline" "this build"); else labels=("auth off" "auth on"); fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for spec in $MODES; do
  mode=${spec%%:*} transport=${spec##*:}
  : >"$WORK/a" && : >"$WORK/b"
  for run in $(seq "$RUNS"); do
    for side in a b; do
      # Not `< <(...)`: the next run must wait until this one's daemon is gone.
      result=$(run_one "$side" "$mode" "$transport")
      read -r ops gbs <<<"$result"
      echo "$ops $gbs" >>"$WORK/$side"
      label=${labels[0]}
      [[ $side == b ]] && label=${labels[1]}
      printf '%-6s %-4s run %d %-10s %10s ops/s %7s GB/s\n' "$mode" "$transport" "$run" "$label" \
        "$ops" "$gbs"
    done
  done
  a_ops=$(cut -d' ' -f1 "$WORK/a" | median) b_ops=$(cut -d' ' -f1 "$WORK/b" | median)
  printf '%-6s %-4s median: %s %s ops/s, %s %s ops/s, ratio %.3f\n' "$mode" "$transport" \
    "${labels[0]}" "$a_ops" "${labels[1]}" "$b_ops" "$(echo "$b_ops / $a_ops" | bc -l)"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
