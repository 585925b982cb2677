"""The native read path: ``Client.get_bytes(path)`` and
``Client.get_many(paths)`` through the Rust client (``sluice._native``,
built from ``host-shim/python/native``), with the interpreter lock
released while a request is out.

Why: in Python every call costs ~90 µs of interpreter time, and threads
calling ``get_bytes`` queue for the one interpreter lock
(docs/performance.md). The native reader holds the lock only to take its
arguments and to copy the bytes into the ``bytes`` it returns.

It is used when the extension is installed and the client was not told
otherwise (``Client(native=False)`` or ``SLUICE_NATIVE=0``), for the calls it
serves exactly as the Python path does: whole objects returned as
``bytes`` (no range, ``copy=True``), and ``get_many`` of paths only. The
native reader opens a shim connection of its own on first use (so a client
using it holds two; the shim allows 128 per user by default); if that
connection cannot be made, the client says so in its log and goes on in
Python.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _malloc
from ._core import _path, _range, _u64
from .errors import Disconnected, ProtocolError, ShimConnectionError, SluiceError, Timeout, from_detail
from .region import Region
from .types import GetSpec, ItemResult, Transfer

try:  # the extension is optional: without it everything runs in Python
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _native = None

log = logging.getLogger("sluice")


def available() -> bool:
    """Whether the native extension is installed."""
    return _native is not None


def wanted(setting: Any) -> bool:
    """Whether a client made with ``native=setting`` uses the native path:
    ``"auto"`` (the default) when the extension is installed and
    ``SLUICE_NATIVE`` is not ``0``; ``True`` requires the extension."""
    if setting is False:
        return False
    if setting is True:
        if _native is None:
            raise ImportError(
                "native=True, but sluice._native is not installed (build host-shim/python with cargo on the PATH)"
            )
        return True
    if setting != "auto":
        raise ValueError(f"native must be 'auto', True or False, not {setting!r}")
    return _native is not None and os.environ.get("SLUICE_NATIVE", "1") != "0"


def _error(kind: str, code: int, message: str, request_id: str, needed: int) -> SluiceError:
    if kind == "shim":
        return from_detail(code, message, request_id, needed)
    if kind == "timeout":
        return Timeout(message)
    if kind == "disconnected":
        return Disconnected(f"the shim connection closed: {message}")
    if kind in ("connect", "closed"):
        return ShimConnectionError(message)
    return ProtocolError(message)


def _each_failed(paths: Sequence[str], e: Exception, closed: bool) -> List[ItemResult]:
    """A batch the native reader failed as a whole (its connection lost, its
    deadline passed) as the Python path reports it: every item failed with
    that error (``get_many`` never raises for them); a client closed
    (``closed``: meanwhile too), or a connection that cannot be made, is
    raised."""
    err = _error(*e.args)
    if closed or (e.args and e.args[0] in ("connect", "closed")):
        if not isinstance(err, ShimConnectionError):
            err = ShimConnectionError(f"the client is closed: {err}")
        raise err from None
    results = []
    for i, path in enumerate(paths):
        res = ItemResult(path, i)
        res.error = err
        results.append(res)
    return results


def _transfer(t: Tuple[Any, ...]) -> Transfer:
    return Transfer(*t)


def _noted_size(n: int) -> None:
    # As Region.read does for the Python path: a large result makes the
    # process keep freed memory (sluice._malloc).
    if n >= _malloc.WORTH_IT and _malloc._state is None:
        _malloc.keep_freed_memory()


class NativeReads:
    """A client's native reader, made on first use, and made again after a
    call interrupted by a signal ended its connection (as the Python path
    does, a connection that may hold half a request is not trusted)."""

    def __init__(
        self,
        socket_path: str,
        connect_timeout: Optional[float],
        scratch_bytes: int,
        batch_bytes: int,
        join: str = "",
    ):
        self._args = (socket_path, connect_timeout, scratch_bytes, batch_bytes)
        #: The Python connection's join token ("": the shim does not offer
        #: joining, and the reader opens a session of its own).
        self._join = join
        self._lock = threading.Lock()
        self._reader: Any = None
        #: Why the native path is off for this client ("" while it is on).
        self.off = ""
        _LIVE.add(self)

    def _get(self, call_timeout: Optional[float]) -> Any:
        r = self._reader
        if r is not None and not r.closed:
            return r
        with self._lock:
            if self.off:
                return None
            r = self._reader
            if r is not None and not r.closed:
                return r
            socket_path, connect_timeout, scratch, batch = self._args
            # The first call waits no longer for the connection than for
            # its own answer.
            limits = [t for t in (connect_timeout, call_timeout) if t is not None and t > 0]
            try:
                self._reader = _native.Reader(  # type: ignore[union-attr]
                    socket_path, min(limits) if limits else None, scratch, batch, self._join
                )
            except _native.NativeError as e:  # type: ignore[union-attr]
                self.off = str(_error(*e.args))
                log.warning("sluice: the native read path is off for this client (%s); reading in Python", self.off)
                return None
            return self._reader

    def ready(self, call_timeout: Optional[float]) -> bool:
        """Whether calls can go the native way (connecting if need be)."""
        return self._get(call_timeout) is not None

    def joined(self, call_timeout: Optional[float]) -> bool:
        """Whether calls into the Python connection's regions can go the
        native way: the reader is up and joined that connection's session."""
        if not self._join:  # a shim older than joining: no reader is opened for this
            return False
        r = self._get(call_timeout)
        return r is not None and bool(r.joined)

    def get_into(
        self,
        path: str,
        region_id: str,
        offset: int,
        span: Optional[Dict[str, Any]],
        timeout: Optional[float],
        if_match: str,
    ) -> Transfer:
        reader = self._reader_or_closed(timeout)
        start, length = (None, None) if span is None else (span["start"], span["length"])
        try:
            t = reader.get_into(path, region_id, offset, start, length, timeout, if_match)
        except _native.NativeError as e:  # type: ignore[union-attr]
            raise _error(*e.args) from None
        return _transfer(t)

    def get_many_into(self, items: List[Tuple[Any, ...]], timeout: Optional[float]) -> List[ItemResult]:
        """``items``: from :func:`checked_items`."""
        paths = [i[0] for i in items]
        reader = self._reader_or_closed(timeout)
        try:
            outs = reader.get_many_into(items, timeout)
        except _native.NativeError as e:  # type: ignore[union-attr]
            return _each_failed(paths, e, closed=self._reader is None)
        results = []
        for i, (path, out) in enumerate(zip(paths, outs)):
            res = ItemResult(path, i)
            if out[0]:
                t = _transfer(out[1])
                res.ok, res.transfer, res.nbytes = True, t, t.bytes
            else:
                res.error = _error(*out[1:])
            results.append(res)
        return results

    def _reader_or_closed(self, call_timeout: Optional[float]) -> Any:
        r = self._get(call_timeout)
        if r is None:  # closed since the caller checked
            raise ShimConnectionError(f"the client is closed ({self.off})")
        return r

    def get_bytes(self, path: str, size_hint: int, timeout: Optional[float]) -> bytes:
        reader = self._reader_or_closed(timeout)
        try:
            data = reader.get_bytes(path, size_hint, timeout, False)
        except _native.NativeError as e:  # type: ignore[union-attr]
            raise _error(*e.args) from None
        _noted_size(len(data))
        return data

    def get_bytes_and_transfer(self, path: str, size_hint: int, timeout: Optional[float]) -> Tuple[bytes, Transfer]:
        reader = self._reader_or_closed(timeout)
        try:
            data, t = reader.get_bytes(path, size_hint, timeout)
        except _native.NativeError as e:  # type: ignore[union-attr]
            raise _error(*e.args) from None
        _noted_size(len(data))
        return data, _transfer(t)

    def get_many(self, paths: Sequence[str], timeout: Optional[float]) -> List[ItemResult]:
        reader = self._reader_or_closed(timeout)
        try:
            outs = reader.get_many(list(paths), timeout)
        except _native.NativeError as e:  # type: ignore[union-attr]
            return _each_failed(paths, e, closed=self._reader is None)
        results = []
        largest = 0
        for i, (path, out) in enumerate(zip(paths, outs)):
            res = ItemResult(path, i)
            if out[0]:
                t = _transfer(out[2])
                res.ok, res.data, res.transfer, res.nbytes = True, out[1], t, t.bytes
                largest = max(largest, t.bytes)
            else:
                res.error = _error(*out[1:])
            results.append(res)
        _noted_size(largest)
        return results

    def stats(self) -> Optional[Tuple[int, ...]]:
        """The native connection's counters, if it is open (a connection
        that ended has none to add)."""
        r = self._reader
        if r is None or r.closed:
            return None
        if r.joined:
            # Counted in the Python connection's session already; its
            # scratch releases are settled first, so they show there.
            try:
                r.settle()
            except _native.NativeError:  # type: ignore[union-attr]
                pass
            return None
        try:
            return tuple(r.stats())
        except _native.NativeError as e:  # type: ignore[union-attr]
            log.debug("sluice: no counters from the native connection: %s", _error(*e.args))
            return None

    def close(self) -> None:
        with self._lock:
            r, self._reader = self._reader, None
            self.off = self.off or "the client is closed"
        if r is not None:
            r.close()

    def _after_fork_in_child(self) -> None:
        # The child's copy of the socket is closed so the shim sees the
        # connection end with the parent; the rest belongs to the parent's
        # threads and is left alone.
        self._lock = threading.Lock()
        self.off = "inherited from the parent process across fork"
        r, self._reader = self._reader, None
        if r is not None:
            r.abandon()


def into_host_region(item: Any) -> bool:
    """Whether a ``get_many`` item is one the native reader serves: a
    :class:`GetSpec` into a live host :class:`Region` (or a region id)."""
    if type(item) is not GetSpec:
        return False
    into = item.into
    return type(into) is str or (type(into) is Region and not into.released)


def checked_items(specs: Sequence[GetSpec]) -> List[Tuple[Any, ...]]:
    """Every item checked before any is sent, in the Python path's order
    and with its errors: ``(path, region_id, offset, start, length,
    if_match)`` each."""
    paths = [_path(s.path) for s in specs]  # every path first, as in Python
    out = []
    for s, path in zip(specs, paths):
        if not isinstance(s.if_match, str):
            raise TypeError("if_match must be a str (an ETag as a Transfer returned it)")
        span = _range(s.range)
        region_id = s.into if type(s.into) is str else s.into.id
        offset = _u64("offset", s.offset)
        start, length = (None, None) if span is None else (span["start"], span["length"])
        out.append((path, region_id, offset, start, length, s.if_match))
    return out


_LIVE: "weakref.WeakSet[NativeReads]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for n in list(_LIVE):
        n._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["NativeReads", "available", "wanted"]
