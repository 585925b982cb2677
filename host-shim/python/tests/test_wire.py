"""The hand-written protobuf codec and framing (no stack needed)."""

from __future__ import annotations

import pickle
import struct

import pytest

import sluice
from sluice import _wire
from sluice.errors import ErrorCode, error_class, from_detail


def test_known_encodings():
    # Request { id: 1, hello: Hello { version: 1 } }
    assert _wire.encode_message("Request", {"id": 1, "hello": {"version": 1}}) == bytes.fromhex("0801 5202 0801")
    # An empty message in a oneof is still sent (field 18, length 0).
    assert _wire.encode_message("Request", {"id": 300, "stats": {}}) == bytes.fromhex("08ac02 9201 00")
    # proto3 defaults are omitted.
    assert _wire.encode_message("Register", {"length": 0, "fd_attached": False}) == b""
    # optional fields are sent when set, even to 0.
    assert _wire.encode_message("ByteRange", {"start": 0, "length": 0}) == bytes.fromhex("1000")
    assert _wire.encode_message("ByteRange", {"start": 5, "length": None}) == bytes.fromhex("0805")
    frame = _wire.encode_frame("Request", {"id": 1, "hello": {"version": 1}})
    assert frame[:4] == struct.pack(">I", 6)


def test_roundtrip_every_request():
    ops = {
        "hello": {"version": 1, "client": "t"},
        "register": {"length": 1 << 40, "fd_attached": True},
        "release": {"region_id": "r1"},
        "get": {"path": "data/k", "range": {"start": 3, "length": 0}, "region_id": "r", "offset": 9},
        "put": {"path": "data/k", "region_id": "r", "offset": 1, "length": 2, "content_type": "x/y"},
        "head": {"path": "data/ü"},
        "list": {"path": "data", "continuation_token": "t", "max_keys": 7, "delimiter": "/"},
        "delete": {"path": "data/k"},
        "stats": {},
    }
    for op, fields in ops.items():
        enc = _wire.encode_message("Request", {"id": 2**64 - 1, "request_id": "rq", op: fields})
        dec = _wire.decode_message("Request", enc)
        assert dec["op"] == op and dec["id"] == 2**64 - 1 and dec["request_id"] == "rq"
        for k, v in fields.items():
            assert dec[op][k] == v, (op, k)


def test_response_decoding_skips_unknown_fields_and_merges():
    body = _wire.encode_message(
        "Response",
        {"id": 7, "get": {"report": {"bytes": 10, "data_path": 2, "parts": 1}, "object_size": 10, "etag": "e"}},
    )
    unknown = bytearray()
    _wire.encode_varint(99 << 3 | 0, unknown)
    _wire.encode_varint(12345, unknown)  # varint
    _wire.encode_varint(98 << 3 | 1, unknown)
    unknown += b"\x00" * 8  # fixed64
    _wire.encode_varint(97 << 3 | 5, unknown)
    unknown += b"\x00" * 4  # fixed32
    _wire.encode_varint(96 << 3 | 2, unknown)
    unknown += b"\x03abc"  # length-delimited
    _wire.encode_varint(95 << 3 | 3, unknown)  # a group with a field inside
    _wire.encode_varint(1 << 3 | 0, unknown)
    unknown += b"\x01"
    _wire.encode_varint(95 << 3 | 4, unknown)
    # A second occurrence of the `get` field merges into the first (proto rule).
    extra = _wire.encode_message("Response", {"get": {"etag": "e2", "report": {"fallback_reason": "why"}}})
    dec = _wire.decode_message("Response", bytes(unknown) + body + extra)
    assert dec["id"] == 7 and dec["result"] == "get"
    g = dec["get"]
    assert g["object_size"] == 10 and g["etag"] == "e2"
    assert g["report"]["bytes"] == 10 and g["report"]["data_path"] == 2 and g["report"]["fallback_reason"] == "why"


def test_oneof_last_member_wins_and_signed_fields():
    a = _wire.encode_message("Response", {"id": 1, "deleted": {}})
    b = _wire.encode_message("Response", {"error": {"code": 5, "message": "gone"}})
    dec = _wire.decode_message("Response", a + b)
    assert dec["result"] == "error" and dec["deleted"] is None and dec["error"]["code"] == 5
    info = _wire.encode_message("ObjectInfo", {"key": "k", "last_modified_unix_ms": -5})
    assert _wire.decode_message("ObjectInfo", info)["last_modified_unix_ms"] == -5
    page = _wire.encode_message(
        "ListPage", {"objects": [{"key": "a", "size": 1}, {"key": "b", "size": 2}], "common_prefixes": ["p/", "q/"]}
    )
    dec = _wire.decode_message("ListPage", page)
    assert [o["key"] for o in dec["objects"]] == ["a", "b"] and dec["common_prefixes"] == ["p/", "q/"]


