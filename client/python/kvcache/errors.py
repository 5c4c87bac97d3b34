"""Exceptions raised by kvcache: one class per gRPC status code, all under kvcache.Error.

Every failed call raises the class of the status code the daemon (or the C++
client, e.g. DATA_LOSS for a block whose checksum does not match) answered.
The message names the field or limit at fault and ends with the call's request
id, the one to look for in the daemon's log.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "Cancelled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
]


class Error(Exception):
    """A kvcache call failed.

    Attributes:
        code: the gRPC status code, an int (5 for NOT_FOUND, ...).
        code_name: its name, e.g. "NOT_FOUND".
        message: the message, without the code.
    """

    code: int = 2
    code_name: str = "UNKNOWN"

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
            self.code_name = _NAMES.get(code, str(code))

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"

    def __reduce__(self):
        return (_from_status, (self.code, self.message))


class Cancelled(Error):
    """The call was cancelled (CANCELLED)."""

    code, code_name = 1, "CANCELLED"


class Unknown(Error):
    """UNKNOWN."""

    code, code_name = 2, "UNKNOWN"


class InvalidArgument(Error, ValueError):
    """A bad argument: layout, id, token, byte count, alignment (INVALID_ARGUMENT)."""

    code, code_name = 3, "INVALID_ARGUMENT"


class DeadlineExceeded(Error, TimeoutError):
    """The call's deadline passed, or a stream made no progress (DEADLINE_EXCEEDED)."""

    code, code_name = 4, "DEADLINE_EXCEEDED"


class NotFound(Error, LookupError):
    """Unknown model, unknown or expired lease (NOT_FOUND)."""

    code, code_name = 5, "NOT_FOUND"


class AlreadyExists(Error):
    """The model id is registered with another layout (ALREADY_EXISTS)."""

    code, code_name = 6, "ALREADY_EXISTS"


class PermissionDenied(Error, PermissionError):
    """The principal's role or tenant may not make the call (PERMISSION_DENIED)."""

    code, code_name = 7, "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """A limit or quota was reached, or the cache is full (RESOURCE_EXHAUSTED)."""

    code, code_name = 8, "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """E.g. start_token beyond the cached prefix, no shared memory (FAILED_PRECONDITION)."""

    code, code_name = 9, "FAILED_PRECONDITION"


class Aborted(Error):
    """The prefix was evicted or the model re-registered meanwhile; retry (ABORTED)."""

    code, code_name = 10, "ABORTED"


class OutOfRange(Error):
    """A range outside its shared-memory region (OUT_OF_RANGE)."""

    code, code_name = 11, "OUT_OF_RANGE"


class Unimplemented(Error):
    """UNIMPLEMENTED."""

    code, code_name = 12, "UNIMPLEMENTED"


class Internal(Error):
    """INTERNAL."""

    code, code_name = 13, "INTERNAL"


class Unavailable(Error, ConnectionError):
    """The daemon cannot be reached (UNAVAILABLE); idempotent calls were retried."""

    code, code_name = 14, "UNAVAILABLE"


class DataLoss(Error):
    """Bytes that do not match their checksum (DATA_LOSS); nothing wrong is returned."""

    code, code_name = 15, "DATA_LOSS"


class Unauthenticated(Error):
    """The call names no known principal (UNAUTHENTICATED)."""

    code, code_name = 16, "UNAUTHENTICATED"


_BY_CODE: dict[int, type[Error]] = {
    cls.code: cls
    for cls in (
        Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
        PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
        Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated,
    )
}
_NAMES: dict[int, str] = {cls.code: cls.code_name for cls in _BY_CODE.values()}


def _from_status(code: int, message: str) -> Error:
    """The exception for a status code (the extension calls this)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
