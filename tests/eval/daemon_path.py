#!/usr/bin/env python3
"""The daemon path of the fidelity evaluation: a sequence's KV through a real kvcached and back.

Contract. `serve_through_daemon(kvcached, stubs_dir, tokens, cache, report, policy, layout)`
starts the `kvcached` binary on a free port with a configuration that compresses quickly (blocks
cold after 1 s, a compaction pass every 100 ms, an activity half-life so long that fading is
nil, calibration off, the policy's sinks, window, decay and weights), registers the layout
(FP16), appends the prefix's whole blocks with their XXH3-64 checksums, sends the attention
report with ReportAttention, sets the policy with Admin.UpdateModelPolicy, waits for a
compaction pass that started after every block was cold to finish (the daemon's
kvcached_compaction_passes_total), and fetches the prefix twice: with lossy_as_stored (the stored
KVQ1 bytes, so the precision maps and stored sizes) and with accept_lossy (the decoded KV it
serves). Every block's checksum is verified (libxxhash), each KVQ1 block must decode to exactly
the bytes the lossy fetch sent, and kept_tokens must list the tokens with an entry not pruned.
It returns a DaemonServed: the served KvCache rebuilt from the fetched blocks, the per-block
precision maps, stored bytes and KVQ1 bytes, and the model's GetStats entry.

Budget mode (policy.mode "budget", daemon_budget_rule.py): the policy, with target_bytes, is set
before the report (the daemon keeps per-head activity only from reports that arrive in budget
mode); a report of num_layers x num_kv_heads rows is sent with num_layers = the layer count;
the stored blocks are version 2, their precision maps (num_layers, num_kv_heads, block_tokens),
and the served cache keeps every position with a per-(layer, head) mask of the entries not
pruned. In quantize/prune mode (version 1) the served cache drops the pruned positions. Both
append the prefix's tokens after the last whole block as the cache holds them.

Run as a program (daemon_path_test.sh), it checks the daemon against daemon_rule.py (quantize/
prune) and daemon_budget_rule.py (budget) on one real text, in the scenarios of `cases()`: the
same precision map for every block, the same stored bytes (KVQ1 bytes equal), the same served KV
bit for bit, the same GetStats counts, and the same logits for a teacher-forced continuation
decoded from the daemon-served cache as from the replica's. Exit status 0 when all hold, 1 with
the differences.

Usage: daemon_path.py --kvcached BIN --stubs GEN_DIR --model MODEL.gguf --text FILE
           [--prefix 384] [--continuation 64] [--block-tokens 16] [--target-mass 0.9]
           [--modes prune,budget]
"""

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_budget_rule as bd  # noqa: E402
import daemon_rule as dr  # noqa: E402

MODEL_ID = "smollm2-135m"
MODES = {"off": 1, "quantize": 2, "prune": 3, "budget": 4}  # admin.CompressionMode
RAW, DEQUANTIZED, COMPRESSED = 0, 1, 2  # kvcache.v1.BlockEncoding


class DaemonPathError(RuntimeError):
    pass


def _xxh3():
    for name in ("libxxhash.so.0", "libxxhash.so"):
        try:
            fn = ctypes.CDLL(name).XXH3_64bits
        except OSError:
            continue
        fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]
        return lambda data: fn(data, len(data))
    raise DaemonPathError("libxxhash is missing (apt-get install libxxhash0): checksums of "
                          "fetched blocks cannot be verified")


def _stubs(path):
    sys.path.insert(0, path)
    try:
        from kvcache.v1 import admin_pb2, admin_pb2_grpc, kvcache_pb2, kvcache_pb2_grpc
        import grpc
    except ImportError as e:
        raise DaemonPathError(f"cannot import grpc or the stubs in {path}: {e}") from e
    return grpc, kvcache_pb2, kvcache_pb2_grpc, admin_pb2, admin_pb2_grpc


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class DaemonServed:
    served: object             # smollm_reference.KvCache
    precision: list            # np.uint8 per block, from the stored form: (block_tokens,) in
    #                            quantize/prune mode, (num_layers, num_kv_heads, block_tokens)
    #                            in budget mode (version 2)
    stored_bytes: list         # per block: KVQ1 size, or the raw block size
    encoded: list              # per block: the KVQ1 bytes, or None for a raw block
    decoded: list              # per block: fp16 (L, 2, H, bt, D) as the lossy fetch sent it
    stats: dict = field(default_factory=dict)  # the model's GetStats counters
    seconds: float = 0.0


class _Daemon:
    """A kvcached child process on free ports; stopped with SIGTERM (exit 0 expected)."""

    def __init__(self, binary, config):
        self.dir = tempfile.TemporaryDirectory(prefix="kvcached-daemon-path-")
        path = os.path.join(self.dir.name, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.port, self.metrics_port = _free_port(), _free_port()
        self.log = open(os.path.join(self.dir.name, "kvcached.log"), "w+")
        self.proc = subprocess.Popen(
            [binary, "--config", path, "--listen", f"127.0.0.1:{self.port}",
             "--unix-socket", "none", "--metrics-address", f"127.0.0.1:{self.metrics_port}",
             "--capacity-bytes", str(256 << 20)],
            stdout=self.log, stderr=subprocess.STDOUT)

    def log_tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def compaction_passes(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("kvcached_compaction_passes_total "):
                    return int(float(line.split()[1]))
        raise DaemonPathError("the metrics have no kvcached_compaction_passes_total")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        tail = self.log_tail()
        self.log.close()
        self.dir.cleanup()
        return code, tail


def daemon_config(policy):
    """The ServerConfig (proto3 JSON) the daemon path runs under."""
    imp = {
        "alpha": policy.alpha, "beta": policy.beta, "gamma": policy.gamma,
        "sink_tokens": policy.sink_tokens, "recent_window": policy.recent_window,
        "decay_tau": policy.decay_tau, "target_mass": policy.target_mass,
        "activity_half_life_seconds": 1e12, "cold_after_seconds": 1,
        "compaction_interval_ms": 100, "calibration_interval_seconds": 0,
    }
    if policy.novelty_layers:
        imp["novelty_layers"] = list(policy.novelty_layers)
    return {"importance": imp}


def _fetch(cache_stub, pb, tokens, layout, xxh3, **flags):
    """Fetches the prefix; returns [(encoding, bytes, kept_tokens or None)] per block after
    verifying every block's checksum and the chunks' order."""
    blocks, current = [], None
    for m in cache_stub.Fetch(pb.FetchRequest(model_id=MODEL_ID, tokens=tokens, **flags),
                              timeout=60):
        if m.offset == 0:
            if current is not None:
                raise DaemonPathError(f"block {current['index']} ended early")
            current = {"index": m.block_index, "encoding": m.encoding, "data": bytearray(),
                       "size": m.block_bytes, "checksum": m.block_checksum,
                       "kept": list(m.kept_tokens) if len(m.kept_tokens) else None}
        if current is None or m.block_index != current["index"] or \
                m.offset != len(current["data"]):
            raise DaemonPathError(f"fetch: chunk out of order at block {m.block_index}")
        current["data"] += m.data
        if len(current["data"]) == current["size"]:
            data = bytes(current["data"])
            if xxh3(data) != current["checksum"]:
                raise DaemonPathError(f"fetch: block {current['index']} fails its checksum")
            if current["index"] != len(blocks):
                raise DaemonPathError(f"fetch: block {current['index']} out of order")
            blocks.append((current["encoding"], data, current["kept"]))
            current = None
    if current is not None:
        raise DaemonPathError("fetch: the stream ended inside a block")
    return blocks


def _fp16_block(data, layout):
    return np.frombuffer(data, np.float16).reshape(
        layout.num_layers, 2, layout.num_kv_heads, layout.block_tokens, layout.head_dim)


def serve_through_daemon(kvcached, stubs_dir, tokens, cache, report, policy, layout,
                         timeout=60.0):
    """See the module's contract. `report` is float32 (num_layers, len(tokens)), or in budget
    mode also (num_layers * num_kv_heads, len(tokens)) per head; `policy` a daemon_rule.Policy,
    `layout` a daemon_rule.Layout. Raises DaemonPathError on any failure."""
    started = time.monotonic()
    grpc, pb, pb_grpc, admin, admin_grpc = _stubs(stubs_dir)
    xxh3 = _xxh3()
    blocks = dr.blocks_of(cache, layout)
    n = len(blocks) * layout.block_tokens
    tokens = [int(t) for t in tokens]
    if len(tokens) != cache.k[0].shape[1]:
        raise DaemonPathError("tokens and cache have different lengths")
    daemon = _Daemon(kvcached, daemon_config(policy))
    channel = grpc.insecure_channel(f"127.0.0.1:{daemon.port}",
                                    options=[("grpc.max_receive_message_length", 64 << 20)])
    ok = False
    try:
        cache_stub, admin_stub = pb_grpc.CacheStub(channel), admin_grpc.AdminStub(channel)
        deadline = time.monotonic() + 20
        while True:
            if daemon.proc.poll() is not None:
                raise DaemonPathError(f"kvcached exited with {daemon.proc.returncode}")
            try:
                admin_stub.GetServerInfo(admin.GetServerInfoRequest(), timeout=1)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise DaemonPathError("kvcached did not answer within 20 s")
                time.sleep(0.1)
        cache_stub.RegisterModel(pb.RegisterModelRequest(model_id=MODEL_ID, layout=pb.ModelLayout(
            num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim, block_tokens=layout.block_tokens, dtype=pb.DTYPE_FP16)),
            timeout=10)
        payload = [b.tobytes() for b in blocks]
        header = pb.AppendHeader(model_id=MODEL_ID, tokens=tokens, start_token=0,
                                 block_checksums=[xxh3(p) for p in payload])

        def requests():
            yield pb.AppendRequest(header=header)
            for p in payload:
                for off in range(0, len(p), 1 << 20):
                    yield pb.AppendRequest(kv_chunk=p[off:off + (1 << 20)])

        r = cache_stub.Append(requests(), timeout=60)
        if r.stored_blocks != len(blocks) or r.cached_tokens != n:
            raise DaemonPathError(f"append stored {r.stored_blocks} blocks, {r.cached_tokens} "
                                  f"tokens; expected {len(blocks)}, {n}")
        budget = policy.mode == "budget"

        def set_policy():
            extra = {"target_bytes": policy.target_bytes} if budget else {}
            change = admin_stub.UpdateModelPolicy(admin.UpdateModelPolicyRequest(
                model_id=MODEL_ID, mode=MODES[policy.mode],
                weights=admin.ImportanceWeights(alpha=policy.alpha, beta=policy.beta,
                                                gamma=policy.gamma),
                target_mass=policy.target_mass, **extra), timeout=10)
            if change.policy.mode != MODES[policy.mode]:
                raise DaemonPathError(f"the policy did not take: {change.policy}")

        # Budget mode keeps per-head activity only from reports that arrive while the model
        # is in budget mode: set the policy first there.
        if budget:
            set_policy()
        report = np.asarray(report, dtype=np.float32)
        per_head = report.shape[0] == layout.num_layers * layout.num_kv_heads
        r = cache_stub.ReportAttention(pb.ReportAttentionRequest(
            model_id=MODEL_ID, tokens=tokens, attention=report.ravel().tolist(),
            num_layers=layout.num_layers if per_head else report.shape[0]), timeout=10)
        if r.matched_tokens != n or r.updated_tokens != n:
            raise DaemonPathError(f"the report matched {r.matched_tokens} and updated "
                                  f"{r.updated_tokens} tokens; expected {n}")
        if not budget:
            set_policy()
        # Every block is cold 1 s after its last use; then wait for a whole pass.
        time.sleep(1.3)
        first = daemon.compaction_passes()
        while daemon.compaction_passes() < first + 2:
            if time.monotonic() - started > timeout:
                raise DaemonPathError("no compaction pass finished in time")
            time.sleep(0.05)
        stats = admin_stub.GetStats(admin.GetStatsRequest(), timeout=10)
        mine = [m for m in stats.models if m.model_id == MODEL_ID][0]
        counters = {k: getattr(mine, k) for k in (
            "blocks", "compressed_blocks", "full_tokens", "int8_tokens", "pruned_tokens",
            "bytes_saved", "attention_reports", "calibrations", "corrupt_blocks",
            "int8_entries", "int4_entries", "pruned_entries", "budget_overruns")}

        stored = _fetch(cache_stub, pb, tokens, layout, xxh3, accept_lossy=True,
                        lossy_as_stored=True)
        lossy = _fetch(cache_stub, pb, tokens, layout, xxh3, accept_lossy=True)
        if len(stored) != len(blocks) or len(lossy) != len(blocks):
            raise DaemonPathError(f"fetched {len(stored)} / {len(lossy)} blocks of {len(blocks)}")
        result = DaemonServed(None, [], [], [], [], counters)
        for b, ((enc, data, _), (lenc, ldata, kept)) in enumerate(zip(stored, lossy)):
            if enc == COMPRESSED:
                decoded, precision = bd.decode_any(data, layout)
                if (precision.ndim == 3) != budget:
                    raise DaemonPathError(f"block {b}: format version "
                                          f"{2 if precision.ndim == 3 else 1} in {policy.mode} "
                                          "mode")
                if lenc != DEQUANTIZED or decoded.tobytes() != ldata:
                    raise DaemonPathError(f"block {b}: the KVQ1 bytes do not decode to what the "
                                          "accept_lossy fetch sent")
                result.encoded.append(data)
            elif enc == RAW and lenc == RAW and data == ldata == payload[b]:
                precision = np.zeros((layout.num_layers, layout.num_kv_heads,
                                      layout.block_tokens) if budget else layout.block_tokens,
                                     np.uint8)
                result.encoded.append(None)
            else:
                raise DaemonPathError(f"block {b}: encodings {enc}/{lenc}, or raw bytes changed")
            # A token is kept when any of its entries is (version 1: the token's one precision).
            unpruned = np.flatnonzero((precision != dr.PRUNED).reshape(
                -1, layout.block_tokens).any(axis=0)).tolist()
            if (kept or list(range(layout.block_tokens))) != unpruned:
                raise DaemonPathError(f"block {b}: kept_tokens {kept}, precision map {precision}")
            result.precision.append(precision)
            result.stored_bytes.append(len(data))
            result.decoded.append(_fp16_block(ldata, layout))
        served = bd.served_cache if budget else dr.served_cache
        result.served = served(result.decoded, result.precision, cache, layout)
        result.seconds = time.monotonic() - started
        ok = True
        return result
    finally:
        channel.close()
        code, tail = daemon.stop()
        if ok and code != 0:
            raise DaemonPathError(f"kvcached exited with {code} after SIGTERM:\n{tail}")
        if not ok:
            print(f"kvcached's log:\n{tail}", file=sys.stderr)


def compare(rule, got, layout):
    """The differences between daemon_rule's plan and what the daemon did (empty: none)."""
    problems = []
    for b, (p, q) in enumerate(zip(rule.precision, got.precision)):
        if p.shape != q.shape:
            problems.append(f"block {b}: precision map shape daemon {q.shape}, rule {p.shape}")
        elif p.ndim == 3 and not np.array_equal(p, q):  # version 2: say where, not all of it
            where = np.argwhere(p != q)
            l, h, t = where[0]
            problems.append(f"block {b}: precision differs in {len(where)} entries, first "
                            f"(layer {l}, head {h}, token {t}): daemon {q[l, h, t]}, rule "
                            f"{p[l, h, t]}")
        elif not np.array_equal(p, q):
            problems.append(f"block {b}: precision map daemon {q.tolist()}, rule {p.tolist()}")
        if rule.stored_bytes[b] != got.stored_bytes[b]:
            problems.append(f"block {b}: stored bytes daemon {got.stored_bytes[b]}, rule "
                            f"{rule.stored_bytes[b]}")
        elif rule.encoded[b] != got.encoded[b]:
            problems.append(f"block {b}: KVQ1 bytes differ")
        if rule.decoded[b].tobytes() != got.decoded[b].tobytes():
            diff = np.abs(rule.decoded[b].astype(np.float32) - got.decoded[b].astype(np.float32))
            problems.append(f"block {b}: served KV differs in {int(np.sum(diff > 0))} elements "
                            f"(max {float(diff.max()):.3g})")
    if len(rule.precision) != len(got.precision):
        problems.append(f"blocks: daemon {len(got.precision)}, rule {len(rule.precision)}")
    return problems


def coarse_report(report, steps=256):
    """The report rounded to multiples of 1/steps: what a worker sending coarse attention
    would report. Many tokens then tie (and many are 0), which pins SelectByMass's tie rule."""
    return (np.round(np.asarray(report, np.float64) * steps) / steps).astype(np.float32)


def cases(block_tokens, target_mass):
    """(name, policy, layout block_tokens, report kind, report transform) of the checked
    scenarios. The report kind is "layers" (num_layers rows, averaged over all heads) or "heads"
    (num_layers x num_kv_heads rows, daemon_budget_rule.head_report).

    quantize/prune (version 1): the default weights on the real report; and attention alone on
    a coarse report (ties, zero scores), 64-token blocks with a 124-token recent window, so the
    block at the window's edge compresses to no smaller pool chunk and must stay raw.

    budget (version 2): target_bytes 0.37 on the per-head report (INT8 and INT4 entries, and
    the first block, whose sinks stay full, pruned in part); 0.2 with attention alone on a
    coarse per-head report and 64-token blocks (everything INT4, then the lowest pruned; many
    tied scores, so the index order of ties decides); 0.6 on the per-layer report (the token's
    activity for every head; all-INT8 fits, so the highest entries are promoted to full)."""
    same = lambda r: r  # noqa: E731
    return [
        ("default weights", dr.Policy(mode="prune", target_mass=target_mass), block_tokens,
         "layers", same),
        ("attention only, coarse report, window 124",
         dr.Policy(mode="prune", alpha=1.0, beta=0.0, gamma=0.0, target_mass=0.9,
                   recent_window=124), 64, "layers", coarse_report),
        ("budget 0.37, per-head report", dr.Policy(mode="budget", target_bytes=0.37),
         block_tokens, "heads", same),
        ("budget 0.2, attention only, coarse per-head report",
         dr.Policy(mode="budget", alpha=1.0, beta=0.0, gamma=0.0, target_bytes=0.2), 64, "heads",
         coarse_report),
        ("budget 0.6, per-layer report", dr.Policy(mode="budget", target_bytes=0.6), block_tokens,
         "layers", same),
    ]


def check_case(name, policy, layout, report, args, cache, prefix, cont, full, model):
    """Runs one case through the replica and the daemon; prints the outcome and returns the
    list of mismatches (None when the daemon path failed)."""
    budget = policy.mode == "budget"
    rule = bd.budget_plan(cache, report, policy, layout) if budget else \
        dr.plan(cache, report, policy, layout)
    try:
        got = serve_through_daemon(args.kvcached, args.stubs, prefix, cache, report, policy,
                                   layout)
    except DaemonPathError as e:
        print(f"{name}: daemon path failed: {e}", file=sys.stderr)
        return None
    problems = compare(rule, got, layout)
    stats = got.stats
    if budget:
        counts = rule.entries
        pairs = [("int8_entries", counts["int8"]), ("int4_entries", counts["int4"]),
                 ("pruned_entries", counts["pruned"]),
                 ("budget_overruns", sum(o for o, c in zip(rule.over_budget, rule.compressed)
                                         if c))]
        summary = (f"entries full {counts['full']}, int8 {counts['int8']}, int4 "
                   f"{counts['int4']}, pruned {counts['pruned']}")
    else:
        counts = rule.tokens
        pairs = [("int8_tokens", counts["int8"]), ("pruned_tokens", counts["pruned"])]
        summary = (f"tokens full {counts['full']}, int8 {counts['int8']}, pruned "
                   f"{counts['pruned']}")
    pairs.append(("compressed_blocks", sum(rule.compressed)))
    for key, want in pairs:
        if stats[key] != want:
            problems.append(f"GetStats {key} {stats[key]}, rule {want}")
    ours, _, _ = model.forward(cont, cache=rule.served)
    theirs, _, _ = model.forward(cont, cache=got.served)
    logit_diff = float(np.max(np.abs(ours - theirs)))
    if not logit_diff <= 1e-6:
        problems.append(f"continuation logits differ by up to {logit_diff:.3g}")
    agree = float(np.mean(theirs.argmax(-1) == full.argmax(-1)))
    ties = sum(s.size - len(np.unique(s[s > 0])) - int(np.sum(s == 0))
               for s in rule.scores if s is not None)
    print(f"{name}: {len(prefix)}-token prefix of {os.path.basename(args.text)}, "
          f"{len(rule.precision)} blocks of {layout.block_tokens}, {sum(rule.compressed)} "
          f"compressed; {summary}; repeated positive scores {ties}; stored {rule.stored_total} "
          f"of {rule.fp16_bytes} bytes ({rule.stored_total / rule.fp16_bytes:.4f}); daemon path "
          f"{got.seconds:.1f} s; continuation of {len(cont)} tokens: max |logit difference| "
          f"{logit_diff:.3g}, top-1 agreement with full precision {agree * 100:.2f}%")
    for p in problems[:40]:
        print("  MISMATCH", p)
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvcached", required=True)
    parser.add_argument("--stubs", required=True, help="folder of the generated kvcache/v1 stubs")
    parser.add_argument("--model", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--prefix", type=int, default=384)
    parser.add_argument("--continuation", type=int, default=64)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--target-mass", type=float, default=0.9)
    parser.add_argument("--modes", default="",
                        help="comma-separated modes whose cases run (default: every case)")
    args = parser.parse_args()
    import smollm_reference as sr
    import smollm_tokenizer as st

    t0 = time.monotonic()
    model = sr.SmolLM(args.model)
    with open(args.text, encoding="utf-8") as f:
        ids = st.encode(st.load(args.model), f.read())
    if len(ids) < args.prefix + args.continuation:
        print(f"{args.text}: {len(ids)} tokens, fewer than prefix + continuation", file=sys.stderr)
        return 1
    prefix, cont = ids[:args.prefix], ids[args.prefix:args.prefix + args.continuation]
    c = model.config
    layer_hook, layer_rows = dr.attention_report_hook()
    head_hook, head_rows = bd.report_rows_hook(c.kv_heads)

    def hook(layer, p):
        layer_hook(layer, p)
        head_hook(layer, p)

    _, cache, _ = model.forward(prefix, attention_hook=hook)
    reports = {"layers": np.stack([layer_rows[i] for i in range(c.layers)]),
               "heads": bd.head_report(head_rows)}
    full, _, _ = model.forward(cont, cache=cache)
    failed = 0
    chosen = cases(args.block_tokens, args.target_mass)
    if args.modes:
        chosen = [x for x in chosen if x[1].mode in args.modes.split(",")]
    for name, policy, block_tokens, kind, transform in chosen:
        layout = dr.Layout(c.layers, c.kv_heads, c.head_dim, block_tokens)
        problems = check_case(name, policy, layout, transform(reports[kind]), args, cache,
                              prefix, cont, full, model)
        if problems is None:
            return 1
        failed += bool(problems)
    print(f"total {time.monotonic() - t0:.1f} s")
    if failed:
        print(f"{failed} case(s) where kvcached and its replica disagree")
        return 1
    print("kvcached and its replicas agree: precision maps, stored bytes, served KV, stats, logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
