"""The native read path (``sluice._native``): ``get_bytes(path)`` and
``get_many(paths)`` through the Rust client must return what the Python path
returns (bytes, transfer reports, typed errors), from many threads, and
stay out of the way where it does not apply.

CI installs the extension and requires it (``SLUICE_NATIVE_BUILD=required``):
there a missing extension fails these tests instead of skipping them."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import socket as socketlib
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import sluice
from sluice import _native_reads, _wire
from sluice.client import scm_rights

from _helpers import payload

if not _native_reads.available():
    if os.environ.get("SLUICE_NATIVE_BUILD") == "required":
        pytest.fail("sluice._native is not installed, and SLUICE_NATIVE_BUILD=required", pytrace=False)
    pytest.skip("sluice._native is not installed (build it: python3 setup.py --native-inplace)", allow_module_level=True)


def _pair(stack):
    return sluice.Client(stack.socket, timeout=60, native=True), sluice.Client(stack.socket, timeout=60, native=False)


def _same_transfer(a: sluice.Transfer, b: sluice.Transfer) -> None:
    for f in ("bytes", "data_path", "fallback_reason", "etag", "object_size", "verified", "unverified_reason"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.request_id and a.request_id != b.request_id


def test_get_bytes_returns_what_the_python_path_returns(stack, prefix):
    """Every size class: empty, tiny, a page, above the unlocked-copy size,
    above the first guess (read again at the size the shim says), and a
    result big enough for huge pages."""
    nat, py = _pair(stack)
    with nat, py:
        sizes = [0, 1, 4096, 300_000, (3 << 20) + 5, (33 << 20) + 7]
        blobs = {f"{prefix}/o{n}": payload(n, n) for n in sizes}
        for k, v in blobs.items():
            py.put(k, v)
        for k, v in blobs.items():
            a = nat.get_bytes(k)
            assert type(a) is bytes and a == v, k
            _, ta = nat._native.get_bytes_and_transfer(k, 0, 60.0)
            b, tb = py._run(py._get_bytes_op(k))
            assert b == v
            _same_transfer(ta, tb)
        assert not nat._native.off and nat._native._reader is not None
        # a size hint too small is corrected by the shim's answer
        assert nat.get_bytes(f"{prefix}/o{(3 << 20) + 5}", size_hint=10) == blobs[f"{prefix}/o{(3 << 20) + 5}"]


def test_errors_are_the_python_paths_typed_errors(stack, prefix):
    nat, py = _pair(stack)
    with nat, py:
        for c in (nat, py):
            with pytest.raises(sluice.NoSuchKey) as e:
                c.get_bytes(f"{prefix}/missing")
            assert e.value.request_id and e.value.code == sluice.ErrorCode.NO_SUCH_KEY
            with pytest.raises(sluice.UnknownNamespace):
                c.get_bytes("no-such-namespace/x")
            with pytest.raises(TypeError):
                c.get_bytes(b"data/x")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                c.get_bytes(f"{prefix}/x", timeout=0)
        # the connection is still good after each of them
        nat.put(f"{prefix}/after", b"fine")
        assert nat.get_bytes(f"{prefix}/after") == b"fine"


def test_get_many_matches_the_python_path_item_by_item(stack, prefix):
    """Sizes around the slot guess (some read again), missing keys and
    another namespace in one call; per-item failures, never a raise."""
    nat, py = _pair(stack)
    with nat, py:
        keys = []
        for i in range(40):
            n = [10, 4096, 200_000, 2 << 20][i % 4] + i
            k = f"{prefix}/m{i}"
            py.put(k, payload(n, ("m", i)))
            keys.append(k)
        keys += [f"{prefix}/missing", "no-such-namespace/y"]
        for _ in range(2):  # the second time with the guess learned
            a, b = nat.get_many(keys), py.get_many(keys)
            assert len(a) == len(b) == len(keys)
            for ra, rb in zip(a, b):
                assert (ra.path, ra.index, ra.ok, ra.nbytes) == (rb.path, rb.index, rb.ok, rb.nbytes)
                assert ra.data == rb.data
                assert type(ra.error) is type(rb.error)
                if ra.ok:
                    _same_transfer(ra.transfer, rb.transfer)
        assert nat.get_many([]) == []


def test_a_native_batch_that_fails_as_a_whole_fails_each_item(stack, prefix, monkeypatch):
    """The native connection lost mid-batch: every item reports it, as the
    Python path does (get_many raised); a closed client still raises."""
    nat = sluice.Client(stack.socket, timeout=60, native=True)
    with nat:
        nat.put(f"{prefix}/w", b"whole")
        assert nat.get_many([f"{prefix}/w"])[0].ok

        class Lost:
            closed = False

            def get_many(self, paths, timeout):
                raise _native_reads._native.NativeError("disconnected", 0, "the shim went away", "", 0)

        monkeypatch.setattr(nat._native, "_get", lambda timeout: Lost())
        got = nat.get_many([f"{prefix}/w", f"{prefix}/x"])
        assert [(r.path, r.ok, type(r.error)) for r in got] == [
            (f"{prefix}/w", False, sluice.Disconnected),
            (f"{prefix}/x", False, sluice.Disconnected),
        ]

        class Closed(Lost):
            def get_many(self, paths, timeout):
                raise _native_reads._native.NativeError("closed", 0, "the client is closed", "", 0)

        monkeypatch.setattr(nat._native, "_get", lambda timeout: Closed())
        with pytest.raises(sluice.ShimConnectionError):
            nat.get_many([f"{prefix}/w"])


def test_many_threads_each_get_their_own_bytes(stack, prefix):
    with sluice.Client(stack.socket, timeout=60, native=True) as c:
        blobs = {f"{prefix}/t{i}": payload(1000 + 997 * i, ("t", i)) for i in range(64)}
        for k, v in blobs.items():
            c.put(k, v)
        want = {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}
        keys = list(blobs)

        def loop(t: int) -> int:
            bad = 0
            for j in range(150):
                k = keys[(t * 7 + j) % len(keys)]
                if j % 10 == 0:
                    got = c.get_many([k, keys[(j + 1) % len(keys)]])
                    bad += sum(hashlib.sha256(r.data).hexdigest() != want[r.path] for r in got)
                elif hashlib.sha256(c.get_bytes(k)).hexdigest() != want[k]:
                    bad += 1
            return bad

        with ThreadPoolExecutor(16) as ex:
            assert sum(ex.map(loop, range(16))) == 0
        # its scratch stays within the budget the client was given
        assert c.stats().registered_bytes <= (256 << 20) * 2


def test_stats_count_the_native_connection_and_close_ends_it(stack, prefix):
    c = sluice.Client(stack.socket, timeout=60, native=True)
    c.put(f"{prefix}/s", b"abc")
    before = c.stats()
    assert c.get_bytes(f"{prefix}/s") == b"abc"
    after = c.stats()
    assert after.bytes_read - before.bytes_read == 3
    c.close()
    assert c._native.off and c._native._reader is None
    with pytest.raises(sluice.ShimConnectionError):
        c.get_bytes(f"{prefix}/s")
    with pytest.raises(sluice.ShimConnectionError):
        c.get_many([f"{prefix}/s"])


def test_gets_into_regions_go_native_and_answer_as_the_python_path(stack, prefix, monkeypatch):
    """``get(path, into=region)`` on the native reader, which joined the
    Python connection's session (one session, counted once): the same
    bytes, reports and typed errors as the Python path, for whole objects,
    ranges, offsets, region ids and ETag pins."""
    nat, py = _pair(stack)
    with nat, py:
        blobs = {f"{prefix}/g{n}": payload(n, ("g", n)) for n in (0, 1, 4096, 300_000, 3 << 20)}
        for k, v in blobs.items():
            py.put(k, v)
        nr, pr = nat.register(4 << 20), py.register(4 << 20)

        def not_here(*args, **kwargs):
            raise AssertionError("a GET into a host region went the Python way")

        # every GET below on `nat` must go native (errors included)
        monkeypatch.setattr(nat, "_get_op", not_here)
        before = nat.stats()
        for k, v in blobs.items():
            ta = nat.get(k, into=nr, offset=64)
            tb = py.get(k, into=pr, offset=64)
            _same_transfer(ta, tb)
            assert nr.read(64, len(v)) == v
        reader = nat._native._reader
        assert reader is not None and reader.joined, "the native reader should have joined the session"
        after = nat.stats()
        # one session: the native reads are counted once, in it
        assert after.requests - before.requests == len(blobs)
        assert after.bytes_read - before.bytes_read == sum(map(len, blobs.values()))
        big = blobs[f"{prefix}/g300000"]
        t = nat.get(f"{prefix}/g300000", into=nr.id, offset=7, range=(1000, 50))
        assert t.bytes == 50 and nr.read(7, 50) == big[1000:1050]
        t = nat.get(f"{prefix}/g300000", into=nr, range=(299_990, None), if_match=t.etag)
        assert t.bytes == 10 and nr.read(0, 10) == big[-10:]
        for c, r in ((nat, nr), (py, pr)):
            with pytest.raises(sluice.RegionTooSmall) as e:
                c.get(f"{prefix}/g{3 << 20}", into=r, offset=2 << 20)
            assert e.value.needed_bytes == 3 << 20
            with pytest.raises(sluice.NoSuchKey):
                c.get(f"{prefix}/missing", into=r)
            with pytest.raises(sluice.PreconditionFailed):
                c.get(f"{prefix}/g4096", into=r, if_match='"not-the-etag"')
            with pytest.raises(sluice.UnknownRegion):
                c.get(f"{prefix}/g1", into="0" * 32)
            with pytest.raises(ValueError):
                c.get(f"{prefix}/g1", into=r, offset=-1)
            with pytest.raises(TypeError):
                c.get(f"{prefix}/g1", into=r, if_match=5)  # type: ignore[arg-type]
        # another connection's region is not this session's, natively too
        with pytest.raises(sluice.UnknownRegion):
            nat.get(f"{prefix}/g1", into=pr.id)
        nr.release()
        with pytest.raises(sluice.UnknownRegion):
            nat.get(f"{prefix}/g1", into=nr.id)
        # still good after each of them
        with nat.register(4096) as r2:
            assert nat.get(f"{prefix}/g4096", into=r2).bytes == 4096 and r2.read(0, 4096) == blobs[f"{prefix}/g4096"]
        # a released Region object, and a request id: the Python path (its errors)
        monkeypatch.undo()
        with pytest.raises(sluice.UnknownRegion):
            nat.get(f"{prefix}/g1", into=nr)
        with nat.register(4096) as r3:
            assert nat.get(f"{prefix}/g1", into=r3, request_id="rid-1").request_id == "rid-1"


def test_get_many_into_regions_goes_native_and_matches_item_by_item(stack, prefix, monkeypatch):
    """``get_many`` of GetSpecs into host regions on the native reader: the
    same per-item reports and typed errors as the Python path (sizes,
    ranges, offsets, region ids, ETag pins, missing keys, too-small slots,
    unknown regions), more items than one GetBatch takes, and bad
    arguments refused before anything is sent."""
    nat, py = _pair(stack)
    with nat, py:
        sizes = [0, 1, 4096, 70_000, 1 << 20]
        for n in sizes:
            py.put(f"{prefix}/b{n}", payload(n, ("b", n)))
        etag = py.head(f"{prefix}/b4096").etag
        nr, pr = nat.register(8 << 20), py.register(8 << 20)

        def specs(r, rid):
            out = [sluice.GetSpec(f"{prefix}/b{n}", into=r, offset=i << 20) for i, n in enumerate(sizes)]
            out += [
                sluice.GetSpec(f"{prefix}/b70000", into=rid, offset=6 << 20, range=(100, 1000)),
                sluice.GetSpec(f"{prefix}/b4096", into=r, offset=7 << 20, if_match=etag),
                sluice.GetSpec(f"{prefix}/b4096", into=r, offset=7 << 20, if_match='"other"'),
                sluice.GetSpec(f"{prefix}/missing", into=r),
                sluice.GetSpec(f"{prefix}/b{1 << 20}", into=r, offset=(8 << 20) - 10),
                sluice.GetSpec(f"{prefix}/b1", into="0" * 32),
            ]
            return out

        def not_here(*args, **kwargs):
            raise AssertionError("get_many into host regions went the Python way")

        monkeypatch.setattr(nat, "_get_many_op", not_here)
        a = nat.get_many(specs(nr, nr.id))
        b = py.get_many(specs(pr, pr.id))
        assert len(a) == len(b) == 11
        for ra, rb in zip(a, b):
            assert (ra.path, ra.index, ra.ok, ra.nbytes) == (rb.path, rb.index, rb.ok, rb.nbytes)
            assert ra.data is None and rb.data is None  # into regions: no bytes returned
            assert type(ra.error) is type(rb.error), (ra.error, rb.error)
            if ra.ok:
                _same_transfer(ra.transfer, rb.transfer)
            else:
                assert ra.error.code == rb.error.code
                assert getattr(ra.error, "needed_bytes", None) == getattr(rb.error, "needed_bytes", None)
        assert [type(r.error).__name__ for r in a[7:]] == [
            "PreconditionFailed",
            "NoSuchKey",
            "RegionTooSmall",
            "UnknownRegion",
        ]
        assert nr.read(0, 8 << 20) == pr.read(0, 8 << 20)
        # more items than one GetBatch takes (1,024): every one answered
        many = [sluice.GetSpec(f"{prefix}/b4096", into=nr, offset=(i % 2000) * 4096) for i in range(1500)]
        got = nat.get_many(many)
        assert len(got) == 1500 and all(r.ok and r.nbytes == 4096 for r in got)
        assert [r.index for r in got] == list(range(1500))
        # bad arguments: refused before anything is sent, as in Python (the
        # good first item is not read: the region keeps its sentinel)
        for c, r in ((nat, nr), (py, pr)):
            r.write(b"\x5a" * 16, 0)
            with pytest.raises(ValueError):
                c.get_many([sluice.GetSpec(f"{prefix}/b1", into=r), sluice.GetSpec(f"{prefix}/b1", into=r, offset=-1)])
            with pytest.raises(TypeError):
                c.get_many([sluice.GetSpec(f"{prefix}/b1", into=r, if_match=3)])  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                c.get_many([sluice.GetSpec(f"{prefix}/b1", into=r, range="x")])  # type: ignore[arg-type]
            with pytest.raises(TypeError):  # every path is checked first, as in Python
                c.get_many([sluice.GetSpec(f"{prefix}/b1", into=r, offset=-1), sluice.GetSpec(5, into=r)])  # type: ignore[arg-type]
            assert r.read(0, 16) == b"\x5a" * 16
        monkeypatch.undo()
        # mixed lists (a path and a region item) go the Python way, and work
        mixed = nat.get_many([f"{prefix}/b1", sluice.GetSpec(f"{prefix}/b1", into=nr)])
        assert mixed[0].data == payload(1, ("b", 1)) and mixed[1].ok


def test_the_native_reader_ends_with_the_python_connection(stack, prefix):
    """The shim closes a joined connection when the one that opened the
    session closes, and releases what the joined one registered when it
    closes itself; the session's regions stay with the Python connection."""
    with sluice.Client(stack.socket, timeout=60, native=True) as c:
        _ends_with_the_python_connection(c, prefix)


