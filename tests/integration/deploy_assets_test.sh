#!/usr/bin/env bash
# Checks the deployment assets in deploy/ against each other and against the
# real daemon:
#   - prometheus.yml and alerts.yml pass `promtool check config/rules`, and the
#     alerts fire as alerts_test.yml expects (`promtool test rules`);
#   - grafana-dashboard.json is valid JSON with the expected variables, and
#     every dashboard expression is valid PromQL;
#   - kvcached.json is accepted by `kvcached --config` (a copy with the sockets
#     moved to free ports / a temp dir and a 64 MiB tier), and every kvcached_*
#     metric, label and label value that the dashboard and alerts use appears in
#     a real scrape, after a small workload through the unix socket makes every
#     metric family carry samples. The copy also has the remote tier on, with a
#     one-node Redis Cluster on a free port (kvcached_remote_* exist only then),
#     and the workload's blocks are written to it and searched there; without
#     redis-server those families are only looked up in the source, and the
#     test says so;
#   - kvcached exits 0 on SIGTERM;
#   - kvcached.service agrees with kvcached.json and passes `systemd-analyze
#     verify` where systemd-analyze works.
# Usage: deploy_assets_test.sh KVCACHED_BINARY REPO_ROOT
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_lib.sh"
setup_test "$@"

need promtool
need curl
need_python
for f in kvcached.json kvcached.service prometheus.yml alerts.yml alerts_test.yml \
  grafana-dashboard.json README.md; do
  [[ -f $deploy/$f ]] || fail "deploy/$f is missing"
done

# --- Prometheus configuration and rules -------------------------------------
check "promtool check config deploy/prometheus.yml (with alerts.yml beside it)"
mkdir "$work/prometheus"
cp "$deploy/prometheus.yml" "$deploy/alerts.yml" "$work/prometheus/"
(cd "$work/prometheus" && promtool check config prometheus.yml) || fail "promtool check config"

check "promtool check rules deploy/alerts.yml"
promtool check rules "$deploy/alerts.yml" || fail "promtool check rules"

check "promtool test rules deploy/alerts_test.yml (each alert fires when, and only when, expected)"
cp "$deploy/alerts_test.yml" "$work/prometheus/"
(cd "$work/prometheus" && promtool test rules alerts_test.yml) || fail "promtool test rules"

# --- JSON files ---------------------------------------------------------------
for f in grafana-dashboard.json kvcached.json; do
  check "deploy/$f is valid JSON ($py -m json.tool)"
  "$py" -m json.tool "$deploy/$f" >/dev/null || fail "deploy/$f is not valid JSON"
done

# Collects every PromQL expression of the dashboard (panel targets and
# template queries) and of alerts.yml, checks the dashboard's variables, and
# writes the dashboard's expressions as recording rules so that promtool can
# parse them.
cat >"$work/exprs.py" <<'EOF'
import json, re, sys

deploy, out_exprs, out_rules = sys.argv[1:4]
dash = json.load(open(f"{deploy}/grafana-dashboard.json"))
problems = []
if not 36 <= dash.get("schemaVersion", 0) <= 40:
    problems.append(f"schemaVersion is {dash.get('schemaVersion')}, expected about 38")
variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
ds = variables.get("datasource")
if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
    problems.append("no `datasource` variable of type datasource for prometheus")
for name in ("namespace", "model"):
    q = variables.get(name, {}).get("query", "")
    q = q.get("query", "") if isinstance(q, dict) else q
    if not q.startswith("label_values("):
        problems.append(f"variable `{name}` is not a label_values() query")

exprs = []  # (where, expr)
for name, v in variables.items():
    if v.get("type") == "query":
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
        if not m:
            problems.append(f"variable `{name}`: cannot parse {q!r}")
        else:
            exprs.append((f"dashboard variable {name}", m.group(1)))

def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))

panels = list(walk(dash.get("panels", [])))
if not panels:
    problems.append("the dashboard has no panels")
for p in panels:
    for t in p.get("targets", []):
        if t.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {p['title']!r}: target does not use ${{datasource}}")
        exprs.append((f"dashboard panel {p['title']!r}", t["expr"]))

try:
    import yaml
    rules = yaml.safe_load(open(f"{deploy}/alerts.yml"))
    for g in rules["groups"]:
        for r in g["rules"]:
            exprs.append((f"alert {r.get('alert', r.get('record'))}", str(r["expr"])))
except ImportError:  # no PyYAML: treat the whole file as one expression
    exprs.append(("alerts.yml (whole file, no PyYAML)", open(f"{deploy}/alerts.yml").read()))

with open(out_exprs, "w") as f:
    json.dump(exprs, f)
