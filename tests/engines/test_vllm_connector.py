"""KvcacheConnector's worker side against the real daemon, with real torch tensors laid out
as vLLM's CPU paged cache, in the venv tests/engines/setup-vllm.sh makes (vLLM importable).

Run: KVCACHED=build/server/kvcached <venv>/bin/python -m pytest tests/engines/test_vllm_connector.py
(tests/engines/vllm_e2e.sh runs it before the engine runs.)

Covers what the end-to-end run cannot provoke: a fetch that comes back short (the blocks it
lacks are reported through get_block_ids_with_load_errors for vLLM to recompute), a load
that skips vLLM's local prefix, and a daemon that is down (every load a load error, no
exception, the breaker opens).
"""

import gc
import os
import subprocess
import tempfile
import time

import pytest
import torch

import kvcache
from kvcache.vllm._core import CircuitBreaker, ConnectorConfig, EngineIdentity, base_id, \
    key_suffix, model_id, register_shape
from kvcache.vllm.connector import KvcacheConnector, KvcacheConnectorMetadata, _Transfer

BS, LAYERS, HEADS, HEAD = 16, 3, 2, 8
IDENT = EngineIdentity(model="test/tiny", revision="", block_size=BS, dtype="bfloat16",
                       kv_cache_dtype="auto", layout="cpu_attn:test:BHNC", num_layers=LAYERS,
                       num_kv_heads=HEADS, head_size=HEAD,
                       block_bytes_per_layer=HEADS * BS * 2 * HEAD * 2, tp_rank=0, tp_size=1)
NUM_BLOCKS = 12


@pytest.fixture(scope="module")
def target():
    binary = os.environ.get("KVCACHED", "")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"no kvcached binary ($KVCACHED): {binary!r}")
    tmp = tempfile.mkdtemp(prefix="kvcache-vllm-")
    sock = os.path.join(tmp, "kvcached.sock")
    log = open(os.path.join(tmp, "kvcached.log"), "wb")
    proc = subprocess.Popen([binary, "--listen", "none", "--unix-socket", sock,
                             "--metrics-address", "none", "--capacity-bytes", str(64 << 20)],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock + ".shm"):
        assert proc.poll() is None and time.monotonic() < deadline, "kvcached did not start"
        time.sleep(0.05)
    yield "unix://" + sock
    for c in _made:  # the daemon drains open shared-memory connections before exiting
        c.shutdown()
        c._staging = c._kv_layers = None
        c.__dict__.pop("_region", None)
    _made.clear()
    gc.collect()
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


_made = []


def make_connector(target, threshold=3):
    """A worker-side connector on IDENT, without a VllmConfig (its constructor's job is
    deriving IDENT from one; the e2e run covers that)."""
    c = object.__new__(KvcacheConnector)
    c._cfg = ConnectorConfig.from_extra({"target": target, "timeout_s": 2.0,
                                         "failure_threshold": threshold, "cooldown_s": 60})
    c._is_worker = True
    c._breaker = CircuitBreaker(threshold, 60)
    c._client = None
    c._registered = set()
    c._identity = IDENT
    c._base = base_id(IDENT)
    c._register_args = register_shape(IDENT)
    c._block_size = BS
    c._max_blocks = 8
    c._load_errors = set()
    c._connector_metadata = None
    c.stats = {"lookups": 0, "hits": 0, "hit_tokens": 0, "loaded_tokens": 0,
               "saved_blocks": 0, "errors": 0, "load_s": 0.0, "save_s": 0.0}
    layers = [torch.randn(NUM_BLOCKS, HEADS, BS, 2 * HEAD, dtype=torch.bfloat16)
              for _ in range(LAYERS)]
    c._kv_layers = [t.view(NUM_BLOCKS, -1).view(torch.uint8) for t in layers]
    c._staging = c._make_staging(torch)
    _made.append(c)
    return c, layers


def run_step(c, transfers):
    c._connector_metadata = KvcacheConnectorMetadata(transfers=transfers)
    c.start_load_kv(None)
    c.wait_for_save()
    c._connector_metadata = None


PROMPT = list(range(1000, 1000 + 4 * BS + 5))


