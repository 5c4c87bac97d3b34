#!/usr/bin/env bash
# A real Prometheus scrapes a real kvcached, and every expression of the
# Grafana dashboard is evaluated against what it stored:
#   - kvcached runs with a copy of deploy/kvcached.json (free ports, sockets,
#     checkpoints and a 64 MiB SSD tier in a temp dir, a 64 MiB host tier),
#     with the remote tier on over a one-node Redis Cluster, so that the
#     dashboard's remote-tier panels have series (without redis-server they
#     may be empty, and the test says so);
#   - Debian's `prometheus` scrapes its metrics address every second, with
#     deploy/alerts.yml loaded as its rules;
#   - a workload over gRPC (Debian's python3-grpcio, stubs generated from the
#     .proto) runs while Prometheus takes several scrapes: appends (stored and
#     deduplicated), lookups that hit and miss, fetches, an error;
#   - through Prometheus's HTTP API, every panel expression of
#     deploy/grafana-dashboard.json (template variables set to this instance,
#     namespace and model; $__rate_interval to 10s) returns status success and
#     a non-empty result, every template variable query finds this test's
#     value, every metric name the dashboard uses is among Prometheus's
#     __name__ values, and every alerting rule evaluates with health ok.
# Every wait is bounded; everything started is killed on exit.
# Usage: prometheus_scrape_test.sh KVCACHED_BINARY REPO_ROOT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_lib.sh"
setup_test "$@"
fail_logs+=(prometheus.log workload.log)

need prometheus
need curl
need protoc
need_python_grpc

free_ports 3
tcp_port=${ports[0]} metrics_port=${ports[1]} prometheus_port=${ports[2]}
instance=127.0.0.1:$metrics_port
ns=prom-test
model=tiny

# --- kvcached -------------------------------------------------------------------
write_deploy_config "$work/kvcached.json" "$tcp_port" "$metrics_port" --no-calibration
remote=0
if has_redis; then
  start_redis_cluster
  check "a one-node Redis Cluster on 127.0.0.1:$redis_port for the remote tier"
  add_remote_tier "$work/kvcached.json" "127.0.0.1:$redis_port"
  remote=1
else
  echo "skip: the dashboard's remote-tier panels may be empty: redis-server is not installed" \
    "(deploy/setup-debian.sh installs it), so the remote tier is off"
fi
check "kvcached (TCP :$tcp_port, metrics $instance, 64 MiB host and SSD tiers)"
start_kvcached "$work/kvcached.json" "http://$instance/metrics"

# --- Prometheus -------------------------------------------------------------------
mkdir "$work/prometheus"
cp "$deploy/alerts.yml" "$work/prometheus/alerts.yml"
cat >"$work/prometheus/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: kvcached
    scrape_interval: 1s
    scrape_timeout: 900ms
    metrics_path: /metrics
    static_configs:
      - targets: ["$instance"]
YAML
prometheus_url=http://127.0.0.1:$prometheus_port
check "prometheus at $prometheus_url scraping $instance every 1 s"
spawn "$work/prometheus.log" prometheus --config.file="$work/prometheus/prometheus.yml" \
  --storage.tsdb.path="$work/tsdb" --web.listen-address="127.0.0.1:$prometheus_port" \
  --log.level=warn
prometheus_pid=$!
prometheus_ready() {
  running "$prometheus_pid" "prometheus exited at start-up" &&
    curl -fsS -o /dev/null "$prometheus_url/-/ready" 2>/dev/null
}
poll 30 "prometheus was not ready within 30 s" prometheus_ready

# --- Workload -----------------------------------------------------------------------
gen_stubs
cat >"$work/workload.py" <<'PY'
import os, sys, time
sys.path.insert(0, sys.argv[1])
from cache_rpc import block_checksums, grpc, pb, connect, register_model

