//! The CUDA driver calls Sluice makes, as a trait: [`crate::LibCuda`] is
//! the real driver, [`crate::HostModel`] the software stand-in tests use.
//!
//! Calls that make CUDA touch host memory given by address, or use a
//! stream/event handle, are `unsafe`: CUDA reads and writes that memory
//! later, asynchronously, so the caller must keep it alive and registered
//! until the stream has passed the copy. The safe types ([`crate::Stream`],
//! [`crate::PinnedHost`], [`crate::DeviceBuffer`]) hold what they need for
//! that; nothing outside this crate calls these methods.

use std::fmt;
use std::os::fd::OwnedFd;

use crate::CudaError;

/// A device address (`CUdeviceptr`).
pub type DevicePtr = u64;

/// A stream handle (`CUstream`), opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(pub usize);

/// An event handle (`CUevent`), opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawEvent(pub usize);

/// `CUpointer_attribute` values (cuda.h).
pub(crate) const POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
pub(crate) const POINTER_ATTRIBUTE_DEVICE_ORDINAL: i32 = 9;
/// `CUresult` values Sluice tells apart.
pub const CUDA_SUCCESS: i32 = 0;
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
pub const CUDA_ERROR_NO_DEVICE: i32 = 100;
pub const CUDA_ERROR_INVALID_DEVICE: i32 = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;
pub const CUDA_ERROR_NOT_READY: i32 = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: i32 = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: i32 = 713;

/// `CUdevice_attribute` values Sluice reports (cuda.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Attribute {
    /// `cuMemHostRegister` works on this device (pinned staging).
    HostRegisterSupported = 99,
    /// A NIC can DMA to and from its memory (GPUDirect RDMA).
    GpuDirectRdmaSupported = 116,
    /// Its memory can be exported as a dma-buf (`cuMemGetHandleForAddressRange`).
    DmaBufSupported = 124,
}

/// `CUmemorytype`: where an address lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryType {
    Host,
    Device,
    Array,
    /// Managed (unified) memory: usable as a device region.
    Unified,
    Other(u32),
}

impl MemoryType {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            1 => Self::Host,
            2 => Self::Device,
            3 => Self::Array,
            4 => Self::Unified,
            other => Self::Other(other),
        }
    }
}

/// What CUDA says about an address of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    pub memory_type: MemoryType,
    /// The device ordinal (0 for host memory).
    pub device: u32,
    /// The allocation holding it: `[base, base + size)` (host memory: size 0).
    pub base: DevicePtr,
    pub size: u64,
}

/// The CUDA driver API calls Sluice makes. One value serves the whole
/// process; every method may be called from any thread. "Current device"
/// means the device whose primary context [`Driver::use_device`] made
/// current on the calling thread, as in CUDA.
pub trait Driver: Send + Sync + fmt::Debug {
    /// "cuda" or "host-model"; what doctor prints.
    fn name(&self) -> &str;
    /// Where the driver was loaded from ("" for the model).
    fn path(&self) -> &str;
    fn device_count(&self) -> Result<u32, CudaError>;
    fn device_name(&self, device: u32) -> Result<String, CudaError>;
    fn attribute(&self, device: u32, attr: Attribute) -> Result<i32, CudaError>;
    /// Whether `device`'s primary context is active: the process already
    /// uses that GPU, so pinning memory there creates no context.
    fn context_active(&self, device: u32) -> Result<bool, CudaError>;
    /// Retains `device`'s primary context (once) and makes it current on
    /// this thread.
    fn use_device(&self, device: u32) -> Result<(), CudaError>;
    /// Where `ptr` lives; [`CudaError::NotDeviceMemory`] for an address
    /// CUDA does not know in this process (another process's, freed, never
    /// allocated).
    fn pointer_info(&self, ptr: DevicePtr) -> Result<PointerInfo, CudaError>;
    /// `cuMemAlloc_v2` on the current device.
    fn mem_alloc(&self, len: usize) -> Result<DevicePtr, CudaError>;
    /// `cuMemFree_v2`.
    ///
    /// # Safety
    /// `ptr` came from [`Driver::mem_alloc`] of this driver and is freed once.
    unsafe fn mem_free(&self, ptr: DevicePtr) -> Result<(), CudaError>;
    /// `cuMemHostRegister_v2` (portable: pinned for every context).
    ///
    /// # Safety
    /// `[addr, addr + len)` is mapped, readable and writable memory that
    /// stays mapped until [`Driver::host_unregister`].
    unsafe fn host_register(&self, addr: *mut u8, len: usize) -> Result<(), CudaError>;
    /// `cuMemHostUnregister`.
    ///
    /// # Safety
    /// No copy from or to the range is still queued on any stream.
    unsafe fn host_unregister(&self, addr: *mut u8) -> Result<(), CudaError>;
    /// A non-blocking stream of the current device.
    fn stream_create(&self) -> Result<RawStream, CudaError>;
    /// # Safety
    /// `stream` came from [`Driver::stream_create`] and is destroyed once.
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<(), CudaError>;
    /// Waits until everything queued on `stream` is done.
    ///
    /// # Safety
    /// `stream` is a live handle of this driver.
    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<(), CudaError>;
    /// An event without timing, on the current device.
    fn event_create(&self) -> Result<RawEvent, CudaError>;
    /// # Safety
    /// `event` came from [`Driver::event_create`] and is destroyed once.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<(), CudaError>;
    /// Marks the point in `stream` the event stands for.
    ///
    /// # Safety
    /// Both are live handles of this driver, of the same device.
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), CudaError>;
    /// Whether the work before the event is done (never blocks).
    ///
    /// # Safety
    /// `event` is a live handle of this driver.
    unsafe fn event_query(&self, event: RawEvent) -> Result<bool, CudaError>;
    /// Waits for the work before the event.
    ///
    /// # Safety
    /// `event` is a live handle of this driver.
    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<(), CudaError>;
    /// `cuMemcpyHtoDAsync_v2`: queues a copy of `len` bytes from host `src`
    /// to device `dst`.
    ///
    /// # Safety
    /// `src` is readable for `len` bytes until the stream passes the copy
    /// (pinned memory: then the copy is truly asynchronous); `dst` is device
    /// memory of the stream's device; `stream` is live.
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError>;
    /// `cuMemcpyDtoHAsync_v2`: the mirror of [`Driver::memcpy_htod_async`].
    ///
    /// # Safety
    /// `dst` is writable for `len` bytes, and nothing else relies on its
    /// contents, until the stream passes the copy; `stream` is live.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError>;
    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a dma-buf of device
    /// memory (page-aligned `ptr` and `len`), for a NIC or DPU to map.
    fn dmabuf_fd(&self, ptr: DevicePtr, len: usize) -> Result<OwnedFd, CudaError>;
}