def _ends_with_the_python_connection(c, prefix):
    c.put(f"{prefix}/e", b"x" * 5000)
    region = c.register(1 << 20)
    assert c.get(f"{prefix}/e", into=region).bytes == 5000
    own = c.stats().regions  # the region, and the Python path's scratch for the put
    assert c.get_bytes(f"{prefix}/e") == b"x" * 5000  # native scratch, in the same session
    assert c.stats().regions == own + 1
    reader = c._native._reader
    reader.close()  # the joined connection goes: its scratch is released, the region stays
    deadline = time.monotonic() + 10
    while c.stats().regions != own and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.stats().regions == own
    assert c.get(f"{prefix}/e", into=region).bytes == 5000  # a new reader joined
    assert c._native._reader is not reader and c._native._reader.joined
    # the Python connection ends: the shim ends the joined one with it
    joined = c._native._reader
    c._sock.shutdown(socketlib.SHUT_RDWR)
    deadline = time.monotonic() + 10
    while True:
        try:
            joined.get_into(f"{prefix}/e", region.id)
        except _native_reads._native.NativeError as e:
            if e.args[0] in ("disconnected", "closed"):
                break
            # until the shim closes it: the session is closing, its regions gone
            assert e.args[0] == "shim" and e.args[1] in (
                sluice.ErrorCode.UNKNOWN_REGION,
                sluice.ErrorCode.AGENT_UNAVAILABLE,
            ), e.args
        assert time.monotonic() < deadline, "the joined connection outlived its session"
        time.sleep(0.05)


