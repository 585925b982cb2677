//! A software GPU for tests: "device memory" is host memory this model
//! allocates, and copies are queued per stream and carried out only when
//! the stream or a later event is synchronized, as a real copy engine may
//! run them late. Code that refills a staging half before the copy out of
//! it is known to be done therefore moves wrong bytes here, where a test
//! sees them. It also records which host ranges are pinned and counts
//! copies from unpinned memory, and, like CUDA, refuses work on a thread
//! where no context was made current.
//!
//! Not NVIDIA's behaviour in every detail: only what Sluice relies on.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::driver::{
    Attribute, DevicePtr, Driver, MemoryType, PointerInfo, RawEvent, RawStream,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE,
};
use crate::CudaError;

thread_local! {
    /// The "current context" of this thread: (model id, device).
    static CURRENT: Cell<Option<(u64, u32)>> = const { Cell::new(None) };
}

static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);

/// A queued copy. Host addresses are the caller's (valid until the copy
/// runs, by the `Driver` contract); device ones are looked up at run time.
#[derive(Debug, Clone, Copy)]
enum Job {
    ToDevice { dst: DevicePtr, src: usize, len: usize },
    ToHost { dst: usize, src: DevicePtr, len: usize },
}

#[derive(Debug, Default)]
struct Queue {
    /// (sequence number, copy), oldest first.
    ops: VecDeque<(u64, Job)>,
    /// The number the next queued copy gets.
    next: u64,
}

#[derive(Debug)]
struct State {
    /// Device allocations by base address: (device, memory).
    allocs: BTreeMap<DevicePtr, (u32, Box<[u8]>)>,
    /// Pinned host ranges: start -> length.
    pinned: BTreeMap<usize, usize>,
    streams: HashMap<usize, Queue>,
    /// Event -> (stream, the sequence number its work ends before).
    events: HashMap<usize, Option<(usize, u64)>>,
    active: Vec<bool>,
    next_handle: usize,
    copies: u64,
    unpinned_copies: u64,
}

/// The host model of a CUDA driver (see the module docs).
#[derive(Debug)]
pub struct HostModel {
    id: u64,
    devices: u32,
    state: Mutex<State>,
}

fn err(call: &'static str, code: i32, what: &str) -> CudaError {
    CudaError::Call { call, code, name: format!("{what} (host model)") }
}

