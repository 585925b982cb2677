//! [`DocaCipher`]: chunk AES-256-GCM on the BlueField-3 crypto engine
//! (`doca_aes_gcm`), producing exactly the bytes [`RingCipher`](crate::RingCipher)
//! does. Only chunk sealing and opening move to the engine; the 32-byte
//! data-key wrap stays on ring.
//!
//! One engine serves the whole agent (tasks are serialised by a mutex); a
//! chunk is staged into DPU memory, processed and copied back, so the engine
//! needs no access to caller memory. Run [`crate::self_test`] on it at
//! start-up before trusting it with data.

use std::sync::Arc;

use sluice_doca::{AesGcmEngine, AesKey, Device};

use crate::cipher::{ChunkKey, Cipher, NONCE_LEN};
use crate::{CryptError, KEY_LEN, MAX_CHUNK_SIZE, TAG_LEN};

/// Most associated data a chunk carries (the format's is 37 bytes); the
/// self-test's vectors stay under this too.
const MAX_AAD: usize = 256;

/// The DOCA AES-GCM cipher.
pub struct DocaCipher {
    engine: AesGcmEngine,
    device: String,
}

impl std::fmt::Debug for DocaCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocaCipher").field("device", &self.device).finish()
    }
}

fn engine_err(what: &'static str) -> impl Fn(sluice_doca::Error) -> CryptError {
    move |e| {
        tracing::warn!(error = %e, what, "DOCA AES-GCM");
        CryptError::Crypto(what)
    }
}

impl DocaCipher {
    /// Starts an AES-GCM engine on `dev` for chunks up to the format's
    /// maximum chunk size.
    pub fn new(dev: &Arc<Device>) -> Result<Self, sluice_doca::Error> {
        let engine = AesGcmEngine::new(dev, MAX_CHUNK_SIZE as usize, MAX_AAD)?;
        Ok(Self { engine, device: format!("{:?}", dev.info()) })
    }
}

impl Cipher for DocaCipher {
    fn name(&self) -> &'static str {
        "doca"
    }

    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError> {
        let k = self.engine.key(key).map_err(engine_err("loading a key"))?;
        // Ring's key for the same bytes: it tells a refused tag from an engine fault.
        let ring = crate::RingCipher.chunk_key(key)?;
        Ok(Box::new(DocaChunkKey { key: k, engine: self.engine.clone(), ring }))
    }
}

/// A key loaded into the engine (the key keeps the engine's context alive
/// and is destroyed under its lock).
struct DocaChunkKey {
    key: AesKey,
    engine: AesGcmEngine,
    ring: Box<dyn ChunkKey>,
}

impl ChunkKey for DocaChunkKey {
    fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], ad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError> {
        self.engine.seal(&self.key, nonce, ad, data).map_err(engine_err("sealing a chunk"))
    }

    fn open_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptError> {
        match self.engine.open(&self.key, nonce, ad, data, tag) {
            Ok(()) => Ok(()),
            // Which code DOCA reports for a refused tag is not documented,
            // so a failed task is checked again on the CPU (`data` is
            // unchanged on failure): ring refusing it too means tampering;
            // ring accepting it means the engine is at fault, and the
            // chunk is served from ring's result.
            Err(sluice_doca::Error::Task { code, .. }) => match self.ring.open_in_place(nonce, ad, data, tag) {
                Err(_) => Err(CryptError::Integrity),
                Ok(()) => {
                    tracing::error!(%code, "the DOCA AES-GCM engine refused a chunk ring authenticates; served from ring");
                    Ok(())
                }
            },
            Err(other) => Err(engine_err("opening a chunk")(other)),
        }
    }
}
