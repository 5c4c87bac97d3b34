#!/usr/bin/env bash
# Reproducible benchmark figures for kvcached, measured side by side with its peers in one
# sitting (docs/benchmarks.md explains the method and the results).
#
#   bash tests/bench/run_benchmarks.sh [BUILD_DIR]              # default BUILD_DIR: build
#   QUICK=1 bash tests/bench/run_benchmarks.sh build            # smoke run, a few minutes
#   MAX_LOAD=1 bash tests/bench/run_benchmarks.sh build         # wait for a quiet machine first
#
# BUILD_DIR must contain server/kvcached, tests/bench/kvcache-bench and client/kvcachectl (a
# Release build); tests/bench/memcpy_baseline and server/core/slab_pool_benchmark are used when
# present. Needs redis-server, redis-benchmark and redis-cli (Debian package redis-server) and
# python3 (free ports). Mooncake Store is an optional peer (see MOONCAKE_VENV).
#
# Environment:
#   RUNS=5          interleaved repetitions of every load measurement (medians are reported)
#   DURATION=3      seconds per load measurement
#   WORKERS="1 4 16" worker counts: kvcache-bench --clients N, redis-benchmark -c N,
#                   N Mooncake worker processes, N memcpy threads
#   CLIENTS=4       clients for the small round trip (lookup vs 16-byte GET)
#   QUICK=0         1: RUNS=1, DURATION=1, 64 KiB and 4 MiB, 1 and 16 workers, one trace capacity
#   KV_CAPACITY     kvcached host tier for the load runs (default 4 GiB)
#   REDIS_IO_THREADS  auto (default: measure 1 and 2 io-threads once, keep the faster), or a number
#   MOONCAKE_VENV   Python venv with the mooncake package (default ../venv-mooncake beside the
#                   repository); its rows are skipped, with the reason, when it is missing
#   OUT_DIR         where raw logs and results.md go (default BUILD_DIR/bench-results/<UTC time>)
#   TRACES_DIR      the Mooncake traces and SOURCES.md (default ../shared/traces beside the
#                   repository)
#   MAX_LOAD        if set, first wait (up to QUIET_WAIT_S=600 s) for the 1-min load to drop below it
#
# What runs (everything on this machine, daemons and load generators alike):
#  1. load: for values of 64 KiB, 512 KiB, 2 MiB and 4 MiB (kvcache-bench layouts with exactly
#     that block size, one block per sequence, so one op moves one value) and for each worker
#     count, RUNS times, interleaved in one loop so that noise hits every peer alike:
#       kvcached over TCP and over shared memory (when kvcache-bench has --transport):
#         append | fetch --no-verify (32-block working set)
#       Redis over TCP and over a Unix socket: SET | GET (32 keys)
#       Mooncake Store over its TCP transport (optional): put | get (32 keys)
#       memcpy_baseline with as many threads as workers
#     Ratios are medians of per-run ratios: both sides of a ratio come from the same run.
#  2. kvcached lookup vs Redis GET of a 16-byte value (a small unary round trip).
#  3. trace replay of both Mooncake traces at 1/5/10/25/50% of their unique blocks (a fresh
#     daemon per capacity, 64 KiB slabs so the capacity is within 8 blocks of the target), next
#     to SOURCES.md's LRU column.
#  4. the slab pool micro-benchmark (SlabPool vs malloc vs operator new), if built.
# The 1-minute load average is recorded at the start and end of every section. The markdown
# report goes to stdout and OUT_DIR/results.md; progress to stderr.
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
  WORKERS=${WORKERS:-1 16}
  MEMCPY_TIME=0.25
else
  RUNS=${RUNS:-5}
  DURATION=${DURATION:-3}
  WORKERS=${WORKERS:-1 4 16}
  MEMCPY_TIME=0.5
fi
read -r -a WORKER_LIST <<<"$WORKERS"
CLIENTS=${CLIENTS:-4}
KV_CAPACITY=${KV_CAPACITY:-$((4 << 30))}
TRACES_DIR=${TRACES_DIR:-$ROOT/../shared/traces}
MOONCAKE_VENV=${MOONCAKE_VENV:-$ROOT/../venv-mooncake}
REDIS_IO_THREADS=${REDIS_IO_THREADS:-auto}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3

