//! Sluice inline encryption: the chunked AES-256-GCM object format (v1), envelope encryption of
//! per-object data keys under tenant master keys, and key providers.
//!
//! The byte format is specified in `docs/encryption-format.md`. In short, a stored object is a
//! fixed-size header followed by independently sealed chunks; each chunk's associated data binds
//! it to its index, to whether it is the final chunk, to the complete header and to the object's
//! bucket/key, so chunks cannot be reordered, dropped, truncated or moved between objects.
//!
//! Typical agent flow:
//! * PUT: [`ObjectSealer::new`] → store the header, then [`ObjectSealer::seal_chunk`] (or the
//!   in-place variants) for every chunk, in any order or in parallel; store
//!   [`ObjectSealer::metadata`] as user metadata.
//! * GET: [`Metadata::from_pairs`] → [`Metadata::plan_range`] for a ranged read → fetch the header
//!   and the planned bytes → [`ObjectOpener::new`] → [`ObjectOpener::open_range`] (or
//!   [`ObjectOpener::open_chunk`] per chunk after [`ObjectOpener::check_metadata`]).
//!
//! Chunk encryption is pluggable: the [`Cipher`] trait (keys prepared as [`ChunkKey`]s) is
//! AES-256-GCM with a 96-bit nonce and a 128-bit tag, in place. [`RingCipher`] (software, `ring`)
//! is the default; a hardware implementation is passed to [`ObjectSealer::new_with_cipher`] /
//! [`ObjectOpener::new_with_cipher`] after it passes [`self_test`]. The stored bytes do not depend
//! on the implementation, so objects sealed by one open with any other. The per-object data-key
//! wrap in the header always uses ring.

#![forbid(unsafe_code)]

mod bench;
mod cipher;
#[cfg(feature = "doca")]
mod doca_cipher;
mod error;
mod file_provider;
mod header;
mod keys;
mod layout;
mod metadata;
mod object;

pub use bench::aes_gcm_throughput;
pub use cipher::{self_test, ChunkKey, Cipher, RingCipher, NONCE_LEN};
#[cfg(feature = "doca")]
pub use doca_cipher::DocaCipher;
pub use error::CryptError;
pub use file_provider::{FileKeyProvider, DEFAULT_CURRENT_TTL};
pub use header::{FORMAT_VERSION, HEADER_LEN, MAGIC};
pub use keys::{
    check_tenant, KeyId, KeyProvider, MasterKey, MemoryKeyProvider, KEY_ID_MAX_LEN, KEY_LEN, TENANT_MAX_LEN,
};
pub use layout::{
    check_chunk_size, ciphertext_len, plaintext_len, plan_range, Layout, RangePlan, DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE, TAG_LEN,
};
pub use metadata::{EncryptionPolicy, Metadata, META_CHUNK, META_ENC, META_KEY_ID, META_PLAIN_SIZE};
pub use object::{open_object, seal_object, ObjectOpener, ObjectSealer};
