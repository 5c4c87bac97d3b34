#!/usr/bin/env bash
# Lookup of 32K-token prompts through the whole RPC with about a million
# blocks cached (docs/benchmarks.md, "Index at scale"): fills a daemon with
# tiny-layout blocks (1 KiB each, 64 tokens), then measures full-hit lookups
# with one client over gRPC/TCP and over the shared-memory socket.
#
#   bash tests/bench/index_scale_rpc.sh [BUILD_DIR]    # default BUILD_DIR: build
#
# Environment: BLOCKS (default 1048576) to cache first, DURATION (default 5)
# seconds per measurement, RUNS (default 3).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
BLOCKS=${BLOCKS:-1048576}
DURATION=${DURATION:-5}
RUNS=${RUNS:-3}
WORK=$(mktemp -d)
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cleanup() {
  [[ -n ${PID:-} ]] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
# A 1 KiB block takes a 4 KiB pool chunk (the smallest class), and a million
# blocks carry ~0.3 GiB of metadata: 5 GiB with a quarter for metadata holds them.
cat >"$WORK/config.json" <<JSON
{"hostTier": {"capacityBytes": "$((5 << 30))", "metadataFraction": 0.25}}
JSON
"$BUILD/server/kvcached" --config "$WORK/config.json" --listen "127.0.0.1:$PORT" \
  --unix-socket "$WORK/k.sock" --metrics-address none >"$WORK/daemon.log" 2>&1 &
PID=$!
sleep 1
LAYOUT=(--layers 1 --kv-heads 1 --head-dim 4 --dtype fp16 --block-tokens 64 --blocks-per-seq 512)
BENCH=$BUILD/tests/bench/kvcache-bench
echo "filling: $BLOCKS blocks of 1 KiB (512-block sequences) ..." >&2
seqs=$((BLOCKS / 512 / 4 + 1))
"$BENCH" lookup --target "127.0.0.1:$PORT" --transport grpc --clients 4 --duration 0.1 \
  --working-set "$seqs" --model filler "${LAYOUT[@]}" >"$WORK/fill.log" 2>&1
cached=$("$BUILD/client/kvcachectl" -t "127.0.0.1:$PORT" --json stats |
  /usr/bin/python3 -c 'import json,sys; print(sum(int(m.get("blocks",0)) for m in json.load(sys.stdin).get("models",[])))')
echo "cached blocks: $cached (load $(cut -d' ' -f1 /proc/loadavg))"
echo "| transport | run | lookups/s | p50 ms | p99 ms | max ms |"
echo "|---|---:|---:|---:|---:|---:|"
for ((r = 1; r <= RUNS; r++)); do
  for t in grpc shm; do
    target="127.0.0.1:$PORT"
    [[ $t == shm ]] && target="unix://$WORK/k.sock"
    line=$("$BENCH" lookup --target "$target" --transport "$t" --clients 1 --duration "$DURATION" \
      --working-set 16 --model probe "${LAYOUT[@]}" 2>&1 | awk '$1=="lookup" && NF>=8')
    read -r _ _ ops _ p50 p99 max _ <<<"$line"
    echo "| $t | $r | $ops | $p50 | $p99 | $max |"
  done
done
echo "load at the end: $(cut -d' ' -f1 /proc/loadavg)"
