//! Progress engines and the two task types Sluice submits: DMA copies
//! (staged placement: DPU memory <-> host memory) and AES-GCM (inline
//! encryption on the DPU's crypto engine).
//!
//! Each engine owns one progress engine and one context and is used by one
//! thread at a time (`&mut self`); callers share it behind a mutex. A call
//! submits one task and polls the progress engine until the task's callback
//! has run, so the buffers the task uses never outlive the call.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use doca_sys as sys;
use doca_sys::DocaErrorCode;

use crate::device::Device;
use crate::error::{check, Error};
use crate::mmap::{Access, Buf, Inventory, Mmap};

/// How long one task may take before the engine is declared hung.
pub const TASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a callback leaves a task's outcome: `PENDING` until then. Lives on
/// the heap behind a raw pointer (never a `Box` argument, whose uniqueness
/// the callback's write would violate), so a hung task can keep it for ever.
pub(crate) struct Slot(AtomicU32);

const PENDING: u32 = u32::MAX;

impl Slot {
    /// A fresh slot, owned by the returned pointer (see [`Slot::free`]).
    pub(crate) fn new() -> *const Slot {
        Box::into_raw(Box::new(Slot(AtomicU32::new(PENDING))))
    }

    /// # Safety
    /// `slot` came from [`Slot::new`], is freed once, and no task refers to it.
    unsafe fn free(slot: *const Slot) {
        // SAFETY: per the contract.
        drop(unsafe { Box::from_raw(slot as *mut Slot) });
    }

    /// # Safety
    /// `slot` is live.
    unsafe fn get(slot: *const Slot) -> Option<sys::doca_error_t> {
        // SAFETY: per the contract. Acquire pairs with the callback's store.
        let v = unsafe { &*slot }.0.load(Ordering::Acquire);
        (v != PENDING).then_some(v)
    }
}

/// Marks the task whose user data is `user_data` as done.
///
/// # Safety
/// `user_data.ptr` must point at a live `Slot` (set before submission).
pub(crate) unsafe fn finish_ok(user_data: sys::doca_data) {
    // SAFETY: per the contract, the slot outlives the task.
    unsafe { &*(user_data.ptr as *const Slot) }.0.store(sys::DOCA_SUCCESS, Ordering::Release);
}

/// Marks the task as failed; `run_task` reads the real status from DOCA.
///
/// # Safety
/// As [`finish_ok`].
pub(crate) unsafe fn finish_err(user_data: sys::doca_data) {
    // SAFETY: as above.
    unsafe { &*(user_data.ptr as *const Slot) }.0.store(DocaErrorCode::Unknown.raw(), Ordering::Release);
}

unsafe extern "C" fn dma_done(_t: *mut sys::doca_dma_task_memcpy, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: the task's user data is the slot set by copy_bufs.
    unsafe { finish_ok(ud) }
}

unsafe extern "C" fn dma_failed(_t: *mut sys::doca_dma_task_memcpy, ud: sys::doca_data, _c: sys::doca_data) {
    // SAFETY: as above.
    unsafe { finish_err(ud) }
}

/// A progress engine with one context connected and started.
pub(crate) struct Progress {
    pub(crate) dev: Arc<Device>,
    pe: NonNull<sys::doca_pe>,
    pub(crate) ctx: *mut sys::doca_ctx,
    /// A task hung: DOCA may still write through its buffers, so nothing
    /// more is submitted on this engine.
    pub(crate) poisoned: bool,
}

impl Progress {
    pub(crate) fn new(dev: &Arc<Device>) -> Result<Self, Error> {
        let mut pe = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("doca_pe_create", unsafe { dev.lib().common.doca_pe_create(&mut pe) })?;
        let pe = NonNull::new(pe).ok_or(Error::Invalid("doca_pe_create returned NULL".into()))?;
        Ok(Self { dev: dev.clone(), pe, ctx: std::ptr::null_mut(), poisoned: false })
    }

    /// Connects and starts `ctx` (configured by the caller).
    pub(crate) fn start(&mut self, ctx: *mut sys::doca_ctx) -> Result<(), Error> {
        let c = &self.dev.lib().common;
        // SAFETY: live pe and a configured, idle context.
        check("doca_pe_connect_ctx", unsafe { c.doca_pe_connect_ctx(self.pe.as_ptr(), ctx) })?;
        // Connected: from here on Drop stops the context before the engine
        // goes (stopping one that never started is a harmless BAD_STATE).
        self.ctx = ctx;
        // SAFETY: as above.
        check("doca_ctx_start", unsafe { c.doca_ctx_start(ctx) })
    }

    pub(crate) fn check_usable(&self, what: &'static str) -> Result<(), Error> {
        if self.poisoned {
            return Err(Error::TimedOut { what, millis: TASK_TIMEOUT.as_millis() as u64 });
        }
        Ok(())
    }

