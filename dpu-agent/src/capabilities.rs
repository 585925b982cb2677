//! Capability exchange: what a session can do, told to the shim when it
//! opens — the region memory the agent reaches (memfd, DOCA host export,
//! GPU dma-buf) and, per namespace, access, data path, transport,
//! placement, encryption and limits. The shim passes it on to its clients
//! and refuses what falls outside it before any byte moves; the agent
//! refuses the same things itself (a shim is not trusted to have checked).

use std::time::Duration;

use sluice_dataplane::TransportKind;

use crate::hostmem::{MemoryCaps, MemoryKind};
use crate::model::{DataPathMode, Permission, Placement};

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
    pub store_checksums: crate::s3::model::StoreChecksums,
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

#[cfg(test)]
mod tests {
    use super::*;

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