target, ns, model, stop_file = sys.argv[2:6]
call = connect(target)
append = call("stream_unary", "Append", pb.AppendResponse)
lookup = call("unary_unary", "Lookup", pb.LookupResponse)
fetch = call("unary_stream", "Fetch", pb.FetchResponse)
assert register_model(call, ns, model, num_layers=1, num_kv_heads=1,
                      head_dim=8).block_bytes == 512
deadline = time.monotonic() + 120  # bounded even if nobody stops it
round = 0
while not os.path.exists(stop_file) and time.monotonic() < deadline:
    # Two new blocks a round (a new first token), appended twice: stored, then deduplicated.
    tokens = [100000 + round] + list(range(31))
    for _ in range(2):
        kv = bytes([round % 256]) * 1024
        header = pb.AppendHeader(namespace=ns, model_id=model, tokens=tokens, start_token=0,
                                 block_checksums=block_checksums(kv, 512))
        append(iter([pb.AppendRequest(header=header), pb.AppendRequest(kv_chunk=kv)]), timeout=10)
    found = lookup(pb.LookupRequest(namespace=ns, model_id=model, tokens=tokens + list(range(16))),
                   timeout=10)
    assert found.matched_tokens == 32, found
    assert sum(len(c.data) for c in fetch(
        pb.FetchRequest(namespace=ns, model_id=model, tokens=tokens), timeout=10)) == 1024
    try:
        lookup(pb.LookupRequest(namespace=ns, model_id="unknown", tokens=tokens), timeout=10)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    round += 1
    if round == 1:
        print("first round done", flush=True)
    time.sleep(0.05)
print(f"{round} rounds", flush=True)
PY
check "a workload over TCP 127.0.0.1:$tcp_port (RegisterModel, Append x2, Lookup, Fetch, NOT_FOUND) in a loop"
spawn "$work/workload.log" \
  "$py" "$work/workload.py" "$work/gen" "127.0.0.1:$tcp_port" "$ns" "$model" "$work/stop-workload"
workload_pid=$!
first_round_done() {
  running "$workload_pid" "the workload exited early" &&
    grep -qs "first round done" "$work/workload.log"
}
poll 15 "the workload's first round did not finish within 15 s" first_round_done

# Query EXPR: the JSON answer of an instant query.
query() { curl -fsS --max-time 10 "$prometheus_url/api/v1/query" --data-urlencode "query=$1"; }
check "prometheus holds at least 6 scrapes of the workload (waits at most 40 s)"
for ((i = 0; ; i++)); do
  running "$workload_pid" "the workload exited early"
  n=$(query "count_over_time(kvcached_lookup_hit_tokens_total{namespace=\"$ns\",model=\"$model\"}[20s])" |
    "$py" -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)') ||
    n=0
  ((n >= 6)) && break
  ((i < 80)) || fail "only $n scrapes with samples after 40 s (up: $(query 'up' || true))"
  sleep 0.5
done

# --- The dashboard against Prometheus -------------------------------------------------------
cat >"$work/dashboard.py" <<'PY'
import json, re, sys, urllib.parse, urllib.request

deploy, url, instance, ns, model, remote = sys.argv[1:7]
dash = json.load(open(f"{deploy}/grafana-dashboard.json"))
values = {"instance": instance, "namespace": ns, "model": model, "datasource": "prometheus",
          "__rate_interval": "10s", "__interval": "1s", "__range": "1m"}
# What the workload makes some panels show: each round appends 2 blocks twice
# (2 stored, 2 deduplicated) and looks up 48 tokens of which 32 are cached.
expected_values = {("Token hit ratio", "A"): 32 / 48, ("Dedup ratio", "A"): 0.5}
# Expressions that may legitimately return nothing here, with the reason. With
# the SSD tier on and the workload above, none is expected to.
allowed_empty = {}
# kvcached_remote_* exist only with the remote tier on (remote_tier.seeds).
def remote_skipped(expr):
    return remote != "1" and "kvcached_remote_" in expr

