//! The one error type of the crate.
//!
//! Authentication failures are deliberately a single variant without detail: telling an attacker
//! *which* check failed (tag, length, final flag) only helps them, and the agent maps all of them to
//! the same S3 error anyway.

use std::path::PathBuf;

/// Everything that can go wrong while sealing, opening or looking up keys.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    /// Authentication failed: the object was tampered with, truncated, reordered, copied to another
    /// bucket/key, or is being opened with the wrong master key.
    #[error(
        "integrity check failed: the object is corrupt, truncated, was moved from another key, or the key is wrong"
    )]
    Integrity,

    /// The header names a key id that the tenant's key provider does not have.
    #[error("unknown key id {key_id:?} for tenant {tenant:?}")]
    UnknownKey { tenant: String, key_id: String },

    /// The tenant has no keys at all (or no `current` key can be determined).
    #[error("no current encryption key for tenant {tenant:?}")]
    NoCurrentKey { tenant: String },

    /// The object header is structurally invalid (wrong magic, bad field value, wrong length).
    #[error("bad encryption header: {0}")]
    BadHeader(String),

    /// The header is for a format version this build cannot read.
    #[error("unsupported encryption format version {0}")]
    UnsupportedVersion(u8),

    /// A key file (or the `current` pointer) could not be read or is malformed.
    #[error("key file {}: {why}", path.display())]
    KeyFile { path: PathBuf, why: String },

    /// A key file is readable by group or others; refusing it keeps a mis-deployed secret from
    /// being used silently.
    #[error("key file {} has mode {mode:04o}; key files must not be accessible by group or others (chmod 600)", path.display())]
    KeyFileMode { path: PathBuf, mode: u32 },

    /// Chunk sizes are restricted so that the range arithmetic stays simple and nonces cannot run out.
    #[error("invalid chunk size {0}: must be a power of two between 4 KiB and 16 MiB")]
    InvalidChunkSize(u64),

    /// A requested plaintext range is empty or does not lie inside the object.
    #[error("range start {start} length {len} is not inside an object of {size} bytes")]
    RangeOutOfBounds { start: u64, len: u64, size: u64 },

    /// The object would need 2^32 or more chunks (the chunk index is 32 bits of the nonce).
    #[error("object of {plaintext_len} bytes needs too many chunks of {chunk_size} bytes")]
    TooLarge { plaintext_len: u64, chunk_size: u32 },

    /// A stored object length is not a length this format can produce for the given chunk size.
    #[error("{len} bytes is not a valid encrypted object length for chunk size {chunk_size}")]
    BadCiphertextLength { len: u64, chunk_size: u32 },

    /// The caller asked for a chunk the object does not have.
    #[error("chunk index {index} out of range: the object has {count} chunks")]
    ChunkIndex { index: u32, count: u32 },

    /// The caller passed a plaintext chunk of the wrong size to the sealer.
    #[error("chunk {index} must hold {expected} plaintext bytes, got {got}")]
    ChunkLength { index: u32, expected: u64, got: u64 },

    /// A tenant name or key id that is not safe to use as a file name / header field.
    #[error("invalid {what} {name:?}: use 1-{max} characters from [A-Za-z0-9._-], not starting with '.'")]
    InvalidName { what: &'static str, name: String, max: usize },

    /// The encryption user metadata of an object is missing a field or malformed.
    #[error("bad encryption metadata: {0}")]
    BadMetadata(String),

    /// A namespace's `encryption` setting is not one of the supported policies.
    #[error("unknown encryption policy {0:?}: expected \"none\" or \"aes-256-gcm\"")]
    UnknownPolicy(String),

    /// Filesystem error while managing keys.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A [`Cipher`](crate::Cipher) implementation failed [`self_test`](crate::self_test): it is not
    /// a correct AES-256-GCM and must not be used. `check` names the failed check (e.g.
    /// "known answer (seal)", "round trip", "tamper: flipped tag byte"); `why` has the detail.
    #[error("cipher {cipher:?} failed its self-test, check {check:?}: {why}")]
    SelfTest { cipher: &'static str, check: &'static str, why: String },

    /// The system random number generator or the AEAD primitive failed for a reason that is not
    /// an authentication failure.
    #[error("cryptographic primitive failed: {0}")]
    Crypto(&'static str),
}

impl CryptError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CryptError::Io { path: path.into(), source }
    }
}
