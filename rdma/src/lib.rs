//! A safe wrapper over rdma-core verbs and rdma_cm for Sluice's verbs
//! transport: device list, context, protection domain, memory regions that
//! own or pin their memory (or are dma-bufs: GPU memory the NIC reaches
//! directly), completion queues driven by tokio, and RC queue pairs
//! connected with rdma_cm that post one-sided WRITE and READ.
//!
//! On a kernel without RDMA every entry point fails with
//! [`RdmaError::NoDevice`] instead of crashing.

mod cq;
pub mod dc;
pub mod dci;
mod device;
mod dmabuf;
mod error;
mod memory;
mod port;
mod qp;

pub use cq::CompletionQueue;
pub use cq::PostResult;
pub use device::{devices, DeviceInfo};
pub use dmabuf::DMABUF_UNSUPPORTED;
pub use error::{RdmaError, Result};
pub use memory::{Access, Buffer, Context, MemoryRegion, PinnedMemory, ProtectionDomain};
pub use port::{pick_ipv4_gid, GidEntry, PortInfo};
pub use qp::{Listener, QueuePair};

#[cfg(test)]
mod tests {
    /// Outside the Soft-RoCE VM (no RDMA in the kernel) the device list is a
    /// clear error, never a crash. Inside it, rxe0 is listed.
    #[test]
    fn no_device_is_a_clear_error_or_devices_are_listed() {
        match super::devices() {
            Ok(list) => assert!(!list.is_empty()),
            Err(super::RdmaError::NoDevice(why)) => assert!(!why.is_empty()),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
