//! S3 user metadata describing an encrypted object, and the per-namespace policy value.
//!
//! The agent stores these pairs as `x-amz-meta-*` user metadata so HEAD and LIST can report the
//! plaintext size without reading the object, and so a ranged GET can be planned before the header
//! is read. Metadata is NOT authenticated: before trusting it for a read, check it against the
//! header with [`crate::ObjectOpener::check_metadata`] (`open_range` does so for its plan).

use std::fmt;
use std::str::FromStr;

use crate::header::{FORMAT_VERSION, HEADER_LEN};
use crate::keys::KeyId;
use crate::layout::{Layout, RangePlan};
use crate::CryptError;

/// Marks an object as encrypted; the value is the format version (`v1`).
pub const META_ENC: &str = "sluice-enc";
/// Plaintext size in bytes (decimal).
pub const META_PLAIN_SIZE: &str = "sluice-plain-size";
/// Chunk size in bytes (decimal).
pub const META_CHUNK: &str = "sluice-chunk";
/// Id of the master key that wraps the object's data key.
pub const META_KEY_ID: &str = "sluice-key-id";

/// The encryption user metadata of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub version: u8,
    pub plaintext_len: u64,
    pub chunk_size: u32,
    pub key_id: KeyId,
}

fn bad(why: String) -> CryptError {
    CryptError::BadMetadata(why)
}

/// Strict decimal: `str::parse` would also accept a leading `+`.
fn decimal(name: &str, value: &str) -> Result<u64, CryptError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!("{name} is not a decimal number: {value:?}")));
    }
    value.parse().map_err(|_| bad(format!("{name} is out of range: {value:?}")))
}

impl Metadata {
    pub fn v1(plaintext_len: u64, chunk_size: u32, key_id: KeyId) -> Self {
        Metadata { version: FORMAT_VERSION, plaintext_len, chunk_size, key_id }
    }

    /// The pairs to store, keys without the `x-amz-meta-` prefix.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            (META_ENC, format!("v{}", self.version)),
            (META_PLAIN_SIZE, self.plaintext_len.to_string()),
            (META_CHUNK, self.chunk_size.to_string()),
            (META_KEY_ID, self.key_id.to_string()),
        ]
    }

    /// Reads the encryption metadata out of all of an object's user metadata (keys without the
    /// `x-amz-meta-` prefix, compared case-insensitively; unrelated keys are ignored).
    /// `Ok(None)` means the object is not encrypted (no `sluice-enc` key).
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Option<Metadata>, CryptError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut fields: [Option<String>; 4] = Default::default();
        let names = [META_ENC, META_PLAIN_SIZE, META_CHUNK, META_KEY_ID];
        for (k, v) in pairs {
            let Some(slot) = names.iter().position(|n| n.eq_ignore_ascii_case(k.as_ref())) else { continue };
            if fields[slot].replace(v.as_ref().to_owned()).is_some() {
                return Err(bad(format!("{} appears more than once", names[slot])));
            }
        }
        let [enc, size, chunk, key_id] = fields;
        let Some(enc) = enc else { return Ok(None) };
        let version = match enc.strip_prefix('v').map(|v| decimal(META_ENC, v)) {
            Some(Ok(1)) => FORMAT_VERSION,
            Some(Ok(v)) => return Err(CryptError::UnsupportedVersion(u8::try_from(v).unwrap_or(u8::MAX))),
            _ => return Err(bad(format!("{META_ENC} has unexpected value {enc:?}"))),
        };
        let missing = |name: &str| bad(format!("{name} is missing"));
        let plaintext_len = decimal(META_PLAIN_SIZE, &size.ok_or_else(|| missing(META_PLAIN_SIZE))?)?;
        let chunk = decimal(META_CHUNK, &chunk.ok_or_else(|| missing(META_CHUNK))?)?;
        let chunk_size = u32::try_from(chunk).map_err(|_| CryptError::InvalidChunkSize(chunk))?;
        let key_id = KeyId::new(key_id.ok_or_else(|| missing(META_KEY_ID))?)?;
        // Validates the chunk size and the chunk-count limit up front.
        Layout::new(plaintext_len, chunk_size)?;
        Ok(Some(Metadata { version, plaintext_len, chunk_size, key_id }))
    }

    /// Chunk geometry described by the metadata.
    pub fn layout(&self) -> Result<Layout, CryptError> {
        Layout::new(self.plaintext_len, self.chunk_size)
    }

    /// Length of the stored object.
    pub fn ciphertext_len(&self) -> Result<u64, CryptError> {
        Ok(self.layout()?.ciphertext_len())
    }

    /// Length of the header at the start of the stored object (fixed per format version).
    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Plans a ranged GET of plaintext bytes `[start, start + len)`.
    pub fn plan_range(&self, start: u64, len: u64) -> Result<RangePlan, CryptError> {
        self.layout()?.plan_range(start, len)
    }
}

