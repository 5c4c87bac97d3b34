"""The vLLM connector's pure parts (kvcache.vllm._core): no vLLM, no torch needed.

Cache identity (what makes KV from another engine a miss), the circuit breaker (daemon
trouble becomes misses, then one trial call after the cool-down), block mapping (which vLLM
blocks load and save), and the config checks. One test uses the real daemon: a model id is
accepted by kvcached and registers with exactly the vLLM block's byte size.
"""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from kvcache.vllm._core import (CircuitBreaker, ConnectorConfig, EngineIdentity, base_id,
                                external_tokens, key_suffix, load_plan, loadable_tokens,
                                model_id, register_shape, save_plan)

# SmolLM2-135M on vLLM's CPU backend: 30 layers, 3 KV heads, head 64, block 128, bf16:
# a layer's block is [3 heads, 128 tokens, 128 = K|V] bf16 = 98,304 bytes.
SMOL = EngineIdentity(model="/models/smollm2-135m-instruct", revision="", block_size=128,
                      dtype="bfloat16", kv_cache_dtype="auto", layout="cpu_attn:amx:BHNC",
                      num_layers=30, num_kv_heads=3, head_size=64,
                      block_bytes_per_layer=3 * 128 * 128 * 2, tp_rank=0, tp_size=1)


def test_importing_the_pure_parts_does_not_import_vllm():
    code = ("import sys, kvcache.vllm, kvcache.vllm._core; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    import kvcache.vllm as pkg
    assert set(pkg.__all__) == {"KvcacheConnector", "KvcacheConnectorMetadata"}
    with pytest.raises(AttributeError):
        pkg.NoSuchThing  # noqa: B018


def test_model_id_is_stable_and_readable():
    a = model_id(SMOL)
    assert a == model_id(dataclasses.replace(SMOL))
    assert a.startswith("vllm/smollm2-135m-instruct/tp0of1/")
    assert len(a.rsplit("/", 1)[1]) == 16


@pytest.mark.parametrize("field,value", [
    ("model", "/models/other"), ("revision", "abc"), ("block_size", 64),
    ("dtype", "float16"), ("kv_cache_dtype", "fp8"), ("layout", "cpu_attn:vec:BHNC"),
    ("num_layers", 29), ("num_kv_heads", 1), ("head_size", 128),
    ("block_bytes_per_layer", 1), ("tp_rank", 1), ("tp_size", 2)])
def test_every_identity_field_changes_the_key(field, value):
    other = dataclasses.replace(SMOL, **{field: value})
    assert model_id(other) != model_id(SMOL)


def test_salt_and_lora_separate_keys_without_leaking_the_salt():
    plain = model_id(SMOL)
    salted = model_id(SMOL, cache_salt="tenant-secret")
    assert salted != plain and salted.startswith(plain + "/salt-")
    assert "tenant-secret" not in salted
    assert model_id(SMOL, cache_salt="a") != model_id(SMOL, cache_salt="b")
    lora = model_id(SMOL, lora_name="adapter")
    assert lora != plain and lora != model_id(SMOL, lora_name="adapter2")
    assert model_id(SMOL, cache_salt="") == plain  # no salt = no suffix


def test_workers_compose_the_id_from_their_own_base_and_the_schedulers_suffix():
    sfx = key_suffix(cache_salt="s", lora_name="l")
    assert model_id(SMOL, cache_salt="s", lora_name="l") == base_id(SMOL) + sfx
    rank1 = dataclasses.replace(SMOL, tp_rank=1, tp_size=2)
    rank0 = dataclasses.replace(SMOL, tp_size=2)
    assert base_id(rank1) + sfx != base_id(rank0) + sfx
    assert key_suffix() == ""


def test_register_shape_matches_the_vllm_block_bytes():
    args = register_shape(SMOL)
    assert args == dict(num_layers=30, num_kv_heads=3, head_dim=64, dtype="bf16",
                        block_tokens=128)
    # kvcached's block_bytes = layers * 2 * heads * tokens * head_dim * element size.
    assert 30 * 2 * 3 * 128 * 64 * 2 == SMOL.block_bytes() == 30 * SMOL.block_bytes_per_layer
    fp32 = dataclasses.replace(SMOL, dtype="float32", block_bytes_per_layer=3 * 128 * 128 * 4)
    assert register_shape(fp32)["dtype"] == "fp32"
    fp16 = dataclasses.replace(SMOL, dtype="float16")
    assert register_shape(fp16)["dtype"] == "fp16"
    with pytest.raises(ValueError):
        register_shape(dataclasses.replace(SMOL, block_bytes_per_layer=12345))


def test_loadable_tokens_are_whole_blocks_and_never_the_last_token():
    assert loadable_tokens(2008, 1920, 128) == 1920
    assert loadable_tokens(2008, 2048, 128) == 1920  # capped at whole blocks of prompt[:-1]
    assert loadable_tokens(1921, 1920, 128) == 1920
    assert loadable_tokens(1920, 1920, 128) == 1792  # the last token is always computed
    assert loadable_tokens(1000, 200, 128) == 128
    assert loadable_tokens(1, 128, 128) == 0
    assert loadable_tokens(0, 0, 128) == 0


def test_external_tokens_beyond_the_local_hit_and_the_admission_threshold():
    assert external_tokens(2008, 1920, 0, 128, 0) == 1920
    assert external_tokens(2008, 1920, 512, 128, 0) == 1408  # vLLM had 4 blocks itself
    assert external_tokens(2008, 1920, 1920, 128, 0) == 0
    assert external_tokens(2008, 256, 512, 128, 0) == 0  # local hit longer than ours
    assert external_tokens(2008, 256, 0, 128, 512) == 0  # below the threshold: recompute
    assert external_tokens(2008, 640, 0, 128, 512) == 640


def test_load_plan_skips_the_local_prefix():
    ids = [7, 3, 9, 4, 8, 1]
    p = load_plan(ids, 0, 512, 128)
    assert (p.first_block, p.block_ids, p.tokens(128)) == (0, (7, 3, 9, 4), 512)
    p = load_plan(ids, 256, 384, 128)
    assert (p.first_block, p.block_ids, p.tokens(128)) == (2, (9, 4, 8), 640)
    with pytest.raises(ValueError):
        load_plan(ids, 100, 128, 128)
    with pytest.raises(ValueError):
        load_plan(ids, 0, 128 * 7, 128)


def test_save_plan_sends_only_new_whole_prompt_blocks():
    ids = list(range(100, 117))  # 17 blocks allocated (prompt + room for output)
    p = save_plan(ids, 2008, 2008, 0, 128)  # 15 whole blocks in 2008 tokens
    assert (p.first_block, len(p.block_ids), p.tokens(128)) == (0, 15, 1920)
    p = save_plan(ids, 2008, 2008, 1024, 128)  # kvcached has 8 blocks already
    assert (p.first_block, p.block_ids[0], p.tokens(128)) == (8, 108, 1920)
    assert save_plan(ids, 2008, 2008, 1920, 128) is None  # nothing new
    assert save_plan(ids, 100, 100, 0, 128) is None  # under one block
    p = save_plan(ids, 2008, 1000, 0, 128)  # only what is computed so far
    assert p.tokens(128) == 896
    assert save_plan(ids[:3], 2008, 2008, 0, 128).tokens(128) == 384  # not past the blocks


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_breaker_opens_after_consecutive_failures_and_half_opens_after_cooldown():
    clock = FakeClock()
    b = CircuitBreaker(failure_threshold=3, cooldown_s=5.0, clock=clock)
    assert b.state == "closed" and b.allow()
    b.record_failure()
    b.record_failure()
    b.record_success()  # a success resets the count
    b.record_failure()
    b.record_failure()
    assert b.allow() and b.state == "closed"
    b.record_failure()  # third in a row
    assert b.state == "open" and not b.allow() and b.trips == 1
    clock.t += 4.9
    assert not b.allow()
    clock.t += 0.2
    assert b.state == "half-open"
    assert b.allow()  # one trial call
    assert not b.allow()  # and only one
    b.record_failure()  # the trial failed: open again for a full cool-down
    assert b.state == "open" and not b.allow() and b.trips == 1
    clock.t += 5.0
    assert b.allow()
    b.record_success()
    assert b.state == "closed" and b.allow()


def test_breaker_rejects_bad_settings():
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError):
        CircuitBreaker(cooldown_s=-1)


