"""Sluice: S3 objects straight into shared memory, through the local shim.

A pure-Python client for ``sluice-shim``'s Unix-socket protocol
(``docs/shim-protocol.md``)::

    import sluice

    with sluice.Client() as c:                      # $SLUICE_SOCKET or /run/sluice/shim.sock
        c.put("data/hello", b"hi")
        assert c.get_bytes("data/hello") == b"hi"
        with c.register(1 << 20) as region:         # shim-created memfd, mapped here
            t = c.get("data/hello", into=region)
            print(region.numpy()[: t.bytes], t.data_path, t.fallback_reason)

See :class:`Client` (blocking, thread-safe), :class:`AsyncClient` (asyncio),
:mod:`sluice.errors` (typed exceptions) and :mod:`sluice.torch` (datasets).
"""

from ._core import DEFAULT_SOCKET, __version__, resolve_socket
from ._wire import MAX_FRAME_LEN, PROTOCOL_VERSION
from .aio import AsyncClient
from .client import Client
from .errors import (
    AccessDenied,
    AgentUnavailable,
    BadRequest,
    DeadlineExceeded,
    Disconnected,
    ErrorCode,
    IntegrityError,
    InternalError,
    InvalidRange,
    NoSuchBucket,
    NoSuchKey,
    OutOfBounds,
    PreconditionFailed,
    ProtocolError,
    QuotaExceeded,
    RegionReleased,
    RegionTooSmall,
    ResourceExhausted,
    ShimConnectionError,
    SluiceError,
    StoreUnavailable,
    Timeout,
    TransferFailed,
    Unauthenticated,
    UnknownNamespace,
    UnknownRegion,
    UnknownTenant,
    Unsupported,
    UnsupportedVersion,
)
from .gpu import GpuRegion
from .region import Region
from .types import Capabilities, GetSpec, ItemResult, ListPage, NamespaceCapabilities, ObjectInfo, Stats, Transfer

__all__ = [
    "GpuRegion",
    "__version__",
    "Client",
    "AsyncClient",
    "Region",
    "Capabilities",
    "NamespaceCapabilities",
    "GetSpec",
    "ItemResult",
    "ListPage",
    "ObjectInfo",
    "Stats",
    "Transfer",
    "DEFAULT_SOCKET",
    "MAX_FRAME_LEN",
    "PROTOCOL_VERSION",
    "resolve_socket",
    "ErrorCode",
    "SluiceError",
    "AccessDenied",
    "AgentUnavailable",
    "DeadlineExceeded",
    "BadRequest",
    "Disconnected",
    "IntegrityError",
    "Unsupported",
    "InternalError",
    "InvalidRange",
    "NoSuchBucket",
    "NoSuchKey",
    "OutOfBounds",
    "PreconditionFailed",
    "ProtocolError",
    "QuotaExceeded",
    "RegionReleased",
    "RegionTooSmall",
    "ResourceExhausted",
    "ShimConnectionError",
    "StoreUnavailable",
    "Timeout",
    "TransferFailed",
    "Unauthenticated",
    "UnknownNamespace",
    "UnknownRegion",
    "UnknownTenant",
    "UnsupportedVersion",
]