    /// Submits `task` (whose user data is `slot`) and polls until its
    /// callback ran; frees the task. On a timeout the slot is leaked, the
    /// engine poisoned, and the caller must leak the task's buffers too.
    pub(crate) fn run_task(
        &mut self,
        what: &'static str,
        task: *mut sys::doca_task,
        slot: *const Slot,
    ) -> Result<(), Error> {
        let c = &self.dev.lib().common;
        // SAFETY: a freshly allocated task of a running context.
        let rc = unsafe { c.doca_task_submit(task) };
        if rc != sys::DOCA_SUCCESS {
            // SAFETY: not submitted, so still ours to free, and so is the slot.
            unsafe {
                c.doca_task_free(task);
                Slot::free(slot);
            }
            return check("doca_task_submit", rc);
        }
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            // SAFETY: the slot lives until freed below.
            if unsafe { Slot::get(slot) }.is_some() {
                break;
            }
            // SAFETY: live pe, polled by this thread only (&mut self).
            if unsafe { c.doca_pe_progress(self.pe.as_ptr()) } == 0 {
                if start.elapsed() > TASK_TIMEOUT {
                    tracing::error!(what, "DOCA task hung; this engine is retired");
                    self.poisoned = true;
                    // The slot stays allocated: DOCA may still complete the task.
                    return Err(Error::TimedOut { what, millis: TASK_TIMEOUT.as_millis() as u64 });
                }
                // Spin briefly (DMA completions take microseconds), then
                // give the core away rather than burn it.
                idle += 1;
                if idle < 1024 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        // SAFETY: completed (its callback ran), so readable and ours to free.
        let status = unsafe { c.doca_task_get_status(task) };
        // SAFETY: as above; freed exactly once.
        unsafe { c.doca_task_free(task) };
        // SAFETY: the task is gone, so nothing refers to the slot any more.
        let outcome = unsafe {
            let o = Slot::get(slot);
            Slot::free(slot);
            o
        };
        match (outcome, DocaErrorCode::from_raw(status)) {
            (Some(sys::DOCA_SUCCESS), None) => Ok(()),
            (_, Some(code)) => Err(Error::Task { what, code }),
            (Some(raw), None) => {
                Err(Error::Task { what, code: DocaErrorCode::from_raw(raw).unwrap_or(DocaErrorCode::Unknown) })
            }
            (None, None) => Err(Error::Task { what, code: DocaErrorCode::Unexpected }),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.poisoned {
            // A task may still be running: leak the engine and its context
            // rather than tear down what DOCA may still use.
            return;
        }
        let c = &self.dev.lib().common;
        // SAFETY: no task is in flight (run_task waits for each); stop the
        // context before the engine that drives it is destroyed.
        unsafe {
            if !self.ctx.is_null() {
                c.doca_ctx_stop(self.ctx);
            }
            c.doca_pe_destroy(self.pe.as_ptr());
        }
    }
}

/// `check` for a task allocation: on failure no task refers to `slot`, so
/// it is freed here.
pub(crate) fn allocated(call: &'static str, rc: sys::doca_error_t, slot: *const Slot) -> Result<(), Error> {
    if rc != sys::DOCA_SUCCESS {
        // SAFETY: fresh from Slot::new and never handed to a task.
        unsafe { Slot::free(slot) };
    }
    check(call, rc)
}

pub(crate) fn user_data(slot: *const Slot) -> sys::doca_data {
    sys::doca_data { ptr: slot as *mut std::ffi::c_void }
}

/// DMA copies between two mmaps on one device.
pub struct DmaEngine {
    progress: Progress,
    dma: NonNull<sys::doca_dma>,
    inv: Arc<Inventory>,
    max: u64,
}

// SAFETY: all DOCA objects here are used through &mut self only.
unsafe impl Send for DmaEngine {}

impl DmaEngine {
    pub fn new(dev: &Arc<Device>) -> Result<Self, Error> {
        let d = &dev.lib().dma;
        // SAFETY: a live devinfo.
        check("doca_dma_cap_task_memcpy_is_supported", unsafe {
            d.doca_dma_cap_task_memcpy_is_supported(dev.devinfo())
        })?;
        let mut max = 0u64;
        // SAFETY: as above; out-pointer to a local.
        check("doca_dma_cap_task_memcpy_get_max_buf_size", unsafe {
            d.doca_dma_cap_task_memcpy_get_max_buf_size(dev.devinfo(), &mut max)
        })?;
        let inv = Inventory::new(dev, 4)?;
        let progress = Progress::new(dev)?;
        let mut dma = std::ptr::null_mut();
        // SAFETY: a live device; out-pointer to a local.
        check("doca_dma_create", unsafe { d.doca_dma_create(dev.as_ptr(), &mut dma) })?;
        let dma = NonNull::new(dma).ok_or(Error::Invalid("doca_dma_create returned NULL".into()))?;
        // Owned from here: Drop cleans up whatever the steps below did.
        let mut me = Self { progress, dma, inv, max };
        // SAFETY: a fresh, idle context; the callbacks match the C types.
        unsafe {
            check(
                "doca_dma_task_memcpy_set_conf",
                d.doca_dma_task_memcpy_set_conf(me.dma.as_ptr(), Some(dma_done), Some(dma_failed), 1),
            )?;
            me.progress.start(d.doca_dma_as_ctx(me.dma.as_ptr()))?;
        }
        Ok(me)
    }

    /// False once a task hung: the engine must be replaced.
    pub fn is_usable(&self) -> bool {
        !self.progress.poisoned
    }

    /// Largest single copy the device takes.
    pub fn max_copy(&self) -> u64 {
        self.max
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`,
    /// in pieces of at most [`max_copy`](Self::max_copy).
    pub fn copy(
        &mut self,
        src: &Arc<Mmap>,
        src_off: usize,
        dst: &Arc<Mmap>,
        dst_off: usize,
        len: usize,
    ) -> Result<(), Error> {
        src.check(src_off, len)?;
        dst.check(dst_off, len)?;
        let step = (self.max.max(1) as usize).min(1 << 30);
        let mut done = 0;
        while done < len {
            let n = step.min(len - done);
            let s = self.inv.buf(src, src_off + done, n, n)?;
            let t = self.inv.buf(dst, dst_off + done, n, 0)?;
            self.copy_bufs(s, t)?;
            done += n;
        }
        Ok(())
    }

    fn copy_bufs(&mut self, src: Buf, dst: Buf) -> Result<(), Error> {
        self.progress.check_usable("DMA memcpy")?;
        let d = &self.progress.dev.lib().dma;
        let slot = Slot::new();
        let mut task = std::ptr::null_mut();
        // SAFETY: running context; buffers live for the whole call; the slot
        // outlives the task (run_task waits for completion).
        let rc = unsafe {
            d.doca_dma_task_memcpy_alloc_init(self.dma.as_ptr(), src.as_ptr(), dst.as_ptr(), user_data(slot), &mut task)
        };
        allocated("doca_dma_task_memcpy_alloc_init", rc, slot)?;
        // SAFETY: a live task.
        let t = unsafe { d.doca_dma_task_memcpy_as_task(task) };
        let r = self.progress.run_task("DMA memcpy", t, slot);
        if matches!(r, Err(Error::TimedOut { .. })) {
            // DOCA may still use them: never return them to the inventory.
            std::mem::forget((src, dst));
        }
        r
    }
}

impl Drop for DmaEngine {
    fn drop(&mut self) {
        // Stop the context (Progress::drop) before destroying it: take the
        // progress engine down first by replacing the context pointer order.
        if self.progress.poisoned {
            return; // leaked on purpose, see Progress::drop
        }
        let d = &self.progress.dev.lib().dma;
        let c = &self.progress.dev.lib().common;
        // SAFETY: no task in flight; stop, then destroy the DMA context; the
        // progress engine is destroyed afterwards by Progress::drop (its ctx
        // pointer is cleared so it is not stopped twice).
        unsafe {
            if !self.progress.ctx.is_null() {
                c.doca_ctx_stop(self.progress.ctx);
            }
            self.progress.ctx = std::ptr::null_mut();
            d.doca_dma_destroy(self.dma.as_ptr());
        }
    }
}

/// Page-aligned memory owned by an mmap, written and read by copies only
/// (the device may access it concurrently).
pub struct Staging {
    ptr: NonNull<u8>,
    len: usize,
    mmap: Arc<Mmap>,
}

// SAFETY: accessed by copies through raw pointers by the engine that owns it.
unsafe impl Send for Staging {}

/// Heap memory owned through a raw pointer (never through a `Box` that
/// moves, which would invalidate pointers derived from it), freed on drop.
struct Owned(NonNull<u8>, usize);

// SAFETY: plain heap memory; only freed in Drop.
unsafe impl Send for Owned {}
// SAFETY: as above; no access through this value.
unsafe impl Sync for Owned {}

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw of a boxed slice of this length, freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.0.as_ptr(), self.1)) });
    }
}

impl Staging {
    pub fn new(dev: &Arc<Device>, len: usize, access: Access) -> Result<Self, Error> {
        let len = len.max(1);
        let raw = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        let ptr = NonNull::new(raw).ok_or(Error::Invalid("allocation".into()))?;
        // SAFETY: the memory is owned by `Owned`, which the mmap keeps until
        // it is destroyed; it never moves.
        let mmap = unsafe { Mmap::local(dev, ptr.as_ptr(), len, access, Box::new(Owned(ptr, len)))? };
        Ok(Self { ptr, len, mmap })
    }

    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn write(&mut self, off: usize, data: &[u8]) -> Result<(), Error> {
        self.mmap.check(off, data.len())?;
        // SAFETY: bounds checked; the memory is owned by the mmap we hold.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len()) };
        Ok(())
    }

    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<(), Error> {
        self.mmap.check(off, out.len())?;
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}
