#!/usr/bin/env bash
# Trace replay over two tiers: what an SSD tier adds to a small host tier.
#
# For each Mooncake trace and each host capacity (a share of the trace's
# unique blocks), replays the trace with kvcache-bench trace twice against a
# fresh daemon: host memory alone, and the same host memory over an SSD tier
# that can hold every unique block, fetching (and verifying) every hit as a
# worker would. Prints the token hit ratio of each and, for the tiered run,
# how the hits split between host memory and SSD.
#
#   bash tests/bench/tier_trace.sh [BUILD_DIR]
#   PERCENTS="1 5 10 25"   host capacities, % of the trace's unique blocks
#   TRACES="conversation synthetic"
#   TRACES_DIR             default ../shared/traces beside the repository
#   SSD_DIR                where the SSD file goes (default: a temp dir under $TMPDIR or /tmp)
#   POLICY=lru             cache.eviction_policy of both tiers. The replay runs as fast as it
#                          can (minutes of trace in seconds of wall time), which distorts a
#                          policy with time constants (LRU-K's correlated period and
#                          fewer-than-K penalty are wall-clock): LRU by default, as
#                          ../shared/traces/SOURCES.md simulates; kvcache-policy-sim measures
#                          LRU-K on the trace's own timestamps.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
KVCACHED=$BUILD/server/kvcached
BENCH=$BUILD/tests/bench/kvcache-bench
CTL=$BUILD/client/kvcachectl
TRACES_DIR=${TRACES_DIR:-$ROOT/../shared/traces}
PERCENTS=${PERCENTS:-"1 5 10 25"}
POLICY=${POLICY:-lru}
TRACES=${TRACES:-"conversation synthetic"}
WORK=$(mktemp -d "${SSD_DIR:-${TMPDIR:-/tmp}}/kvcache-tier-trace-XXXXXX")
trap 'kill $KV_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
for f in "$KVCACHED" "$BENCH" "$CTL"; do
  [[ -x $f ]] || { echo "tier_trace.sh: $f is not built" >&2; exit 2; }
done

BLOCK=8192     # kvcache-bench trace: 16 bytes/token x 512 tokens
SLOT=12288     # an 8 KiB block's SSD extent (64-byte header, size class 12 KiB)
SOCK=$WORK/kvcached.sock
KV_PID=""
# An LRU over payloads alone (as ../shared/traces/SOURCES.md simulates):
# no metadata budget, no staging headroom; migrate from 90% down to 80%.
echo '{"hostTier": {"metadataFraction": 0, "appendStagingFraction": 0},
      "cache": {"evictionPolicy": "'"$POLICY"'"}}' >"$WORK/config.json"

source "$ROOT/tests/bench/trace_daemon.sh"
start() {  # start HOST_BYTES [flags...]
  trace_daemon_start "$WORK/config.json" "$@"
}
stop() {
  trace_daemon_stop
  rm -f "$WORK/ssd.bin"
}
field() {  # field LOG REGEX: the first capture of REGEX in LOG
  sed -n "s/$2/\1/p" "$1" | head -1
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); policy $POLICY"
printf '| trace | host (%% of unique) | host blocks | host only: token hit | host+ssd: token hit | from host | from ssd | unbounded |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|\n'
for t in $TRACES; do
  trace=$TRACES_DIR/${t}_trace.jsonl
  [[ -f $trace ]] || { echo "tier_trace.sh: $trace not found (set TRACES_DIR)" >&2; exit 2; }
  unique=$(grep -o '"hash_ids": \[[^]]*\]' "$trace" | tr -c '0-9\n' ' ' | tr ' ' '\n' | sort -u |
    grep -c .)
  for p in $PERCENTS; do
    blocks=$((unique * p / 100 / 8 * 8))
    host=$((blocks * BLOCK))
    start "$host"
    "$BENCH" trace --target "unix://$SOCK" --trace "$trace" --fetch-hits >"$WORK/host.log" 2>&1
    stop
    # The SSD holds every unique block (plus a region per size class in use).
    ssd=$(((unique * SLOT / 16777216 + 4) * 16777216))
    start "$host" --ssd-path "$WORK/ssd.bin" --ssd-capacity-bytes "$ssd"
    "$BENCH" trace --target "unix://$SOCK" --trace "$trace" --fetch-hits >"$WORK/tier.log" 2>&1
    stop
    printf '| %s | %s%% | %s | %s | %s | %s | %s | %s |\n' "$t" "$p" "$blocks" \
      "$(field "$WORK/host.log" '^tokens: .* hit_ratio=\([0-9.]*\).*')" \
      "$(field "$WORK/tier.log" '^tokens: .* hit_ratio=\([0-9.]*\).*')" \
      "$(field "$WORK/tier.log" '^hit tokens by tier: host=[0-9]* (\([0-9.]*\).*')" \
      "$(field "$WORK/tier.log" '^hit tokens by tier: .* ssd=[0-9]* (\([0-9.]*\).*')" \
      "$(field "$WORK/tier.log" '^tokens: .*unbounded cache: \([0-9.]*\)).*')"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