KVCACHED=$BUILD/server/kvcached
BENCH=$BUILD/tests/bench/kvcache-bench
CTL=$BUILD/client/kvcachectl
MEMCPY=$BUILD/tests/bench/memcpy_baseline
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
MC_MASTER_PID=""
MC_STORE_PID=""
cleanup() {
  local rc=$?
  local pid
  for pid in $KV_PID $REDIS_PID $MC_STORE_PID $MC_MASTER_PID; do
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
# The values recorded under exactly the key "$*" (space-joined fields before the value).
values() { awk -F'\t' -v k="$*" '{v=$NF; $NF=""; sub(/[ \t]+$/,""); if($0==k) print v}' OFS=' ' "$RES"; }
# The values whose leading fields are "$*" (load rows: every run of one measurement).
sel() {
  awk -F'\t' -v k="$*" 'BEGIN{n=split(k,K," ")} {for(i=1;i<=n;i++) if($i!=K[i]) next; print $NF}' "$RES"
}
# Median over runs of A/B, pairing the two measurements of the same run (field before the value).
pratio() {  # pratio "KEY A" "KEY B"
  awk -F'\t' -v a="$1" -v b="$2" '
    function match_key(k,   n, K, i) { n=split(k,K," "); for(i=1;i<=n;i++) if($i!=K[i]) return 0; return 1 }
    match_key(a) {x[$(NF-1)]=$NF} match_key(b) {y[$(NF-1)]=$NF}
    END {for (r in x) if ((r in y) && y[r] > 0) print x[r]/y[r]}' "$RES" |
    median | awk '{if($1=="-") print "-"; else printf("%.2f\n", $1)}'
}
record() {  # record FIELD... VALUE
  local IFS=$'\t'
  echo "$*" >>"$RES"
}
fmt() { awk -v x="$1" -v p="${2:-0}" 'BEGIN{if(x=="-"||x=="") print "-"; else printf("%.*f\n", p, x)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(a=="-"||b=="-"||b==0) print "-"; else printf("%.2f\n", a/b)}'; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# Sections: the 1-min load average at the start and end of each, in order.
SECTIONS=()
declare -A SEC_START=() SEC_END=()
section_start() { SECTIONS+=("$1"); SEC_START[$1]=$(load1); log "== $1 (load $(load1))"; }
section_end() { SEC_END[$1]=$(load1); }

# ---------------------------------------------------------------- quiet check
LOAD_BEFORE_WAIT=$(cut -d' ' -f1-3 /proc/loadavg)
WAITED=0
if [[ -n ${MAX_LOAD:-} ]]; then
  while awk -v m="$MAX_LOAD" '{exit !($1 > m)}' /proc/loadavg && ((WAITED < ${QUIET_WAIT_S:-600})); do
    log "1-min load $(load1) > $MAX_LOAD; waiting ($WAITED s so far)"
    sleep 30
    WAITED=$((WAITED + 30))
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
REDIS_IO=1
start_redis() {  # start_redis IO_THREADS
  REDIS_IO=$1
  local io_flags=()
  ((REDIS_IO > 1)) && io_flags=(--io-threads "$REDIS_IO" --io-threads-do-reads yes)
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --unixsocket "$REDIS_UNIX" \
    --unixsocketperm 700 --save '' --appendonly no --daemonize no --dir "$WORK" "${io_flags[@]}" \
    >>"$OUT_DIR/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    if redis-cli -s "$REDIS_UNIX" ping 2>/dev/null | grep -q PONG; then return 0; fi
    sleep 0.1
  done
  echo "run_benchmarks.sh: redis-server did not come up (see $OUT_DIR/redis.log)" >&2
  exit 1
}
stop_redis() {
  if [[ -n $REDIS_PID ]]; then
    kill -TERM "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
    REDIS_PID=""
  fi
}

# kvcached over shared memory, only when kvcache-bench has the transport.
if "$BENCH" --help 2>&1 | grep -q -- '--transport'; then
  SHM=1
  SHM_NOTE="kvcache-bench --transport=shm against unix://<socket>"
else
  SHM=0
  SHM_NOTE="n/a (kvcache-bench has no shm transport)"
fi

# Mooncake Store: mooncake_master (with its HTTP metadata server) and one storage process
# (mooncake_client, which mounts the global segment); tests/bench/mooncake_peer.py's workers
# contribute no memory, so every value crosses Mooncake's TCP transport.
MC=0
MC_NOTE=""
MC_PY=$MOONCAKE_VENV/bin/python
if [[ ! -x $MC_PY ]]; then
  MC_NOTE="n/a (no venv at $MOONCAKE_VENV; set MOONCAKE_VENV)"
elif ! mc_err=$("$MC_PY" -c 'import mooncake.store' 2>&1); then
  MC_NOTE="n/a (import mooncake.store failed: $(tail -1 <<<"$mc_err"))"
elif [[ ! -x $MOONCAKE_VENV/bin/mooncake_master || ! -x $MOONCAKE_VENV/bin/mooncake_client ]]; then
  MC_NOTE="n/a (mooncake_master or mooncake_client missing in $MOONCAKE_VENV/bin)"
else
  MC=1
fi
MC_RPC=""
MC_META=""
start_mooncake() {
  MC_RPC=127.0.0.1:$(free_port)
  local http metrics store_port
  http=$(free_port)
  metrics=$(free_port)
  store_port=$(free_port)
  MC_META=http://127.0.0.1:$http/metadata
  "$MOONCAKE_VENV/bin/mooncake_master" --rpc_address=127.0.0.1 --rpc_port="${MC_RPC##*:}" \
    --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 \
    --http_metadata_server_port="$http" --metrics_host=127.0.0.1 --metrics_port="$metrics" \
    >"$OUT_DIR/mooncake-master.log" 2>&1 &
  MC_MASTER_PID=$!
  local up=0
  for _ in $(seq 100); do
    if "$PY" -c "import socket; socket.create_connection(('127.0.0.1', ${MC_RPC##*:}), 1)" 2>/dev/null; then
      up=1
      break
    fi
    sleep 0.1
  done
  if ((up == 0)); then
    MC=0
    MC_NOTE="n/a (mooncake_master did not come up; see mooncake-master.log)"
    return 0
  fi
  "$MOONCAKE_VENV/bin/mooncake_client" --host=127.0.0.1 --port="$store_port" \
    --master_server_address="$MC_RPC" --metadata_server="$MC_META" \
    --global_segment_size="${MOONCAKE_SEGMENT:-2 GB}" --protocol=tcp \
    >"$OUT_DIR/mooncake-store.log" 2>&1 &
  MC_STORE_PID=$!
  for _ in $(seq 150); do
    if grep -q 'Starting real client service' "$OUT_DIR/mooncake-store.log" 2>/dev/null; then
      MC_NOTE="mooncake $("$MC_PY" -c 'import importlib.metadata as m; print(m.version("mooncake-transfer-engine-non-cuda"))' 2>/dev/null ||
        echo '?'), protocol tcp, one storage process (mooncake_client, ${MOONCAKE_SEGMENT:-2 GB} segment)"
      return 0
    fi
    kill -0 "$MC_STORE_PID" 2>/dev/null || break
    sleep 0.2
  done
  MC=0
  MC_NOTE="n/a (mooncake_client did not come up; see mooncake-store.log)"
}

# ---------------------------------------------------------------- load runs
# name bytes layers kv_heads head_dim block_tokens (fp16: bytes = layers*2*kv*tok*hd*2)
SIZES=(
  "64KiB 65536 4 2 128 16"
  "512KiB 524288 32 2 128 16"
  "2MiB 2097152 32 8 128 16"
  "4MiB 4194304 32 16 128 16"
)
[[ $QUICK == 1 ]] && SIZES=("${SIZES[0]}" "${SIZES[3]}")

# kv_run PEER LABEL SIZE WORKERS RUN MODE MODEL FLAGS...   (PEER: kv-tcp | kv-unix | kv-shm)
kv_run() {
  local peer=$1 label=$2 size=$3 n=$4 run=$5 mode=$6 model=$7
  shift 7
  local target=$KV_TCP
  local extra=()
  case $peer in
    kv-unix) target=unix://$KV_UNIX extra=(--transport=grpc) ;;
    kv-shm) target=unix://$KV_UNIX extra=(--transport=shm) ;;
  esac
  local logf=$OUT_DIR/$peer-$label-$size.log rc=0 out
  out=$("$BENCH" "$mode" --target "$target" "${extra[@]}" --clients "$n" --duration "$DURATION" \
    --model "$model" --blocks-per-seq 1 "$@" 2>&1) || rc=$?
  printf '%s\n%s\n' "### $peer $label $size workers=$n run=$run rc=$rc" "$out" >>"$logf"
  local line
  line=$(awk -v op="$mode" '$1==op && NF>=8 {print; exit}' <<<"$out")
  if ((rc != 0)) || [[ -z $line ]] || [[ $(awk '{print $8}' <<<"$line") != 0 ]]; then
    log "  $peer $label $size x$n FAILED (rc=$rc; see $logf)"
    FAILURES=$((FAILURES + 1))
    "$CTL" -t "unix://$KV_UNIX" evict --model "$model" --all >/dev/null 2>&1 || true
    return 0
  fi
  local ops p50 ev
  read -r _ _ ops _ p50 _ _ _ <<<"$line"
  ev=$(sed -n 's/.*capacity_evictions=\([0-9]*\).*/\1/p' <<<"$out" | head -1)
  record load "$size" "$n" "$peer" "$label" ops "$run" "$ops"
  record load "$size" "$n" "$peer" "$label" p50 "$run" "$p50"
  record load "$size" "$n" "$peer" "$label" evictions "$run" "${ev:-0}"
  log "  $peer $label $size x$n: $ops ops/s p50 ${p50} ms"
  "$CTL" -t "unix://$KV_UNIX" evict --model "$model" --all >/dev/null
}

