"""kvcache.llama_cpp against the real engine and a real kvcached (run by llama_cpp_e2e.sh).

Needs the llama-cpp venv (tests/engines/setup-llama-cpp.sh): KVCACHED names the daemon
binary, LLAMA_MODEL the GGUF file.
"""

import os
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import kvcache
import llama_cpp
from llama_cpp import Llama
from kvcache.llama_cpp import KvcacheLlamaCache
from kvcache.llama_cpp import _state

MODEL = os.environ.get("LLAMA_MODEL", "")
T = 16


@pytest.fixture()
def daemon():
    binary = os.environ.get("KVCACHED", "")
    assert binary and os.access(binary, os.X_OK), "set KVCACHED to the kvcached binary"
    tmp = tempfile.mkdtemp(prefix="kvc-")
    sock = os.path.join(tmp, "k.sock")
    log = open(os.path.join(tmp, "kvcached.log"), "wb")
    proc = subprocess.Popen([binary, "--listen", "none", "--unix-socket", sock,
                             "--metrics-address", "none", "--capacity-bytes", str(512 << 20)],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(sock + ".shm"):
            break
        time.sleep(0.05)
    yield {"target": "unix://" + sock, "proc": proc}
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def make_llm(**kw):
    assert MODEL and os.path.exists(MODEL), "set LLAMA_MODEL to the GGUF file"
    return Llama(model_path=MODEL, n_ctx=1024, n_threads=os.cpu_count(), seed=0,
                 verbose=False, **kw)


def prompt(llm, n=200, suffix="What is next?", what="ships"):
    text = " ".join(f"Line {i}: the keeper counts the {what} in the bay." for i in range(60))
    return llm.tokenize(text.encode())[:n] + llm.tokenize((" " + suffix).encode(), add_bos=False)


def seq_kv(llm, n_tokens):
    """The context's KV of positions 0..n_tokens-1 in kvcached's layout (via a state)."""
    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_get_size(ctx)
    buf = (llama_cpp.ctypes.c_uint8 * int(size))()
    n = llama_cpp.llama_state_get_data(ctx, buf, size)
    st = _state.parse_state(memoryview(buf)[:n])
    heads = llama_cpp.llama_model_n_head_kv(llm.model)
    return _state.to_blocks(st, heads, T, 0, n_tokens // T)


def test_a_second_process_loads_the_exact_kv_and_answers_the_same(daemon):
    a = make_llm()
    ca = KvcacheLlamaCache(a, daemon["target"], block_tokens=T)
    a.set_cache(ca)
    p = prompt(a)
    out_a = a.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert ca.counters.saved_blocks >= len(p) // T  # prompt and completion, whole blocks
    kv_a = seq_kv(a, len(p) // T * T)

    b = make_llm()
    cb = KvcacheLlamaCache(b, daemon["target"], block_tokens=T)
    assert cb.model_id == ca.model_id
    b.set_cache(cb)
    out_b = b.create_completion(p, max_tokens=8, temperature=0.0)["choices"][0]["text"]
    assert cb.counters.hits == 1 and cb.counters.hit_tokens == (len(p) - 1) // T * T
    assert out_b == out_a
    # B's context holds, for the loaded positions, exactly the bytes A computed.
    n = cb.counters.hit_tokens
    np.testing.assert_array_equal(seq_kv(b, n), kv_a[:len(seq_kv(b, n))])


def test_a_different_salt_or_kv_type_never_sees_the_kv(daemon):
    a = make_llm()
    a.set_cache(KvcacheLlamaCache(a, daemon["target"], block_tokens=T))
    p = prompt(a)
    a.create_completion(p, max_tokens=2, temperature=0.0)

    salted = make_llm()
    cs = KvcacheLlamaCache(salted, daemon["target"], block_tokens=T, salt="tenant-b")
    assert p not in cs
    f32 = make_llm(type_k=0, type_v=0)  # GGML_TYPE_F32 KV: another key, never fp16 bytes
    cf = KvcacheLlamaCache(f32, daemon["target"], block_tokens=T)
    assert cf.model_id != cs.model_id and p not in cf


def test_a_quantized_kv_cache_disables_the_cache_without_breaking_the_engine(daemon):
    llm = make_llm(type_k=8, type_v=8, flash_attn=True)  # Q8_0 KV (needs flash attention)
    cache = KvcacheLlamaCache(llm, daemon["target"], block_tokens=T)
    assert "not F32/F16/BF16" in cache.disabled_reason
    llm.set_cache(cache)
    text = llm.create_completion(prompt(llm), max_tokens=4, temperature=0.0)["choices"][0]["text"]
    assert isinstance(text, str) and cache.counters.hits == 0


def test_a_daemon_killed_mid_run_is_a_miss_not_an_exception(daemon):
    llm = make_llm()
    cache = KvcacheLlamaCache(llm, daemon["target"], block_tokens=T, timeout=1.0)
    llm.set_cache(cache)
    p = prompt(llm)
    first = llm.create_completion(p, max_tokens=4, temperature=0.0)["choices"][0]["text"]
    daemon["proc"].kill()
    daemon["proc"].wait()
    llm.reset()
    again = llm.create_completion(p, max_tokens=4, temperature=0.0)["choices"][0]["text"]
    assert again == first
    assert cache.counters.errors >= 1 and cache.counters.hits == 0


def test_a_flash_attention_context_loads_kv_saved_without_it(daemon):
    """The stored layout does not depend on V's transposition."""
    a = make_llm(flash_attn=False)
    ca = KvcacheLlamaCache(a, daemon["target"], block_tokens=T)
    b = make_llm(flash_attn=True)
    cb = KvcacheLlamaCache(b, daemon["target"], block_tokens=T)
    assert ca._layout.v_trans and not cb._layout.v_trans  # llama.cpp transposes V without it
    assert ca.model_id == cb.model_id
    a.set_cache(ca)
    b.set_cache(cb)
    p = prompt(a)
    a.create_completion(p, max_tokens=2, temperature=0.0)
    b.create_completion(p, max_tokens=2, temperature=0.0)
    assert cb.counters.hits == 1
    n = cb.counters.hit_tokens
    np.testing.assert_array_equal(seq_kv(b, n), seq_kv(a, n))


def test_a_state_still_held_is_never_overwritten(daemon):
    """The cache reuses its state buffer only once the state written into it is gone."""
    llm = make_llm()
    cache = KvcacheLlamaCache(llm, daemon["target"], block_tokens=T)
    llm.set_cache(cache)
    p1, p2 = prompt(llm), prompt(llm, what="gulls")
    for p in (p1, p2):
        llm.reset()
        llm.create_completion(p, max_tokens=2, temperature=0.0)
    llm.reset()
    s1 = cache[p1]
    kept = bytes(s1.llama_state)
    s2 = cache[p2]
    assert bytes(s1.llama_state) == kept and bytes(s2.llama_state) != kept
    second = bytes(s2.llama_state)
    del s1
    s3 = cache[p1]  # written into s1's buffer
    assert bytes(s3.llama_state) == kept and bytes(s2.llama_state) == second


def test_a_prompt_too_short_to_load_does_not_use_up_the_breakers_trial_call(daemon):
    """After the cooldown one trial call is let through; a lookup that never reaches the
    daemon must leave it for the next one, or the cache would stay off for good."""
    llm = make_llm()
    cache = KvcacheLlamaCache(llm, daemon["target"], block_tokens=T, failure_threshold=1,
                              cooldown_s=0.0, timeout=1.0)
    llm.set_cache(cache)
    daemon["proc"].kill()
    daemon["proc"].wait()
    llm.create_completion(prompt(llm), max_tokens=2, temperature=0.0)  # fails: breaker opens
    assert cache.counters.errors >= 1 and cache._breaker.state == "half-open"
    with pytest.raises(KeyError):
        cache[[1, 2, 3]]  # shorter than a block: answered without the daemon
    assert [1, 2, 3] not in cache
    assert cache._breaker.allow()  # the trial call is still there
