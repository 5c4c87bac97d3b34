#!/usr/bin/env bash
# Checks deploy/Containerfile and the Kubernetes manifests of deploy/k8s as far as a machine
# with no container registry and no cluster allows:
#   - the Containerfile: its stages (build on Debian 12 through deploy/setup-debian.sh --build,
#     a Release build; runtime on Debian 12), that every file it COPYs exists and is in the
#     build context (.dockerignore), COPY --from names an earlier stage, a numeric non-root
#     USER that the image creates, ENTRYPOINT/CMD/EXPOSE/VOLUME/HEALTHCHECK agreeing with
#     deploy/container/kvcached.json; deploy/container/runtime-packages.sh on the binaries
#     under test names installed, non -dev packages;
#   - every manifest parses as YAML; every object has apiVersion, kind and metadata.name, and
#     (with python3-kubernetes) only fields its kind knows; kustomization.yaml lists every
#     manifest but the Secret template; per kind: selectors match the pods they mean
#     (DaemonSet, Services, ServiceMonitor, every NetworkPolicy and its peers), containers
#     have images, resources, probes and a locked-down securityContext, the daemon's memory
#     limit holds the host tier, its metadata budget and the gRPC quota, every path in the
#     daemon's config lies on a volume, the seeds name the Redis StatefulSet's pods, ports
#     agree across config, containers, Services and policies; the Secret template's key is a
#     placeholder kvcached refuses; every embedded shell script passes `sh -n`; deploy/alerts.yml
#     wrapped as a PrometheusRule as deploy/README.md says;
#   - `kubectl kustomize deploy/k8s` renders (the ConfigMaps generated from the files, their
#     hashed names used by the pods, the image rewritten); `kubectl apply --dry-run=client`
#     is tried with an empty kubeconfig and skipped, saying why, when it needs a server;
#   - the real programs: kvcached started with the image's config (its HEALTHCHECK command
#     exits 0, SIGTERM exits 0); the Redis pod's start script running Debian's redis-server
#     with deploy/k8s/redis.conf and a password (AUTH required, the pod's probe, a restart
#     with another IP in nodes.conf announcing the new one); kvcached started with
#     deploy/k8s/kvcached.json (paths moved into a temp dir, the seeds pointed at that
#     Redis) connecting to it, its probe command exiting 0 while it serves and not after it
#     stopped; and the Secret template's placeholder key stopping kvcached with exit 2.
# Without redis-server the Redis parts are skipped, saying so, and kvcached starts with seeds
# that nothing answers (it must serve anyway).
# Usage: k8s_manifests_test.sh KVCACHED_BINARY REPO_ROOT [KVCACHECTL_BINARY]
#   (kvcachectl defaults to ../client/kvcachectl beside the daemon's directory)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_lib.sh"
kvcachectl_arg=${3:-}
setup_test "${@:1:2}"

need_python
need curl
"$py" -c 'import yaml' 2>/dev/null ||
  fail "$py cannot import yaml (apt-get install python3-yaml; deploy/setup-debian.sh installs it)"
kvcachectl=${kvcachectl_arg:-$(dirname "$kvcached")/../client/kvcachectl}
[[ -x $kvcachectl ]] || fail "kvcachectl not found at $kvcachectl (pass it as the third argument)"
kvcachectl=$(realpath "$kvcachectl")
k8s=$deploy/k8s
for f in Containerfile container/kvcached.json container/runtime-packages.sh k8s/kustomization.yaml \
  k8s/namespace.yaml k8s/daemonset.yaml k8s/service.yaml k8s/servicemonitor.yaml \
  k8s/networkpolicy.yaml k8s/redis-cluster.yaml k8s/redis-cluster-create.yaml \
  k8s/secret-template.yaml k8s/kvcached.json k8s/redis.conf; do
  [[ -f $deploy/$f ]] || fail "deploy/$f is missing"
done
[[ -f $root/.dockerignore ]] || fail ".dockerignore (the image's build context) is missing"

# --- deploy/Containerfile -------------------------------------------------------------------
cat >"$work/containerfile.py" <<'EOF'
import fnmatch, json, os, re, shlex, subprocess, sys

root, out = sys.argv[1:3]
problems = []
def problem(msg):
    problems.append(msg)

# Instructions, continuation lines joined, comments dropped.
lines, cur = [], ""
for raw in open(f"{root}/deploy/Containerfile"):
    s = raw.rstrip("\n")
    if not cur and (not s.strip() or s.lstrip().startswith("#")):
        continue
    if cur and s.lstrip().startswith("#"):
        continue
    if s.endswith("\\"):
        cur += s[:-1] + " "
        continue
    lines.append((cur + s).strip())
    cur = ""
args, stages = {}, []  # stages: [{"name", "base", "ins": [(op, rest)]}]
for line in lines:
    op, _, rest = line.partition(" ")
    op, rest = op.upper(), rest.strip()
    if op == "ARG" and not stages:
        name, _, default = rest.partition("=")
        args[name] = default
    elif op == "FROM":
        m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
        base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda g: args.get(g.group(1) or g.group(2), "?"),
                      m.group(1))
        stages.append({"name": m.group(2), "base": base, "ins": []})
    elif not stages:
        problem(f"{op} before the first FROM")
    else:
        stages[-1]["ins"].append((op, rest))
names = [s["name"] for s in stages]
print("  stages: " + ", ".join(f"{s['name']} FROM {s['base']}" for s in stages))
if names[:1] != ["build"] or names[-1:] != ["runtime"] or len(stages) != 2:
    problem(f"stages are {names}, expected build then runtime")
for s in stages:
    if not re.fullmatch(r"(docker\.io/(library/)?)?debian:12(-slim)?", s["base"]):
        problem(f"stage {s['name']} is FROM {s['base']}, not Debian 12 (bookworm)")
build = stages[0] if stages else {"ins": []}
runtime = stages[-1] if stages else {"ins": []}
def runs(stage):
    return " ".join(rest for op, rest in stage["ins"] if op == "RUN")
if "deploy/setup-debian.sh --build" not in runs(build):
    problem("the build stage does not install its packages with deploy/setup-debian.sh --build")
for want in ("-DCMAKE_BUILD_TYPE=Release", "--target kvcached kvcachectl",
             "-DKVCACHE_BUILD_TESTS=OFF"):
    if want not in runs(build):
        problem(f"the build stage's cmake lacks {want}")
if re.search(r"setup-debian|build-essential|-dev\b", runs(runtime)):
    problem("the runtime stage installs build packages")

