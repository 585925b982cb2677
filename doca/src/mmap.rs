//! Memory maps (local, dma-buf, imported from a PCI export) and buffers.

use std::any::Any;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use doca_sys as sys;

use crate::device::Device;
use crate::error::{check, Error};

/// What a peer may do with an mmap (`DOCA_ACCESS_FLAG_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_READ_WRITE: Access = Access(sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
    /// The DPU may read and write it over PCIe (host regions for the agent).
    pub const PCI_READ_WRITE: Access = Access(sys::DOCA_ACCESS_FLAG_PCI_READ_WRITE);
    pub const RDMA_WRITE: Access = Access(sys::DOCA_ACCESS_FLAG_RDMA_WRITE);
    pub const RDMA_READ: Access = Access(sys::DOCA_ACCESS_FLAG_RDMA_READ);

    pub fn and(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

/// Where an mmap's memory came from; keeps it alive as long as DOCA maps it.
enum Backing {
    /// Memory this process owns (kept alive by the boxed owner).
    Local(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// A dma-buf fd (GPU memory); the fd stays open while mapped.
    Dmabuf(#[allow(dead_code)] OwnedFd),
    /// Another function's memory imported from its export descriptor.
    Imported,
}

/// A started `doca_mmap`. Calls that take it (exports, buffer creation,
/// memory keys) hold its internal lock: DOCA objects are not thread-safe
/// unless documented otherwise.
pub struct Mmap {
    dev: Arc<Device>,
    ptr: NonNull<sys::doca_mmap>,
    addr: usize,
    len: usize,
    lock: Mutex<()>,
    _backing: Backing,
}

// SAFETY: every DOCA call on the handle holds `lock` (exports here,
// `Inventory::buf`, `Buf::mkey`) or is in Drop (exclusive); the memory
// behind it is kept alive by `_backing`.
unsafe impl Send for Mmap {}
// SAFETY: as above.
unsafe impl Sync for Mmap {}

impl std::fmt::Debug for Mmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mmap").field("addr", &format_args!("{:#x}", self.addr)).field("len", &self.len).finish()
    }
}

/// Destroys an mmap that failed half-way through set-up.
struct Unstarted<'a>(&'a Device, *mut sys::doca_mmap);

impl Drop for Unstarted<'_> {
    fn drop(&mut self) {
        if !self.1.is_null() {
            // SAFETY: created by doca_mmap_create and not handed out.
            unsafe { self.0.lib().common.doca_mmap_destroy(self.1) };
        }
    }
}

impl Unstarted<'_> {
    fn finish(mut self) -> Result<NonNull<sys::doca_mmap>, Error> {
        let p = std::mem::replace(&mut self.1, std::ptr::null_mut());
        NonNull::new(p).ok_or(Error::Invalid("doca_mmap_create returned NULL".into()))
    }
}