def test_packed_repeated_enums_decode_as_protobuf_packs_them():
    # Capabilities.agent_memory = [MEMFD, GPU_DMABUF]: proto3 packs repeated
    # numbers into one length-delimited run (field 1, wire type 2).
    packed = bytes.fromhex("0a02 0103") + bytes.fromhex("1001")  # then shim_memory = [MEMFD], unpacked
    dec = _wire.decode_message("Capabilities", packed)
    assert dec["agent_memory"] == [1, 3] and dec["shim_memory"] == [1]
    # A run that claims more bytes than the message has, or whose last value
    # runs past it, is refused.
    for bad in [bytes.fromhex("0a05 01"), bytes.fromhex("0a01 ff01")]:
        with pytest.raises(_wire.WireError):
            _wire.decode_message("Capabilities", bad)
    caps = sluice.Capabilities._from_wire(dec)
    assert caps.agent_memory == ["memfd", "gpu-dmabuf"] and caps.region_memory == ["memfd"]


@pytest.mark.parametrize(
    "bad",
    [b"\x08", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x12\x05ab", b"\x00\x01", b"\x0f"],
)
def test_malformed_input_is_rejected(bad):
    with pytest.raises(_wire.WireError):
        _wire.decode_message("Response", bad)


def test_encoder_rejects_bad_values():
    with pytest.raises(_wire.WireError):
        _wire.encode_message("List", {"max_keys": 1 << 32})
    with pytest.raises(_wire.WireError):
        _wire.encode_message("Register", {"length": -1})
    with pytest.raises(_wire.WireError):
        _wire.encode_message("Request", {"head": {"path": "a/b"}, "delete": {"path": "a/b"}})
    with pytest.raises(_wire.WireError):
        _wire.encode_frame("Head", {"path": "x" * (_wire.MAX_FRAME_LEN + 1)})


def test_frame_decoder_reassembles_and_pairs_descriptors():
    f1 = _wire.encode_frame("Response", {"id": 1, "deleted": {}})
    f2 = _wire.encode_frame("Response", {"id": 2, "registered": {"region_id": "r", "length": 4, "fd_attached": True}})
    stream = f1 + f2
    d = _wire.FrameDecoder()
    got = []
    for i in range(len(stream)):
        d.feed(stream[i : i + 1], [100] if i == len(f1) else [])
        got.extend(d.frames())
    assert [_wire.decode_message("Response", g)["id"] for g in got] == [1, 2]
    assert d.take_fd() == 100 and d.take_fd() is None
    d.feed(struct.pack(">I", _wire.MAX_FRAME_LEN + 1), [])
    with pytest.raises(_wire.WireError):
        list(d.frames())


def test_error_classes_mirror_every_code():
    for code in ErrorCode:
        if code == ErrorCode.ERROR_CODE_UNSPECIFIED:
            assert error_class(code) is sluice.SluiceError
            continue
        cls = error_class(code)
        assert cls is not sluice.SluiceError and cls.CODE == code
        e = from_detail(int(code), "msg", "rid")
        assert isinstance(e, cls) and e.code is code and e.request_id == "rid"
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and again.code is code and str(again) == str(e)
    unknown = from_detail(999, "future")
    assert type(unknown) is sluice.SluiceError and unknown.code == 999
    assert issubclass(sluice.NoSuchKey, LookupError) and issubclass(sluice.BadRequest, ValueError)
    assert issubclass(sluice.RegionReleased, sluice.UnknownRegion)


def test_scratch_pool_keeps_within_budget():
    import mmap

    from sluice._core import _ScratchPool
    from sluice.region import Region

    def region(n):
        return Region(None, f"r{n}", n, mmap.mmap(-1, n))

    pool = _ScratchPool(budget=10_000)
    a, b, e = region(4000), region(5000), region(1000)
    assert pool.give(a) and pool.give(b) and pool.give(e)  # exactly the budget
    assert not pool.give(region(20_000))  # larger than the whole budget
    assert pool.take(4500) is b and pool.take(4500) is None and pool.take(1) is e
    assert pool.give(b) and pool.give(e)
    # Full. A region that only fits by evicting bigger ones is refused, and
    # nothing is evicted for it.
    assert not pool.give(region(3000)) and pool.pop_evicted() == []
    # A bigger one evicts the smallest regions, just enough of them.
    assert pool.give(region(4500))
    assert [r.nbytes for r in pool.pop_evicted()] == [1000, 4000]
    assert sorted(r.nbytes for r in pool.clear()) == [4500, 5000]
    assert len(pool) == 0


def test_import_is_light():
    """numpy and torch are optional and imported only when used."""
    import subprocess
    import sys

    code = "import sys, sluice, sluice.errors; assert 'numpy' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_transfer_reports_whether_the_bytes_were_verified():
    from sluice.types import Transfer

    body = _wire.encode_message(
        "Response",
        {"get": {"etag": "e", "object_size": 5, "report": {"bytes": 5, "unverified_reason": "a ranged read"}}},
    )
    g = _wire.decode_message("Response", body)["get"]
    t = Transfer._from_wire(g["report"], g["etag"], g["object_size"])
    assert (t.verified, t.unverified_reason) == (False, "a ranged read")
    body = _wire.encode_message("Response", {"get": {"report": {"bytes": 5, "verified": True}}})
    g = _wire.decode_message("Response", body)["get"]
    assert Transfer._from_wire(g["report"], "", 5).verified
    # An agent older than the field says nothing: not verified.
    assert not Transfer._from_wire({**g["report"], "verified": False}, "", 5).verified
    assert not Transfer._from_wire(None, "", 0).verified