def api(path, **params):
    full = f"{url}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(full, timeout=10) as r:
        return json.load(r)

def substitute(expr):
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"unknown template variable ${name} in {expr!r}")
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)

def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))

problems, names, checked = [], set(), 0
for p in walk(dash.get("panels", [])):
    for t in p.get("targets", []):
        expr = t["expr"]
        names.update(re.findall(r"\b(kvcached_\w+)", expr))
        where = f"panel {p['title']!r} ({t.get('refId', '?')})"
        try:
            q = substitute(expr)
            answer = api("query", query=q)
        except Exception as e:  # HTTP 400 for bad PromQL comes here
            body = e.read().decode() if hasattr(e, "read") else ""
            problems.append(f"{where}: {e} {body}\n    {expr}")
            continue
        checked += 1
        if answer.get("status") != "success":
            problems.append(f"{where}: status {answer.get('status')}: {answer.get('error')}\n    {q}")
        elif not answer["data"]["result"]:
            if expr in allowed_empty:
                print(f"  {where}: empty, allowed: {allowed_empty[expr]}")
            elif remote_skipped(expr):
                print(f"  {where}: empty, SKIPPED: the remote tier is off (no redis-server)")
            else:
                problems.append(f"{where}: empty result\n    {q}")
        else:
            result = answer["data"]["result"]
            print(f"  {where}: {len(result)} series")
            want = expected_values.get((p["title"], t.get("refId")))
            if want is not None:
                got = float(result[0]["value"][1])
                if not abs(got - want) < 0.02:
                    problems.append(f"{where}: {got}, expected {want:.3f} from the workload\n    {q}")
                else:
                    print(f"    = {got:.3f} (the workload's {want:.3f})")

# Template variables: label_values(EXPR, LABEL) must offer this test's value.
for v in dash.get("templating", {}).get("list", []):
    if v.get("type") != "query":
        continue
    q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
    if not m:
        problems.append(f"variable {v['name']}: cannot parse {q!r}")
        continue
    names.update(re.findall(r"\b(kvcached_\w+)", q))
    series = api("series", **{"match[]": substitute(m.group(1))})["data"]
    offered = sorted({s.get(m.group(2), "") for s in series})
    want = values[v["name"]]
    if want not in offered:
        problems.append(f"variable {v['name']}: {q} offers {offered}, not {want!r}")
    else:
        print(f"  variable {v['name']}: offers {offered}")

known = set(api("label/__name__/values")["data"])
for name in sorted(names - known):
    if remote_skipped(name):
        print(f"  metric {name}: SKIPPED, the remote tier is off (no redis-server)")
        continue
    problems.append(f"metric {name} (used by the dashboard) is not among Prometheus's __name__ values")
print(f"  {checked} panel expressions evaluated, {len(names)} metric names checked")

# The alert rules Prometheus loaded from deploy/alerts.yml evaluate without error.
rules = [r for g in api("rules")["data"]["groups"] for r in g["rules"]]
if not rules:
    problems.append("prometheus loaded no rules from alerts.yml")
for r in rules:
    if r.get("health") != "ok":
        problems.append(f"rule {r['name']}: health {r.get('health')}: {r.get('lastError')}")
print(f"  {len(rules)} rules from alerts.yml loaded, health ok")
for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
check "every dashboard expression evaluates to a non-empty result; variables and names resolve"
# Rules are evaluated every second: wait for a first evaluation of each.
sleep 2
"$py" "$work/dashboard.py" "$deploy" "$prometheus_url" "$instance" "$ns" "$model" "$remote" ||
  fail "the dashboard against Prometheus"

touch "$work/stop-workload"
poll 10 "the workload did not stop within 10 s" exited "$workload_pid"
wait "$workload_pid" || fail "the workload failed"
forget "$workload_pid"
echo "  workload: $(tail -n 1 "$work/workload.log")"
echo "PASS: prometheus scrape"