def test_a_join_token_is_good_only_in_the_process_that_got_it(stack, prefix):
    """Another process (or a made-up token) cannot join a session: the
    shim refuses with BAD_REQUEST and the session's regions stay out of
    reach."""
    with sluice.Client(stack.socket, timeout=60, native=False) as c:
        token = c._join_token
        assert len(token) == 32
        region = c.register(4096)
        with pytest.raises(_native_reads._native.NativeError) as e:
            _native_reads._native.Reader(stack.socket, 10.0, 1 << 20, 1 << 20, "0" * 32)
        assert e.value.args[:2] == ("shim", sluice.ErrorCode.BAD_REQUEST)
        # another process of the same user, with the right token
        child = (
            "import sys\n"
            "from sluice import _native\n"
            "try:\n"
            "    _native.Reader(sys.argv[1], 10.0, 1 << 20, 1 << 20, sys.argv[2])\n"
            "    print('joined')\n"
            "except _native.NativeError as e:\n"
            "    print(e.args[0], int(e.args[1]))\n"
        )
        src = os.path.dirname(os.path.dirname(sluice.__file__))
        env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run(
            [sys.executable, "-c", child, stack.socket, token], capture_output=True, text=True, timeout=60, env=env
        )
        assert p.stdout.split() == ["shim", str(int(sluice.ErrorCode.BAD_REQUEST))], (p.stdout, p.stderr)
        # in this process it joins, and names the region
        reader = _native_reads._native.Reader(stack.socket, 10.0, 1 << 20, 1 << 20, token)
        try:
            assert reader.joined
            c.put(f"{prefix}/j", b"joined")
            t = reader.get_into(f"{prefix}/j", region.id)
            assert t[1] == 6 and region.read(0, 6) == b"joined"
        finally:
            reader.close()


