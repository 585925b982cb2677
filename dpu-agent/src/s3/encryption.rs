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
}

impl std::fmt::Debug for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encryption")
            .field("chunk_size", &self.chunk_size)
            .field("cipher", &self.cipher.name())
            .finish_non_exhaustive()
    }
}
