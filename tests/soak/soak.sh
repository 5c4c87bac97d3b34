#!/usr/bin/env bash
# The operator's soak: one kvcached with a host tier over an SSD tier and
# checkpoints on, shared-memory workers and gRPC workers at once (kvcache-bench
# mixed: appends, lookups and fetches, every fetched byte checked against the
# pattern it was appended with), the daemon's memory sampled every second.
# Prints a report and exits non-zero when a promise is broken:
#   - a worker saw an error or a wrong byte, or a load generator failed;
#   - the daemon died, or did not stop cleanly on SIGTERM (final checkpoint);
#   - the SSD tier ended less than half used, or refused 1% or more of the
#     demotions it was offered (docs/checkpoints.md, retention and the SSD tier);
#   - the daemon's memory peaked above 1.1 x host capacity + 64 MiB
#     (docs/operations.md, "Memory"), measured as VmRSS minus RssShmem: the
#     workers' shared-memory regions the daemon maps belong to the workers;
#   - with --check-fairness: a path's per-worker throughput fell below half
#     of the other's, or its fetch p99 rose above 3x the other's.
#
# Usage: tests/soak/soak.sh [options]
#   --build DIR            build folder with server/kvcached and
#                          tests/bench/kvcache-bench (default: build)
#   --duration SECONDS     load duration (default 600)
#   --workers N            workers in all, split evenly: N/2 on shared memory,
#                          N/2 on gRPC over TCP (default 64)
#   --capacity-mib M       host tier (default 256)
#   --ssd-mib M            SSD tier (default 512)
#   --checkpoint-every S   seconds between checkpoints (default 60)
#   --data-path-concurrency N
#                          limits.data_path_concurrency (default: the daemon's)
#   --check-fairness       also fail on the fairness rule above
#   --report FILE          also write the report (markdown) to FILE
#   --keep DIR             keep the daemon's log, the generators' output and
#                          the memory samples in DIR
# CI runs `--duration 60 --workers 16 --checkpoint-every 20` (tests/CMakeLists.txt:
# soak_test);
# docs/benchmarks.md has the 10-minute figures.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

build=$repo/build duration=600 workers=64 capacity_mib=256 ssd_mib=512
checkpoint_every=60 check_fairness=0 report="" keep="" slots=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --capacity-mib) capacity_mib=$2; shift 2 ;;
    --ssd-mib) ssd_mib=$2; shift 2 ;;
    --checkpoint-every) checkpoint_every=$2; shift 2 ;;
    --data-path-concurrency) slots=$2; shift 2 ;;
    --check-fairness) check_fairness=1; shift ;;
    --report) report=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "soak.sh: unknown option $1" >&2; usage ;;
  esac
done
for n in "$duration" "$workers" "$capacity_mib" "$ssd_mib" "$checkpoint_every"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: '$n' is not a positive integer" >&2; exit 2; }
done
((workers >= 2 && workers % 2 == 0)) || { echo "soak.sh: --workers must be even, >= 2" >&2; exit 2; }
bench=$(realpath "$build/tests/bench/kvcache-bench" 2>/dev/null) ||
  { echo "soak.sh: no $build/tests/bench/kvcache-bench (build it first)" >&2; exit 2; }

# shellcheck source=../integration/shell_lib.sh
source "$repo/tests/integration/shell_lib.sh"
setup_test "$build/server/kvcached" "$repo"
fail_logs=(kvcached.log shm.out grpc.out)
if [[ -n $keep ]]; then
  mkdir -p "$keep" || fail "mkdir $keep"
  trap 'cp "$work"/*.log "$work"/*.out "$work"/*.tsv "$work"/*.md "$keep"/ 2>/dev/null; _cleanup' EXIT
fi
need curl
need_python
free_ports 2
tcp_port=${ports[0]} metrics_port=${ports[1]}
capacity=$((capacity_mib << 20))

"$py" - "$work" "$tcp_port" "$metrics_port" "$capacity" "$((ssd_mib << 20))" \
  "$checkpoint_every" "$slots" >"$work/kvcached.json" <<'EOF' || fail "cannot write the soak's config"
