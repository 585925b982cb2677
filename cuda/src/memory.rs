//! Memory CUDA copies between: pinned host memory ([`PinnedHost`]), device
//! memory named by address and validated ([`DeviceSpan`]), and device
//! memory this crate allocated ([`DeviceBuffer`]).

use std::fmt;
use std::sync::Arc;

use crate::driver::DevicePtr;
use crate::{Cuda, CudaError};

/// Host memory that can be pinned and handed to CUDA's copy engines.
///
/// # Safety
/// `as_ptr()` is the start of `len()` bytes that stay mapped, readable and
/// writable at that address for as long as the value lives, and are freed
/// by nothing else. The bytes may be written by a copy engine at any time
/// while a copy is queued, so implementors never hand out references that
/// assume they do not change (access by copying, as `MappedRegion` does).
pub unsafe trait HostMemory: Send + Sync + fmt::Debug {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a MappedRegion's mapping stays at the same address, valid and
// writable (MAP_SHARED, PROT_READ|WRITE, its memfd sealed against
// shrinking), until the value is dropped; its own accessors copy through
// raw pointers, so copy-engine writes race with nothing Rust assumes.
unsafe impl HostMemory for sluice_shm::MappedRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn len(&self) -> usize {
        sluice_shm::MappedRegion::len(self) as usize
    }
}

/// Host memory registered with CUDA (`cuMemHostRegister`): copies from and
/// to it run at the copy engines' full speed and truly asynchronously.
/// Holds the memory, so it cannot be unmapped while pinned; unregisters on
/// drop. Streams hold an `Arc` of it while their copies are queued.
pub struct PinnedHost {
    cuda: Cuda,
    memory: Arc<dyn HostMemory>,
    addr: usize,
    len: usize,
    device: u32,
}

impl fmt::Debug for PinnedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHost").field("addr", &format_args!("{:#x}", self.addr)).field("len", &self.len).finish()
    }
}

impl PinnedHost {
    pub(crate) fn new(cuda: &Cuda, device: u32, memory: Arc<dyn HostMemory>) -> Result<Self, CudaError> {
        let (addr, len) = (memory.as_ptr(), memory.len());
        if len == 0 {
            return Err(CudaError::Invalid("cannot pin an empty range".into()));
        }
        cuda.driver().use_device(device)?;
        // SAFETY: `memory` stays mapped at `addr` for `len` bytes while it
        // lives (HostMemory), and we hold it until after unregistering.
        unsafe { cuda.driver().host_register(addr, len) }?;
        Ok(Self { cuda: cuda.clone(), memory, addr: addr as usize, len, device })
    }

    /// The pinned memory's address (what CUDA and a model see).
    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory it pins.
    pub fn memory(&self) -> &Arc<dyn HostMemory> {
        &self.memory
    }

    pub(crate) fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    pub(crate) fn check(&self, offset: u64, len: u64) -> Result<usize, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len as u64 => Ok(offset as usize),
            _ => Err(CudaError::Invalid(format!("window {offset}+{len} outside the {} pinned bytes", self.len))),
        }
    }

    /// Copies `data` into the pinned memory at `offset`. Do not call while
    /// a copy out of that window is queued.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), CudaError> {
        let at = self.check(offset, data.len() as u64)?;
        // SAFETY: `check` proved the window lies inside the live memory;
        // `data` is a separate Rust slice, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr as *mut u8).add(at), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the pinned memory.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), CudaError> {
        let at = self.check(offset, out.len() as u64)?;
        // SAFETY: bounds checked as in `write_at`; `out` is an exclusive
        // Rust slice distinct from the memory.
        unsafe { std::ptr::copy_nonoverlapping((self.addr as *const u8).add(at), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let d = self.cuda.driver();
        if let Err(e) = d.use_device(self.device) {
            tracing::warn!(error = %e, "unpinning host memory: no context");
        }
        // SAFETY: every stream that queued a copy with this memory holds an
        // Arc of `self` until it has synchronized, so none is queued now.
        if let Err(e) = unsafe { d.host_unregister(self.addr as *mut u8) } {
            tracing::warn!(error = %e, addr = self.addr, "cuMemHostUnregister failed");
        }
    }
}

/// A span of device memory of this process, checked with CUDA: it lies in
/// one live allocation of one device ([`Cuda::device_span`]). It names the
/// memory without owning it: the owner (torch, a [`DeviceBuffer`]) must
/// keep it allocated while transfers use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan {
    ptr: DevicePtr,
    len: u64,
    device: u32,
    /// Which driver checked it (a model's span is no use to libcuda).
    driver: usize,
}

impl DeviceSpan {
    pub(crate) fn new(ptr: DevicePtr, len: u64, device: u32, driver: usize) -> Self {
        Self { ptr, len, device, driver }
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    pub(crate) fn driver(&self) -> usize {
        self.driver
    }

    /// The part `[offset, offset + len)` of this span.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSpan, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Self { ptr: self.ptr + offset, len, ..*self }),
            _ => Err(CudaError::Invalid(format!("window {offset}+{len} outside the GPU region of {} bytes", self.len))),
        }
    }
}

/// Device memory allocated here (`cuMemAlloc`), freed on drop: what the
/// CLI reads objects into.
pub struct DeviceBuffer {
    cuda: Cuda,
    span: DeviceSpan,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer").field("span", &self.span).finish()
    }
}

impl DeviceBuffer {
    pub(crate) fn new(cuda: &Cuda, device: u32, len: u64) -> Result<Self, CudaError> {
        let n = usize::try_from(len).map_err(|_| CudaError::Invalid(format!("{len} bytes is too large")))?;
        if n == 0 {
            return Err(CudaError::Invalid("a device buffer needs at least one byte".into()));
        }
        cuda.driver().use_device(device)?;
        let ptr = cuda.driver().mem_alloc(n)?;
        Ok(Self { cuda: cuda.clone(), span: DeviceSpan::new(ptr, len, device, cuda.id()) })
    }

    /// All of it, as a span transfers can use.
    pub fn span(&self) -> DeviceSpan {
        self.span
    }

    pub fn ptr(&self) -> DevicePtr {
        self.span.ptr
    }

    pub fn len(&self) -> u64 {
        self.span.len
    }

    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    pub fn device(&self) -> u32 {
        self.span.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let d = self.cuda.driver();
        let _ = d.use_device(self.span.device);
        // SAFETY: the pointer came from mem_alloc in `new` and is freed only here.
        if let Err(e) = unsafe { d.mem_free(self.span.ptr) } {
            tracing::warn!(error = %e, "cuMemFree failed");
        }
    }
}