def test_save_then_load_into_other_blocks_and_short_loads(target):
    mid = key_suffix(cache_salt="roundtrip")
    c, layers = make_connector(target)
    assert hasattr(c, "_region")  # staging is a shared region: the daemon's one copy
    saved = [3, 5, 7]  # the prompt's first 3 blocks sit in vLLM blocks 3, 5, 7
    run_step(c, [_Transfer("r1", mid, PROMPT[:3 * BS], 0, tuple(saved), True)])
    assert c.stats["saved_blocks"] == 3 and c.stats["errors"] == 0
    want = [t[saved].clone() for t in layers]

    # A fresh worker loads them into blocks 1, 2, 4.
    d, dl = make_connector(target)
    run_step(d, [_Transfer("r2", mid, PROMPT[:3 * BS], 0, (1, 2, 4), False)])
    assert d.get_block_ids_with_load_errors() == set()
    for t, w in zip(dl, want):
        assert torch.equal(t[[1, 2, 4]], w)

    # vLLM had the first block itself: load blocks 1 and 2 of the prompt only, into 8, 9.
    run_step(d, [_Transfer("r3", mid, PROMPT[:3 * BS], 1, (8, 9), False)])
    assert d.get_block_ids_with_load_errors() == set()
    for t, w in zip(dl, want):
        assert torch.equal(t[[8, 9]], w[1:])

    # Asked for 4 blocks, the daemon holds 3 (as after an eviction): the 4th is a load error.
    before = dl[0][0].clone()
    run_step(d, [_Transfer("r4", mid, PROMPT[:4 * BS], 0, (10, 11, 6, 0), False)])
    assert d.get_block_ids_with_load_errors() == {0}
    assert d.get_block_ids_with_load_errors() == set()  # reported once
    assert torch.equal(dl[0][0], before)  # the missing block is left for vLLM to recompute
    for t, w in zip(dl, want):
        assert torch.equal(t[[10, 11, 6]], w)

    # Another salt (another identity) sees nothing: every block a load error.
    other = key_suffix(cache_salt="someone-else")
    run_step(d, [_Transfer("r5", other, PROMPT[:2 * BS], 0, (10, 11), False)])
    assert d.get_block_ids_with_load_errors() == {10, 11}


def test_save_skips_blocks_already_cached(target):
    mid = key_suffix(cache_salt="append-from")
    c, layers = make_connector(target)
    run_step(c, [_Transfer("a", mid, PROMPT[:2 * BS], 0, (1, 2), True)])
    run_step(c, [_Transfer("b", mid, PROMPT[:4 * BS], 2, (3, 4), True)])  # blocks 2, 3
    with kvcache.Client(target) as k:
        assert k.lookup(model_id(IDENT, cache_salt="append-from"), PROMPT).matched_tokens \
            == 4 * BS
    d, dl = make_connector(target)
    run_step(d, [_Transfer("c", mid, PROMPT[:4 * BS], 0, (5, 6, 7, 8), False)])
    assert d.get_block_ids_with_load_errors() == set()
    for t, s in zip(dl, layers):
        assert torch.equal(t[[5, 6, 7, 8]], s[[1, 2, 3, 4]])


def test_a_down_daemon_is_load_errors_and_skipped_saves_never_an_exception(tmp_path):
    c, layers = make_connector(f"unix://{tmp_path}/nobody.sock", threshold=2)
    mid = key_suffix()
    run_step(c, [_Transfer("x", mid, PROMPT[:2 * BS], 0, (1, 2), True)])  # skipped save
    run_step(c, [_Transfer("y", mid, PROMPT[:2 * BS], 0, (3, 4), False)])
    assert c.get_block_ids_with_load_errors() == {3, 4}
    assert c._breaker.state == "open" and c.stats["errors"] >= 2
    t0 = time.perf_counter()
    run_step(c, [_Transfer("z", mid, PROMPT[:2 * BS], 0, (5, 6), False)])  # no daemon call
    assert c.get_block_ids_with_load_errors() == {5, 6}
    assert time.perf_counter() - t0 < 0.05
    assert c.stats["saved_blocks"] == 0


def test_each_tensor_parallel_rank_keeps_its_own_heads(target):
    """The scheduler sends a key suffix; each worker stores under its own rank's base id."""
    import dataclasses
    r0, l0 = make_connector(target)
    r1, l1 = make_connector(target)
    r1._identity = dataclasses.replace(IDENT, tp_rank=1, tp_size=2)
    r1._base = base_id(r1._identity)
    r0._identity = dataclasses.replace(IDENT, tp_rank=0, tp_size=2)
    r0._base = base_id(r0._identity)
    sfx = key_suffix(cache_salt="tp")
    run_step(r0, [_Transfer("t", sfx, PROMPT[:BS], 0, (1,), True)])
    run_step(r1, [_Transfer("t", sfx, PROMPT[:BS], 0, (2,), True)])
    run_step(r0, [_Transfer("u", sfx, PROMPT[:BS], 0, (3,), False)])
    run_step(r1, [_Transfer("u", sfx, PROMPT[:BS], 0, (4,), False)])
    assert r0.get_block_ids_with_load_errors() == set() == r1.get_block_ids_with_load_errors()
    for a, b in zip(l0, l1):
        assert torch.equal(a[3], a[1]) and torch.equal(b[4], b[2])
        assert not torch.equal(a[3], b[2])  # rank 0 did not get rank 1's heads
