//! A namespace's encryption settings: where its master keys come from, the
//! chunk cipher and the chunk size. The encrypted GET and PUT that use them
//! are in `crypto.rs`; building them from the config is in `setup.rs`.

use std::sync::Arc;

use sluice_crypt::KeyProvider;

/// A namespace's encryption settings.
pub struct Encryption {
    pub provider: Arc<dyn KeyProvider>,
    /// The AES-GCM implementation for chunks (ring or the DPU's engine).
    pub cipher: Arc<dyn sluice_crypt::Cipher>,
    /// Plaintext bytes per chunk for new objects.
    pub chunk_size: u32,
    /// Chunk sizes older objects were sealed with (see
    /// [`Self::size_from_listing`]).
    pub previous_chunk_sizes: Vec<u32>,
}

impl Encryption {
    /// The plaintext size of a listed object from its stored size alone,
    /// where that is unambiguous: every chunk size the namespace's objects
    /// were sealed with that can give this stored size gives the same
    /// plaintext size. `None`: only the object's metadata says (a stored
    /// size of 3 MiB + 120 + 3 tags is 3 MiB sealed in 1 MiB chunks and
    /// 3 MiB + 32 in 4 MiB ones).
    pub fn size_from_listing(&self, stored: u64) -> Option<u64> {
        let sizes = std::iter::once(self.chunk_size).chain(self.previous_chunk_sizes.iter().copied());
        let mut plain = sizes.filter_map(|c| sluice_crypt::plaintext_len(stored, c).ok());
        let first = plain.next()?;
        plain.all(|n| n == first).then_some(first)
    }
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryption")
            .field("chunk_size", &self.chunk_size)
            .field("previous_chunk_sizes", &self.previous_chunk_sizes)
            .field("cipher", &self.cipher.name())
            .finish_non_exhaustive()
    }
}
