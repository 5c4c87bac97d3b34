"""kvcache.Client: a worker's connection to kvcached (wraps the C++ kvcache::Client)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from . import _kvcache

if TYPE_CHECKING:  # pragma: no cover
    from ._kvcache import (AppendResult, DataPathStats, EvictResult, FetchResult,
                           LookupResult, RegisterResult, SharedRegion)
    from .errors import Error

    Tokens = Any  # Sequence[int] or a 1-D uint32 array
    Buffer = Any  # a C-contiguous CPU buffer: numpy array, torch CPU tensor, bytearray, ...


class Client:
    """One connection to one kvcached, acting in one namespace.

    Thread-safe: any number of threads may call any method at once; each call
    releases the GIL while it waits on the daemon or copies bytes. Every call has
    a deadline (``timeout``); idempotent calls are retried on UNAVAILABLE.
    Appends always send each block's XXH3-64; fetches always verify every block
    against its checksum (a mismatch raises :class:`kvcache.DataLoss` and returns
    nothing). Errors raise :class:`kvcache.Error` subclasses.

    A ``unix://`` target on the daemon's host moves KV through shared memory by
    itself: fetching into (and appending from) a :class:`SharedRegion`
    (:meth:`create_shared_region`) costs one copy, made by the daemon; other
    buffers take one more memcpy through a staging region.

    Use it as a context manager, or call :meth:`close`::

        with kvcache.Client("unix:///tmp/kvcached.sock") as c:
            c.register_model("m", num_layers=2, num_kv_heads=2, head_dim=64)
    """

    def __init__(
        self,
        target: str = "unix:///tmp/kvcached.sock",
        *,
        namespace: str = "",
        timeout: float = 30.0,
        max_attempts: int = 3,
        data_path: str = "auto",
        token: str = "",
        shm_socket: str = "",
        max_message_bytes: int = 64 << 20,
        max_shm_connections: int = 16,
        shm_staging_bytes: int = 64 << 20,
        tls_ca_file: str = "",
        tls_cert_file: str = "",
        tls_key_file: str = "",
        tls_server_name: str = "",
    ) -> None:
        """Creates the channel (does not wait for the daemon: see :meth:`wait_for_ready`).

        Args:
            target: ``"unix:///path/to.sock"`` or ``"host:port"``.
            namespace: the namespace calls act in; empty means "default".
            timeout: every call's deadline, in seconds.
            max_attempts: attempts of an idempotent call on UNAVAILABLE.
            data_path: ``"auto"`` (shared memory for unix:// targets when the daemon
                offers it, else gRPC), ``"grpc"``, or ``"shm"`` (insist).
            token: bearer token for a daemon with authentication on.
            shm_socket: the shared-memory socket's path; empty: asked of the daemon.
            max_message_bytes: must match the daemon's limits.max_message_bytes.
            max_shm_connections: shared-memory connections at most (one call each).
            shm_staging_bytes: staging region per connection for buffers outside
                every SharedRegion.
            tls_ca_file, tls_cert_file, tls_key_file, tls_server_name: TLS to a TCP
                target (CA bundle; client certificate and key for mutual TLS).
        """
        self._c = _kvcache._Client(
            target, namespace, float(timeout), max_attempts, data_path, token, shm_socket,
            max_message_bytes, max_shm_connections, shm_staging_bytes, tls_ca_file,
            tls_cert_file, tls_key_file, tls_server_name)
        self.target = target
        self.namespace = namespace

    # --- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel and the shared-memory connections. Idempotent.

        Calls made afterwards raise :class:`kvcache.FailedPrecondition`. Shared
        regions stay valid while referenced.
        """
        self._c.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._c.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"kvcache.Client({self.target!r}, namespace={self.namespace!r}, {state})"

    def wait_for_ready(self, timeout: float = 10.0) -> None:
        """Waits until the channel is connected; :class:`kvcache.Unavailable` after ``timeout`` s."""
        self._c.wait_for_ready(float(timeout))

    # --- models -----------------------------------------------------------------

    def register_model(
        self,
        model_id: str,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str = "fp16",
        block_tokens: int = 64,
    ) -> "RegisterResult":
        """Registers a model's KV layout (a no-op when the same layout is registered).

        One block holds ``block_tokens`` tokens of every layer, laid out
        ``[layer][K, V][kv_head][token][head_dim]`` in ``dtype`` ("fp16", "bf16"
        or "fp32"); ``result.block_bytes`` is its size. The client remembers the
        layout and registers it again when a restarted daemon has forgotten it.
        Raises :class:`kvcache.InvalidArgument` for a bad layout,
        :class:`kvcache.AlreadyExists` for the id with another layout.
        """
        return self._c.register_model(model_id, num_layers, num_kv_heads, head_dim, dtype,
                                      block_tokens)

    def unregister_model(self, model_id: str) -> dict:
        """Removes a model: its blocks, leases and registration. NotFound when unknown."""
        return self._c.unregister_model(model_id)

    def list_models(self, namespace: str = "") -> dict:
        """The registered models (ListModelsResponse as a dict)."""
        return self._c.list_models(namespace)

    # --- the data calls -----------------------------------------------------------

    def lookup(
        self,
        model_id: str,
        tokens: "Tokens",
        *,
        lease: bool = False,
        lease_ttl: float = 0.0,
        accept_lossy: bool = False,
        prefetch: str = "none",
        prefetch_timeout: float = 0.0,
    ) -> "LookupResult":
        """The longest cached prefix of ``tokens`` (whole blocks).

        With ``lease=True`` the matched blocks are pinned until
        :meth:`release_lease`, the lease's expiry (``lease_ttl`` seconds, 0: the
        daemon's default) or :meth:`fetch_lease`. Blocks stored lossy are left
        out (``withheld_tokens``) unless ``accept_lossy``. ``prefetch``: "none",
        "best_effort" or "wait" (blocks only the SSD tier holds).
        """
        return self._c.lookup(model_id, tokens, lease, float(lease_ttl), accept_lossy,
                              prefetch, float(prefetch_timeout))

    def batch_lookup(
        self,
        model_id: str,
        sequences: Iterable["Tokens"],
        *,
        lease: bool = False,
        lease_ttl: float = 0.0,
        accept_lossy: bool = False,
        prefetch: str = "none",
        prefetch_timeout: float = 0.0,
    ) -> "list[LookupResult | Error]":
        """Looks up each sequence as :meth:`lookup` would, in one call.

        Returns one entry per sequence: its LookupResult, or the
        :class:`kvcache.Error` that sequence got (not raised).
        """
        return self._c.batch_lookup(model_id, sequences, lease, float(lease_ttl), accept_lossy,
                                    prefetch, float(prefetch_timeout))

    def release_lease(self, lease_id: int) -> bool:
        """Releases a lease; False when it had already expired."""
        return self._c.release_lease(lease_id)

    def append(
        self, model_id: str, tokens: "Tokens", kv: "Buffer", *, start_token: int = 0
    ) -> "AppendResult":
        """Appends the KV of the whole blocks of ``tokens[start_token:]``.

        ``kv`` is any C-contiguous CPU buffer (numpy array, torch CPU tensor,
        bytes, a slice of a SharedRegion's ``array``), read as its bytes: exactly
        ``whole_blocks * block_bytes`` of them. ``start_token`` is block-aligned
        and not beyond the cached prefix. Each block's XXH3-64 is sent and
        checked by the daemon. Raises :class:`kvcache.InvalidArgument` for a
        wrong byte count or alignment (nothing is stored).
        """
        return self._c.append(model_id, tokens, kv, start_token)

    def fetch(
        self, model_id: str, tokens: "Tokens", out: "Buffer", *, accept_lossy: bool = False
    ) -> "FetchResult":
        """Fetches the KV of the longest cached prefix of ``tokens`` into ``out``.

        ``out`` is a writable C-contiguous CPU buffer (numpy array, torch CPU
        tensor, bytearray, a slice of a SharedRegion's ``array``: then the daemon
        copies straight into it); block ``i`` lands at byte ``i * block_bytes``.
        Every block is verified against its checksum (:class:`kvcache.DataLoss`
        otherwise). :class:`kvcache.InvalidArgument` when ``out`` is smaller than
        the cached prefix (look it up first). ``result.nbytes`` bytes are written.
        """
        return self._c.fetch(model_id, tokens, out, accept_lossy)

    def fetch_lease(
        self, model_id: str, lease_id: int, out: "Buffer", *, accept_lossy: bool = False
    ) -> "FetchResult":
        """As :meth:`fetch`, for exactly the blocks a leasing :meth:`lookup` pinned."""
        return self._c.fetch_lease(model_id, lease_id, out, accept_lossy)

    def evict_prefix(self, model_id: str, tokens: "Tokens") -> "EvictResult":
        """Evicts the cached blocks of ``tokens`` (a block-aligned prefix) and after."""
        return self._c.evict_prefix(model_id, tokens)

    def evict_model(self, model_id: str) -> "EvictResult":
        """Evicts every cached block of a model (it stays registered)."""
        return self._c.evict_model(model_id)

    # --- shared memory ------------------------------------------------------------

    def create_shared_region(self, nbytes: int) -> "SharedRegion":
        """A region of at least ``nbytes`` shared with the daemon.

        ``region.array`` is a numpy uint8 view of it (no copy): fetch into and
        append from slices of it with one copy, made by the daemon. It stays
        valid while referenced, even after the client is closed.
        :class:`kvcache.FailedPrecondition` when the shared-memory path is not in
        use (a TCP target, ``data_path="grpc"``, a daemon without it).
        """
        return self._c.create_shared_region(nbytes)

    def uses_shared_memory(self) -> bool:
        """Whether data calls go over shared memory now (probes the daemon once)."""
        return self._c.uses_shared_memory()

    def data_path_stats(self) -> "DataPathStats":
        """How data calls have travelled so far (from memory, no call)."""
        return self._c.data_path_stats()

    # --- admin --------------------------------------------------------------------

    def server_info(self) -> dict:
        """GetServerInfoResponse as a dict (version, limits, shm_socket, ...)."""
        return self._c.server_info()

    def stats(self) -> dict:
        """GetStatsResponse as a dict (proto field names; 64-bit counters are strings)."""
        return self._c.stats()

    def who_am_i(self) -> dict:
        """Who the daemon takes this client to be (principal, tenant, role)."""
        return self._c.who_am_i()