def test_the_native_path_is_off_when_asked_and_for_calls_it_does_not_serve(stack, prefix, monkeypatch):
    with sluice.Client(stack.socket, native=False) as c:
        assert c._native is None
    with pytest.raises(ValueError):
        sluice.Client(stack.socket, native="yes")
    monkeypatch.setenv("SLUICE_NATIVE", "0")
    with sluice.Client(stack.socket) as c:
        assert c._native is None
    monkeypatch.delenv("SLUICE_NATIVE")
    with sluice.Client(stack.socket, timeout=60) as c:
        assert c._native is not None
        c.put(f"{prefix}/r", b"0123456789")
        # a range and copy=False go the Python way (and work)
        assert c.get_bytes(f"{prefix}/r", range=(2, 3)) == b"234"
        v = c.get_bytes(f"{prefix}/r", copy=False)
        assert bytes(v) == b"0123456789"
        v.release()
        assert c._native._reader is None  # nothing above needed it
        # items into the caller's regions go native (the reader joins)
        with c.register(1 << 20) as region:
            (res,) = c.get_many([sluice.GetSpec(f"{prefix}/r", into=region)])
            assert res.ok and region.read(0, 10) == b"0123456789"
        assert c._native._reader is not None and c._native._reader.joined


def test_a_forked_child_is_refused_and_the_parent_goes_on(stack, prefix):
    with sluice.Client(stack.socket, timeout=60, native=True) as c:
        c.put(f"{prefix}/f", b"parent")
        assert c.get_bytes(f"{prefix}/f") == b"parent"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                c.get_bytes(f"{prefix}/f")
            except sluice.ShimConnectionError:
                # the child's copy of the native socket was closed at fork
                code = 0 if c._native.off.startswith("inherited") and c._native._reader is None else 4
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.get_bytes(f"{prefix}/f") == b"parent"


