//! Helpers shared by the integration tests.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sluice_crypt::{KeyId, MasterKey, MemoryKeyProvider};

/// Small chunks keep the tests fast while still producing multi-chunk objects.
pub const C: u32 = 4096;
pub const CU: usize = C as usize;

pub const TENANT: &str = "acme";
pub const BUCKET: &str = "photos";
pub const KEY: &str = "2024/cat.jpg";

/// A provider with tenant `acme` (key `k1`).
pub fn provider() -> MemoryKeyProvider {
    let p = MemoryKeyProvider::new();
    p.insert(TENANT, KeyId::new("k1").unwrap(), MasterKey::generate().unwrap()).unwrap();
    p
}

/// Deterministic, non-repeating-looking plaintext so misplaced bytes are noticed.
pub fn pattern(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9 ^ n as u32;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A scratch directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let unique = format!(
            "sluice-crypt-{name}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        );
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
