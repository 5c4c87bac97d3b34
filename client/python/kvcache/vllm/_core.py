"""The vLLM connector's pure parts: cache identity, the circuit breaker, block mapping.

Nothing here imports vLLM or torch, so these rules are unit-tested without an engine
(client/python/tests/test_vllm_core.py). The connector (connector.py) feeds them facts it
reads from vLLM's config and requests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from ..breaker import CircuitBreaker  # re-exported: the connector and its tests use it from here

#: Bump when the meaning of the stored bytes changes for the same identity.
KEY_FORMAT_VERSION = 1


@dataclass(frozen=True)
class EngineIdentity:
    """Everything that decides what a cached block's bytes mean to a vLLM worker.

    Two engines share cached KV only when every field is equal: KV from another model,
    block size, dtype, KV dtype, attention block layout (on CPU the interior depends on the
    ISA the backend picked: K transposed, AMX tiles) or tensor-parallel shard is a miss.
    """

    model: str  #: the model's name or path as vLLM was given it
    revision: str  #: the model revision ("" when none), a checkpoint change
    block_size: int  #: vLLM's block size in tokens (= kvcached's block_tokens)
    dtype: str  #: the model dtype, e.g. "bfloat16"
    kv_cache_dtype: str  #: vLLM's cache_dtype ("auto" = the model dtype, "fp8", ...)
    layout: str  #: the attention backend's block layout, e.g. "cpu_attn:amx:HNC"
    num_layers: int  #: attention layers whose KV a block carries
    num_kv_heads: int  #: KV heads of this tensor-parallel rank
    head_size: int
    block_bytes_per_layer: int  #: bytes of one block of one layer in vLLM's paged cache
    tp_rank: int
    tp_size: int

    def digest(self) -> str:
        """A short stable hash of every field (and the key format version)."""
        blob = json.dumps({"v": KEY_FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def block_bytes(self) -> int:
        """Bytes of one kvcached block: one vLLM block of every layer."""
        return self.block_bytes_per_layer * self.num_layers


def model_id(identity: EngineIdentity, *, cache_salt: Optional[str] = None,
             lora_name: Optional[str] = None) -> str:
    """The kvcached model id a request's KV is stored under: base_id + key_suffix.

    Readable prefix (model's last path part, rank) for operators, then the identity's
    digest; a request's cache_salt and LoRA adapter each add a suffix, so they never share
    blocks with requests without them (the salt itself is hashed, never sent in clear).
    """
    return base_id(identity) + key_suffix(cache_salt=cache_salt, lora_name=lora_name)


def base_id(identity: EngineIdentity) -> str:
    """The model id of requests with neither salt nor LoRA (the identity alone)."""
    short = identity.model.rstrip("/").split("/")[-1][:48] or "model"
    return f"vllm/{short}/tp{identity.tp_rank}of{identity.tp_size}/{identity.digest()}"


def key_suffix(*, cache_salt: Optional[str] = None, lora_name: Optional[str] = None) -> str:
    """The per-request part of the model id. The scheduler sends it to the workers, and
    each worker puts it after its own base_id: tensor-parallel ranks keep their heads apart."""
    out = ""
    if lora_name:
        out += "/lora-" + hashlib.sha256(lora_name.encode()).hexdigest()[:16]
    if cache_salt:
        out += "/salt-" + hashlib.sha256(cache_salt.encode()).hexdigest()[:16]
    return out


def register_shape(identity: EngineIdentity) -> dict:
    """register_model() arguments whose block_bytes equal the vLLM block's bytes.

    kvcached's canonical layout is [layer][K, V][kv_head][token][head_dim]; vLLM's CPU block
    is [kv_head][token][K|V interleaved per backend], so the bytes are described by size
    (num_layers, kv heads, head size, block tokens, element size), and the layout string in
    the model id says how the interior is really arranged.
    """
    elem = identity.block_bytes_per_layer // (2 * identity.num_kv_heads * identity.head_size
                                              * identity.block_size)
    dtype = {2: "bf16" if "bfloat16" in _kv_dtype_name(identity) else "fp16", 4: "fp32"}.get(elem)
    if dtype is None or elem * 2 * identity.num_kv_heads * identity.head_size * \
            identity.block_size != identity.block_bytes_per_layer:
        raise ValueError(f"block of {identity.block_bytes_per_layer} bytes per layer is not "
                         f"2 x {identity.num_kv_heads} heads x {identity.head_size} x "
                         f"{identity.block_size} tokens of a 2- or 4-byte type")
    return dict(num_layers=identity.num_layers, num_kv_heads=identity.num_kv_heads,
                head_dim=identity.head_size, dtype=dtype, block_tokens=identity.block_size)


def _kv_dtype_name(identity: EngineIdentity) -> str:
    return identity.dtype if identity.kv_cache_dtype in ("", "auto") else identity.kv_cache_dtype


# --- block mapping --------------------------------------------------------------------


def loadable_tokens(prompt_len: int, cached_tokens: int, block_size: int) -> int:
    """Tokens of a prompt that may come from the cache: whole blocks, never the last token.

    vLLM must compute at least the prompt's last token to sample from it, so the hit is
    capped at the whole blocks of prompt[:-1].
    """
    if prompt_len <= 1 or block_size <= 0:
        return 0
    cap = (prompt_len - 1) // block_size * block_size
    return max(0, min(cached_tokens // block_size * block_size, cap))


def external_tokens(prompt_len: int, cached_tokens: int, num_computed_tokens: int,
                    block_size: int, min_tokens: int) -> int:
    """What get_num_new_matched_tokens answers: tokens to load beyond vLLM's local hit.

    0 when the load would bring fewer than ``min_tokens`` new tokens (loading a little costs
    more than recomputing it: the admission threshold).
    """
    n = loadable_tokens(prompt_len, cached_tokens, block_size) - num_computed_tokens
    return n if n > 0 and n >= max(min_tokens, 1) else 0


@dataclass(frozen=True)
class BlockPlan:
    """Which of a request's vLLM blocks move, and where they sit in the kvcached sequence."""

    first_block: int  #: index (within the request) of the first block that moves
    block_ids: tuple  #: vLLM block ids, in token order, of the blocks that move

    def tokens(self, block_size: int) -> int:
        return (self.first_block + len(self.block_ids)) * block_size


def load_plan(block_ids: Sequence[int], num_computed_tokens: int, num_external_tokens: int,
              block_size: int) -> BlockPlan:
    """The blocks a hit fills: those after vLLM's local prefix, up to the external tokens.

    num_computed_tokens (the local prefix-cache hit) is block-aligned in vLLM's v1
    scheduler; both counts must be.
    """
    if num_computed_tokens % block_size or num_external_tokens % block_size:
        raise ValueError("load_plan: token counts must be whole blocks")
    first = num_computed_tokens // block_size
    last = (num_computed_tokens + num_external_tokens) // block_size
    if last > len(block_ids):
        raise ValueError(f"load_plan: {last} blocks needed, request has {len(block_ids)}")
    return BlockPlan(first, tuple(block_ids[first:last]))


def save_plan(block_ids: Sequence[int], prompt_len: int, computed_after_step: int,
              already_cached_tokens: int, block_size: int) -> Optional[BlockPlan]:
    """The prompt blocks to append once the step that finishes them has run.

    Only whole blocks of the prompt whose KV exists after this step (computed_after_step)
    and that kvcached does not hold yet (already_cached_tokens, from the scheduler's lookup)
    are sent; None when there is nothing to send.
    """
    full = min(prompt_len, computed_after_step) // block_size
    full = min(full, len(block_ids))
    first = already_cached_tokens // block_size
    if first >= full:
        return None
    return BlockPlan(first, tuple(block_ids[first:full]))


# --- circuit breaker ----------------------------------------------------------------


# --- configuration ------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectorConfig:
    """kv_connector_extra_config, validated (unknown keys are refused: typos fail loudly)."""

    target: str = "unix:///tmp/kvcached.sock"
    namespace: str = ""
    token: str = ""
    timeout_s: float = 2.0  #: every daemon call's deadline
    #: attempts of an idempotent call on UNAVAILABLE; 1: a down daemon costs one failed
    #: connect (~0 ms) per call rather than ~140 ms of retries; a miss is cheap
    max_attempts: int = 1
    min_load_tokens: int = 0  #: admit a hit only when it loads at least this many tokens
    failure_threshold: int = 3
    cooldown_s: float = 5.0
    data_path: str = "auto"  #: "auto" (shared memory on unix:// when offered), "grpc", "shm"

    @classmethod
    def from_extra(cls, extra: Optional[dict]) -> "ConnectorConfig":
        extra = dict(extra or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kvcache.vllm: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        kw = {}
        for name, f in cls.__dataclass_fields__.items():
            if name in extra:
                kw[name] = type(f.default)(extra[name])
        cfg = cls(**kw)
        if cfg.timeout_s <= 0 or cfg.min_load_tokens < 0 or cfg.max_attempts < 1:
            raise ValueError("kvcache.vllm: timeout_s > 0, min_load_tokens >= 0 and "
                             "max_attempts >= 1 are required")
        if cfg.data_path not in ("auto", "grpc", "shm"):
            raise ValueError(f"kvcache.vllm: data_path {cfg.data_path!r}: auto, grpc or shm")
        return cfg
