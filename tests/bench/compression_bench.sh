#!/usr/bin/env bash
# Fetch throughput of compressed blocks next to raw ones, and the memory the
# compression saves, measured in the same sitting against one daemon
# (docs/benchmarks.md, "Fetching compressed blocks").
#
#   bash tests/bench/compression_bench.sh [BUILD_DIR]     # default BUILD_DIR: build
#
# For RUNS repetitions (default 5), interleaved: kvcache-bench fetch of a raw
# working set, of one the daemon quantized, and of one it pruned (each a new
# model, so every run compresses its own blocks). Blocks are 2 MiB (bf16, 32
# layers x 8 KV heads x 128 dims x 16 tokens), 16 blocks per sequence, so the
# last 4 blocks of each sequence (the 64-token recent window) stay raw.
# Prints each run and the medians; raw logs go to OUT_DIR (default a temp dir).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build}
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
CLIENTS=${CLIENTS:-2}
OUT_DIR=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$OUT_DIR"
KVCACHED=$BUILD/server/kvcached
BENCH=$BUILD/tests/bench/kvcache-bench
for f in "$KVCACHED" "$BENCH"; do
  [[ -x $f ]] || { echo "compression_bench: $f is missing (build first)" >&2; exit 2; }
done
SOCK=$OUT_DIR/kvcached.sock
cat > "$OUT_DIR/config.json" <<JSON
{"listen": {"tcp_address": "none", "unix_socket": "$SOCK", "metrics_address": "none"},
 "host_tier": {"capacity_bytes": "8589934592"},
 "importance": {"cold_after_seconds": 1, "compaction_interval_ms": 100,
                "max_blocks_per_pass": 4096}}
JSON
"$KVCACHED" --config "$OUT_DIR/config.json" > "$OUT_DIR/kvcached.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -S $SOCK ]] && break; sleep 0.1; done

ARGS=(--target "unix://$SOCK" --clients "$CLIENTS" --duration "$DURATION" --layers 32
      --kv-heads 8 --head-dim 128 --dtype bf16 --block-tokens 16 --blocks-per-seq 16
      --working-set 2)
declare -A GBS
run() {  # run NAME RUN EXTRA...
  local name=$1 run=$2; shift 2
  local log=$OUT_DIR/$name-$run.log
  "$BENCH" fetch --model "$name-$run" "${ARGS[@]}" "$@" > "$log" 2>&1
  local gbs saved used
  gbs=$(awk '$1 == "fetch" {print $4}' "$log")
  saved=$(sed -n 's/.*blocks compressed, \([0-9.]*\) MiB saved/\1/p' "$log")
  echo "run $run $name: ${gbs} GB/s${saved:+, $saved MiB of 128 MiB saved}" >&2
  GBS[$name]+="$gbs "
}
for r in $(seq "$RUNS"); do
  run raw "$r" --no-verify
  run quantize "$r" --compress quantize
  run prune "$r" --compress prune
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
raw=$(echo "${GBS[raw]}" | median)
echo "| working set | fetch GB/s (median of $RUNS) | vs raw |"
echo "|---|---|---|"
for name in raw quantize prune; do
  m=$(echo "${GBS[$name]}" | median)
  echo "| $name | $m | $(awk -v a="$m" -v b="$raw" 'BEGIN {printf "%.2fx", a / b}') |"
done
echo "logs: $OUT_DIR" >&2
