"""Answers, and whose turn it is to read them.

The blocking client has no reader thread: a caller waiting for an answer
reads the connection itself, one caller at a time (a leader/follower
scheme). A caller alone on a client (a loader's ``get_bytes`` loop) so
waits on the socket and takes its answer in, where a reader thread cost a
wake-up of that thread and a hand-off back per call (docs/performance.md).

* A waiter first registers (``ReadTurn.wait``), then tries the read token.
  Whoever holds it reads and hands every answer it finds to its waiter;
  the others sleep on their own :class:`Answer`.
* A reader leaves when its own answer is in (or its deadline passes): it
  gives the token back and then rouses one registered waiter whose answer
  has not come, unless another caller has taken the token meanwhile (it
  will do the same when it leaves). Registering before trying, and giving
  back before rousing, means no waiter can be left asleep with nobody
  reading.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

from ._core import Outcome


class Answer:
    """The answer to one request: set once (by whichever caller is reading,
    or at once for a request that could not be sent) and waited for by its
    caller, who may be roused before it is set to take its turn reading.

    ``_wake`` is a lock held while the waiter has nothing to wake up for;
    releasing it (``_rouse``) wakes the waiter. ``_woken`` says it is
    released and not yet taken back: both change only under the client's
    pending-table lock, so a lock is never released twice.
    """

    __slots__ = ("_wake", "_woken", "_value", "_done", "sluice_id", "sluice_timeout")

    def __init__(self, id_: int = -1, timeout: Optional[float] = None) -> None:
        self._wake = threading.Lock()
        self._wake.acquire()
        self._woken = False
        self._value: Any = None
        self._done = False
        self.sluice_id = id_
        self.sluice_timeout = timeout

    def done(self) -> bool:
        return self._done

    def result(self) -> Outcome:
        """The answer; only once :meth:`done`."""
        if not self._done:
            raise RuntimeError("no answer yet")
        return self._value

    def set_result(self, value: Outcome) -> None:
        """Sets the answer and wakes its waiter. One setter per answer:
        whoever took it out of the pending table under the client's lock (a
        reading caller), or the submitter of a request that was never sent
        (before anyone can wait). A second call is ignored."""
        if self._done:
            return
        self._value = value
        self._done = True
        self._rouse()

    def _rouse(self) -> None:
        if not self._woken:
            self._woken = True
            self._wake.release()


class ReadTurn:
    """The read token, and the callers waiting for an answer.

    ``lock`` is the client's pending-table lock: answers are set and waiters
    roused under it.
    """

    def __init__(self, lock: "threading.Lock") -> None:
        self._lock = lock
        self._token = threading.Lock()
        self._waiting: Dict[Answer, None] = {}  # an ordered set
        self._leader = 0  # thread ident of the caller reading now

    def wait(self, ans: Answer, deadline: Optional[float], lead: Callable[[Answer, Optional[float]], None]) -> bool:
        """Waits until ``ans`` is set (True) or ``deadline`` (a
        ``time.monotonic()`` value; None: none) passes (False). When the
        token is free, this caller reads: ``lead(ans, deadline)`` must read
        and hand out answers until ``ans`` is set, the deadline passes or
        the connection is gone."""
        if ans._done:
            return True
        with self._lock:
            self._waiting[ans] = None
        try:
            while not ans._done:
                if self._token.acquire(blocking=False):
                    self._leader = threading.get_ident()
                    try:
                        lead(ans, deadline)
                    finally:
                        self._leader = 0
                        self._token.release()
                        self._pass_on(ans)
                    if ans._done:
                        return True
                    if deadline is not None and time.monotonic() >= deadline:
                        return False
                    continue
                if deadline is None:
                    woke = ans._wake.acquire()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    woke = ans._wake.acquire(timeout=left)
                if woke:
                    with self._lock:
                        ans._woken = False
            return True
        finally:
            with self._lock:
                self._waiting.pop(ans, None)

    def _pass_on(self, leaving: Optional[Answer]) -> None:
        """Rouses one waiter whose answer has not come, to read next; none
        if another caller took the token meanwhile (every holder passes on
        when it gives the token back, so nobody is left asleep, and a waiter
        is not woken only to find the token taken)."""
        if self._token.locked():
            return
        with self._lock:
            for w in self._waiting:
                if w is not leaving and not w._done:
                    w._rouse()
                    return

    def is_reading(self) -> bool:
        """Whether the calling thread holds the token."""
        return self._leader == threading.get_ident()

    @contextlib.contextmanager
    def hold(self, timeout: Optional[float]) -> Iterator[bool]:
        """Takes the token (waiting up to ``timeout`` seconds; None: no
        limit) for a read outside :meth:`wait`, or for closing the socket
        with nobody inside a read. Yields whether it was taken; a thread
        that already holds it gets False and keeps it."""
        if self.is_reading():
            yield False
            return
        got = self._token.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        if got:
            self._leader = threading.get_ident()
        try:
            yield got
        finally:
            if got:
                self._leader = 0
                self._token.release()
                self._pass_on(None)
