"""kvcache.vllm: a vLLM v1 KV connector backed by kvcached.

Select it in vLLM with::

    kv_transfer_config = {"kv_connector": "KvcacheConnector",
                          "kv_connector_module_path": "kvcache.vllm",
                          "kv_role": "kv_both",
                          "kv_connector_extra_config": {"target": "unix:///tmp/kvcached.sock"}}

The connector class imports vLLM; the pure parts (``kvcache.vllm._core``: cache identity,
circuit breaker, block mapping) do not, so they are importable and tested without vLLM.
Supported: vLLM 0.32.x (``_compat.SUPPORTED``), the CPU attention backend.
"""

__all__ = ["KvcacheConnector", "KvcacheConnectorMetadata"]


def __getattr__(name):  # lazy: importing vLLM costs seconds and may be absent
    if name in __all__:
        from . import connector
        return getattr(connector, name)
    raise AttributeError(f"module 'kvcache.vllm' has no attribute {name!r}")
