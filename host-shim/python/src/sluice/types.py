"""Plain result types returned by :class:`sluice.Client` and :class:`sluice.AsyncClient`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from .errors import SluiceError

#: ``sluice.common.v1.DataPath`` values as the strings used in reports.
DATA_PATHS = {0: "unknown", 1: "http", 2: "rdma", 3: "rdma-staged"}

#: Names of the capability enums of ``sluice.common.v1`` (as config files
#: spell them; checked against the protos by a test).
MEMORY_KINDS = {0: "unknown", 1: "memfd", 2: "doca-host", 3: "gpu-dmabuf"}
DATA_PATH_MODES = {0: "unknown", 1: "http", 2: "rdma", 3: "auto"}
TRANSPORTS = {0: "unknown", 1: "http-only", 2: "tcp", 3: "verbs-rc", 4: "dc"}
PLACEMENTS = {0: "unknown", 1: "direct", 2: "staged"}
ENCRYPTIONS = {0: "unknown", 1: "none", 2: "aes-256-gcm"}
ACCESS = {0: "unknown", 1: "read", 2: "write", 3: "list", 4: "delete"}
STORE_CHECKSUMS = {0: "unknown", 1: "kept", 2: "ignored"}

#: A byte range: ``(start, length)``; ``length = None`` means "to the end".
ByteRange = Tuple[int, Optional[int]]


@dataclass(frozen=True)
class ObjectInfo:
    """An object's metadata (``sluice.common.v1.ObjectInfo``).

    ``key`` is the key inside the namespace (no namespace prefix).
    """

    key: str
    size: int
    etag: str = ""
    last_modified_unix_ms: int = 0
    content_type: str = ""

    @classmethod
    def _from_wire(cls, d: Dict[str, Any]) -> "ObjectInfo":
        return cls(d["key"], d["size"], d["etag"], d["last_modified_unix_ms"], d["content_type"])


@dataclass(frozen=True)
class Transfer:
    """How one GET or PUT went (``TransferReport`` plus the object's etag/size).

    Attributes:
        request_id: trace id, also in the shim's and agent's logs.
        bytes: bytes moved.
        data_path: ``"http"``, ``"rdma"``, ``"rdma-staged"`` (``"unknown"``
            if the shim did not say).
        fallback_reason: empty unless the request fell back from the
            configured data path.
        elapsed_us: time the transfer took, in microseconds.
        parts: how many S3 requests carried the data.
        etag: the object's ETag.
        object_size: GET: size of the whole object; PUT: bytes stored.
        verified: the bytes were checked end to end (GET: against the
            object's CRC64NVME, or by decryption; PUT: the store confirmed
            them). ``False`` when nothing could check them (a ranged read,
            an object without a checksum, ``verify_checksums = false``) or
            the agent is older than the check.
        unverified_reason: why ``verified`` is ``False`` (empty when it is
            ``True``).
    """

    request_id: str
    bytes: int
    data_path: str
    fallback_reason: str
    elapsed_us: int
    parts: int
    etag: str
    object_size: int
    verified: bool = False
    unverified_reason: str = ""

    @property
    def transport(self) -> str:
        """Alias of :attr:`data_path`."""
        return self.data_path

    @property
    def fell_back(self) -> bool:
        return bool(self.fallback_reason)

    @classmethod
    def _from_wire(cls, report: Optional[Dict[str, Any]], etag: str, object_size: int) -> "Transfer":
        r = report or {
            "request_id": "",
            "bytes": 0,
            "data_path": 0,
            "fallback_reason": "",
            "elapsed_us": 0,
            "parts": 0,
            "verified": False,
            "unverified_reason": "",
        }
        return cls(
            request_id=r["request_id"],
            bytes=r["bytes"],
            data_path=DATA_PATHS.get(r["data_path"], "unknown"),
            fallback_reason=r["fallback_reason"],
            elapsed_us=r["elapsed_us"],
            parts=r["parts"],
            etag=etag,
            object_size=object_size,
            verified=r["verified"],
            unverified_reason=r["unverified_reason"],
        )


@dataclass
class ItemResult:
    """The outcome of one item of :meth:`sluice.Client.get_many`.

    Exactly one of ``transfer`` / ``error`` is set.

    Attributes:
        path: the item's path.
        ok: ``True`` if the item succeeded.
        data: the bytes read, for items read without an ``into`` region
            (``None`` for items read into a caller's region, and on error;
            a read-only ``memoryview`` of scratch memory with ``copy=False``).
        nbytes: bytes read (0 on error).
        transfer: the transfer report (``None`` on error).
        error: the typed exception for this item (``None`` on success).
        index: position of the item in the request list.
    """

    path: str
    index: int
    ok: bool = False
    data: Optional[Union[bytes, memoryview]] = None
    nbytes: int = 0
    transfer: Optional[Transfer] = None
    error: Optional[SluiceError] = None

    @property
    def data_path(self) -> Optional[str]:
        """``"http"``, ``"rdma"``, ``"rdma-staged"``; ``None`` on error."""
        return self.transfer.data_path if self.transfer else None

    #: Alias of :attr:`data_path`.
    transport = data_path

    @property
    def fallback_reason(self) -> str:
        return self.transfer.fallback_reason if self.transfer else ""

    @property
    def request_id(self) -> str:
        if self.transfer:
            return self.transfer.request_id
        return self.error.request_id if self.error else ""

    def unwrap(self) -> Optional[bytes]:
        """Returns :attr:`data`, or raises :attr:`error`."""
        if self.error is not None:
            raise self.error
        return self.data


@dataclass(frozen=True)
class ListPage:
    """One page of a listing (``sluice.shim.v1.ListPage``)."""

    objects: List[ObjectInfo]
    common_prefixes: List[str]
    next_continuation_token: str

    @classmethod
    def _from_wire(cls, d: Dict[str, Any]) -> "ListPage":
        return cls(
            [ObjectInfo._from_wire(o) for o in d["objects"]],
            list(d["common_prefixes"]),
            d["next_continuation_token"],
        )


@dataclass(frozen=True)
class Stats:
    """This connection's session counters (``StatsResult``)."""

    requests: int
    bytes_read: int
    bytes_written: int
    errors: int
    fallbacks: int
    regions: int
    registered_bytes: int

    @classmethod
    def _from_wire(cls, d: Dict[str, Any]) -> "Stats":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class NamespaceCapabilities:
    """What one namespace offers (``sluice.common.v1.NamespaceCapabilities``).

    Attributes:
        access: of ``"read"``, ``"write"``, ``"list"``, ``"delete"``.
        data_path: ``"http"``, ``"rdma"`` or ``"auto"``.
        transport: ``"http-only"``, ``"tcp"``, ``"verbs-rc"`` or ``"dc"``
            (the one in use; ``degraded_reason`` says why if it is a fallback).
        placement: ``"direct"`` or ``"staged"``.
        encryption: ``"none"`` or ``"aes-256-gcm"``.
        max_object_bytes: the largest object a put may write here.
        max_window_bytes: the largest window one RDMA descriptor covers (0: HTTP only).
        store_checksums: what the store does with the checksums the agent
            sends, as learned from its replies when the session opened:
            ``"kept"`` (it checks, keeps and returns them), ``"ignored"``
            (Content-MD5 goes with every upload and reads are checked against
            the CRC64NVME the agent keeps in each object's metadata) or
            ``"unknown"`` (no reply has told yet).
    """

    name: str
    access: List[str]
    data_path: str
    transport: str
    degraded_reason: str
    placement: str
    encryption: str
    max_object_bytes: int
    max_window_bytes: int
    get_part_bytes: int
    put_part_bytes: int
    rdma_min_bytes: int
    request_timeout_ms: int
    store_checksums: str = "unknown"

    @classmethod
    def _from_wire(cls, d: Dict[str, Any]) -> "NamespaceCapabilities":
        return cls(
            name=d["name"],
            access=[ACCESS.get(a, "unknown") for a in d["access"]],
            data_path=DATA_PATH_MODES.get(d["data_path"], "unknown"),
            transport=TRANSPORTS.get(d["transport"], "unknown"),
            degraded_reason=d["degraded_reason"],
            placement=PLACEMENTS.get(d["placement"], "unknown"),
            encryption=ENCRYPTIONS.get(d["encryption"], "unknown"),
            max_object_bytes=d["max_object_bytes"],
            max_window_bytes=d["max_window_bytes"],
            get_part_bytes=d["get_part_bytes"],
            put_part_bytes=d["put_part_bytes"],
            rdma_min_bytes=d["rdma_min_bytes"],
            request_timeout_ms=d["request_timeout_ms"],
            store_checksums=STORE_CHECKSUMS.get(d["store_checksums"], "unknown"),
        )


@dataclass(frozen=True)
class Capabilities:
    """What this connection can do, agreed at the handshake
    (``sluice.common.v1.Capabilities``). Requests outside it fail with
    :class:`sluice.errors.Unsupported` before any byte moves.

    Attributes:
        agent_memory / shim_memory: region memory the agent reaches and the
            shim registers (``"memfd"``, ``"doca-host"``, ``"gpu-dmabuf"``).
        region_memory: the kinds both handle (what ``register`` can do).
        gpu_staging: how GPU regions take bytes that cannot be placed
            directly ("" when GPU memory cannot be reached).
        namespaces: per namespace, by name.
    """

    agent_memory: List[str]
    shim_memory: List[str]
    max_batch_items: int
    max_region_bytes: int
    max_registered_bytes: int
    gpu_staging: str
    namespaces: Dict[str, NamespaceCapabilities]

    @property
    def region_memory(self) -> List[str]:
        return [k for k in self.agent_memory if k in self.shim_memory]

    @property
    def gpu_dmabuf_path(self) -> str:
        """How the agent reaches GPU memory registered as a dma-buf
        (``Client.register_dmabuf``): ``"doca"`` (a BlueField: DMA through
        DPU memory, any data path), ``"rdma"`` (a co-located agent whose NIC
        registers dma-bufs: direct RDMA GETs only), or "" (not here; GPU
        regions then go through the client's own staging, see
        ``Client.gpu_paths``)."""
        if "gpu-dmabuf" not in self.region_memory:
            return ""
        return "doca" if self.gpu_staging else "rdma"

    @classmethod
    def _from_wire(cls, d: Optional[Dict[str, Any]]) -> "Capabilities":
        if d is None:
            return cls([], [], 0, 0, 0, "", {})
        namespaces = [NamespaceCapabilities._from_wire(n) for n in d["namespaces"]]
        return cls(
            agent_memory=[MEMORY_KINDS.get(k, "unknown") for k in d["agent_memory"]],
            shim_memory=[MEMORY_KINDS.get(k, "unknown") for k in d["shim_memory"]],
            max_batch_items=d["max_batch_items"],
            max_region_bytes=d["max_region_bytes"],
            max_registered_bytes=d["max_registered_bytes"],
            gpu_staging=d["gpu_staging"],
            namespaces={n.name: n for n in namespaces},
        )


@dataclass(frozen=True)
class GetSpec:
    """One item of :meth:`sluice.Client.get_many`.

    Attributes:
        path: ``"namespace/key"``.
        into: a region to read into; without one the bytes are returned in
            :attr:`ItemResult.data`.
        offset: where in ``into`` the bytes land.
        range: ``(start, length)`` or ``(start, None)`` for "to the end".
        if_match: the ETag the object must have ("" = any); another
            version fails the item with :class:`~sluice.PreconditionFailed`.
    """

    path: str
    into: Optional[Any] = None  # sluice.Region
    offset: int = 0
    range: Optional[ByteRange] = None
    if_match: str = ""


GetItem = Union[str, GetSpec, Tuple[Any, ...]]


def as_spec(item: GetItem) -> GetSpec:
    """Normalises a ``get_many`` item: a path, a :class:`GetSpec`, or a
    tuple of :class:`GetSpec`'s fields."""
    if isinstance(item, GetSpec):
        return item
    if isinstance(item, str):
        return GetSpec(item)
    if isinstance(item, tuple):
        return GetSpec(*item)
    if isinstance(item, dict):
        return GetSpec(**item)
    raise TypeError(f"get_many items are paths, GetSpec or tuples, not {type(item).__name__}")


__all__ = [
    "ObjectInfo",
    "Transfer",
    "ItemResult",
    "ListPage",
    "Stats",
    "Capabilities",
    "NamespaceCapabilities",
    "GetSpec",
    "ByteRange",
    "DATA_PATHS",
]
