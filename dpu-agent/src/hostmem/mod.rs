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

pub use sluice_dataplane::{MemError, RegionMemory as HostRegion};

/// The typed code for a memory error.
pub fn mem_code(e: &MemError) -> ErrorCode {
    match e {
        MemError::OutOfBounds { .. } => ErrorCode::OutOfBounds,
        _ => ErrorCode::BadRequest,
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
