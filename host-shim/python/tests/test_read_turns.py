"""The blocking client's callers read their own answers, one at a time
(``sluice._turns``): the turn-taking alone, then against the scripted fake
shim (several threads on one client, an interrupted read)."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, List, Optional

import pytest

import sluice
from sluice._turns import Answer, ReadTurn

from test_fake_shim import FakeShim


def _turn() -> ReadTurn:
    return ReadTurn(threading.Lock())


def test_an_answer_is_set_once():
    a = Answer(7, 0.5)
    assert (a.sluice_id, a.sluice_timeout, a.done()) == (7, 0.5, False)
    with pytest.raises(RuntimeError):
        a.result()
    a.set_result("first")
    a.set_result("second")  # ignored: its lock is not released twice
    assert a.done() and a.result() == "first"


def test_a_caller_alone_reads_its_own_answer():
    turn, a = _turn(), Answer(1)
    readers: List[int] = []

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        readers.append(threading.get_ident())
        with turn._lock:
            ans.set_result("mine")

    assert turn.wait(a, None, lead) and a.result() == "mine"
    assert readers == [threading.get_ident()]
    assert not turn._waiting and turn._leader == 0


def test_a_deadline_ends_the_wait_and_the_registration():
    turn, a = _turn(), Answer(1)

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        assert deadline is not None
        time.sleep(max(0.0, deadline - time.monotonic()))  # nothing arrives

    t0 = time.monotonic()
    assert turn.wait(a, t0 + 0.05, lead) is False
    assert 0.04 <= time.monotonic() - t0 < 2
    assert not a.done() and not turn._waiting
    assert turn.wait(a, time.monotonic() - 1, lead) is False  # already passed: no wait


def _two_waiters(answer_both: bool):
    """A reads first and blocks until B waits; A's read then answers A (and
    B too if ``answer_both``). Returns who read, in order, and B's result."""
    turn, a, b = _turn(), Answer(1), Answer(2)
    b_waiting = threading.Event()
    readers: List[str] = []

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        me = "A" if ans is a else "B"
        readers.append(me)
        if me == "A":
            assert b_waiting.wait(5)
            time.sleep(0.05)  # B has tried the token and sleeps on its answer
            with turn._lock:
                a.set_result("a")
                if answer_both:
                    b.set_result("b")
        else:
            with turn._lock:
                b.set_result("b, read by B")

    got = {}
    leader = threading.Thread(target=lambda: got.update(a=turn.wait(a, time.monotonic() + 5, lead)))
    leader.start()
    while not turn._leader:
        time.sleep(0.001)

    def follower() -> None:
        with turn._lock:
            pass
        b_waiting.set()
        got["b"] = turn.wait(b, time.monotonic() + 5, lead)

    f = threading.Thread(target=follower)
    f.start()
    leader.join(10)
    f.join(10)
    assert got == {"a": True, "b": True}
    assert not turn._waiting
    return readers, b.result()


def test_a_leaving_reader_hands_the_turn_to_a_waiter_still_unanswered():
    readers, b = _two_waiters(answer_both=False)
    assert readers == ["A", "B"] and b == "b, read by B"


def test_a_waiter_answered_by_the_reader_does_not_read():
    readers, b = _two_waiters(answer_both=True)
    assert readers == ["A"] and b == "b"


def test_a_waiter_roused_as_its_deadline_passes_rouses_the_next():
    """A reads; B (short deadline) and then C (long) wait. A leaves and
    rouses B just as B gives up: B must rouse C on its way out, or C
    sleeps out its whole deadline with nobody reading."""
    a, b, c = Answer(1), Answer(2), Answer(3)
    let_a_go = threading.Event()
    readers: List[str] = []

    class Turn(ReadTurn):
        def _take(self, me: int) -> bool:
            if threading.current_thread().name == "B":
                # Every try of B's finds the turn taken: the first one lets
                # A leave (once C sleeps) and returns only after A gave the
                # turn back, rousing B.
                while c not in self._waiting:
                    time.sleep(0.001)
                time.sleep(0.05)
                let_a_go.set()
                while self._leader:
                    time.sleep(0.001)
                return False
            return super()._take(me)

    turn = Turn(threading.Lock())

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        name = threading.current_thread().name
        readers.append(name)
        if name == "A":
            assert let_a_go.wait(5)
        with turn._lock:
            ans.set_result(name)

    took = {}

    def run(name: str, ans: Answer, seconds: float) -> None:
        t0 = time.monotonic()
        turn.wait(ans, t0 + seconds, lead)
        took[name] = time.monotonic() - t0

    ta = threading.Thread(target=run, args=("A", a, 5), name="A")
    ta.start()
    while not turn._leader:
        time.sleep(0.001)
    tb = threading.Thread(target=run, args=("B", b, 0.3), name="B")
    tb.start()
    while b not in turn._waiting:
        time.sleep(0.001)
    tc = threading.Thread(target=run, args=("C", c, 5), name="C")
    tc.start()
    for t in (ta, tb, tc):
        t.join(10)
    assert readers == ["A", "C"] and c.result() == "C" and not b.done()
    assert took["C"] < 2, took


