//! Streams (ordered queues of copies) and events (points in a stream to
//! wait for), owning their CUDA handles.
//!
//! A copy only queues work: the host memory it reads or writes must stay
//! alive and pinned until the copy engine gets to it. A [`Stream`] keeps an
//! `Arc` of every [`PinnedHost`] it queued a copy with until it has been
//! synchronized, so dropping the caller's handle early cannot unpin or
//! unmap memory under a queued copy.
//!
//! Every call first makes the stream's device current on the calling
//! thread: async tasks move between threads, and CUDA's current context is
//! per thread.

use std::sync::{Arc, Mutex};

use crate::driver::{RawEvent, RawStream};
use crate::memory::{DeviceSpan, PinnedHost};
use crate::{Cuda, CudaError};

/// A non-blocking CUDA stream of one device.
#[derive(Debug)]
pub struct Stream {
    cuda: Cuda,
    device: u32,
    raw: RawStream,
    /// Pinned memory with copies queued since the last synchronize.
    keep: Mutex<Vec<Arc<PinnedHost>>>,
}

impl Stream {
    pub(crate) fn new(cuda: &Cuda, device: u32) -> Result<Self, CudaError> {
        cuda.driver().use_device(device)?;
        let raw = cuda.driver().stream_create()?;
        Ok(Self { cuda: cuda.clone(), device, raw, keep: Mutex::default() })
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    fn check_span(&self, span: &DeviceSpan) -> Result<(), CudaError> {
        if span.driver() != self.cuda.id() {
            return Err(CudaError::Invalid("the GPU region was checked by another CUDA driver".into()));
        }
        if span.device() != self.device {
            return Err(CudaError::Invalid(format!(
                "the GPU region is on cuda:{}, the stream on cuda:{}",
                span.device(),
                self.device
            )));
        }
        Ok(())
    }

    fn hold(&self, host: &Arc<PinnedHost>) -> Result<(), CudaError> {
        if host.cuda().id() != self.cuda.id() {
            return Err(CudaError::Invalid("the host memory is pinned with another CUDA driver".into()));
        }
        let mut keep = self.keep.lock().unwrap_or_else(|p| p.into_inner());
        if !keep.iter().any(|k| Arc::ptr_eq(k, host)) {
            keep.push(host.clone());
        }
        Ok(())
    }

    /// Queues a copy of `dst.len()` bytes from `src` at `src_offset` into `dst`.
    pub fn copy_to_device(&self, dst: &DeviceSpan, src: &Arc<PinnedHost>, src_offset: u64) -> Result<(), CudaError> {
        self.check_span(dst)?;
        let at = src.check(src_offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.hold(src)?;
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: `src` is pinned memory checked to hold the window, and
        // `hold` keeps it alive (and pinned) until this stream synchronizes;
        // `dst` was checked by this driver to be device memory of this
        // stream's device; the stream is ours and live.
        unsafe { d.memcpy_htod_async(dst.ptr(), (src.addr() as *const u8).add(at), dst.len() as usize, self.raw) }
    }

    /// Queues a copy of `src.len()` bytes from `src` into `dst` at `dst_offset`.
    pub fn copy_to_host(&self, dst: &Arc<PinnedHost>, dst_offset: u64, src: &DeviceSpan) -> Result<(), CudaError> {
        self.check_span(src)?;
        let at = dst.check(dst_offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.hold(dst)?;
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: as in `copy_to_device`, with the directions swapped; the
        // pinned memory is only ever accessed by copying, so a write by the
        // copy engine breaks no Rust aliasing assumption.
        unsafe { d.memcpy_dtoh_async((dst.addr() as *mut u8).add(at), src.ptr(), src.len() as usize, self.raw) }
    }

    /// Marks the current end of the stream in `event`.
    pub fn record(&self, event: &Event) -> Result<(), CudaError> {
        if event.cuda.id() != self.cuda.id() || event.device != self.device {
            return Err(CudaError::Invalid("the event belongs to another device or driver".into()));
        }
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: both handles are ours, live, and of the same device.
        unsafe { d.event_record(event.raw, self.raw) }
    }

    /// Waits (blocking the thread) until every queued copy is done, then
    /// lets go of the memory they used.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: the stream is ours and live.
        let r = unsafe { d.stream_synchronize(self.raw) };
        if r.is_ok() {
            self.keep.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
        r
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let d = self.cuda.driver();
        let _ = d.use_device(self.device);
        // Finish the queued copies before their memory may go.
        // SAFETY: the stream is ours and live until destroyed below.
        if let Err(e) = unsafe { d.stream_synchronize(self.raw) } {
            tracing::warn!(error = %e, "a stream's last copies failed");
        }
        // SAFETY: ours, destroyed once, nothing queued any more.
        if let Err(e) = unsafe { d.stream_destroy(self.raw) } {
            tracing::warn!(error = %e, "cuStreamDestroy failed");
        }
    }
}

/// A CUDA event of one device (no timing).
#[derive(Debug)]
pub struct Event {
    cuda: Cuda,
    device: u32,
    raw: RawEvent,
}

impl Event {
    pub(crate) fn new(cuda: &Cuda, device: u32) -> Result<Self, CudaError> {
        cuda.driver().use_device(device)?;
        let raw = cuda.driver().event_create()?;
        Ok(Self { cuda: cuda.clone(), device, raw })
    }

    /// Whether the work before the event is done (never blocks).
    pub fn query(&self) -> Result<bool, CudaError> {
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: the event is ours and live.
        unsafe { d.event_query(self.raw) }
    }

    /// Waits (blocking the thread) for the work before the event.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let d = self.cuda.driver();
        d.use_device(self.device)?;
        // SAFETY: the event is ours and live.
        unsafe { d.event_synchronize(self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let d = self.cuda.driver();
        let _ = d.use_device(self.device);
        // SAFETY: ours, destroyed once.
        let _ = unsafe { d.event_destroy(self.raw) };
    }
}