redis_conn() { [[ $1 == redis-tcp ]] && echo "-h 127.0.0.1 -p $REDIS_PORT" || echo "-s $REDIS_UNIX"; }
# redis_run PEER LABEL SIZE WORKERS RUN TEST VALUE_BYTES REQUESTS   (PEER: redis-tcp | redis-unix)
redis_run() {
  local peer=$1 label=$2 size=$3 n=$4 run=$5 test=$6 d=$7 reqs=$8
  local logf=$OUT_DIR/$peer-$label-$size.log rc=0 out
  # shellcheck disable=SC2046
  out=$(redis-benchmark $(redis_conn "$peer") -t "$test" -d "$d" -c "$n" -n "$reqs" -r 32 -P 1 --csv 2>&1) || rc=$?
  printf '%s\n%s\n' "### $peer $label $size workers=$n run=$run n=$reqs rc=$rc" "$out" >>"$logf"
  local up line
  up=$(tr '[:lower:]' '[:upper:]' <<<"$test")
  line=$(tr -d '"' <<<"$out" | awk -F, -v t="$up" '$1==t {print; exit}')
  if ((rc != 0)) || [[ -z $line ]]; then
    log "  $peer $label $size x$n FAILED (rc=$rc; see $logf)"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  local ops p50
  ops=$(cut -d, -f2 <<<"$line")
  p50=$(cut -d, -f5 <<<"$line")
  record load "$size" "$n" "$peer" "$label" ops "$run" "$ops"
  record load "$size" "$n" "$peer" "$label" p50 "$run" "$p50"
  log "  $peer $label $size x$n: $ops ops/s p50 ${p50} ms"
}