# The build context: .dockerignore, Docker's rules (last matching pattern wins; a pattern
# that matches a directory matches what is under it).
patterns = []
for raw in open(f"{root}/.dockerignore"):
    s = raw.strip()
    if s and not s.startswith("#"):
        neg = s.startswith("!")
        p = s[1:] if neg else s
        rx = re.escape(p.strip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        rx = rx.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append((neg, re.compile(rx)))
def in_context(path):
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    included = True
    for neg, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            included = neg
    return included
tracked = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
tracked = tracked.stdout.split() if tracked.returncode == 0 else []
if not tracked:  # not a git checkout: every file under the root
    tracked = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]

copies = []
for stage in stages:
    for op, rest in stage["ins"]:
        if op not in ("COPY", "ADD"):
            continue
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        srcs, dst = paths[:-1], paths[-1]
        src_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        if src_stage is not None:
            earlier = names[: stages.index(stage)]
            if src_stage not in earlier:
                problem(f"COPY --from={src_stage} in stage {stage['name']}: no earlier stage")
            continue
        for src in srcs:
            copies.append((src, dst))
            full = os.path.join(root, src)
            if not os.path.exists(full):
                problem(f"COPY {src}: no such file in the repository")
                continue
            files = [src] if os.path.isfile(full) else [
                t for t in tracked if t.startswith(src.rstrip("/") + "/")]
            if not files:
                problem(f"COPY {src}: no tracked files under it")
            left_out = [f for f in files if not in_context(f)]
            if left_out:
                problem(f"COPY {src}: .dockerignore leaves out {left_out[:3]}")
print(f"  {len(copies)} COPY sources exist and are in the build context")

def ins(stage, op):
    return [rest for o, rest in stage["ins"] if o == op]
user = (ins(runtime, "USER") or [""])[-1]
m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
if not m or int(m.group(1)) == 0:
    problem(f"the runtime stage's USER is {user!r}, not a numeric non-root uid[:gid]")
    uid = None
else:
    uid = int(m.group(1))
    if f"--uid {uid}" not in runs(runtime):
        problem(f"the runtime stage does not create a user with uid {uid}")
def exec_form(op):
    values = ins(runtime, op)
    if not values:
        problem(f"no {op} in the runtime stage")
        return []
    try:
        v = json.loads(values[-1])
        assert isinstance(v, list)
        return v
    except Exception:
        problem(f"{op} is not in exec (JSON) form: {values[-1]}")
        return []
entry, cmd = exec_form("ENTRYPOINT"), exec_form("CMD")
if entry != ["/usr/local/bin/kvcached"]:
    problem(f"ENTRYPOINT is {entry}, expected [\"/usr/local/bin/kvcached\"]")
if "install -D -m 0755 /build/server/kvcached /out/usr/local/bin/kvcached" not in runs(build) or \
        "COPY --from=build /out/usr/local/bin/ /usr/local/bin/" not in \
        "\n".join(f"{op} {rest}" for op, rest in runtime["ins"]):
    problem("the programs are not installed from the build stage's /out/usr/local/bin")
config_dst = dict(copies).get("deploy/container/kvcached.json")
if cmd[:1] != ["--config"] or len(cmd) != 2 or cmd[1] != config_dst:
    problem(f"CMD {cmd} does not pass the config the image COPYs ({config_dst})")
config = json.load(open(f"{root}/deploy/container/kvcached.json"))
listen = config["listen"]
metrics_host, metrics_port = listen["metrics_address"].rsplit(":", 1)
if metrics_host != "0.0.0.0":
    problem(f"the image's metrics_address {listen['metrics_address']} is not reachable from outside")
if not re.match(r"(127\.|localhost:|\[::1\]:|none$)", listen["tcp_address"]):
    problem(f"the image's tcp_address {listen['tcp_address']} is not loopback: it needs TLS and "
            "principals (docs/security.md)")
exposed = " ".join(ins(runtime, "EXPOSE")).split()
if metrics_port not in [e.split("/")[0] for e in exposed]:
    problem(f"EXPOSE {exposed} lacks the metrics port {metrics_port}")
socket = listen["unix_socket"]
volumes = [v for rest in ins(runtime, "VOLUME") for v in json.loads(rest)]
for need in (os.path.dirname(socket), os.path.dirname(config["checkpoint"]["dir"])):
    if need not in volumes:
        problem(f"VOLUME {volumes} lacks {need}")
health = (ins(runtime, "HEALTHCHECK") or [""])[-1]
hm = re.search(r"CMD\s+(\[.*\])", health)
health_cmd = json.loads(hm.group(1)) if hm else []
if not health_cmd or os.path.basename(health_cmd[0]) != "kvcachectl" or \
        f"unix://{socket}" not in health_cmd or health_cmd[-1] != "status":
    problem(f"HEALTHCHECK {health!r} is not `kvcachectl --target unix://{socket} status`")
if (ins(runtime, "STOPSIGNAL") or [""])[-1] != "SIGTERM":
    problem("STOPSIGNAL is not SIGTERM (kvcached drains and checkpoints on SIGTERM)")
json.dump({"uid": uid, "health": health_cmd, "socket": socket,
           "volumes": volumes}, open(out, "w"))
