"""Exceptions mirroring the shim's typed errors (``sluice.common.v1.ErrorCode``).

Every error the shim (or the agent behind it) reports arrives as an
``ErrorDetail { code, message }`` and is raised as the subclass of
:class:`SluiceError` registered for that code, so callers branch with
``except NoSuchKey:`` instead of parsing messages::

    try:
        client.head("data/missing")
    except sluice.NoSuchKey as e:
        print(e.code, e.message, e.request_id)

Errors that happen in this process (cannot connect, connection lost, a
timeout, use of a released region) are also :class:`SluiceError`\\ s; the ones
that have no shim code carry ``code = None``.
"""

from __future__ import annotations

import enum
from typing import Dict, Optional, Type


class ErrorCode(enum.IntEnum):
    """``sluice.common.v1.ErrorCode``, value for value."""

    ERROR_CODE_UNSPECIFIED = 0
    INTERNAL = 1
    BAD_REQUEST = 2
    UNKNOWN_TENANT = 3
    UNKNOWN_NAMESPACE = 4
    NO_SUCH_KEY = 5
    NO_SUCH_BUCKET = 6
    ACCESS_DENIED = 7
    UNKNOWN_REGION = 8
    REGION_TOO_SMALL = 9
    OUT_OF_BOUNDS = 10
    INVALID_RANGE = 11
    STORE_UNAVAILABLE = 12
    TRANSFER_FAILED = 13
    PROTOCOL = 14
    UNSUPPORTED_VERSION = 15
    UNAUTHENTICATED = 16
    PRECONDITION_FAILED = 17
    RESOURCE_EXHAUSTED = 18
    QUOTA_EXCEEDED = 19
    INTEGRITY = 20
    UNSUPPORTED = 21
    AGENT_UNAVAILABLE = 22
    DEADLINE_EXCEEDED = 23


class SluiceError(Exception):
    """Base of every error raised by this package.

    Attributes:
        code: the shim's :class:`ErrorCode` (an ``int`` if this client does
            not know the value), or ``None`` for errors raised locally
            without a shim code (connection failures, timeouts).
        message: the human-readable text.
        request_id: the trace id of the failed request (also in the shim's
            and agent's logs), when known.
    """

    #: The code this class stands for (``None`` for client-side errors).
    CODE: Optional[ErrorCode] = None

    def __init__(self, message: str, code: "Optional[ErrorCode | int]" = None, request_id: str = "") -> None:
        super().__init__(message)
        if code is None:
            code = self.CODE
        if code is not None and not isinstance(code, ErrorCode):
            try:
                code = ErrorCode(code)
            except ValueError:
                pass  # a code newer than this client: keep the int
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        parts = [self.message]
        tags = []
        if self.code is not None:
            tags.append(self.code.name if isinstance(self.code, ErrorCode) else f"code {self.code}")
        if self.request_id:
            tags.append(f"request {self.request_id}")
        if tags:
            parts.append(f"[{', '.join(tags)}]")
        return " ".join(parts)

    def __reduce__(self):  # picklable across processes (DataLoader workers)
        return (_rebuild, (type(self), self.message, self.code, self.request_id))


def _rebuild(cls: type, message: str, code: "Optional[int]", request_id: str) -> "SluiceError":
    return cls(message, code, request_id)


# ---------------------------------------------------------------- by code ---


class InternalError(SluiceError):
    """INTERNAL: a bug or an unexpected failure in the shim or agent."""

    CODE = ErrorCode.INTERNAL


class BadRequest(SluiceError, ValueError):
    """BAD_REQUEST: malformed or inconsistent request fields (e.g. a path
    that is not ``namespace/key``). Also a :class:`ValueError`."""

    CODE = ErrorCode.BAD_REQUEST


class UnknownTenant(SluiceError):
    """UNKNOWN_TENANT: this process's uid/gid is not mapped to a tenant."""

    CODE = ErrorCode.UNKNOWN_TENANT


class UnknownNamespace(SluiceError):
    """UNKNOWN_NAMESPACE: the namespace is not configured for this tenant."""

    CODE = ErrorCode.UNKNOWN_NAMESPACE


class NoSuchKey(SluiceError, LookupError):
    """NO_SUCH_KEY: the object does not exist. Also a :class:`LookupError`."""

    CODE = ErrorCode.NO_SUCH_KEY


class NoSuchBucket(SluiceError):
    """NO_SUCH_BUCKET: the namespace's bucket does not exist on the store."""

    CODE = ErrorCode.NO_SUCH_BUCKET


class AccessDenied(SluiceError):
    """ACCESS_DENIED: the store or the tenant's rights refused the request."""

    CODE = ErrorCode.ACCESS_DENIED


class UnknownRegion(SluiceError):
    """UNKNOWN_REGION: the region was never issued on this connection, or
    was released."""

    CODE = ErrorCode.UNKNOWN_REGION


class RegionTooSmall(SluiceError):
    """REGION_TOO_SMALL: the object (or range) does not fit in the region at
    that offset; nothing was written. ``needed_bytes`` is what it needs (the
    object's size, or the range's span; 0 if the shim did not say)."""

    CODE = ErrorCode.REGION_TOO_SMALL
    needed_bytes = 0


class OutOfBounds(SluiceError):
    """OUT_OF_BOUNDS: offset/length fall outside the region."""

    CODE = ErrorCode.OUT_OF_BOUNDS