impl Mmap {
    fn create<'d>(dev: &'d Device) -> Result<Unstarted<'d>, Error> {
        let mut m = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; destroyed by Unstarted on failure.
        check("doca_mmap_create", unsafe { dev.lib().common.doca_mmap_create(&mut m) })?;
        Ok(Unstarted(dev, m))
    }

    fn finish_local(
        dev: &Arc<Device>,
        u: Unstarted<'_>,
        access: Access,
        addr: usize,
        len: usize,
        backing: Backing,
    ) -> Result<Arc<Self>, Error> {
        let c = &dev.lib().common;
        // SAFETY: `u.1` is a fresh, unstarted mmap; `dev` is live.
        unsafe {
            check("doca_mmap_set_permissions", c.doca_mmap_set_permissions(u.1, access.0))?;
            check("doca_mmap_add_dev", c.doca_mmap_add_dev(u.1, dev.as_ptr()))?;
            check("doca_mmap_start", c.doca_mmap_start(u.1))?;
        }
        let ptr = u.finish()?;
        Ok(Arc::new(Self { dev: dev.clone(), ptr, addr, len, lock: Mutex::new(()), _backing: backing }))
    }

    /// Maps memory of this process.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay valid and at the same address while
    /// `owner` lives (the mmap keeps `owner`), and may be written by the
    /// device at any time.
    pub unsafe fn local(
        dev: &Arc<Device>,
        ptr: *mut u8,
        len: usize,
        access: Access,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Arc<Self>, Error> {
        if ptr.is_null() || len == 0 {
            return Err(Error::Invalid("an mmap needs a non-empty range".into()));
        }
        let u = Self::create(dev)?;
        // SAFETY: the caller guarantees the range (see above).
        check("doca_mmap_set_memrange", unsafe {
            dev.lib().common.doca_mmap_set_memrange(u.1, ptr.cast::<c_void>(), len)
        })?;
        Self::finish_local(dev, u, access, ptr as usize, len, Backing::Local(owner))
    }

    /// Maps memory pinned at a fixed address (a shim's shared-memory
    /// region); the mmap keeps `mem` alive.
    pub fn pinned(
        dev: &Arc<Device>,
        mem: Arc<dyn sluice_rdma::PinnedMemory>,
        access: Access,
    ) -> Result<Arc<Self>, Error> {
        let (ptr, len) = (mem.as_ptr(), mem.len());
        // SAFETY: PinnedMemory guarantees the range stays valid and in place
        // while `mem` lives, and allows device writes; the mmap owns `mem`.
        unsafe { Self::local(dev, ptr, len, access, Box::new(mem)) }
    }

    /// Maps `len` bytes at `offset` of a dma-buf (GPU memory exported by
    /// CUDA's `cuMemGetHandleForAddressRange`). `gpu_addr` is the CUDA
    /// virtual address of the range (DOCA records it for the peer).
    pub fn dmabuf(
        dev: &Arc<Device>,
        fd: OwnedFd,
        offset: usize,
        len: usize,
        gpu_addr: u64,
        access: Access,
    ) -> Result<Arc<Self>, Error> {
        if len == 0 {
            return Err(Error::Invalid("an mmap needs a non-empty range".into()));
        }
        let u = Self::create(dev)?;
        // SAFETY: a fresh mmap; the fd is owned by the Backing we store, so it
        // stays open as long as DOCA may use it.
        check("doca_mmap_set_dmabuf_memrange", unsafe {
            dev.lib().common.doca_mmap_set_dmabuf_memrange(
                u.1,
                fd.as_raw_fd(),
                gpu_addr as usize as *mut c_void,
                offset,
                len,
            )
        })?;
        Self::finish_local(dev, u, access, gpu_addr as usize, len, Backing::Dmabuf(fd))
    }

    /// Imports another function's memory from its `export_pci` descriptor.
    pub fn import(dev: &Arc<Device>, descriptor: &[u8]) -> Result<Arc<Self>, Error> {
        let c = &dev.lib().common;
        let mut m = std::ptr::null_mut();
        // SAFETY: the descriptor is a byte slice read by DOCA (which validates
        // it); out-pointer to a local; NULL user data is allowed.
        check("doca_mmap_create_from_export", unsafe {
            c.doca_mmap_create_from_export(
                std::ptr::null(),
                descriptor.as_ptr().cast::<c_void>(),
                descriptor.len(),
                dev.as_ptr(),
                &mut m,
            )
        })?;
        let ptr = NonNull::new(m).ok_or(Error::Invalid("doca_mmap_create_from_export returned NULL".into()))?;
        let (mut addr, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a live imported mmap; out-pointers to locals.
        let rc = unsafe { c.doca_mmap_get_memrange(ptr.as_ptr(), &mut addr, &mut len) };
        let me =
            Self { dev: dev.clone(), ptr, addr: addr as usize, len, lock: Mutex::new(()), _backing: Backing::Imported };
        check("doca_mmap_get_memrange", rc)?;
        Ok(Arc::new(me))
    }

    fn export(&self, call: &'static str, rdma: bool) -> Result<Vec<u8>, Error> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let (mut desc, mut len) = (std::ptr::null(), 0usize);
        let c = &self.dev.lib().common;
        // SAFETY: a live, started mmap and device; out-pointers to locals.
        let rc = unsafe {
            if rdma {
                c.doca_mmap_export_rdma(self.ptr.as_ptr(), self.dev.as_ptr(), &mut desc, &mut len)
            } else {
                c.doca_mmap_export_pci(self.ptr.as_ptr(), self.dev.as_ptr(), &mut desc, &mut len)
            }
        };
        check(call, rc)?;
        if desc.is_null() || len == 0 {
            return Err(Error::Invalid(format!("{call} returned an empty descriptor")));
        }
        // SAFETY: DOCA returns `len` readable bytes owned by the mmap, valid
        // until it is destroyed; we copy them out under the lock.
        Ok(unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), len) }.to_vec())
    }

    /// The descriptor the DPU imports (`doca_mmap_export_pci`).
    pub fn export_pci(&self) -> Result<Vec<u8>, Error> {
        self.export("doca_mmap_export_pci", false)
    }

    /// A descriptor an RDMA peer can use (`doca_mmap_export_rdma`).
    pub fn export_rdma(&self) -> Result<Vec<u8>, Error> {
        self.export("doca_mmap_export_rdma", true)
    }

    /// Start address of the mapped range (the exporter's virtual address
    /// for an imported mmap).
    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::doca_mmap {
        self.ptr.as_ptr()
    }

    /// Fails unless `[offset, offset + len)` lies in the range.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Invalid(format!("{len} bytes at {offset} outside a {}-byte mmap", self.len))),
        }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        let c = &self.dev.lib().common;
        // SAFETY: exclusive access in Drop; buffers over this mmap hold an
        // Arc to it, so none remains. Stop then destroy, as DOCA requires.
        unsafe {
            c.doca_mmap_stop(self.ptr.as_ptr());
            c.doca_mmap_destroy(self.ptr.as_ptr());
        }
    }
}