print(f"  USER {user}, ENTRYPOINT {entry} CMD {cmd}, EXPOSE {' '.join(exposed)}, VOLUME {volumes}")
for p in problems:
    print(f"FAIL: deploy/Containerfile: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
check "deploy/Containerfile: stages, base images, COPY sources in the build context, USER, ENTRYPOINT, CMD, EXPOSE, VOLUME, HEALTHCHECK"
"$py" "$work/containerfile.py" "$root" "$work/image.json" || fail "deploy/Containerfile"

check "deploy/container/runtime-packages.sh names the packages of the libraries kvcached and kvcachectl load"
bash -n "$deploy/container/runtime-packages.sh" || fail "runtime-packages.sh: syntax"
bash "$deploy/container/runtime-packages.sh" "$kvcached" "$kvcachectl" >"$work/runtime-packages.txt" ||
  fail "runtime-packages.sh failed"
[[ -s $work/runtime-packages.txt ]] || fail "runtime-packages.sh named no package"
while read -r p; do
  [[ $p != *-dev ]] || fail "runtime-packages.sh names a development package: $p"
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    fail "runtime-packages.sh names $p, which is not an installed package"
done <"$work/runtime-packages.txt"
echo "  $(wc -l <"$work/runtime-packages.txt") packages: $(tr '\n' ' ' <"$work/runtime-packages.txt")"

# --- deploy/k8s: the manifests -----------------------------------------------------------------
cat >"$work/manifests.py" <<'EOF'
import glob, json, os, re, sys
import yaml

root, work = sys.argv[1:3]
k8s = f"{root}/deploy/k8s"
image = json.load(open(f"{work}/image.json"))
problems = []
def problem(msg):
    problems.append(msg)

# Every file parses; every object has apiVersion, kind, metadata.name.
objects = []  # (file, object)
for path in sorted(glob.glob(f"{k8s}/*.yaml")):
    name = os.path.basename(path)
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    except yaml.YAMLError as e:
        problem(f"{name} does not parse as YAML: {e}")
        continue
    for d in docs:
        if not isinstance(d, dict) or not d.get("apiVersion") or not d.get("kind"):
            problem(f"{name}: an object without apiVersion or kind")
            continue
        if d["kind"] != "Kustomization" and not (d.get("metadata") or {}).get("name"):
            problem(f"{name}: {d['kind']} without metadata.name")
            continue
        objects.append((name, d))
print(f"  {len(objects)} objects in {len(glob.glob(f'{k8s}/*.yaml'))} YAML files parse, each "
      "with apiVersion, kind and metadata.name")
def the(kind, name=None):
    found = [o for f, o in objects if o["kind"] == kind and (name is None or
                                                             o["metadata"]["name"] == name)]
    if len(found) != 1:
        problem(f"expected one {kind} {name or ''}, found {len(found)}")
        return {}
    return found[0]

# Field names against the Kubernetes API's own models (python3-kubernetes), where known.
try:
    import kubernetes.client as kc
except ImportError:
    kc = None
    print("  skip: field names against the API's models (python3-kubernetes is not installed)")
if kc:
    def model_for(obj):
        group, _, version = obj["apiVersion"].rpartition("/")
        if group not in ("", "apps", "batch", "policy", "networking.k8s.io"):
            return None
        return getattr(kc, version.capitalize() + obj["kind"], None)
    def walk(value, typ, where):
        if typ.startswith("list["):
            if not isinstance(value, list):
                problem(f"{where}: expected a list")
                return
            for i, v in enumerate(value):
                walk(v, typ[5:-1], f"{where}[{i}]")
        elif typ.startswith("dict("):
            if not isinstance(value, dict):
                problem(f"{where}: expected a map")
                return
            inner = typ[5:-1].split(", ", 1)[1]
            for k, v in value.items():
                walk(v, inner, f"{where}.{k}")
        elif typ == "str":
            if not isinstance(value, str):
                problem(f"{where}: expected a string, found {value!r}")
        elif typ == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                problem(f"{where}: expected an integer, found {value!r}")
        elif typ == "bool":
            if not isinstance(value, bool):
                problem(f"{where}: expected true or false, found {value!r}")
        elif typ in ("object", "float", "datetime", "date"):
            pass
        else:
            cls = getattr(kc, typ, None)
            if cls is None:
                return
            if not isinstance(value, dict):
                problem(f"{where}: expected an object ({typ})")
                return
            fields = {json_name: py for py, json_name in cls.attribute_map.items()}
            for k, v in value.items():
                if k not in fields:
                    problem(f"{where}: {typ} has no field `{k}`")
                else:
                    walk(v, cls.openapi_types[fields[k]], f"{where}.{k}")
    checked = 0
    for f, o in objects:
        cls = model_for(o)
        if cls:
            walk(o, cls.__name__, f"{f}:{o['kind']}/{o['metadata']['name']}")
            checked += 1
    print(f"  {checked} objects' field names and types checked against the API's models "
          "(python3-kubernetes)")

# kustomization.yaml: every manifest but the Secret template; the generated ConfigMaps.
kust = the("Kustomization")
namespace = kust.get("namespace")
resources = kust.get("resources", [])
manifests = sorted(os.path.basename(p) for p in glob.glob(f"{k8s}/*.yaml"))
for m in manifests:
    if m in ("kustomization.yaml", "secret-template.yaml"):
        continue
    if m not in resources:
        problem(f"kustomization.yaml does not list {m}")
if "secret-template.yaml" in resources:
    problem("kustomization.yaml lists secret-template.yaml: its placeholders would replace the "
            "real Secret on every apply")
for r in resources:
    if not os.path.exists(f"{k8s}/{r}"):
        problem(f"kustomization.yaml lists {r}, which does not exist")
generated = {}
for g in kust.get("configMapGenerator", []):
    for fname in g.get("files", []):
        if not os.path.exists(f"{k8s}/{fname}"):
            problem(f"configMapGenerator {g['name']}: no file {fname}")
        generated.setdefault(g["name"], []).append(fname)
for f, o in objects:
    ns = o.get("metadata", {}).get("namespace")
    if o["kind"] not in ("Kustomization", "Namespace") and ns not in (None, namespace):
        problem(f"{f}: {o['kind']}/{o['metadata']['name']} is in namespace {ns}, not {namespace}")
if the("Namespace").get("metadata", {}).get("name") != namespace:
    problem(f"the Namespace is not kustomization.yaml's namespace {namespace}")

# Helpers.
def matches(selector, labels):
    if set(selector) - {"matchLabels"}:
        problem(f"selector {selector}: only matchLabels is checked here")
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
def quantity(q):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?", str(q))
    if not m:
        problem(f"cannot read the quantity {q!r}")
        return 0
    mult = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
            "G": 10**9, "T": 10**12, "m": 10**-3}[m.group(2)]
    return float(m.group(1)) * mult
def mounts_of(container):
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}
def check_container(where, c, init=False, job=False):
    if not c.get("image"):
        problem(f"{where}: no image")
    elif c["image"] != "kvcached" and ":" not in c["image"].rsplit("/", 1)[-1]:
        problem(f"{where}: image {c['image']} has no tag")
    elif c["image"].endswith(":latest"):
        problem(f"{where}: image {c['image']} is not pinned")
    res = c.get("resources", {})
    if not res.get("requests") or not (res.get("limits") or {}).get("memory"):
        problem(f"{where}: resources need requests and a memory limit")
    if not init and not job:
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in c:
                problem(f"{where}: no {probe}")
    sc = c.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False:
        problem(f"{where}: allowPrivilegeEscalation is not false")
    if sc.get("readOnlyRootFilesystem") is not True:
        problem(f"{where}: readOnlyRootFilesystem is not true")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        problem(f"{where}: capabilities do not drop ALL")
    if set(caps.get("add", [])) - ({"CHOWN", "FOWNER"} if init else set()):
        problem(f"{where}: adds capabilities {caps.get('add')}")
def non_root(where, pod, c):
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})
    if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True and
            sc.get("runAsUser", psc.get("runAsUser", 0)) != 0):
        problem(f"{where}: not runAsNonRoot with a non-zero runAsUser")
def volumes_of(pod):
    return {v["name"]: v for v in pod.get("volumes", [])}

# Workloads and their pods' labels.
ds = the("DaemonSet", "kvcached")
sts = the("StatefulSet", "redis-cluster")
job = the("Job", "redis-cluster-create")
workloads = {"DaemonSet/kvcached": ds, "StatefulSet/redis-cluster": sts,
             "Job/redis-cluster-create": job}
pod_labels = {k: w.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
              for k, w in workloads.items()}
