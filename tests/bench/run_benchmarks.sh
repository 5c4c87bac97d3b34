#!/usr/bin/env bash
# Reproducible benchmark figures for kvcached, measured side by side with Redis
# in the same sitting (docs/benchmarks.md explains the method and the results).
#
#   bash tests/bench/run_benchmarks.sh [BUILD_DIR]      # default BUILD_DIR: build
#   QUICK=1 bash tests/bench/run_benchmarks.sh build    # ~2-minute smoke run
#
# BUILD_DIR must contain server/kvcached, tests/bench/kvcache-bench and
# client/kvcachectl (a Release build; server/core/slab_pool_benchmark is used
# when present). Needs redis-server, redis-benchmark and redis-cli (Debian
# package redis-server) and /usr/bin/python3 (free ports, copy baseline).
#
# Environment:
#   RUNS=5          repetitions of every load measurement (medians are reported)
#   DURATION=5      seconds per load measurement
#   CLIENTS=4       concurrent clients (kvcache-bench threads, redis-benchmark -c)
#   QUICK=0         1: RUNS=1, DURATION=1, two sizes, one trace capacity
#   KV_CAPACITY     kvcached host tier for the load runs (default 4 GiB)
#   OUT_DIR         where raw logs and results.md go (default BUILD_DIR/bench-results/<UTC time>)
#   TRACES_DIR      the Mooncake traces and SOURCES.md (default ../shared/traces beside the
#                   repository, found from this script's location)
#   MAX_LOAD        if set, first wait (up to QUIET_WAIT_S=600 s) for the 1-min load to drop below it
#
# What runs (everything on this machine, daemons and load generators alike):
#  1. load: for blocks of 64 KiB, 512 KiB and 2 MiB (kvcache-bench layouts with
#     exactly that block size, one block per sequence, so one op moves one value),
#     over TCP and over a Unix socket, RUNS times, interleaved:
#       kvcached append | Redis SET | kvcached fetch (verified) | Redis GET |
#       kvcached fetch --no-verify
#     plus kvcached lookup vs Redis GET of a 16-byte value (a small unary round trip).
#     Between kvcached runs the model's cache is evicted, so runs do not pile up.
#  2. a copy baseline per size (python bytearray slice copy, i.e. memmove in CPython).
#  3. trace replay of both Mooncake traces at 1/5/10/25/50% of their unique
#     blocks (a fresh daemon per capacity, 64 KiB slabs so the capacity is within
#     8 blocks of the target), next to SOURCES.md's LRU column.
#  4. the slab pool micro-benchmark (SlabPool vs malloc vs operator new), if built.
# The markdown report goes to stdout and OUT_DIR/results.md; progress to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_ARG=${1:-${BUILD_DIR:-build}}
if [[ -d $BUILD_ARG ]]; then
  BUILD=$(cd "$BUILD_ARG" && pwd)
elif [[ -d $ROOT/$BUILD_ARG ]]; then
  BUILD=$(cd "$ROOT/$BUILD_ARG" && pwd)
else
  echo "run_benchmarks.sh: build dir '$BUILD_ARG' not found" >&2
  exit 2
fi
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
  RUNS=${RUNS:-1}
  DURATION=${DURATION:-1}
else
  RUNS=${RUNS:-5}
  DURATION=${DURATION:-5}
fi
CLIENTS=${CLIENTS:-4}
KV_CAPACITY=${KV_CAPACITY:-$((4 << 30))}
TRACES_DIR=${TRACES_DIR:-$ROOT/../shared/traces}  # beside the checkout: ../shared/traces
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3

KVCACHED=$BUILD/server/kvcached
BENCH=$BUILD/tests/bench/kvcache-bench
CTL=$BUILD/client/kvcachectl
SLABBENCH=$BUILD/server/core/slab_pool_benchmark
for b in "$KVCACHED" "$BENCH" "$CTL"; do
  [[ -x $b ]] || { echo "run_benchmarks.sh: missing $b (build it first)" >&2; exit 2; }
done
for b in redis-server redis-benchmark redis-cli; do
  command -v "$b" >/dev/null || { echo "run_benchmarks.sh: $b not found (apt-get install redis-server)" >&2; exit 2; }
