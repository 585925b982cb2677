//! Wire format of the `tcp` transport (see docs/tcp-transport.md).
//!
//! Operation header, 36 bytes, big-endian:
//! `magic "SLDP" | version u8 | op u8 | reserved u16 | rkey u32 | dct u32 |
//!  addr u64 | len u64 | reserved u32`
//! The owner answers every operation with a 16-byte reply
//! `status u8 | reserved [7] | len u64`, followed by `len` bytes: the data
//! for a successful READ, a UTF-8 message for an error. After an error the
//! owner closes the connection.
//!
//! WRITE is a handshake (version 2): the owner first checks the header
//! (descriptor key, bounds) and answers `Ok` with length 0 — the go-ahead —
//! and only then does the remote send the `len` payload bytes, after which
//! the owner answers again. So a remote never sends object bytes to
//! anything but a Sluice owner that expects exactly this write: a token
//! naming some other service's address gets a header and nothing more.

use crate::capability::Key;

pub const MAGIC: [u8; 4] = *b"SLDP";
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 36;
pub const REPLY_LEN: usize = 16;

/// A request header that is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad magic")]
    Magic,
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown op {0}")]
    Op(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write = 1,
    Read = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub key: Key,
    pub addr: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    Rejected = 1,
    Protocol = 2,
    Memory = 3,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[8..12].copy_from_slice(&self.key.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.key.dct.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24..32].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Self, HeaderError> {
        if b[0..4] != MAGIC {
            return Err(HeaderError::Magic);
        }
        if b[4] != VERSION {
            return Err(HeaderError::Version(b[4]));
        }
        let op = match b[5] {
            1 => Op::Write,
            2 => Op::Read,
            o => return Err(HeaderError::Op(o)),
        };
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        Ok(Self { op, key: Key { rkey: u32_at(8), dct: u32_at(12) }, addr: u64_at(16), len: u64_at(24) })
    }
}

pub fn reply(status: Status, len: u64) -> [u8; REPLY_LEN] {
    let mut b = [0u8; REPLY_LEN];
    b[0] = status as u8;
    b[8..16].copy_from_slice(&len.to_be_bytes());
    b
}

pub fn decode_reply(b: &[u8; REPLY_LEN]) -> (u8, u64) {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[8..16]);
    (b[0], u64::from_be_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let h = Header { op: Op::Read, key: Key { rkey: 7, dct: 0xabcdef }, addr: 1 << 40, len: 12345 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Header::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[5] = 9;
        assert!(Header::decode(&bad).is_err());
        // Version 1 (no WRITE handshake) and unknown versions are refused.
        for v in [1u8, 3] {
            let mut bad = h.encode();
            bad[4] = v;
            assert!(Header::decode(&bad).is_err(), "version {v}");
        }
    }
}