for k, w in workloads.items():
    sel = w.get("spec", {}).get("selector")
    if k.startswith("Job"):
        continue
    if not sel or not matches(sel, pod_labels[k]):
        problem(f"{k}: spec.selector {sel} does not match its template's labels {pod_labels[k]}")
scripts = {}  # name -> shell text

# The daemon: config, volumes, probes, resources.
config = json.load(open(f"{k8s}/kvcached.json"))
image_config = json.load(open(f"{root}/deploy/container/kvcached.json"))
drift = sorted(k for k in set(config) | set(image_config)
               if k != "remote_tier" and config.get(k) != image_config.get(k))
if drift or "remote_tier" in image_config:
    problem(f"k8s/kvcached.json is not container/kvcached.json plus remote_tier: {drift} differ")
pod = ds.get("spec", {}).get("template", {}).get("spec", {})
containers = {c["name"]: c for c in pod.get("containers", [])}
inits = {c["name"]: c for c in pod.get("initContainers", [])}
daemon = containers.get("kvcached", {})
if not daemon:
    problem("the DaemonSet has no container `kvcached`")
check_container("DaemonSet kvcached", daemon)
non_root("DaemonSet kvcached", pod, daemon)
for name, c in inits.items():
    check_container(f"DaemonSet init {name}", c, init=True)
    scripts[f"daemonset-init-{name}"] = c.get("command", ["", "", ""])[-1]
volumes = volumes_of(pod)
for c in list(containers.values()) + list(inits.values()):
    for m in c.get("volumeMounts", []):
        if m["name"] not in volumes:
            problem(f"DaemonSet {c['name']}: mounts an undefined volume {m['name']}")
uid = daemon.get("securityContext", {}).get("runAsUser")
if uid != image["uid"]:
    problem(f"the daemon runs as uid {uid}, the image's USER is {image['uid']}")
if "kvcached" not in (daemon.get("image") or ""):
    problem("the DaemonSet's container does not run the kvcached image")
if not any(i.get("name") == "kvcached" for i in kust.get("images", [])):
    problem("kustomization.yaml has no images entry for `kvcached`")
args = daemon.get("args", [])
mounts = mounts_of(daemon)
if len(args) != 2 or args[0] != "--config":
    problem(f"the daemon's args {args} are not --config FILE")
else:
    cfg_dir, cfg_file = os.path.split(args[1])
    vol = volumes.get((mounts.get(cfg_dir) or {}).get("name"), {})
    if (vol.get("configMap") or {}).get("name") not in generated or \
            cfg_file not in generated.get(vol["configMap"]["name"], []):
        problem(f"--config {args[1]} is not kvcached.json from a generated ConfigMap")
def mount_for(path, writable):
    best = max((m for m in mounts if path.startswith(m.rstrip("/") + "/")), key=len, default=None)
    if best is None:
        problem(f"kvcached.json: {path} is on no volume of the daemon (its root is read-only)")
    elif writable and mounts[best].get("readOnly"):
        problem(f"kvcached.json: {path} must be writable but {best} is mounted read-only")
    return best
listen = config["listen"]
socket = listen["unix_socket"]
sock_mount = mount_for(socket, True)
sock_vol = volumes.get((mounts.get(sock_mount) or {}).get("name"), {})
host_dir = (sock_vol.get("hostPath") or {}).get("path")
if host_dir != os.path.dirname(socket) or sock_mount != os.path.dirname(socket):
    problem(f"the socket {socket} is not in a hostPath directory mounted at the same path "
            f"(workers must see the path the daemon reports): hostPath {host_dir}, mount {sock_mount}")
for field in (config["checkpoint"]["dir"], config["importance"]["calibration_file"]):
    mount_for(field, True)
remote = config.get("remote_tier", {})
for field in ("key_file", "password_file"):
    mount_for(remote[field], False)
if not re.match(r"(127\.|localhost:|\[::1\]:|none$)", listen["tcp_address"]):
    problem(f"tcp_address {listen['tcp_address']} is reachable by others: it needs TLS and "
            "principals (docs/security.md)")
metrics_port = int(listen["metrics_address"].rsplit(":", 1)[1])
ports = {p["name"]: p["containerPort"] for p in daemon.get("ports", [])}
if ports.get("metrics") != metrics_port:
    problem(f"the container's port `metrics` is {ports.get('metrics')}, metrics_address says "
            f"{metrics_port}")
limit = quantity(daemon.get("resources", {}).get("limits", {}).get("memory", 0))
request = quantity(daemon.get("resources", {}).get("requests", {}).get("memory", 0))
capacity = int(config["host_tier"]["capacity_bytes"])
metadata = float(config["host_tier"].get("metadata_fraction", 0.125))
quota = int(config["limits"].get("grpc_memory_quota_bytes", 1 << 30))
# The remote tier copies blocks it writes or reads: its queues, at 4 MiB a block.
in_flight = (int(remote.get("write_queue_blocks", 1024)) +
             int(remote.get("max_discover_blocks", 256))) * (4 << 20)
need = capacity * (1 + metadata) + quota + in_flight + (256 << 20)
if limit < need:
    problem(f"the daemon's memory limit {limit / 2**30:.2f} GiB is under host tier + metadata + "
            f"gRPC quota + remote blocks in flight + 256 MiB = {need / 2**30:.2f} GiB")
if request != limit:
    problem("the daemon's memory request differs from its limit")
print(f"  memory limit {limit / 2**30:.1f} GiB >= {need / 2**30:.2f} GiB (host tier "
      f"{capacity / 2**30:.0f} GiB + metadata {metadata} + gRPC quota {quota / 2**30:.0f} GiB "
      f"+ remote blocks in flight {in_flight / 2**30:.2f} GiB + 256 MiB)")
grace = pod.get("terminationGracePeriodSeconds", 30)
if grace <= config.get("drain_timeout_seconds", 10) + 30:
    problem(f"terminationGracePeriodSeconds {grace} leaves no room for the drain and the final "
            "checkpoint")
probe_cmd = None
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    cmd = daemon.get(probe, {}).get("exec", {}).get("command")
    if not cmd or os.path.basename(cmd[0]) != "kvcachectl" or f"unix://{socket}" not in cmd \
            or cmd[-1] != "status":
        problem(f"{probe} is not `kvcachectl --target unix://{socket} status`: {cmd}")
    elif probe_cmd not in (None, cmd):
        problem(f"{probe} runs another command than the other probes")
    else:
        probe_cmd = cmd
strategy = ds.get("spec", {}).get("updateStrategy", {}).get("rollingUpdate", {})
if strategy.get("maxSurge", 0) not in (0, "0", "0%"):
    problem("the DaemonSet may surge: two daemons on one node would share one socket path")

