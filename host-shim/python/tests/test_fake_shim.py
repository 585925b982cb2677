"""Client machinery against a scripted fake shim: answers out of order, late
answers after a timeout, descriptors arriving for abandoned requests, unknown
fields. (The real stack is covered by the other test files.)"""

from __future__ import annotations

import os
import socket as socketlib
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

import sluice
from sluice import _wire
from sluice.client import fds_from_ancillary, scm_rights

UNKNOWN = bytes.fromhex("f8 06 2a") + bytes.fromhex("fa 06 03") + b"xyz"  # fields 111 (varint), 111 (bytes)


class FakeShim(threading.Thread):
    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.listener = socketlib.socket(socketlib.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(1)
        self.requests: List[Dict[str, Any]] = []
        self.withheld: List[Tuple[Dict[str, Any], Optional[int]]] = []
        self.gets: List[Dict[str, Any]] = []
        self.conn: Optional[socketlib.socket] = None
        self.hold_register = True
        #: Reads nothing after the Hello (a shim that stopped reading).
        self.deaf = False
        self.start()

    def send(self, resp: Dict[str, Any], fd: Optional[int] = None) -> None:
        body = _wire.encode_message("Response", resp) + UNKNOWN
        frame = len(body).to_bytes(4, "big") + body
        assert self.conn is not None
        if fd is None:
            self.conn.sendall(frame)
        else:
            n = self.conn.sendmsg([frame], scm_rights(fd))
            self.conn.sendall(frame[n:])
            os.close(fd)

    def run(self) -> None:
        self.conn, _ = self.listener.accept()
        dec = _wire.FrameDecoder()
        while True:
            data, anc, _, _ = self.conn.recvmsg(1 << 16, socketlib.CMSG_SPACE(16))
            if not data:
                return
            dec.feed(data, fds_from_ancillary(anc))
            for payload in dec.frames():
                self.handle(_wire.decode_message("Request", payload))
            if self.deaf:
                threading.Event().wait()  # holds the connection open, reads nothing

    def handle(self, req: Dict[str, Any]) -> None:
        self.requests.append(req)
        op, id_ = req["op"], req["id"]
        if op == "hello":
            self.send({"id": id_, "hello": {"version": 1, "tenant": "fake", "namespaces": ["data"]}})
        elif op == "head" and req["head"]["path"] == "data/slow":
            self.withheld.append(({"id": id_, "head": {"key": "slow", "size": 1}}, None))
        elif op == "register" and req["register"]["length"] > 1 << 40:
            self.send({"id": id_, "error": {"code": 18, "message": "region larger than max_region_bytes"}})
        elif op == "get" and req["get"]["path"] == "data/huge":
            self.send({"id": id_, "error": {"code": 9, "message": "too small", "needed_bytes": 1 << 50}})
        elif op == "get" and req["get"]["path"] == "data/given-up":
            # The shim's own deadline: the agent may still be writing.
            self.send({"id": id_, "error": {"code": 23, "message": "no answer from the agent in time"}})
        elif op == "get" and req["get"]["path"] == "data/late-deadline":
            # The shim's DEADLINE_EXCEEDED, after the client's own deadline.
            threading.Timer(0.6, self.send, ({"id": id_, "error": {"code": 23, "message": "the shim's answer"}},)).start()
        elif op == "register":
            fd = os.memfd_create("fake")
            length = req["register"]["length"]
            os.ftruncate(fd, length)
            if self.hold_register:  # answered late, after the client gave up
                resp = {"id": id_, "registered": {"region_id": "late-region", "length": length, "fd_attached": True}}
                self.withheld.append((resp, fd))
            else:
                resp = {"id": id_, "registered": {"region_id": f"region-{id_}", "length": length, "fd_attached": True}}
                self.send(resp, fd)
        elif op == "stats":
            for resp, fd in self.withheld:  # late answers first
                self.send(resp, fd)
            self.withheld.clear()
            self.send({"id": id_, "stats": {"requests": len(self.requests)}})
        elif op == "get":
            self.gets.append(req)
            if len(self.gets) == 5:  # answer the pipelined batch in reverse order
                for g in reversed(self.gets):
                    n = int(g["get"]["path"].rsplit("-", 1)[1])
                    report = {"bytes": n, "data_path": 1}
                    self.send({"id": g["id"], "get": {"report": report, "etag": g["get"]["path"]}})
                self.gets.clear()
        elif op == "get_batch":  # answer the items in reverse order, one frame each
            items = req["get_batch"]["items"]
            for k in reversed(range(len(items))):
                path = items[k]["path"]
                if path == "data/huge":
                    err = {"code": 9, "message": "too small", "needed_bytes": 1 << 50}
                    self.send({"id": id_, "item": k, "error": err})
                elif path == "data/given-up":
                    self.send({"id": id_, "item": k, "error": {"code": 23, "message": "no answer in time"}})
                else:
                    report = {"bytes": int(path.rsplit("-", 1)[1]), "data_path": 1}
                    self.send({"id": id_, "item": k, "get": {"report": report, "etag": path}})
        elif op == "release":
            self.send({"id": id_, "released": {}})
        else:
            self.send({"id": id_, "error": {"code": 2, "message": f"fake shim does not do {op}"}})


class short:
    """Calls through ``client`` with a 0.3 s timeout (then restores it)."""

    def __init__(self, client: sluice.Client) -> None:
        self._c = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._c, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            saved, self._c.timeout = self._c.timeout, 0.3
            try:
                return method(*args, **kwargs)
            finally:
                self._c.timeout = saved

        return call


def _open_memfds(name: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name}")
        except OSError:
            pass
    return n


@pytest.fixture
def fake(tmp_path, monkeypatch):
    # No grace past a deadline: the fake's withheld answers come only when
    # asked for, so a timeout here is the client's own.
    monkeypatch.setattr(sluice._core, "ANSWER_GRACE", 0.0)
    path = str(tmp_path / "fake.sock")
    shim = FakeShim(path)
    return path, shim


def test_out_of_order_answers_are_matched_by_id(fake):
    path, shim = fake
    with sluice.Client(path, timeout=10, native=False) as c:
        assert c.tenant == "fake" and c.namespaces == ["data"]
        res = c.get_many([sluice.GetSpec(f"data/k-{i}", into="r1") for i in range(5)])
        assert [r.nbytes for r in res] == [0, 1, 2, 3, 4]
        assert [r.transfer.etag for r in res] == [f"data/k-{i}" for i in range(5)]
        with pytest.raises(sluice.BadRequest, match="fake shim does not do delete"):
            c.delete("data/x")


def test_timeouts_and_late_answers(fake):
    path, shim = fake
    with sluice.Client(path, timeout=10, native=False) as c:
        with pytest.raises(sluice.Timeout):
            short(c).head("data/slow")
        assert c.stats().requests == 3  # the late HEAD answer was discarded
        with pytest.raises(sluice.Timeout):
            short(c).register(4096)
        c.stats()  # the late Registered (with its memfd) arrives now: orphaned
        c.stats()  # ... and is released before this request
        releases = [r["release"]["region_id"] for r in shim.requests if r["op"] == "release"]
        assert releases == ["late-region"]
        assert _open_memfds("fake") == 0  # the late descriptor was closed, not leaked
        assert len(c._pending) == 0 and c._decoder.drain_fds() == []


def test_async_out_of_order(fake):
    import asyncio

    path, shim = fake

    async def main():
        async with sluice.AsyncClient(path, timeout=10) as c:
            res = await asyncio.gather(*(c.get(f"data/k-{i}", into="r1") for i in range(5)))
            assert [t.bytes for t in res] == [0, 1, 2, 3, 4]
            c.timeout = 0.3
            with pytest.raises(sluice.Timeout):
                await c.head("data/slow")
            c.timeout = 10
            assert (await c.stats()).requests == 8

    asyncio.run(main())


def test_abandoned_scratch_region_is_not_reused(fake):
    """A GET that timed out may still be writing into its scratch region:
    the region must be released, never lent to the next operation."""
    path, shim = fake
    shim.hold_register = False
    with sluice.Client(path, timeout=10, native=False) as c:
        with pytest.raises(sluice.Timeout):
            short(c).get_bytes("data/k-1")  # the fake holds GETs until it has 5
        assert len(c._pool) == 0
        c.stats()  # the release goes out before this request
        registered = [r["id"] for r in shim.requests if r["op"] == "register"]
        released = [r["release"]["region_id"] for r in shim.requests if r["op"] == "release"]
        assert len(registered) == 1 and released == [f"region-{registered[0]}"]
        assert _open_memfds("fake") == 0


def test_an_object_too_large_to_read_teaches_no_slot_size(fake):
    """A read that needs a region the shim will not register fails alone:
    later reads of unknown size keep their slot size (it was learned from
    the failure, and every later read then failed to register its slot)."""
    path, shim = fake
    shim.hold_register = False
    with sluice.Client(path, timeout=10, native=False) as c:
        guess = c._size_guess
        with pytest.raises(sluice.ResourceExhausted):
            c.get_bytes("data/huge")
        assert c._size_guess == guess
        res = c.get_many(["data/huge"])
        assert not res[0].ok and c._size_guess == guess


def test_a_region_the_shim_gave_up_on_is_never_reused(fake):
    """The shim's own DEADLINE_EXCEEDED comes while the agent may still write
    into the region: it is released, never pooled for the next read."""
    path, shim = fake
    shim.hold_register = False
    with sluice.Client(path, timeout=10, native=False) as c:
        with pytest.raises(sluice.DeadlineExceeded):
            c.get_bytes("data/given-up")
        assert len(c._pool) == 0
        res = c.get_many(["data/given-up"])
        assert isinstance(res[0].error, sluice.DeadlineExceeded) and len(c._pool) == 0
        c.stats()  # the releases go out before this request
        released = [r["release"]["region_id"] for r in shim.requests if r["op"] == "release"]
        assert len(released) == 2


def test_the_shims_answer_to_a_deadline_is_waited_for(fake, monkeypatch):
    """Past the client's deadline, the shim's own answer (here 0.3 s after
    it) is what the caller gets, not a local Timeout."""
    monkeypatch.setattr(sluice._core, "ANSWER_GRACE", 2.0)
    path, shim = fake
    shim.hold_register = False
    with sluice.Client(path, timeout=10, native=False) as c:
        with pytest.raises(sluice.DeadlineExceeded, match="the shim's answer"):
            short(c).get_bytes("data/late-deadline")


def test_a_call_cancelled_while_it_is_sent_leaks_no_region(fake):
    """A task cancelled while its Register frame goes out: the frame still
    goes whole, and the region its late answer names is released and its
    descriptor closed (the answer went to a future nobody read)."""
    import asyncio

    path, shim = fake
    shim.hold_register = False

    async def main():
        async with sluice.AsyncClient(path, timeout=10) as c:
            write = c._write_frame

            async def slow_write(frame, fd):
                await asyncio.sleep(0.2)
                await write(frame, fd)

            c._write_frame = slow_write
            task = asyncio.ensure_future(c.register(4096))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            c._write_frame = write
            await asyncio.sleep(0.5)  # the answer arrives, to nobody
            await c.stats()  # the release goes out before this request
            await c.stats()

    asyncio.run(main())
    released = [r["release"]["region_id"] for r in shim.requests if r["op"] == "release"]
    registered = [r["id"] for r in shim.requests if r["op"] == "register"]
    assert len(registered) == 1 and released == [f"region-{registered[0]}"]
    assert _open_memfds("fake") == 0


def test_a_shim_that_stops_reading_ends_the_connection_after_the_send_wait(fake, monkeypatch):
    """A send the shim takes nothing of fails after SEND_WAIT with a clear
    error (it held the sending thread, and every other, for good)."""
    path, shim = fake
    shim.deaf = True
    monkeypatch.setattr(sluice._core, "SEND_WAIT", 0.5)
    c = sluice.Client(path, timeout=30)
    started = time.monotonic()
    with pytest.raises(sluice.Disconnected, match="took none of a frame for 0.5 s"):
        c.head("data/" + "k" * 900_000)  # one frame far larger than the socket's buffer
    assert time.monotonic() - started < 10
    with pytest.raises(sluice.Disconnected):
        c.head("data/next")
