"""Bad input: every refusal is a typed exception, and refusals change nothing."""

from __future__ import annotations

import socket as socketlib
import struct

import pytest

import sluice
from sluice import _wire
from sluice.errors import ErrorCode


@pytest.fixture
def region(client):
    r = client.register(4096)
    r.numpy()[:] = 0xAB
    yield r
    client.release(r)


def untouched(region) -> bool:
    return bool((region.numpy() == 0xAB).all())


def test_unknown_namespace(client, region):
    for call in (
        lambda: client.head("nope/key"),
        lambda: client.get_bytes("nope/key"),
        lambda: client.get("nope/key", into=region),
        lambda: client.put("nope/key", b"x"),
        lambda: client.delete("nope/key"),
        lambda: list(client.list("nope")),
    ):
        with pytest.raises(sluice.UnknownNamespace) as e:
            call()
        assert e.value.code is ErrorCode.UNKNOWN_NAMESPACE and e.value.request_id
    assert untouched(region)


def test_missing_key(client, region, prefix):
    for call in (
        lambda: client.head(f"{prefix}/missing"),
        lambda: client.get_bytes(f"{prefix}/missing"),
        lambda: client.get(f"{prefix}/missing", into=region),
    ):
        with pytest.raises(sluice.NoSuchKey) as e:
            call()
        assert e.value.code is ErrorCode.NO_SUCH_KEY and "missing" in e.value.message
        assert isinstance(e.value, LookupError)
    assert untouched(region)


def test_region_too_small_writes_nothing(client, region, prefix):
    client.put(f"{prefix}/5k", b"z" * 5000)
    with pytest.raises(sluice.RegionTooSmall) as e:
        client.get(f"{prefix}/5k", into=region)
    assert e.value.code is ErrorCode.REGION_TOO_SMALL
    with pytest.raises(sluice.RegionTooSmall):
        client.get(f"{prefix}/5k", into=region, range=(0, 100), offset=4000)
    assert untouched(region)
    # The same request fits with a range.
    assert client.get(f"{prefix}/5k", into=region, range=(0, 4096)).bytes == 4096


def test_offset_out_of_bounds(client, region, prefix):
    client.put(f"{prefix}/small", b"abc")
    with pytest.raises(sluice.RegionTooSmall):
        client.get(f"{prefix}/small", into=region, offset=4096 + 10)  # GET: the span must fit
    with pytest.raises(sluice.OutOfBounds) as e:
        client.put(f"{prefix}/oob", region, 4000, 200)  # PUT: window outside the region
    assert e.value.code is ErrorCode.OUT_OF_BOUNDS
    with pytest.raises(sluice.OutOfBounds):
        client.put(f"{prefix}/oob", region, 5000, 1)
    with pytest.raises(sluice.NoSuchKey):
        client.head(f"{prefix}/oob")  # a refused PUT creates no object
    assert untouched(region)
    # Local bounds checks on the region's own accessors.
    with pytest.raises(sluice.BadRequest):
        region.read(4000, 200)
    with pytest.raises(sluice.BadRequest):
        region.write(b"x" * 10, 4090)


def test_released_region(client, prefix):
    client.put(f"{prefix}/k", b"abc")
    r = client.register(4096)
    client.release(r)
    with pytest.raises(sluice.UnknownRegion) as e:
        client.get(f"{prefix}/k", into=r)
    assert e.value.code is ErrorCode.UNKNOWN_REGION and not isinstance(e.value, sluice.RegionReleased)
    with pytest.raises(sluice.UnknownRegion):
        client.put(f"{prefix}/k2", r.id, 0, 1)
    with pytest.raises(sluice.RegionReleased):
        r.view
    with pytest.raises(sluice.RegionReleased):
        r.read()
    with pytest.raises(sluice.UnknownRegion):
        client.get(f"{prefix}/k", into="no-such-region-id")


def test_region_of_another_connection(stack, client, prefix):
    client.put(f"{prefix}/k", b"abc")
    with sluice.Client(stack.socket) as other:
        foreign = other.register(4096)
        with pytest.raises(sluice.UnknownRegion):
            client.get(f"{prefix}/k", into=foreign)  # ids are per connection
        with pytest.raises(sluice.UnknownRegion):
            client.release(foreign.id)
        with pytest.raises(sluice.UnknownRegion):
            client.release(foreign)
        assert not foreign.released  # still the other connection's, still usable
        assert other.get(f"{prefix}/k", into=foreign).bytes == 3