# The Secret: template name and keys as the pods use them; a placeholder key.
secret = the("Secret", "kvcached-remote")
secret_keys = set((secret.get("stringData") or {}).keys()) | set((secret.get("data") or {}).keys())
secret_vol = next((v for v in volumes.values() if "secret" in v), {})
if secret_vol.get("secret", {}).get("secretName") != secret["metadata"]["name"]:
    problem("the DaemonSet's secret volume does not name the Secret of secret-template.yaml")
init_script = "\n".join(scripts.values())
for field in ("key_file", "password_file"):
    base = os.path.basename(remote[field])
    if base not in secret_keys:
        problem(f"remote_tier.{field} {remote[field]}: the Secret has no key {base}")
    if base not in init_script:
        problem(f"the init container does not copy {base} for the daemon")
placeholder = (secret.get("stringData") or {}).get("remote.key", "")
if re.fullmatch(r"[0-9a-fA-F]{64}\n?", placeholder):
    problem("secret-template.yaml holds a real-looking key: commit a placeholder only")
if "openssl rand -hex 32" not in open(f"{k8s}/secret-template.yaml").read():
    problem("secret-template.yaml does not say to make the key with `openssl rand -hex 32`")
open(f"{work}/placeholder.key", "w").write(placeholder)

# The Service, the ServiceMonitor.
svc = the("Service", "kvcached")
if svc.get("metadata", {}).get("name") != "kvcached":
    problem("the metrics Service is not named kvcached (the job deploy/alerts.yml expects)")
if not matches({"matchLabels": svc.get("spec", {}).get("selector", {})}, pod_labels["DaemonSet/kvcached"]):
    problem("Service kvcached's selector does not match the DaemonSet's pods")
svc_ports = {p["name"]: p for p in svc.get("spec", {}).get("ports", [])}
for p in svc_ports.values():
    if p.get("targetPort") not in ports and p.get("targetPort") not in ports.values():
        problem(f"Service kvcached: targetPort {p.get('targetPort')} is no port of the daemon")
sm = the("ServiceMonitor", "kvcached")
if not matches(sm.get("spec", {}).get("selector", {}), svc.get("metadata", {}).get("labels", {})):
    problem("the ServiceMonitor's selector does not match Service kvcached's labels")
for e in sm.get("spec", {}).get("endpoints", []):
    if e.get("port") not in svc_ports:
        problem(f"the ServiceMonitor scrapes port {e.get('port')}, which Service kvcached lacks")

# Redis: the StatefulSet, its Service, redis.conf, the seeds, the Job.
conf = {}
for line in open(f"{k8s}/redis.conf"):
    line = line.strip()
    if line and not line.startswith("#"):
        key, _, value = line.partition(" ")
        conf[key] = value
redis_port, bus_port = int(conf.get("port", 6379)), int(conf.get("cluster-port", 0) or 0)
for key, want in (("cluster-enabled", "yes"), ("appendonly", "no"), ("save", '""'),
                  ("maxmemory-policy", "allkeys-lru")):
    if conf.get(key) != want:
        problem(f"redis.conf: {key} is {conf.get(key)!r}, expected {want}")
if bus_port != redis_port + 10000:
    problem(f"redis.conf: cluster-port {bus_port} is not port + 10000")
sts_spec = sts.get("spec", {})
replicas = sts_spec.get("replicas", 0)
if replicas < 6 or replicas % 2:
    problem(f"the Redis StatefulSet has {replicas} pods: 3 masters with a replica each need 6")
rsvc = the("Service", sts_spec.get("serviceName"))
if rsvc.get("spec", {}).get("clusterIP") != "None" or \
        not rsvc.get("spec", {}).get("publishNotReadyAddresses"):
    problem("the Redis Service is not headless with publishNotReadyAddresses")
if not matches({"matchLabels": rsvc.get("spec", {}).get("selector", {})},
               pod_labels["StatefulSet/redis-cluster"]):
    problem("the Redis Service's selector does not match the StatefulSet's pods")
rpod = sts_spec.get("template", {}).get("spec", {})
redis = rpod.get("containers", [{}])[0]
check_container("StatefulSet redis", redis)
non_root("StatefulSet redis", rpod, redis)
rports = {p["name"]: p["containerPort"] for p in redis.get("ports", [])}
if rports.get("client") != redis_port or rports.get("bus") != bus_port:
    problem(f"the Redis container's ports {rports} are not redis.conf's {redis_port}/{bus_port}")
rvols = volumes_of(rpod)
rmounts = mounts_of(redis)
conf_vol = rvols.get((rmounts.get("/etc/redis") or {}).get("name"), {})
if (conf_vol.get("configMap") or {}).get("name") not in generated or \
        "redis.conf" not in generated.get(conf_vol["configMap"]["name"], []):
    problem("/etc/redis is not the generated ConfigMap of redis.conf")
if conf.get("dir") not in rmounts:
    problem(f"redis.conf's dir {conf.get('dir')} is not a volume")
if quantity(redis.get("resources", {}).get("limits", {}).get("memory", 0)) < \
        quantity(conf.get("maxmemory", "0").replace("gb", "Gi").replace("mb", "Mi")) + (512 << 20):
    problem("the Redis container's memory limit leaves under 512 MiB above maxmemory")
scripts["redis-start"] = redis.get("command", ["", "", ""])[-1]
redis_probe = redis.get("readinessProbe", {}).get("exec", {}).get("command", [])
scripts["redis-probe"] = redis_probe[-1] if redis_probe else ""
env = {e["name"]: e for e in redis.get("env", [])}
for name in ("REDIS_PASSWORD", "REDISCLI_AUTH"):
    ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
    if ref.get("name") != secret["metadata"]["name"] or ref.get("key") not in secret_keys:
        problem(f"the Redis container's {name} is not a key of Secret {secret['metadata']['name']}")
if os.path.basename(remote["password_file"]) != env.get("REDIS_PASSWORD", {}).get(
        "valueFrom", {}).get("secretKeyRef", {}).get("key"):
    problem("the daemon's password_file and Redis's REDIS_PASSWORD are different Secret keys")
seed_rx = re.compile(rf"{re.escape(sts['metadata']['name'])}-(\d+)\."
                     rf"{re.escape(sts_spec.get('serviceName', ''))}\.{re.escape(namespace)}\.svc:(\d+)")
for seed in remote.get("seeds", []):
    m = seed_rx.fullmatch(seed)
    if not m or int(m.group(1)) >= replicas or int(m.group(2)) != redis_port:
        problem(f"the seed {seed} is not one of the StatefulSet's pods "
                f"(redis-cluster-N.{sts_spec.get('serviceName')}.{namespace}.svc:{redis_port})")
if not remote.get("seeds"):
    problem("kvcached.json has no remote_tier.seeds")
jpod = job.get("spec", {}).get("template", {}).get("spec", {})
jc = jpod.get("containers", [{}])[0]
check_container("Job redis-cluster-create", jc, job=True)
non_root("Job redis-cluster-create", jpod, jc)
jscript = jc.get("command", ["", "", ""])[-1]
scripts["redis-cluster-create"] = jscript
if f"nodes={replicas}" not in jscript or "--cluster-replicas 1" not in jscript:
    problem(f"the Job does not create a cluster of the {replicas} pods with one replica each")