with open(out_rules, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (where, e) in enumerate(exprs):
        if not where.startswith("dashboard"):
            continue
        e = e.replace("$__rate_interval", "5m")
        e = re.sub(r"\$\{?(\w+)\}?", ".*", e)
        f.write(f"      - record: dashboard:expr_{i}\n        expr: {json.dumps(e)}\n")
for p in problems:
    print(f"grafana-dashboard.json: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
check "dashboard has schemaVersion ~38, \${datasource}, namespace/model label_values variables"
"$py" "$work/exprs.py" "$deploy" "$work/exprs.json" "$work/dashboard_rules.yml" ||
  fail "grafana-dashboard.json"
check "every dashboard expression is valid PromQL (promtool check rules on them as recording rules)"
promtool check rules "$work/dashboard_rules.yml" >/dev/null ||
  { promtool check rules "$work/dashboard_rules.yml" || true; fail "dashboard PromQL"; }

# --- Cross-checks between the assets -------------------------------------------
cat >"$work/cross.py" <<'EOF'
import json, re, sys

deploy = sys.argv[1]
config = json.load(open(f"{deploy}/kvcached.json"))
unit = {}
for line in open(f"{deploy}/kvcached.service"):
    line = line.strip()
    if line and not line.startswith(("#", "[")):
        key, _, value = line.partition("=")
        unit.setdefault(key, []).append(value)
problems = []

def want(key, value):
    if value not in unit.get(key, []):
        problems.append(f"kvcached.service: expected {key}={value}, found {unit.get(key)}")

for key, value in [("Type", "simple"), ("User", "kvcached"), ("RuntimeDirectory", "kvcached"),
                   ("ExecStart", "/usr/local/bin/kvcached --config /etc/kvcached/kvcached.json"),
                   ("KillSignal", "SIGTERM"), ("LimitMEMLOCK", "infinity"),
                   ("Restart", "on-failure"), ("NoNewPrivileges", "yes"),
                   ("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                   ("ReadWritePaths", "/run/kvcached")]:
    want(key, value)
drain = config.get("drain_timeout_seconds", 10)
stop = unit.get("TimeoutStopSec", ["0"])[-1]
if not stop.isdigit() or int(stop) <= drain:
    problems.append(f"kvcached.service: TimeoutStopSec={stop} must exceed drain_timeout_seconds={drain}")
nofile = unit.get("LimitNOFILE", ["0"])[-1]
if nofile != "infinity" and int(nofile) < 65536:
    problems.append(f"kvcached.service: LimitNOFILE={nofile} is not high")
calibration = config.get("importance", {}).get("calibration_file", "")
if calibration and not calibration.startswith("/var/lib/kvcached/"):
    problems.append(f"kvcached.json: calibration_file {calibration} is not in StateDirectory")
checkpoints = config.get("checkpoint", {}).get("dir", "")
if checkpoints and not checkpoints.startswith("/var/lib/kvcached/"):
    problems.append(f"kvcached.json: checkpoint.dir {checkpoints} is not in StateDirectory")
if calibration or checkpoints:
    want("StateDirectory", "kvcached")
    want("ReadWritePaths", "/var/lib/kvcached")
sock = config["listen"]["unix_socket"]
if not sock.startswith("/run/kvcached/"):
    problems.append(f"kvcached.json: unix_socket {sock} is not in RuntimeDirectory /run/kvcached")
port = config["listen"]["metrics_address"].rsplit(":", 1)[1]
prom = open(f"{deploy}/prometheus.yml").read()
if f"localhost:{port}" not in prom:
    problems.append(f"prometheus.yml does not scrape localhost:{port} (metrics_address)")
if not re.search(r"job_name:\s*kvcached\b", prom):
    problems.append("prometheus.yml has no job `kvcached`")
print(f"  unit: TimeoutStopSec={stop} > drain_timeout_seconds={drain}; socket {sock}; "
      f"scrape target localhost:{port}")
for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
check "kvcached.service, kvcached.json and prometheus.yml agree"
"$py" "$work/cross.py" "$deploy" || fail "the assets disagree"

# --- The real daemon with the example config ---------------------------------
free_ports 2
tcp_port=${ports[0]} metrics_port=${ports[1]}
write_deploy_config "$work/kvcached.json" "$tcp_port" "$metrics_port"
# The remote tier's metrics exist only with it on: a one-node Redis Cluster for it.
remote=0 remote_note=""
if has_redis; then
  start_redis_cluster
  check "a one-node Redis Cluster on 127.0.0.1:$redis_port (cluster_state:ok) for the remote tier"
  add_remote_tier "$work/kvcached.json" "127.0.0.1:$redis_port"
  remote=1 remote_note=", the remote tier on it"
else
  echo "skip: the remote tier's metrics (kvcached_remote_*) in a real scrape: redis-server is not" \
    "installed (deploy/setup-debian.sh installs it); they are looked up in" \
    "server/remote/remote_sharing.cc instead"
fi
check "kvcached accepts a copy of deploy/kvcached.json (TCP :$tcp_port, metrics :$metrics_port," \
  "socket in a temp dir, 64 MiB host and SSD tiers$remote_note)"
metrics_url=http://127.0.0.1:$metrics_port/metrics
start_kvcached "$work/kvcached.json" "$metrics_url" "$work/kvcached.sock"

# A small workload through the unix socket, so that every family has samples:
# register a model, append two blocks twice (stored, then deduplicated), look
# up 48 tokens (32 hit, 16 miss), fetch, and look up an unknown model.
exercised=0
if command -v protoc >/dev/null && has_python_grpc; then
  gen_stubs
  check "a workload over unix:$work/kvcached.sock (RegisterModel, Append x2, Lookup, Fetch, NOT_FOUND)"
  "$py" - "$work/gen" "unix:$work/kvcached.sock" <<'EOF' || fail "the workload failed"
import sys
sys.path.insert(0, sys.argv[1])
from cache_rpc import block_checksums, grpc, pb, connect, register_model

call = connect(sys.argv[2])
ns, model = "deploy-test", "tiny"
reg = register_model(call, ns, model, num_layers=1, num_kv_heads=1, head_dim=8)
assert reg.block_bytes == 512, reg
tokens = list(range(32))
def append():
    kv = bytes(range(256)) * 4
    header = pb.AppendHeader(namespace=ns, model_id=model, tokens=tokens, start_token=0,
                             block_checksums=block_checksums(kv, reg.block_bytes))
    requests = [pb.AppendRequest(header=header), pb.AppendRequest(kv_chunk=kv)]
    return call("stream_unary", "Append", pb.AppendResponse)(iter(requests), timeout=10)
first, second = append(), append()
assert first.stored_blocks == 2 and second.deduplicated_blocks == 2, (first, second)
found = call("unary_unary", "Lookup", pb.LookupResponse)(
    pb.LookupRequest(namespace=ns, model_id=model, tokens=list(range(48))), timeout=10)
assert found.matched_tokens == 32, found
chunks = call("unary_stream", "Fetch", pb.FetchResponse)(
    pb.FetchRequest(namespace=ns, model_id=model, tokens=tokens), timeout=10)
assert sum(len(c.data) for c in chunks) == 1024
try:
    call("unary_unary", "Lookup", pb.LookupResponse)(
        pb.LookupRequest(namespace=ns, model_id="unknown", tokens=tokens), timeout=10)
    raise AssertionError("Lookup of an unknown model succeeded")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.NOT_FOUND, e
print("  workload: 2 blocks stored, 2 deduplicated, 32 of 48 tokens hit, 1024 bytes fetched")
EOF
  exercised=1
else
  echo "skip: workload (needs protoc and $py with grpc and protobuf); metric names missing" \
    "from the scrape will be looked up in server/metrics/metrics.cc instead"
fi

# The remote tier writes and searches on threads of its own: wait until the workload's two
# blocks are written to Redis and its short lookup has searched there (and found nothing).
remote_worked() {
  curl -fsS "$metrics_url" >"$work/scrape.txt" 2>/dev/null &&
    grep -Eq '^kvcached_remote_writes_total\{[^}]*outcome="done"[^}]*\} ([2-9]|[1-9][0-9]+)$' \
      "$work/scrape.txt" &&
    grep -Eq '^kvcached_remote_discoveries_total\{[^}]*outcome="searched"[^}]*\} [1-9]' \
      "$work/scrape.txt" &&
    grep -Eq '^kvcached_remote_reads_total\{[^}]*outcome="absent"[^}]*\} [1-9]' "$work/scrape.txt"
}
if ((remote && exercised)); then
  check "the remote tier wrote the workload's 2 blocks to Redis and searched it for the third"
  poll 10 "kvcached_remote_* did not show the writes and the search within 10 s" remote_worked
  echo "  $(redis-cli -h 127.0.0.1 -p "$redis_port" dbsize) keys in Redis"
fi

check "scrape $metrics_url"
curl -fsS "$metrics_url" >"$work/scrape.txt" || fail "curl $metrics_url"
grep -q '^kvcached_tier_capacity_bytes{tier="host"} 67108864$' "$work/scrape.txt" ||
  fail "the scrape does not show the 64 MiB host tier the config asked for"

cat >"$work/names.py" <<'EOF'
import json, re, sys

exprs_path, scrape_path, source_path, remote_source_path, exercised, remote = sys.argv[1:7]
exercised = exercised == "1"
remote = remote == "1"
exprs = json.load(open(exprs_path))
types, samples = {}, {}  # family -> type; metric name -> [labels]
for line in open(scrape_path):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        types[m.group(1)] = m.group(2)
        continue
    m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ", line)
    if m and not line.startswith("#"):
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        samples.setdefault(m.group(1), []).append(labels)
source = open(source_path).read()
remote_source = open(remote_source_path).read()

def skipped_remote(name):
    """A kvcached_remote_* name while the remote tier is off (no redis-server)."""
    return name.startswith("kvcached_remote_") and not remote

def family(name):
    """The scraped family a name in an expression belongs to, or None."""
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            return base
    return None

problems, names = [], {}
for where, expr in exprs:
    for name in re.findall(r"\b(kvcached_\w+)", expr):
        names.setdefault(name, set()).add(where)
    # name{label op "value", ...}: each label (and each exact value) must occur.
    for name, body in re.findall(r"\b(kvcached_\w+)\{([^}]*)\}", expr):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            if label in ("instance", "job") or not exercised or skipped_remote(name):
                continue  # added by Prometheus; or no samples to look at
            seen = samples.get(name, [])
            if not any(label in s for s in seen):
                problems.append(f"{where}: {name} has no label `{label}` in the scrape")
            elif op == "=" and "$" not in value and not any(s.get(label) == value for s in seen):
                problems.append(f"{where}: no {name} sample has {label}=\"{value}\"")

def has_samples(fam):
    return any(n in (fam, fam + "_bucket", fam + "_sum", fam + "_count") for n in samples)

for name in sorted(names):
    fam = family(name)
    suffix = f" (histogram {fam})" if fam and fam != name else ""
    if fam is None and skipped_remote(name):
        if f'"{name}"' in remote_source:
            how = "SKIPPED in the scrape (no redis-server): in server/remote/remote_sharing.cc"
        else:
            how = "MISSING"
            problems.append(f"{name} (used by {', '.join(sorted(names[name]))}) is not exported")
    elif fam is None:
        if not exercised and f'"{re.sub(r"_(bucket|sum|count)$", "", name)}"' in source:
            how = "in server/metrics/metrics.cc (not in the scrape: no workload ran)"
        else:
            how = "MISSING"
            problems.append(f"{name} (used by {', '.join(sorted(names[name]))}) is not exported")
    elif has_samples(fam):
        how = "in the scrape, with samples" + suffix
    elif exercised:
        how = "in the scrape, NO samples" + suffix
        problems.append(f"{name}: declared but has no samples after the workload")
    else:
        how = "in the scrape (# TYPE line)" + suffix
    print(f"  {name}: {how}")
if exercised:
    def value(name, **labels):
        for line in open(scrape_path):
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None
    model = {"namespace": "deploy-test", "model": "tiny"}
    for name, want in [("kvcached_model_blocks", 2), ("kvcached_lookup_hit_tokens_total", 32),
                       ("kvcached_lookup_miss_tokens_total", 16),
                       ("kvcached_deduplicated_blocks_total", 2)]:
        got = value(name, **model)
        if got != want:
            problems.append(f"{name}{{deploy-test/tiny}} is {got}, expected {want}")
    print("  workload visible: model blocks 2, hit tokens 32, miss tokens 16, deduplicated 2")
for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
print(f"  {len(names)} metric names from {len(exprs)} expressions checked")
sys.exit(1 if problems else 0)
EOF
check "every kvcached_* metric (and matched label) in the dashboard and alerts is exported"
"$py" "$work/names.py" "$work/exprs.json" "$work/scrape.txt" "$root/server/metrics/metrics.cc" \
  "$root/server/remote/remote_sharing.cc" "$exercised" "$remote" || fail "metric names"

check "SIGTERM stops kvcached with exit status 0"
stop_kvcached

# --- systemd unit ----------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null; then
  echo "skip: systemd-analyze verify (systemd-analyze is not installed)"
else
  mkdir "$work/units"
  printf '[Unit]\nDescription=probe\n[Service]\nType=simple\nExecStart=/bin/true\n' \
    >"$work/units/probe.service"
  if ! probe=$(systemd-analyze verify "$work/units/probe.service" 2>&1) || [[ -n $probe ]]; then
    echo "skip: systemd-analyze verify (it does not work here: a trivial unit gives: ${probe:-an error})"
  else
    # verify insists that ExecStart's binary exists; point it at the one under test.
    sed "s#^ExecStart=/usr/local/bin/kvcached #ExecStart=$kvcached #" "$deploy/kvcached.service" \
      >"$work/units/kvcached.service"
    check "systemd-analyze verify deploy/kvcached.service (ExecStart binary replaced by $kvcached)"
    out=$(systemd-analyze verify "$work/units/kvcached.service" 2>&1) ||
      fail "systemd-analyze verify: $out"
    [[ -z $out ]] || fail "systemd-analyze verify warns: $out"
  fi
fi

echo "PASS: deploy assets"
