#!/usr/bin/env bash
# The status page (docs/status_page.md) against the real daemon, in a real
# browser (Debian's headless Chromium):
#   - kvcached starts with a small host tier over an SSD tier (so blocks move
#     between tiers) and a migration log it cannot open (so an error is
#     logged while it serves);
#   - a workload over its Unix socket (Debian's python3-grpcio and stubs
#     generated from the .proto) registers a model, appends sequences with a
#     protected range, looks them up, and reports per-head attention;
#   - curl: /metrics is Prometheus text with the workload in it, /status is
#     HTML with every section, POST is refused (405), unknown paths are 404;
#   - chromium --dump-dom: the rendered /status has every section id, the
#     attention map one cell per token, the tier move and the error; the
#     attention page of the top prefix (followed from /status) one cell per
#     token, one per token and layer, and the pinned marks;
#   - chromium --screenshot: a valid 1280x2000 PNG with many colours, among
#     them the tier bars' and the heatmap's;
#   - no token id anywhere by default; restarted with status_page.show_tokens,
#     the token ids are on both pages;
#   - kvcached exits 0 on SIGTERM.
# Usage: status_page_test.sh KVCACHED_BINARY REPO_ROOT
# With KVCACHE_TEST_ARTIFACTS set, the screenshot is copied into that directory.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=shell_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_lib.sh"
setup_test "$@"
fail_logs+=(chromium.log)

need chromium "chromium not found: this test loads the status page in headless Chromium;" \
  "install it with \`apt-get install chromium\` (deploy/setup-debian.sh does)"
for tool in curl protoc timeout; do
  need "$tool"
done
need_python_grpc

gen_stubs

# Chromium as root needs --no-sandbox; its profile goes to the temp dir.
browse() {
  timeout 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$work/chromium" --force-color-profile=srgb \
    --hide-scrollbars "$@" 2>>"$work/chromium.log"
}

# --- The daemon ------------------------------------------------------------------
metrics_port=""
start_daemon() { # $1: show_tokens (true/false)
  free_ports 2
  local tcp_port=${ports[0]}
  metrics_port=${ports[1]}
  rm -rf "$work/ssd.bin" "$work/kvcached.sock"
  : >"$work/not-a-dir" # the migration log's "directory" is a file: opening it fails
  cat >"$work/kvcached.json" <<EOF
{
  "listen": {"tcp_address": "127.0.0.1:$tcp_port", "unix_socket": "$work/kvcached.sock",
             "metrics_address": "127.0.0.1:$metrics_port"},
  "host_tier": {"capacity_bytes": "8388608", "slab_bytes": "1048576",
                "high_watermark": 0.2, "low_watermark": 0.1},
  "ssd_tier": {"path": "$work/ssd.bin", "capacity_bytes": "67108864",
               "region_bytes": "1048576", "direct_io": false},
  "logging": {"migration_log": "$work/not-a-dir/migration.log"},
  "importance": {"default_mode": "budget"},
  "status_page": {"show_tokens": $1, "recent_events": 20}
}
EOF
  start_kvcached "$work/kvcached.json" "http://127.0.0.1:$metrics_port/status" \
    "$work/kvcached.sock"
}

# Registers status-test/tiny (2 layers, 2 KV heads, head dim 64, fp16, 16-token
# blocks: 16 KiB a block), appends `sequences` sequences of 256 tokens (16
# blocks; tokens 7770000 + 1000 s + i, the first 8 protected), looks sequence 0
# up 5 times and the others once, and reports per-head attention for
# sequence 0.
cat >"$work/workload.py" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
from cache_rpc import block_checksums, pb, connect, register_model