if f"{sts['metadata']['name']}-$1.{sts_spec.get('serviceName')}.$NAMESPACE.svc" not in jscript:
    problem("the Job does not address the StatefulSet's pods by name")
if redis.get("image") != jc.get("image"):
    problem("the Job and the StatefulSet run different Redis images")

# NetworkPolicies: each selects pods that exist, its peers exist, its ports are theirs.
container_ports = {
    "DaemonSet/kvcached": set(ports.values()),
    "StatefulSet/redis-cluster": set(rports.values()),
    "Job/redis-cluster-create": set()}
def selected(selector):
    return [k for k, labels in pod_labels.items() if matches(selector, labels)]
policies = {o["metadata"]["name"]: o for f, o in objects if o["kind"] == "NetworkPolicy"}
for name, pol in policies.items():
    spec = pol.get("spec", {})
    targets = selected(spec.get("podSelector", {}))
    if not targets:
        problem(f"NetworkPolicy {name} selects no pods of these manifests")
    if set(spec.get("policyTypes", [])) != {"Ingress", "Egress"}:
        problem(f"NetworkPolicy {name} does not restrict both ingress and egress")
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        for rule in spec.get(direction, []):
            local_peers = []
            for peer in rule.get(peers_key, []):
                if "namespaceSelector" in peer:
                    continue  # Prometheus, DNS: outside these manifests
                found = selected(peer.get("podSelector", {}))
                if not found:
                    problem(f"NetworkPolicy {name}: {direction} peer {peer} matches no pods")
                local_peers += found
            owners = targets if direction == "ingress" else local_peers
            for p in rule.get("ports", []):
                if owners and not any(p["port"] in container_ports[o] for o in owners):
                    problem(f"NetworkPolicy {name}: {direction} port {p['port']} is no port of "
                            f"{owners}")
dpol = policies.get("kvcached", {}).get("spec", {})
if [p["port"] for r in dpol.get("ingress", []) for p in r.get("ports", [])] != [metrics_port]:
    problem("NetworkPolicy kvcached lets in more than the metrics port")
egress_redis = [p["port"] for r in dpol.get("egress", []) for p in r.get("ports", [])
                if any(selected(x.get("podSelector", {})) == ["StatefulSet/redis-cluster"]
                       for x in r.get("to", []))]
if egress_redis != [redis_port]:
    problem(f"NetworkPolicy kvcached lets the daemons reach Redis on {egress_redis}, "
            f"expected only the client port {redis_port}")
rpol = policies.get("redis-cluster", {}).get("spec", {})
for r in rpol.get("ingress", []):
    if any(p["port"] == bus_port for p in r.get("ports", [])):
        if [selected(x.get("podSelector", {})) for x in r.get("from", [])] != \
                [["StatefulSet/redis-cluster"]]:
            problem("NetworkPolicy redis-cluster opens the cluster bus to more than Redis itself")

os.makedirs(f"{work}/scripts", exist_ok=True)
for name, text in scripts.items():
    if not text.strip():
        problem(f"no script found for {name}")
    open(f"{work}/scripts/{name}.sh", "w").write(text)
json.dump({"probe": probe_cmd, "mounts": {m: v["name"] for m, v in mounts.items()},
           "redis_mounts": {m: v["name"] for m, v in rmounts.items()},
           "redis_port": redis_port, "namespace": namespace}, open(f"{work}/k8s.json", "w"))
print(f"  DaemonSet, Services, ServiceMonitor, {len(policies)} NetworkPolicies, StatefulSet "
      f"({replicas} pods), Job, Secret template and kvcached.json agree; seeds "
      f"{', '.join(remote.get('seeds', []))}")
