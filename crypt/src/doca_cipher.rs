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
    /// The engine new chunk keys are loaded into; replaced when a task on
    /// it hung (a hung engine fails every later task, for every tenant).
    engine: std::sync::Mutex<AesGcmEngine>,
    dev: Arc<Device>,
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
        Ok(Self { engine: std::sync::Mutex::new(engine), dev: dev.clone(), device: format!("{:?}", dev.info()) })
    }

    /// The engine to load a key into: the current one, or a new one if a
    /// task hung on it; `None` if none can be made now (the caller then
    /// works on the CPU, which makes the same bytes).
    fn usable_engine(&self) -> Option<AesGcmEngine> {
        let mut current = self.engine.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.is_usable() {
            return Some(current.clone());
        }
        match AesGcmEngine::new(&self.dev, MAX_CHUNK_SIZE as usize, MAX_AAD) {
            Ok(fresh) => {
                tracing::warn!(device = %self.device, "a DOCA AES-GCM task hung; the engine was replaced");
                *current = fresh.clone();
                Some(fresh)
            }
            Err(e) => {
                tracing::warn!(error = %e, "replacing the hung DOCA AES-GCM engine failed; chunks go on the CPU");
                None
            }
        }
    }
}

impl Cipher for DocaCipher {
    fn name(&self) -> &'static str {
        "doca"
    }

    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError> {
        // Ring's key for the same bytes: it tells a refused tag from an
        // engine fault, and stands in for an engine that failed.
        let ring = crate::RingCipher.chunk_key(key)?;
        let Some(engine) = self.usable_engine() else { return Ok(ring) };
        let k = engine.key(key).map_err(engine_err("loading a key"))?;
        Ok(Box::new(DocaChunkKey { key: k, engine, ring }))
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
        match self.engine.seal(&self.key, nonce, ad, data) {
            Ok(tag) => Ok(tag),
            // `data` is unchanged when a task fails (the result is copied
            // back only on success): ring seals it to the same bytes.
            Err(e) => {
                engine_err("sealing a chunk")(e);
                self.ring.seal_in_place(nonce, ad, data)
            }
        }
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
            // The engine failed (a hung task, a dead engine): ring opens it.
            Err(other) => {
                engine_err("opening a chunk")(other);
                self.ring.open_in_place(nonce, ad, data, tag).map_err(|_| CryptError::Integrity)
            }
        }
    }
}
