#!/usr/bin/env bash
# Hit ratio of the daemon's eviction policy, replayed through the daemon.
#
# For each Mooncake trace and each host capacity (a share of the trace's
# unique blocks), replays the trace with kvcache-bench trace against a fresh
# kvcached three times, and puts beside them what kvcache-policy-sim (the same
# policy classes in process) gives at the same number of blocks:
#   lru      cache.eviction_policy lru, the whole tier for KV (no staging
#            headroom, no metadata budget): the model the simulator and
#            ../shared/traces/SOURCES.md use;
#   lru_k    the default policy, the whole tier for KV: the policy alone;
#   default  the daemon as shipped (embedded config: lru_k, append staging
#            and the metadata budget), only the time constants scaled.
# The lru_k runs are paced: each request is sent at its timestamp / SPEEDUP,
# and the policy's time constants (correlated period, fewer-than-K penalty)
# are SPEEDUP times smaller, so the daemon sees the trace's own timing in
# SPEEDUP times less wall time (the report gives how late requests started).
# "gap" is the share of the LRU -> Belady gap captured: (x - LRU) / (Belady -
# LRU), with the daemon's own LRU run and the simulator's leaf-only Belady.
#
#   bash tests/bench/policy_trace.sh [BUILD_DIR]
#   PERCENTS="5 10"        host capacities, % of the trace's unique blocks
#   TRACES="conversation synthetic"   names under TRACES_DIR (NAME_trace.jsonl), or paths
#                          of any Mooncake-format trace (an entry ending in .jsonl)
#   TRACES_DIR             default ../shared/traces beside the repository
#   SPEEDUP=40             replay speed of the paced runs
#   BYTES_PER_TOKEN=256    KV bytes per token (blocks of 128 KiB). The index's
#                          metadata per block (its 512 token ids, about 2.3 KiB)
#                          counts against host_tier.metadata_fraction (0.125 of
#                          the tier): below about 40 bytes per token it, not the
#                          tier, bounds the default run's blocks (a real model
#                          has thousands of bytes per token)
#   LIMIT=0                replay only the first LIMIT requests (0: all); SMOKE=1
#                          sets LIMIT=300, PERCENTS=5 and TRACES=synthetic
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
KVCACHED=$BUILD/server/kvcached
BENCH=$BUILD/tests/bench/kvcache-bench
SIM=$BUILD/tests/bench/kvcache-policy-sim
CTL=$BUILD/client/kvcachectl
TRACES_DIR=${TRACES_DIR:-$ROOT/../shared/traces}
PERCENTS=${PERCENTS:-"5 10"}
TRACES=${TRACES:-"conversation synthetic"}
SPEEDUP=${SPEEDUP:-40}
BYTES_PER_TOKEN=${BYTES_PER_TOKEN:-256}
LIMIT=${LIMIT:-0}
if [[ ${SMOKE:-0} == 1 ]]; then LIMIT=300 PERCENTS=5 TRACES=synthetic; fi
for f in "$KVCACHED" "$BENCH" "$SIM" "$CTL"; do
  [[ -x $f ]] || { echo "policy_trace.sh: $f is not built" >&2; exit 2; }
done
trace_path() {  # trace_path NAME_OR_PATH
  if [[ $1 == *.jsonl ]]; then echo "$1"; else echo "$TRACES_DIR/${1}_trace.jsonl"; fi
}
for t in $TRACES; do
  if [[ ! -f $(trace_path "$t") ]]; then
    echo "policy_trace.sh: $(trace_path "$t") not found (set TRACES_DIR)" >&2
    exit 77
  fi
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvcache-policy-trace-XXXXXX")
KV_PID=""
trap 'kill $KV_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

BLOCK=$((BYTES_PER_TOKEN * 512))
SOCK=$WORK/kvcached.sock
period=$((1000 / SPEEDUP))       # the defaults: 1 s and 10 minutes
penalty=$((600000 / SPEEDUP))
lru_k='"lruK": {"correlatedPeriodMs": '$period', "fewerThanKPenaltyMs": "'$penalty'"}'
whole='"hostTier": {"metadataFraction": 0, "appendStagingFraction": 0}'
echo '{'"$whole"', "cache": {"evictionPolicy": "lru"}}' >"$WORK/lru.json"
echo '{'"$whole"', "cache": {"evictionPolicy": "lru_k", '"$lru_k"'}}' >"$WORK/lru_k.json"
echo '{"cache": {'"$lru_k"'}}' >"$WORK/default.json"

