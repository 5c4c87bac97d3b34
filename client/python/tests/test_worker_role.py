"""A worker-role principal, with authentication on, can make every call the engine
integrations make (kvcache.vllm's scheduler and worker, kvcache.llama_cpp), on both data
paths, and no more: another tenant's namespace stays closed.

The calls below are the integrations' own, in their order: register the model, look up a
prompt, fetch into a shared region (the staging buffer), append the blocks past the hit
with start_token, and read stats (kvcache.llama_cpp checks the model's shape there).
"""

import json
import os
import signal
import subprocess
import tempfile
import time
import uuid

import numpy as np
import pytest

import kvcache

from test_client import BLOCK_BYTES, BLOCK_TOKENS, LAYOUT, new_tokens, pattern

ACME = "acme-worker-token-0123456789"
GLOBEX = "globex-worker-token-0123456789"
READER = "acme-reader-token-0123456789"


@pytest.fixture(scope="module")
def auth_daemon(request):
    binary = request.config.getoption("--kvcached")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"no kvcached binary (--kvcached or $KVCACHED): {binary!r}")
    tmp = tempfile.mkdtemp(prefix="kvcache-py-auth-")
    principals = os.path.join(tmp, "principals.json")
    with open(principals, "w") as f:
        json.dump({"principals": [
            {"name": "acme-engine", "tenant": "acme", "role": "worker", "token": ACME},
            {"name": "globex-engine", "tenant": "globex", "role": "worker", "token": GLOBEX},
            {"name": "acme-monitor", "tenant": "acme", "role": "reader", "token": READER},
        ]}, f)
    os.chmod(principals, 0o600)
    sock = os.path.join(tmp, "kvcached.sock")
    log_path = os.path.join(tmp, "kvcached.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "--listen", "none", "--unix-socket", sock, "--metrics-address", "none",
             "--capacity-bytes", str(64 << 20), "--principals-file", principals,
             "--secret-file", os.path.join(tmp, "secret")],
            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (os.path.exists(sock) and os.path.exists(sock + ".shm")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("kvcached did not start:\n" + open(log_path).read())
        time.sleep(0.05)
    yield "unix://" + sock
    assert proc.poll() is None, "kvcached died during the tests:\n" + open(log_path).read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, open(log_path).read()


@pytest.mark.parametrize("data_path", ["grpc", "shm"])
def test_worker_makes_every_engine_call(auth_daemon, data_path):
    with kvcache.Client(auth_daemon, namespace="acme", token=ACME, data_path=data_path,
                        timeout=20) as c:
        c.wait_for_ready(10)
        assert c.uses_shared_memory() == (data_path == "shm")
        me = c.who_am_i()
        assert me["principal"] == "acme-engine" and me["role"] == "worker", me
        model = "engine-" + uuid.uuid4().hex[:8]
        assert c.register_model(model, **LAYOUT).created
        tokens = new_tokens(6 * BLOCK_TOKENS + 3)
        kv = pattern(tokens, 6)
        # Process A: a miss, then the save of the whole prompt.
        assert c.lookup(model, tokens).matched_tokens == 0
        assert c.append(model, tokens[:2 * BLOCK_TOKENS], kv[:2 * BLOCK_BYTES]).stored_blocks == 2
        # The blocks past what is cached, as the integrations save them.
        a = c.append(model, tokens, kv[2 * BLOCK_BYTES:], start_token=2 * BLOCK_TOKENS)
        assert a.stored_blocks == 4 and a.cached_tokens == 6 * BLOCK_TOKENS
        # Process B: the lookup, then the fetch into the staging region.
        assert c.lookup(model, tokens).matched_tokens == 6 * BLOCK_TOKENS
        if data_path == "shm":
            staging = c.create_shared_region(6 * BLOCK_BYTES).array[:6 * BLOCK_BYTES]
        else:
            staging = np.zeros(6 * BLOCK_BYTES, np.uint8)
        f = c.fetch(model, tokens, staging)
        assert f.blocks == 6 and np.array_equal(staging, kv)
        mine = [m for m in c.stats()["models"] if m["model_id"] == model]
        assert len(mine) == 1 and int(mine[0]["blocks"]) == 6


@pytest.mark.parametrize("data_path", ["grpc", "shm"])
def test_worker_stays_in_its_tenant(auth_daemon, data_path):
    model = "shared-name-" + uuid.uuid4().hex[:8]
    tokens = new_tokens(2 * BLOCK_TOKENS)
    kv = pattern(tokens, 2)
    with kvcache.Client(auth_daemon, namespace="acme", token=ACME, data_path=data_path,
                        timeout=20) as acme:
        acme.register_model(model, **LAYOUT)
        assert acme.append(model, tokens, kv).stored_blocks == 2
    with kvcache.Client(auth_daemon, namespace="globex", token=GLOBEX, data_path=data_path,
                        timeout=20) as globex:
        # The same model name in its own namespace sees nothing of acme's.
        globex.register_model(model, **LAYOUT)
        assert globex.lookup(model, tokens).matched_tokens == 0
        out = np.zeros_like(kv)
        assert globex.fetch(model, tokens, out).blocks == 0 and not out.any()
    with kvcache.Client(auth_daemon, namespace="acme", token=GLOBEX, data_path=data_path,
                        timeout=20) as intruder:
        with pytest.raises(kvcache.PermissionDenied):
            intruder.lookup(model, tokens)
        with pytest.raises(kvcache.PermissionDenied):
            intruder.fetch(model, tokens, np.zeros_like(kv))
        with pytest.raises(kvcache.PermissionDenied):
            intruder.append(model, tokens, kv)
    # What the worker may not do is refused by role, and changes nothing.
    with kvcache.Client(auth_daemon, namespace="acme", token=ACME, timeout=20) as acme:
        with pytest.raises(kvcache.PermissionDenied):
            acme.unregister_model(model)
        assert acme.lookup(model, tokens).matched_tokens == 2 * BLOCK_TOKENS


def test_reader_and_strangers_cannot_touch_kv(auth_daemon):
    model = "engine-" + uuid.uuid4().hex[:8]
    tokens = new_tokens(BLOCK_TOKENS)
    with kvcache.Client(auth_daemon, namespace="acme", token=READER, timeout=20) as reader:
        assert reader.who_am_i()["role"] == "reader"
        assert isinstance(reader.stats(), dict)
        with pytest.raises(kvcache.PermissionDenied):
            reader.register_model(model, **LAYOUT)
    with kvcache.Client(auth_daemon, namespace="acme", token="not-a-known-token-at-all",
                        data_path="grpc", timeout=20) as stranger:
        with pytest.raises(kvcache.Unauthenticated):
            stranger.lookup(model, tokens)
