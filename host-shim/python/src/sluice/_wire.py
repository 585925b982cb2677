"""Hand-written protobuf codec and framing for the shim's socket protocol.

Only the messages of ``proto/proto/sluice/shim.proto`` and ``common.proto``
are described here; field numbers and types are copied from those files.
The codec follows proto3 wire rules:

* scalars equal to their default are omitted on encode (``optional`` fields
  and message fields are sent whenever they are set, even when empty);
* unknown fields of any wire type are skipped on decode;
* a message field that appears several times is merged (its bytes are
  concatenated before decoding, which is exactly protobuf's merge rule);
* for a ``oneof`` the last member seen wins.

Frames are a 4-byte big-endian length followed by that many bytes.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple, Union

#: Largest frame either side may send (``sluice_proto::MAX_FRAME_LEN``).
MAX_FRAME_LEN = 1 << 20
#: The protocol version ``Hello`` must name (``sluice.shim.v1.Version.VERSION_1``).
PROTOCOL_VERSION = 1
#: ``sluice.shim.v1.RegionKind`` values.
REGION_KIND_SHARED_MEMORY = 0
REGION_KIND_GPU_DMABUF = 1

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_U64_MASK = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not a valid encoding of the expected message."""


# --------------------------------------------------------------------------
# Schema: message name -> {field number: (field name, kind, label)}
#   kind:  "u64" "u32" "i64" "bool" "enum" "string" or a message name
#   label: ""         plain proto3 field (omitted when default)
#          "optional" explicit presence (None when absent)
#          "repeated"
#          "oneof:<name>" member of the oneof <name>
# --------------------------------------------------------------------------
SCHEMA: Dict[str, Dict[int, Tuple[str, str, str]]] = {
    # sluice.common.v1
    "ErrorDetail": {1: ("code", "enum", ""), 2: ("message", "string", ""), 3: ("needed_bytes", "u64", "")},
    "ByteRange": {1: ("start", "u64", ""), 2: ("length", "u64", "optional")},
    "ObjectInfo": {
        1: ("key", "string", ""),
        2: ("size", "u64", ""),
        3: ("etag", "string", ""),
        4: ("last_modified_unix_ms", "i64", ""),
        5: ("content_type", "string", ""),
    },
    "TransferReport": {
        1: ("request_id", "string", ""),
        2: ("bytes", "u64", ""),
        3: ("data_path", "enum", ""),
        4: ("fallback_reason", "string", ""),
        5: ("elapsed_us", "u64", ""),
        6: ("parts", "u32", ""),
        7: ("verified", "bool", ""),
        8: ("unverified_reason", "string", ""),
    },
    # sluice.shim.v1
    "Request": {
        1: ("id", "u64", ""),
        2: ("request_id", "string", ""),
        3: ("timeout_ms", "u32", ""),
        10: ("hello", "Hello", "oneof:op"),
        11: ("register", "Register", "oneof:op"),
        12: ("release", "Release", "oneof:op"),
        13: ("get", "Get", "oneof:op"),
        14: ("put", "Put", "oneof:op"),
        15: ("head", "Head", "oneof:op"),
        16: ("list", "List", "oneof:op"),
        17: ("delete", "Delete", "oneof:op"),
        18: ("stats", "Stats", "oneof:op"),
        19: ("get_batch", "GetBatch", "oneof:op"),
    },
    "Response": {
        1: ("id", "u64", ""),
        2: ("request_id", "string", ""),
        3: ("item", "u32", ""),
        10: ("error", "ErrorDetail", "oneof:result"),
        11: ("hello", "HelloOk", "oneof:result"),
        12: ("registered", "Registered", "oneof:result"),
        13: ("released", "Released", "oneof:result"),
        14: ("get", "GetResult", "oneof:result"),
        15: ("put", "PutResult", "oneof:result"),
        16: ("head", "ObjectInfo", "oneof:result"),
        17: ("list", "ListPage", "oneof:result"),
        18: ("deleted", "Deleted", "oneof:result"),
        19: ("stats", "StatsResult", "oneof:result"),
    },
    "Hello": {1: ("version", "u32", ""), 2: ("client", "string", ""), 3: ("join", "string", "")},
    "Capabilities": {
        1: ("agent_memory", "enum", "repeated"),
        2: ("shim_memory", "enum", "repeated"),
        3: ("max_batch_items", "u32", ""),
        4: ("max_region_bytes", "u64", ""),
        5: ("max_registered_bytes", "u64", ""),
        6: ("namespaces", "NamespaceCapabilities", "repeated"),
        7: ("gpu_staging", "string", ""),
    },
    "NamespaceCapabilities": {
        1: ("name", "string", ""),
        2: ("access", "enum", "repeated"),
        3: ("data_path", "enum", ""),
        4: ("transport", "enum", ""),
        5: ("degraded_reason", "string", ""),
        6: ("placement", "enum", ""),
        7: ("encryption", "enum", ""),
        8: ("max_object_bytes", "u64", ""),
        9: ("max_window_bytes", "u64", ""),
        10: ("get_part_bytes", "u64", ""),
        11: ("put_part_bytes", "u64", ""),
        12: ("rdma_min_bytes", "u64", ""),
        13: ("request_timeout_ms", "u32", ""),
        14: ("store_checksums", "enum", ""),
    },
    "HelloOk": {
        1: ("version", "u32", ""),
        2: ("tenant", "string", ""),
        3: ("namespaces", "string", "repeated"),
        4: ("capabilities", "Capabilities", ""),
        5: ("join_token", "string", ""),
    },
    "Register": {
        1: ("length", "u64", ""),
        2: ("fd_attached", "bool", ""),
        3: ("kind", "enum", ""),
        4: ("dmabuf_offset", "u64", ""),
        5: ("gpu_address", "u64", ""),
    },
    "Registered": {
        1: ("region_id", "string", ""),
        2: ("length", "u64", ""),
        3: ("fd_attached", "bool", ""),
    },
    "Release": {1: ("region_id", "string", "")},
    "Released": {},
    "Get": {
        1: ("path", "string", ""),
        2: ("range", "ByteRange", "optional"),
        3: ("region_id", "string", ""),
        4: ("offset", "u64", ""),
        5: ("max_bytes", "u64", ""),
        6: ("if_match", "string", ""),
    },
    "GetBatch": {1: ("items", "Get", "repeated")},
    "GetResult": {
        1: ("report", "TransferReport", ""),
        2: ("object_size", "u64", ""),
        3: ("etag", "string", ""),
    },
    "Put": {
        1: ("path", "string", ""),
        2: ("region_id", "string", ""),
        3: ("offset", "u64", ""),
        4: ("length", "u64", ""),
        5: ("content_type", "string", ""),
    },
    "PutResult": {1: ("report", "TransferReport", ""), 2: ("etag", "string", "")},
    "Head": {1: ("path", "string", "")},
    "List": {
        1: ("path", "string", ""),
        2: ("continuation_token", "string", ""),
        3: ("max_keys", "u32", ""),
        4: ("delimiter", "string", ""),
    },
    "ListPage": {
        1: ("objects", "ObjectInfo", "repeated"),
        2: ("common_prefixes", "string", "repeated"),
        3: ("next_continuation_token", "string", ""),
    },
    "Delete": {1: ("path", "string", "")},
    "Deleted": {},
    "Stats": {},
    "StatsResult": {
        1: ("requests", "u64", ""),
        2: ("bytes_read", "u64", ""),
        3: ("bytes_written", "u64", ""),
        4: ("errors", "u64", ""),
        5: ("fallbacks", "u64", ""),
        6: ("regions", "u32", ""),
        7: ("registered_bytes", "u64", ""),
    },
}

