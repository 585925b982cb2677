//! The CUDA driver calls Sluice makes, loaded at run time.
//!
//! Sluice moves object bytes into GPU memory *in the process that owns
//! it*: the agent writes them into a pinned shared-memory staging lane (a
//! region like any other), and the client has the GPU's copy engines move
//! them from there into the caller's buffer, part by part while later parts
//! are still on the network. No daemon maps a client's GPU memory, so a
//! tenant can only ever fill or read memory its own process can address:
//! the check is CUDA's own ([`Cuda::device_span`]).
//!
//! Everything goes through the [`Driver`] trait. [`LibCuda`] is the NVIDIA
//! driver (`libcuda.so.1`, or `$SLUICE_LIBCUDA`, opened with `dlopen`:
//! nothing links CUDA at build time, and a machine without it gets
//! [`CudaError::NoDriver`]). [`HostModel`] is a software GPU whose device
//! memory is host memory and whose copies happen only when a stream or
//! event is synchronized, so tests without a GPU run the same code and
//! catch a staging half reused before its copy finished.
//!
//! The safe types own what CUDA needs to stay alive: [`PinnedHost`] holds
//! the memory it pinned, a [`Stream`] holds the pinned memory of its queued
//! copies until it synchronizes, [`DeviceBuffer`] frees on drop.

mod driver;
mod error;
mod handle;
mod libcuda;
mod memory;
mod model;
mod stream;

pub use driver::{
    Attribute, DevicePtr, Driver, MemoryType, PointerInfo, RawEvent, RawStream, CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_READY, CUDA_ERROR_NO_DEVICE,
};
pub use error::CudaError;
pub use handle::{Cuda, DeviceInfo};
pub use libcuda::{default_path, LibCuda, DEFAULT_LIBCUDA, LIBCUDA_ENV};
pub use memory::{DeviceBuffer, DeviceSpan, HostMemory, PinnedHost};
pub use model::HostModel;
pub use stream::{Event, Stream};

#[cfg(test)]
mod tests;