done
if grep -q 'CMAKE_BUILD_TYPE:STRING=' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  BUILD_TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt")
else
  BUILD_TYPE=unknown
fi
[[ $BUILD_TYPE == Release ]] || echo "run_benchmarks.sh: warning: build type is '$BUILD_TYPE', not Release" >&2

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT_DIR=${OUT_DIR:-$BUILD/bench-results/$STAMP}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/kvbench.XXXXXX)
RES=$OUT_DIR/results.tsv  # kind <tab> key... <tab> value, one measurement per line
: >"$RES"
FAILURES=0

KV_PID=""
REDIS_PID=""
cleanup() {
  local rc=$?
  local pid
  for pid in $KV_PID $REDIS_PID; do
    if kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# median / min / max of the numbers on stdin ("-" if none).
median() {
  sort -g | awk '{a[NR]=$1} END{if(NR==0){print "-";exit}
    if(NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
minmax() { sort -g | awk 'NR==1{mn=$1} {mx=$1} END{if(NR==0) print "- -"; else print mn, mx}'; }
# The values recorded under key "$*" (space-joined fields before the value).
values() { awk -F'\t' -v k="$*" '{v=$NF; $NF=""; sub(/[ \t]+$/,""); if($0==k) print v}' OFS=' ' "$RES"; }
record() {  # record FIELD... VALUE
  local IFS=$'\t'
  echo "$*" >>"$RES"
}
fmt() { awk -v x="$1" -v p="${2:-0}" 'BEGIN{if(x=="-"||x=="") print "-"; else printf("%.*f\n", p, x)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="-"||b=="-"||b==0) print "-"; else printf("%.2f\n", a/b)}'; }

# ---------------------------------------------------------------- quiet check
if [[ -n ${MAX_LOAD:-} ]]; then
  waited=0
  while awk -v m="$MAX_LOAD" '{exit !($1 > m)}' /proc/loadavg && ((waited < ${QUIET_WAIT_S:-600})); do
    log "1-min load $(cut -d' ' -f1 /proc/loadavg) > $MAX_LOAD; waiting ($waited s so far)"
    sleep 30
    waited=$((waited + 30))
  done
fi
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)

# ---------------------------------------------------------------- daemons
KV_TCP=""
KV_UNIX=$WORK/kvcached.sock
start_kvcached() {  # start_kvcached CAPACITY_BYTES [extra flags...]
  local cap=$1
  shift
  KV_TCP=127.0.0.1:$(free_port)
  rm -f "$KV_UNIX"
  "$KVCACHED" --listen "$KV_TCP" --unix-socket "$KV_UNIX" --metrics-address none \
    --capacity-bytes "$cap" --log-level warn "$@" >>"$OUT_DIR/kvcached.log" 2>&1 &
  KV_PID=$!
  for _ in $(seq 100); do
    if "$CTL" -t "unix://$KV_UNIX" --timeout 1 status >/dev/null 2>&1; then return 0; fi
    kill -0 "$KV_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "run_benchmarks.sh: kvcached did not come up (see $OUT_DIR/kvcached.log)" >&2
  exit 1
}
stop_kvcached() {
  if [[ -n $KV_PID ]]; then
    kill -TERM "$KV_PID" 2>/dev/null || true
    wait "$KV_PID" 2>/dev/null || true
    KV_PID=""
  fi
}
REDIS_PORT=$(free_port)
REDIS_UNIX=$WORK/redis.sock
start_redis() {
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --unixsocket "$REDIS_UNIX" \
    --unixsocketperm 700 --save '' --appendonly no --daemonize no --dir "$WORK" \
    >"$OUT_DIR/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    if redis-cli -s "$REDIS_UNIX" ping 2>/dev/null | grep -q PONG; then return 0; fi
    sleep 0.1
  done
  echo "run_benchmarks.sh: redis-server did not come up (see $OUT_DIR/redis.log)" >&2
  exit 1
}

# ---------------------------------------------------------------- load runs
# name bytes layers kv_heads head_dim block_tokens (fp16: bytes = layers*2*kv*tok*hd*2)
SIZES=(
  "64KiB 65536 4 2 128 16"
  "512KiB 524288 32 2 128 16"
  "2MiB 2097152 32 8 128 16"
)
[[ $QUICK == 1 ]] && SIZES=("${SIZES[0]}" "${SIZES[2]}")

kv_target() { [[ $1 == tcp ]] && echo "$KV_TCP" || echo "unix://$KV_UNIX"; }
redis_conn() { [[ $1 == tcp ]] && echo "-h 127.0.0.1 -p $REDIS_PORT" || echo "-s $REDIS_UNIX"; }

# kv_run LABEL SIZE TRANSPORT MODE MODEL LAYOUT_FLAGS... [-- extra flags]
kv_run() {
  local label=$1 size=$2 tr=$3 mode=$4 model=$5
  shift 5
  local logf=$OUT_DIR/kv-$label-$size-$tr.log rc=0 out
  out=$("$BENCH" "$mode" --target "$(kv_target "$tr")" --clients "$CLIENTS" --duration "$DURATION" \
    --model "$model" --blocks-per-seq 1 "$@" 2>&1) || rc=$?
  printf '%s\n%s\n' "### $label $size $tr rc=$rc" "$out" >>"$logf"
  local line
  line=$(awk -v op="$mode" '$1==op && NF>=8 {print; exit}' <<<"$out")
  if ((rc != 0)) || [[ -z $line ]] || [[ $(awk '{print $8}' <<<"$line") != 0 ]]; then
    log "  kvcached $label $size $tr FAILED (rc=$rc; see $logf)"
    FAILURES=$((FAILURES + 1))
    "$CTL" -t "unix://$KV_UNIX" evict --model "$model" --all >/dev/null 2>&1 || true
    return 0
  fi
  local ops p50 p99 ev
  read -r _ _ ops _ p50 p99 _ _ <<<"$line"
  ev=$(sed -n 's/.*capacity_evictions=\([0-9]*\).*/\1/p' <<<"$out" | head -1)
  record load "$size" "$tr" "$label" ops "$ops"
  record load "$size" "$tr" "$label" p50 "$p50"
  record load "$size" "$tr" "$label" p99 "$p99"
  record load "$size" "$tr" "$label" evictions "${ev:-0}"
  log "  kvcached $label $size $tr: $ops ops/s p50 ${p50} ms"
  "$CTL" -t "unix://$KV_UNIX" evict --model "$model" --all >/dev/null
}

# redis_run LABEL SIZE TRANSPORT TEST VALUE_BYTES REQUESTS
redis_run() {
  local label=$1 size=$2 tr=$3 test=$4 d=$5 n=$6
  local logf=$OUT_DIR/redis-$label-$size-$tr.log rc=0 out
  # shellcheck disable=SC2046
  out=$(redis-benchmark $(redis_conn "$tr") -t "$test" -d "$d" -c "$CLIENTS" -n "$n" -r 32 -P 1 --csv 2>&1) || rc=$?
  printf '%s\n%s\n' "### $label $size $tr n=$n rc=$rc" "$out" >>"$logf"
  local up line
  up=$(tr '[:lower:]' '[:upper:]' <<<"$test")
  line=$(tr -d '"' <<<"$out" | awk -F, -v t="$up" '$1==t {print; exit}')
  if ((rc != 0)) || [[ -z $line ]]; then
    log "  redis $label $size $tr FAILED (rc=$rc; see $logf)"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  local ops p50 p99
  ops=$(cut -d, -f2 <<<"$line")
  p50=$(cut -d, -f5 <<<"$line")
  p99=$(cut -d, -f7 <<<"$line")
  record load "$size" "$tr" "$label" ops "$ops"
  record load "$size" "$tr" "$label" p50 "$p50"
  record load "$size" "$tr" "$label" p99 "$p99"
  log "  redis $label $size $tr: $ops ops/s p50 ${p50} ms"
}

# Requests for about DURATION seconds of redis-benchmark -t TEST at the rate
# measured by a short calibration run (which also fills the 32 keys).
redis_calibrate() {  # redis_calibrate TEST VALUE_BYTES -> requests
  local test=$1 d=$2 cal rps up
  cal=$((256 * 1048576 / (d > 65536 ? d : 65536)))
  ((cal < 128)) && cal=128
  up=$(tr '[:lower:]' '[:upper:]' <<<"$test")
  rps=$(redis-benchmark -s "$REDIS_UNIX" -t "$test" -d "$d" -c "$CLIENTS" -n "$cal" -r 32 -P 1 --csv 2>/dev/null |
    tr -d '"' | awk -F, -v t="$up" '$1==t {print $2; exit}')
  awk -v r="${rps:-100}" -v s="$DURATION" 'BEGIN{n=int(r*s); if(n<100)n=100; print n}'
}

start_redis
start_kvcached "$KV_CAPACITY"
log "kvcached pid $KV_PID on $KV_TCP and $KV_UNIX; redis-server pid $REDIS_PID on 127.0.0.1:$REDIS_PORT and $REDIS_UNIX"
log "RUNS=$RUNS DURATION=${DURATION}s CLIENTS=$CLIENTS; raw logs in $OUT_DIR"

declare -A LAYOUT_OK=()
for spec in "${SIZES[@]}"; do
  read -r size bytes layers kvh hd bt <<<"$spec"
  model=bench-$size
  layout=(--layers "$layers" --kv-heads "$kvh" --head-dim "$hd" --block-tokens "$bt" --dtype fp16)
  # The layout must give exactly one block of `bytes` (kvcache-bench prints it).
  got=$("$BENCH" append --target "unix://$KV_UNIX" --clients 1 --duration 0.2 --model "$model" \
    --blocks-per-seq 1 "${layout[@]}" 2>&1 | sed -n 's/.* tokens x \([0-9]*\) bytes.*/\1/p' | head -1)
  "$CTL" -t "unix://$KV_UNIX" evict --model "$model" --all >/dev/null
  if [[ $got != "$bytes" ]]; then
    echo "run_benchmarks.sh: layout for $size gives blocks of '${got}' bytes, want $bytes" >&2
    exit 1
  fi
  record loadavg "$size" "$(cut -d' ' -f1 /proc/loadavg)"
  LAYOUT_OK[$size]="${layers} layers x ${kvh} KV heads x head_dim ${hd} x ${bt} tokens, fp16"
  redis-cli -s "$REDIS_UNIX" flushall >/dev/null
  n_set=$(redis_calibrate set "$bytes")
  n_get=$(redis_calibrate get "$bytes")
  keys=$(redis-cli -s "$REDIS_UNIX" dbsize)
  len=$(redis-cli -s "$REDIS_UNIX" strlen key:000000000000)
  log "size $size: ${LAYOUT_OK[$size]}; redis SET n=$n_set GET n=$n_get (keys=$keys strlen=$len)"
  [[ $len == "$bytes" ]] || { echo "run_benchmarks.sh: redis value is $len bytes, want $bytes" >&2; exit 1; }
  for ((r = 1; r <= RUNS; r++)); do
    for tr in tcp unix; do
      log "size $size run $r/$RUNS over $tr"
      kv_run append "$size" "$tr" append "$model" "${layout[@]}"
      redis_run SET "$size" "$tr" set "$bytes" "$n_set"
      kv_run fetch "$size" "$tr" fetch "$model" "${layout[@]}"
      redis_run GET "$size" "$tr" get "$bytes" "$n_get"
      kv_run fetch-noverify "$size" "$tr" fetch "$model" "${layout[@]}" --no-verify
    done
  done
done

# Small unary round trip: Lookup of one 16-token block vs GET of a 16-byte value.
redis-cli -s "$REDIS_UNIX" flushall >/dev/null
n_small=$(redis_calibrate get 16)
redis-benchmark -s "$REDIS_UNIX" -t set -d 16 -c "$CLIENTS" -n 2000 -r 32 -P 1 -q >/dev/null 2>&1
read -r _ _ layers kvh hd bt <<<"${SIZES[0]}"
small_layout=(--layers "$layers" --kv-heads "$kvh" --head-dim "$hd" --block-tokens "$bt")
for ((r = 1; r <= RUNS; r++)); do
  for tr in tcp unix; do
    log "small round trip run $r/$RUNS over $tr"
    kv_run lookup small "$tr" lookup bench-lookup "${small_layout[@]}"
    redis_run GET16 small "$tr" get 16 "$n_small"
  done
done

# ---------------------------------------------------------------- copy baseline
log "copy baseline (python bytearray slice copy)"
for spec in "${SIZES[@]}"; do
  read -r size bytes _ <<<"$spec"
  for ((r = 1; r <= RUNS; r++)); do
    gbs=$("$PY" - "$bytes" <<'EOF'
import sys, time
n = int(sys.argv[1])
src = bytearray(b'\x5a' * n); dst = bytearray(n)
dst[:] = src
iters = max(8, (512 << 20) // n)
t = time.perf_counter()
for _ in range(iters):
    dst[:] = src
dt = time.perf_counter() - t
print(f"{iters * n / dt / 1e9:.3f}")
EOF
)
    record copy "$size" gbs "$gbs"
  done
done
stop_kvcached
kill -TERM "$REDIS_PID" 2>/dev/null || true
wait "$REDIS_PID" 2>/dev/null || true
REDIS_PID=""

# ---------------------------------------------------------------- trace replay
SRC=$TRACES_DIR/SOURCES.md
[[ -f $SRC ]] || { echo "run_benchmarks.sh: $SRC not found (set TRACES_DIR to the traces' directory)" >&2; exit 2; }
PCTS=(1 5 10 25 50)
[[ $QUICK == 1 ]] && PCTS=(10)
declare -A UNIQUE=() LRU=()
for t in conversation synthetic; do
  row=$(grep "^| ${t}_trace |" "$SRC" || true)
  [[ -n $row ]] || { echo "run_benchmarks.sh: no '${t}_trace' row in $SRC" >&2; exit 1; }
  UNIQUE[$t]=$(awk -F'|' '{gsub(/[ ,]/,"",$5); print $5}' <<<"$row")
  i=7
  for p in 1 5 10 25 50; do
    LRU[$t,$p]=$(awk -F'|' -v i=$i '{gsub(/ /,"",$i); print $i}' <<<"$row")
    i=$((i + 1))
  done
done
TRACE_SLAB=65536
BLOCK_BYTES=8192  # 512 tokens x 16 bytes/token (kvcache-bench's default)
for t in conversation synthetic; do
  for p in "${PCTS[@]}"; do
    per_slab=$((TRACE_SLAB / BLOCK_BYTES))
    slabs=$(awk -v u="${UNIQUE[$t]}" -v p="$p" -v s="$per_slab" 'BEGIN{x=int(u*p/100/s+0.5); if(x<1)x=1; print x}')
    cap=$((slabs * TRACE_SLAB))
    blocks=$((cap / BLOCK_BYTES))
    log "trace $t at $p% ($blocks blocks, $cap bytes)"
    start_kvcached "$cap" --slab-bytes "$TRACE_SLAB"
    logf=$OUT_DIR/trace-$t-$p.log
    rc=0
    "$BENCH" trace --target "unix://$KV_UNIX" --trace "$TRACES_DIR/${t}_trace.jsonl" >"$logf" 2>&1 || rc=$?
    stop_kvcached
    if ((rc != 0)); then
      log "  FAILED (rc=$rc; see $logf)"
      FAILURES=$((FAILURES + 1))
      continue
    fi
    record trace "$t" "$p" blocks "$blocks"
    record trace "$t" "$p" block_hit "$(sed -n 's/^blocks: .* hit_ratio=\([0-9.]*\).*/\1/p' "$logf")"
    record trace "$t" "$p" token_hit "$(sed -n 's/^tokens: .* hit_ratio=\([0-9.]*\).*/\1/p' "$logf")"
    record trace "$t" "$p" ideal "$(sed -n 's/^blocks: .*unbounded cache: \([0-9.]*\)).*/\1/p' "$logf")"
    record trace "$t" "$p" reqs "$(sed -n 's/^requests=.*(\([0-9.]*\) req\/s).*/\1/p' "$logf")"
    record trace "$t" "$p" lookup_p50 "$(awk '$1=="lookup"{print $5}' "$logf")"
    record trace "$t" "$p" append_p50 "$(awk '$1=="append"{print $5}' "$logf")"
    log "  block hit $(values trace "$t" "$p" block_hit) (SOURCES.md LRU ${LRU[$t,$p]})"
  done
done

# ---------------------------------------------------------------- slab pool
SLAB_CSV=""
if [[ -x $SLABBENCH ]]; then
  log "slab pool micro-benchmark"
  SLAB_CSV=$OUT_DIR/slab_pool_benchmark.csv
  if [[ $QUICK == 1 ]]; then
    slab_args=(--benchmark_min_time=0.05 --benchmark_filter='threads:1$')
  else
    slab_args=(--benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
  fi
  "$SLABBENCH" "${slab_args[@]}" --benchmark_format=csv >"$SLAB_CSV" 2>"$OUT_DIR/slab_pool_benchmark.err" ||
    { log "  slab_pool_benchmark failed"; FAILURES=$((FAILURES + 1)); SLAB_CSV=""; }
fi
T_END=$(date +%s)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- report
{
  echo "## Machine and sitting"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| date (UTC) | $(date -u -d "@$T_START" '+%Y-%m-%d %H:%M') (took $(((T_END - T_START) / 60)) min $(((T_END - T_START) % 60)) s) |"
  echo "| CPU | $(nproc) cores visible, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) |"
  echo "| memory | $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo) |"
  echo "| kernel | $(uname -sr) |"
  echo "| load average (1/5/15 min) | start $LOAD_START, end $LOAD_END |"
  echo "| kvcached | $("$KVCACHED" --version 2>&1 | head -1), $BUILD_TYPE build, binary built $(date -u -r "$KVCACHED" '+%Y-%m-%d %H:%M'); tree at git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)') when run |"
  echo "| Redis | $(redis-server --version | sed 's/ sha=.*//'), persistence off |"
  echo "| command | \`RUNS=$RUNS DURATION=$DURATION CLIENTS=$CLIENTS QUICK=$QUICK bash tests/bench/run_benchmarks.sh $BUILD_ARG\` |"
  echo
  echo "## Writes: kvcached Append vs Redis SET (medians of $RUNS runs)"
  echo
  echo "One op stores one value of the given size. ops/s spread = (max-min)/median over the runs."
  echo
  echo "| size | transport | kvcached append ops/s | GB/s | p50 ms | spread | Redis SET ops/s | GB/s | p50 ms | spread | append/SET |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for spec in "${SIZES[@]}"; do
    read -r size bytes _ <<<"$spec"
    for tr in tcp unix; do
      row="| $size | $tr"
      meds=()
      for op in append SET; do
        m=$(values load "$size" "$tr" "$op" ops | median)
        read -r mn mx < <(values load "$size" "$tr" "$op" ops | minmax)
        spread=$(awk -v a="$mn" -v b="$mx" -v m="$m" 'BEGIN{if(m=="-"||m==0) print "-"; else printf("%.0f%%", (b-a)/m*100)}')
        gbs=$(awk -v o="$m" -v s="$bytes" 'BEGIN{if(o=="-") print "-"; else printf("%.2f", o*s/1e9)}')
        row+=" | $(fmt "$m") | $gbs | $(fmt "$(values load "$size" "$tr" "$op" p50 | median)" 3) | $spread"
        meds+=("$m")
      done
      echo "$row | $(ratio "${meds[0]}" "${meds[1]}") |"
    done
  done
  echo
  echo "## Reads: kvcached Fetch vs Redis GET (medians of $RUNS runs)"
  echo
  echo "fetch verifies every byte against the bench pattern (on top of the client's XXH3 check); fetch-nv is --no-verify (XXH3 check only)."
  echo
  echo "| size | transport | fetch ops/s | GB/s | p50 ms | fetch-nv ops/s | GB/s | p50 ms | Redis GET ops/s | GB/s | p50 ms | fetch/GET | fetch-nv/GET | copy GB/s |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for spec in "${SIZES[@]}"; do
    read -r size bytes _ <<<"$spec"
    for tr in tcp unix; do
      row="| $size | $tr"
      declare -A med=()
      for op in fetch fetch-noverify GET; do
        m=$(values load "$size" "$tr" "$op" ops | median)
        med[$op]=$m
        gbs=$(awk -v o="$m" -v s="$bytes" 'BEGIN{if(o=="-") print "-"; else printf("%.2f", o*s/1e9)}')
        p50=$(values load "$size" "$tr" "$op" p50 | median)
        row+=" | $(fmt "$m") | $gbs | $(fmt "$p50" 3)"
      done
      copy=$(values copy "$size" gbs | median)
      echo "$row | $(ratio "${med[fetch]}" "${med[GET]}") | $(ratio "${med[fetch-noverify]}" "${med[GET]}") | $(fmt "$copy" 1) |"
      unset med
    done
  done
  echo
  echo "## Small round trip: kvcached Lookup (one 16-token block) vs Redis GET of 16 bytes (medians of $RUNS runs)"
  echo
  echo "| transport | lookup ops/s | p50 ms | Redis GET16 ops/s | p50 ms | lookup/GET |"
  echo "|---|---:|---:|---:|---:|---:|"
  for tr in tcp unix; do
    a=$(values load small "$tr" lookup ops | median)
    b=$(values load small "$tr" GET16 ops | median)
    echo "| $tr | $(fmt "$a") | $(fmt "$(values load small "$tr" lookup p50 | median)" 3) | $(fmt "$b") | $(fmt "$(values load small "$tr" GET16 p50 | median)" 3) | $(ratio "$a" "$b") |"
  done
  echo
  echo -n "1-min load average when each size started:"
  for spec in "${SIZES[@]}"; do
    read -r size _ <<<"$spec"
    echo -n " $size $(values loadavg "$size" | head -1);"
  done
  echo
  echo
  ev_total=$(awk -F'\t' '$5=="evictions"{s+=$6} END{print s+0}' "$RES")
  echo "Capacity evictions during load runs (should be 0): $ev_total."
  echo
  echo "## Trace replay: hit ratios vs SOURCES.md's LRU simulation"
  echo
  echo "Daemon per capacity: --capacity-bytes = blocks x 8 KiB, --slab-bytes 65536; kvcache-bench trace (16 bytes/token, 8 KiB blocks)."
  echo
  echo "| trace | target | capacity (blocks) | of unique | block hit | token hit | SOURCES.md LRU | difference | unbounded | replay req/s | lookup p50 ms | append p50 ms |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for t in conversation synthetic; do
    for p in "${PCTS[@]}"; do
      bh=$(values trace "$t" "$p" block_hit | head -1)
      [[ -n $bh ]] || continue
      blocks=$(values trace "$t" "$p" blocks | head -1)
      echo "| $t | $p% | $blocks | $(awk -v b="$blocks" -v u="${UNIQUE[$t]}" 'BEGIN{printf("%.2f%%", b/u*100)}') | $bh | $(values trace "$t" "$p" token_hit | head -1) | ${LRU[$t,$p]} | $(awk -v a="$bh" -v b="${LRU[$t,$p]}" 'BEGIN{d=a-b; if(d<0.0005&&d>-0.0005) print "0.000"; else printf("%+.3f", d)}') | $(values trace "$t" "$p" ideal | head -1) | $(values trace "$t" "$p" reqs | head -1) | $(values trace "$t" "$p" lookup_p50 | head -1) | $(values trace "$t" "$p" append_p50 | head -1) |"
    done
  done
  if [[ -n $SLAB_CSV ]]; then
    echo
    echo "## Slab pool micro-benchmark: allocate + touch + free, ns per op (real time$([[ $QUICK == 1 ]] || echo ', median of 3 repetitions'))"
    echo
    echo "| bytes | threads | SlabPool | malloc | operator new | SlabPool/malloc |"
    echo "|---:|---:|---:|---:|---:|---:|"
    tr -d '"' <"$SLAB_CSV" | awk -F, '
      /^BM_/ {
        name=$1; if (name ~ /_(mean|stddev|cv)$/) next; sub(/_median$/, "", name)
        split(name, p, "/"); kind=p[1]; sub(/^BM_/, "", kind); th=p[4]; sub(/threads:/, "", th)
        key=p[2] " " th; ns[kind, key]=$3; if (!(key in seen)) { seen[key]=1; order[++n]=key }
      }
      END {
        for (i=1; i<=n; i++) { split(order[i], k, " ")
          printf("| %s | %s | %.1f | %.1f | %.1f | %.2f |\n", k[1], k[2], ns["SlabPool", order[i]],
                 ns["Malloc", order[i]], ns["OperatorNew", order[i]], ns["SlabPool", order[i]]/ns["Malloc", order[i]]) }
      }'
  fi
  echo
  echo "Failures: $FAILURES. Raw logs: $OUT_DIR"
} | tee "$OUT_DIR/results.md"

log "done in $((T_END - T_START)) s; report in $OUT_DIR/results.md"
((FAILURES == 0))