_SCALARS = {"u64", "u32", "i64", "bool", "enum", "string"}
_BY_NAME: Dict[str, Dict[str, Tuple[int, str, str]]] = {
    msg: {name: (num, kind, label) for num, (name, kind, label) in fields.items()}
    for msg, fields in SCHEMA.items()
}


def _default(kind: str, label: str) -> Any:
    if label == "repeated":
        return []
    if label == "optional" or label.startswith("oneof:") or kind not in _SCALARS:
        return None
    return "" if kind == "string" else (False if kind == "bool" else 0)


# ------------------------------- encoding ---------------------------------


def encode_varint(value: int, out: bytearray) -> None:
    """Appends ``value`` (taken modulo 2**64) as a base-128 varint."""
    if 0 <= value < 0x80:
        out.append(value)
        return
    value &= _U64_MASK
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


class _EncField:
    """How one field is written, worked out once per message (encoding is on
    every request's path: no per-field string tests there)."""

    __slots__ = ("num", "kind", "plain", "rep", "group", "is_msg", "default", "len_key", "var_key")

    def __init__(self, num: int, kind: str, label: str) -> None:
        self.num, self.kind = num, kind
        self.plain = label == ""  # proto3: a plain field at its default is not sent
        self.rep = label == "repeated"
        self.group = label[6:] if label.startswith("oneof:") else ""
        self.is_msg = kind not in _SCALARS
        self.default = _default(kind, "") if not self.is_msg else None
        key = bytearray()
        encode_varint(num << 3 | _LEN, key)
        self.len_key = bytes(key)
        key = bytearray()
        encode_varint(num << 3 | _VARINT, key)
        self.var_key = bytes(key)