target, sequences = sys.argv[2], int(sys.argv[3])
call = connect(target)
ns, model = "status-test", "tiny"
reg = register_model(call, ns, model, num_layers=2, num_kv_heads=2, head_dim=64)
assert reg.block_bytes == 16384, reg
tokens_of = lambda s: [7770000 + 1000 * s + i for i in range(256)]
for s in range(sequences):
    hints = pb.AppendHints(protected_ranges=[pb.TokenRange(begin=0, end=8)])
    kv = bytes((s * 31 + i) % 251 for i in range(16384)) * 16
    header = pb.AppendHeader(namespace=ns, model_id=model, tokens=tokens_of(s), start_token=0,
                             hints=hints, block_checksums=block_checksums(kv, reg.block_bytes))
    requests = [pb.AppendRequest(header=header)] + [
        pb.AppendRequest(kv_chunk=kv[i:i + 65536]) for i in range(0, len(kv), 65536)]
    r = call("stream_unary", "Append", pb.AppendResponse)(iter(requests), timeout=10)
    assert r.cached_tokens == 256, r
lookup = call("unary_unary", "Lookup", pb.LookupResponse)
for s in range(sequences):
    for _ in range(5 if s == 0 else 1):
        found = lookup(pb.LookupRequest(namespace=ns, model_id=model, tokens=tokens_of(s)),
                       timeout=10)
        assert found.matched_tokens == 256, found
# Per (layer, KV head) rows: the mass falls off with the distance from a few
# heavy hitters, so the scores (and the map's colours) spread.
n = 256
attention = []
for layer in range(2):
    for head in range(2):
        for t in range(n):
            heavy = min(abs(t - c) for c in (20 + 40 * head, 130 + 20 * layer, 230))
            attention.append(1.0 / (1 + heavy))
r = call("unary_unary", "ReportAttention", pb.ReportAttentionResponse)(
    pb.ReportAttentionRequest(namespace=ns, model_id=model, tokens=tokens_of(0),
                              attention=attention, num_layers=2), timeout=10)
assert r.matched_tokens == 256, r
print(f"  workload: {sequences} sequences of 256 tokens appended and looked up, attention "
      "reported for sequence 0")
EOF

# Checks a page's HTML: $1 file, $2 what it is, then the checks (see below).
cat >"$work/page.py" <<'EOF'
import html, re, sys

path, what, *checks = sys.argv[1:]
text = open(path, encoding="utf-8").read()
problems = []
for c in checks:
    kind, _, arg = c.partition("=")
    if kind == "id":
        if not re.search(rf'\bid="{re.escape(arg)}"', text):
            problems.append(f"no element with id {arg!r}")
    elif kind == "has":
        if arg not in text:
            problems.append(f"does not contain {arg!r}")
    elif kind == "count":  # class=N[+]
        cls, _, want = arg.partition(":")
        at_least = want.endswith("+")
        want = int(want.rstrip("+"))
        got = len(re.findall(rf'class="{re.escape(cls)}"', text))
        if got < want if at_least else got != want:
            problems.append(f"{got} elements of class {cls!r}, expected {want}{'+' if at_least else ''}")
        print(f"  {what}: {got} elements of class {cls}")
    elif kind == "no-tokens":
        found = sorted(set(re.findall(r"\b777\d{4}\b", text)))
        if found:
            problems.append(f"shows token ids without show_tokens: {found[:5]}")
    elif kind == "link":  # print the first attention link, unescaped
        m = re.search(r'class="attention-link" href="([^"]+)"', text)
        if not m:
            problems.append("no attention link")
        else:
            print(html.unescape(m.group(1)))
    elif kind == "no-script":
        if re.search(r"<script", text, re.I):
            problems.append("has a <script> element")
