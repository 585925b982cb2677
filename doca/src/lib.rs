//! Safe wrapper over the DOCA calls Sluice uses (`doca-sys`): devices,
//! memory maps with PCI export / import and RDMA re-export, buffer
//! inventories, DMA copies and AES-GCM tasks.
//!
//! Nothing here needs DOCA to build: the libraries are loaded at run time
//! ([`load`]); a machine without them gets a typed error naming what is
//! missing. Every DOCA object is owned by a Rust value that destroys it on
//! drop and holds an `Arc` of what it depends on (buffer -> mmap -> device
//! -> libraries). DOCA objects are not thread-safe: mmaps and inventories
//! serialise calls with a lock, engines take `&mut self`.
//!
//! [`export`] (the envelope the shim sends the agent) is plain Rust and is
//! what the agent checks before DOCA ever sees an import descriptor.

mod aes;
mod device;
mod engine;
mod error;
pub mod export;
mod mmap;
/// Test support (the DOCA test model in `doca/model`); not for production use.
#[doc(hidden)]
pub mod model;

pub use aes::{AesGcmEngine, AesKey, TaskLayout, IV_LEN, TAG_LEN};
pub use device::{list, load, load_from, Device, DeviceInfo, Lib};
pub use doca_sys::DocaErrorCode;
pub use engine::{DmaEngine, Staging, TASK_TIMEOUT};
pub use error::Error;
pub use export::{ExportEnvelope, MemoryKind};
pub use mmap::{Access, Buf, Inventory, Mmap};