_ENCODE: Dict[str, Dict[str, _EncField]] = {}


def _encoding(msg: str) -> Dict[str, _EncField]:
    spec = _ENCODE.get(msg)
    if spec is None:
        spec = {name: _EncField(num, kind, label) for name, (num, kind, label) in _BY_NAME[msg].items()}
        _ENCODE[msg] = spec
    return spec


def _encode_into(msg: str, values: Dict[str, Any], out: bytearray) -> None:
    spec = _encoding(msg)
    oneofs_seen: Optional[Dict[str, str]] = None
    for name, value in values.items():
        f = spec.get(name)
        if f is None:
            raise WireError(f"{msg} has no field {name!r}")
        if value is None:
            continue
        if f.group:
            if oneofs_seen is None:
                oneofs_seen = {}
            if f.group in oneofs_seen:
                raise WireError(f"{msg}: both {oneofs_seen[f.group]} and {name} set in oneof {f.group}")
            oneofs_seen[f.group] = name
        kind = f.kind
        for item in value if f.rep else (value,):
            if f.is_msg:
                body = bytearray()
                _encode_into(kind, item, body)
                out += f.len_key
                encode_varint(len(body), out)
                out += body
                continue
            if f.plain and item == f.default:
                continue  # proto3: defaults are not sent
            if kind == "string":
                data = item.encode("utf-8")
                out += f.len_key
                encode_varint(len(data), out)
                out += data
                continue
            v = int(item)
            if kind == "u32" and not 0 <= v <= 0xFFFFFFFF:
                raise WireError(f"field {f.num}: {v} does not fit uint32")
            if kind == "u64" and not 0 <= v <= _U64_MASK:
                raise WireError(f"field {f.num}: {v} does not fit uint64")
            out += f.var_key
            encode_varint(v, out)


def encode_message(msg: str, values: Dict[str, Any]) -> bytes:
    """Encodes ``values`` (field name -> value) as message ``msg``."""
    out = bytearray()
    _encode_into(msg, values, out)
    return bytes(out)


def encode_frame(msg: str, values: Dict[str, Any]) -> bytes:
    """A whole frame: big-endian length prefix plus the encoded message."""
    body = encode_message(msg, values)
    if len(body) > MAX_FRAME_LEN:
        raise WireError(f"a {msg} of {len(body)} bytes exceeds the {MAX_FRAME_LEN}-byte frame limit")
    return struct.pack(">I", len(body)) + body


# ------------------------------- decoding ---------------------------------


def decode_varint(data: bytes, pos: int) -> Tuple[int, int]:
    """Reads a varint at ``pos``; returns (value mod 2**64, new position)."""
    try:
        b = data[pos]
    except IndexError:
        raise WireError("truncated varint") from None
    if b < 0x80:  # most keys, lengths and small numbers: one byte
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        b = data[pos]
        pos += 1
        if shift < 64:
            result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & _U64_MASK, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _skip(data: bytes, pos: int, wtype: int, num: int, depth: int = 0) -> int:
    if wtype == _VARINT:
        return decode_varint(data, pos)[1]
    if wtype == _I64:
        pos += 8
    elif wtype == _I32:
        pos += 4
    elif wtype == _LEN:
        n, pos = decode_varint(data, pos)
        pos += n
    elif wtype == _SGROUP:
        # Deprecated groups: skip nested fields up to the matching end-group.
        if depth > 32:
            raise WireError("groups nested too deeply")
        while True:
            key, pos = decode_varint(data, pos)
            inner_type, inner_num = key & 7, key >> 3
            if inner_type == _EGROUP:
                if inner_num != num:
                    raise WireError("mismatched end-group")
                return pos
            pos = _skip(data, pos, inner_type, inner_num, depth + 1)
    else:
        raise WireError(f"invalid wire type {wtype}")
    if pos > len(data):
        raise WireError("truncated field")
    return pos