for p in problems:
    print(f"{what}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

# Checks a PNG: valid, $2 x $3 pixels, many colours, among them the tier
# bars' and at least 8 of the heatmap's (viridis, as attention_map.cc).
cat >"$work/png.py" <<'EOF'
import struct, sys, zlib

path, want_w, want_h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = open(path, "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(f"{path} is not a PNG")
pos, chunks = 8, {}
idat = b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
    if zlib.crc32(kind + body) & 0xffffffff != crc:
        sys.exit(f"{path}: bad CRC in chunk {kind}")
    if kind == b"IDAT":
        idat += body
    else:
        chunks.setdefault(kind, body)
    pos += 12 + length
    if kind == b"IEND":
        break
w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
if (w, h) != (want_w, want_h):
    sys.exit(f"{path} is {w}x{h}, expected {want_w}x{want_h}")
if depth != 8 or colour not in (2, 6) or interlace != 0:
    sys.exit(f"{path}: depth {depth}, colour type {colour}, interlace {interlace} not handled")
bpp = 3 if colour == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = {}
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1:
            line[i] = (line[i] + a) & 255
        elif f == 2:
            line[i] = (line[i] + b) & 255
        elif f == 3:
            line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = bytes(line[x:x + 3])
        colours[px] = colours.get(px, 0) + 1
    prev = line

def viridis(score):
    stops = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
    at = min(max(score, 0.0), 1.0) * 4
    i = min(3, int(at))
    f = at - i
    return bytes(int(round(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]) + 1e-9)) for k in range(3))

palette = {viridis(i / 4000) for i in range(4001)}
heat = [c for c in colours if c in palette and colours[c] >= 50]
problems = []
if len(colours) < 32:
    problems.append(f"only {len(colours)} distinct colours: the page did not render")
for name, rgb in (("tier bar (used)", b"\x9e\xca\xe1"), ("tier bar (payload)", b"\x08\x51\x9c")):
    if colours.get(rgb, 0) < 50:
        problems.append(f"no {name} colour #{rgb.hex()} ({colours.get(rgb, 0)} pixels)")
if len(heat) < 8:
    problems.append(f"only {len(heat)} heatmap colours of 50+ pixels; expected 8+")
most = max(colours.values()) / (w * h)
print(f"  {path.rsplit('/', 1)[-1]}: {w}x{h}, {len(colours)} colours, {len(heat)} heatmap colours, "
      f"the commonest {most:.0%} of the pixels")
