//! Wire format of the `tcp` transport (see docs/tcp-transport.md).
//!
//! Operation header, 36 bytes, big-endian:
//! `magic "SLDP" | version u8 | op u8 | flags u16 | rkey u32 | dct u32 |
//!  addr u64 | len u64 | reserved u32`
//! The owner answers every operation with a 16-byte reply
//! `status u8 | features u8 | reserved [6] | len u64`, followed by `len`
//! bytes: the data for a successful READ, a UTF-8 message for an error.
//! After an error the owner closes the connection.
//!
//! WRITE is a handshake (version 2): the owner first checks the header
//! (descriptor key, bounds) and answers `Ok` with length 0 — the go-ahead —
//! and only then does the remote send the `len` payload bytes, after which
//! the owner answers again. So a remote never sends object bytes to
//! anything but a Sluice owner that expects exactly this write: a token
//! naming some other service's address gets a header and nothing more.
//!
//! An owner that sets [`FEATURE_EAGER`] in its replies also takes a WRITE
//! whose header has [`FLAG_EAGER`]: the payload follows the header at once,
//! with no go-ahead, and the owner answers once. A remote sends one only on
//! a connection on which this owner has already answered (so the bytes go
//! nowhere but to a Sluice owner); it saves a round trip per small WRITE.
//! A refused eager WRITE (at most [`EAGER_MAX_BYTES`]) has its payload read
//! and dropped, never written, then is answered and the connection closed.
//! Owners without the feature answer it with zeros, and remotes keep the
//! handshake with them.
//!
//! An owner that sets [`FEATURE_POSTED`] tells the remote that whoever
//! asked for a WRITE into its memory waits for the owner itself to have the
//! bytes (`crate::landing`), not for the remote's word. Such a remote may
//! post an eager WRITE: tell its requester the WRITE is done without
//! waiting for the owner's answer, and read that answer before its next
//! operation on the connection. It saves the remote a wake-up and a round
//! trip per small object. A posted WRITE the owner refused is found then,
//! and its requester, waiting on its window, sees the bytes never landed.

use crate::capability::Key;

pub const MAGIC: [u8; 4] = *b"SLDP";
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 36;
pub const REPLY_LEN: usize = 16;
/// Header flag: the WRITE's payload follows without a go-ahead.
pub const FLAG_EAGER: u16 = 1;
/// Reply feature: this owner takes [`FLAG_EAGER`] WRITEs.
pub const FEATURE_EAGER: u8 = 1;
/// Reply feature: this owner's requesters wait for the bytes themselves,
/// so eager WRITEs may be posted (answered later; see the module's text).
pub const FEATURE_POSTED: u8 = 2;
/// The largest WRITE a remote sends eager (with its header, in one write).
/// An owner that refuses one reads and drops its payload first, so the
/// refusal's reason reaches the remote instead of a reset connection.
pub const EAGER_MAX_BYTES: u64 = 256 << 10;

/// A request header that is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad magic")]
    Magic,
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown op {0}")]
    Op(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u16),
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
    /// A WRITE whose payload follows at once ([`FLAG_EAGER`]).
    pub eager: bool,
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
        let flags = if self.eager { FLAG_EAGER } else { 0 };
        b[6..8].copy_from_slice(&flags.to_be_bytes());
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
        let flags = u16::from_be_bytes([b[6], b[7]]);
        // Only a WRITE can be eager; unknown bits are refused, not ignored
        // (an ignored flag would desynchronise the stream).
        if flags & !FLAG_EAGER != 0 || (flags != 0 && op != Op::Write) {
            return Err(HeaderError::Flags(flags));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        Ok(Self {
            op,
            key: Key { rkey: u32_at(8), dct: u32_at(12) },
            addr: u64_at(16),
            len: u64_at(24),
            eager: flags & FLAG_EAGER != 0,
        })
    }
}

/// An owner's reply, advertising the features this owner has.
pub fn reply(status: Status, len: u64) -> [u8; REPLY_LEN] {
    let mut b = [0u8; REPLY_LEN];
    b[0] = status as u8;
    b[1] = FEATURE_EAGER | FEATURE_POSTED;
    b[8..16].copy_from_slice(&len.to_be_bytes());
    b
}

/// A decoded reply: status, the owner's features, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: u8,
    pub features: u8,
    pub len: u64,
}

pub fn decode_reply(b: &[u8; REPLY_LEN]) -> Reply {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[8..16]);
    Reply { status: b[0], features: b[1], len: u64::from_be_bytes(a) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let h = Header { op: Op::Read, key: Key { rkey: 7, dct: 0xabcdef }, addr: 1 << 40, len: 12345, eager: false };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let w = Header { op: Op::Write, eager: true, ..h };
        assert_eq!(Header::decode(&w.encode()).unwrap(), w);
        // An eager READ, and unknown flag bits, are refused.
        let mut bad = h.encode();
        bad[7] = FLAG_EAGER as u8;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Flags(1)));
        let mut bad = w.encode();
        bad[6] = 0x80;
        assert!(matches!(Header::decode(&bad), Err(HeaderError::Flags(_))));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Header::decode(&bad).is_err());
        let mut bad = h.encode();
        bad[5] = 9;
        assert!(Header::decode(&bad).is_err());
        let r = decode_reply(&reply(Status::Rejected, 77));
        assert_eq!(r, Reply { status: Status::Rejected as u8, features: FEATURE_EAGER | FEATURE_POSTED, len: 77 });
        // Version 1 (no WRITE handshake) and unknown versions are refused.
        for v in [1u8, 3] {
            let mut bad = h.encode();
            bad[4] = v;
            assert!(Header::decode(&bad).is_err(), "version {v}");
        }
    }
}