/// Per-namespace encryption policy (`encryption = "none" | "aes-256-gcm"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncryptionPolicy {
    #[default]
    None,
    Aes256Gcm,
}

impl FromStr for EncryptionPolicy {
    type Err = CryptError;

    fn from_str(s: &str) -> Result<Self, CryptError> {
        match s {
            "none" => Ok(EncryptionPolicy::None),
            "aes-256-gcm" => Ok(EncryptionPolicy::Aes256Gcm),
            other => Err(CryptError::UnknownPolicy(other.to_owned())),
        }
    }
}

impl fmt::Display for EncryptionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EncryptionPolicy::None => "none",
            EncryptionPolicy::Aes256Gcm => "aes-256-gcm",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        Metadata::v1(12345, 4096, KeyId::new("k1").unwrap())
    }

    #[test]
    fn pairs_round_trip() {
        let m = sample();
        let pairs = m.to_pairs();
        assert_eq!(pairs[0], ("sluice-enc", "v1".to_owned()));
        let mut with_other: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_uppercase(), v.clone())).collect();
        with_other.push(("content-owner".into(), "x".into()));
        assert_eq!(Metadata::from_pairs(with_other).unwrap(), Some(m));
        assert_eq!(Metadata::from_pairs([("other", "1")]).unwrap(), None);
    }

    #[test]
    fn malformed_metadata_rejected() {
        let base = sample().to_pairs();
        let with = |key: &str, value: Option<&str>| {
            let mut p: Vec<(String, String)> = base.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            p.retain(|(k, _)| k != key);
            if let Some(v) = value {
                p.push((key.to_owned(), v.to_owned()));
            }
            Metadata::from_pairs(p)
        };
        assert!(matches!(with(META_ENC, Some("v2")), Err(CryptError::UnsupportedVersion(2))));
        assert!(matches!(with(META_ENC, Some("yes")), Err(CryptError::BadMetadata(_))));
        assert!(matches!(with(META_PLAIN_SIZE, None), Err(CryptError::BadMetadata(_))));
        assert!(matches!(with(META_PLAIN_SIZE, Some("+5")), Err(CryptError::BadMetadata(_))));
        assert!(matches!(with(META_PLAIN_SIZE, Some("99999999999999999999")), Err(CryptError::BadMetadata(_))));
        assert!(matches!(with(META_CHUNK, Some("1000")), Err(CryptError::InvalidChunkSize(1000))));
        assert!(matches!(with(META_KEY_ID, Some("../x")), Err(CryptError::InvalidName { .. })));
        let mut dup = base.clone();
        dup.push((META_CHUNK, "4096".into()));
        assert!(matches!(Metadata::from_pairs(dup), Err(CryptError::BadMetadata(_))));
    }

    #[test]
    fn policy_parses() {
        assert_eq!("none".parse::<EncryptionPolicy>().unwrap(), EncryptionPolicy::None);
        assert_eq!("aes-256-gcm".parse::<EncryptionPolicy>().unwrap(), EncryptionPolicy::Aes256Gcm);
        assert_eq!(EncryptionPolicy::Aes256Gcm.to_string(), "aes-256-gcm");
        assert!(matches!("AES".parse::<EncryptionPolicy>(), Err(CryptError::UnknownPolicy(_))));
    }
}