# Stores the 32 keys redis-benchmark -r 32 reads (key:000000000000 .. key:000000000031).
redis_fill() {  # redis_fill VALUE_BYTES
  local d=$1 k
  head -c "$d" /dev/zero | tr '\0' 'x' >"$WORK/value"
  redis-cli -s "$REDIS_UNIX" flushall >/dev/null
  for ((k = 0; k < 32; k++)); do
    redis-cli -s "$REDIS_UNIX" -x set "$(printf 'key:%012d' "$k")" <"$WORK/value" >/dev/null
  done
  local keys len
  keys=$(redis-cli -s "$REDIS_UNIX" dbsize)
  len=$(redis-cli -s "$REDIS_UNIX" strlen key:000000000031)
  [[ $keys == 32 && $len == "$d" ]] || {
    echo "run_benchmarks.sh: redis holds $keys keys of $len bytes, want 32 of $d" >&2
    exit 1
  }
}

# Requests for about DURATION seconds of redis-benchmark -t TEST at the rate measured by a
# short calibration run over the Unix socket.
redis_calibrate() {  # redis_calibrate TEST VALUE_BYTES WORKERS -> requests
  local test=$1 d=$2 n=$3 cal rps up
  cal=$((128 * 1048576 / (d > 65536 ? d : 65536)))
  ((cal < 64)) && cal=64
  up=$(tr '[:lower:]' '[:upper:]' <<<"$test")
  rps=$(redis-benchmark -s "$REDIS_UNIX" -t "$test" -d "$d" -c "$n" -n "$cal" -r 32 -P 1 --csv 2>/dev/null |
    tr -d '"' | awk -F, -v t="$up" '$1==t {print $2; exit}')
  awk -v r="${rps:-100}" -v s="$DURATION" 'BEGIN{n=int(r*s); if(n<50)n=50; print n}'
}

# mc_run LABEL SIZE WORKERS RUN OP BYTES
mc_run() {
  local label=$1 size=$2 n=$3 run=$4 op=$5 d=$6
  local logf=$OUT_DIR/mooncake-$label-$size.log rc=0 out keys=32
  [[ $op == put ]] && keys=$((32 / n > 2 ? 32 / n : 2))
  out=$(GLOG_minloglevel=2 "$MC_PY" "$ROOT/tests/bench/mooncake_peer.py" "$op" --master "$MC_RPC" \
    --metadata "$MC_META" --size "$d" --clients "$n" --duration "$DURATION" --keys "$keys" \
    --prefix "bench-$size" 2>"$WORK/mc.err") || rc=$?
  printf '%s\n%s\n%s\n' "### mooncake $label $size workers=$n run=$run rc=$rc" "$out" \
    "$(grep -v '^[IW][0-9]\{4\} ' "$WORK/mc.err" | tail -20)" >>"$logf"
  local line
  line=$(awk -v op="$op" '$1==op && NF>=8 {print; exit}' <<<"$out")
  if ((rc != 0)) || [[ -z $line ]]; then
    log "  mooncake $label $size x$n FAILED (rc=$rc; see $logf)"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  local ops p50
  read -r _ _ ops _ p50 _ _ _ <<<"$line"
  record load "$size" "$n" mooncake "$label" ops "$run" "$ops"
  record load "$size" "$n" mooncake "$label" p50 "$run" "$p50"
  log "  mooncake $label $size x$n: $ops ops/s p50 ${p50} ms"
}

