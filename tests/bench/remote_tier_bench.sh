#!/usr/bin/env bash
# The remote tier, measured on this machine (docs/benchmarks.md, "The remote
# tier"): a Redis Cluster of 3 masters (Debian's redis-server on loopback) and
# three kvcached daemons: A and B share KV through the cluster, C has no
# remote tier.
#   1. kvcache-remote-fetch: a 2,016-token prefix in SmolLM2-135M's layout
#      appended on A and found by B (a local miss: a PREFETCH_WAIT lookup that
#      searches the cluster, then a shared-memory fetch), against local hits
#      on B and on A, every byte verified; RUNS prefixes.
#   2. The write-back's cost to the appending daemon: kvcache-bench append
#      (--clients 2, DURATION s, the same layout and 4-block sequences)
#      against A (whose appends are shared) and C (not shared), alternating,
#      ROUNDS rounds; p50 and p99 of each, median over rounds.
#
#   bash tests/bench/remote_tier_bench.sh [BUILD_DIR]
#   RUNS=5 ROUNDS=3 DURATION=2 by default (3 rounds of 2 s leave the 4 GiB tiers unfilled,
#   so both daemons append into free memory); SMOKE=1: one short round of each.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$ROOT/build}
RUNS=${RUNS:-5}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-2}
PREFIX=${PREFIX:-2016}
if [[ ${SMOKE:-0} == 1 ]]; then RUNS=1 ROUNDS=1 DURATION=1 PREFIX=256; fi
KVCACHED=${KVCACHED:-$BUILD/server/kvcached}  # another build of the daemon, for A/B runs
FETCH=$BUILD/tests/bench/kvcache-remote-fetch
BENCH=$BUILD/tests/bench/kvcache-bench
for b in "$KVCACHED" "$FETCH" "$BENCH"; do
  [[ -x $b ]] || { echo "remote_tier_bench: $b is missing (build it first)" >&2; exit 2; }
done
for t in redis-server redis-cli curl python3; do  # 77: skipped (CTest's SKIP_RETURN_CODE)
  command -v "$t" > /dev/null || { echo "remote_tier_bench: needs $t; skipped" >&2; exit 77; }
done

DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done
  for f in "$DIR"/redis-*.pid; do [[ -f $f ]] && kill -9 "$(cat "$f")" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- the cluster ---------------------------------------------------------------
NODES=()
for i in 1 2 3; do
  port=$(free_port) bus=$(free_port)
  redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "nodes-$port.conf" --save '' --appendonly no --daemonize yes \
    --dir "$DIR" --pidfile "$DIR/redis-$port.pid" --logfile "$DIR/redis-$port.log"
  NODES+=("127.0.0.1:$port")
done
for n in "${NODES[@]}"; do
  until redis-cli -p "${n##*:}" ping > /dev/null 2>&1; do sleep 0.05; done
done
redis-cli --cluster create "${NODES[@]}" --cluster-replicas 0 --cluster-yes > "$DIR/create.log" 2>&1
for n in "${NODES[@]}"; do
  until redis-cli -p "${n##*:}" cluster info 2> /dev/null | grep -q cluster_state:ok; do sleep 0.1; done
done

# --- the daemons -----------------------------------------------------------------
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/shared.key"
chmod 600 "$DIR/shared.key"
cat > "$DIR/remote.json" << EOF
{"remote_tier": {"seeds": ["${NODES[0]}", "${NODES[1]}"], "key_file": "$DIR/shared.key"}}
EOF
start_daemon() {  # NAME [CONFIG]: its metrics port in $DIR/NAME.metrics (not a $(...):
  # a daemon started in a subshell would escape the cleanup's PIDS)
  local name=$1 config=${2:-} metrics
  metrics=$(free_port)
  echo "$metrics" > "$DIR/$name.metrics"
  "$KVCACHED" --unix-socket "$DIR/$name.sock" --listen none --metrics-address "127.0.0.1:$metrics" \
    --capacity-bytes $((4 << 30)) ${config:+--config "$config"} > "$DIR/$name.log" 2>&1 &
  PIDS+=($!)
  until [[ -S $DIR/$name.sock ]] && curl -sf "http://127.0.0.1:$metrics/metrics" > /dev/null; do
    sleep 0.05
  done
}
start_daemon a "$DIR/remote.json"
start_daemon b "$DIR/remote.json"
start_daemon c
A_METRICS=$(cat "$DIR/a.metrics")

echo "# $(date -Is) $(uname -r) $(nproc) cpus; redis $(redis-server --version | awk '{print $3}')"
echo "# load before: $(uptime)"

# --- 1. a prefix found remotely ----------------------------------------------------
"$FETCH" --append-target "unix://$DIR/a.sock" --fetch-target "unix://$DIR/b.sock" \
  --append-metrics "http://127.0.0.1:$A_METRICS/metrics" --prefix-tokens "$PREFIX" \
  --runs "$RUNS" | tee "$DIR/fetch.json"

# --- 2. the write-back's cost to appends -----------------------------------------------
append_row() {  # TARGET: "p50 p99" of kvcache-bench append's append row
  "$BENCH" append --target "$1" --transport shm --clients 2 --duration "$DURATION" \
    --layers 30 --kv-heads 3 --head-dim 64 --block-tokens 32 --blocks-per-seq 4 \
    | awk '$1=="append" {print $5, $6}'
}
for _ in $(seq "$ROUNDS"); do
  append_row "unix://$DIR/a.sock" >> "$DIR/shared"
  append_row "unix://$DIR/c.sock" >> "$DIR/local"
done
echo "# load after: $(uptime)"
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for f in shared local; do
  printf '{"appends": "%s", "p50_ms": %s, "p99_ms": %s, "rounds": %s}\n' "$f" \
    "$(cut -d' ' -f1 "$DIR/$f" | median)" "$(cut -d' ' -f2 "$DIR/$f" | median)" "$ROUNDS"
done
printf '# blocks A wrote to the cluster: %s\n' \
  "$(curl -sf "http://127.0.0.1:$A_METRICS/metrics" | awk '/^kvcached_remote_writes_total/ {printf "%s ", $0}')"
