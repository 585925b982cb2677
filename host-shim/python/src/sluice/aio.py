"""The asyncio client: the same operations as :class:`sluice.Client`, awaitable."""

from __future__ import annotations

import asyncio
import os
import socket as _socket
from collections import deque
from typing import Any, AsyncIterator, Deque, Iterable, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from . import _core
from ._core import DEFAULT_TIMEOUT, Call, CoreClient, Op, Outcome, call_timeout, close_fd, drive_step
from .client import ANC_SPACE, MSG_CTRUNC, RECV_FLAGS, fds_from_ancillary, recv_buffer, scm_rights
from .errors import Disconnected, ShimConnectionError, SluiceError, Timeout
from .region import Region
from .types import ByteRange, GetItem, ItemResult, ListPage, ObjectInfo, Stats, Transfer

T = TypeVar("T")


class AsyncClient(CoreClient):
    """An asyncio connection to the shim.

    ::

        async with sluice.AsyncClient(socket) as c:
            region = await c.register(1 << 20)
            t = await c.get("data/key", into=region)
            results = await c.get_many(["data/a", "data/b"])
            async for obj in c.list("data/prefix/"):
                ...

    Constructing does no I/O; the connection opens in ``async with`` or
    :meth:`open` (or use ``await AsyncClient.connect(...)``). Arguments are
    those of :class:`sluice.Client`.

    Concurrency: any number of tasks on the client's event loop may issue
    requests at once; they are pipelined on the one connection. The client
    is bound to the loop that opened it and is not thread-safe.
    """

    def __init__(
        self,
        socket: "Optional[Union[str, os.PathLike[str]]]" = None,
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        connect_timeout: Optional[float] = 30.0,
        client_name: Optional[str] = None,
        scratch_bytes: int = 256 << 20,
        get_many_batch_bytes: int = 256 << 20,
        _protocol_version: int = _core._wire.PROTOCOL_VERSION,
    ) -> None:
        super().__init__(
            socket,
            timeout=timeout,
            client_name=client_name,
            scratch_bytes=scratch_bytes,
            get_many_batch_bytes=get_many_batch_bytes,
        )
        self._connect_timeout = connect_timeout
        self._version = _protocol_version
        self._sock: Optional[_socket.socket] = None
        self._rbuf = recv_buffer()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wlock: Optional[asyncio.Lock] = None
        self._dead = False
        self._background: Set["asyncio.Task[Any]"] = set()

    @classmethod
    async def connect(cls, socket: "Optional[Union[str, os.PathLike[str]]]" = None, **kwargs: Any) -> "AsyncClient":
        """Creates a client and opens its connection."""
        c = cls(socket, **kwargs)
        await c.open()
        return c

    async def open(self) -> "AsyncClient":
        """Connects and performs the versioned handshake."""
        if self._sock is not None:
            return self
        loop = asyncio.get_running_loop()
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, self.socket_path), self._connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            sock.close()
            self.closed = True
            raise ShimConnectionError(f"connecting to the shim at {self.socket_path}: {e or 'timed out'}") from e
        self._loop, self._sock, self._wlock = loop, sock, asyncio.Lock()
        loop.add_reader(sock.fileno(), self._on_readable)
        saved, self.timeout = self.timeout, self._connect_timeout
        try:
            await self._run(self._hello_op(self._version))
        except BaseException:
            await self.close()
            raise
        finally:
            self.timeout = saved
        return self

    async def __aenter__(self) -> "AsyncClient":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection; the shim releases this connection's regions."""
        if self.closed:
            return
        self.closed = True
        for t in list(self._background):
            t.cancel()
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            try:
                self._sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        self._lost("")
        self._invalidate_all()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"tenant={self.tenant!r}"
        return f"<sluice.AsyncClient {self.socket_path} {state}>"

    # --------------------------------------------------------------- I/O --
    def _on_readable(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                n, anc, flags, _ = sock.recvmsg_into([self._rbuf], ANC_SPACE, RECV_FLAGS)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(str(e))
                return
            fds = fds_from_ancillary(anc)
            if not n or flags & MSG_CTRUNC:
                for fd in fds:
                    close_fd(fd)
                self._lost("" if not n else "descriptors from the shim were truncated")
                return
            self._decoder.feed(self._rbuf[:n], fds)
            try:
                for payload in self._decoder.frames():
                    parsed = self._parse(payload)
                    if parsed is not None:
                        self._dispatch(*parsed)
            except (SluiceError, ValueError) as e:
                self._lost(str(e))
                return

    def _dispatch(self, id_: int, outcome: Outcome) -> None:
        if id_ == 0:
            self._connection_level(outcome)
            return
        fut = self._pending.pop(id_, None)
        if fut is None or fut.done():
            self._orphan(outcome)
        else:
            fut.set_result(outcome)

    def _lost(self, err: str) -> None:
        if self._dead:
            return
        self._dead = True
        if err:
            self._note_end(err)
        if self._sock is not None and self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self._sock.fileno())
            except (ValueError, OSError):
                pass
        pending, self._pending = self._pending, {}
        gone = Disconnected(f"the shim connection closed{self._why()}")
        for fut in pending.values():
            if fut is not None and not fut.done():
                fut.set_result(gone)
        for fd in self._decoder.drain_fds():
            close_fd(fd)

    async def _writable(self) -> None:
        assert self._loop is not None and self._sock is not None
        fut = self._loop.create_future()
        fd = self._sock.fileno()

        def ready() -> None:
            self._loop.remove_writer(fd)  # type: ignore[union-attr]
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, ready)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    async def _write_frame(self, frame: bytes, fd: Optional[int]) -> None:
        assert self._wlock is not None and self._sock is not None
        async with self._wlock:
            view = memoryview(frame)
            while view:
                try:
                    n = self._sock.sendmsg([view], scm_rights(fd)) if fd is not None else self._sock.send(view)
                except (BlockingIOError, InterruptedError):
                    await self._writable()
                    continue
                if n > 0:
                    fd = None  # the descriptor went with the first byte
                view = view[n:]

    async def _send(self, frame: bytes, fd: Optional[int]) -> None:
        # A frame is written whole even if the caller is cancelled meanwhile:
        # half a frame would desynchronise the stream.
        assert self._loop is not None
        task = self._loop.create_task(self._write_frame(frame, fd))
        await asyncio.shield(task)

    def _check_open(self) -> None:
        self._check_usable()
        if self._sock is None:
            raise ShimConnectionError("the client is not open: use `async with` or `await client.open()`")
        if self._dead:
            raise Disconnected(f"the shim connection closed{self._why()}")

    async def _submit(self, call: Call, wait: bool = True) -> "Optional[asyncio.Future[Outcome]]":
        self._check_open()
        assert self._loop is not None
        id_ = self._new_id()
        frame = self._encode(id_, call)
        fut: "Optional[asyncio.Future[Outcome]]" = self._loop.create_future() if wait else None
        self._pending[id_] = fut
        if fut is not None:
            fut.sluice_id = id_  # type: ignore[attr-defined]
            fut.sluice_timeout = self._timeout_now()  # type: ignore[attr-defined]
        try:
            await self._send(frame, call.fd)
        except OSError as e:
            self._pending.pop(id_, None)
            raise Disconnected(f"sending to the shim failed: {e}") from e
        except BaseException:
            # Cancelled while the frame went out (whole: `_send`): nobody
            # will wait for its answer, which then comes to a done future
            # and is orphaned (a region it registered released, its
            # descriptor closed), not kept on a future nobody reads.
            if fut is not None:
                fut.cancel()
            raise
        return fut

    async def _submit_batch(self, calls: Sequence[Call]) -> "List[asyncio.Future[Outcome]]":
        assert self._loop is not None
        await self._flush_orphans()
        futs: "List[asyncio.Future[Outcome]]" = []
        try:
            for c in calls:
                try:
                    f = await self._submit(c)
                    assert f is not None
                except SluiceError as e:
                    f = self._loop.create_future()
                    f.set_result(e)
                futs.append(f)
        except BaseException:
            # Cancelled part-way: the caller never gets these to wait on.
            for f in futs:
                f.cancel()
            raise
        return futs

    async def _flush_orphans(self) -> None:
        rids = self._take_orphans()
        for k, rid in enumerate(rids):
            try:
                await self._submit(Call("release", {"region_id": rid}), wait=False)
            except SluiceError:
                return
            except BaseException:
                # Cancelled: this release went out; the rest wait for the
                # next request.
                self._requeue_orphans(rids[k + 1 :])
                raise

    async def _wait(self, fut: "asyncio.Future[Outcome]") -> Outcome:
        timeout = getattr(fut, "sluice_timeout", self.timeout)
        # As the blocking client: the shim's own answer comes just after.
        wait = None if timeout is None else max(0.0, timeout) + _core.ANSWER_GRACE
        try:
            return await asyncio.wait_for(asyncio.shield(fut), wait)
        except asyncio.TimeoutError:
            self._pending.pop(getattr(fut, "sluice_id", -1), None)
            if fut.done():
                return fut.result()
            raise Timeout(f"no answer from the shim within {timeout}s (and {_core.ANSWER_GRACE}s of grace)") from None

    def _forget(self, futs: "Sequence[asyncio.Future[Outcome]]") -> None:
        for f in futs:
            self._pending.pop(getattr(f, "sluice_id", -1), None)
            if f.done() and not f.cancelled():
                self._orphan(f.result())

    async def _run(self, gen: "Op[T]") -> T:
        futs: "List[asyncio.Future[Outcome]]" = []
        outcomes: Optional[List[Outcome]] = None
        try:
            while True:
                finished, val = drive_step(gen, outcomes)
                if finished:
                    break
                futs = await self._submit_batch(val)
                outcomes = [await self._wait(f) for f in futs]
                futs = []
        except BaseException:
            self._forget(futs)
            gen.close()
            if self._orphans and not self.closed and self._loop is not None:
                task = self._loop.create_task(self._flush_orphans())
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            raise
        if self._orphans and not self.closed:
            await self._flush_orphans()
        return val

    def _release_region_blocking(self, region: Region) -> None:
        raise TypeError("regions of an AsyncClient are released with `await region.arelease()`")

    # --------------------------------------------------------------- API --
    async def register(self, nbytes: int, *, local: bool = False, fd: Optional[int] = None) -> Region:
        """See :meth:`sluice.Client.register`. Use ``async with region:`` or
        ``await region.arelease()`` to release it."""
        return await self._run(self._register_op(nbytes, fd=fd, local=local))

    async def register_dmabuf(self, fd: int, nbytes: int, *, offset: int = 0, gpu_address: int = 0) -> str:
        """See :meth:`sluice.Client.register_dmabuf`."""
        return await self._run(self._register_dmabuf_op(fd, nbytes, offset, gpu_address))

    async def release(self, region: Union[Region, str]) -> None:
        """See :meth:`sluice.Client.release`."""
        if isinstance(region, Region) and region.released:
            return
        await self._run(self._release_op(region))

    async def get(
        self,
        path: str,
        into: Union[Region, str],
        offset: int = 0,
        range: Optional[ByteRange] = None,
        *,
        request_id: str = "",
        timeout: Optional[float] = None,
        if_match: str = "",
    ) -> Transfer:
        """See :meth:`sluice.Client.get`."""
        with call_timeout(timeout):
            return await self._run(self._get_op(path, into, offset, range, request_id, if_match))

    async def get_bytes(
        self,
        path: str,
        range: Optional[ByteRange] = None,
        *,
        size_hint: Optional[int] = None,
        timeout: Optional[float] = None,
        copy: bool = True,
    ) -> Any:
        """See :meth:`sluice.Client.get_bytes` (``copy=False``: a memoryview of
        the scratch memory, no copy)."""
        with call_timeout(timeout):
            return (await self._run(self._get_bytes_op(path, range, size_hint, copy=copy)))[0]

    async def put(
        self,
        path: str,
        data: Any,
        offset: int = 0,
        length: Optional[int] = None,
        *,
        content_type: str = "",
        request_id: str = "",
        timeout: Optional[float] = None,
    ) -> Transfer:
        """See :meth:`sluice.Client.put`."""
        with call_timeout(timeout):
            return await self._run(self._put_op(path, data, offset, length, content_type, request_id))

    async def head(self, path: str, *, request_id: str = "", timeout: Optional[float] = None) -> ObjectInfo:
        """See :meth:`sluice.Client.head`."""
        with call_timeout(timeout):
            return await self._run(self._head_op(path, request_id))

    async def list_page(
        self, prefix: str, continuation_token: str = "", max_keys: int = 0, delimiter: str = ""
    ) -> ListPage:
        """See :meth:`sluice.Client.list_page`."""
        return await self._run(self._list_page_op(prefix, continuation_token, max_keys, delimiter))

    async def list(self, prefix: str, *, page_size: int = 0, delimiter: str = "") -> AsyncIterator[ObjectInfo]:
        """``async for`` over every object under ``prefix`` (pages fetched lazily)."""
        token = ""
        while True:
            page = await self.list_page(prefix, token, page_size, delimiter)
            for obj in page.objects:
                yield obj
            if not page.next_continuation_token:
                return
            token = page.next_continuation_token

    async def delete(self, path: str, *, request_id: str = "", timeout: Optional[float] = None) -> None:
        """See :meth:`sluice.Client.delete`."""
        with call_timeout(timeout):
            await self._run(self._delete_op(path, request_id))

    async def stats(self) -> Stats:
        """See :meth:`sluice.Client.stats`."""
        return await self._run(self._stats_op())

    async def get_many(
        self, items: Iterable[GetItem], *, timeout: Optional[float] = None, copy: bool = True
    ) -> List[ItemResult]:
        """See :meth:`sluice.Client.get_many` (one GetBatch; per-item results)."""
        with call_timeout(timeout):
            return await self._run(self._get_many_op(list(items), copy=copy))

    async def _item(self, index: int, path: str, hint: Optional[int]) -> ItemResult:
        res = ItemResult(path, index)
        try:
            data, t = await self._run(self._get_bytes_op(path, size_hint=hint))
            res.ok, res.data, res.transfer, res.nbytes = True, data, t, t.bytes
        except SluiceError as e:
            res.error = e
        return res

    async def iter_get(
        self, items: Iterable[Union[str, Tuple[str, Optional[int]]]], *, prefetch: int = 8
    ) -> AsyncIterator[ItemResult]:
        """See :meth:`sluice.Client.iter_get`: ``async for`` over results in
        order with up to ``prefetch`` reads in flight."""
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        self._check_open()
        loop = asyncio.get_running_loop()
        source = iter(enumerate(items))
        queue: "Deque[asyncio.Task[ItemResult]]" = deque()

        def start() -> None:
            try:
                i, item = next(source)
            except StopIteration:
                return
            path, hint = (item, None) if isinstance(item, str) else item
            queue.append(loop.create_task(self._item(i, path, hint)))

        try:
            for _ in range(prefetch):
                start()
            while queue:
                res = await queue.popleft()
                start()
                yield res
        finally:
            for t in queue:
                t.cancel()
            if queue:
                await asyncio.gather(*queue, return_exceptions=True)


__all__ = ["AsyncClient"]
