"""kvcache (the Python package) against the real kvcached: both data paths.

Every fetched byte is compared with a pattern that is a function of the block's
whole token prefix, so a block served for the wrong prefix would be caught.
"""

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import kvcache

LAYOUT = dict(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp16", block_tokens=16)
BLOCK_TOKENS = 16
BLOCK_BYTES = 2 * 2 * 2 * 16 * 64 * 2  # layers * (K, V) * heads * tokens * head_dim * fp16
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


class DLPackOnly:
    """An array seen only through DLPack, as a torch CPU tensor is."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def new_model(c):
    model = "py-" + uuid.uuid4().hex[:12]
    r = c.register_model(model, **LAYOUT)
    assert r.created and r.block_bytes == BLOCK_BYTES and r.block_tokens == BLOCK_TOKENS
    return model


def new_tokens(n):
    return np.random.default_rng().integers(0, 2**31, size=n, dtype=np.uint32)


def pattern(tokens, blocks):
    """KV bytes for `blocks` whole blocks of `tokens`, each a function of its whole prefix."""
    out = np.empty(blocks * BLOCK_BYTES, dtype=np.uint8)
    for b in range(blocks):
        seed = hashlib.sha256(np.asarray(tokens[: (b + 1) * BLOCK_TOKENS],
                                         dtype=np.uint32).tobytes()).digest()
        rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
        out[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES] = rng.integers(0, 256, BLOCK_BYTES,
                                                                   dtype=np.uint8)
    return out


def cache_state(c, model):
    """What the daemon holds for `model` (blocks, tokens, bytes) and its live leases."""
    stats = c.stats()
    mine = [m for m in stats["models"] if m["model_id"] == model]
    assert len(mine) == 1, stats["models"]
    m = mine[0]
    return int(m["blocks"]), int(m["tokens"]), int(m["bytes"]), int(stats["active_leases"])


def test_package_metadata():
    version = re.search(r"project\(kvcached VERSION ([0-9.]+)",
                        open(os.path.join(ROOT, "CMakeLists.txt")).read()).group(1)
    assert kvcache.__version__ == version
    assert issubclass(kvcache.NotFound, kvcache.Error)
    assert issubclass(kvcache.InvalidArgument, ValueError)
    e = kvcache.errors._from_status(8, "full")
    assert isinstance(e, kvcache.ResourceExhausted) and e.code == 8 and e.message == "full"
    assert str(e) == "RESOURCE_EXHAUSTED: full"
    assert kvcache.block_checksum(b"") == kvcache.block_checksum(np.zeros(0, np.uint8))
    pkg = os.path.dirname(kvcache.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    assert os.path.exists(os.path.join(pkg, "_kvcache.pyi"))


def test_data_path_is_the_one_asked_for(client, data_path):
    assert client.uses_shared_memory() == (data_path == "shm")
    assert client.data_path_stats().shared_memory == (data_path == "shm")
    assert client.server_info()["shm_socket"].endswith(".shm")
    assert isinstance(client.stats(), dict)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_round_trip_byte_exact(client, dtype):
    model = "py-" + uuid.uuid4().hex[:12]
    layout = dict(LAYOUT, dtype=dtype)
    r = client.register_model(model, **layout)
    elem = 4 if dtype == "fp32" else 2
    assert r.block_bytes == BLOCK_BYTES // 2 * elem
    tokens = new_tokens(5 * BLOCK_TOKENS + 7)  # the partial tail block is not cached
    kv = np.random.default_rng().integers(0, 256, 5 * r.block_bytes, dtype=np.uint8)
    a = client.append(model, tokens, kv)
    assert a.stored_blocks == 5 and a.cached_tokens == 80 and a.conflicting_blocks == 0
    hit = client.lookup(model, tokens)
    assert hit.matched_tokens == 80 and hit.lease_id == 0 and len(hit.blocks) == 5
    assert [b.checksum for b in hit.blocks] == [
        kvcache.block_checksum(kv[i * r.block_bytes:(i + 1) * r.block_bytes]) for i in range(5)]
    out = np.zeros_like(kv)
    f = client.fetch(model, tokens, out)
    assert f.matched_tokens == 80 and f.blocks == 5 and f.nbytes == kv.nbytes
    assert np.array_equal(out, kv)
    # Another dtype's view of the same memory, and a bytearray.
    out16 = np.zeros(kv.nbytes // 2, dtype=np.float16)
    client.fetch(model, tokens, out16)
    assert out16.tobytes() == kv.tobytes()
    ba = bytearray(kv.nbytes)
    client.fetch(model, list(map(int, tokens)), ba)
    assert bytes(ba) == kv.tobytes()
    # Through DLPack (torch CPU tensors): the output and, again, the input.
    out[:] = 0
    client.fetch(model, tokens, DLPackOnly(out))
    assert np.array_equal(out, kv)
    assert client.append(model, tokens, DLPackOnly(kv)).deduplicated_blocks == 5
    # The same bytes again are deduplicated.
    again = client.append(model, tokens.tolist(), kv.tobytes())
    assert again.deduplicated_blocks == 5 and again.stored_blocks == 0


def test_prefix_and_extension(client):
    model = new_model(client)
    tokens = new_tokens(8 * BLOCK_TOKENS)
    kv = pattern(tokens, 8)
    client.append(model, tokens[:3 * BLOCK_TOKENS], kv[:3 * BLOCK_BYTES])
    hit = client.lookup(model, tokens)
    assert hit.matched_tokens == 3 * BLOCK_TOKENS
    a = client.append(model, tokens, kv[hit.matched_tokens * BLOCK_BYTES // BLOCK_TOKENS:],
                      start_token=hit.matched_tokens)
    assert a.stored_blocks == 5 and a.cached_tokens == 8 * BLOCK_TOKENS
    out = np.empty(8 * BLOCK_BYTES, np.uint8)
    assert client.fetch(model, tokens, out).matched_tokens == 8 * BLOCK_TOKENS
    assert np.array_equal(out, kv)
    # A shorter prefix's fetch and a sequence sharing only the first blocks.
    other = np.concatenate([tokens[:2 * BLOCK_TOKENS], new_tokens(BLOCK_TOKENS)])
    out2 = np.empty(3 * BLOCK_BYTES, np.uint8)
    f = client.fetch(model, other, out2)
    assert f.matched_tokens == 2 * BLOCK_TOKENS and f.nbytes == 2 * BLOCK_BYTES
    assert np.array_equal(out2[:2 * BLOCK_BYTES], kv[:2 * BLOCK_BYTES])


def test_shared_region_zero_copy(daemon):
    with kvcache.Client(daemon["target"], data_path="shm") as c:
        model = new_model(c)
        tokens = new_tokens(6 * BLOCK_TOKENS)
        kv = pattern(tokens, 6)
        region = c.create_shared_region(2 * kv.nbytes)
        assert region.nbytes >= 2 * kv.nbytes
        arr = region.array
        assert arr.dtype == np.uint8 and arr.flags.writeable
        arr[:kv.nbytes] = kv
        assert c.append(model, tokens, arr[:kv.nbytes]).stored_blocks == 6
        dst = arr[kv.nbytes:2 * kv.nbytes]
        dst[:] = 0
        f = c.fetch(model, tokens, dst)
        assert f.nbytes == kv.nbytes and np.array_equal(dst, kv)
        # A typed view of the region (what an engine hands over) is the same memory.
        view = arr[kv.nbytes:2 * kv.nbytes].view(np.float16)
        view[:] = 0
        c.fetch(model, tokens, view)
        assert np.array_equal(arr[kv.nbytes:2 * kv.nbytes], kv)
    # The region outlives the client that made it.
    assert np.array_equal(arr[:kv.nbytes], kv)
    del region, arr, dst, view


def test_leases(client):
    model = new_model(client)
    tokens = new_tokens(4 * BLOCK_TOKENS)
    kv = pattern(tokens, 4)
    client.append(model, tokens, kv)
    hit = client.lookup(model, tokens, lease=True, lease_ttl=30)
    assert hit.lease_id != 0 and hit.matched_tokens == 4 * BLOCK_TOKENS
    assert hit.lease_expires is not None and hit.lease_expires > time.time()
    out = np.empty_like(kv)
    f = client.fetch_lease(model, hit.lease_id, out)
    assert f.matched_tokens == 4 * BLOCK_TOKENS and np.array_equal(out, kv)
    hit2 = client.lookup(model, tokens, lease=True)
    assert client.release_lease(hit2.lease_id) is True
    with pytest.raises(kvcache.NotFound):
        client.fetch_lease(model, hit2.lease_id, out)


def test_batch_lookup(client):
    model = new_model(client)
    tokens = new_tokens(2 * BLOCK_TOKENS)
    client.append(model, tokens, pattern(tokens, 2))
    res = client.batch_lookup(model, [tokens, new_tokens(BLOCK_TOKENS), tokens[:BLOCK_TOKENS]])
    assert [r.matched_tokens for r in res] == [32, 0, 16]


def test_bad_input_raises_typed_errors_and_changes_nothing(client, data_path):
    model = new_model(client)
    tokens = new_tokens(4 * BLOCK_TOKENS)
    kv = pattern(tokens, 4)
    client.append(model, tokens[:2 * BLOCK_TOKENS], kv[:2 * BLOCK_BYTES])
    before = client.lookup(model, tokens).matched_tokens
    assert before == 2 * BLOCK_TOKENS
    state_before = cache_state(client, model)
    assert state_before[0] == 2

    with pytest.raises(kvcache.InvalidArgument):  # not a whole number of blocks
        client.append(model, tokens, kv[:-1])
    with pytest.raises(kvcache.InvalidArgument):  # more bytes than blocks
        client.append(model, tokens, np.concatenate([kv, kv[:BLOCK_BYTES]]))
    with pytest.raises(kvcache.InvalidArgument):  # start_token not block-aligned
        client.append(model, tokens, kv[BLOCK_BYTES:], start_token=5)
    with pytest.raises(kvcache.FailedPrecondition):  # beyond the cached prefix
        client.append(model, tokens, kv[3 * BLOCK_BYTES:], start_token=3 * BLOCK_TOKENS)
    with pytest.raises(kvcache.NotFound):
        client.lookup("py-no-such-model", tokens)
    with pytest.raises(kvcache.NotFound):
        client.append("py-no-such-model", tokens, kv)
    with pytest.raises(kvcache.AlreadyExists):
        client.register_model(model, **dict(LAYOUT, head_dim=128))
    with pytest.raises(kvcache.InvalidArgument):
        client.register_model("py-bad-" + uuid.uuid4().hex[:8], **dict(LAYOUT, head_dim=0))
    with pytest.raises(kvcache.InvalidArgument):
        client.register_model("bad id with spaces", **LAYOUT)
    with pytest.raises(kvcache.InvalidArgument):
        client.lookup(model, [1, -2, 3])
    with pytest.raises(kvcache.InvalidArgument):
        client.lookup(model, [1, 2**32])
    small = np.full(BLOCK_BYTES, 7, np.uint8)  # one block for a two-block prefix
    with pytest.raises(kvcache.InvalidArgument):
        client.fetch(model, tokens, small)
    if data_path == "shm":
        assert (small == 7).all()  # nothing written
    with pytest.raises(TypeError):  # a read-only output
        client.fetch(model, tokens, bytes(4 * BLOCK_BYTES))
    with pytest.raises(TypeError):  # a non-contiguous output is never silently copied
        client.fetch(model, tokens, np.zeros(8 * BLOCK_BYTES, np.uint8)[::2])
    with pytest.raises(kvcache.NotFound):
        client.fetch_lease(model, 123456789, np.empty(BLOCK_BYTES, np.uint8))

    assert client.lookup(model, tokens).matched_tokens == before
    assert cache_state(client, model) == state_before
    out = np.empty(2 * BLOCK_BYTES, np.uint8)
    client.fetch(model, tokens, out)
    assert np.array_equal(out, kv[:2 * BLOCK_BYTES])


def test_evict_and_unregister(client):
    model = new_model(client)
    tokens = new_tokens(4 * BLOCK_TOKENS)
    client.append(model, tokens, pattern(tokens, 4))
    ev = client.evict_prefix(model, tokens[:2 * BLOCK_TOKENS])
    assert ev.evicted_blocks >= 1 and ev.evicted_bytes == ev.evicted_blocks * BLOCK_BYTES
    assert client.lookup(model, tokens).matched_tokens < 4 * BLOCK_TOKENS
    client.append(model, tokens, pattern(tokens, 4))
    assert client.evict_model(model).evicted_blocks == 4
    assert client.lookup(model, tokens).matched_tokens == 0
    client.unregister_model(model)
    with pytest.raises(kvcache.NotFound):
        client.unregister_model(model)


def test_threads_share_one_client(client):
    model = new_model(client)
    errors = []

    def worker():
        try:
            for _ in range(10):
                tokens = new_tokens(3 * BLOCK_TOKENS)
                kv = pattern(tokens, 3)
                client.append(model, tokens, kv)
                out = np.empty_like(kv)
                client.fetch(model, tokens, out)
                assert np.array_equal(out, kv)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_closed_client(daemon):
    c = kvcache.Client(daemon["target"])
    with c:
        assert not c.closed
    assert c.closed
    with pytest.raises(kvcache.FailedPrecondition):
        c.stats()
    c.close()  # idempotent


def test_unreachable_daemon_is_unavailable(tmp_path):
    with kvcache.Client("unix://" + str(tmp_path / "none.sock"), timeout=1,
                        max_attempts=1) as c:
        with pytest.raises(kvcache.Unavailable):
            c.lookup("m", [1, 2, 3])


WORKER = r"""
import sys, numpy as np, kvcache
target, data_path, model = sys.argv[1:4]
c = kvcache.Client(target, data_path=data_path)
bb = int(sys.argv[4])
tokens = np.arange(64 * 16, dtype=np.uint32) + 7
kv = np.random.default_rng(1).integers(0, 256, 64 * bb, dtype=np.uint8)
out = np.empty_like(kv)
print("ready", flush=True)
while True:
    c.append(model, tokens, kv)
    c.fetch(model, tokens, out)
    c.evict_model(model)
"""


def test_worker_killed_mid_call_leaves_daemon_serving(daemon, client, data_path):
    model = new_model(client)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, daemon["target"], data_path, model,
                               str(BLOCK_BYTES)], stdout=subprocess.PIPE)
             for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.5)  # they are deep in appends and fetches now
        for i, p in enumerate(procs):
            time.sleep(0.05 * i)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert daemon["proc"].poll() is None
    tokens = new_tokens(4 * BLOCK_TOKENS)
    kv = pattern(tokens, 4)
    client.append(model, tokens, kv)
    out = np.empty_like(kv)
    client.fetch(model, tokens, out)
    assert np.array_equal(out, kv)
    with kvcache.Client(daemon["target"], data_path=data_path) as fresh:
        assert fresh.lookup(model, tokens).matched_tokens == 4 * BLOCK_TOKENS


def test_calls_release_the_gil(tmp_path):
    """Python threads run while a call waits (here: for a daemon that is not there)."""
    c = kvcache.Client("unix://" + str(tmp_path / "none.sock"), timeout=2, max_attempts=1)
    failed = []

    def wait():
        try:
            c.wait_for_ready(1.5)
        except kvcache.Unavailable as e:
            failed.append(e)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.1)
    ticks = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        time.sleep(0.005)
        ticks += 1
    assert t.is_alive() and ticks >= 20  # this thread ran while the call was blocked
    t.join()
    assert len(failed) == 1
    c.close()


def test_stub_matches_the_extension():
    """Every class and method of _kvcache.pyi exists in the extension, and the other way round."""
    import ast

    from kvcache import _kvcache

    pkg = os.path.dirname(kvcache.__file__)
    tree = ast.parse(open(os.path.join(pkg, "_kvcache.pyi")).read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert hasattr(_kvcache, node.name), node.name
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_kvcache, node.name)
            stubbed = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            public = {n for n in dir(cls) if not n.startswith("_")}
            assert stubbed - set(dir(cls)) == set(), node.name
            assert public - stubbed == set(), node.name
