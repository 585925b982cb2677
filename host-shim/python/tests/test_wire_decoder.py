"""The reply decoder (``_wire.decode_message``) against a plain one.

``decode_message`` takes short ways on the common shapes (one-byte keys
and lengths read inline, a message field seen once decoded from its slice,
the oneof clean-up only when a oneof changed member). The decoder here
reads every field the plain way, straight from ``SCHEMA``; on random
messages, merged repeats, unknown fields and mutated bytes the two must
agree: the same dict, or both a ``WireError``.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Tuple

import pytest

from sluice import _wire

_NUMBERS = {"u64", "u32", "i64", "bool", "enum"}


def plain_decode(msg: str, data: bytes) -> Dict[str, Any]:
    spec = _wire.SCHEMA[msg]
    out: Dict[str, Any] = {}
    for name, kind, label in spec.values():
        out[name] = [] if label == "repeated" else _wire._default(kind, label)
        if label.startswith("oneof:"):
            out[label[6:]] = None
    merged: Dict[str, Tuple[str, bytearray]] = {}
    switched = False
    pos = 0
    while pos < len(data):
        key, pos = _wire.decode_varint(data, pos)
        num, wtype = key >> 3, key & 7
        if num == 0:
            raise _wire.WireError("field number 0")
        if num not in spec:
            pos = _wire._skip(data, pos, wtype, num)
            continue
        name, kind, label = spec[num]
        group = label[6:] if label.startswith("oneof:") else ""
        if kind in _NUMBERS:
            if wtype == 2 and label == "repeated":
                n, pos = _wire.decode_varint(data, pos)
                if pos + n > len(data):
                    raise _wire.WireError("truncated")
                run_end = pos + n
                while pos < run_end:
                    v, pos = _wire.decode_varint(data, pos)
                    if pos > run_end:
                        raise _wire.WireError("packed value past its field")
                    out[name].append(_wire._scalar(kind, v))
                continue
            if wtype != 0:
                raise _wire.WireError("expected varint")
            v, pos = _wire.decode_varint(data, pos)
            value: Any = _wire._scalar(kind, v)
        else:
            if wtype != 2:
                raise _wire.WireError("expected length-delimited")
            n, pos = _wire.decode_varint(data, pos)
            if pos + n > len(data):
                raise _wire.WireError("truncated")
            chunk = data[pos : pos + n]
            pos += n
            if kind == "string":
                try:
                    value = chunk.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise _wire.WireError("invalid UTF-8") from e
            elif label == "repeated":
                value = plain_decode(kind, chunk)
            else:
                if group:
                    if out[group] not in (None, name):
                        merged.pop(out[group], None)
                        merged.pop(name, None)
                        switched = True
                    out[group] = name
                merged.setdefault(name, (kind, bytearray()))[1].extend(chunk)
                continue
        if label == "repeated":
            out[name].append(value)
        else:
            if group:
                switched |= out[group] not in (None, name)
                out[group] = name
            out[name] = value
    for name, (kind, raw) in merged.items():
        out[name] = plain_decode(kind, bytes(raw))
    if switched:
        for name, kind, label in spec.values():
            if label.startswith("oneof:") and out[label[6:]] != name:
                out[name] = None
    return out


def random_value(rng: random.Random, kind: str, depth: int) -> Any:
    if kind == "u64":
        return rng.choice([0, 1, 127, 128, 300, rng.getrandbits(64)])
    if kind == "u32":
        return rng.choice([0, 1, 200, rng.getrandbits(32)])
    if kind == "i64":
        return rng.choice([0, -1, -5, rng.getrandbits(63), -rng.getrandbits(63)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "enum":
        return rng.randrange(0, 6)
    if kind == "string":
        return rng.choice(["", "a", "data/key-1", "é→✓", "x" * rng.randrange(0, 300)])
    return random_message(rng, kind, depth + 1)


def random_message(rng: random.Random, msg: str, depth: int = 0) -> Dict[str, Any]:
    values: Dict[str, Any] = {}
    groups: Dict[str, list] = {}
    for name, kind, label in _wire.SCHEMA[msg].values():
        if label.startswith("oneof:"):
            groups.setdefault(label[6:], []).append((name, kind))
            continue
        if depth > 2 and kind not in _NUMBERS and kind != "string":
            continue
        if rng.random() < 0.6:
            if label == "repeated":
                values[name] = [random_value(rng, kind, depth) for _ in range(rng.randrange(0, 4))]
            else:
                values[name] = random_value(rng, kind, depth)
    for members in groups.values():
        if depth <= 2 and rng.random() < 0.8:
            name, kind = rng.choice(members)
            values[name] = random_value(rng, kind, depth)
    return values


def unknown_field(rng: random.Random) -> bytes:
    out = bytearray()
    wtype = rng.choice([0, 1, 2, 5])
    _wire.encode_varint((rng.randrange(60, 2000) << 3) | wtype, out)
    if wtype == 0:
        _wire.encode_varint(rng.getrandbits(40), out)
    elif wtype == 1:
        out += bytes(8)
    elif wtype == 5:
        out += bytes(4)
    else:
        out += b"\x03abc"
    return bytes(out)


def outcome(decode, msg: str, data: bytes) -> Any:
    try:
        return decode(msg, data)
    except _wire.WireError:
        return "WireError"


@pytest.mark.parametrize("msg", ["Response", "GetResult", "ListPage", "Capabilities", "StatsResult", "Request"])
def test_decoder_agrees_with_the_plain_one(msg):
    rng = random.Random(f"wire-{msg}")
    for _ in range(400):
        parts = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            parts.append(_wire.encode_message(msg, random_message(rng, msg)))
            if rng.random() < 0.3:
                parts.append(unknown_field(rng))
        data = bytearray(b"".join(parts))
        mutate = rng.random()
        if data and mutate < 0.2:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif data and mutate < 0.3:
            del data[rng.randrange(len(data)) :]
        data = bytes(data)
        got, want = outcome(_wire.decode_message, msg, data), outcome(plain_decode, msg, data)
        assert got == want, f"{msg} {data.hex()}"
        if mutate >= 0.3:
            assert got != "WireError", f"{msg} {data.hex()}"


def test_a_reply_item_decodes_from_any_buffer_type():
    item = _wire.encode_message(
        "Response",
        {"id": 3, "item": 2, "get": {"report": {"bytes": 4096, "data_path": 1, "parts": 1}, "object_size": 4096}},
    )
    want = _wire.decode_message("Response", item)
    assert want["get"]["report"]["bytes"] == 4096 and want["item"] == 2
    assert _wire.decode_message("Response", bytearray(item)) == want
    assert _wire.decode_message("Response", memoryview(item)) == want


def test_frames_read_in_one_pass_or_across_an_abandoned_one():
    frames = [_wire.encode_frame("Response", {"id": i, "item": i, "deleted": {}}) for i in range(1, 6)]
    d = _wire.FrameDecoder()
    # Three whole frames and half of the fourth in one read, with a
    # descriptor for the second.
    stream = b"".join(frames)
    cut = sum(map(len, frames[:3])) + 3
    d.feed(stream[:cut], [7])
    it = d.frames()
    first = next(it)
    assert _wire.decode_message("Response", first)["id"] == 1
    # Frames still buffered behind this one: a queued descriptor may be theirs.
    assert d.stray_fds() == [] and d.buffered == cut - len(frames[0])
    it.close()  # the reader gave up on the pass (an exception in its loop)
    assert d.buffered == cut - len(frames[0])
    got = [_wire.decode_message("Response", p)["id"] for p in d.frames()]
    assert got == [2, 3] and d.buffered == 3
    assert d.stray_fds() == [], "a partial frame is buffered: the descriptor may still be claimed"
    d.feed(stream[cut:], [])
    assert [_wire.decode_message("Response", p)["id"] for p in d.frames()] == [4, 5]
    assert d.buffered == 0 and d.stray_fds() == [7]
