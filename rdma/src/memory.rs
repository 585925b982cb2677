//! Context, protection domain and memory regions.
//!
//! Each C object is a `NonNull` newtype with `Drop`; children hold an `Arc`
//! to their parent (MR -> PD -> context), so teardown order follows the
//! type system. Registered memory is owned (or pinned) by the region, so
//! registration is a safe call.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_core_sys as sys;

use crate::error::{RdmaError, Result};

/// A device context. Contexts that rdma_cm opened are borrowed: they live
/// as long as the cm id kept in `_keep`.
pub struct Context {
    pub(crate) ptr: NonNull<sys::ibv_context>,
    owned: bool,
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs objects may be used from any thread; rdma-core documents
// the verbs API as thread safe.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only passes the pointer to thread-safe verbs.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("owned", &self.owned).finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the named device (e.g. "rxe0").
    pub fn open(name: &str) -> Result<Arc<Self>> {
        crate::device::devices()?;
        let mut n = 0i32;
        // SAFETY: see `device::devices`.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(RdmaError::NoDevice("ibv_get_device_list returned NULL".into()));
        }
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` entries, each a valid device.
            let dev = unsafe { *list.add(i) };
            // SAFETY: the name is a NUL-terminated string owned by `dev`.
            let dn = unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name(dev)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: `dev` is valid until the list is freed; the opened
                // context does not depend on the list afterwards.
                found = NonNull::new(unsafe { sys::ibv_open_device(dev) });
                break;
            }
        }
        // SAFETY: freed once; `found` does not borrow from it.
        unsafe { sys::ibv_free_device_list(list) };
        let ptr = found.ok_or_else(|| RdmaError::NoDevice(format!("device {name:?} not found or cannot be opened")))?;
        Ok(Arc::new(Self { ptr, owned: true, _keep: None }))
    }

    /// The device's name (`rxe0`, `mlx5_0`), for messages.
    pub fn device_name(&self) -> String {
        // SAFETY: a live context points at its device, whose name is a
        // NUL-terminated string libibverbs owns for as long as the context.
        unsafe {
            let dev = (*self.ptr.as_ptr()).device;
            if dev.is_null() {
                return "unknown device".into();
            }
            std::ffi::CStr::from_ptr(sys::ibv_get_device_name(dev)).to_string_lossy().into_owned()
        }
    }

    /// A context rdma_cm opened for a cm id; valid while `keep` lives.
    pub(crate) fn borrowed(
        ptr: *mut sys::ibv_context,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Arc<Self>> {
        let ptr = NonNull::new(ptr).ok_or_else(|| RdmaError::Invalid("cm id has no device context".into()))?;
        Ok(Arc::new(Self { ptr, owned: false, _keep: Some(keep) }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we opened it; every child holds an Arc to us, so none is alive.
            unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
        }
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    pub(crate) ptr: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs are thread safe (rdma-core); the PD is only passed to verbs.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: ctx is a live context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(pd).ok_or_else(|| RdmaError::last_os("ibv_alloc_pd"))?;
        Ok(Arc::new(Self { ptr, ctx: ctx.clone() }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The `struct ibv_pd *`, for other stacks that build on a verbs PD
    /// (DOCA's RDMA bridge). Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by us; MRs and QPs hold an Arc to us, so none remains.
        unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// Memory that stays at a fixed address while registered.
///
/// # Safety
/// `as_ptr()..as_ptr()+len()` must stay valid, mapped and at the same
/// address for as long as the value lives, and may be written by the NIC at
/// any time while registered for remote write.
pub unsafe trait PinnedMemory: Send + Sync {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A heap buffer for registration. Access is by copy (the NIC may write it
/// concurrently), never through Rust references.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain heap memory owned by this value; accessed by copies only.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn zeroed(len: usize) -> Arc<Self> {
        let b: Box<[u8]> = vec![0u8; len.max(1)].into_boxed_slice();
        let len = b.len();
        let ptr = NonNull::new(Box::into_raw(b).cast::<u8>()).expect("Box pointers are non-null");
        Arc::new(Self { ptr, len })
    }

    fn check(&self, off: usize, n: usize) -> Result<()> {
        match off.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RdmaError::Invalid(format!("{n} bytes at {off} outside a {}-byte buffer", self.len))),
        }
    }

    pub fn write_at(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        // SAFETY: bounds checked; `data` is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len()) };
        Ok(())
    }

    pub fn read_at(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len())?;
        // SAFETY: bounds checked; `out` is a distinct exclusive Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // In bounds by construction.
        let _ = self.read_at(0, &mut v);
        v
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from Box::into_raw of a boxed slice of this length.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
    }
}

// SAFETY: a Buffer's allocation never moves or shrinks while it lives.
unsafe impl PinnedMemory for Buffer {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: a MappedRegion's mapping stays at the same address, valid and
// writable (MAP_SHARED, PROT_READ|WRITE), until the value is dropped; its own
// accessors copy through raw pointers, so NIC writes race with nothing Rust
// assumes about the bytes.
unsafe impl PinnedMemory for sluice_shm::MappedRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn len(&self) -> usize {
        sluice_shm::MappedRegion::len(self) as usize
    }
}

/// Which remote operations a region allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub remote_write: bool,
    pub remote_read: bool,
}

impl Access {
    pub const LOCAL: Self = Self { remote_write: false, remote_read: false };
    pub const REMOTE_WRITE: Self = Self { remote_write: true, remote_read: false };
    pub const REMOTE_READ: Self = Self { remote_write: false, remote_read: true };
    pub const REMOTE_ALL: Self = Self { remote_write: true, remote_read: true };

    pub(crate) fn flags(self) -> i32 {
        let mut f = sys::IBV_ACCESS_LOCAL_WRITE;
        if self.remote_write {
            f |= sys::IBV_ACCESS_REMOTE_WRITE;
        }
        if self.remote_read {
            f |= sys::IBV_ACCESS_REMOTE_READ;
        }
        f as i32
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The rkey is a credential: keep it out of logs.
        f.debug_struct("MemoryRegion").field("len", &self.len()).finish_non_exhaustive()
    }
}

/// What a region's keys reach: host memory the wrapper keeps pinned, or a
/// dma-buf (GPU memory) the kernel holds its own reference to. Held for the
/// region's lifetime, never read.
pub(crate) enum Backing {
    Host(#[allow(dead_code)] Arc<dyn PinnedMemory>),
    /// The kernel took its own reference to the dma-buf at registration;
    /// the descriptor is kept anyway so the exporter's buffer visibly
    /// outlives every key to it.
    Dmabuf(#[allow(dead_code)] Arc<std::os::fd::OwnedFd>),
}

/// A registered memory region; it keeps its memory and PD alive.
pub struct MemoryRegion {
    pub(crate) ptr: NonNull<sys::ibv_mr>,
    pub(crate) _backing: Backing,
    pub(crate) _pd: Arc<ProtectionDomain>,
    /// The address remotes use for the first registered byte: the host
    /// address of the window, or the IOVA a dma-buf was registered at.
    pub(crate) addr: u64,
    pub(crate) len: usize,
}

// SAFETY: verbs are thread safe (rdma-core); the MR's keys are plain data.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers all of `mem`.
    pub fn register(pd: &Arc<ProtectionDomain>, mem: Arc<dyn PinnedMemory>, access: Access) -> Result<Arc<Self>> {
        // SAFETY: the PinnedMemory contract keeps [ptr, ptr+len) valid and
        // fixed while `mem` lives, and the MR holds `mem` until deregistered.
        let mr = unsafe { sys::ibv_reg_mr(pd.ptr.as_ptr(), mem.as_ptr().cast(), mem.len(), access.flags()) };
        let ptr = NonNull::new(mr).ok_or_else(|| RdmaError::last_os("ibv_reg_mr"))?;
        let (addr, len) = (mem.as_ptr() as u64, mem.len());
        Ok(Arc::new(Self { ptr, _backing: Backing::Host(mem), _pd: pd.clone(), addr, len }))
    }

    /// Registers `[offset, offset+len)` of `mem` only: a remote holding this
    /// region's rkey can reach nothing outside that window.
    pub fn register_range(
        pd: &Arc<ProtectionDomain>,
        mem: Arc<dyn PinnedMemory>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Arc<Self>> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(RdmaError::Invalid(format!("window {offset}+{len} outside a {}-byte memory", mem.len())));
        }
        // SAFETY: the window lies inside `mem` (checked), which the PinnedMemory
        // contract keeps valid and fixed while the MR holds it.
        let mr = unsafe { sys::ibv_reg_mr(pd.ptr.as_ptr(), mem.as_ptr().add(offset).cast(), len, access.flags()) };
        let ptr = NonNull::new(mr).ok_or_else(|| RdmaError::last_os("ibv_reg_mr"))?;
        let addr = mem.as_ptr() as u64 + offset as u64;
        Ok(Arc::new(Self { ptr, _backing: Backing::Host(mem), _pd: pd.clone(), addr, len }))
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: ptr is a live MR.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: ptr is a live MR.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }
    /// Address of the first registered byte (what remotes use with the rkey).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> u64 {
        self.len as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by us and deregistered once; the backing memory
        // is dropped after (fields drop after `drop` returns).
        unsafe { sys::ibv_dereg_mr(self.ptr.as_ptr()) };
    }
}