source "$ROOT/tests/bench/trace_daemon.sh"
replay() {  # replay CONFIG HOST_BYTES TRACE LOG [bench flags...]: prints the token hit ratio
  local config=$1 host=$2 trace=$3 log=$4
  shift 4
  trace_daemon_start "$config" "$host"
  "$BENCH" trace --target "unix://$SOCK" --trace "$trace" --limit "$LIMIT" \
    --bytes-per-token "$BYTES_PER_TOKEN" "$@" >"$log" 2>&1 ||
    { echo "policy_trace.sh: kvcache-bench failed:" >&2; tail -5 "$log" >&2; exit 1; }
  trace_daemon_stop
  sed -n 's/^tokens: .* hit_ratio=\([0-9.]*\) .*/\1/p' "$log" | head -1
}
sim() {  # sim JSON POLICY: the simulator's token hit of POLICY
  sed -n 's/.*"policy": "'"$2"'", "token_hit": \([0-9.]*\).*/\1/p' "$1" | head -1
}
gap() { awk -v x="$1" -v l="$2" -v b="$3" 'BEGIN { printf (b - l > 1e-9 ? "%.2f" : "n/a"), (x - l) / (b - l) }'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); speedup $SPEEDUP (lru_k: correlated" \
  "period ${period} ms, fewer-than-K penalty ${penalty} ms); ${BYTES_PER_TOKEN} bytes per token"
printf '| trace | capacity | blocks | sim LRU | sim LRU-K2 | sim Belady | daemon lru | daemon lru_k | daemon default | gap lru_k | gap default | late p99 |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
ok=1
for t in $TRACES; do
  trace=$(trace_path "$t")
  t=$(basename "$t" .jsonl)
  if ((LIMIT > 0)); then
    head -n "$LIMIT" "$trace" >"$WORK/trace.jsonl"
    trace=$WORK/trace.jsonl
  fi
  unique=$(grep -o '"hash_ids": \[[^]]*\]' "$trace" | tr -c '0-9\n' ' ' | tr ' ' '\n' | sort -u |
    grep -c .)
  for p in $PERCENTS; do
    blocks=$((unique * p / 100 / 8 * 8))
    host=$((blocks * BLOCK))
    # The simulator at exactly `blocks` blocks.
    pct=$(awk -v b="$blocks" -v u="$unique" 'BEGIN { printf "%.6f", (b + 0.5) * 100 / u }')
    "$SIM" --trace "$trace" --capacity-percent "$pct" --json >"$WORK/sim.json"
    lru=$(replay "$WORK/lru.json" "$host" "$trace" "$WORK/lru.log")
    lruk=$(replay "$WORK/lru_k.json" "$host" "$trace" "$WORK/lru_k.log" --speedup "$SPEEDUP")
    dflt=$(replay "$WORK/default.json" "$host" "$trace" "$WORK/default.log" --speedup "$SPEEDUP")
    late=$(sed -n 's/^pacing: .* p99=\([0-9.]*ms\).*/\1/p' "$WORK/default.log" | head -1)
    belady=$(sim "$WORK/sim.json" belady)
    # The replay must model the cache as the simulator does: the daemon's LRU
    # within 0.02 of the simulator's, and every figure read.
    simlru=$(sim "$WORK/sim.json" lru)
    for v in "$lru" "$lruk" "$dflt" "$simlru" "$belady"; do
      [[ $v =~ ^[0-9.]+$ ]] || { echo "policy_trace.sh: a figure is missing ($t, $p%)" >&2; ok=0; }
    done
    if ! awk -v a="$lru" -v b="$simlru" 'BEGIN { exit !(a - b <= 0.02 && b - a <= 0.02) }'; then
      echo "policy_trace.sh: daemon LRU $lru is not within 0.02 of the simulator's $simlru" >&2
      ok=0
    fi
    printf '| %s | %s%% | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$p" \
      "$blocks" "$simlru" "$(sim "$WORK/sim.json" combined)" "$belady" \
      "$lru" "$lruk" "$dflt" "$(gap "$lruk" "$lru" "$belady")" "$(gap "$dflt" "$lru" "$belady")" \
      "$late"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
((ok)) || exit 1