import json, sys
work, tcp, metrics, capacity, ssd, every, slots = sys.argv[1:]
config = {
    "listen": {"tcp_address": f"127.0.0.1:{tcp}", "unix_socket": f"{work}/k.sock",
               "metrics_address": f"127.0.0.1:{metrics}"},
    "host_tier": {"capacity_bytes": capacity},
    "ssd_tier": {"path": f"{work}/ssd.bin", "capacity_bytes": ssd},
    "checkpoint": {"dir": f"{work}/checkpoints", "interval_seconds": int(every)},
}
if int(slots) > 0:
    config["limits"] = {"data_path_concurrency": int(slots)}
print(json.dumps(config, indent=2))
EOF
metrics_url=http://127.0.0.1:$metrics_port/metrics
start_kvcached "$work/kvcached.json" "$metrics_url" "$work/k.sock"

# The daemon's memory, once a second: VmRSS, RssAnon, RssFile, RssShmem (KiB).
sample_memory() {
  echo -e "seconds\tvm_rss_kib\trss_anon_kib\trss_file_kib\trss_shmem_kib"
  local t=0
  while [[ -r /proc/$daemon_pid/status ]]; do
    awk -v t="$t" '/^VmRSS|^RssAnon|^RssFile|^RssShmem/ { v[$1] = $2 }
      END { printf "%d\t%d\t%d\t%d\t%d\n", t, v["VmRSS:"], v["RssAnon:"], v["RssFile:"], v["RssShmem:"] }' \
      "/proc/$daemon_pid/status" 2>/dev/null || break
    sleep 1
    t=$((t + 1))
  done
}
spawn "$work/memory.tsv" sample_memory
sampler_pid=$!

layout=(--model soak --layers 8 --kv-heads 4 --head-dim 64 --block-tokens 16
  --blocks-per-seq 4 --working-set 16 --duration "$duration")
per_path=$((workers / 2))
check "$per_path shared-memory and $per_path gRPC workers for $duration s"
spawn "$work/shm.out" "$bench" mixed --target "unix://$work/k.sock" --transport shm \
  --clients "$per_path" "${layout[@]}"
shm_pid=$!
spawn "$work/grpc.out" "$bench" mixed --target "127.0.0.1:$tcp_port" --transport grpc \
  --clients "$per_path" "${layout[@]}"
grpc_pid=$!
shm_status=0 grpc_status=0
wait "$shm_pid" || shm_status=$?
wait "$grpc_pid" || grpc_status=$?
forget "$shm_pid"
forget "$grpc_pid"
running "$daemon_pid" "kvcached died during the soak"
curl -fsS "$metrics_url" >"$work/metrics.txt" || fail "cannot scrape $metrics_url"
check "kvcached stops cleanly, writing its last checkpoint"
stop_kvcached
stop_process "$sampler_pid"
status=0

"$py" - "$work" "$capacity" "$check_fairness" "$shm_status" "$grpc_status" \
  "$per_path" "$duration" "$(uptime)" >"$work/report.md" <<'EOF' || status=$?
import re, sys

work, capacity, check_fairness, shm_status, grpc_status, per_path, duration, load = sys.argv[1:]
capacity, per_path = int(capacity), int(per_path)
failures = []

def bench(path, status):
    text = open(f"{work}/{path}.out").read()
    ops = {}
    for m in re.finditer(r"^(append|lookup|fetch)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)$",
                         text, re.M):
        ops[m[1]] = dict(count=int(m[2]), rate=float(m[3]), gbps=float(m[4]), p50=float(m[5]),
                         p99=float(m[6]), max=float(m[7]), errors=int(m[8]))
    if status != "0":
        failures.append(f"the {path} load generator exited {status}")
    if set(ops) != {"append", "lookup", "fetch"}:
        failures.append(f"the {path} load generator printed no complete table")
    errors = sum(o["errors"] for o in ops.values())
    if errors:
        failures.append(f"{errors} {path} calls failed")
    if "against the pattern: all correct" not in text:
        failures.append(f"{path} workers did not verify every fetched byte as correct")
    return ops

paths = {"shared memory": bench("shm", shm_status), "gRPC": bench("grpc", grpc_status)}

metrics = {}
for line in open(f"{work}/metrics.txt"):
    if line.startswith("kvcached_"):
        name, value = line.rsplit(" ", 1)
        metrics[name] = float(value)
