# shellcheck shell=bash
# What the shell integration tests (deploy_assets_test.sh, status_page_test.sh,
# prometheus_scrape_test.sh) share: argument handling, a temp dir and the
# processes started in it, cleaned up on every exit; failing with the logs;
# free ports; a copy of deploy/kvcached.json; starting and stopping kvcached;
# Python gRPC stubs for driving traffic.
#
# Use: after `set -euo pipefail`,
#   source "$(dirname "${BASH_SOURCE[0]}")/shell_lib.sh"
#   setup_test "$@"
#
# Every function checks its own steps and calls `fail` itself, so it behaves
# the same whether it runs under `set -e` or where errexit is off (after `if`,
# `||`, `&&`). `fail` exits the test only from the main shell, not from a
# subshell such as $(...): there, report with a nonzero status instead.
#
# Globals set here and read by the tests:
#   py          Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf
#               when the test needs them).
#   kvcached    the daemon binary under test (absolute path).
#   root        the repository root (absolute); deploy=$root/deploy.
#   work        the test's temp dir, removed on exit.
#   daemon_pid  the kvcached started by start_kvcached, "" when none runs.
#   ports       what free_ports found.
#   fail_logs   files in $work whose tails `fail` prints (default: kvcached.log);
#               a test appends its own.
#
# setup_test KVCACHED_BINARY REPO_ROOT
#   Checks the arguments (else prints the usage and exits 2) and that the
#   binary is executable; sets kvcached, root, deploy and work; installs the
#   EXIT trap that stops every process started with `spawn` (in reverse
#   order, SIGTERM then SIGKILL after 5 s) and removes $work.
# fail MESSAGE...
#   Prints "FAIL: MESSAGE" and the last 40 lines of each non-empty log in
#   fail_logs to stderr, then exits 1 (the EXIT trap cleans up).
# check MESSAGE...
#   Prints "check: MESSAGE": what the test checks next.
# need TOOL [MESSAGE...]
#   Fails, with MESSAGE or "TOOL not found (deploy/setup-debian.sh installs
#   it)", when TOOL is not on PATH.
# need_python
#   Fails when $py is not executable.
# has_python_grpc
#   Succeeds when $py imports grpc and google.protobuf.
# need_python_grpc
#   Fails, naming the packages, when has_python_grpc does not succeed.
# free_ports N
#   Sets the array `ports` to N distinct free TCP ports on 127.0.0.1 (all
#   bound at once, then released); fails if it cannot.
# write_deploy_config DST TCP_PORT METRICS_PORT [--no-calibration]
#   Writes to DST a copy of deploy/kvcached.json that listens on
#   127.0.0.1:TCP_PORT, unix:$work/kvcached.sock and 127.0.0.1:METRICS_PORT,
#   with a 64 MiB host tier, a 64 MiB SSD tier in $work/ssd.bin and
#   checkpoints in $work/checkpoints; --no-calibration drops the calibration
#   file (which is in the unit's StateDirectory).
# spawn LOG COMMAND...
#   Starts COMMAND in the background, stdout and stderr to LOG; $! is its pid
#   afterwards. The EXIT trap stops it unless `forget` was called.
# forget PID
#   The EXIT trap no longer stops PID (it has been waited for).
# stop_process PID
#   SIGTERM, then SIGKILL if PID still runs after 5 s; nothing if PID is ""
#   or has exited.
# running PID MESSAGE
#   Succeeds while PID runs; fails MESSAGE once it has exited.
# exited PID
#   Succeeds once PID has exited.
# poll SECONDS MESSAGE COMMAND...
#   Runs COMMAND every 0.1 s until it succeeds; fails MESSAGE when it has not
#   after SECONDS. COMMAND may itself fail the test (e.g. `running`).
# start_kvcached CONFIG URL [SOCKET]
#   Starts $kvcached --config CONFIG (log: $work/kvcached.log, replaced), sets
#   daemon_pid and waits up to 10 s until URL answers (and SOCKET, if given,
#   exists); fails if kvcached exits first or is not ready in time.
# stop_kvcached
#   Sends kvcached SIGTERM; fails unless it exits within 15 s with status 0.
#   daemon_pid is "" afterwards.
# has_redis
#   Succeeds when redis-server and redis-cli are installed.
# start_redis_cluster
#   Starts Debian's redis-server as a one-node Redis Cluster on free ports of
#   127.0.0.1 (every slot on it, nothing saved; files in $work/redis, log
#   $work/redis.log, added to fail_logs) and waits up to 10 s for
#   cluster_state:ok. Sets redis_port (and overwrites `ports`). The EXIT trap
#   stops it.
# add_remote_tier CONFIG SEED
#   Turns the remote tier on in the JSON config CONFIG: remote_tier.seeds
#   [SEED] and remote_tier.key_file $work/remote.key, made (64 random hex
#   digits, mode 0600) if missing.
# gen_stubs
#   Generates the kvcache.v1 Python stubs into $work/gen, beside cache_rpc.py:
#     import sys; sys.path.insert(0, GEN)
#     from cache_rpc import block_checksums, grpc, pb, connect, register_model
#     call = connect(TARGET)  # waits up to 10 s for the channel
#     call("unary_unary", "Lookup", pb.LookupResponse)(request, timeout=10)
#     register_model(call, NS, MODEL, num_layers, num_kv_heads, head_dim)
#       # fp16, 16-token blocks; returns the RegisterModelResponse
#     block_checksums(kv, block_bytes)
#       # XXH3-64 of each whole block (libxxhash; raises without it): the
#       # AppendHeader.block_checksums kvcached requires by default
#   Fails if protoc does.

