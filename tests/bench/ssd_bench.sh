#!/usr/bin/env bash
# SsdStore throughput next to dd with O_DIRECT on the same file system, in the
# same sitting: dd is the yardstick for what the device gives a single
# sequential stream of 4 MiB writes/reads.
#
#   bash tests/bench/ssd_bench.sh [BUILD_DIR] [DIR]   # defaults: build, BUILD_DIR
#
# BLOCKS (default 256) blocks of 4 MiB (and BLOCKS*16 of 256 KiB), RUNS
# (default 3) runs each, medians reported (MB = 10^6 bytes). The dd file and
# the store file are never on disk together: at most BLOCKS*4 MiB plus a few
# regions at a time. Writes go to freshly allocated extents (write_seq) or to
# the holes left by freeing a random half (write_rand).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build}
DIR=${2:-$BUILD}
BLOCKS=${BLOCKS:-256}
RUNS=${RUNS:-3}
BENCH=$BUILD/server/tier/ssd_store_benchmark
[[ -x $BENCH ]] || { echo "ssd_bench: $BENCH is missing (build it first)" >&2; exit 2; }
mkdir -p "$DIR"
FILE=$DIR/ssd_bench.$$.bin
OUT=$(mktemp -d)
trap 'rm -f "$FILE"; rm -rf "$OUT"' EXIT

echo "# $(date -Is) $(uname -r) $(nproc) cpus; file system: $(df -T "$DIR" | awk 'NR==2{print $1" "$2}')"
echo "# load before: $(uptime)"

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# MB/s from dd's summary line: "<bytes> bytes (...) copied, <seconds> s, ..."
dd_mbps() { awk '/copied/ {for (i=1;i<=NF;i++) if ($i=="s,") printf "%.1f\n", $1/$(i-1)/1e6}'; }

for _ in $(seq "$RUNS"); do
  rm -f "$FILE"
  dd if=/dev/zero of="$FILE" bs=4M count="$BLOCKS" oflag=direct 2>&1 | dd_mbps >> "$OUT/dd_write"
  dd if="$FILE" of=/dev/null bs=4M iflag=direct 2>&1 | dd_mbps >> "$OUT/dd_read"
done
rm -f "$FILE"
DD_WRITE=$(median < "$OUT/dd_write")
DD_READ=$(median < "$OUT/dd_read")

"$BENCH" --path "$FILE" --block_bytes $((4 << 20)) --blocks "$BLOCKS" --region_bytes $((64 << 20)) \
  --threads 1,4 --repeat "$RUNS" > "$OUT/bench_4m"
"$BENCH" --path "$FILE" --block_bytes $((256 << 10)) --blocks $((BLOCKS * 16)) \
  --region_bytes $((16 << 20)) --threads 1,4 --repeat "$RUNS" > "$OUT/bench_256k"
grep '^# engine' "$OUT/bench_4m" "$OUT/bench_256k" | sed 's/^[^#]*//'
echo "# load after: $(uptime)"

printf '\n%-10s %-12s %7s %-10s %9s %9s %7s\n' block engine threads op MB/s dd_MB/s ratio
printf '%-10s %-12s %7s %-10s %9s %9s %7s\n' 4M dd 1 write_seq "$DD_WRITE" "$DD_WRITE" 1.00
printf '%-10s %-12s %7s %-10s %9s %9s %7s\n' 4M dd 1 read_seq "$DD_READ" "$DD_READ" 1.00
for f in bench_4m bench_256k; do
  grep '^MEDIAN' "$OUT/$f" | sed 's/[a-z_]*=//g' | while read -r _ engine threads block op mbps; do
    if [[ $op == write* ]]; then base=$DD_WRITE; else base=$DD_READ; fi
    label=$([[ $block == 4194304 ]] && echo 4M || echo 256K)
    printf '%-10s %-12s %7s %-10s %9s %9s %7.2f\n' "$label" "$engine" "$threads" "$op" "$mbps" \
      "$base" "$(awk -v a="$mbps" -v b="$base" 'BEGIN{print a/b}')"
  done
done