for p in problems:
    print(f"FAIL: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

sections=(id=version id=config id=tiers id=models id=top-prefixes id=recent-errors
  id=recent-migrations id=attention)

# --- Default: no token ids ---------------------------------------------------------
check "kvcached starts (8 MiB host tier, high watermark 0.2, over a 64 MiB SSD tier)"
start_daemon false
base=http://127.0.0.1:$metrics_port
check "a workload over unix:$work/kvcached.sock (RegisterModel, Append x10, Lookup x14," \
  "ReportAttention per head)"
"$py" "$work/workload.py" "$work/gen" "unix:$work/kvcached.sock" 10 || fail "the workload failed"

check "curl $base/metrics: Prometheus text with the workload's model"
curl -fsS -D "$work/metrics.head" "$base/metrics" >"$work/metrics.txt" || fail "curl /metrics"
grep -qi '^content-type: text/plain; version=0.0.4' "$work/metrics.head" ||
  fail "/metrics content type: $(grep -i content-type "$work/metrics.head")"
grep -q '^kvcached_model_blocks{namespace="status-test",model="tiny"} ' "$work/metrics.txt" ||
  fail "/metrics has no kvcached_model_blocks for status-test/tiny"
grep -q '^kvcached_rpcs_total{.*method="Append"' "$work/metrics.txt" ||
  grep -q '^kvcached_rpcs_total{.*Append' "$work/metrics.txt" ||
  fail "/metrics has no kvcached_rpcs_total for Append"

check "the endpoint is read-only: POST /status is 405, GET /nothing is 404"
code=$(curl -sS -o /dev/null -w '%{http_code}' -X POST --data x "$base/status")
[[ $code == 405 ]] || fail "POST /status answered $code"
code=$(curl -sS -o /dev/null -w '%{http_code}' "$base/nothing")
[[ $code == 404 ]] || fail "GET /nothing answered $code"

check "the tier moves and the migration log's error reach /status (waiting up to 15 s)"
status_shows_move_and_error() {
  curl -fsS "$base/status" >"$work/status.html" || fail "curl /status"
  grep -q 'class="move"' "$work/status.html" &&
    grep -q 'class="event level-error"' "$work/status.html"
}
poll 15 "/status lists no tier move or no error after 15 s" status_shows_move_and_error

check "curl $base/status: every section, the model, no script, no token id"
"$py" "$work/page.py" "$work/status.html" "/status (curl)" "${sections[@]}" \
  has=status-test has='migration log' has='>ssd<' no-tokens no-script ||
  fail "/status (curl)"

check "chromium --dump-dom $base/status: every section, one heatmap cell per token of the" \
  "top prefix, its layer rows"
browse --dump-dom "$base/status" >"$work/status.dom" || fail "chromium --dump-dom /status"
"$py" "$work/page.py" "$work/status.dom" "/status (chromium)" "${sections[@]}" \
  count=cell:256 count=layer-cell:512 count=mark-pinned:8 count=move:1+ \
  count=prefix:20 has='level-error' no-tokens || fail "/status as Chromium rendered it"

check "chromium --screenshot of /status (1280x2000): a PNG with the tier bars and the heatmap"
browse --screenshot="$work/status.png" --window-size=1280,2000 "$base/status" >/dev/null ||
  fail "chromium --screenshot /status"
[[ -s $work/status.png ]] || fail "chromium wrote no screenshot"
"$py" "$work/png.py" "$work/status.png" 1280 2000 || fail "the screenshot of /status"
if [[ -n ${KVCACHE_TEST_ARTIFACTS:-} ]]; then # keep the screenshot, e.g. for CI artifacts
  mkdir -p "$KVCACHE_TEST_ARTIFACTS" && cp "$work/status.png" "$KVCACHE_TEST_ARTIFACTS/"
fi

check "the attention page of the top prefix, followed from /status"
link=$("$py" "$work/page.py" "$work/status.dom" "/status" link) || fail "no attention link"
echo "  link: $link"
browse --dump-dom "$base$link" >"$work/attention.dom" || fail "chromium --dump-dom $link"
"$py" "$work/page.py" "$work/attention.dom" "attention page" id=attention id=blocks \
  count=cell:256 count=layer-cell:512 count=mark-pinned:8 count=mark-protected:8+ \
  count=block:16 no-tokens || fail "the attention page"
code=$(curl -sS -o /dev/null -w '%{http_code}' "$base/status/attention?ns=status-test&model=tiny&key=1")
[[ $code == 404 ]] || fail "the attention page of an unknown key answered $code"

check "SIGTERM stops kvcached with exit status 0"
stop_kvcached

# --- status_page.show_tokens -----------------------------------------------------
check "restarted with status_page.show_tokens: the token ids are on both pages"
start_daemon true
base=http://127.0.0.1:$metrics_port
"$py" "$work/workload.py" "$work/gen" "unix:$work/kvcached.sock" 2 || fail "the workload failed"
browse --dump-dom "$base/status" >"$work/status_tokens.dom" || fail "chromium --dump-dom /status"
"$py" "$work/page.py" "$work/status_tokens.dom" "/status (show_tokens)" "${sections[@]}" \
  has='7770000 7770001 7770002' has='first tokens' || fail "/status with show_tokens"
link=$("$py" "$work/page.py" "$work/status_tokens.dom" "/status" link) || fail "no attention link"
browse --dump-dom "$base$link" >"$work/attention_tokens.dom" || fail "chromium --dump-dom $link"
"$py" "$work/page.py" "$work/attention_tokens.dom" "attention page (show_tokens)" \
  count=cell:256 has='token 7770000' has='token 7770255' || fail "attention page with show_tokens"
stop_kvcached

echo "PASS: status page"