def test_hold_keeps_others_from_reading_and_is_not_taken_twice():
    turn = _turn()
    with turn.hold(timeout=0) as outer:
        assert outer and turn.is_reading()
        with turn.hold(timeout=0) as inner:  # the same thread: keeps it
            assert inner is False and turn.is_reading()
        seen = []

        def other() -> None:
            with turn.hold(timeout=0.02) as got:
                seen.append(got)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen == [False]
    assert not turn.is_reading() and turn._leader == 0


def test_a_turn_left_taken_by_an_interrupted_caller_is_taken_back_by_its_next_call():
    turn, a = _turn(), Answer(1)
    assert turn._take(threading.get_ident())  # ... and Ctrl-C before it read

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        with turn._lock:
            ans.set_result("read")

    assert turn.wait(a, time.monotonic() + 5, lead) and a.result() == "read"
    assert turn._leader == 0


def test_a_waiter_roused_to_read_that_leaves_rouses_the_next():
    turn, b, c = _turn(), Answer(2), Answer(3)
    turn._take(-1)  # someone else reads
    with turn._lock:
        turn._waiting[b] = None
        turn._waiting[c] = None
        turn._leader = 0
        turn._rouse_next()  # the reader left: b is roused
    assert b._woken and not c._woken
    with turn._lock:  # b leaves without reading (its deadline passed)
        turn._waiting.pop(b)
        turn._rouse_next()
    assert c._woken


# ------------------------------------------------------ against the fake --
@pytest.fixture
def fake(tmp_path):
    path = str(tmp_path / "fake.sock")
    return path, FakeShim(path)


def test_the_client_starts_no_thread(fake):
    path, _ = fake
    before = threading.active_count()
    with sluice.Client(path, timeout=10, native=False) as c:
        assert c.stats().requests == 2
        assert threading.active_count() == before


def test_threads_sharing_a_client_each_get_their_answer(fake):
    """Five threads' GETs are answered together, last first (the fake holds
    them until it has five): whoever reads hands the others theirs, and the
    turn passes on as readers leave."""
    path, _ = fake
    with sluice.Client(path, timeout=10, native=False) as c:
        for _ in range(3):
            results: dict = {}

            def one(i: int) -> None:
                results[i] = c.get(f"data/k-{i}", into="r1")

            threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(20)
            assert {i: (t.bytes, t.etag) for i, t in results.items()} == {i: (i, f"data/k-{i}") for i in range(5)}
            assert not c._turn._waiting and not c._pending