class SilentShim(threading.Thread):
    """Says hello and registers memory, never answers a GET."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.listener = socketlib.socket(socketlib.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(8)
        self.gets = 0
        self.connections = 0
        self.start()

    def run(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            self.connections += 1
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socketlib.socket) -> None:
        dec = _wire.FrameDecoder()
        while True:
            data = conn.recv(1 << 16)
            if not data:
                return
            dec.feed(data, [])
            for body in dec.frames():
                req = _wire.decode_message("Request", body)
                op, id_ = req["op"], req["id"]
                if op == "hello":
                    resp = {"id": id_, "hello": {"version": 1, "tenant": "fake", "namespaces": ["data"]}}
                    self.send(conn, resp)
                elif op == "register":
                    fd = os.memfd_create("silent", os.MFD_ALLOW_SEALING)
                    os.ftruncate(fd, req["register"]["length"])
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
                    region = {"region_id": f"r{id_}", "length": req["register"]["length"], "fd_attached": True}
                    self.send(conn, {"id": id_, "registered": region}, fd)
                elif op in ("get", "get_batch"):
                    self.gets += 1

    @staticmethod
    def send(conn: socketlib.socket, resp, fd=None) -> None:
        body = _wire.encode_message("Response", resp)
        frame = len(body).to_bytes(4, "big") + body
        if fd is None:
            conn.sendall(frame)
        else:
            n = conn.sendmsg([frame], scm_rights(fd))
            conn.sendall(frame[n:])
            os.close(fd)


def test_ctrl_c_interrupts_a_call_waiting_on_a_silent_store(tmp_path):
    """The interpreter lock is released while a call waits, and Python's
    signal handlers still run: Ctrl-C ends the call. As on the Python path,
    the connection it was on (which may hold half a request) is ended,
    and the next call makes a new one."""
    path = str(tmp_path / "silent.sock")
    shim = SilentShim(path)
    with sluice.Client(path, timeout=30, native=True) as c:
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            c.get_bytes("data/never")
        assert time.monotonic() - t0 < 5
        assert shim.gets == 1 and shim.connections == 2  # the client's, the native reader's
        assert c._native._reader.closed
        # other threads ran meanwhile: the lock was not held
        ticks = []
        waiter = threading.Thread(target=lambda: pytest.raises(sluice.SluiceError, c.get_bytes, "data/x", timeout=1))
        waiter.start()
        while waiter.is_alive():
            ticks.append(1)
            time.sleep(0.01)
        waiter.join()
        assert len(ticks) > 20
        assert shim.gets == 2 and shim.connections == 3  # a new native connection
        assert not c._native.off


def test_close_ends_calls_waiting_on_the_native_connection(tmp_path):
    path = str(tmp_path / "silent.sock")
    SilentShim(path)
    c = sluice.Client(path, timeout=60, native=True)
    errors = []

    def wait() -> None:
        try:
            c.get_many(["data/a", "data/b"])
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    c.close()
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], sluice.ShimConnectionError), errors


def test_odd_timeouts_are_taken_as_python_takes_them(stack, prefix):
    with sluice.Client(stack.socket, timeout=None, native=True) as c:
        c.put(f"{prefix}/t", b"deadline")
        assert c.get_bytes(f"{prefix}/t") == b"deadline"  # the namespace's deadline
        assert c.get_bytes(f"{prefix}/t", timeout=float("inf")) == b"deadline"
        assert c.get_bytes(f"{prefix}/t", timeout=1e30) == b"deadline"
        assert [r.data for r in c.get_many([f"{prefix}/t"], timeout=1e-3 + 30)] == [b"deadline"]
