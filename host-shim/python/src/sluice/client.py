"""The blocking client."""

from __future__ import annotations

import array
import contextlib
import dataclasses
import os
import socket as _socket
import select
import struct
import threading
import time
from collections import deque
from typing import Any, Deque, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

from . import _core, _gpu_ops, _native_reads
from ._core import DEFAULT_TIMEOUT, Call, CoreClient, Op, Outcome, _range, _u64, call_timeout, close_fd, drive_step
from ._native_reads import NativeReads
from ._turns import Answer, ReadTurn
from .errors import Disconnected, RegionReleased, ShimConnectionError, SluiceError, Timeout
from .gpu import GpuRegion
from .gpu import validate as validate_gpu
from .region import Region
from .types import ByteRange, GetItem, ItemResult, ListPage, ObjectInfo, Stats, Transfer

T = TypeVar("T")

_MAX_FDS = 16  # the shim attaches at most 4 per sendmsg; leave room
ANC_SPACE = _socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
RECV_FLAGS = int(getattr(_socket, "MSG_CMSG_CLOEXEC", 0))
#: Reads never block: the reading caller waits in poll() first, with its
#: deadline (a blocking recvmsg on a socket with a timeout polls first too).
RECV_FLAGS_NOWAIT = RECV_FLAGS | int(_socket.MSG_DONTWAIT)
#: As a plain int: the socket module's flags are an ``enum.IntFlag``, and
#: ``int & IntFlag`` builds an enum member on every reply read.
MSG_CTRUNC = int(getattr(_socket, "MSG_CTRUNC", 0))
RECV_SIZE = 1 << 18
#: A caller sending a long run of requests before it waits takes in the
#: answers that have come every this many requests, so that the shim, whose
#: queue of answers is bounded, never waits on a client that is not reading
#: while that client waits for the shim to read its requests.
PUMP_EVERY = 64


def recv_buffer() -> memoryview:
    """A connection's buffer for ``recvmsg_into``, made once: ``recvmsg``
    allocates a fresh ``RECV_SIZE`` bytes object per read, which glibc maps
    and unmaps (above its mmap threshold): 14 µs of system time per read on
    the 2-CPU VM, against 2 µs into a buffer kept (docs/performance.md)."""
    return memoryview(bytearray(RECV_SIZE))