py=/usr/bin/python3 # Debian's interpreter: python3-grpcio, python3-protobuf
kvcached="" root="" deploy="" work="" daemon_pid="" ports=() redis_port=""
fail_logs=(kvcached.log)
_spawned_pids=()

setup_test() {
  if (($# != 2)); then
    echo "usage: $0 KVCACHED_BINARY REPO_ROOT" >&2
    exit 2
  fi
  kvcached=$(realpath "$1") || exit 2
  root=$(realpath "$2") || exit 2
  deploy=$root/deploy
  work=$(mktemp -d) || exit 1
  trap _cleanup EXIT
  [[ -x $kvcached ]] || fail "$kvcached is not an executable"
}

_cleanup() {
  local i
  for ((i = ${#_spawned_pids[@]} - 1; i >= 0; i--)); do
    stop_process "${_spawned_pids[i]}"
  done
  if [[ -n $work ]]; then rm -rf "$work"; fi
}

fail() {
  local log
  echo "FAIL: $*" >&2
  for log in "${fail_logs[@]}"; do
    if [[ -n $work && -s $work/$log ]]; then
      echo "--- $log (last 40 lines) ---" >&2
      tail -n 40 "$work/$log" >&2
    fi
  done
  exit 1
}

check() { echo "check: $*"; }

need() {
  if command -v "$1" >/dev/null; then return 0; fi
  if (($# > 1)); then fail "${@:2}"; fi
  fail "$1 not found (deploy/setup-debian.sh installs it)"
}

need_python() { [[ -x $py ]] || fail "$py not found"; }

has_python_grpc() { "$py" -c 'import grpc, google.protobuf' 2>/dev/null; }

need_python_grpc() {
  need_python
  has_python_grpc ||
    fail "$py lacks grpc or protobuf (apt-get install python3-grpcio python3-protobuf)"
}

free_ports() {
  ports=()
  read -r -a ports < <("$py" -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))' "$1") || true
  ((${#ports[@]} == $1)) || fail "cannot pick free ports"
}

write_deploy_config() {
  "$py" - "$deploy/kvcached.json" "$1" "$2" "$3" "$work" "${4:-}" <<'EOF' ||
import json, sys
src, dst, tcp, metrics, work, option = sys.argv[1:7]
c = json.load(open(src))
c["listen"]["tcp_address"] = f"127.0.0.1:{tcp}"
c["listen"]["unix_socket"] = f"{work}/kvcached.sock"
c["listen"]["metrics_address"] = f"127.0.0.1:{metrics}"
c["host_tier"]["capacity_bytes"] = 64 << 20
# An SSD tier too, so that the tier metrics (alerts, dashboard) have an ssd series.
c["ssd_tier"] = {"path": f"{work}/ssd.bin", "capacity_bytes": str(64 << 20)}
# Checkpoints in the temp dir (the real ones are in the unit's StateDirectory).
c["checkpoint"]["dir"] = f"{work}/checkpoints"
if option == "--no-calibration":
    c.get("importance", {}).pop("calibration_file", None)
elif option:
    sys.exit(f"write_deploy_config: unknown option {option}")
json.dump(c, open(dst, "w"), indent=2)
EOF
    fail "cannot write a copy of deploy/kvcached.json to $1"
}

spawn() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  _spawned_pids+=("$!")
}

forget() {
  local i
  for i in "${!_spawned_pids[@]}"; do
    if [[ ${_spawned_pids[i]} == "$1" ]]; then unset '_spawned_pids[i]'; fi
  done
  _spawned_pids=("${_spawned_pids[@]}")
}

stop_process() {
  local pid=$1 i
  if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

running() { kill -0 "$1" 2>/dev/null || fail "$2"; }

exited() { ! kill -0 "$1" 2>/dev/null; }

poll() {
  local seconds=$1 message=$2 i
  shift 2
  for ((i = 0; ; i++)); do
    if "$@"; then return 0; fi
    ((i < seconds * 10)) || fail "$message"
    sleep 0.1
  done
}

_kvcached_ready() { # URL [SOCKET]
  running "$daemon_pid" "kvcached exited at start-up" &&
    [[ -z ${2:-} || -S ${2:-} ]] && curl -fsS -o /dev/null "$1" 2>/dev/null
}

start_kvcached() {
  local config=$1 url=$2 socket=${3:-}
  spawn "$work/kvcached.log" "$kvcached" --config "$config"
  daemon_pid=$!
  if [[ -n $socket ]]; then
    poll 10 "kvcached did not serve its socket $socket and $url within 10 s" \
      _kvcached_ready "$url" "$socket"
  else
    poll 10 "kvcached did not serve $url within 10 s" _kvcached_ready "$url"
  fi
}

stop_kvcached() {
  local status=0
  kill -TERM "$daemon_pid" 2>/dev/null || true
  poll 15 "kvcached still running 15 s after SIGTERM" exited "$daemon_pid"
  wait "$daemon_pid" || status=$?
  forget "$daemon_pid"
  daemon_pid=""
  ((status == 0)) || fail "kvcached exited $status after SIGTERM"
}

has_redis() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; }

_redis_answers() {
  [[ $(redis-cli -h 127.0.0.1 -p "$redis_port" ping 2>/dev/null) == PONG ]]
}

_redis_cluster_ok() {
  [[ $(redis-cli -h 127.0.0.1 -p "$redis_port" cluster info 2>/dev/null) == *cluster_state:ok* ]]
}

start_redis_cluster() {
  free_ports 2
  redis_port=${ports[0]}
  mkdir -p "$work/redis" || fail "mkdir $work/redis"
  fail_logs+=(redis.log)
  spawn "$work/redis.log" redis-server --port "$redis_port" --cluster-port "${ports[1]}" \
    --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "$work/redis/nodes.conf" \
    --save "" --appendonly no --dir "$work/redis"
  poll 10 "redis-server did not answer on 127.0.0.1:$redis_port within 10 s" _redis_answers
  redis-cli -h 127.0.0.1 -p "$redis_port" cluster addslotsrange 0 16383 >/dev/null ||
    fail "redis-cli cluster addslotsrange 0 16383 failed"
  poll 10 "the Redis Cluster on 127.0.0.1:$redis_port did not reach cluster_state:ok within 10 s" \
    _redis_cluster_ok
}

add_remote_tier() {
  "$py" - "$1" "$2" "$work/remote.key" <<'EOF' ||
import json, os, secrets, sys
config, seed, key = sys.argv[1:4]
if not os.path.exists(key):
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (secrets.token_hex(32) + "\n").encode())
    os.close(fd)
c = json.load(open(config))
c["remote_tier"] = {"seeds": [seed], "key_file": key}
json.dump(c, open(config, "w"), indent=2)
EOF
    fail "cannot turn the remote tier on in $1"
}

gen_stubs() {
  mkdir -p "$work/gen" || fail "mkdir $work/gen"
  protoc -I "$root/proto" --python_out="$work/gen" kvcache/v1/kvcache.proto ||
    fail "protoc kvcache.proto"
  cat >"$work/gen/cache_rpc.py" <<'EOF' || fail "cannot write $work/gen/cache_rpc.py"
import ctypes
import grpc
from kvcache.v1 import kvcache_pb2 as pb

def _xxh3():
    for name in ("libxxhash.so.0", "libxxhash.so"):
        try:
            fn = ctypes.CDLL(name).XXH3_64bits
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]
        return fn
    raise RuntimeError("libxxhash is missing (apt-get install libxxhash0, or run "
                       "deploy/setup-debian.sh): appends cannot carry block_checksums")

def block_checksums(kv, block_bytes):
    """XXH3-64 of each whole block of kv: AppendHeader.block_checksums, which kvcached
    requires by default (security.require_block_checksums)."""
    fn = _xxh3()
    return [fn(bytes(kv[o:o + block_bytes]), block_bytes)
            for o in range(0, len(kv) - block_bytes + 1, block_bytes)]

def connect(target):
    """Returns call(kind, name, response_type): a stub for /kvcache.v1.Cache/name."""
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=10)
    ser = lambda m: m.SerializeToString()
    def call(kind, name, resp):
        return getattr(channel, kind)(f"/kvcache.v1.Cache/{name}", request_serializer=ser,
                                      response_deserializer=resp.FromString)
    return call

def register_model(call, ns, model, num_layers, num_kv_heads, head_dim):
    """RegisterModel with an fp16 layout of 16-token blocks; returns the response."""
    layout = pb.ModelLayout(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                            dtype=pb.DTYPE_FP16, block_tokens=16)
    return call("unary_unary", "RegisterModel", pb.RegisterModelResponse)(
        pb.RegisterModelRequest(namespace=ns, model_id=model, layout=layout), timeout=10)
EOF
}