def test_an_interrupted_read_ends_the_connection_with_a_clear_error(fake, monkeypatch):
    """Ctrl-C lands in whichever caller is reading. Once bytes have left the
    socket the stream cannot be trusted to stay in step, so the connection
    ends and later calls say why (rather than wait for lost answers)."""
    path, _ = fake
    c = sluice.Client(path, timeout=10, native=False)
    parse = c._parse

    def interrupted(payload: bytes):
        monkeypatch.setattr(c, "_parse", parse)
        raise KeyboardInterrupt

    monkeypatch.setattr(c, "_parse", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.stats()
    with pytest.raises(sluice.Disconnected, match="interrupted while taking in"):
        c.stats()
    c.close()


def test_a_send_cut_short_ends_the_connection_with_a_clear_error(fake):
    """Ctrl-C (or a signal handler's exception) during the send of a frame
    can leave part of it on the socket: the next frame, from any thread,
    would be read as its rest. So the connection ends, and later calls say
    why, rather than send into a stream the shim can no longer read."""
    path, _ = fake
    c = sluice.Client(path, timeout=10, native=False)

    class HalfThenInterrupt:
        def __init__(self, sock: Any) -> None:
            self.sock, self.cut = sock, False

        def sendall(self, data: Any) -> None:
            if not self.cut:
                self.cut = True
                self.sock.send(bytes(data[: len(data) // 2]))
                raise KeyboardInterrupt
            self.sock.sendall(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    real = c._sock
    c._sock = HalfThenInterrupt(real)
    with pytest.raises(KeyboardInterrupt):
        c.stats()
    with pytest.raises(sluice.Disconnected, match="cut short while it was sent"):
        c.stats()
    c._sock = real
    c.close()


def test_no_caller_sleeps_while_nobody_reads(fake):
    """Threads with deadlines shorter than an answer's round trip give up
    while others read, with the interpreter switching threads as often as
    it can: a caller with a long deadline must never sleep with nobody
    reading (it would wait out its whole deadline)."""
    import sys

    path, _ = fake
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with sluice.Client(path, timeout=10, native=False) as c:
            t0 = time.perf_counter()
            for _ in range(50):
                c.stats()
            rtt = (time.perf_counter() - t0) / 50
            worst: List[float] = []
            end = time.monotonic() + float(os.environ.get("STRESS_S", "2"))
            rounds = 0
            while time.monotonic() < end:
                rounds += 1

                def short(k: int) -> None:
                    try:  # the fake refuses a delete at once
                        c.delete("data/x", timeout=rtt * random.uniform(0.3, 1.5))
                    except (sluice.Timeout, sluice.BadRequest):
                        pass

                def long_() -> None:
                    t = time.perf_counter()
                    with pytest.raises(sluice.BadRequest):
                        c.delete("data/x", timeout=5)
                    worst.append(time.perf_counter() - t)

                ts = [threading.Thread(target=short, args=(k,)) for k in range(4)]
                ts += [threading.Thread(target=long_) for _ in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(20)
            assert rounds > 20 and max(worst) < 1.0, (rounds, max(worst))
            assert not c._turn._waiting and c._turn._leader == 0
    finally:
        sys.setswitchinterval(saved)


def test_closing_wakes_a_caller_that_is_reading(fake):
    path, _ = fake
    c = sluice.Client(path, timeout=30, native=False)
    errors: List[BaseException] = []

    def slow() -> None:
        try:
            c.head("data/slow")  # the fake withholds this answer
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    t = threading.Thread(target=slow)
    t.start()
    while not c._turn._leader:
        time.sleep(0.001)
    t0 = time.monotonic()
    c.close()
    t.join(10)
    assert time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], sluice.Disconnected)


def test_a_long_run_of_requests_takes_in_answers_as_it_sends(fake, monkeypatch):
    """Nobody reads while a caller is still sending, so a long run of
    requests takes in what has come every PUMP_EVERY sends: the shim's
    queue of answers is bounded, and a client not reading could otherwise
    stall both sides."""
    from sluice._core import Call
    from sluice.client import PUMP_EVERY

    path, _ = fake
    with sluice.Client(path, timeout=10, native=False) as c:
        pumps = []
        pump = c._pump
        monkeypatch.setattr(c, "_pump", lambda: (pumps.append(1), pump()))
        n = 5 * PUMP_EVERY + 3
        answers = c._submit_batch([Call("stats", {}) for _ in range(n)])
        assert len(pumps) == 5
        outs = [c._wait(a) for a in answers]
        assert [o.body["requests"] for o in outs] == list(range(2, n + 2))
        assert not c._pending and not c._turn._waiting


def test_a_signal_handler_cannot_read_inside_an_interrupted_read():
    """A handler running in the reading thread, in the middle of its read,
    must not take the turn back and read the same stream a second time."""
    turn, a, b = _turn(), Answer(1), Answer(2)
    seen: List[BaseException] = []

    def lead(ans: Answer, deadline: Optional[float]) -> None:
        if ans is a:  # "the handler" runs here, inside A's read
            try:
                turn.wait(b, time.monotonic() + 1, lead)
            except RuntimeError as e:
                seen.append(e)
        with turn._lock:
            ans.set_result("ok")

    assert turn.wait(a, time.monotonic() + 5, lead)
    assert len(seen) == 1 and "signal handler" in str(seen[0])
    assert turn._leader == 0 and not turn._waiting