class InvalidRange(SluiceError):
    """INVALID_RANGE: the requested byte range is not satisfiable."""

    CODE = ErrorCode.INVALID_RANGE


class StoreUnavailable(SluiceError):
    """STORE_UNAVAILABLE: the store (or the agent) failed after retries."""

    CODE = ErrorCode.STORE_UNAVAILABLE


class TransferFailed(SluiceError):
    """TRANSFER_FAILED: the transfer broke mid-way; the destination is not valid."""

    CODE = ErrorCode.TRANSFER_FAILED


class ProtocolError(SluiceError):
    """PROTOCOL: a frame or message violated the protocol (either side)."""

    CODE = ErrorCode.PROTOCOL


class UnsupportedVersion(SluiceError):
    """UNSUPPORTED_VERSION: the shim does not speak this client's protocol version."""

    CODE = ErrorCode.UNSUPPORTED_VERSION


class Unauthenticated(SluiceError):
    """UNAUTHENTICATED: the shim's session with the agent is missing or expired."""

    CODE = ErrorCode.UNAUTHENTICATED


class PreconditionFailed(SluiceError):
    """PRECONDITION_FAILED: the object changed while it was being read."""

    CODE = ErrorCode.PRECONDITION_FAILED


class ResourceExhausted(SluiceError):
    """RESOURCE_EXHAUSTED: a limit (regions, memory) was hit."""

    CODE = ErrorCode.RESOURCE_EXHAUSTED


class QuotaExceeded(SluiceError):
    """QUOTA_EXCEEDED: a tenant quota (requests/s, in-flight, memory) refused the request."""

    CODE = ErrorCode.QUOTA_EXCEEDED


class IntegrityError(SluiceError):
    """INTEGRITY: an encrypted object failed authentication."""

    CODE = ErrorCode.INTEGRITY


class Unsupported(SluiceError):
    """UNSUPPORTED: not possible in this deployment (memory backend, hardware,
    build features), e.g. a GPU dma-buf region where the agent reaches no GPU
    memory (no DOCA, no RDMA NIC that registers dma-bufs), or GPU memory in
    a process without the CUDA driver."""

    CODE = ErrorCode.UNSUPPORTED


class AgentUnavailable(SluiceError):
    """AGENT_UNAVAILABLE: the agent is unreachable or restarting. The shim
    keeps this connection and its regions and re-opens its session with the
    agent when it is back, so retrying later succeeds."""

    CODE = ErrorCode.AGENT_UNAVAILABLE


class DeadlineExceeded(SluiceError, TimeoutError):
    """DEADLINE_EXCEEDED: the request did not finish within its deadline
    (the client's ``timeout``, or the namespace's); the shim and agent
    stopped it. Also a :class:`TimeoutError`."""

    CODE = ErrorCode.DEADLINE_EXCEEDED


# ------------------------------------------------------------ client-side ---


class ShimConnectionError(SluiceError):
    """The shim's socket could not be reached, or the connection is gone."""


class Disconnected(ShimConnectionError):
    """The connection closed (or was closed) before the answer arrived."""


class Timeout(SluiceError, TimeoutError):
    """No answer within the client's timeout. The request may still complete
    on the shim; the connection stays usable."""


class RegionReleased(UnknownRegion):
    """The region was released (or its client closed) and its memory is no
    longer mapped in this process."""


_BY_CODE: Dict[int, Type[SluiceError]] = {
    cls.CODE: cls
    for cls in (
        InternalError,
        BadRequest,
        UnknownTenant,
        UnknownNamespace,
        NoSuchKey,
        NoSuchBucket,
        AccessDenied,
        UnknownRegion,
        RegionTooSmall,
        OutOfBounds,
        InvalidRange,
        StoreUnavailable,
        TransferFailed,
        ProtocolError,
        UnsupportedVersion,
        Unauthenticated,
        PreconditionFailed,
        ResourceExhausted,
        QuotaExceeded,
        IntegrityError,
        Unsupported,
        AgentUnavailable,
        DeadlineExceeded,
    )
    if cls.CODE is not None
}


def error_class(code: int) -> Type[SluiceError]:
    """The exception class for a wire error code (``SluiceError`` if unknown)."""
    return _BY_CODE.get(code, SluiceError)


def from_detail(code: int, message: str, request_id: str = "", needed_bytes: int = 0) -> SluiceError:
    """Builds the typed exception for an ``ErrorDetail`` received from the shim."""
    err = error_class(code)(message or f"shim error code {code}", code, request_id)
    if needed_bytes and isinstance(err, RegionTooSmall):
        err.needed_bytes = needed_bytes
    return err


__all__ = [
    "ErrorCode",
    "SluiceError",
    "InternalError",
    "BadRequest",
    "UnknownTenant",
    "UnknownNamespace",
    "NoSuchKey",
    "NoSuchBucket",
    "AccessDenied",
    "UnknownRegion",
    "RegionTooSmall",
    "OutOfBounds",
    "InvalidRange",
    "StoreUnavailable",
    "TransferFailed",
    "ProtocolError",
    "UnsupportedVersion",
    "Unauthenticated",
    "PreconditionFailed",
    "ResourceExhausted",
    "QuotaExceeded",
    "IntegrityError",
    "Unsupported",
    "AgentUnavailable",
    "DeadlineExceeded",
    "ShimConnectionError",
    "Disconnected",
    "Timeout",
    "RegionReleased",
    "error_class",
    "from_detail",
]