# memcpy_run SIZE WORKERS RUN BYTES: aggregate GB/s of WORKERS threads, recorded as ops/s.
memcpy_run() {
  local size=$1 n=$2 run=$3 d=$4 out gbs
  [[ -x $MEMCPY ]] || return 0
  out=$("$MEMCPY" --sizes "$d" --threads "$n" --min-time "$MEMCPY_TIME" 2>&1) || {
    log "  memcpy $size x$n FAILED: $out"
    FAILURES=$((FAILURES + 1))
    return 0
  }
  gbs=$(awk '$1=="memcpy" {print $4; exit}' <<<"$out")
  record load "$size" "$n" memcpy copy ops "$run" "$(awk -v g="$gbs" -v d="$d" 'BEGIN{printf("%.1f", g*1e9/d)}')"
  echo "$out" >>"$OUT_DIR/memcpy.log"
}

# Redis io-threads: measured once (GET and SET of 512 KiB over TCP with the most workers), the
# faster setting is kept for every Redis row.
redis_probe() {  # redis_probe IO_THREADS -> records probe rows
  local io=$1 n=${WORKER_LIST[-1]} t reqs
  start_redis "$io"
  redis_fill 524288
  for t in set get; do
    reqs=$(redis_calibrate "$t" 524288 "$n")
    redis_run redis-tcp "probe-io$io-$t" 512KiB "$n" 1 "$t" 524288 "$reqs"
  done
  stop_redis
}
section_start "Redis io-threads probe"
if [[ $REDIS_IO_THREADS == auto ]]; then
  redis_probe 1
  redis_probe 2
  REDIS_IO_CHOSEN=$(awk -v a="$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp probe-io1-set ops | head -1)" \
    -v b="$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp probe-io1-get ops | head -1)" \
    -v c="$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp probe-io2-set ops | head -1)" \
    -v d="$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp probe-io2-get ops | head -1)" \
    'BEGIN{if (c*d > a*b) print 2; else print 1}')
  REDIS_IO_WHY="measured: geometric mean of SET and GET ops/s, 512 KiB, ${WORKER_LIST[-1]} connections, TCP"
else
  REDIS_IO_CHOSEN=$REDIS_IO_THREADS
  REDIS_IO_WHY="set by REDIS_IO_THREADS"
fi
section_end "Redis io-threads probe"
log "redis io-threads: $REDIS_IO_CHOSEN ($REDIS_IO_WHY)"

start_redis "$REDIS_IO_CHOSEN"
start_kvcached "$KV_CAPACITY"
((MC == 1)) && start_mooncake
log "kvcached pid $KV_PID on $KV_TCP and $KV_UNIX; redis-server pid $REDIS_PID on 127.0.0.1:$REDIS_PORT and $REDIS_UNIX"
log "shm: $SHM_NOTE; mooncake: ${MC_NOTE:-off}"
log "RUNS=$RUNS DURATION=${DURATION}s WORKERS='$WORKERS'; raw logs in $OUT_DIR"
[[ -x $MEMCPY ]] || log "memcpy_baseline not built ($MEMCPY): no memcpy rows"

declare -A LAYOUT_OK=()
for spec in "${SIZES[@]}"; do
  read -r size bytes layers kvh hd bt <<<"$spec"
  section_start "load $size"
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
  LAYOUT_OK[$size]="${layers} layers x ${kvh} KV heads x head_dim ${hd} x ${bt} tokens, fp16"
  redis_fill "$bytes"
  for n in "${WORKER_LIST[@]}"; do
    n_set=$(redis_calibrate set "$bytes" "$n")
    n_get=$(redis_calibrate get "$bytes" "$n")
    ws=$((32 / n > 1 ? 32 / n : 1))  # kvcached fetch working set: 32 blocks over all clients
    log "size $size, $n workers: ${LAYOUT_OK[$size]}; redis SET n=$n_set GET n=$n_get; fetch working set $ws/client"
    for ((r = 1; r <= RUNS; r++)); do
      log "size $size, $n workers, run $r/$RUNS"
      kv_run kv-tcp append "$size" "$n" "$r" append "$model" "${layout[@]}"
      redis_run redis-tcp SET "$size" "$n" "$r" set "$bytes" "$n_set"
      redis_run redis-unix SET "$size" "$n" "$r" set "$bytes" "$n_set"
      if ((SHM == 1)); then kv_run kv-shm append "$size" "$n" "$r" append "$model" "${layout[@]}"; fi
      if ((MC == 1)); then mc_run put "$size" "$n" "$r" put "$bytes"; fi
      memcpy_run "$size" "$n" "$r" "$bytes"
      kv_run kv-tcp fetch "$size" "$n" "$r" fetch "$model" "${layout[@]}" --no-verify --working-set "$ws"
      redis_run redis-tcp GET "$size" "$n" "$r" get "$bytes" "$n_get"
      redis_run redis-unix GET "$size" "$n" "$r" get "$bytes" "$n_get"
      if ((SHM == 1)); then
        kv_run kv-shm fetch "$size" "$n" "$r" fetch "$model" "${layout[@]}" --no-verify --working-set "$ws"
      fi
      if ((MC == 1)); then mc_run get "$size" "$n" "$r" get "$bytes"; fi
    done
  done
  section_end "load $size"