def _scalar(kind: str, v: int) -> Any:
    """A decoded varint as field type ``kind`` wants it."""
    if kind == "u32":
        return v & 0xFFFFFFFF
    if kind == "i64":
        return v - (1 << 64) if v >= 1 << 63 else v
    if kind == "enum":
        v &= 0xFFFFFFFF
        return v - (1 << 32) if v >= 1 << 31 else v
    if kind == "bool":
        return v != 0
    return v


#: How a field is read: a number (varint), a string, or a message.
_NUMBER, _STRING, _MESSAGE = 0, 1, 2


class _Compiled:
    """One message's schema, worked out once: the dict of defaults every
    decode starts from, and per field number what to do with it (decoding
    is on every reply's path: no per-field string tests there)."""

    __slots__ = ("defaults", "repeated", "fields", "oneof_members")

    def __init__(self, msg: str) -> None:
        spec = SCHEMA[msg]
        self.defaults: Dict[str, Any] = {}
        self.repeated: List[str] = []
        #: num -> (name, kind, how, repeated, oneof group or "", scalar
        #: kind or "" when a u64 needs no conversion)
        self.fields: Dict[int, Tuple[str, str, int, bool, str, str]] = {}
        self.oneof_members: List[Tuple[str, str]] = []  # (member, group)
        for num, (name, kind, label) in spec.items():
            rep = label == "repeated"
            group = label[6:] if label.startswith("oneof:") else ""
            if rep:
                self.repeated.append(name)
            else:
                self.defaults[name] = _default(kind, label)
            if group:
                self.defaults[group] = None
                self.oneof_members.append((name, group))
            how = _STRING if kind == "string" else (_NUMBER if kind in _SCALARS else _MESSAGE)
            convert = "" if kind == "u64" else kind
            self.fields[num] = (name, kind, how, rep, group, convert)


_COMPILED: Dict[str, _Compiled] = {}


def _compiled(msg: str) -> _Compiled:
    c = _COMPILED.get(msg)
    if c is None:
        c = _COMPILED[msg] = _Compiled(msg)
    return c


