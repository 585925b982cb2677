//! How the agent reaches host memory. One trait, several backends:
//!
//! * [`colocated`]: the agent runs on the host itself; the shim hands each
//!   region's memfd over a Unix socket and the agent maps it.
//! * DOCA (on a BlueField, later): the shim exports the region with
//!   `doca_mmap_export_pci`, the agent imports the blob.
//!
//! Every access is bounds-checked by the region.

pub mod colocated;

use std::sync::Arc;

use sluice_proto::common::ErrorCode;

/// Errors reaching host memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    #[error("access of {len} bytes at offset {offset} is outside the {region_len}-byte region")]
    OutOfBounds { offset: u64, len: u64, region_len: u64 },
    #[error("unknown or expired memory ticket; hand the fd over the memory socket first")]
    UnknownTicket,
    #[error("cannot map the region: {0}")]
    Map(String),
    #[error("{0}")]
    Unsupported(String),
}

impl MemError {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::OutOfBounds { .. } => ErrorCode::OutOfBounds,
            Self::UnknownTicket | Self::Map(_) | Self::Unsupported(_) => ErrorCode::BadRequest,
        }
    }
}

impl From<sluice_shm::ShmError> for MemError {
    fn from(e: sluice_shm::ShmError) -> Self {
        match e {
            sluice_shm::ShmError::OutOfBounds { offset, len, region_len } => {
                Self::OutOfBounds { offset, len, region_len }
            }
            other => Self::Map(other.to_string()),
        }
    }
}

/// A host memory region the agent can write object bytes into (GET) and
/// read them from (PUT).
pub trait HostRegion: Send + Sync + std::fmt::Debug {
    fn len(&self) -> u64;
    /// Regions are never empty (zero-length registration is refused).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError>;
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError>;

    /// Fails unless `[offset, offset+len)` lies inside the region.
    fn check(&self, offset: u64, len: u64) -> Result<(), MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(MemError::OutOfBounds { offset, len, region_len: self.len() }),
        }
    }
}

/// What the shim sends to make a region reachable.
#[derive(Debug)]
pub enum RegionExport {
    /// Co-located: a one-time ticket for an fd handed over the memory socket.
    Colocated { ticket: String },
    /// DPU: a `doca_mmap_export_pci` blob.
    Doca { blob: Vec<u8> },
}

/// A way of importing host regions.
pub trait HostMemory: Send + Sync {
    fn import(&self, export: RegionExport, len: u64) -> Result<Arc<dyn HostRegion>, MemError>;
}
