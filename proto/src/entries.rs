//! Counting a message's repeated entries before decoding it.
//!
//! Decoding makes one value per entry of a repeated field, however small the
//! entry is on the wire: an empty `StreamedGet` is 2 bytes, and its decoded
//! value a few hundred. A frame of the largest size either side takes, full
//! of empty entries, would make a daemon allocate a hundred times the
//! frame's size before any count of them is checked. So where a peer's
//! message carries a repeated field whose count has a limit, the count is
//! read from the bytes first (a walk over the message's fields that
//! allocates nothing), and a message past it is refused undecoded.

/// Bytes that are not a protobuf message (a decoder would refuse them too).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a protobuf message: {0}")]
pub struct Malformed(&'static str);

type DecodeError = Malformed;

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// What a repeated field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Messages (or strings, bytes): one entry per occurrence.
    Messages,
    /// Varint scalars (`repeated uint32` ...), packed or not.
    Varints,
}

fn varint(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(Malformed("a varint runs past the end"));
        };
        *buf = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Malformed("a varint longer than 10 bytes"))
}

fn take<'a>(buf: &mut &'a [u8], n: u64) -> Result<&'a [u8], DecodeError> {
    let n = usize::try_from(n).map_err(|_| Malformed("a length past the message"))?;
    if n > buf.len() {
        return Err(Malformed("a field runs past the end of the message"));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// Calls `each(field number, wire type, payload)` for every top-level
/// field of `msg` (payload: a length-delimited field's bytes, empty
/// otherwise; a varint's bytes are not kept).
fn walk(mut msg: &[u8], mut each: impl FnMut(u64, u64, &[u8])) -> Result<(), DecodeError> {
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            VARINT => {
                varint(&mut msg)?;
                each(number, wire, &[]);
            }
            FIXED64 => {
                take(&mut msg, 8)?;
                each(number, wire, &[]);
            }
            LEN => {
                let n = varint(&mut msg)?;
                each(number, wire, take(&mut msg, n)?);
            }
            FIXED32 => {
                take(&mut msg, 4)?;
                each(number, wire, &[]);
            }
            _ => return Err(Malformed("wire type 3, 4, 6 or 7 (groups, or none)")),
        }
    }
    Ok(())
}

/// How many entries repeated field `field` of the message at `within` has,
/// over every occurrence (a decoder merges them): `within` is a path of
/// message fields from the top (`&[]`: the top-level message itself).
/// Malformed bytes are an error (the decoder would refuse them too).
pub fn count(msg: &[u8], within: &[u32], field: u32, kind: Kind) -> Result<usize, DecodeError> {
    let mut n = 0usize;
    let mut failed = None;
    walk(msg, |number, wire, payload| {
        if failed.is_some() {
            return;
        }
        match within.split_first() {
            Some((&outer, rest)) if number == u64::from(outer) && wire == LEN => {
                match count(payload, rest, field, kind) {
                    Ok(k) => n = n.saturating_add(k),
                    Err(e) => failed = Some(e),
                }
            }
            Some(_) => {}
            None if number != u64::from(field) => {}
            None => match (kind, wire) {
                // Packed: one value per byte that ends a varint.
                (Kind::Varints, LEN) => n = n.saturating_add(payload.iter().filter(|&&b| b & 0x80 == 0).count()),
                _ => n = n.saturating_add(1),
            },
        }
    })?;
    match failed {
        Some(e) => Err(e),
        None => Ok(n),
    }
}

/// The most entries any one top-level field of `msg` has (each occurrence
/// one entry; packed scalars are one, and decode to no more than 8 bytes a
/// byte). Without a schema: for checking any message a peer sends.
pub fn most_in_one_field(msg: &[u8]) -> Result<usize, DecodeError> {
    let mut per_field: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    walk(msg, |number, _, _| *per_field.entry(number).or_insert(0) += 1)?;
    Ok(per_field.into_values().max().unwrap_or(0))
}

/// The value of top-level varint field `field` (the last occurrence, as a
/// decoder keeps), if the message has it.
pub fn top_varint(msg: &[u8], field: u32) -> Option<u64> {
    let mut rest = msg;
    let mut found = None;
    while !rest.is_empty() {
        let key = varint(&mut rest).ok()?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            VARINT => {
                let v = varint(&mut rest).ok()?;
                if number == u64::from(field) {
                    found = Some(v);
                }
            }
            FIXED64 => drop(take(&mut rest, 8).ok()?),
            LEN => {
                let n = varint(&mut rest).ok()?;
                take(&mut rest, n).ok()?;
            }
            FIXED32 => drop(take(&mut rest, 4).ok()?),
            _ => return None,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{GetItem, GetStreamRequest, StreamedGet};
    use crate::shim;
    use prost::Message;

    #[test]
    fn counts_what_the_decoder_would_make() {
        let get = StreamedGet { index: 1, session_id: "s".into(), item: Some(GetItem::default()) };
        let m = GetStreamRequest { gets: vec![get.clone(), StreamedGet::default(), get], cancel: vec![1, 300, 70_000] };
        let mut bytes = m.encode_to_vec();
        assert_eq!(count(&bytes, &[], 1, Kind::Messages).unwrap(), 3);
        assert_eq!(count(&bytes, &[], 2, Kind::Varints).unwrap(), 3, "packed");
        // A second occurrence of each (decoders merge them), cancels unpacked.
        bytes.extend_from_slice(&[0x0a, 0x00, 0x10, 0x05, 0x10, 0x06]);
        let decoded = GetStreamRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(count(&bytes, &[], 1, Kind::Messages).unwrap(), decoded.gets.len());
        assert_eq!(count(&bytes, &[], 2, Kind::Varints).unwrap(), decoded.cancel.len());
        assert!(count(&bytes[..bytes.len() - 1], &[], 1, Kind::Messages).is_err(), "cut short");
    }

    #[test]
    fn counts_inside_a_nested_message_over_every_occurrence() {
        let items = |n| shim::GetBatch { items: vec![shim::Get::default(); n] };
        let req = |n| shim::Request { id: 42, op: Some(shim::request::Op::GetBatch(items(n))), ..Default::default() };
        let mut bytes = req(3).encode_to_vec();
        bytes.extend_from_slice(&req(2).encode_to_vec());
        let decoded = shim::Request::decode(bytes.as_slice()).unwrap();
        let Some(shim::request::Op::GetBatch(b)) = decoded.op else { panic!("a batch") };
        assert_eq!(count(&bytes, &[19], 1, Kind::Messages).unwrap(), b.items.len());
        assert_eq!(top_varint(&bytes, 1), Some(42));
        assert_eq!(count(&shim::Request::default().encode_to_vec(), &[19], 1, Kind::Messages).unwrap(), 0);
    }
}
