"""kvcache: the Python client of kvcached, the LLM KV-cache daemon.

A binding of the C++ client library (kvcache::Client), so checksums, the
same-host shared-memory data plane, leases, retries and the lossy opt-in behave
exactly as in C++. Start with :class:`Client`; errors are :class:`Error`
subclasses named after gRPC status codes.
"""

from ._kvcache import (AppendResult, BlockInfo, DataPathStats, EvictResult, FetchResult,
                       LookupResult, RegisterResult, SharedRegion, __version__,
                       block_checksum)
from ._client import Client
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error,
                     FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                     PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
                     Unimplemented, Unknown)

__all__ = [
    "__version__", "Client", "SharedRegion", "block_checksum",
    "AppendResult", "BlockInfo", "DataPathStats", "EvictResult", "FetchResult",
    "LookupResult", "RegisterResult",
    "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable",
    "Unimplemented", "Unknown",
]
