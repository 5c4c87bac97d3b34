#!/usr/bin/python3
"""An independent client for kvcached, written from the .proto files alone.

Starts the real daemon on a free TCP port, talks to it through Python stubs
generated from proto/ (no code shared with the C++ client), and checks the
wire contract: register, append, lookup, fetch (bytes and per-chunk fields),
leases, evict, error codes for bad input, admin calls, and a clean exit 0 on
SIGTERM.

Run with Debian's interpreter, which has python3-grpcio:
  /usr/bin/python3 tests/python/client_test.py --kvcached build/server/kvcached \
      --stubs build/tests/python/gen
"""

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
v1 = None  # the generated modules, imported once --stubs is known
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvcache_stubs  # noqa: E402


def _import_stubs(path):
    global v1
    v1 = kvcache_stubs.load(path)


XXH3 = None  # XXH3-64 from libxxhash, loaded by main(); the test fails without it

import grpc  # noqa: E402  (after the docstring and helpers on purpose)

LAYOUT = dict(num_layers=2, num_kv_heads=2, head_dim=64, block_tokens=16)
BLOCK_TOKENS = 16
BLOCK_BYTES = 2 * 2 * 2 * 16 * 64 * 2  # layers * K,V * heads * tokens * head_dim * fp16


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_state(channel, timeout=1.0):
    """grpc.health.v1.Health/Check with raw bytes: the request is empty, the
    response is field 1 (varint status; 1 = SERVING)."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    resp = check(b"", timeout=timeout)
    return resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0


class KvcachedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.log = tempfile.NamedTemporaryFile(prefix="kvcached-", suffix=".log", delete=False)
        cls.proc = subprocess.Popen(
            [
                ARGS.kvcached,
                "--listen", f"127.0.0.1:{cls.port}",
                "--unix-socket", "none",
                "--metrics-address", "none",
                "--capacity-bytes", "268435456",
            ],
            stdout=cls.log,
            stderr=subprocess.STDOUT,
        )
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.port}")
        cls.cache = v1.cache_grpc.CacheStub(cls.channel)
        cls.admin = v1.admin_grpc.AdminStub(cls.channel)
        deadline = time.monotonic() + 20
        last = None
        while time.monotonic() < deadline:
            if cls.proc.poll() is not None:
                raise RuntimeError(f"kvcached exited with {cls.proc.returncode}:\n{cls._log_text()}")
            try:
                if health_state(cls.channel) == 1:
                    cls.admin.GetServerInfo(v1.admin.GetServerInfoRequest(), timeout=2)
                    return
            except grpc.RpcError as e:
                last = e
            time.sleep(0.1)
        cls.proc.kill()
        raise RuntimeError(f"kvcached did not become SERVING in 20 s ({last}):\n{cls._log_text()}")

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.proc.send_signal(signal.SIGTERM)
        try:
            code = cls.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            cls.proc.kill()
            raise AssertionError("kvcached did not exit within 30 s of SIGTERM")
        log = cls._log_text()
        os.unlink(cls.log.name)
        if code != 0:
            raise AssertionError(f"kvcached exited with {code} after SIGTERM:\n{log}")

    @classmethod
    def _log_text(cls):
        cls.log.flush()
        with open(cls.log.name, errors="replace") as f:
            return f.read()[-4000:]

    # --- helpers ---------------------------------------------------------------------

    def register(self, model, **overrides):
        layout = dict(LAYOUT, **overrides)
        return self.cache.RegisterModel(
            v1.pb.RegisterModelRequest(
                model_id=model, layout=v1.pb.ModelLayout(dtype=v1.pb.DTYPE_FP16, **layout)
            ),
            timeout=5,
        )

    def append(self, model, tokens, kv, start_token=0, checksums=None, chunk=10000):
        """Appends with the XXH3-64 of each block the tokens hold (read from `kv`,
        however long it is), unless `checksums` gives the list to send instead."""
        if checksums is None:
            blocks = (len(tokens) - start_token) // BLOCK_TOKENS
            checksums = [XXH3(kv[b * BLOCK_BYTES : (b + 1) * BLOCK_BYTES]) for b in range(blocks)]
        header = v1.pb.AppendHeader(model_id=model, tokens=tokens, start_token=start_token)
        header.block_checksums.extend(checksums)

        def requests():
            yield v1.pb.AppendRequest(header=header)
            for off in range(0, len(kv), chunk):
                yield v1.pb.AppendRequest(kv_chunk=kv[off : off + chunk])

        return self.cache.Append(requests(), timeout=10)

    def lookup(self, model, tokens, **kw):
        return self.cache.Lookup(v1.pb.LookupRequest(model_id=model, tokens=tokens, **kw), timeout=5)

    def fetch(self, model, tokens=(), lease_id=0, max_chunk_bytes=4096):
        """Returns (bytes, matched_tokens) after checking every chunk's fields."""
        msgs = list(
            self.cache.Fetch(
                v1.pb.FetchRequest(
                    model_id=model, tokens=tokens, lease_id=lease_id, max_chunk_bytes=max_chunk_bytes
                ),
                timeout=10,
            )
        )
        out = bytearray()
        if not msgs:
            return bytes(out), 0
        matched = msgs[0].matched_tokens
        expect_block, expect_offset, checksum = 0, 0, None
        for m in msgs:
            self.assertEqual(m.matched_tokens, matched, "matched_tokens changes mid-stream")
            self.assertEqual(m.block_bytes, BLOCK_BYTES)
            self.assertLessEqual(len(m.data), max_chunk_bytes)
            self.assertEqual((m.block_index, m.offset), (expect_block, expect_offset), "gap or reorder")
            if m.offset == 0:
                checksum = m.block_checksum
            self.assertEqual(m.block_checksum, checksum, "block_checksum differs between chunks")
            out += m.data
            expect_offset += len(m.data)
            if expect_offset == BLOCK_BYTES:
                block = bytes(out[-BLOCK_BYTES:])
                self.assertEqual(XXH3(block), checksum, f"block {m.block_index}: not XXH3-64")
                expect_block, expect_offset = expect_block + 1, 0
        self.assertEqual(expect_offset, 0, "stream ended inside a block")
        self.assertEqual(len(out), matched // BLOCK_TOKENS * BLOCK_BYTES)
        return bytes(out), matched

    def assertCode(self, code, fn, *args, **kw):
        with self.assertRaises(grpc.RpcError) as cm:
            result = fn(*args, **kw)
            if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
                list(result)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        self.assertTrue(cm.exception.details(), "error without a message")
        return cm.exception.details()

    # --- tests -----------------------------------------------------------------------

    def test_register_model(self):
        r = self.register("py-register")
        self.assertTrue(r.created)
        self.assertEqual(r.block_bytes, BLOCK_BYTES)
        self.assertEqual(r.layout.block_tokens, BLOCK_TOKENS)
        again = self.register("py-register")
        self.assertFalse(again.created)
        self.assertEqual(again.block_bytes, BLOCK_BYTES)
        d = self.register("py-register-default", block_tokens=0)
        self.assertEqual(d.layout.block_tokens, 64)
        self.assertEqual(d.block_bytes, BLOCK_BYTES * 4)
        self.assertCode(grpc.StatusCode.ALREADY_EXISTS, self.register, "py-register", head_dim=128)

    def test_append_lookup_fetch_evict(self):
        model = "py-roundtrip"
        self.register(model)
        rng = random.Random(7)
        tokens = [rng.randrange(1 << 32) for _ in range(3 * BLOCK_TOKENS + 5)]
        kv = rng.randbytes(3 * BLOCK_BYTES)
        sums = [XXH3(kv[i * BLOCK_BYTES : (i + 1) * BLOCK_BYTES]) for i in range(3)]

        r = self.append(model, tokens, kv, checksums=sums)
        self.assertEqual((r.stored_blocks, r.deduplicated_blocks), (3, 0))
        self.assertEqual(r.stored_bytes, 3 * BLOCK_BYTES)
        self.assertEqual(r.cached_tokens, 3 * BLOCK_TOKENS)

        look = self.lookup(model, tokens)
        self.assertEqual(look.matched_tokens, 3 * BLOCK_TOKENS)
        self.assertEqual([b.index for b in look.blocks], [0, 1, 2])
        self.assertEqual(len({b.key for b in look.blocks}), 3)
        for b in look.blocks:
            self.assertEqual(b.bytes, BLOCK_BYTES)
            self.assertEqual(b.checksum, sums[b.index])

        data, matched = self.fetch(model, tokens)
        self.assertEqual(matched, 3 * BLOCK_TOKENS)
        self.assertEqual(data, kv, "fetched bytes differ from the appended ones")

        # The same KV again is deduplicated; more blocks extend the prefix.
        r = self.append(model, tokens, kv)
        self.assertEqual((r.stored_blocks, r.deduplicated_blocks), (0, 3))
        longer = tokens[: 3 * BLOCK_TOKENS] + [rng.randrange(1 << 32) for _ in range(2 * BLOCK_TOKENS)]
        more = rng.randbytes(2 * BLOCK_BYTES)
        r = self.append(model, longer, more, start_token=3 * BLOCK_TOKENS)
        self.assertEqual(r.stored_blocks, 2)
        self.assertEqual(r.cached_tokens, 5 * BLOCK_TOKENS)
        data, matched = self.fetch(model, longer, max_chunk_bytes=BLOCK_BYTES)
        self.assertEqual(matched, 5 * BLOCK_TOKENS)
        self.assertEqual(data, kv + more)

        # A sequence that diverges in block 1 matches block 0 only.
        other = tokens[:BLOCK_TOKENS] + [t ^ 1 for t in tokens[BLOCK_TOKENS:]]
        self.assertEqual(self.lookup(model, other).matched_tokens, BLOCK_TOKENS)
        data, matched = self.fetch(model, other)
        self.assertEqual((data, matched), (kv[:BLOCK_BYTES], BLOCK_TOKENS))

        # Evicting the 2-block prefix removes block 1 and every block below it.
        ev = self.cache.Evict(
            v1.pb.EvictRequest(
                model_id=model, prefix=v1.pb.PrefixTarget(tokens=tokens[: 2 * BLOCK_TOKENS])
            ),
            timeout=5,
        )
        self.assertEqual(ev.evicted_blocks, 4)
        self.assertEqual(ev.evicted_bytes, 4 * BLOCK_BYTES)
        self.assertEqual(self.lookup(model, longer).matched_tokens, BLOCK_TOKENS)
        ev = self.cache.Evict(v1.pb.EvictRequest(model_id=model, whole_model=True), timeout=5)
        self.assertEqual(ev.evicted_blocks, 1)
        self.assertEqual(self.lookup(model, longer).matched_tokens, 0)
        self.assertEqual(self.fetch(model, longer), (b"", 0))

    def test_lease(self):
        model = "py-lease"
        self.register(model)
        tokens = list(range(1000, 1000 + 2 * BLOCK_TOKENS))
        kv = random.Random(3).randbytes(2 * BLOCK_BYTES)
        self.append(model, tokens, kv)
        look = self.lookup(model, tokens, acquire_lease=True, lease_ttl_ms=60000)
        self.assertNotEqual(look.lease_id, 0)
        self.assertGreater(look.lease_expires_unix_ms, int(time.time() * 1000))
        data, matched = self.fetch(model, lease_id=look.lease_id)
        self.assertEqual((data, matched), (kv, 2 * BLOCK_TOKENS))
        rel = self.cache.ReleaseLease(v1.pb.ReleaseLeaseRequest(lease_id=look.lease_id), timeout=5)
        self.assertTrue(rel.released)
        rel = self.cache.ReleaseLease(v1.pb.ReleaseLeaseRequest(lease_id=look.lease_id), timeout=5)
        self.assertFalse(rel.released)
        # No lease when nothing matched.
        self.assertEqual(self.lookup(model, [1, 2, 3] * 20, acquire_lease=True).lease_id, 0)

    def test_bad_input(self):
        model = "py-bad"
        self.register(model)
        tokens = list(range(2 * BLOCK_TOKENS))
        kv = bytes(2 * BLOCK_BYTES)
        C = grpc.StatusCode
        self.assertCode(C.INVALID_ARGUMENT, self.append, model, tokens, kv[:-1])
        self.assertCode(C.INVALID_ARGUMENT, self.append, model, tokens, kv + b"x")
        self.assertCode(C.NOT_FOUND, self.append, "py-no-such-model", tokens, kv)
        self.assertCode(C.NOT_FOUND, self.lookup, "py-no-such-model", tokens)
        self.assertCode(C.NOT_FOUND, self.fetch, "py-no-such-model", tokens)
        self.assertCode(
            C.FAILED_PRECONDITION, self.append, model, tokens, kv[:BLOCK_BYTES],
            start_token=BLOCK_TOKENS,
        )
        self.assertCode(C.INVALID_ARGUMENT, self.append, model, tokens, kv[:BLOCK_BYTES], start_token=3)
        self.assertCode(C.DATA_LOSS, self.append, model, tokens, kv, checksums=[1, 2])
        # The default daemon refuses KV it cannot verify (security.require_block_checksums).
        details = self.assertCode(C.INVALID_ARGUMENT, self.append, model, tokens, kv, checksums=[])
        self.assertIn("block_checksums", details)
        self.assertIn("security.require_block_checksums", details)
        self.assertCode(C.INVALID_ARGUMENT, self.register, "py-bad-layout", head_dim=0)
        self.assertCode(C.INVALID_ARGUMENT, self.register, "py-bad-layout", block_tokens=24)
        self.assertCode(C.INVALID_ARGUMENT, self.register, "bad model id!")
        # Nothing of the rejected appends was stored.
        self.assertEqual(self.lookup(model, tokens).matched_tokens, 0)

    def test_importance_api(self):
        model = "py-importance"
        self.register(model)
        tokens = list(range(3000, 3000 + 2 * BLOCK_TOKENS))
        self.append(model, tokens, random.Random(5).randbytes(2 * BLOCK_BYTES))
        report = self.cache.ReportAttention(
            v1.pb.ReportAttentionRequest(
                model_id=model, tokens=tokens, attention=[0.5] * len(tokens) * 2, num_layers=2
            ),
            timeout=5,
        )
        self.assertEqual((report.matched_tokens, report.updated_tokens), (len(tokens),) * 2)
        C = grpc.StatusCode
        bad = v1.pb.ReportAttentionRequest(model_id=model, tokens=tokens, attention=[0.5] * 3)
        self.assertCode(C.INVALID_ARGUMENT, self.cache.ReportAttention, bad, timeout=5)
        admin = v1.admin
        changed = self.admin.UpdateModelPolicy(
            admin.UpdateModelPolicyRequest(
                model_id=model,
                mode=admin.COMPRESSION_MODE_PRUNE,
                weights=admin.ImportanceWeights(alpha=0.5, beta=0.4, gamma=0.1),
            ),
            timeout=5,
        )
        self.assertEqual(changed.previous_mode, admin.COMPRESSION_MODE_OFF)
        self.assertEqual(changed.policy.mode, admin.COMPRESSION_MODE_PRUNE)
        self.assertAlmostEqual(changed.policy.weights.alpha, 0.5, places=6)
        self.assertCode(
            C.INVALID_ARGUMENT,
            self.admin.UpdateModelPolicy,
            admin.UpdateModelPolicyRequest(model_id=model, target_mass=2.0),
            timeout=5,
        )
        stats = self.admin.GetStats(admin.GetStatsRequest(), timeout=5)
        mine = [m for m in stats.models if m.model_id == model][0]
        self.assertEqual(mine.attention_reports, 1)
        self.assertEqual(mine.policy.mode, admin.COMPRESSION_MODE_PRUNE)
        self.assertEqual(mine.full_tokens, len(tokens))
        # Nothing is compressed yet (blocks are not cold): fetches stay raw.
        data, matched = self.fetch(model, tokens)
        self.assertEqual(matched, len(tokens))

    def test_checksums_are_xxh3_and_never_skipped(self):
        self.assertEqual(XXH3(b""), 0x2D06800538D394C2)  # XXH3-64 of no bytes, seed 0
        with self.assertRaises(RuntimeError) as cm:
            kvcache_stubs.xxh3_64(names=("libkvcache-test-no-such-xxhash.so.0",))
        self.assertIn("libxxhash", str(cm.exception))

    def test_admin(self):
        self.register("py-admin")
        info = self.admin.GetServerInfo(v1.admin.GetServerInfoRequest(), timeout=5)
        self.assertTrue(info.version)
        self.assertIn(f"127.0.0.1:{self.port}", " ".join(info.listen_addresses))
        models = self.admin.ListModels(v1.admin.ListModelsRequest(), timeout=5).models
        mine = [m for m in models if m.model_id == "py-admin"]
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0].namespace, "default")
        self.assertEqual(mine[0].block_bytes, BLOCK_BYTES)
        stats = self.admin.GetStats(v1.admin.GetStatsRequest(), timeout=5)
        host = [t for t in stats.tiers if t.name == "host"]
        self.assertEqual(len(host), 1)
        self.assertEqual(host[0].capacity_bytes, 268435456)
        self.assertLessEqual(host[0].used_bytes, host[0].capacity_bytes)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvcached", required=True, help="path of the kvcached binary")
    parser.add_argument("--stubs", required=True, help="directory of the generated *_pb2*.py")
    ARGS, rest = parser.parse_known_args()
    _import_stubs(ARGS.stubs)
    global XXH3
    try:
        XXH3 = kvcache_stubs.xxh3_64()
    except RuntimeError as e:
        sys.exit(f"client_test.py: {e}")
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
