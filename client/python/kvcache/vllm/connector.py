"""KvcacheConnector: vLLM v1's KV connector backed by kvcached.

The scheduler-side instance (EngineCore process) looks prompts up in kvcached and plans
loads and saves per step; the worker-side instance (one per worker) moves the bytes: a
fetch into a shared-memory staging region then a scatter into vLLM's paged cache on a hit,
a gather from the paged cache then an append after the step that completes a prompt.

One kvcached block = one vLLM block (block_tokens = vLLM's block_size) of every layer, as
the bytes sit in vLLM's paged cache: layer after layer, each layer's block as the backend
lays it out. Which engines may share those bytes is decided by the model id (_core.model_id).

Failures never reach vLLM: a daemon error or timeout is a miss (or a skipped save), and a
circuit breaker stops calling a daemon that keeps failing. A load that comes back short
reports its blocks through get_block_ids_with_load_errors so vLLM recomputes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

import kvcache

from . import _compat
from ._compat import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from ._core import (CircuitBreaker, ConnectorConfig, EngineIdentity, base_id, external_tokens,
                    key_suffix, load_plan, register_shape, save_plan)

logger = _compat.get_logger()

# Errors that say "not there", not "the daemon is in trouble": they don't trip the breaker.
_EXPECTED = (kvcache.NotFound, kvcache.FailedPrecondition)


@dataclass
class _Transfer:
    req_id: str
    suffix: str  #: key_suffix of the request; the worker prepends its own base_id
    tokens: list  #: the prompt tokens the moved blocks cover (whole blocks, from token 0)
    first_block: int  #: first block (within the request) that moves
    block_ids: tuple  #: vLLM block ids of the blocks that move
    is_store: bool


@dataclass
class KvcacheConnectorMetadata(KVConnectorMetadata):
    transfers: list = field(default_factory=list)


@dataclass
class _Pending:
    """A request whose prompt is still being prefilled (chunked prefill), to save later."""

    suffix: str
    prompt: list
    block_ids: list
    cached_tokens: int


class KvcacheConnector(KVConnectorBase_V1):
    """vLLM KV connector: kv_connector="KvcacheConnector", kv_connector_module_path="kvcache.vllm"."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None)
        self._cfg = ConnectorConfig.from_extra(extra)
        self._is_worker = role == KVConnectorRole.WORKER
        self._breaker = CircuitBreaker(self._cfg.failure_threshold, self._cfg.cooldown_s)
        self._client: Optional[kvcache.Client] = None
        self._registered: set = set()
        self._identity: Optional[EngineIdentity] = None
        self._base = ""
        self._layer_names: list = []
        if not self._is_worker:
            _compat.prefer_recompute_on_load_failure(vllm_config, logger)
        version = _compat.vllm_version()
        if not _compat.version_supported(version):
            logger.warning("kvcache.vllm: vLLM %s is outside the tested range %s", version,
                           _compat.SUPPORTED)
        try:
            spec, self._layer_names = _compat.attention_spec(kv_cache_config)
            layout = _compat.block_layout(vllm_config, spec)
            if layout is None:
                raise ValueError("only vLLM's CPU attention backend is supported")
            mc, cc = vllm_config.model_config, vllm_config.cache_config
            self._identity = EngineIdentity(
                model=str(mc.model), revision=str(getattr(mc, "revision", None) or ""),
                block_size=int(spec.block_size), dtype=str(mc.dtype).replace("torch.", ""),
                kv_cache_dtype=str(cc.cache_dtype), layout=layout,
                num_layers=len(self._layer_names), num_kv_heads=int(spec.num_kv_heads),
                head_size=int(spec.head_size),
                block_bytes_per_layer=int(spec.page_size_bytes),
                tp_rank=_compat.tp_rank(self._is_worker),
                tp_size=int(vllm_config.parallel_config.tensor_parallel_size))
            self._register_args = register_shape(self._identity)
        except Exception as e:  # inert: every request a miss, nothing saved
            logger.warning("kvcache.vllm: connector disabled (%s)", e)
            self._identity = None
        self._block_size = self._identity.block_size if self._identity else 1
        max_len = int(vllm_config.model_config.max_model_len)
        self._max_blocks = -(-max_len // self._block_size)
        # Scheduler state.
        self._lookups: dict = {}  # req_id -> (key suffix, cached tokens in kvcached)
        self._loads: dict = {}  # req_id -> external tokens to load
        self._local: dict = {}  # req_id -> vLLM's local prefix hit when we were asked
        self._pending: dict = {}  # req_id -> _Pending
        # Worker state.
        self._kv_layers: list = []
        self._staging = None  # torch uint8 view of a shared region (or a plain tensor)
        self._load_errors: set = set()
        self.stats = {"lookups": 0, "hits": 0, "hit_tokens": 0, "loaded_tokens": 0,
                      "saved_blocks": 0, "errors": 0, "load_s": 0.0, "save_s": 0.0}
        if self._identity:
            self._base = base_id(self._identity)
            logger.info("kvcache.vllm: %s role, target %s, model id %s", role, self._cfg.target,
                        self._base)

    # --- the daemon, behind the breaker -------------------------------------------------

    def _call(self, what: str, fn, *args, **kwargs):
        """fn(client, ...) or None: errors become None (and count against the breaker)."""
        if self._identity is None or not self._breaker.allow():
            return None
        try:
            if self._client is None:
                self._client = kvcache.Client(self._cfg.target, namespace=self._cfg.namespace,
                                              token=self._cfg.token, timeout=self._cfg.timeout_s,
                                              max_attempts=self._cfg.max_attempts,
                                              data_path=self._cfg.data_path)
            out = fn(self._client, *args, **kwargs)
            self._breaker.record_success()
            return out
        except _EXPECTED as e:
            self._breaker.record_success()
            logger.debug("kvcache.vllm: %s: %s", what, e)
            return e
        except Exception as e:  # noqa: BLE001 (any failure is a miss, never vLLM's problem)
            self._breaker.record_failure()
            self.stats["errors"] += 1
            logger.warning("kvcache.vllm: %s failed (%s: %s); breaker %s", what,
                           type(e).__name__, e, self._breaker.state)
            return None

    def _suffix_for(self, request: Any) -> Optional[str]:
        """The request's key_suffix, or None when it must not be cached."""
        if self._identity is None:
            return None
        salt, lora, multimodal = _compat.request_extras(request)
        if multimodal:
            return None  # image/audio inputs change KV without changing token ids
        return key_suffix(cache_salt=salt, lora_name=lora)

    def _ensure_registered(self, client: kvcache.Client, mid: str) -> None:
        if mid not in self._registered:
            client.register_model(mid, **self._register_args)
            self._registered.add(mid)

    # --- scheduler side ----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        prompt = list(request.prompt_token_ids or [])
        suffix = self._suffix_for(request)
        self._local[request.request_id] = num_computed_tokens
        if suffix is None or len(prompt) <= self._block_size:
            return 0, False
        mid = self._base + suffix  # the scheduler asks what rank 0 holds
        memo = self._lookups.get(request.request_id)
        if memo is None or memo[0] != suffix:
            self.stats["lookups"] += 1
            t0 = time.perf_counter()
            hit = self._call("lookup", lambda c: c.lookup(mid, prompt))
            cached = hit.matched_tokens if isinstance(hit, kvcache.LookupResult) else 0
            if hit is None:  # daemon trouble: a miss, and no save planned on its word
                cached = -1
            self._lookups[request.request_id] = (suffix, cached)
            logger.debug("kvcache.vllm: lookup of %s (%d tokens): %d cached, %.2f ms",
                        request.request_id, len(prompt), cached, (time.perf_counter() - t0) * 1e3)
        cached = self._lookups[request.request_id][1]
        n = external_tokens(len(prompt), max(cached, 0), num_computed_tokens, self._block_size,
                            self._cfg.min_load_tokens)
        return n, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if num_external_tokens > 0:
            self._loads[request.request_id] = num_external_tokens
            self.stats["hits"] += 1
            self.stats["hit_tokens"] += num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KvcacheConnectorMetadata:
        meta = KvcacheConnectorMetadata()
        bs = self._block_size
        for req in scheduler_output.scheduled_new_reqs:
            memo = self._lookups.pop(req.req_id, None)
            local = self._local.pop(req.req_id, 0)
            if memo is None:
                continue
            suffix, cached = memo
            prompt = list(req.prompt_token_ids or [])
            block_ids = list(req.block_ids[0])
            n_ext = self._loads.pop(req.req_id, 0)
            if n_ext:
                plan = load_plan(block_ids, local, n_ext, bs)
                meta.transfers.append(_Transfer(req.req_id, suffix, prompt[:plan.tokens(bs)],
                                                plan.first_block, plan.block_ids, False))
            if cached < 0:
                continue  # the daemon failed this request's lookup: don't save on a guess
            done = req.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(req.req_id, 0)
            pending = _Pending(suffix, prompt, block_ids, cached)
            if not self._plan_save(meta, req.req_id, pending, done):
                self._pending[req.req_id] = pending
        cached_reqs = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached_reqs.req_ids):
            pending = self._pending.get(req_id)
            if pending is None:
                continue
            new_ids = cached_reqs.new_block_ids[i]
            if req_id in getattr(cached_reqs, "resumed_req_ids", ()):  # all its blocks anew
                pending.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                pending.block_ids.extend(new_ids[0])
            done = cached_reqs.num_computed_tokens[i] + \
                scheduler_output.num_scheduled_tokens.get(req_id, 0)
            if self._plan_save(meta, req_id, pending, done):
                del self._pending[req_id]
        return meta

    def _plan_save(self, meta: KvcacheConnectorMetadata, req_id: str, p: _Pending,
                   done: int) -> bool:
        """Adds the save once the prompt's KV is complete; True when the request is settled."""
        if done < len(p.prompt):
            return False
        plan = save_plan(p.block_ids, len(p.prompt), done, p.cached_tokens, self._block_size)
        if plan is not None:
            meta.transfers.append(_Transfer(req_id, p.suffix,
                                            p.prompt[:plan.tokens(self._block_size)],
                                            plan.first_block, plan.block_ids, True))
        return True

    def request_finished(self, request: Any, block_ids: Any):
        for d in (self._lookups, self._loads, self._local, self._pending):
            d.pop(request.request_id, None)
        return False, None

    # --- worker side -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict) -> None:
        if self._identity is None:
            return
        try:
            import torch
            layers = [kv_caches[name] for name in self._layer_names]
            per_layer = self._identity.block_bytes_per_layer
            for t in layers:
                if t.device.type != "cpu" or t[0].numel() * t.element_size() != per_layer \
                        or not t[0].is_contiguous():
                    raise ValueError(f"layer tensor {tuple(t.shape)} {t.dtype} on {t.device} "
                                     f"is not {per_layer}-byte CPU blocks")
            # Each layer seen as [num_blocks, bytes of a block].
            self._kv_layers = [t.view(t.shape[0], -1).view(torch.uint8) for t in layers]
            self._staging = self._make_staging(torch)
        except Exception as e:
            logger.warning("kvcache.vllm: connector disabled on this worker (%s)", e)
            self._identity = None

    def _make_staging(self, torch):
        nbytes = self._max_blocks * self._identity.block_bytes()
        region = self._call("create_shared_region", lambda c: c.create_shared_region(nbytes)
                            if c.uses_shared_memory() else None)
        if isinstance(region, kvcache.SharedRegion):
            self._region = region  # keeps the mapping alive
            arr = region.array[:nbytes]
            logger.info("kvcache.vllm: shared-memory staging of %d MiB", nbytes >> 20)
        else:
            arr = np.empty(nbytes, dtype=np.uint8)
            logger.info("kvcache.vllm: gRPC data path (no shared memory)")
        L = self._identity.num_layers
        return torch.from_numpy(arr).view(self._max_blocks, L, self._identity.block_bytes_per_layer)

    def _staging_bytes(self, n_blocks: int):
        return self._staging[:n_blocks].view(-1).numpy()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if self._identity is None or not isinstance(meta, KvcacheConnectorMetadata):
            return
        for t in meta.transfers:
            if not t.is_store:
                self._load(t)

    def _load(self, t: _Transfer) -> None:
        import torch
        t0 = time.perf_counter()
        n_total = len(t.tokens) // self._block_size  # blocks from token 0
        out = self._staging_bytes(n_total)
        mid = self._base + t.suffix  # this rank's own heads
        res = self._call("fetch", lambda c: c.fetch(mid, t.tokens, out))
        t_fetch = time.perf_counter() - t0
        got = res.matched_tokens // self._block_size if isinstance(res, kvcache.FetchResult) else 0
        got = min(got, n_total)
        usable = max(0, got - t.first_block)
        if usable < len(t.block_ids):  # evicted meanwhile or daemon trouble: vLLM recomputes
            self._load_errors.update(t.block_ids[usable:])
            logger.warning("kvcache.vllm: %s: %d of %d blocks loaded, the rest recomputed",
                           t.req_id, usable, len(t.block_ids))
        if usable:
            idx = torch.tensor(t.block_ids[:usable], dtype=torch.long)
            src = self._staging[t.first_block:t.first_block + usable]
            for l, layer in enumerate(self._kv_layers):
                layer.index_copy_(0, idx, src[:, l])
        self.stats["loaded_tokens"] += usable * self._block_size
        self.stats["load_s"] += time.perf_counter() - t0
        logger.info("kvcache.vllm: loaded %d tokens of %s in %.1f ms (fetch %.1f ms, %d MiB)",
                    usable * self._block_size, t.req_id, (time.perf_counter() - t0) * 1e3,
                    t_fetch * 1e3, out.nbytes >> 20)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads finish in start_load_kv, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None  # saved whole in wait_for_save, from the registered caches

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if self._identity is None or not isinstance(meta, KvcacheConnectorMetadata):
            return
        for t in meta.transfers:
            if t.is_store:
                self._save(t)

    def _save(self, t: _Transfer) -> None:
        import torch
        t0 = time.perf_counter()
        n = len(t.block_ids)
        idx = torch.tensor(t.block_ids, dtype=torch.long)
        dst = self._staging[:n]
        for l, layer in enumerate(self._kv_layers):
            dst[:, l].copy_(layer.index_select(0, idx))
        kv = self._staging_bytes(n)
        start = t.first_block * self._block_size

        mid = self._base + t.suffix  # this rank's own heads

        def append(c):
            self._ensure_registered(c, mid)
            return c.append(mid, t.tokens, kv, start_token=start)

        res = self._call("append", append)
        if isinstance(res, kvcache.AppendResult):
            self.stats["saved_blocks"] += n
        self.stats["save_s"] += time.perf_counter() - t0
        logger.info("kvcache.vllm: saved %d blocks of %s from token %d in %.1f ms (%s)", n,
                    t.req_id, start, (time.perf_counter() - t0) * 1e3,
                    "ok" if isinstance(res, kvcache.AppendResult) else f"skipped: {res}")

    def get_finished(self, finished_req_ids: set):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
            self._client = None