def decode_message(msg: str, data: bytes) -> Dict[str, Any]:
    """Decodes ``data`` as message ``msg`` into a dict with every field.

    Absent plain fields hold their proto3 default, absent optional/message
    fields ``None``. For a oneof ``<name>`` the dict also holds
    ``"<name>"`` = the member that was set (or ``None``).

    Every reply item goes through here, so the common shapes take the
    short way: one-byte keys and lengths are read inline, a message field
    seen once is decoded from its slice (a second occurrence merges, by
    concatenation, protobuf's rule), and the oneof clean-up runs only when
    a oneof changed member. ``tests/test_wire_decoder.py`` checks it against the
    plain field-by-field decoder on random and mutated messages.
    """
    c = _compiled(msg)
    out: Dict[str, Any] = c.defaults.copy()
    for name in c.repeated:
        out[name] = []
    # Non-repeated message fields: name -> (kind, bytes or a merged bytearray),
    # in the order first seen.
    raw_msgs: Optional[Dict[str, Tuple[str, Any]]] = None
    switched = False  # a oneof changed member: clear the others at the end
    if not isinstance(data, bytes):
        data = memoryview(data).tobytes()
    pos, end = 0, len(data)
    fields = c.fields
    while pos < end:
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = decode_varint(data, pos)
        num, wtype = key >> 3, key & 7
        if num == 0:
            raise WireError("field number 0")
        field = fields.get(num)
        if field is None:
            pos = _skip(data, pos, wtype, num)
            continue
        name, kind, how, rep, group, convert = field
        if how == _NUMBER:
            if wtype == _LEN and rep:
                # proto3 packs repeated numbers: one length-delimited run.
                n, pos = decode_varint(data, pos)
                if pos + n > end:
                    raise WireError(f"{msg}.{name}: truncated")
                run_end = pos + n
                while pos < run_end:
                    v, pos = decode_varint(data, pos)
                    if pos > run_end:
                        raise WireError(f"{msg}.{name}: a packed value runs past its field")
                    out[name].append(_scalar(kind, v))
                continue
            if wtype != _VARINT:
                raise WireError(f"{msg}.{name}: wire type {wtype}, expected varint")
        elif wtype != _LEN:
            raise WireError(f"{msg}.{name}: wire type {wtype}, expected length-delimited")
        # A varint comes next either way: the number, or the length.
        if pos >= end:
            raise WireError("truncated varint")
        v = data[pos]
        if v < 0x80:
            pos += 1
        else:
            v, pos = decode_varint(data, pos)
        if how == _NUMBER:
            value: Any = _scalar(convert, v) if convert else v
        else:
            n = v
            if pos + n > end:
                raise WireError(f"{msg}.{name}: truncated")
            chunk = data[pos : pos + n]
            pos += n
            if how == _STRING:
                try:
                    value = chunk.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise WireError(f"{msg}.{name}: invalid UTF-8") from e
            elif rep:
                value = decode_message(kind, chunk)
            else:
                if raw_msgs is None:
                    raw_msgs = {}
                if group:
                    previous = out[group]
                    if previous is not None and previous != name:
                        # Setting another member clears the oneof.
                        raw_msgs.pop(previous, None)
                        raw_msgs.pop(name, None)
                        switched = True
                    out[group] = name
                seen = raw_msgs.get(name)
                if seen is None:
                    raw_msgs[name] = (kind, chunk)
                else:
                    merged = seen[1] if isinstance(seen[1], bytearray) else bytearray(seen[1])
                    merged += chunk
                    raw_msgs[name] = (kind, merged)
                continue
        if rep:
            out[name].append(value)
        else:
            if group:
                previous = out[group]
                if previous is not None and previous != name:
                    switched = True
                out[group] = name
            out[name] = value
    if raw_msgs:
        for name, (kind, raw) in raw_msgs.items():
            out[name] = decode_message(kind, raw if isinstance(raw, bytes) else bytes(raw))
    if switched:
        for name, group in c.oneof_members:
            if out[group] != name:
                out[name] = None
    return out


class FrameDecoder:
    """Splits a byte stream into frames; keeps received descriptors in order.

    Descriptors (SCM_RIGHTS) arrive with the first byte of the frame that
    carries them, so a FIFO of descriptors matched against frames in order
    reproduces the sender's pairing (this is what ``sluice_shm::FrameReader``
    does on the Rust side).
    """

    def __init__(self, max_frame: int = MAX_FRAME_LEN) -> None:
        self._buf = bytearray()
        #: Where the next frame starts in ``_buf``: frames read are dropped
        #: from the front once per read (in ``feed``), not once per frame (a
        #: read brings a batch's items, each a frame of ~100 bytes).
        self._pos = 0
        self._fds: Deque[int] = deque()
        self._max = max_frame

    def feed(self, data: "Union[bytes, memoryview]", fds: List[int]) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
        self._fds.extend(fds)

    def frames(self) -> Iterator[bytes]:
        """Yields every complete frame buffered so far. A pass given up
        part way (the caller raised) leaves the rest for the next one."""
        buf = self._buf
        while len(buf) - self._pos >= 4:
            (n,) = struct.unpack_from(">I", buf, self._pos)
            if n > self._max:
                raise WireError(f"frame of {n} bytes exceeds {self._max}")
            start = self._pos + 4
            if len(buf) < start + n:
                return
            # One copy, and the view released before the buffer can change.
            with memoryview(buf) as view:
                payload = view[start : start + n].tobytes()
            self._pos = start + n
            yield payload

    def take_fd(self) -> Optional[int]:
        """The oldest unclaimed descriptor, if any (the caller owns it)."""
        return self._fds.popleft() if self._fds else None

    def stray_fds(self) -> List[int]:
        """Descriptors nobody can claim any more: with no partial frame
        buffered, a queued descriptor cannot belong to a future frame."""
        if len(self._buf) > self._pos or not self._fds:
            return []
        out = list(self._fds)
        self._fds.clear()
        return out

    def drain_fds(self) -> List[int]:
        out = list(self._fds)
        self._fds.clear()
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos
