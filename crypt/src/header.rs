//! The fixed-size object header of format v1 (see docs/encryption-format.md).
//!
//! The header is fixed-size per version so a ranged GET can compute chunk offsets from the
//! plaintext size and chunk size alone. All integers are big-endian. Parsing validates every field
//! and never panics: the bytes come from storage and are attacker-controlled.

use crate::keys::{KeyId, KEY_ID_MAX_LEN, KEY_LEN};
use crate::layout::{check_chunk_size, Layout, TAG_LEN};
use crate::CryptError;

/// Identifies a Sluice encrypted object.
pub const MAGIC: [u8; 4] = *b"SLCE";
/// The format version this build writes (and the only one it reads).
pub const FORMAT_VERSION: u8 = 1;
/// Algorithm byte for AES-256-GCM chunks with AES-256-GCM key wrapping.
pub const ALG_AES_256_GCM: u8 = 1;
/// Length of the random per-object nonce prefix (chunk nonce = prefix || u32 index).
pub const NONCE_PREFIX_LEN: usize = 8;
/// Length of the random nonce used to wrap the data key.
pub const WRAP_NONCE_LEN: usize = 12;
/// Wrapped data key: 32 encrypted bytes plus the GCM tag.
pub const WRAPPED_KEY_LEN: usize = KEY_LEN + TAG_LEN;
/// Total v1 header length.
pub const HEADER_LEN: usize = 120;

// Field offsets. Everything before OFF_WRAPPED_KEY is authenticated as associated data of the key
// wrap, so the opener rejects a modified header before decrypting any chunk.
pub(crate) const OFF_VERSION: usize = 4;
pub(crate) const OFF_ALG: usize = 5;
pub(crate) const OFF_KEY_ID_LEN: usize = 6;
pub(crate) const OFF_RESERVED: usize = 7;
pub(crate) const OFF_CHUNK_SIZE: usize = 8;
pub(crate) const OFF_PLAINTEXT_LEN: usize = 12;
pub(crate) const OFF_NONCE_PREFIX: usize = 20;
pub(crate) const OFF_WRAP_NONCE: usize = OFF_NONCE_PREFIX + NONCE_PREFIX_LEN;
pub(crate) const OFF_KEY_ID: usize = OFF_WRAP_NONCE + WRAP_NONCE_LEN;
pub(crate) const OFF_WRAPPED_KEY: usize = OFF_KEY_ID + KEY_ID_MAX_LEN;
const _: () = assert!(OFF_WRAPPED_KEY + WRAPPED_KEY_LEN == HEADER_LEN);

