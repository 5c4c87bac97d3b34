"""KvcacheLlamaCache: llama-cpp-python's prompt cache (``Llama.set_cache``) backed by kvcached."""

from __future__ import annotations

import logging
import os
import time
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

import llama_cpp
from llama_cpp.llama import Llama, LlamaState
from llama_cpp.llama_cache import BaseLlamaCache

from .. import Client, Error, FailedPrecondition, block_checksum
from ..breaker import CircuitBreaker
from . import _state

log = logging.getLogger("kvcache.llama_cpp")

#: Bump when the meaning of the stored bytes changes for the same identity.
KEY_FORMAT_VERSION = 1
#: llama-cpp-python releases whose state format this module was checked against.
SUPPORTED = ("0.3.",)


@dataclass
class CacheCounters:
    """What the cache did, for logs and tests (not thread-safe; llama.cpp is one thread)."""
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    skipped_local: int = 0  #: lookups the Llama's own context already covered as far
    saves: int = 0
    saved_blocks: int = 0
    errors: int = 0
    last_load_s: float = 0.0
    last_save_s: float = 0.0


class KvcacheLlamaCache(BaseLlamaCache):
    """Prefix KV of a llama.cpp model shared through kvcached, block by block.

    ``llm.set_cache(KvcacheLlamaCache(llm, "unix:///tmp/kvcached.sock"))``: after each
    completion llama-cpp-python hands the context's state over; the KV of its whole
    ``block_tokens`` blocks goes to kvcached (blocks already there are not sent again), laid
    out as kvcached's canonical blocks. Before a completion the longest cached whole-block
    prefix of the prompt (short of its last token, whose logits the engine must compute) is
    fetched and handed back as a state holding just that KV, so any process with the same
    model reuses any prefix any other process computed. The logits a saved state carries
    (``n_batch x n_vocab`` floats, ~100 MB for a 49K vocabulary) are never stored.

    A daemon error or timeout is a miss (or a skipped save), never an exception into the
    engine; after ``failure_threshold`` failures in a row the cache stops calling the daemon
    for ``cooldown_s``. A context whose KV this module cannot lay out (a quantized KV cache,
    a recurrent or SWA model, M-RoPE) is found at construction: the cache then only misses,
    and says why in :attr:`disabled_reason`.

    The key is the model (file size and a sample of its bytes, architecture, layer and head
    shapes), the KV element type, RoPE settings, LoRA adapter, and ``salt`` (a namespace of
    your own); contexts that differ in any of them never see each other's KV.
    """

    def __init__(self, llm: Llama, client, *, block_tokens: int = 16, min_hit_tokens: int = 16,
                 salt: str = "", timeout: float = 2.0, failure_threshold: int = 3,
                 cooldown_s: float = 5.0, namespace: str = "", token: str = "",
                 capacity_bytes: int = 0) -> None:
        """
        Args:
            llm: the Llama this cache serves (its context is probed once, here).
            client: a :class:`kvcache.Client`, or a target string to make one from.
            block_tokens: tokens per kvcached block; hits are whole blocks.
            min_hit_tokens: shorter hits are not loaded (recomputing them costs less).
            salt: separates caches of the same model (e.g. per tenant or prompt format).
            timeout, failure_threshold, cooldown_s: daemon deadline and circuit breaker.
            namespace, token: for a client made from a target string.
            capacity_bytes: unused (kvcached's capacity is the daemon's); kept for the
                BaseLlamaCache signature.
        """
        super().__init__(capacity_bytes)
        if block_tokens < 1 or min_hit_tokens < 0:
            raise ValueError("KvcacheLlamaCache: block_tokens >= 1 and min_hit_tokens >= 0")
        if not llama_cpp.__version__.startswith(SUPPORTED):
            log.warning("kvcache.llama_cpp: llama-cpp-python %s is not one of the checked "
                        "releases %s; the state is still parsed strictly",
                        llama_cpp.__version__, SUPPORTED)
        self._llm = llm
        self._owns_client = isinstance(client, str)
        self._client = (Client(client, namespace=namespace, timeout=timeout, token=token)
                        if self._owns_client else client)
        self.block_tokens = block_tokens
        self.min_hit_tokens = max(min_hit_tokens, 1)
        self._breaker = CircuitBreaker(failure_threshold, cooldown_s)
        self.counters = CacheCounters()
        self.disabled_reason = ""
        self.model_id = ""
        self._registered = False
        self._region = None  # a shared region the daemon fetches into (same host)
        self._region_failed = False
        # The buffer the last state was written into, reused once that state is gone (Llama
        # loads a state at once and drops it); a state still referenced is never overwritten.
        self._state_buffer: Optional[np.ndarray] = None
        self._state_owner: Optional[weakref.ref] = None
        self._kv_heads = llama_cpp.llama_model_n_head_kv(llm.model)
        try:
            self._layout = self._probe_layout()
        except _state.UnsupportedState as e:
            self._layout = None
            self.disabled_reason = str(e)
            log.warning("kvcache.llama_cpp: disabled, every lookup will miss: %s", e)
            return
        self.model_id = self._model_id(salt)

    # --- BaseLlamaCache -----------------------------------------------------------

    @property
    def cache_size(self) -> int:
        """Bytes kvcached holds for this model (0 when unknown or unreachable)."""
        if not self.model_id or not self._breaker.allow():
            return 0
        try:
            for m in self._client.stats().get("models", []):
                if m.get("model_id") == self.model_id:
                    self._breaker.record_success()
                    return int(m.get("bytes", 0))
            self._breaker.record_success()
        except Error:
            self._breaker.record_failure()
        return 0

    def __contains__(self, key: Sequence[int]) -> bool:
        n = self._loadable(key)
        if n < self.min_hit_tokens or not self._may_call_daemon():
            return False
        try:
            hit = self._client.lookup(self.model_id, _tokens(key)[:n]).matched_tokens
            self._breaker.record_success()
        except Error as e:
            self._failed("lookup", e)
            return False
        return hit >= self.min_hit_tokens

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        """A state holding the longest cached whole-block prefix of ``key``; KeyError if none
        is worth loading (shorter than ``min_hit_tokens``, or no longer than what the Llama's
        own context already holds of ``key``)."""
        started = time.perf_counter()
        self.counters.lookups += 1
        n = self._loadable(key)
        if n < self.min_hit_tokens or not self._may_call_daemon():
            raise KeyError("kvcache.llama_cpp: miss")
        tokens = _tokens(key)[:n]
        local = Llama.longest_token_prefix(self._llm._input_ids.tolist(), key)
        try:
            hit = self._client.lookup(self.model_id, tokens).matched_tokens
            if hit < self.min_hit_tokens or hit <= local:
                self._breaker.record_success()
                self.counters.skipped_local += hit > 0
                raise KeyError("kvcache.llama_cpp: miss")
            out = self._fetch_buffer(hit // self.block_tokens * self._block_bytes)
            got = self._client.fetch(self.model_id, tokens[:hit], out)
            self._breaker.record_success()
        except Error as e:
            self._failed("fetch", e)
            raise KeyError("kvcache.llama_cpp: miss") from None
        n = got.matched_tokens
        if n < self.min_hit_tokens or n <= local:  # evicted between lookup and fetch
            raise KeyError("kvcache.llama_cpp: miss")
        blob = _state.from_blocks(self._layout, out[:got.nbytes], self._kv_heads,
                                  self.block_tokens, out=self._reusable_state_buffer())
        input_ids = np.full(self._llm._n_ctx, -1, dtype=np.intc)  # -1 matches no token
        input_ids[:n] = tokens[:n]
        # load_state copies `scores` into the Llama's logits rows [0, n) by broadcasting: one
        # row of zeros stands for them all (the engine recomputes the logits it samples from).
        scores = np.zeros((1, self._llm._n_vocab), dtype=np.single)
        self.counters.hits += 1
        self.counters.hit_tokens += n
        self.counters.last_load_s = time.perf_counter() - started
        log.debug("kvcache.llama_cpp: hit %d of %d tokens in %.1f ms", n, len(key),
                  self.counters.last_load_s * 1e3)
        state = LlamaState(input_ids=input_ids, scores=scores, n_tokens=n, llama_state=blob,
                           llama_state_size=len(blob), seed=self._llm._seed)
        if self._state_buffer is not None and blob.base is self._state_buffer:
            self._state_owner = weakref.ref(state)
        elif self._state_owner is None or self._state_owner() is None:
            self._state_buffer, self._state_owner = blob, weakref.ref(state)
        return state

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        """Stores the whole blocks of ``value``'s KV that kvcached does not hold yet."""
        if self._layout is None:
            return
        started = time.perf_counter()
        try:
            parsed = _state.parse_state(memoryview(value.llama_state)[:value.llama_state_size])
            if parsed.layout != self._layout:
                raise _state.UnsupportedState(
                    f"state layout {parsed.layout} differs from the probed {self._layout}")
        except _state.UnsupportedState as e:
            self.counters.errors += 1
            log.warning("kvcache.llama_cpp: not saved: %s", e)
            return
        run = len(parsed.prefix_cells())
        tokens = _tokens(value.input_ids[:min(value.n_tokens, run)])
        whole = len(tokens) // self.block_tokens
        if whole == 0:
            return
        tokens = tokens[:whole * self.block_tokens]
        if not self._may_call_daemon():
            return
        try:
            have = self._client.lookup(self.model_id, tokens).matched_tokens // self.block_tokens
            if have < whole:
                try:
                    self._append(parsed, tokens, have, whole)
                except FailedPrecondition:  # the cached prefix shrank meanwhile: send it all
                    self._append(parsed, tokens, 0, whole)
            self._breaker.record_success()
        except Error as e:
            self._failed("append", e)
            return
        self.counters.saves += 1
        self.counters.last_save_s = time.perf_counter() - started

    # --- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Closes the client if this cache made it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> "KvcacheLlamaCache":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------

    def _append(self, parsed: _state.ParsedState, tokens: np.ndarray, first: int, whole: int) -> None:
        kv = _state.to_blocks(parsed, self._kv_heads, self.block_tokens, first, whole - first)
        res = self._client.append(self.model_id, tokens, kv, start_token=first * self.block_tokens)
        self.counters.saved_blocks += res.stored_blocks

    def _reusable_state_buffer(self) -> Optional[np.ndarray]:
        if self._state_owner is not None and self._state_owner() is None:
            return self._state_buffer
        return None

    def _fetch_buffer(self, nbytes: int) -> np.ndarray:
        """Where a fetch lands: a shared region (the daemon's one copy) grown as needed, or
        process memory when the daemon is not on this host."""
        if not self._region_failed and (self._region is None or len(self._region) < nbytes):
            try:
                self._region = self._client.create_shared_region(max(nbytes, 2 * (len(self._region) if self._region is not None else 0)))
            except Error:
                self._region_failed = True
                self._region = None
        if self._region is not None:
            return self._region.array[:nbytes]
        return np.empty(nbytes, dtype=np.uint8)

    def _loadable(self, key: Sequence[int]) -> int:
        """Tokens of ``key`` a hit may cover: whole blocks, short of the last token."""
        if self._layout is None:
            return 0
        return (len(key) - 1) // self.block_tokens * self.block_tokens if len(key) else 0

    def _may_call_daemon(self) -> bool:
        """Asks the breaker, then registers the model once. Call it only right before a
        daemon call whose outcome is recorded: in half-open state it hands out the one
        trial call."""
        return self._breaker.allow() and self._ensure_registered()

    def _ensure_registered(self) -> bool:
        if self._registered:
            return True
        d = self._layout.n_embd_k // self._kv_heads
        try:
            res = self._client.register_model(
                self.model_id, num_layers=self._layout.n_layer, num_kv_heads=self._kv_heads,
                head_dim=d, dtype=self._layout.dtype_name, block_tokens=self.block_tokens)
            self._breaker.record_success()
        except Error as e:
            self._failed("register_model", e)
            return False
        if res.block_bytes != self._block_bytes:
            self._layout = None
            self.disabled_reason = (f"kvcached's block of {res.block_bytes} bytes is not the "
                                    f"{self._block_bytes} this layout needs")
            log.warning("kvcache.llama_cpp: disabled: %s", self.disabled_reason)
            return False
        self._registered = True
        return True

    @property
    def _block_bytes(self) -> int:
        return _state.block_bytes(self._layout, self._kv_heads, self.block_tokens)

    def _failed(self, what: str, e: Error) -> None:
        self.counters.errors += 1
        self._breaker.record_failure()
        log.warning("kvcache.llama_cpp: %s failed (%s: %s); treated as a miss",
                    what, type(e).__name__, e)

    def _probe_layout(self) -> _state.StateLayout:
        """Evaluates one token in the (empty) context to read its state's layout, then
        forgets it; the context is left as a fresh Llama's is."""
        llm = self._llm
        if llm.n_tokens != 0:
            raise _state.UnsupportedState("the cache must be made before the Llama is used")
        if self._kv_heads <= 0:
            raise _state.UnsupportedState("the model reports no KV heads")
        bos = llm.token_bos()
        llm.eval([bos if bos >= 0 else 0])
        try:
            ctx = llm._ctx.ctx
            size = llama_cpp.llama_state_get_size(ctx)
            buf = (llama_cpp.ctypes.c_uint8 * int(size))()
            n = llama_cpp.llama_state_get_data(ctx, buf, size)
            parsed = _state.parse_state(memoryview(buf)[:n])
        finally:
            llm.reset()
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        lay = parsed.layout
        if lay.n_embd_k != lay.n_embd_v or lay.n_embd_k % self._kv_heads:
            raise _state.UnsupportedState(
                f"K/V widths {lay.n_embd_k}/{lay.n_embd_v} do not split into "
                f"{self._kv_heads} heads")
        return lay

    def _model_id(self, salt: str) -> str:
        """llama.cpp:<arch>:<file name>:<digest of everything that changes the KV>."""
        llm = self._llm
        path = llm.model_path
        cp = llm.context_params
        facts = [f"v{KEY_FORMAT_VERSION}", self._layout.describe(), f"h{self._kv_heads}",
                 _file_fingerprint(path),
                 f"rope:{cp.rope_scaling_type}:{cp.rope_freq_base}:{cp.rope_freq_scale}:"
                 f"{cp.yarn_ext_factor}:{cp.yarn_attn_factor}:{cp.yarn_beta_fast}:"
                 f"{cp.yarn_beta_slow}:{cp.yarn_orig_ctx}",
                 f"lora:{llm.lora_path or ''}:{llm.lora_scale if llm.lora_path else ''}",
                 f"salt:{salt}"]
        digest = block_checksum("\n".join(facts).encode())
        name = os.path.basename(path)[:64]
        return f"llama.cpp:{self._layout.arch}:{name}:{digest:016x}"


def _tokens(seq) -> np.ndarray:
    return np.asarray(seq, dtype=np.uint32)


def _file_fingerprint(path: str, samples: int = 64, sample_bytes: int = 64 << 10) -> str:
    """The file's size and an XXH3 of 64 evenly spaced 64 KiB samples (4 MiB read whatever
    the model's size): fine-tunes of one base change every weight, so they differ here."""
    size = os.path.getsize(path)
    parts = []
    with open(path, "rb") as f:
        for i in range(samples):
            f.seek(max(0, (size - sample_bytes) * i // max(1, samples - 1)))
            parts.append(f.read(sample_bytes))
    return f"{size}:{block_checksum(b''.join(parts)):016x}"