for p in problems:
    print(f"FAIL: deploy/k8s: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
check "deploy/k8s: YAML, objects, field names, kustomization, selectors, containers, volumes, memory, ports, seeds, Secret template, NetworkPolicies"
"$py" "$work/manifests.py" "$root" "$work" || fail "deploy/k8s manifests"

check "every shell script embedded in the manifests passes sh -n"
for s in "$work"/scripts/*.sh; do
  sh -n "$s" || fail "$(basename "$s" .sh): sh -n failed"
done
echo "  $(cd "$work/scripts" && echo *.sh)"
if command -v shellcheck >/dev/null; then
  check "every shell script embedded in the manifests passes shellcheck -s sh"
  shellcheck -s sh "$work"/scripts/*.sh || fail "shellcheck on the embedded scripts"
else
  echo "skip: shellcheck on the embedded scripts (shellcheck is not installed)"
fi

check "deploy/alerts.yml indented under a PrometheusRule's spec (deploy/README.md, section 8) holds its groups"
{
  printf 'apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: kvcached\n  namespace: kvcached\nspec:\n'
  sed 's/^/  /' "$deploy/alerts.yml"
} >"$work/prometheusrule.yaml"
"$py" - "$work/prometheusrule.yaml" "$deploy/alerts.yml" <<'EOF' || fail "the PrometheusRule"
import sys, yaml
rule, alerts = (yaml.safe_load(open(p)) for p in sys.argv[1:3])
assert rule["kind"] == "PrometheusRule" and rule["spec"] == alerts, "spec is not alerts.yml"
print(f"  {sum(len(g['rules']) for g in rule['spec']['groups'])} rules")
EOF

# --- kubectl ---------------------------------------------------------------------------------
if ! command -v kubectl >/dev/null; then
  echo "skip: kubectl kustomize deploy/k8s (kubectl is not installed)"
else
  check "kubectl kustomize deploy/k8s renders; the pods use the generated ConfigMaps; the image is rewritten"
  kubectl kustomize "$k8s" >"$work/rendered.yaml" 2>"$work/kustomize.log" ||
    fail "kubectl kustomize deploy/k8s: $(cat "$work/kustomize.log")"
  "$py" - "$work/rendered.yaml" "$k8s" <<'EOF' || fail "the rendered manifests"
import sys, yaml
rendered, k8s = sys.argv[1:3]
objs = [o for o in yaml.safe_load_all(open(rendered)) if o]
problems = []
kust = yaml.safe_load(open(f"{k8s}/kustomization.yaml"))
by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
maps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ConfigMap"}
for g in kust["configMapGenerator"]:
    names = [n for n in maps if n.startswith(g["name"] + "-")]
    if len(names) != 1:
        problems.append(f"no single generated ConfigMap {g['name']}-HASH: {sorted(maps)}")
        continue
    for f in g["files"]:
        if maps[names[0]]["data"].get(f) != open(f"{k8s}/{f}").read():
            problems.append(f"ConfigMap {names[0]}: {f} differs from deploy/k8s/{f}")
used = set()
for o in objs:
    if o["kind"] in ("DaemonSet", "StatefulSet", "Job"):
        pod = o["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "configMap" in v:
                used.add(v["configMap"]["name"])
                if v["configMap"]["name"] not in maps:
                    problems.append(f"{o['kind']} {o['metadata']['name']} uses ConfigMap "
                                    f"{v['configMap']['name']}, which is not rendered")
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            if c["image"] == "kvcached":
                problems.append(f"{o['kind']} {o['metadata']['name']}: image not rewritten")
    if o["kind"] != "Namespace" and o["metadata"].get("namespace") != kust["namespace"]:
        problems.append(f"{o['kind']} {o['metadata']['name']} is not in {kust['namespace']}")
if set(maps) - used:
    problems.append(f"generated ConfigMaps no pod uses: {set(maps) - used}")
for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
print(f"  {len(objs)} objects: " + ", ".join(sorted(f"{k}/{n}" for k, n in by)))
sys.exit(1 if problems else 0)
EOF
  # Client-side dry runs still ask an API server for its resource types: with an empty
  # kubeconfig (never the user's cluster) this works only where a server answers on the
  # default address.
  : >"$work/kubeconfig"
  if KUBECONFIG=$work/kubeconfig timeout 20 kubectl apply --dry-run=client --validate=false \
    --request-timeout=5s -f "$work/rendered.yaml" >"$work/dry-run.log" 2>&1; then
    check "kubectl apply --dry-run=client accepted the rendered manifests"
  else
    echo "skip: kubectl apply --dry-run=client (it needs an API server for discovery, and none" \
      "answers here: $(grep -m1 -o 'dial tcp[^"]*\|connection refused' "$work/dry-run.log" ||
        tail -n 1 "$work/dry-run.log"))"
  fi
fi

# --- The real programs -------------------------------------------------------------------------
# relocate CONFIG OUT MOUNTS_JSON_KEY DIR TCP METRICS [SEED]: CONFIG with every path under a
# volume of the pod (or image) moved under DIR/<volume>, the listeners on loopback ports, and
# the seeds replaced by SEED.
relocate() {
  "$py" - "$@" <<'EOF' || fail "cannot relocate $1"
import json, os, sys
src, dst, mounts_json, key, base, tcp, metrics = sys.argv[1:8]
seed = sys.argv[8] if len(sys.argv) > 8 else None
mounts = json.load(open(mounts_json))[key]
if isinstance(mounts, list):  # the image's VOLUMEs
    mounts = {m: m.strip("/").replace("/", "_") for m in mounts}
for name in set(mounts.values()):
    os.makedirs(f"{base}/{name}", mode=0o700, exist_ok=True)
def move(v):
    if isinstance(v, dict):
        return {k: move(x) for k, x in v.items()}
    if isinstance(v, list):
        return [move(x) for x in v]
    if isinstance(v, str):
        for m, name in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if v.startswith(m.rstrip("/") + "/"):
                return f"{base}/{name}/{v[len(m.rstrip('/')) + 1:]}"
    return v
c = move(json.load(open(src)))
c["listen"]["tcp_address"] = f"127.0.0.1:{tcp}"
c["listen"]["metrics_address"] = f"127.0.0.1:{metrics}"
if seed and "remote_tier" in c:
    c["remote_tier"]["seeds"] = [seed]
json.dump(c, open(dst, "w"), indent=2)
EOF
}
# A probe command with the socket and kvcachectl of this test.
probe_args() { # JSON_LIST SOCKET_DIR_FROM SOCKET_DIR_TO
  "$py" -c 'import json, sys
cmd = json.loads(sys.argv[1])
print("\0".join([sys.argv[4]] + [a.replace(sys.argv[2], sys.argv[3]) for a in cmd[1:]]), end="")' \
    "$1" "$2" "$3" "$kvcachectl"
}

# The image's configuration and HEALTHCHECK, as the image runs them (its VOLUMEs in a temp dir).
free_ports 2
relocate "$deploy/container/kvcached.json" "$work/image.conf" "$work/image.json" volumes \
  "$work/image" "${ports[0]}" "${ports[1]}"
image_socket=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["listen"]["unix_socket"])' \
  "$work/image.conf")
check "kvcached starts with the image's deploy/container/kvcached.json (volumes in a temp dir)"
start_kvcached "$work/image.conf" "http://127.0.0.1:${ports[1]}/metrics" "$image_socket"
health_json=$("$py" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["health"]))' \
  "$work/image.json")
image_sock_dir=$("$py" -c 'import json,sys,os; print(os.path.dirname(json.load(open(sys.argv[1]))["socket"]))' \
  "$work/image.json")
mapfile -d '' health_cmd < <(probe_args "$health_json" "$image_sock_dir" "$(dirname "$image_socket")")
check "the image's HEALTHCHECK command exits 0: ${health_cmd[*]}"
"${health_cmd[@]}" >"$work/health.out" 2>&1 || fail "HEALTHCHECK failed: $(cat "$work/health.out")"
grep -q 'health: *SERVING' "$work/health.out" || fail "HEALTHCHECK: $(cat "$work/health.out")"
check "SIGTERM stops it with exit status 0"
stop_kvcached

# The Redis pod's start script, with redis.conf and its password, on loopback ports.
password=$("$py" -c 'import secrets; print(secrets.token_hex(32))')
seed=""
if has_redis; then
  real_redis=$(command -v redis-server)
  free_ports 2
  redis_port=${ports[0]} redis_bus=${ports[1]}
  redis_pod=$work/redis-pod
  mkdir -p "$work/bin" "$redis_pod/data" "$redis_pod/config" "$redis_pod/run"
  # The pod's paths (its volumes) moved into the temp dir, in the start script and in
  # redis.conf's `dir`; the ports are moved by the redis-server wrapper below.
  "$py" - "$work/k8s.json" "$work/scripts/redis-start.sh" "$work/redis-start.sh" "$redis_pod" \
    "$k8s/redis.conf" "$redis_pod/config/redis.conf" <<'EOF' ||
import json, re, sys
info, src, dst, base, conf_src, conf_dst = sys.argv[1:7]
mounts = json.load(open(info))["redis_mounts"]
s = open(src).read()
for m, name in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
    s = s.replace(m.rstrip("/") + "/", f"{base}/{name}/")
open(dst, "w").write(s)
def move_dir(m):
    return f"dir {base}/{mounts[m.group(1)]}" if m.group(1) in mounts else m.group(0)
conf = re.sub(r"(?m)^dir (\S+)$", move_dir, open(conf_src).read())
open(conf_dst, "w").write(conf)
EOF
    fail "cannot move the Redis start script's paths"
  printf '#!/bin/sh\nexec %q "$@" --port %s --cluster-port %s --bind 127.0.0.1\n' \
    "$real_redis" "$redis_port" "$redis_bus" >"$work/bin/redis-server"
  chmod +x "$work/bin/redis-server"
  fail_logs+=(redis-pod.log)
  start_redis_pod() { # POD_IP
    spawn "$work/redis-pod.log" env POD_IP="$1" REDIS_PASSWORD="$password" \
      PATH="$work/bin:$PATH" sh "$work/redis-start.sh"
    redis_pid=$!
    redis_up() {
      running "$redis_pid" "the Redis pod's start script exited" &&
        [[ $(REDISCLI_AUTH=$password redis-cli -p "$redis_port" ping 2>/dev/null) == PONG ]]
    }
    poll 10 "the Redis pod's start script did not serve 127.0.0.1:$redis_port within 10 s" redis_up
  }
  rcli() { REDISCLI_AUTH=$password redis-cli -p "$redis_port" "$@"; }
  check "the Redis pod's start script runs redis-server with deploy/k8s/redis.conf and the password"
  start_redis_pod 127.0.0.1
  [[ $(stat -c %a "$redis_pod/run/auth.conf") == 600 ]] || fail "auth.conf is not mode 0600"
  [[ $(redis-cli -p "$redis_port" ping 2>&1) == *NOAUTH* ]] || fail "Redis answers without AUTH"
  for key in cluster-enabled maxmemory-policy maxmemory appendonly cluster-announce-ip; do
    echo "  $key $(rcli config get "$key" | tail -n 1)"
  done
  check "the Redis pod's readiness probe passes"
  REDISCLI_AUTH=$password sh -c "$(sed "s/-p 6379/-p $redis_port/" "$work/scripts/redis-probe.sh")" ||
    fail "the Redis readiness probe failed"
  rcli cluster addslotsrange 0 16383 >/dev/null || fail "cluster addslotsrange"
  redis_cluster_ok() { [[ $(rcli cluster info) == *cluster_state:ok* ]]; }
  poll 10 "no cluster_state:ok within 10 s" redis_cluster_ok
  check "a Redis pod back with another IP in nodes.conf announces the new one (cluster-announce-ip)"
  stop_process "$redis_pid"
  wait "$redis_pid" 2>/dev/null || true
  forget "$redis_pid"
  sed -i 's/^\([0-9a-f]* \)127\.0\.0\.1:/\110.255.0.1:/' "$redis_pod/data/nodes.conf"
  grep -q ' 10\.255\.0\.1:' "$redis_pod/data/nodes.conf" || fail "could not change nodes.conf"
  start_redis_pod 127.0.0.1
  poll 10 "no cluster_state:ok after the restart" redis_cluster_ok
  nodes=$(rcli cluster nodes)
  [[ $nodes =~ \ 127\.0\.0\.1:${redis_port}@${redis_bus}[\ ,].*myself ]] ||
    fail "after the restart CLUSTER NODES shows: $nodes"
  seed=127.0.0.1:$redis_port
else
  echo "skip: the Redis pod's start script and kvcached connecting to it: redis-server is not" \
    "installed (deploy/setup-debian.sh installs it); kvcached gets seeds nothing answers"
  free_ports 1
  seed=127.0.0.1:${ports[0]}
fi

# kvcached with deploy/k8s/kvcached.json: its volumes in a temp dir as the pod has them.
pod=$work/pod
free_ports 2
relocate "$k8s/kvcached.json" "$work/pod.conf" "$work/k8s.json" mounts "$pod" "${ports[0]}" \
  "${ports[1]}" "$seed"
read -r key_file password_file pod_socket < <("$py" -c 'import json,sys
c = json.load(open(sys.argv[1]))
print(c["remote_tier"]["key_file"], c["remote_tier"]["password_file"], c["listen"]["unix_socket"])' \
  "$work/pod.conf")
(umask 077 && "$py" -c 'import secrets; print(secrets.token_hex(32))' >"$key_file" &&
  echo "$password" >"$password_file")
check "kvcached starts with deploy/k8s/kvcached.json (volumes in a temp dir, seeds $seed)"
start_kvcached "$work/pod.conf" "http://127.0.0.1:${ports[1]}/metrics" "$pod_socket"
if has_redis; then
  check "it connected to the Redis Cluster with the password"
  grep -q 'remote tier: connected to the Redis Cluster' "$work/kvcached.log" ||
    fail "kvcached did not log that it connected to the Redis Cluster"
else
  grep -q 'remote tier: the Redis Cluster of .* cannot be used yet' "$work/kvcached.log" ||
    fail "kvcached did not log that the cluster cannot be used yet"
fi
curl -fsS "http://127.0.0.1:${ports[1]}/metrics" >"$work/pod-scrape.txt" || fail "no metrics"
grep -q '^kvcached_remote_reads_total' "$work/pod-scrape.txt" ||
  fail "no kvcached_remote_* metrics: the remote tier is not on"
probe_json=$("$py" -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["probe"]))' \
  "$work/k8s.json")
k8s_sock_dir=$("$py" -c 'import json,sys,os; c=json.load(open(sys.argv[1])); print(os.path.dirname(c["listen"]["unix_socket"]))' \
  "$k8s/kvcached.json")
mapfile -d '' probe_cmd < <(probe_args "$probe_json" "$k8s_sock_dir" "$(dirname "$pod_socket")")
check "the DaemonSet's probe command exits 0 while kvcached serves: ${probe_cmd[*]}"
"${probe_cmd[@]}" >"$work/probe.out" 2>&1 || fail "the probe failed: $(cat "$work/probe.out")"
check "SIGTERM stops it with exit status 0, and the probe fails afterwards"
stop_kvcached
if "${probe_cmd[@]}" >"$work/probe.out" 2>&1; then
  fail "the probe passed with kvcached stopped: $(cat "$work/probe.out")"
fi

# The Secret template's placeholder must not start a daemon.
check "kvcached refuses the Secret template's placeholder key (exit 2, naming remote_tier.key_file)"
cp "$work/placeholder.key" "$key_file"
chmod 600 "$key_file"
free_ports 2
relocate "$k8s/kvcached.json" "$work/placeholder.conf" "$work/k8s.json" mounts "$pod" \
  "${ports[0]}" "${ports[1]}" "$seed"
status=0
timeout 20 "$kvcached" --config "$work/placeholder.conf" >"$work/placeholder.log" 2>&1 || status=$?
((status == 2)) || fail "kvcached exited $status with the placeholder key, expected 2: $(tail -n 3 "$work/placeholder.log")"
grep -q 'remote_tier.key_file.*does not hold 64 hexadecimal digits' "$work/placeholder.log" ||
  fail "the refusal does not name remote_tier.key_file: $(tail -n 3 "$work/placeholder.log")"

echo "PASS: k8s manifests and Containerfile"