impl HostModel {
    /// A model with `devices` GPUs, each with an active primary context.
    pub fn new(devices: u32) -> Arc<Self> {
        Arc::new(Self {
            id: NEXT_MODEL.fetch_add(1, Ordering::Relaxed),
            devices,
            state: Mutex::new(State {
                allocs: BTreeMap::new(),
                pinned: BTreeMap::new(),
                streams: HashMap::new(),
                events: HashMap::new(),
                active: vec![true; devices as usize],
                next_handle: 1,
                copies: 0,
                unpinned_copies: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates `len` bytes of "device memory" on `device` (zeroed).
    pub fn alloc(&self, len: usize, device: u32) -> DevicePtr {
        let mem = vec![0u8; len.max(1)].into_boxed_slice();
        let base = mem.as_ptr() as DevicePtr;
        self.state().allocs.insert(base, (device, mem));
        base
    }

    /// Frees an allocation; false if `ptr` is not the start of one.
    pub fn free(&self, ptr: DevicePtr) -> bool {
        self.state().allocs.remove(&ptr).is_some()
    }

    /// The bytes at `[ptr, ptr + len)` of one allocation.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, CudaError> {
        let mut st = self.state();
        let (mem, off) = find(&mut st, ptr, len).ok_or_else(|| not_ours(ptr))?;
        Ok(mem[off..off + len].to_vec())
    }

    /// Writes `data` at `ptr` of one allocation.
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), CudaError> {
        let mut st = self.state();
        let (mem, off) = find(&mut st, ptr, data.len()).ok_or_else(|| not_ours(ptr))?;
        mem[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// The pinned host ranges: (start, length).
    pub fn pinned(&self) -> Vec<(usize, usize)> {
        self.state().pinned.iter().map(|(a, n)| (*a, *n)).collect()
    }

    /// Copies carried out so far.
    pub fn copies(&self) -> u64 {
        self.state().copies
    }

    /// Copies queued from or to host memory that was not pinned.
    pub fn unpinned_copies(&self) -> u64 {
        self.state().unpinned_copies
    }

    /// Copies queued and not yet carried out, on all streams.
    pub fn queued(&self) -> usize {
        self.state().streams.values().map(|q| q.ops.len()).sum()
    }

    /// Says whether `device`'s primary context is active (whether "the
    /// process uses CUDA" there).
    pub fn set_context_active(&self, device: u32, active: bool) {
        if let Some(a) = self.state().active.get_mut(device as usize) {
            *a = active;
        }
    }

    fn current(&self, call: &'static str) -> Result<u32, CudaError> {
        match CURRENT.with(Cell::get) {
            Some((id, dev)) if id == self.id => Ok(dev),
            _ => Err(err(
                call,
                CUDA_ERROR_INVALID_CONTEXT,
                "CUDA_ERROR_INVALID_CONTEXT: no current context on this thread",
            )),
        }
    }

    fn check_device(&self, device: u32) -> Result<(), CudaError> {
        if device >= self.devices {
            return Err(CudaError::NoDevice { device, count: self.devices });
        }
        Ok(())
    }

    fn handle(st: &mut State) -> usize {
        let h = st.next_handle;
        st.next_handle += 1;
        h
    }

    fn queue(
        &self,
        call: &'static str,
        stream: RawStream,
        dev: DevicePtr,
        host: usize,
        c: Job,
    ) -> Result<(), CudaError> {
        let current = self.current(call)?;
        let len = match c {
            Job::ToDevice { len, .. } | Job::ToHost { len, .. } => len,
        };
        let mut st = self.state();
        match st.allocs.range(..=dev).next_back() {
            Some((base, (d, mem))) if dev + len as u64 <= base + mem.len() as u64 => {
                if *d != current {
                    return Err(err(
                        call,
                        CUDA_ERROR_INVALID_VALUE,
                        "device memory of another device than the current",
                    ));
                }
            }
            _ => return Err(err(call, CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE: not device memory")),
        }
        if !is_pinned(&st, host, len) {
            st.unpinned_copies += 1;
        }
        let q = st.streams.get_mut(&stream.0).ok_or_else(|| err(call, CUDA_ERROR_INVALID_VALUE, "no such stream"))?;
        let seq = q.next;
        q.next += 1;
        q.ops.push_back((seq, c));
        Ok(())
    }

    /// Carries out the copies of `stream` numbered below `upto`.
    fn run(&self, call: &'static str, stream: usize, upto: u64) -> Result<(), CudaError> {
        let mut st = self.state();
        let mut failed = None;
        while let Some(c) = next_job(&mut st, stream, upto) {
            let done = match c {
                Job::ToDevice { dst, src, len } => find(&mut st, dst, len).map(|(mem, off)| {
                    // SAFETY: `src` was readable for `len` bytes until this
                    // copy runs (the `memcpy_htod_async` contract); `mem` is
                    // the model's own allocation, bounds checked by `find`.
                    unsafe { std::ptr::copy(src as *const u8, mem[off..off + len].as_mut_ptr(), len) }
                }),
                Job::ToHost { dst, src, len } => find(&mut st, src, len).map(|(mem, off)| {
                    // SAFETY: `dst` is writable for `len` bytes and unused
                    // until this copy runs (the `memcpy_dtoh_async`
                    // contract); `mem` is bounds checked by `find`.
                    unsafe { std::ptr::copy(mem[off..off + len].as_ptr(), dst as *mut u8, len) }
                }),
            };
            match done {
                Some(()) => st.copies += 1,
                // The allocation was freed with the copy still queued.
                None => {
                    failed = Some(err(
                        call,
                        CUDA_ERROR_ILLEGAL_ADDRESS,
                        "CUDA_ERROR_ILLEGAL_ADDRESS: memory freed under a queued copy",
                    ))
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// The oldest copy of `stream` numbered below `upto`, taken off the queue.
fn next_job(st: &mut State, stream: usize, upto: u64) -> Option<Job> {
    let q = st.streams.get_mut(&stream)?;
    if q.ops.front()?.0 >= upto {
        return None;
    }
    q.ops.pop_front().map(|(_, c)| c)
}

fn not_ours(ptr: DevicePtr) -> CudaError {
    CudaError::NotDeviceMemory { ptr, reason: "host model: freed or never allocated".into() }
}

/// The allocation holding `[ptr, ptr + len)` and the offset of `ptr` in it.
fn find(st: &mut State, ptr: DevicePtr, len: usize) -> Option<(&mut [u8], usize)> {
    let (base, (_, mem)) = st.allocs.range_mut(..=ptr).next_back()?;
    let off = usize::try_from(ptr - *base).ok()?;
    (off.checked_add(len)? <= mem.len()).then_some((&mut mem[..], off))
}

fn is_pinned(st: &State, addr: usize, len: usize) -> bool {
    st.pinned.range(..=addr).next_back().is_some_and(|(a, n)| addr + len <= a + n)
}

impl Driver for HostModel {
    fn name(&self) -> &str {
        "host-model"
    }

    fn path(&self) -> &str {
        ""
    }

    fn device_count(&self) -> Result<u32, CudaError> {
        Ok(self.devices)
    }

    fn device_name(&self, device: u32) -> Result<String, CudaError> {
        self.check_device(device)?;
        Ok(format!("host model GPU {device}"))
    }

    fn attribute(&self, device: u32, attr: Attribute) -> Result<i32, CudaError> {
        self.check_device(device)?;
        Ok(match attr {
            Attribute::HostRegisterSupported | Attribute::DmaBufSupported => 1,
            Attribute::GpuDirectRdmaSupported => 0,
        })
    }

    fn context_active(&self, device: u32) -> Result<bool, CudaError> {
        self.check_device(device)?;
        Ok(self.state().active[device as usize])
    }

    fn use_device(&self, device: u32) -> Result<(), CudaError> {
        if device >= self.devices {
            return Err(err("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"));
        }
        CURRENT.with(|c| c.set(Some((self.id, device))));
        Ok(())
    }

    fn pointer_info(&self, ptr: DevicePtr) -> Result<PointerInfo, CudaError> {
        let st = self.state();
        if let Some((base, (device, mem))) = st.allocs.range(..=ptr).next_back() {
            if ptr < base + mem.len() as u64 {
                return Ok(PointerInfo {
                    memory_type: MemoryType::Device,
                    device: *device,
                    base: *base,
                    size: mem.len() as u64,
                });
            }
        }
        if is_pinned(&st, ptr as usize, 1) {
            return Ok(PointerInfo { memory_type: MemoryType::Host, device: 0, base: ptr, size: 0 });
        }
        Err(not_ours(ptr))
    }

    fn mem_alloc(&self, len: usize) -> Result<DevicePtr, CudaError> {
        let dev = self.current("cuMemAlloc_v2")?;
        Ok(self.alloc(len, dev))
    }

    unsafe fn mem_free(&self, ptr: DevicePtr) -> Result<(), CudaError> {
        if self.free(ptr) {
            Ok(())
        } else {
            Err(err("cuMemFree_v2", CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"))
        }
    }

    unsafe fn host_register(&self, addr: *mut u8, len: usize) -> Result<(), CudaError> {
        self.current("cuMemHostRegister_v2")?;
        let mut st = self.state();
        let start = addr as usize;
        let overlaps = st.pinned.range(..start + len.max(1)).next_back().is_some_and(|(a, n)| a + n > start);
        if overlaps {
            return Err(err(
                "cuMemHostRegister_v2",
                CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
            ));
        }
        st.pinned.insert(start, len);
        Ok(())
    }

    unsafe fn host_unregister(&self, addr: *mut u8) -> Result<(), CudaError> {
        match self.state().pinned.remove(&(addr as usize)) {
            Some(_) => Ok(()),
            None => Err(err(
                "cuMemHostUnregister",
                CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
            )),
        }
    }

    fn stream_create(&self) -> Result<RawStream, CudaError> {
        self.current("cuStreamCreate")?;
        let mut st = self.state();
        let h = Self::handle(&mut st);
        st.streams.insert(h, Queue::default());
        Ok(RawStream(h))
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<(), CudaError> {
        // CUDA finishes a destroyed stream's work; so does the model.
        let r = self.run("cuStreamDestroy_v2", stream.0, u64::MAX);
        self.state().streams.remove(&stream.0);
        r
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<(), CudaError> {
        self.run("cuStreamSynchronize", stream.0, u64::MAX)
    }

    fn event_create(&self) -> Result<RawEvent, CudaError> {
        self.current("cuEventCreate")?;
        let mut st = self.state();
        let h = Self::handle(&mut st);
        st.events.insert(h, None);
        Ok(RawEvent(h))
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<(), CudaError> {
        self.state().events.remove(&event.0);
        Ok(())
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), CudaError> {
        self.current("cuEventRecord")?;
        let mut st = self.state();
        let upto = st.streams.get(&stream.0).map(|q| q.next);
        match (upto, st.events.get_mut(&event.0)) {
            (Some(upto), Some(e)) => {
                *e = Some((stream.0, upto));
                Ok(())
            }
            _ => Err(err("cuEventRecord", CUDA_ERROR_INVALID_VALUE, "no such event or stream")),
        }
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool, CudaError> {
        // Never "runs" anything: only a synchronize does, so a caller that
        // polls and then refills without waiting is caught.
        let st = self.state();
        match st.events.get(&event.0) {
            Some(Some((s, upto))) => Ok(st.streams.get(s).is_none_or(|q| q.ops.front().is_none_or(|(n, _)| n >= upto))),
            Some(None) => Ok(true),
            None => Err(err("cuEventQuery", CUDA_ERROR_INVALID_VALUE, "no such event")),
        }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<(), CudaError> {
        let target = self.state().events.get(&event.0).copied();
        match target {
            Some(Some((stream, upto))) => self.run("cuEventSynchronize", stream, upto),
            Some(None) => Ok(()),
            None => Err(err("cuEventSynchronize", CUDA_ERROR_INVALID_VALUE, "no such event")),
        }
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError> {
        self.queue("cuMemcpyHtoDAsync_v2", stream, dst, src as usize, Job::ToDevice { dst, src: src as usize, len })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<(), CudaError> {
        self.queue("cuMemcpyDtoHAsync_v2", stream, src, dst as usize, Job::ToHost { dst: dst as usize, src, len })
    }

    fn dmabuf_fd(&self, _ptr: DevicePtr, _len: usize) -> Result<OwnedFd, CudaError> {
        Err(CudaError::Unsupported("the host model has no dma-buf export".into()))
    }
}