done

# Small unary round trip: Lookup of one 16-token block vs GET of a 16-byte value.
section_start "small round trip"
redis-cli -s "$REDIS_UNIX" flushall >/dev/null
redis-benchmark -s "$REDIS_UNIX" -t set -d 16 -c "$CLIENTS" -n 2000 -r 32 -P 1 -q >/dev/null 2>&1
n_small=$(redis_calibrate get 16 "$CLIENTS")
read -r _ _ layers kvh hd bt <<<"${SIZES[0]}"
small_layout=(--layers "$layers" --kv-heads "$kvh" --head-dim "$hd" --block-tokens "$bt")
for ((r = 1; r <= RUNS; r++)); do
  for tr in tcp unix; do
    log "small round trip run $r/$RUNS over $tr"
    kv_run "kv-$tr" lookup small "$CLIENTS" "$r" lookup bench-lookup "${small_layout[@]}"
    redis_run "redis-$tr" GET16 small "$CLIENTS" "$r" get 16 "$n_small"
  done
  if ((SHM)); then
    kv_run kv-shm lookup small "$CLIENTS" "$r" lookup bench-lookup "${small_layout[@]}"
  fi
done
section_end "small round trip"
stop_kvcached
stop_redis
for pid in $MC_STORE_PID $MC_MASTER_PID; do
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
done
MC_STORE_PID=""
MC_MASTER_PID=""

# ---------------------------------------------------------------- trace replay
section_start "trace replay"
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
# SOURCES.md simulates an LRU over the payload alone: no metadata budget (at 512 tokens per
# 8 KiB block the index metadata, about 2.4 KiB a block, would pass the default 1/8 budget and
# evict first) and no staging headroom (the default keeps 1/8 of the capacity free).
echo '{"hostTier": {"metadataFraction": 0, "appendStagingFraction": 0}}' >"$WORK/trace-config.json"
BLOCK_BYTES=8192  # 512 tokens x 16 bytes/token (kvcache-bench's default)
for t in conversation synthetic; do
  for p in "${PCTS[@]}"; do
    per_slab=$((TRACE_SLAB / BLOCK_BYTES))
    slabs=$(awk -v u="${UNIQUE[$t]}" -v p="$p" -v s="$per_slab" 'BEGIN{x=int(u*p/100/s+0.5); if(x<1)x=1; print x}')
    cap=$((slabs * TRACE_SLAB))
    blocks=$((cap / BLOCK_BYTES))
    log "trace $t at $p% ($blocks blocks, $cap bytes)"
    start_kvcached "$cap" --slab-bytes "$TRACE_SLAB" --config "$WORK/trace-config.json"
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
section_end "trace replay"