def fds_from_ancillary(ancdata: List[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors of the SCM_RIGHTS messages in ``recvmsg`` ancillary data."""
    fds: List[int] = []
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - len(data) % arr.itemsize])
            fds.extend(arr)
    return fds


def scm_rights(fd: int) -> List[Tuple[int, int, bytes]]:
    return [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]


class _Handle:
    """One operation in progress on a blocking client (see ``_core``)."""

    def __init__(self, client: "Client", gen: "Op[Any]") -> None:
        self._c = client
        self._gen = gen
        self._futs: List[Answer] = []
        self.done = False
        self._value: Any = None
        self._exc: Optional[BaseException] = None
        self._step(None)

    def _step(self, outcomes: Optional[List[Outcome]]) -> None:
        try:
            finished, val = drive_step(self._gen, outcomes)
        except BaseException as e:  # the operation's own error
            self.done, self._exc = True, e
            self._c._flush_orphans()
            return
        if finished:
            self.done, self._value = True, val
            self._c._flush_orphans()
        else:
            self._futs = self._c._submit_batch(val)

    def poll(self, pump: bool = True) -> None:
        """Advances without blocking as far as the answers so far allow
        (taking in those that have arrived first, unless ``pump`` is False:
        the caller just did, for several handles)."""
        if pump:
            self._c._pump()
        while not self.done and all(f.done() for f in self._futs):
            self._step([f.result() for f in self._futs])

    def result(self) -> Any:
        """Runs the operation to completion and returns its value (or raises)."""
        try:
            while not self.done:
                self._step([self._c._wait(f) for f in self._futs])
        except BaseException:
            self.cancel()
            raise
        if self._exc is not None:
            exc, self._exc = self._exc, None
            raise exc
        return self._value

    def cancel(self) -> None:
        """Abandons the operation; late answers are discarded (regions they
        create are released)."""
        if not self.done:
            self.done = True
            self._c._forget(self._futs)
            self._gen.close()


class Client(CoreClient):
    """A blocking connection to the shim.

    ::

        with sluice.Client() as c:                  # $SLUICE_SOCKET or the default socket
            with c.register(64 << 20) as region:    # shared memory, released on exit
                t = c.get("data/train/shard-0001", into=region)
                arr = region.numpy()[: t.bytes]

    Args:
        socket: path of the shim socket; default ``$SLUICE_SOCKET``, then
            ``./.sluice/run/shim.sock`` if present, then ``/run/sluice/shim.sock``.
        timeout: each request's end-to-end deadline in seconds (default 300;
            ``None``: the namespace's deadline, set by the agent's operator).
            The deadline travels with the request: the shim and agent stop it
            when it passes and :class:`~sluice.DeadlineExceeded` is raised (or
            :class:`~sluice.Timeout` if no answer came at all); the connection
            stays usable. Methods that move data take ``timeout=`` per call.
        connect_timeout: seconds for connecting and the handshake.
        client_name: sent in ``Hello`` (shows in the shim's log).
        scratch_bytes: how much internal scratch memory (regions used by
            :meth:`get_bytes`, :meth:`put` of bytes, :meth:`get_many` and
            :meth:`iter_get`) to keep registered for reuse; more is
            registered on demand and released after use.
        get_many_batch_bytes: :meth:`get_many` reads bytes-items into shared
            scratch regions of at most this size per pipelined batch.
        pin_regions: pin host regions for CUDA once at registration, so a
            loader's ``.cuda()`` of what it read runs at pinned speed:
            ``"auto"`` (when this process already uses CUDA: no context is
            made here), ``"always"``, ``"never"``; ``SLUICE_PIN_REGIONS=0``
            turns it off. See :meth:`pinned`.
        gpu_staging_bytes / gpu_lane_bytes: pinned staging for GPU regions
            (:meth:`register_gpu`): lanes of ``gpu_lane_bytes`` (two halves:
            one on the network while the other is copied to the GPU), made
            on demand up to ``gpu_staging_bytes`` in all; one per GPU
            request in flight.
        cuda: the CUDA driver to use (tests pass :class:`sluice.cuda.HostModel`);
            default: ``libcuda.so.1``, loaded on first GPU use.

    Thread safety: a ``Client`` may be shared by threads; requests from
    different threads are pipelined on the one connection. There is no
    background thread: a caller waiting for an answer reads the connection
    itself, one at a time, and hands the others' answers to them
    (``sluice._turns``). A client must not be used in a
    process forked after it was created; make one per process (e.g. per
    DataLoader worker), as :mod:`sluice.torch` does.
    """

    _GPU_OK = True

    def __init__(
        self,
        socket: "Optional[Union[str, os.PathLike[str]]]" = None,
        *,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        connect_timeout: Optional[float] = 30.0,
        client_name: Optional[str] = None,
        scratch_bytes: int = 256 << 20,
        get_many_batch_bytes: int = 256 << 20,
        pin_regions: str = "auto",
        gpu_staging_bytes: int = _core.DEFAULT_STAGING_BYTES,
        gpu_lane_bytes: int = _core.DEFAULT_LANE_BYTES,
        cuda: Any = None,
        native: Any = "auto",
        _protocol_version: int = _core._wire.PROTOCOL_VERSION,
    ) -> None:
        super().__init__(
            socket,
            timeout=timeout,
            client_name=client_name,
            scratch_bytes=scratch_bytes,
            get_many_batch_bytes=get_many_batch_bytes,
            cuda=cuda,
            gpu_staging_bytes=gpu_staging_bytes,
            gpu_lane_bytes=gpu_lane_bytes,
            pin_regions=pin_regions,
        )
        self._dead = False
        self._wlock = threading.Lock()
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(self.socket_path)
            sock.settimeout(None)
            # Sends only (reads wait for answers as long as calls say).
            wait = _core.SEND_WAIT
            sock.setsockopt(
                _socket.SOL_SOCKET, _socket.SO_SNDTIMEO, struct.pack("@ll", int(wait), int((wait % 1) * 1_000_000))
            )
        except OSError as e:
            sock.close()
            self.closed = True
            raise ShimConnectionError(f"connecting to the shim at {self.socket_path}: {e}") from e
        self._sock = sock
        self._turn = ReadTurn(self._pending_lock)
        self._rbuf = recv_buffer()
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)
        saved, self.timeout = self.timeout, connect_timeout
        try:
            self._run(self._hello_op(_protocol_version))
        except BaseException:
            self.close()
            raise
        finally:
            self.timeout = saved
        self._native: Optional[NativeReads] = None
        if _native_reads.wanted(native):
            self._native = NativeReads(
                self.socket_path, connect_timeout, scratch_bytes, get_many_batch_bytes, self._join_token
            )

    # --------------------------------------------------------- lifecycle --
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection. The shim releases every region this
        connection registered; they become unusable here. Idempotent."""
        if self.closed:
            return
        self.closed = True
        native = getattr(self, "_native", None)
        if native is not None:
            native.close()
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        # A caller inside a read sees the end of the stream and leaves; the
        # descriptor is closed only then, so no read can reach a reused one.
        with self._turn.hold(timeout=10):
            self._lost("")
            # A sender, woken by the shutdown, leaves before the descriptor
            # is closed (its number could otherwise be reused under it).
            with self._wlock:
                self._sock.close()
        self._invalidate_all()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"tenant={self.tenant!r}"
        return f"<sluice.Client {self.socket_path} {state}>"

    # --------------------------------------------------------------- I/O --
    def _lead(self, ans: Optional[Answer], deadline: Optional[float]) -> None:
        """Reads, as the caller whose turn it is, until ``ans`` is answered
        (None: until the connection ends), ``deadline`` passes or the
        connection is gone; every answer read goes to its waiter."""
        poll = self._poller.poll
        while not self._dead and (ans is None or not ans._done):
            if deadline is None:
                ready = poll()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._take_in()  # what has arrived by now still counts
                    return
                ready = poll(int(left * 1000) + 1)
            if ready:
                self._take_in()

    def _take_in(self) -> bool:
        """Reads what the shim has sent, without blocking, and hands each
        answer to its waiter; False if nothing was there.

        Once bytes may have left the socket, an exception from this thread
        (Ctrl-C lands in the caller who is reading) could lose part of the
        stream; the connection is then ended with that reason rather than
        trusted to stay in step.
        """
        consuming, fds = True, None
        try:
            try:
                n, anc, flags, _ = self._sock.recvmsg_into([self._rbuf], ANC_SPACE, RECV_FLAGS_NOWAIT)
            except BlockingIOError:
                consuming = False
                return False
            fds = fds_from_ancillary(anc)
            if flags & MSG_CTRUNC or not n:
                consuming = False
                self._end("descriptors from the shim were truncated" if n else "")
                return True
            self._decoder.feed(self._rbuf[:n], fds)
            fds = None  # the decoder has them (and closes them if the stream ends)
            for payload in self._decoder.frames():
                parsed = self._parse(payload)
                if parsed is not None:
                    self._dispatch(*parsed)
            consuming = False
            return True
        except (OSError, ValueError, SluiceError) as e:
            consuming = False
            self._end("" if self.closed else str(e))
            return True
        except Exception as e:  # a bug here must not leave waiters hanging
            consuming = False
            self._end(f"reading the shim's answers failed: {type(e).__name__}: {e}")
            return True
        finally:
            for fd in fds or ():
                close_fd(fd)
            if consuming:
                self._end("interrupted while taking in the shim's answers, some of which may be lost")

    def _end(self, err: str) -> None:
        """The stream is over or can no longer be trusted: nothing more is
        read or sent on it (the shim then releases this connection's
        regions), and every waiter gets :class:`~sluice.Disconnected`."""
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        self._lost(err)

    def _pump(self) -> None:
        """Takes in whatever answers have arrived, without waiting, if no
        other caller is reading (for :meth:`_Handle.poll`)."""
        with self._turn.hold(timeout=0) as reading:
            if reading:
                while not self._dead and self._take_in():
                    pass

    def _dispatch(self, id_: int, outcome: Outcome) -> None:
        if id_ == 0:
            self._connection_level(outcome)
            return
        with self._pending_lock:
            fut = self._pending.pop(id_, None)
            if fut is not None and not fut.done():
                # Set under the lock: a caller that gave up waiting takes its
                # answer out of the table under the same lock, so either it
                # finds the answer set or the answer finds it gone.
                fut.set_result(outcome)
                return
        self._orphan(outcome)

    def _lost(self, err: str) -> None:
        with self._pending_lock:
            if self._dead:
                return
            self._dead = True
            if err:
                self._note_end(err)
            pending, self._pending = self._pending, {}
            gone = Disconnected(f"the shim connection closed{self._why()}")
            for fut in pending.values():
                if fut is not None and not fut.done():
                    fut.set_result(gone)
            # Any waiter still asleep (its answer taken out of the table by
            # a read that was interrupted) wakes to find the connection gone.
            self._turn.rouse_all()
        for fd in self._decoder.drain_fds():
            close_fd(fd)

    def _send(self, frame: bytes, fd: Optional[int]) -> None:
        cut: Optional[BaseException] = None
        failed: Optional[OSError] = None
        with self._wlock:
            view = memoryview(frame)
            try:
                if fd is not None:
                    n = self._sock.sendmsg([view], scm_rights(fd))
                    view = view[n:]
                if view:
                    self._sock.sendall(view)
            except OSError as e:
                failed = e
            except BaseException as e:  # noqa: BLE001 - Ctrl-C, a signal handler's exception
                cut = e
        if failed is not None:
            # Part of the frame may have gone (a send that waited past
            # SEND_WAIT, after some of it): nothing more is sent on it.
            if isinstance(failed, BlockingIOError):
                why = f"the shim took none of a frame for {_core.SEND_WAIT:g} s (it stopped reading)"
                failed = BlockingIOError(failed.errno, why)
            self._end(f"sending to the shim failed: {failed}")
            raise failed
        if cut is not None:
            # Part of the frame may have gone: the next frame, from any
            # thread, would be read as its rest, and the shim would misread
            # the stream from there. Nothing more is sent on it.
            self._end(f"a frame was cut short while it was sent ({type(cut).__name__})")
            raise cut

    def _submit(self, call: Call, wait: bool = True) -> Optional[Answer]:
        self._check_usable()
        id_ = self._new_id()
        frame = self._encode(id_, call)
        fut = Answer(id_, self._timeout_now()) if wait else None
        with self._pending_lock:
            if self._dead:
                raise Disconnected(f"the shim connection closed{self._why()}")
            self._pending[id_] = fut
        try:
            self._send(frame, call.fd)
        except OSError as e:
            with self._pending_lock:
                self._pending.pop(id_, None)
            # The shim may have said why before closing: take that in so
            # the error can tell.
            with self._turn.hold(timeout=2) as reading:
                if reading:
                    self._lead(None, time.monotonic() + 2)
            raise Disconnected(f"sending to the shim failed: {e}{self._why()}") from e
        return fut

    def _submit_batch(self, calls: Sequence[Call]) -> List[Answer]:
        """Sends every call (pipelined) before anyone waits for an answer."""
        self._flush_orphans()
        futs: List[Answer] = []
        for k, c in enumerate(calls):
            if k and k % PUMP_EVERY == 0:
                self._pump()
            try:
                f = self._submit(c)
                assert f is not None
            except SluiceError as e:
                f = Answer()
                f.set_result(e)
            futs.append(f)
        return futs

    def _flush_orphans(self) -> None:
        for rid in self._take_orphans():
            try:
                self._submit(Call("release", {"region_id": rid}), wait=False)
            except SluiceError:
                return

    def _wait(self, fut: Answer) -> Outcome:
        timeout = fut.sluice_timeout
        # The shim's own DEADLINE_EXCEEDED (per item of a batch) comes just
        # after the deadline it was sent: wait for it (ANSWER_GRACE).
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout) + _core.ANSWER_GRACE
        if self._turn.wait(fut, deadline, self._lead):
            return fut.result()
        with self._pending_lock:
            self._pending.pop(fut.sluice_id, None)
        if fut.done():
            return fut.result()
        if self._dead:
            raise Disconnected(f"the shim connection closed{self._why()}")
        raise Timeout(f"no answer from the shim within {timeout}s (and {_core.ANSWER_GRACE}s of grace)") from None

    def _forget(self, futs: Sequence[Answer]) -> None:
        for f in futs:
            with self._pending_lock:
                self._pending.pop(f.sluice_id, None)
            if f.done():
                self._orphan(f.result())

    def _run(self, gen: "Op[T]") -> T:
        return _Handle(self, gen).result()

    def _release_region_blocking(self, region: Region) -> None:
        self.release(region)

    # --------------------------------------------------------------- API --
    def register(self, nbytes: int, *, local: bool = False, fd: Optional[int] = None) -> Region:
        """Registers a shared-memory region of ``nbytes`` bytes.

        By default the shim creates the memfd and passes it back
        (SCM_RIGHTS). With ``local=True`` this process creates the memfd and
        hands it in; with ``fd=`` an existing memory file of at least
        ``nbytes`` bytes is handed in (the shim answers
        :class:`~sluice.RegionTooSmall` if it is shorter). Either way the
        region is mapped here read-write.
        """
        return self._run(self._register_op(nbytes, fd=fd, local=local))

    def region_at(self, address: int, nbytes: int) -> Optional[Tuple[Region, int]]:
        """The live region this client registered (not its scratch memory)
        holding all of ``[address, address + nbytes)`` in this process, with
        the offset of ``address`` in it; ``None`` if no region does.

        This is how tensors that live in registered memory (a state dict
        from :func:`sluice.dcp.register_state_dict`, or ``Region.torch``
        views) are read and written with no copy on this host."""
        for region in list(self._regions.values()):
            if region.released or region._scratch:
                continue
            try:
                start = _gpu_ops._addr(region)
            except (RegionReleased, ValueError, TypeError):
                continue
            if start <= address and address + nbytes <= start + region.nbytes:
                return region, address - start
        return None

    @contextlib.contextmanager
    def staging(self, nbytes: int) -> Iterator[Region]:
        """A registered region of at least ``nbytes`` bytes lent from the
        client's scratch pool for the ``with`` block, then given back to it.

        The pool keeps up to ``scratch_bytes`` of regions registered and
        mapped, so a loop of reads or writes through staging memory pays for
        registration (and the first touch of each page) once, not per
        object. A block left by an exception does not return its region to
        the pool (a request it abandoned may still use it): it is released.
        """
        region = self._run(self._checkout(max(_core._u64("nbytes", nbytes), 1)))
        clean = False
        try:
            yield region
            clean = True
        finally:
            self._give_back(region, clean)

    def register_gpu(self, memory: Any, *, nbytes: Optional[int] = None, device: Optional[int] = None) -> GpuRegion:
        """GPU memory of this process as a region for :meth:`get`,
        :meth:`get_many` and :meth:`put`: a torch CUDA tensor, anything with
        ``__cuda_array_interface__`` (cupy, numba) or ``__dlpack__`` on a
        CUDA device, or a device address with ``nbytes=``. It must be
        contiguous and inside one live allocation of this process (checked
        with CUDA: another process's address or freed memory raise
        :class:`~sluice.BadRequest`; no CUDA here: :class:`~sluice.Unsupported`).

        Bytes reach it through pinned staging lanes and the GPU's copy
        engines, overlapped part by part with the network; nothing about the
        GPU memory is sent to the shim. The region keeps ``memory`` alive
        until :meth:`GpuRegion.release` (or the end of a ``with`` block)."""
        return validate_gpu(self._driver(), memory, nbytes, device)

    def gpu_paths(self) -> List[Tuple[str, str]]:
        """The ways GPU memory can be reached from here, ``(name, detail)``:
        ``"client-staging"`` (this process has the CUDA driver and a GPU:
        :meth:`register_gpu` works on any node), ``"dmabuf-doca"`` and
        ``"dmabuf-rdma"`` (the agent places bytes in GPU memory itself:
        :meth:`register_dmabuf`; from the capability exchange). Empty: no GPU
        path (``sluice doctor`` says why)."""
        out: List[Tuple[str, str]] = []
        from .cuda import try_driver

        d = self._cuda if self._cuda is not None else try_driver()
        if d is not None:
            try:
                n = d.device_count()
                if n:
                    names = ", ".join(d.device_name(i) for i in range(n))
                    out.append(("client-staging", f"{d.name}: {n} device(s): {names}"))
            except SluiceError:
                pass
        via = self.capabilities.gpu_dmabuf_path
        if via == "doca":
            out.append(("dmabuf-doca", f"the agent on this host's BlueField: {self.capabilities.gpu_staging}"))
        elif via == "rdma":
            out.append(("dmabuf-rdma", "a co-located agent whose RDMA NIC registers dma-bufs (direct RDMA GETs)"))
        return out

    def pinned(self, region: Region) -> bool:
        """Whether ``region`` is pinned for CUDA (``pin_regions``)."""
        return super().pinned(region)

    def register_dmabuf(self, fd: int, nbytes: int, *, offset: int = 0, gpu_address: int = 0) -> str:
        """Registers GPU memory: ``nbytes`` bytes at ``offset`` of the CUDA
        dma-buf ``fd`` (``cuMemGetHandleForAddressRange``), whose range starts
        at CUDA address ``gpu_address``. Returns the region id to pass to
        :meth:`get`/:meth:`put` and :meth:`release`. The memory is not mapped
        here. Needs a shim with the DOCA memory backend; other shims raise
        :class:`~sluice.Unsupported`, and a descriptor that is not a dma-buf
        raises :class:`~sluice.BadRequest`."""
        return self._run(self._register_dmabuf_op(fd, nbytes, offset, gpu_address))

    def release(self, region: Union[Region, str]) -> None:
        """Releases a region (the shim and agent drop it). Releasing a
        :class:`Region` twice is a no-op; releasing an id the shim does not
        know raises :class:`~sluice.UnknownRegion`."""
        if isinstance(region, Region) and region.released:
            return
        self._run(self._release_op(region))

    def get(
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
        """Reads object ``path`` (``"namespace/key"``), or ``range`` of it
        (``(start, length)``, ``(start, None)`` = to the end), into region
        ``into`` at ``offset``. Returns the :class:`~sluice.Transfer`; its
        ``bytes`` is how many bytes landed. If the span does not fit,
        :class:`~sluice.RegionTooSmall` is raised and nothing is written.
        ``timeout``: this call's deadline (default: the client's).
        ``if_match``: the ETag the object must have (as a Transfer's
        ``etag`` gave it; "" = any): another version raises
        :class:`~sluice.PreconditionFailed`, writing nothing. Reading one
        object in several ranged GETs, pin them all to the first one's."""
        if (
            self._native is not None
            and not request_id
            and type(path) is str
            and (type(into) is str or (type(into) is Region and not into.released))
        ):
            # Into a host region of this connection: the native reader, if
            # it joined this connection's session, sends it without the
            # interpreter lock (sluice._native_reads). Arguments are checked
            # in the Python path's order, with its errors.
            self._check_usable()
            t = self._timeout_of(timeout)
            if not isinstance(if_match, str):
                raise TypeError("if_match must be a str (an ETag as a Transfer returned it)")
            span = _range(range)
            offset = _u64("offset", offset)
            if self._native.joined(t):
                region_id = into if type(into) is str else into.id  # type: ignore[union-attr]
                return self._native.get_into(path, region_id, offset, span, t, if_match)
        with call_timeout(timeout):
            return self._run(self._get_op(path, into, offset, range, request_id, if_match))

    def get_bytes(
        self,
        path: str,
        range: Optional[ByteRange] = None,
        *,
        size_hint: Optional[int] = None,
        timeout: Optional[float] = None,
        copy: bool = True,
    ) -> Any:
        """Reads an object (or a range of it) and returns its bytes, via an
        internal scratch region. ``size_hint`` avoids a retry for objects
        larger than the scratch region.

        ``copy=False`` returns a read-only :class:`memoryview` of the scratch
        memory itself instead of a ``bytes`` copy. The memory is lent to the view:
        it is reused only once the view and every slice of it are gone, so
        drop it (or ``release()`` it) when done. ``numpy.frombuffer`` and
        ``torch.frombuffer`` take it as is.

        With ``copy=True``, a ``bytes`` of a MiB or more would cost more in
        page faults than in copying (glibc's ``malloc`` gives freed memory
        back to the kernel, and the next result faults it in again:
        docs/performance.md, ~220 faults per MiB in batches of 8), so the
        first such copy sets ``malloc``'s thresholds to the values glibc
        itself adapts to at most (blocks up to 32 MiB from the heap, up to
        64 MiB of free memory kept per arena; :mod:`sluice._malloc`). It
        leaves them alone if ``GLIBC_TUNABLES`` sets a ``glibc.malloc``
        tunable or ``SLUICE_MALLOC_TUNING=0``. Results of 32 MiB or more,
        always fresh mappings, are copied into huge pages where the kernel
        has them, with the interpreter lock released (:mod:`sluice._bigcopy`)."""
        if range is None and copy and self._native is not None and type(path) is str:
            self._check_usable()
            t = self._timeout_of(timeout)
            if self._native.ready(t):
                return self._native.get_bytes(path, _u64("size_hint", size_hint or 0), t)
        with call_timeout(timeout):
            return self._run(self._get_bytes_op(path, range, size_hint, copy=copy))[0]

    def _timeout_of(self, timeout: Optional[float]) -> Optional[float]:
        """A request's deadline: the call's ``timeout``, else the one in force."""
        if timeout is None:
            return self._timeout_now()
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        return float(timeout)

    def put(
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
        """Stores an object.

        ``data`` is a :class:`Region` (``length`` bytes from ``offset``;
        default: to the region's end; outside the region:
        :class:`~sluice.OutOfBounds`) or any bytes-like object (bytes,
        bytearray, memoryview, numpy array), which is copied into a scratch
        region first."""
        with call_timeout(timeout):
            return self._run(self._put_op(path, data, offset, length, content_type, request_id))

    def head(self, path: str, *, request_id: str = "", timeout: Optional[float] = None) -> ObjectInfo:
        """The object's metadata; :class:`~sluice.NoSuchKey` if it does not exist."""
        with call_timeout(timeout):
            return self._run(self._head_op(path, request_id))

    def list_page(
        self, prefix: str, continuation_token: str = "", max_keys: int = 0, delimiter: str = ""
    ) -> ListPage:
        """One page of a listing of ``prefix`` (``"namespace"`` or
        ``"namespace/prefix"``)."""
        return self._run(self._list_page_op(prefix, continuation_token, max_keys, delimiter))

    def list(self, prefix: str, *, page_size: int = 0, delimiter: str = "") -> Iterator[ObjectInfo]:
        """Iterates over every object under ``prefix`` (``"namespace"`` or
        ``"namespace/prefix"``), fetching pages lazily. Keys are relative to
        the namespace. (Use :meth:`list_page` for common prefixes.)"""
        token = ""
        while True:
            page = self.list_page(prefix, token, page_size, delimiter)
            yield from page.objects
            if not page.next_continuation_token:
                return
            token = page.next_continuation_token

    def delete(self, path: str, *, request_id: str = "", timeout: Optional[float] = None) -> None:
        """Deletes an object (a missing key is not an error: S3 semantics)."""
        with call_timeout(timeout):
            self._run(self._delete_op(path, request_id))

    def stats(self) -> Stats:
        """This client's session counters: its connection's, plus its native
        reader's connection's once that is open (``sluice._native_reads``)."""
        # Asked first: a native reader that joined this connection's session
        # is counted in it already, and settles its scratch releases here so
        # the session's counters below show them.
        native = self._native.stats() if self._native is not None else None
        own = self._run(self._stats_op())
        if native is None:
            return own
        return Stats(*(a + b for a, b in zip(dataclasses.astuple(own), native)))

    def get_many(
        self, items: Iterable[GetItem], *, timeout: Optional[float] = None, copy: bool = True
    ) -> List[ItemResult]:
        """Reads many objects with pipelined requests; never raises for a
        single item's failure.

        Each item is a path (bytes returned in :attr:`ItemResult.data`), a
        :class:`~sluice.GetSpec` (``into=`` a region to read into), or a tuple
        of GetSpec's fields. Returns one :class:`~sluice.ItemResult` per item,
        in order: ``ok``, ``data``/``nbytes``, ``data_path`` (transport),
        ``fallback_reason``, ``error``.

        The items go out as one GetBatch request (one frame; the shim makes
        one agent call for them all), and each item is answered as soon as it
        is done. Items without a region are read straight into shared scratch
        memory at offsets, in slots of their range's length or of the largest
        size read lately; one that turns out bigger is read again at the size
        the shim reports (no HEAD first). ``timeout`` applies to each batch.
        ``copy=False``: items without a region get a read-only
        :class:`memoryview` of the scratch memory as ``data`` instead of a
        ``bytes`` copy (see :meth:`get_bytes`).
        """
        items = list(items)
        if copy and self._native is not None and items and all(type(i) is str for i in items):
            self._check_usable()
            t = self._timeout_of(timeout)
            if self._native.ready(t):
                return self._native.get_many(items, t)  # type: ignore[arg-type]
        if self._native is not None and items and all(_native_reads.into_host_region(i) for i in items):
            # Every item into a host region of this connection: the native
            # reader, if it joined this connection's session. (A closed or
            # forked client goes the Python way: its errors come per item.)
            t = self._timeout_of(timeout)
            checked = _native_reads.checked_items(items)  # type: ignore[arg-type]
            if self._native.joined(t):
                return self._native.get_many_into(checked, t)
        with call_timeout(timeout):
            return self._run(self._get_many_op(items, copy=copy))

    def iter_get(
        self, items: Iterable[Union[str, Tuple[str, Optional[int]]]], *, prefetch: int = 8
    ) -> Iterator[ItemResult]:
        """Yields an :class:`~sluice.ItemResult` with the bytes of each path,
        in order, keeping up to ``prefetch`` reads in flight ahead of the
        consumer. Items are paths or ``(path, size_hint)``. Failures are
        reported per item, never raised."""
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        source = iter(enumerate(items))
        queue: Deque[Tuple[int, str, _Handle]] = deque()

        def start() -> bool:
            try:
                i, item = next(source)
            except StopIteration:
                return False
            path, hint = (item, None) if isinstance(item, str) else item
            queue.append((i, path, _Handle(self, self._get_bytes_op(path, size_hint=hint))))
            return True

        try:
            while len(queue) < prefetch and start():
                pass
            while queue:
                i, path, h = queue.popleft()
                res = ItemResult(path, i)
                try:
                    data, t = h.result()
                    res.ok, res.data, res.transfer, res.nbytes = True, data, t, t.bytes
                except SluiceError as e:
                    res.error = e
                start()
                self._pump()
                for _, _, other in queue:
                    other.poll(pump=False)
                yield res
        finally:
            for _, _, h in queue:
                h.cancel()


__all__ = ["Client"]
