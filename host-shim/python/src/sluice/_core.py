"""State and operations shared by the blocking and the asyncio client.

Every operation is written once, as a generator that does no I/O: it yields a
*batch* of :class:`Call`\\ s and receives, in the same order, one outcome per
call (a :class:`Reply`, or the :class:`~sluice.SluiceError` for that call).
A driver sends the whole batch before waiting for any answer, so each batch
is pipelined on the connection; the blocking client drives operations with
threads-and-futures, the asyncio client with asyncio futures.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import itertools
import mmap
import os
import threading
import weakref
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _wire
from ._gpu_ops import PIN_AUTO, GpuOps
# Re-exported: the clients and the GPU operations take them from here.
from ._ops import Call, Op, Outcome, Reply, all_of, check, close_fd, drive_step, one  # noqa: F401
from ._scratch import _byte_array, _pow2, _scratch_size, _ScratchPool
from .errors import (
    AgentUnavailable,
    BadRequest,
    DeadlineExceeded,
    InternalError,
    ProtocolError,
    RegionTooSmall,
    ShimConnectionError,
    SluiceError,
    Timeout,
    Unsupported,
    from_detail,
)
from .gpu import DEFAULT_LANE_BYTES, DEFAULT_STAGING_BYTES, GpuRegion
from .region import Region
from .types import ByteRange, Capabilities, GetItem, ItemResult, ListPage, ObjectInfo, Stats, Transfer, as_spec

__version__ = "0.1.0"

DEFAULT_SOCKET = "/run/sluice/shim.sock"
LOCAL_STACK_SOCKET = ".sluice/run/shim.sock"

#: Default end-to-end deadline of each request, seconds (the agent's default
#: namespace deadline is the same).
DEFAULT_TIMEOUT = 300.0

#: Most items in one GetBatch request (the shim's default ``max_batch_items``).
MAX_BATCH_ITEMS = 1024
#: ``Response.item`` of an answer about a whole batch (refused as such).
WHOLE_BATCH = 0xFFFFFFFF
#: Bytes a scratch slot gets for an object of unknown size before the client
#: has seen any (then: the largest recent size, rounded up to a power of 2).
FIRST_SIZE_GUESS = 256 << 10
#: The most the size guess grows to: one large object must not make every
#: later small read register (and batch around) a slot of its size; larger
#: objects are read again at the size the shim reports.
MAX_SIZE_GUESS = 64 << 20
#: Seconds past a request's deadline that the client still waits for its
#: answer: the shim (and the agent, whose deadline starts when the request
#: reaches it) answer DEADLINE_EXCEEDED themselves, per item of a batch,
#: after the deadline, and that answer says more than a local Timeout.
#: The shim's own grace is 2 s; the Rust client waits the same 5 s.
ANSWER_GRACE = 5.0
#: Seconds one frame's send may wait for the shim to take any of it (a shim
#: that stopped reading): the connection then ends with a clear error
#: instead of holding every thread that sends on it. The shim's own limit
#: for a client that takes no answers is 60 s too.
SEND_WAIT = 60.0

#: Errors that may come before the agent has stopped writing into a
#: request's region: the shim gave up on it (its deadline, the agent link
#: lost), or the client did, or nobody can say. A scratch region such a
#: request used is released, never used again for another read, whose
#: bytes late writes would then overwrite.
MAY_STILL_WRITE = (DeadlineExceeded, AgentUnavailable, InternalError, ShimConnectionError, Timeout, ProtocolError)


def resolve_socket(socket: "Optional[Union[str, os.PathLike[str]]]") -> str:
    """The shim socket to use: ``socket``, else ``$SLUICE_SOCKET``, else
    ``./.sluice/run/shim.sock`` if it exists (a ``sluice up`` stack), else
    ``/run/sluice/shim.sock`` (the same order as the ``sluice`` CLI)."""
    if socket is not None:
        return os.fspath(socket)
    env = os.environ.get("SLUICE_SOCKET")
    if env:
        return env
    if os.path.exists(LOCAL_STACK_SOCKET):
        return LOCAL_STACK_SOCKET
    return DEFAULT_SOCKET


def _u64(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if not 0 <= v < 1 << 64:
        raise BadRequest(f"{name} {v} is out of range (0 <= {name} < 2**64)")
    return v


def _path(p: Any) -> str:
    if type(p) is str:  # the usual case, before the (slow) ABC check
        return p
    if isinstance(p, os.PathLike):
        p = os.fspath(p)
    if not isinstance(p, str):
        raise TypeError(f"path must be a str like 'namespace/key', not {type(p).__name__}")
    return p


def _range(r: Optional[ByteRange]) -> Optional[Dict[str, Any]]:
    if r is None:
        return None
    if isinstance(r, range) and r.step == 1:
        return {"start": _u64("range start", r.start), "length": _u64("range length", max(0, r.stop - r.start))}
    try:
        start, length = r  # type: ignore[misc]
    except (TypeError, ValueError):
        raise TypeError("range must be (start, length) or (start, None)") from None
    return {"start": _u64("range start", start), "length": None if length is None else _u64("range length", length)}


def _region_id(region: Any) -> str:
    if isinstance(region, Region):
        return region.id
    if isinstance(region, str):
        return region
    raise TypeError(f"expected a Region (or a region id), not {type(region).__name__}")


_LIVE: "weakref.WeakSet[CoreClient]" = weakref.WeakSet()


#: No per-call timeout in force (use the client's).
_UNSET: Any = object()
#: A per-call timeout set by the public methods' ``timeout=`` for the
#: duration of one call (a context variable: per thread and per asyncio task).
_CALL_TIMEOUT: "contextvars.ContextVar[Any]" = contextvars.ContextVar("sluice_call_timeout", default=_UNSET)


@contextlib.contextmanager
def call_timeout(timeout: Optional[float]) -> Iterator[None]:
    """Within the block, requests use ``timeout`` seconds (``None``: the
    client's own ``timeout``)."""
    if timeout is None:
        yield
        return
    if timeout <= 0:
        raise ValueError("timeout must be > 0 seconds")
    token = _CALL_TIMEOUT.set(float(timeout))
    try:
        yield
    finally:
        _CALL_TIMEOUT.reset(token)


def _after_fork_in_child() -> None:
    """A forked child must not use its parent's connections (the answers go
    to the parent's reader). Close the child's copies of their sockets
    (close, not shutdown: the parent's connection stays intact) so that the
    shim sees the connection end when the parent goes away."""
    for c in list(_LIVE):
        c._abandon()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class CoreClient(GpuOps):
    """Connection state and protocol operations; no I/O."""

    #: GPU regions need a driver that may block on copy engines and on a
    #: free staging lane: the blocking client. (The asyncio client refuses them.)
    _GPU_OK = False

    def __init__(
        self,
        socket: "Optional[Union[str, os.PathLike[str]]]",
        *,
        timeout: Optional[float],
        client_name: Optional[str],
        scratch_bytes: int,
        get_many_batch_bytes: int,
        cuda: Any = None,
        gpu_staging_bytes: int = DEFAULT_STAGING_BYTES,
        gpu_lane_bytes: int = DEFAULT_LANE_BYTES,
        pin_regions: str = PIN_AUTO,
    ) -> None:
        self._init_gpu(cuda, gpu_staging_bytes, gpu_lane_bytes, pin_regions)
        self.socket_path = resolve_socket(socket)
        self.timeout = timeout
        self._client_name = client_name or f"sluice-python/{__version__}"
        self._next_id = 1
        self._id_lock = threading.Lock()
        self._pending: Dict[int, Any] = {}
        self._pending_lock = threading.Lock()
        self._regions: "weakref.WeakValueDictionary[str, Region]" = weakref.WeakValueDictionary()
        self._pool = _ScratchPool(scratch_bytes)
        self._batch_bytes = max(1, get_many_batch_bytes)
        self._batches: Dict[int, _Gather] = {}  # id -> answers of a GetBatch so far
        # Scratch regions lent to zero-copy results (copy=False) whose last
        # view is gone: back to the pool at the next checkout. Appended from
        # a finalizer (any thread, any moment), hence a deque and no lock.
        #: Scratch regions whose lent views are all gone, and whether they
        #: may be used again (see ``MAY_STILL_WRITE``).
        self._lent: "Deque[Tuple[Region, bool]]" = deque()
        # Slot size for bytes-items of unknown size: the largest size seen
        # lately (loaders read samples of similar size), so most fit in one
        # request and the rest are read again at the size the shim reports.
        self._size_guess = FIRST_SIZE_GUESS
        self._decoder = _wire.FrameDecoder()
        self._orphans: List[str] = []  # regions registered for callers that gave up
        self._last_conn_error = ""
        self.tenant = ""
        self.namespaces: List[str] = []
        #: What this connection can do (set by the handshake).
        self.capabilities = Capabilities._from_wire(None)
        self.closed = False
        self._pid = os.getpid()
        _LIVE.add(self)

    # ------------------------------------------------------------ framing --
    def _new_id(self) -> int:
        with self._id_lock:
            i = self._next_id
            self._next_id += 1
            return i

    def _timeout_now(self) -> Optional[float]:
        """The timeout of a request sent now: the call's, else the client's."""
        t = _CALL_TIMEOUT.get()
        return self.timeout if t is _UNSET else t

    def _encode(self, id_: int, call: Call) -> bytes:
        # The deadline travels with the request: the shim and the agent stop
        # working on it when it passes (DEADLINE_EXCEEDED), not only this
        # client's wait.
        t = self._timeout_now()
        timeout_ms = 0 if t is None else min(max(int(t * 1000), 1), (1 << 32) - 1)
        try:
            frame = _wire.encode_frame(
                "Request",
                {"id": id_, "request_id": call.request_id, "timeout_ms": timeout_ms, call.op: call.fields},
            )
        except _wire.WireError as e:
            raise BadRequest(str(e)) from None
        if call.op == "get_batch":
            # Its answers (one per item) are gathered before the call completes.
            self._batches[id_] = _Gather(len(call.fields["items"]))
        return frame

    def _gpu_allowed(self) -> None:
        if not self._GPU_OK:
            raise Unsupported("GPU regions are served by the blocking sluice.Client; use it (e.g. in a thread)")

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise ShimConnectionError(
                "this Client was created in another process (before a fork); create a new Client in each process"
            )
        if self.closed:
            raise ShimConnectionError(f"the client is closed{self._why()}")

    def _abandon(self) -> None:
        self.closed = True
        self._last_conn_error = "inherited from the parent process across fork"
        sock = getattr(self, "_sock", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _note_end(self, err: str) -> None:
        """Records why the connection ended, after anything the shim said
        (an ``id = 0`` error) just before."""
        if self._last_conn_error and err not in self._last_conn_error:
            self._last_conn_error = f"{self._last_conn_error}; then {err}"
        else:
            self._last_conn_error = err

    def _why(self) -> str:
        return f" ({self._last_conn_error})" if self._last_conn_error else ""

    def _parse(self, payload: bytes) -> Optional[Tuple[int, Outcome]]:
        """Decodes one response frame; claims its descriptor if it has one.
        ``None`` when the frame was one item of a batch still incomplete."""
        id_, out, item = self._parse_one(payload)
        g = self._batches.get(id_)
        if g is None:
            return id_, out
        g.put(item, out)
        if g.left > 0:
            return None
        del self._batches[id_]
        return id_, Reply(id_, "", "batch", {"items": g.outs})

    def _parse_one(self, payload: bytes) -> Tuple[int, Outcome, int]:
        try:
            resp = _wire.decode_message("Response", payload)
        except _wire.WireError as e:
            raise ProtocolError(f"undecodable response from the shim: {e}") from None
        kind: Optional[str] = resp["result"]
        rid: str = resp["request_id"]
        if kind is None:
            return resp["id"], ProtocolError("response without a result", request_id=rid), resp["item"]
        body: Dict[str, Any] = resp[kind]
        fd = None
        if kind == "registered" and body["fd_attached"]:
            fd = self._decoder.take_fd()
        for stray in self._decoder.stray_fds():
            close_fd(stray)
        if kind == "error":
            return resp["id"], from_detail(body["code"], body["message"], rid, body["needed_bytes"]), resp["item"]
        return resp["id"], Reply(resp["id"], rid, kind, body, fd), resp["item"]

    def _orphan(self, outcome: Outcome) -> None:
        """An answer nobody waits for (timed out / cancelled): if it created
        a region, release it on the next request."""
        if isinstance(outcome, Reply):
            close_fd(outcome.fd)
            if outcome.kind == "registered":
                with self._pending_lock:
                    self._orphans.append(outcome.body["region_id"])

    def _take_orphans(self) -> List[str]:
        with self._pending_lock:
            out, self._orphans = self._orphans, []
            return out

    def _requeue_orphans(self, rids: Sequence[str]) -> None:
        """Orphaned regions taken for release and not released after all."""
        with self._pending_lock:
            self._orphans.extend(rids)

    def _connection_level(self, outcome: Outcome) -> None:
        if isinstance(outcome, SluiceError):
            self._last_conn_error = str(outcome)

    # ------------------------------------------------------------ regions --
    def _track(self, region: Region) -> Region:
        self._regions[region.id] = region
        return region

    def _invalidate_all(self) -> None:
        self._close_gpu()
        for r in list(self._regions.values()):
            self._unpin(r)
            r._invalidate()
        for r in self._pool.clear():
            self._unpin(r)
            r._invalidate()

    def _release_later(self, region: Region) -> None:
        """Forgets ``region`` here and queues its release; the driver sends
        queued releases without waiting for their answers."""
        self._unpin(region)
        region._invalidate()
        self._regions.pop(region.id, None)
        self._release_later_id(region.id)

    def _checkout(self, n: int) -> "Op[Region]":
        while self._lent:
            lent, reuse = self._lent.popleft()
            if not lent.released:
                self._give_back(lent, reuse)
        r = self._pool.take(n)
        if r is not None:
            return r
        region = yield from self._register_op(_scratch_size(n))
        region._scratch = True
        return region

    def _lend(self, region: Region, spans: Sequence[Tuple[int, int]], reuse: bool = True) -> List[memoryview]:
        """Read-only views of ``spans`` (offset, length) of scratch ``region``,
        without a copy. The region is lent to them: it goes back to the pool
        (or, not ``reuse``, to the shim) only once the last view (and every
        slice of one) is gone."""
        owner = _byte_array(region.nbytes).from_buffer(region._map())
        whole = memoryview(owner).cast("B")
        views = [whole[off : off + n].toreadonly() for off, n in spans]
        weakref.finalize(owner, self._lent.append, (region, reuse))
        return views

    def _learn_size(self, n: int) -> None:
        """The next unknown-size read's slot: the last size read, as a power
        of two, at most ``MAX_SIZE_GUESS`` (a read that failed teaches
        nothing: a too-large object would make every later read fail to
        register its slot)."""
        self._size_guess = min(_pow2(n), MAX_SIZE_GUESS)

    def _give_back(self, region: Region, reuse: bool = True) -> None:
        """Returns a scratch region: to the pool, or (if the pool is full, or
        an abandoned request may still be using it) to the shim."""
        if not reuse or not self._pool.give(region):
            self._release_later(region)
        for r in self._pool.pop_evicted():
            self._release_later(r)

    # --------------------------------------------------------- operations --
    def _hello_op(self, version: int = _wire.PROTOCOL_VERSION) -> "Op[None]":
        r = yield from one(Call("hello", {"version": version, "client": self._client_name}), "hello")
        self.tenant = r.body["tenant"]
        self.namespaces = list(r.body["namespaces"])
        self.capabilities = Capabilities._from_wire(r.body["capabilities"])
        # What the native reader names to share this connection's session
        # (and so its regions); "" from a shim older than joining.
        self._join_token: str = r.body["join_token"]

    def _register_dmabuf_op(self, fd: int, nbytes: int, offset: int, gpu_address: int) -> "Op[str]":
        body = {
            "length": _u64("nbytes", nbytes),
            "fd_attached": True,
            "kind": _wire.REGION_KIND_GPU_DMABUF,
            "dmabuf_offset": _u64("offset", offset),
            "gpu_address": _u64("gpu_address", gpu_address),
        }
        r = yield from one(Call("register", body, fd=fd), "registered")
        return str(r.body["region_id"])

    def _register_op(
        self, nbytes: int, fd: Optional[int] = None, local: bool = False, pin: bool = True
    ) -> "Op[Region]":
        nbytes = _u64("nbytes", nbytes)
        own_fd = None
        if local:
            own_fd = os.memfd_create("sluice-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(own_fd, nbytes)
                # The shim and agent map only memory that cannot shrink under
                # them (a truncated mapping faults whoever touches it).
                fcntl.fcntl(own_fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            except OSError:
                os.close(own_fd)
                raise
            fd = own_fd
        elif fd is not None:
            # Checked here: a descriptor that is not open would fail the
            # send itself, which the client could not tell from a lost
            # connection.
            try:
                os.fstat(fd)
            except (OSError, TypeError, ValueError, OverflowError) as e:
                raise BadRequest(f"fd={fd!r} is not an open descriptor of this process ({e})") from None
        try:
            call = Call("register", {"length": nbytes, "fd_attached": fd is not None}, fd=fd)
            r = yield from one(call, "registered")
            got_fd = r.fd
            if fd is None and (got_fd is None or not r.body["fd_attached"]):
                self._release_later_id(r.body["region_id"])
                raise ProtocolError("Registered came without a descriptor", request_id=r.request_id)
            map_fd = fd if fd is not None else got_fd
            assert map_fd is not None
            length = r.body["length"] or nbytes
            try:
                mm = mmap.mmap(map_fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError) as e:
                self._release_later_id(r.body["region_id"])
                raise SluiceError(f"mapping region {r.body['region_id']} failed: {e}") from e
            finally:
                close_fd(got_fd)  # mmap keeps its own duplicate
            region = self._track(Region(self, r.body["region_id"], length, mm, local=fd is not None))
            if pin:
                self._maybe_pin(region)
            return region
        finally:
            close_fd(own_fd)

    def _release_later_id(self, region_id: str) -> None:
        with self._pending_lock:
            self._orphans.append(region_id)

    def _release_op(self, region: Union[Region, str]) -> "Op[None]":
        rid = _region_id(region)
        try:
            yield from one(Call("release", {"region_id": rid}), "released")
        finally:
            r = region if isinstance(region, Region) else self._regions.get(rid)
            if r is not None and r._owner is self:  # never another client's region
                self._unpin(r)
                r._invalidate()
                self._regions.pop(rid, None)

    def _get_op(
        self, path: Any, into: Any, offset: int, range: Optional[ByteRange], request_id: str = "", if_match: str = ""
    ) -> "Op[Transfer]":
        if isinstance(into, GpuRegion):
            if not isinstance(if_match, str):
                raise TypeError("if_match must be a str (an ETag as a Transfer returned it)")
            self._gpu_allowed()
            return (yield from self._gpu_get_op(_path(path), into, _u64("offset", offset), _range(range), if_match, request_id))
        call = self._get_call(path, into, offset, range, request_id, if_match)
        r = yield from one(call, "get")
        return Transfer._from_wire(r.body["report"], r.body["etag"], r.body["object_size"])

    def _get_call(
        self, path: Any, into: Any, offset: int, range: Optional[ByteRange], request_id: str = "", if_match: str = ""
    ) -> Call:
        if into is None:
            raise TypeError("get() needs a region: get(path, into=region); use get_bytes() for bytes")
        if not isinstance(if_match, str):
            raise TypeError("if_match must be a str (an ETag as a Transfer returned it)")
        fields = {
            "path": _path(path),
            "range": _range(range),
            "region_id": _region_id(into),
            "offset": _u64("offset", offset),
            "if_match": if_match,
        }
        return Call("get", fields, request_id=request_id)

    def _put_op(
        self,
        path: Any,
        src: Any,
        offset: int = 0,
        length: Optional[int] = None,
        content_type: str = "",
        request_id: str = "",
    ) -> "Op[Transfer]":
        path = _path(path)
        if not isinstance(content_type, str):
            raise TypeError("content_type must be a str")
        if isinstance(src, GpuRegion):
            self._gpu_allowed()
            n = None if length is None else _u64("length", length)
            return (yield from self._gpu_put_op(path, src, _u64("offset", offset), n, content_type, request_id))
        if isinstance(src, (Region, str)):
            if length is None:
                if not isinstance(src, Region):
                    raise TypeError("put() by region id needs length=")
                length = src.nbytes - _u64("offset", offset) if offset <= src.nbytes else 0
            fields = {
                "path": path,
                "region_id": _region_id(src),
                "offset": _u64("offset", offset),
                "length": _u64("length", length),
                "content_type": content_type,
            }
            r = yield from one(Call("put", fields, request_id=request_id), "put")
            return Transfer._from_wire(r.body["report"], r.body["etag"], length)
        try:
            data = memoryview(src).cast("B")
        except TypeError:
            raise TypeError(f"put() takes a Region or a bytes-like object, not {type(src).__name__}") from None
        if offset or length is not None:
            data = data[_u64("offset", offset) :]
            if length is not None:
                data = data[: _u64("length", length)]
        n = data.nbytes
        region = yield from self._checkout(max(n, 1))
        reuse = True
        try:
            region.write(data)
            fields = {"path": path, "region_id": region.id, "offset": 0, "length": n, "content_type": content_type}
            r = yield from one(Call("put", fields, request_id=request_id), "put")
            return Transfer._from_wire(r.body["report"], r.body["etag"], n)
        except GeneratorExit:
            reuse = False  # abandoned mid-request: the shim may still use the region
            raise
        finally:
            self._give_back(region, reuse)

    def _get_bytes_op(
        self,
        path: Any,
        range: Optional[ByteRange] = None,
        size_hint: Optional[int] = None,
        request_id: str = "",
        copy: bool = True,
    ) -> "Op[Tuple[Any, Transfer]]":
        path = _path(path)
        rng = _range(range)
        exact = rng is not None and rng["length"] is not None
        want = rng["length"] if exact else (size_hint or self._size_guess)
        # One request: into a scratch slot of the known or guessed size. If
        # the object is bigger, the shim says how big and it is read again
        # (a HEAD only if it could not say).
        for attempt in itertools.count():
            region = yield from self._checkout(max(want, 1))
            reuse, lent = True, False
            try:
                fields = {"path": path, "range": rng, "region_id": region.id, "offset": 0}
                (out,) = yield [Call("get", fields, request_id=request_id)]
                if isinstance(out, RegionTooSmall) and attempt < 3:
                    want = out.needed_bytes
                    if not want:
                        info = check((yield [Call("head", {"path": path})])[0], "head")
                        want = _span(info.body["size"], rng)
                    continue
                if isinstance(out, MAY_STILL_WRITE):
                    reuse = False
                r = check(out, "get")
                t = Transfer._from_wire(r.body["report"], r.body["etag"], r.body["object_size"])
                if t.bytes > region.nbytes:
                    reuse = False
                    raise ProtocolError(f"the shim reported {t.bytes} bytes read into a {region.nbytes}-byte region")
                if not exact:
                    self._learn_size(t.bytes)
                if copy:
                    return region.read(0, t.bytes), t
                lent = True
                return self._lend(region, [(0, t.bytes)])[0], t
            except GeneratorExit:
                reuse = False  # abandoned mid-request: the shim may still use the region
                raise
            finally:
                if not lent:
                    self._give_back(region, reuse)
        raise AssertionError("unreachable")  # pragma: no cover

    def _get_many_op(self, items: Sequence[GetItem], copy: bool = True) -> "Op[List[ItemResult]]":
        specs = [as_spec(i) for i in items]
        results = [ItemResult(_path(s.path), i) for i, s in enumerate(specs)]
        # Validate everything before sending anything.
        direct: List[Tuple[int, Dict[str, Any]]] = []
        todo: List[Tuple[int, int, bool]] = []  # bytes-items: (index, slot size, size known)
        on_gpu: List[Any] = []  # items into GPU regions: (index, path, region, offset, range, if_match)
        for i, s in enumerate(specs):
            if isinstance(s.into, GpuRegion):
                self._gpu_allowed()
                _range(s.range)
                on_gpu.append((i, results[i].path, s.into, _u64("offset", s.offset), s.range, s.if_match))
            elif s.into is not None:
                direct.append((i, self._get_call(s.path, s.into, s.offset, s.range, "", s.if_match).fields))
            else:
                rng = _range(s.range)
                known = rng is not None and rng["length"] is not None
                todo.append((i, rng["length"] if known else 0, known))

        # Every item in one GetBatch per chunk (items of caller regions all
        # in the first), bytes-items into one scratch region per chunk at
        # offsets; items bigger than their slot are read again in a later
        # round at the size the shim reported.
        for round_ in range(3):
            todo = [(i, n if known else (n or self._size_guess), known) for i, n, known in todo]
            again: List[Tuple[int, int, bool]] = []
            seen = 0
            while direct or todo:
                chunk: List[Tuple[int, int, int]] = []  # (index, offset in scratch, slot bytes)
                known_of: Dict[int, bool] = {}
                total = 0
                while (
                    todo
                    and len(direct) + len(chunk) < MAX_BATCH_ITEMS
                    and (not chunk or total + _slot(todo[0][1]) <= self._batch_bytes)
                ):
                    i, n, known = todo[0]
                    chunk.append((i, total, _slot(n)))
                    known_of[i] = known
                    total += _slot(n)
                    todo.pop(0)
                mine, direct = direct[:MAX_BATCH_ITEMS], direct[MAX_BATCH_ITEMS:]
                region = None
                if chunk:
                    try:
                        region = yield from self._checkout(total)
                    except SluiceError as e:
                        # No slot for these items (a region too large to
                        # register): theirs is the error, not the call's.
                        for i, _, _ in chunk:
                            results[i].error = e
                        chunk = []
                        if not mine:
                            continue
                reuse, lent = True, False
                filled: List[Tuple[int, int]] = []  # (index, offset) of items read into `region`
                try:
                    fields = [f for _, f in mine]
                    fields += [
                        {
                            "path": results[i].path,
                            "range": _range(specs[i].range),
                            "region_id": region.id,
                            "offset": off,
                            "max_bytes": slot,
                        }
                        for i, off, slot in chunk
                        if region is not None
                    ]
                    (out,) = yield [Call("get_batch", {"items": fields})]
                    outs = _batch_outcomes(out, len(fields))
                    for (i, _), o in zip(mine, outs):
                        _fill(results[i], o, None)
                    for (i, off, slot), o in zip(chunk, outs[len(mine) :]):
                        known = known_of[i]
                        if isinstance(o, RegionTooSmall) and round_ < 2:
                            try:
                                need = o.needed_bytes or (yield from self._size_of(results[i].path, specs[i].range))
                            except SluiceError as e:
                                results[i].error = e
                                continue
                            # Read again at the size the shim said; its
                            # success teaches the slot size, as any would.
                            again.append((i, need, known))
                            continue
                        _fill(results[i], o, (region, off) if copy else None, slot)
                        if isinstance(results[i].error, MAY_STILL_WRITE):
                            reuse = False
                        if results[i].ok:
                            filled.append((i, off))
                            if not known:
                                seen = max(seen, results[i].nbytes)
                    if not copy and filled and region is not None:
                        views = self._lend(region, [(off, results[i].nbytes) for i, off in filled], reuse)
                        lent = True
                        for (i, _), v in zip(filled, views):
                            results[i].data = v
                except GeneratorExit:
                    reuse = False  # abandoned mid-request: the shim may still use the region
                    raise
                finally:
                    if region is not None and not lent:
                        self._give_back(region, reuse)
            if seen:
                self._learn_size(seen)
            if not again:
                break
            todo = again
        yield from self._gpu_items_op(on_gpu, results)
        return results

    def _size_of(self, path: str, rng: Optional[ByteRange]) -> "Op[int]":
        info = check((yield [Call("head", {"path": path})])[0], "head")
        return _span(info.body["size"], _range(rng))

    def _head_op(self, path: Any, request_id: str = "") -> "Op[ObjectInfo]":
        r = yield from one(Call("head", {"path": _path(path)}, request_id=request_id), "head")
        return ObjectInfo._from_wire(r.body)

    def _list_page_op(
        self, prefix: Any, continuation_token: str = "", max_keys: int = 0, delimiter: str = "", request_id: str = ""
    ) -> "Op[ListPage]":
        if _u64("max_keys", max_keys) > 0xFFFFFFFF:
            raise BadRequest("max_keys must fit in 32 bits")
        fields = {
            "path": _path(prefix),
            "continuation_token": continuation_token,
            "max_keys": max_keys,
            "delimiter": delimiter,
        }
        r = yield from one(Call("list", fields, request_id=request_id), "list")
        return ListPage._from_wire(r.body)

    def _delete_op(self, path: Any, request_id: str = "") -> "Op[None]":
        yield from one(Call("delete", {"path": _path(path)}, request_id=request_id), "deleted")

    def _stats_op(self) -> "Op[Stats]":
        r = yield from one(Call("stats", {}), "stats")
        return Stats._from_wire(r.body)


def _span(size: int, rng: Optional[Dict[str, Any]]) -> int:
    if rng is None:
        return size
    avail = max(0, size - rng["start"])
    return avail if rng["length"] is None else min(avail, rng["length"])


def _slot(span: int) -> int:
    """Room for one item in a shared scratch region (64-byte aligned, >= 1 byte)."""
    return (max(span, 1) + 63) & ~63


def _fill(res: ItemResult, out: Outcome, scratch: Optional[Tuple[Region, int]], slot: Optional[int] = None) -> None:
    try:
        r = check(out, "get")
    except SluiceError as e:
        res.error = e
        return
    t = Transfer._from_wire(r.body["report"], r.body["etag"], r.body["object_size"])
    if slot is not None and t.bytes > slot:
        # More than its slot: the bytes past it are the next item's.
        res.error = ProtocolError(f"the shim reported {t.bytes} bytes read into a {slot}-byte slot")
        return
    res.ok, res.transfer, res.nbytes = True, t, t.bytes
    if scratch is not None:
        region, off = scratch
        res.data = region.read(off, t.bytes)


class _Gather:
    """The answers of one GetBatch, one per item, as they arrive."""

    def __init__(self, n: int) -> None:
        self.outs: List[Optional[Outcome]] = [None] * n
        self.left = n

    def put(self, item: int, out: Outcome) -> None:
        if item == WHOLE_BATCH:
            for i, o in enumerate(self.outs):
                if o is None:
                    self.outs[i] = out
            self.left = 0
        elif 0 <= item < len(self.outs) and self.outs[item] is None:
            self.outs[item] = out
            self.left -= 1


def _batch_outcomes(out: Outcome, n: int) -> List[Outcome]:
    """Per-item outcomes of a get_batch call (its error for every item if the
    call failed as a whole)."""
    if isinstance(out, Reply) and out.kind == "batch":
        return [o if o is not None else ProtocolError("no answer for this item") for o in out.body["items"]]
    if isinstance(out, BaseException):
        return [out] * n
    return [ProtocolError(f"expected batch answers, got {out.kind}", request_id=out.request_id)] * n