/// A started buffer inventory. Taking and returning buffers is serialised
/// by an internal lock.
pub struct Inventory {
    dev: Arc<Device>,
    ptr: NonNull<sys::doca_buf_inventory>,
    lock: Mutex<()>,
}

// SAFETY: every call on the handle is made under `lock` (or in Drop).
unsafe impl Send for Inventory {}
// SAFETY: as above.
unsafe impl Sync for Inventory {}

impl Inventory {
    pub fn new(dev: &Arc<Device>, elements: usize) -> Result<Arc<Self>, Error> {
        let c = &dev.lib().common;
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("doca_buf_inventory_create", unsafe { c.doca_buf_inventory_create(elements, &mut p) })?;
        let ptr = NonNull::new(p).ok_or(Error::Invalid("doca_buf_inventory_create returned NULL".into()))?;
        let me = Self { dev: dev.clone(), ptr, lock: Mutex::new(()) };
        // SAFETY: a fresh inventory (destroyed by Drop if starting fails).
        check("doca_buf_inventory_start", unsafe { c.doca_buf_inventory_start(ptr.as_ptr()) })?;
        Ok(Arc::new(me))
    }

    /// A buffer over `[mmap.addr + offset, + len)` whose data is the first
    /// `data_len` bytes (0 for a destination, `len` for a source).
    pub fn buf(self: &Arc<Self>, mmap: &Arc<Mmap>, offset: usize, len: usize, data_len: usize) -> Result<Buf, Error> {
        mmap.check(offset, len)?;
        if data_len > len {
            return Err(Error::Invalid(format!("data of {data_len} bytes in a {len}-byte buffer")));
        }
        let addr = (mmap.addr + offset) as *mut c_void;
        let mut b = std::ptr::null_mut();
        // Both objects take part in the call: hold both locks (always in
        // this order: inventory, then mmap).
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _m = mmap.lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: live inventory and mmap; the range was checked to lie in the mmap.
        check("doca_buf_inventory_buf_get_by_args", unsafe {
            self.dev.lib().common.doca_buf_inventory_buf_get_by_args(
                self.ptr.as_ptr(),
                mmap.as_ptr(),
                addr,
                len,
                addr,
                data_len,
                &mut b,
            )
        })?;
        let ptr = NonNull::new(b).ok_or(Error::Invalid("buf_get_by_args returned NULL".into()))?;
        Ok(Buf { inv: self.clone(), ptr, _mmap: mmap.clone() })
    }
}

impl Drop for Inventory {
    fn drop(&mut self) {
        let c = &self.dev.lib().common;
        // SAFETY: buffers hold an Arc to the inventory, so none is outstanding.
        unsafe {
            c.doca_buf_inventory_stop(self.ptr.as_ptr());
            c.doca_buf_inventory_destroy(self.ptr.as_ptr());
        }
    }
}

/// A buffer from an inventory; returned to it on drop.
pub struct Buf {
    inv: Arc<Inventory>,
    ptr: NonNull<sys::doca_buf>,
    _mmap: Arc<Mmap>,
}

// SAFETY: the buffer is used by one task at a time, and returned to its
// inventory under the inventory's lock.
unsafe impl Send for Buf {}
// SAFETY: the accessors only read the descriptor.
unsafe impl Sync for Buf {}

impl Buf {
    pub(crate) fn as_ptr(&self) -> *mut sys::doca_buf {
        self.ptr.as_ptr()
    }

    /// The valid bytes: (address, length).
    pub fn data(&self) -> Result<(usize, usize), Error> {
        let c = &self.inv.dev.lib().common;
        let (mut p, mut n) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a live buffer; out-pointers to locals.
        unsafe {
            check("doca_buf_get_data", c.doca_buf_get_data(self.ptr.as_ptr(), &mut p))?;
            check("doca_buf_get_data_len", c.doca_buf_get_data_len(self.ptr.as_ptr(), &mut n))?;
        }
        Ok((p as usize, n))
    }

    /// The memory key of this buffer on `dev` (RDMA bridge), for verbs
    /// work requests on the PD `dev` was opened from.
    pub fn mkey(&self, dev: &Device) -> Result<u32, Error> {
        let _g = self.inv.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _m = self._mmap.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut k = 0u32;
        // SAFETY: a live buffer and device; out-pointer to a local.
        check("doca_rdma_bridge_get_buf_mkey", unsafe {
            self.inv.dev.lib().common.doca_rdma_bridge_get_buf_mkey(self.ptr.as_ptr(), dev.as_ptr(), &mut k)
        })?;
        Ok(k)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let _g = self.inv.lock.lock().unwrap_or_else(|p| p.into_inner());
        let _m = self._mmap.lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: we hold one reference, taken at creation.
        unsafe { self.inv.dev.lib().common.doca_buf_dec_refcount(self.ptr.as_ptr(), std::ptr::null_mut()) };
    }
}