/// Decoded v1 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub key_id: KeyId,
    pub layout: Layout,
    pub nonce_prefix: [u8; NONCE_PREFIX_LEN],
    pub wrap_nonce: [u8; WRAP_NONCE_LEN],
    pub wrapped_key: [u8; WRAPPED_KEY_LEN],
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..OFF_VERSION].copy_from_slice(&MAGIC);
        h[OFF_VERSION] = FORMAT_VERSION;
        h[OFF_ALG] = ALG_AES_256_GCM;
        let id = self.key_id.as_str().as_bytes();
        // KeyId guarantees 1..=32 bytes.
        h[OFF_KEY_ID_LEN] = id.len() as u8;
        h[OFF_RESERVED] = 0;
        h[OFF_CHUNK_SIZE..OFF_PLAINTEXT_LEN].copy_from_slice(&self.layout.chunk_size().to_be_bytes());
        h[OFF_PLAINTEXT_LEN..OFF_NONCE_PREFIX].copy_from_slice(&self.layout.plaintext_len().to_be_bytes());
        h[OFF_NONCE_PREFIX..OFF_WRAP_NONCE].copy_from_slice(&self.nonce_prefix);
        h[OFF_WRAP_NONCE..OFF_KEY_ID].copy_from_slice(&self.wrap_nonce);
        h[OFF_KEY_ID..OFF_KEY_ID + id.len()].copy_from_slice(id);
        h[OFF_WRAPPED_KEY..].copy_from_slice(&self.wrapped_key);
        h
    }

    /// Parses and validates a header. `bytes` must be exactly the header.
    pub fn parse(bytes: &[u8]) -> Result<Header, CryptError> {
        let bad = |why: &str| CryptError::BadHeader(why.to_owned());
        if bytes.get(..OFF_VERSION) != Some(&MAGIC[..]) {
            return Err(bad("not a Sluice encrypted object (bad magic)"));
        }
        // The version decides the header length, so check it before the length.
        match bytes.get(OFF_VERSION) {
            Some(&FORMAT_VERSION) => {}
            Some(&v) => return Err(CryptError::UnsupportedVersion(v)),
            None => return Err(bad("truncated header")),
        }
        let h: &[u8; HEADER_LEN] = bytes
            .try_into()
            .map_err(|_| CryptError::BadHeader(format!("header is {} bytes, expected {HEADER_LEN}", bytes.len())))?;
        if h[OFF_ALG] != ALG_AES_256_GCM {
            return Err(CryptError::BadHeader(format!("unknown algorithm {}", h[OFF_ALG])));
        }
        if h[OFF_RESERVED] != 0 {
            return Err(bad("reserved byte is not zero"));
        }
        let id_len = usize::from(h[OFF_KEY_ID_LEN]);
        if id_len == 0 || id_len > KEY_ID_MAX_LEN {
            return Err(bad("key id length out of range"));
        }
        let id_field = &h[OFF_KEY_ID..OFF_WRAPPED_KEY];
        // Non-zero padding would be a second encoding of the same header; reject it so the header
        // bytes stay canonical.
        if id_field[id_len..].iter().any(|&b| b != 0) {
            return Err(bad("key id padding is not zero"));
        }
        let key_id = std::str::from_utf8(&id_field[..id_len])
            .ok()
            .and_then(|s| KeyId::new(s).ok())
            .ok_or_else(|| bad("key id is not a valid key id"))?;
        let chunk_size = u32::from_be_bytes(array(&h[OFF_CHUNK_SIZE..OFF_PLAINTEXT_LEN]));
        let chunk_size = check_chunk_size(u64::from(chunk_size))
            .map_err(|_| CryptError::BadHeader(format!("invalid chunk size {chunk_size}")))?;
        let plaintext_len = u64::from_be_bytes(array(&h[OFF_PLAINTEXT_LEN..OFF_NONCE_PREFIX]));
        let layout = Layout::new(plaintext_len, chunk_size).map_err(|e| CryptError::BadHeader(e.to_string()))?;
        Ok(Header {
            key_id,
            layout,
            nonce_prefix: array(&h[OFF_NONCE_PREFIX..OFF_WRAP_NONCE]),
            wrap_nonce: array(&h[OFF_WRAP_NONCE..OFF_KEY_ID]),
            wrapped_key: array(&h[OFF_WRAPPED_KEY..]),
        })
    }
}

/// Copies a slice whose length is fixed by the constant offsets above into an array.
fn array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            key_id: KeyId::new("k-2024").unwrap(),
            layout: Layout::new(123_456, 4096).unwrap(),
            nonce_prefix: [1; NONCE_PREFIX_LEN],
            wrap_nonce: [2; WRAP_NONCE_LEN],
            wrapped_key: [3; WRAPPED_KEY_LEN],
        }
    }

    #[test]
    fn encode_parse_round_trip() {
        let h = sample();
        let bytes = h.encode();
        assert_eq!(&bytes[..4], b"SLCE");
        assert_eq!(Header::parse(&bytes).unwrap(), h);
    }

    #[test]
    fn malformed_headers_rejected() {
        let good = sample().encode();
        let parse_with = |f: &dyn Fn(&mut [u8; HEADER_LEN])| {
            let mut b = good;
            f(&mut b);
            Header::parse(&b)
        };
        assert!(matches!(parse_with(&|b| b[0] ^= 1), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_VERSION] = 2), Err(CryptError::UnsupportedVersion(2))));
        assert!(matches!(parse_with(&|b| b[OFF_ALG] = 9), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_RESERVED] = 1), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_KEY_ID_LEN] = 0), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_KEY_ID_LEN] = 33), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_KEY_ID + 31] = 1), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_KEY_ID] = b'/'), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_CHUNK_SIZE + 3] = 1), Err(CryptError::BadHeader(_))));
        assert!(matches!(parse_with(&|b| b[OFF_PLAINTEXT_LEN] = 0xff), Err(CryptError::BadHeader(_))));
        for len in [0, 3, 4, 5, HEADER_LEN - 1] {
            assert!(matches!(Header::parse(&good[..len]), Err(CryptError::BadHeader(_))), "len {len}");
        }
        let mut long = good.to_vec();
        long.push(0);
        assert!(matches!(Header::parse(&long), Err(CryptError::BadHeader(_))));
    }
}