# ---------------------------------------------------------------- slab pool
SLAB_CSV=""
if [[ -x $SLABBENCH ]]; then
  section_start "slab pool"
  SLAB_CSV=$OUT_DIR/slab_pool_benchmark.csv
  if [[ $QUICK == 1 ]]; then
    slab_args=(--benchmark_min_time=0.05 --benchmark_filter='threads:1$')
  else
    slab_args=(--benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
  fi
  "$SLABBENCH" "${slab_args[@]}" --benchmark_format=csv >"$SLAB_CSV" 2>"$OUT_DIR/slab_pool_benchmark.err" ||
    { log "  slab_pool_benchmark failed"; FAILURES=$((FAILURES + 1)); SLAB_CSV=""; }
  section_end "slab pool"
fi
T_END=$(date +%s)
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- report
# GB/s of the median ops/s of one measurement, or a note when the peer did not run.
gbs_cell() {  # gbs_cell SIZE BYTES WORKERS PEER LABEL
  local m
  m=$(sel load "$1" "$3" "$4" "$5" ops | median)
  awk -v o="$m" -v s="$2" 'BEGIN{if(o=="-") print "-"; else printf("%.2f\n", o*s/1e9)}'
}
p50_cell() { fmt "$(sel load "$1" "$2" "$3" "$4" p50 | median)" 3; }
spread_cell() {  # (max-min)/median of ops/s over the runs
  local m mn mx
  m=$(sel load "$1" "$2" "$3" "$4" ops | median)
  read -r mn mx < <(sel load "$1" "$2" "$3" "$4" ops | minmax)
  awk -v a="$mn" -v b="$mx" -v m="$m" 'BEGIN{if(m=="-"||m==0) print "-"; else printf("%.0f%%\n", (b-a)/m*100)}'
}
# One table per direction: GB/s medians, then per-run ratios.
load_table() {  # load_table KV_LABEL REDIS_LABEL MC_LABEL
  local kv=$1 rd=$2 mc=$3 spec size bytes n row best
  echo "| size | workers | kvcached tcp | kvcached shm | Redis tcp | Redis unix | Mooncake tcp | memcpy | kv tcp / Redis tcp | kv shm / Redis unix | kv tcp / Mooncake | best kv / memcpy |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for spec in "${SIZES[@]}"; do
    read -r size bytes _ <<<"$spec"
    for n in "${WORKER_LIST[@]}"; do
      row="| $size | $n | $(gbs_cell "$size" "$bytes" "$n" kv-tcp "$kv")"
      if ((SHM == 1)); then row+=" | $(gbs_cell "$size" "$bytes" "$n" kv-shm "$kv")"; else row+=" | n/a"; fi
      row+=" | $(gbs_cell "$size" "$bytes" "$n" redis-tcp "$rd") | $(gbs_cell "$size" "$bytes" "$n" redis-unix "$rd")"
      if [[ -n $(sel load "$size" "$n" mooncake "$mc" ops) ]]; then
        row+=" | $(gbs_cell "$size" "$bytes" "$n" mooncake "$mc")"
      else
        row+=" | n/a"
      fi
      row+=" | $(gbs_cell "$size" "$bytes" "$n" memcpy copy)"
      row+=" | $(pratio "load $size $n kv-tcp $kv ops" "load $size $n redis-tcp $rd ops")"
      row+=" | $( ((SHM == 1)) && pratio "load $size $n kv-shm $kv ops" "load $size $n redis-unix $rd ops" || echo n/a)"
      if ((MC == 1)); then row+=" | $(pratio "load $size $n kv-tcp $kv ops" "load $size $n mooncake $mc ops")"; else row+=" | n/a"; fi
      best="kv-tcp"
      if ((SHM == 1)) && [[ -n $(sel load "$size" "$n" kv-shm "$kv" ops) ]]; then best="kv-shm"; fi
      row+=" | $(pratio "load $size $n $best $kv ops" "load $size $n memcpy copy ops") |"
      echo "$row"
    done
  done
}
latency_table() {  # latency_table KV_LABEL REDIS_LABEL MC_LABEL
  local kv=$1 rd=$2 mc=$3 spec size n
  echo "| size | workers | kvcached tcp p50 | spread | kvcached shm p50 | Redis tcp p50 | spread | Redis unix p50 | Mooncake p50 |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for spec in "${SIZES[@]}"; do
    read -r size _ <<<"$spec"
    for n in "${WORKER_LIST[@]}"; do
      echo "| $size | $n | $(p50_cell "$size" "$n" kv-tcp "$kv") | $(spread_cell "$size" "$n" kv-tcp "$kv") | $( ((SHM == 1)) && p50_cell "$size" "$n" kv-shm "$kv" || echo n/a) | $(p50_cell "$size" "$n" redis-tcp "$rd") | $(spread_cell "$size" "$n" redis-tcp "$rd") | $(p50_cell "$size" "$n" redis-unix "$rd") | $( ((MC == 1)) && p50_cell "$size" "$n" mooncake "$mc" || echo n/a) |"
    done
  done
}
{
  echo "## Machine and sitting"
  echo
  echo "| | |"
  echo "|---|---|"
  echo "| date (UTC) | $(date -u -d "@$T_START" '+%Y-%m-%d %H:%M') (took $(((T_END - T_START) / 60)) min $(((T_END - T_START) % 60)) s) |"
  echo "| CPU | $(nproc) cores visible, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1) |"
  echo "| memory | $(awk '/MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo) |"
  echo "| kernel | $(uname -sr) |"
  if [[ -n ${MAX_LOAD:-} ]]; then
    echo "| quiet wait | MAX_LOAD=$MAX_LOAD: load $LOAD_BEFORE_WAIT when invoked, waited $WAITED s$( awk -v m="$MAX_LOAD" -v l="${LOAD_START%% *}" 'BEGIN{if (l > m) print " and gave up: NOT a quiet sitting"}') |"
  else
    echo "| quiet wait | none (MAX_LOAD not set) |"
  fi
  echo "| load average (1/5/15 min) | start $LOAD_START, end $LOAD_END |"
  echo "| kvcached | $("$KVCACHED" --version 2>&1 | head -1), $BUILD_TYPE build, binary built $(date -u -r "$KVCACHED" '+%Y-%m-%d %H:%M'); tree at git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)') when run |"
  echo "| kvcached shm | $SHM_NOTE |"
  echo "| Redis | $(redis-server --version | sed 's/ sha=.*//'), persistence off, io-threads $REDIS_IO_CHOSEN ($REDIS_IO_WHY) |"
  echo "| Mooncake Store | ${MC_NOTE:-off} |"
  echo "| memcpy | $([[ -x $MEMCPY ]] && echo "memcpy_baseline: 256 MiB source + 256 MiB destination split over the threads, pre-faulted, ${MEMCPY_TIME} s per run" || echo "n/a (memcpy_baseline not built)") |"
  echo "| command | \`RUNS=$RUNS DURATION=$DURATION WORKERS='$WORKERS' CLIENTS=$CLIENTS QUICK=$QUICK bash tests/bench/run_benchmarks.sh $BUILD_ARG\` |"
  echo
  echo "### 1-minute load average by section"
  echo
  echo "| section | start | end |"
  echo "|---|---:|---:|"
  for s in "${SECTIONS[@]}"; do echo "| $s | ${SEC_START[$s]} | ${SEC_END[$s]:--} |"; done
  if [[ $REDIS_IO_THREADS == auto ]]; then
    echo
    echo "### Redis io-threads probe (512 KiB, ${WORKER_LIST[-1]} connections, TCP, one run each)"
    echo
    echo "| io-threads | SET ops/s | GET ops/s |"
    echo "|---:|---:|---:|"
    for io in 1 2; do
      echo "| $io$( [[ $io == 2 ]] && echo ' (do-reads yes)') | $(fmt "$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp "probe-io$io-set" ops | head -1)") | $(fmt "$(sel load 512KiB "${WORKER_LIST[-1]}" redis-tcp "probe-io$io-get" ops | head -1)") |"
    done
    echo
    echo "Redis rows below use io-threads $REDIS_IO_CHOSEN."
  fi
  echo
  echo "## Reads: kvcached Fetch (--no-verify) vs Redis GET vs Mooncake get vs memcpy, GB/s (medians of $RUNS runs)"
  echo
  echo "One op reads one value of the given size; workers = kvcache-bench clients = redis-benchmark connections = Mooncake worker processes = memcpy threads. Ratios are the median of per-run ratios (both sides from the same interleaved run). kvcached fetch still checks XXH3 in the client library."
  echo
  load_table fetch GET get
  echo
  echo "p50 latency in ms; spread = (max-min)/median of ops/s over the runs:"
  echo
  latency_table fetch GET get
  echo
  echo "## Writes: kvcached Append vs Redis SET vs Mooncake put (upsert) vs memcpy, GB/s (medians of $RUNS runs)"
  echo
  load_table append SET put
  echo
  latency_table append SET put
  echo
  echo "Layouts (one block = one value):"
  for spec in "${SIZES[@]}"; do
    read -r size _ <<<"$spec"
    echo "- $size: ${LAYOUT_OK[$size]:-?}"
  done
  echo
  ev_total=$(awk -F'\t' '$1=="load" && $6=="evictions"{s+=$NF} END{print s+0}' "$RES")
  echo "Capacity evictions: the daemon's cumulative counter as each kvcached load run ended, summed over the runs: $ev_total (0 means no run evicted; appends over shared memory can fill KV_CAPACITY within one run, and then run under eviction)."
  echo
  echo "## Small round trip: kvcached Lookup (one 16-token block) vs Redis GET of 16 bytes, $CLIENTS clients (medians of $RUNS runs)"
  echo
  echo "| transport | lookup ops/s | p50 ms | Redis GET16 ops/s | p50 ms | lookup/GET |"
  echo "|---|---:|---:|---:|---:|---:|"
  for tr in tcp unix shm; do
    # gRPC over TCP and over the Unix socket; the shared-memory socket is
    # compared with Redis over its Unix socket.
    rtr=$tr
    [[ $tr == shm ]] && rtr=unix
    a=$(sel load small "$CLIENTS" "kv-$tr" lookup ops | median)
    [[ -n $a ]] || continue
    b=$(sel load small "$CLIENTS" "redis-$rtr" GET16 ops | median)
    echo "| $tr | $(fmt "$a") | $(p50_cell small "$CLIENTS" "kv-$tr" lookup) | $(fmt "$b") | $(p50_cell small "$CLIENTS" "redis-$rtr" GET16) | $(pratio "load small $CLIENTS kv-$tr lookup ops" "load small $CLIENTS redis-$rtr GET16 ops") |"
  done
  echo
  echo "## Trace replay: hit ratios vs SOURCES.md's LRU simulation"
  echo
  echo "Daemon per capacity: --capacity-bytes = blocks x 8 KiB, --slab-bytes 65536, host_tier.metadata_fraction 0 and append_staging_fraction 0 (an LRU over the payload alone, as SOURCES.md simulates); kvcache-bench trace (16 bytes/token, 8 KiB blocks)."
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