def metric(name):
    return metrics.get(name, 0.0)
ssd_used = metric('kvcached_tier_used_bytes{tier="ssd"}')
ssd_capacity = metric('kvcached_tier_capacity_bytes{tier="ssd"}')
demotions = metric('kvcached_tier_migrations_total{from="host",to="ssd",reason="demote"}')
refused = metric('kvcached_tier_write_failures_total{tier="ssd"}')
offered = demotions + refused
ssd_share = ssd_used / ssd_capacity if ssd_capacity else 0.0
refused_share = refused / offered if offered else 0.0
if ssd_share < 0.5:
    failures.append(f"the SSD tier ended {ssd_share:.1%} used (< 50%)")
if refused_share >= 0.01:
    failures.append(f"the SSD tier refused {refused_share:.2%} of demotions (>= 1%)")

samples = [l.split("\t") for l in open(f"{work}/memory.tsv").read().splitlines()[1:]]
samples = [list(map(int, s)) for s in samples if len(s) == 5]
if not samples:
    failures.append("no memory samples")
    samples = [[0, 0, 0, 0, 0]]
own = [s[1] - s[4] for s in samples]
peak = max(range(len(samples)), key=lambda i: own[i])
mib = lambda kib: kib / 1024
bound_kib = (1.1 * capacity + (64 << 20)) / 1024
if own[peak] > bound_kib:
    failures.append(f"the daemon's memory peaked at {mib(own[peak]):.0f} MiB "
                    f"(> 1.1 x capacity + 64 MiB = {mib(bound_kib):.0f} MiB)")

print(f"# kvcached soak: {duration} s, {per_path} shared-memory + {per_path} gRPC workers\n")
print(f"Host tier {capacity >> 20} MiB, SSD tier {int(ssd_capacity) >> 20} MiB, checkpoints on. "
      f"Load at the end: `{load.strip()}`.\n")
print("| path | workers | appends/s | lookups/s | fetches/s | per worker ops/s | fetch p50 ms | fetch p99 ms | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
per_worker, p99 = {}, {}
for name, ops in paths.items():
    if not ops:
        continue
    total = sum(o["rate"] for o in ops.values())
    per_worker[name] = total / per_path
    p99[name] = ops["fetch"]["p99"]
    print(f"| {name} | {per_path} | {ops['append']['rate']:,.0f} | {ops['lookup']['rate']:,.0f} | "
          f"{ops['fetch']['rate']:,.0f} | {per_worker[name]:,.1f} | {ops['fetch']['p50']:.2f} | "
          f"{ops['fetch']['p99']:.2f} | {sum(o['errors'] for o in ops.values())} |")
if len(per_worker) == 2 and min(per_worker.values()) > 0 and min(p99.values()) > 0:
    throughput_ratio = min(per_worker.values()) / max(per_worker.values())
    p99_ratio = max(p99.values()) / min(p99.values())
    print(f"\nFairness: the slower path's per-worker throughput is {throughput_ratio:.2f}x the "
          f"faster's (rule: >= 0.5); fetch p99 ratio {p99_ratio:.2f}x (rule: <= 3).")
    if check_fairness == "1" and (throughput_ratio < 0.5 or p99_ratio > 3):
        failures.append(f"unfair: throughput ratio {throughput_ratio:.2f}, p99 ratio {p99_ratio:.2f}")
print(f"\nSSD tier: {ssd_share:.1%} used at the end; {demotions:,.0f} demotions, {refused:,.0f} refused "
      f"({refused_share:.2%}).")
s = samples[peak]
print(f"\nDaemon memory at its peak (t={s[0]} s): VmRSS {mib(s[1]):.0f} MiB = anonymous "
      f"{mib(s[2]):.0f} + file {mib(s[3]):.0f} + shared {mib(s[4]):.0f} (the workers' regions); "
      f"its own {mib(own[peak]):.0f} MiB = {own[peak] * 1024 / capacity:.2f}x the host tier "
      f"(bound {mib(bound_kib):.0f} MiB).")
print("\n" + ("FAIL: " + "; ".join(failures) if failures else "PASS: every promise kept"))
sys.exit(1 if failures else 0)
EOF
cat "$work/report.md"
[[ -z $report ]] || cp "$work/report.md" "$report"
exit "$status"
