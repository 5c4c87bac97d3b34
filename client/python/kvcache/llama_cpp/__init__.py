"""kvcache.llama_cpp: llama-cpp-python's prompt cache backed by kvcached.

Use it with::

    from llama_cpp import Llama
    from kvcache.llama_cpp import KvcacheLlamaCache

    llm = Llama(model_path="model.gguf", n_ctx=4096)
    llm.set_cache(KvcacheLlamaCache(llm, "unix:///tmp/kvcached.sock"))

Several processes serving the same model then share prompt prefixes block by block. The
cache class imports llama_cpp; the state format (``kvcache.llama_cpp._state``) does not, so
it is importable and tested without the engine. Checked against llama-cpp-python 0.3.36.
"""

__all__ = ["KvcacheLlamaCache", "CacheCounters"]


def __getattr__(name):  # lazy: llama_cpp loads a shared library and may be absent
    if name in __all__:
        from . import cache
        return getattr(cache, name)
    raise AttributeError(f"module 'kvcache.llama_cpp' has no attribute {name!r}")
