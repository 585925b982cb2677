//! [`Cuda`]: the process's CUDA driver (real or model) and the safe calls
//! Sluice makes with it.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::driver::{Attribute, DevicePtr, Driver, MemoryType};
use crate::libcuda::{default_path, LibCuda};
use crate::memory::{DeviceBuffer, DeviceSpan, HostMemory, PinnedHost};
use crate::stream::{Event, Stream};
use crate::CudaError;

/// A handle on a CUDA driver, cheap to clone. Everything made with it
/// (pins, streams, buffers) holds a clone, so the driver outlives them.
#[derive(Clone)]
pub struct Cuda {
    driver: Arc<dyn Driver>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("driver", &self.driver.name()).finish()
    }
}

/// What doctor reports about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    /// `cuMemHostRegister` works (pinned staging lanes).
    pub host_register: bool,
    /// GPUDirect RDMA: a NIC may DMA into its memory.
    pub gpudirect_rdma: bool,
    /// Its memory exports as a dma-buf.
    pub dma_buf: bool,
}

impl Cuda {
    /// The NVIDIA driver: `$SLUICE_LIBCUDA`, else `libcuda.so.1`.
    pub fn load() -> Result<Self, CudaError> {
        Ok(Self::new(Arc::new(LibCuda::load()?)))
    }

    /// The driver library at `path`.
    pub fn load_from(path: impl AsRef<OsStr>) -> Result<Self, CudaError> {
        Ok(Self::new(Arc::new(LibCuda::load_from(path.as_ref())?)))
    }

    /// The driver only if this process has already loaded it (`path`, else
    /// the default); never loads CUDA into a process that does not use it.
    pub fn load_if_in_use(path: Option<&OsStr>) -> Result<Option<Self>, CudaError> {
        let path = path.map_or_else(default_path, ToOwned::to_owned);
        Ok(LibCuda::load_if_in_use(&path)?.map(|d| Self::new(Arc::new(d))))
    }

    /// Any driver, e.g. a [`crate::HostModel`] in tests.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self { driver }
    }

    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// "cuda" or "host-model".
    pub fn name(&self) -> &str {
        self.driver.name()
    }

    /// Identity of the driver (spans and pins remember who checked them).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.driver).cast::<()>() as usize
    }

    pub fn device_count(&self) -> Result<u32, CudaError> {
        self.driver.device_count()
    }

    /// A device's name and the attributes Sluice's GPU paths depend on.
    pub fn device(&self, ordinal: u32) -> Result<DeviceInfo, CudaError> {
        let d = &self.driver;
        Ok(DeviceInfo {
            ordinal,
            name: d.device_name(ordinal)?,
            host_register: d.attribute(ordinal, Attribute::HostRegisterSupported)? != 0,
            gpudirect_rdma: d.attribute(ordinal, Attribute::GpuDirectRdmaSupported)? != 0,
            dma_buf: d.attribute(ordinal, Attribute::DmaBufSupported)? != 0,
        })
    }

    /// The first device whose primary context is active: the GPU this
    /// process already uses, if any.
    pub fn active_device(&self) -> Result<Option<u32>, CudaError> {
        for d in 0..self.driver.device_count()? {
            if self.driver.context_active(d)? {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// Checks that `[ptr, ptr + len)` is device memory of this process,
    /// inside one live allocation (of `device`, if given): CUDA's own
    /// answer, so another process's address, freed memory and host memory
    /// are refused ([`CudaError::is_bad_request`]).
    pub fn device_span(&self, ptr: DevicePtr, len: u64, device: Option<u32>) -> Result<DeviceSpan, CudaError> {
        if len == 0 {
            return Err(CudaError::Invalid("a GPU region needs at least one byte".into()));
        }
        let info = self.driver.pointer_info(ptr)?;
        match info.memory_type {
            MemoryType::Device | MemoryType::Unified => {}
            MemoryType::Host => {
                return Err(CudaError::Invalid(format!(
                    "address {ptr:#x} is host memory, not GPU memory (register it as a host region)"
                )))
            }
            other => {
                return Err(CudaError::Invalid(format!(
                    "address {ptr:#x} is {other:?} memory, not a linear device allocation"
                )))
            }
        }
        if let Some(want) = device.filter(|d| *d != info.device) {
            return Err(CudaError::Invalid(format!(
                "the memory is on cuda:{}, not cuda:{want} as described",
                info.device
            )));
        }
        let fits = ptr.checked_add(len).is_some_and(|end| end <= info.base.saturating_add(info.size));
        if !fits {
            return Err(CudaError::Invalid(format!(
                "{len} bytes at {ptr:#x} run past the end of their allocation ({} bytes at {:#x})",
                info.size, info.base
            )));
        }
        Ok(DeviceSpan::new(ptr, len, info.device, self.id()))
    }

    /// `len` bytes of device memory on `device` (`cuMemAlloc`).
    pub fn alloc(&self, device: u32, len: u64) -> Result<DeviceBuffer, CudaError> {
        DeviceBuffer::new(self, device, len)
    }

    /// Pins `memory` for CUDA (`cuMemHostRegister`, portable to every
    /// context), with `device`'s context current.
    pub fn pin(&self, device: u32, memory: Arc<dyn HostMemory>) -> Result<Arc<PinnedHost>, CudaError> {
        Ok(Arc::new(PinnedHost::new(self, device, memory)?))
    }

    /// `len` bytes of new pinned host memory: a memfd mapping, the kind of
    /// memory a staging lane is.
    pub fn pinned_buffer(&self, device: u32, len: u64) -> Result<Arc<PinnedHost>, CudaError> {
        let map = sluice_shm::MappedRegion::create("sluice-cuda-pinned", len)
            .map_err(|e| CudaError::Invalid(format!("host memory for pinning: {e}")))?;
        self.pin(device, Arc::new(map))
    }

    pub fn stream(&self, device: u32) -> Result<Stream, CudaError> {
        Stream::new(self, device)
    }

    pub fn event(&self, device: u32) -> Result<Event, CudaError> {
        Event::new(self, device)
    }

    /// A dma-buf of the span (`cuMemGetHandleForAddressRange`); the span
    /// must be page-aligned at both ends.
    pub fn dmabuf(&self, span: &DeviceSpan) -> Result<OwnedFd, CudaError> {
        if span.driver() != self.id() {
            return Err(CudaError::Invalid("the GPU region was checked by another CUDA driver".into()));
        }
        self.driver.use_device(span.device())?;
        self.driver.dmabuf_fd(span.ptr(), span.len() as usize)
    }
}
