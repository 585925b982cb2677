//! Capability exchange: what a session can do, told to the shim when it
//! opens — the region memory the agent reaches (memfd, DOCA host export,
//! GPU dma-buf) and, per namespace, access, data path, transport,
//! placement, encryption and limits. The shim passes it on to its clients
//! and refuses what falls outside it before any byte moves; the agent
//! refuses the same things itself (a shim is not trusted to have checked).

use std::time::Duration;

use sluice_dataplane::TransportKind;

use crate::config::{DataPathMode, Permission, Placement};
use crate::hostmem::{MemoryCaps, MemoryKind};

/// Most parts of one multipart upload (S3's limit).
pub const MAX_PARTS: u64 = 10_000;

/// Largest S3 object (5 TiB).
pub const MAX_S3_OBJECT_BYTES: u64 = 5 << 40;

/// Largest single (not multipart) PUT S3 accepts (5 GiB).
pub const MAX_SINGLE_PUT_BYTES: u64 = 5 << 30;

/// One namespace's capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceCaps {
    pub name: String,
    pub access: Vec<Permission>,
    pub data_path: DataPathMode,
    /// The one-sided transport in use; `None`: HTTP only.
    pub transport: Option<TransportKind>,
    /// Why the configured transport is not the one in use.
    pub degraded: Option<String>,
    pub placement: Placement,
    pub encrypted: bool,
    /// Largest object a PUT may write.
    pub max_object_bytes: u64,
    /// Largest window one descriptor covers (0: HTTP only).
    pub max_window_bytes: u64,
    pub get_part_bytes: u64,
    pub put_part_bytes: u64,
    pub rdma_min_bytes: u64,
    pub request_timeout: Duration,
    /// What the store does with checksums, as learned so far.
    pub store_checksums: crate::s3::integrity::StoreChecksums,
}

/// What a session of one tenant can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Region memory the agent reaches, and how GPU memory is staged.
    pub memory: MemoryCaps,
    /// What the shim said it can register (echoed back).
    pub shim_memory: Vec<MemoryKind>,
    pub max_batch_items: u32,
    pub max_registered_bytes: u64,
    /// Sorted by name.
    pub namespaces: Vec<NamespaceCaps>,
}

impl Capabilities {
    /// Region kinds both sides can handle. Empty means no region can be
    /// registered in this session (logged when the session opens).
    pub fn usable_memory(&self) -> Vec<MemoryKind> {
        self.memory.kinds.iter().copied().filter(|k| self.shim_memory.contains(k)).collect()
    }
}

/// Largest object a PUT can write with these part sizes: a single PUT up
/// to `multipart_threshold`, else at most [`MAX_PARTS`] parts of
/// `part_bytes` (plaintext bytes per part for encrypted namespaces).
pub fn max_object_bytes(multipart_threshold: u64, part_bytes: u64) -> u64 {
    MAX_PARTS.saturating_mul(part_bytes).max(multipart_threshold).min(MAX_S3_OBJECT_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_object_follows_the_part_size() {
        // 8 MiB parts: 10,000 of them.
        assert_eq!(max_object_bytes(16 << 20, 8 << 20), 10_000 * (8 << 20));
        // 1 GiB parts would pass 5 TiB: S3's limit wins.
        assert_eq!(max_object_bytes(16 << 20, 1 << 30), MAX_S3_OBJECT_BYTES);
    }

    #[test]
    fn usable_memory_is_what_both_sides_handle() {
        let caps = |agent: Vec<MemoryKind>, shim: Vec<MemoryKind>| Capabilities {
            memory: MemoryCaps { kinds: agent, gpu_staging: None },
            shim_memory: shim,
            max_batch_items: 1,
            max_registered_bytes: 1,
            namespaces: vec![],
        };
        let doca = vec![MemoryKind::DocaHost, MemoryKind::GpuDmabuf];
        assert_eq!(caps(doca.clone(), doca.clone()).usable_memory(), doca);
        assert!(caps(vec![MemoryKind::Memfd], doca.clone()).usable_memory().is_empty());
        assert_eq!(
            caps(doca, vec![MemoryKind::DocaHost, MemoryKind::Memfd]).usable_memory(),
            vec![MemoryKind::DocaHost]
        );
    }
}