@pytest.mark.parametrize("path", ["data", "data/", "/key", ""])
def test_malformed_object_path(client, region, path):
    for call in (
        lambda: client.head(path),
        lambda: client.get(path, into=region),
        lambda: client.put(path, b"x"),
        lambda: client.delete(path),
    ):
        with pytest.raises(sluice.BadRequest) as e:
            call()
        assert e.value.code is ErrorCode.BAD_REQUEST and isinstance(e.value, ValueError)


def test_malformed_list_path(client):
    with pytest.raises(sluice.BadRequest):
        list(client.list("/x"))


def test_invalid_range(client, prefix, region):
    client.put(f"{prefix}/ten", b"0123456789")
    with pytest.raises(sluice.InvalidRange) as e:
        client.get_bytes(f"{prefix}/ten", range=(100, None))
    assert e.value.code is ErrorCode.INVALID_RANGE
    with pytest.raises(sluice.InvalidRange):
        client.get(f"{prefix}/ten", into=region, range=(3, 0))
    assert untouched(region)


def test_bad_arguments_fail_before_sending(client, region):
    with pytest.raises(sluice.BadRequest):
        client.register(0)  # refused by the shim
    with pytest.raises(sluice.BadRequest):
        client.register(-1)  # refused here: not a uint64
    with pytest.raises(sluice.BadRequest):
        client.get("data/x", into=region, offset=-1)
    with pytest.raises(TypeError):
        client.get("data/x", into=None)
    with pytest.raises(TypeError):
        client.head(42)
    with pytest.raises(TypeError):
        client.put("data/x", 42)
    with pytest.raises(TypeError):
        client.get("data/x", into=region, range="0-1")
    with pytest.raises(sluice.BadRequest):
        client.head("data/" + "k" * (sluice.MAX_FRAME_LEN + 1))  # would exceed the frame limit
    # The connection is still fine after all of that, and only the
    # fixture's region was ever registered.
    assert client.stats().regions == 1


def test_unsupported_version(stack):
    with pytest.raises(sluice.UnsupportedVersion) as e:
        sluice.Client(stack.socket, _protocol_version=2)
    assert e.value.code is ErrorCode.UNSUPPORTED_VERSION


def test_no_shim_listening(tmp_path):
    with pytest.raises(sluice.ShimConnectionError) as e:
        sluice.Client(tmp_path / "nothing.sock")
    assert e.value.code is None and "nothing.sock" in str(e.value)


def _raw(sock, fields):
    sock.sendall(_wire.encode_frame("Request", fields))
    (n,) = struct.unpack(">I", sock.recv(4, socketlib.MSG_WAITALL))
    return _wire.decode_message("Response", sock.recv(n, socketlib.MSG_WAITALL))


def test_raw_protocol_errors(stack):
    with socketlib.socket(socketlib.AF_UNIX) as s:
        s.connect(stack.socket)
        resp = _raw(s, {"id": 1, "head": {"path": "data/x"}})  # before Hello
        assert resp["id"] == 1 and resp["error"]["code"] == ErrorCode.PROTOCOL
        assert _raw(s, {"id": 2, "hello": {"version": 1}})["result"] == "hello"
        resp = _raw(s, {"id": 3, "hello": {"version": 1}})  # twice
        assert resp["error"]["code"] == ErrorCode.PROTOCOL
        resp = _raw(s, {"id": 4})  # no operation
        assert resp["id"] == 4 and resp["error"]["code"] == ErrorCode.BAD_REQUEST
        # Register claiming a descriptor that is not there.
        resp = _raw(s, {"id": 5, "register": {"length": 10, "fd_attached": True}})
        assert resp["error"]["code"] == ErrorCode.PROTOCOL


def test_shim_closing_oversized_frame_fails_pending_calls(stack):
    c = sluice.Client(stack.socket, timeout=30)
    try:
        with c._wlock:  # a frame header claiming more than the limit
            c._sock.sendall(struct.pack(">I", sluice.MAX_FRAME_LEN + 1))
        with pytest.raises(sluice.Disconnected) as e:
            c.head("data/x")
        assert "PROTOCOL" in str(e.value) and "exceeds" in str(e.value)  # the shim's reason
    finally:
        c.close()
