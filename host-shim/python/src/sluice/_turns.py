"""Answers, and whose turn it is to read them.

The blocking client has no reader thread: a caller waiting for an answer
reads the connection itself, one caller at a time (a leader/follower
scheme). A caller alone on a client (a loader's ``get_bytes`` loop) so
waits on the socket and takes its answer in, where a reader thread cost a
wake-up of that thread and a hand-off back per call (docs/performance.md).

* A waiter first registers (``ReadTurn.wait``), then tries to take the
  turn. Whoever has it reads and hands every answer it finds to its
  waiter; the others sleep on their own :class:`Answer`.
* A reader leaves when its own answer is in (or its deadline passes): in
  one step under the client's lock it gives the turn back and rouses one
  registered waiter whose answer has not come. A roused waiter that leaves
  without reading (its deadline, Ctrl-C) rouses the next. Registering
  before trying, and these steps under one lock, mean no waiter is left
  asleep with nobody reading.
* The one gap is Python's: Ctrl-C landing in the main thread just after it
  took the turn and before it began to read. The turn is then held by a
  thread that is not reading; that thread's next call takes it back, and
  until then other threads' calls wait to their deadline.
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
    """Whose turn it is to read, and the callers waiting for an answer.

    ``lock`` is the client's pending-table lock. Under it: answers are set
    and waiters roused, and the turn is taken and given back (so taking it
    and naming the reader are one step, and giving it back and rousing the
    next reader are one step too: an exception cannot fall between them).
    """

    def __init__(self, lock: "threading.Lock") -> None:
        self._lock = lock
        self._waiting: Dict[Answer, None] = {}  # an ordered set
        self._leader = 0  # thread ident of the caller reading now; 0: nobody
        self._reading = False  # the leader is inside ``lead`` (not just holding the turn)

    def wait(self, ans: Answer, deadline: Optional[float], lead: Callable[[Answer, Optional[float]], None]) -> bool:
        """Waits until ``ans`` is set (True), or False when ``deadline`` (a
        ``time.monotonic()`` value; None: none) passes or the connection is
        gone first. When nobody is reading, this caller reads:
        ``lead(ans, deadline)`` must read and hand out answers until ``ans``
        is set, the deadline passes or the connection is gone."""
        if ans._done:
            return True
        me = threading.get_ident()
        with self._lock:
            if self._leader == me:
                if self._reading:
                    # Only a signal handler can get here: it interrupted this
                    # thread in the middle of a read. A second reader on the
                    # same stream would corrupt it; waiting would never end.
                    raise RuntimeError("a sluice.Client cannot be used from a signal handler that interrupted it")
                # This thread is not inside a read while it starts a wait:
                # an earlier call of it was interrupted (Ctrl-C) between
                # taking the turn and reading. Take it back rather than leave
                # the connection with a reader that never reads.
                self._leader = 0
            self._waiting[ans] = None
        try:
            while not ans._done:
                if self._take(me):
                    try:
                        self._reading = True
                        lead(ans, deadline)
                    finally:
                        self._reading = False
                        self._give_back()
                    # Not answered: the deadline passed or the connection is
                    # gone (reading again would find nothing new).
                    return ans._done
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
                # Roused to read but leaving (timed out, interrupted)
                # without reading: rouse another in its place.
                self._rouse_next()

    def _take(self, me: int) -> bool:
        with self._lock:
            if self._leader:
                return False
            self._leader = me
            return True

    def _give_back(self) -> None:
        with self._lock:
            self._leader = 0
            self._rouse_next()

    def _rouse_next(self) -> None:
        """Under the lock: if nobody is reading, rouses the first waiter
        whose answer has not come (nothing if it is already roused: it is on
        its way)."""
        if self._leader:
            return
        for w in self._waiting:
            if not w._done:
                w._rouse()
                return

    def rouse_all(self) -> None:
        """Under the lock: wakes every waiter (the connection has ended)."""
        for w in self._waiting:
            w._rouse()

    def is_reading(self) -> bool:
        """Whether the calling thread has the turn."""
        return self._leader == threading.get_ident()

    @contextlib.contextmanager
    def hold(self, timeout: Optional[float]) -> Iterator[bool]:
        """Takes the turn (trying for up to ``timeout`` seconds; None: no
        limit) for a read outside :meth:`wait`, or to close the socket with
        nobody inside a read. Yields whether it was taken; a thread that
        already has it gets False and keeps it. Used rarely (closing, a
        failed send, a non-blocking poll), hence a short sleep between
        tries rather than a place in the queue."""
        me = threading.get_ident()
        if self._leader == me:
            yield False
            return
        end = None if timeout is None else time.monotonic() + timeout
        got = self._take(me)
        while not got and (end is None or time.monotonic() < end):
            time.sleep(0.001)
            got = self._take(me)
        try:
            self._reading = got
            yield got
        finally:
            if got:
                self._reading = False
                self._give_back()