def test_config_from_extra_validates():
    cfg = ConnectorConfig.from_extra({"target": "unix:///x.sock", "timeout_s": 1,
                                      "min_load_tokens": "256"})
    assert (cfg.target, cfg.timeout_s, cfg.min_load_tokens) == ("unix:///x.sock", 1.0, 256)
    assert ConnectorConfig.from_extra(None) == ConnectorConfig()
    with pytest.raises(ValueError, match="unknown"):
        ConnectorConfig.from_extra({"targte": "x"})
    with pytest.raises(ValueError):
        ConnectorConfig.from_extra({"timeout_s": 0})
    with pytest.raises(ValueError):
        ConnectorConfig.from_extra({"data_path": "carrier-pigeon"})
    with pytest.raises(ValueError):
        ConnectorConfig.from_extra({"max_attempts": 0})
    assert ConnectorConfig().max_attempts == 1  # a down daemon: one failed connect, a miss


def test_model_id_and_shape_are_accepted_by_kvcached(daemon):
    import kvcache
    with kvcache.Client(daemon["target"]) as c:
        mid = model_id(SMOL, cache_salt="s")
        info = c.register_model(mid, **register_shape(SMOL))
        assert info.block_bytes == SMOL.block_bytes()
        prompt = np.arange(256, dtype=np.uint32)
        kv = np.random.default_rng(0).integers(0, 255, 2 * info.block_bytes, dtype=np.uint8)
        c.append(mid, prompt, kv)
        out = np.zeros_like(kv)
        assert c.fetch(mid, prompt, out).matched_tokens == 256
        assert np.array_equal(out, kv)
        # Another identity (here: the unsalted one) does not see these blocks.
        other = model_id(SMOL)
        c.register_model(other, **register_shape(SMOL))
        assert c.lookup(other, prompt).matched_tokens == 0
