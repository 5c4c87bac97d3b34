#!/usr/bin/env bash
# llama_cpp_e2e.sh: the llama.cpp cache (kvcache.llama_cpp) end to end, in one command.
#
# Starts its own kvcached on a temporary Unix socket (shared memory on), then runs
# llama-cpp-python 0.3.36 on SmolLM2-135M-Instruct (GGUF Q4_1) in separate processes, prompts
# sharing a ~2K-token prefix, one at a time, greedy, each timed prompt in a fresh context:
#   recompute     no cache: A's and B's questions computed from scratch (the reference outputs)
#   local         the Llama's own context reuse (prefix computed once in-process): upper bound
#   disk-A/B      llama-cpp-python's LlamaDiskCache: A computes and pickles states, a fresh B
#                 loads the longest-prefix state for its own (different) questions
#   kvcache-A/B   kvcache.llama_cpp: A computes and stores blocks in kvcached, a fresh B loads
#                 the shared prefix for its own questions
#   kvcache-down  kvcache.llama_cpp pointed at a socket no daemon serves: every prompt a miss,
#                 nothing raised into llama.cpp, the same outputs
# after the cache's tests against the engine and the daemon (test_llama_cpp_cache.py),
# and prints a table of TTFT medians and whether every output equals the recompute run's;
# exits 1 if one does not, if kvcache-B loaded nothing or kvcache-down loaded anything.
#
# Usage: tests/engines/llama_cpp_e2e.sh [--build BUILD_DIR] [--prompts N] [--prefix-tokens N]
#                                       [--out DIR] [--no-setup] [--help]
#   --build      the C++ build with kvcached and kvcache_client (default ./build)
#   --prompts    questions per process, at most 4 (default 4)
#   --no-setup   skip tests/engines/setup-llama-cpp.sh (run it once before)
#   --out        where the JSON results and logs go (default: a new temporary folder)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/build"
prompts=4
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
    *) echo "llama_cpp_e2e: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
home=${KVCACHE_LLAMA_CPP_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/kvcache/llama-cpp}
if [ "$setup" = 1 ]; then
  "$root/tests/engines/setup-llama-cpp.sh" --build "$build" || exit 1
fi
py="$home/venv/bin/python"
model="$home/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -x "$py" ] && [ -f "$model" ] || { echo "llama_cpp_e2e: run tests/engines/setup-llama-cpp.sh first" >&2; exit 1; }

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/kvcache-llama-cpp-e2e-XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)
sockdir=$(mktemp -d "${TMPDIR:-/tmp}/kvcached-XXXXXX")  # short path: unix sockets cap at 107 bytes
sock="$sockdir/kvcached.sock"
"$build/server/kvcached" --listen none --unix-socket "$sock" --metrics-address none \
  --capacity-bytes $((2 << 30)) > "$out/kvcached.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$sockdir"' EXIT
for _ in $(seq 200); do [ -S "$sock.shm" ] && break; sleep 0.05; done
[ -S "$sock.shm" ] || { cat "$out/kvcached.log" >&2; echo "llama_cpp_e2e: kvcached did not start" >&2; exit 1; }

echo "llama_cpp_e2e: the cache against the engine and kvcached (test_llama_cpp_cache.py)"
KVCACHED="$build/server/kvcached" LLAMA_MODEL="$model" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q \
  -p no:cacheprovider "$root/tests/engines/test_llama_cpp_cache.py" 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || { echo "llama_cpp_e2e: test_llama_cpp_cache.py failed" >&2; exit 1; }

step() {  # tag mode role [args...]
  local tag=$1 mode=$2 role=$3; shift 3
  echo "llama_cpp_e2e: $tag ($(date +%T), load average $(cut -d' ' -f1-3 /proc/loadavg))"
  (cd "$out" && "$py" "$root/tests/engines/llama_cpp_e2e.py" --mode "$mode" --role "$role" \
     --tag "$tag" --out "$out/$tag.json" --model "$model" --prompts "$prompts" \
     --prefix-tokens "$prefix" "$@" > "$out/$tag.log" 2>&1) \
    || { tail -30 "$out/$tag.log" >&2; echo "llama_cpp_e2e: $tag failed" >&2; exit 1; }
}
step recompute none all
step local local B
step disk-A disk A --cache-dir "$out/disk-cache"
step disk-B disk B --cache-dir "$out/disk-cache"
step kvcache-A kvcache A --target "unix://$sock"
step kvcache-B kvcache B --target "unix://$sock"
step kvcache-down kvcache B --target "unix://$sockdir/nobody.sock"

echo "llama_cpp_e2e: results in $out"
cd "$out"
status=0
"$py" "$root/tests/engines/llama_cpp_e2e.py" --summarize recompute.json local.json disk-A.json \
  disk-B.json kvcache-A.json kvcache-B.json kvcache-down.json || status=1
"$py" - <<'PY' || status=1
import json
b = json.load(open("kvcache-B.json"))
c = b["counters"]
loads = sorted(r["load_s"] * 1e3 for r in b["rows"])
print(f"kvcache-B: {c['hits']} hits, {c['hit_tokens']} tokens from kvcached; "
      f"load median {loads[len(loads) // 2]:.1f} ms; model {b['model_id']}")
a = json.load(open("kvcache-A.json"))
saves = sorted(r["save_s"] * 1e3 for r in a["rows"])
print(f"kvcache-A: {a['counters']['saved_blocks']} blocks stored; save median {saves[len(saves) // 2]:.1f} ms")
down = json.load(open("kvcache-down.json"))["counters"]
print(f"kvcache-down: {down['hits']} hits (must be 0), {down['errors']} daemon errors turned into misses")
raise SystemExit(0 if c["hits"] > 0 and down["hits"] == 0 else 1)
PY
exit $status
