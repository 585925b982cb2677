//! A completion queue with a completion channel, driven by tokio: a driver
//! task polls completions and wakes the request that posted each one.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdma_core_sys as sys;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::error::{RdmaError, Result};
use crate::memory::{Context, MemoryRegion};

/// The outcome of a one-sided operation: the local region back, with the
/// error if it failed.
pub type PostResult = std::result::Result<Arc<MemoryRegion>, (RdmaError, Arc<MemoryRegion>)>;

type Waiters = Mutex<HashMap<u64, oneshot::Sender<Result<()>>>>;

struct Inner {
    cq: NonNull<sys::ibv_cq>,
    channel: NonNull<sys::ibv_comp_channel>,
    waiters: Waiters,
    _ctx: Arc<Context>,
}

// SAFETY: verbs are thread safe (rdma-core); the CQ is polled by one driver
// task at a time and the waiter map is behind a mutex.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it and is gone; the
        // driver task (which holds an Arc too) has ended.
        unsafe {
            sys::ibv_destroy_cq(self.cq.as_ptr());
            sys::ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

struct ChannelFd(RawFd);
impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A completion queue shared by the queue pairs posting to it.
pub struct CompletionQueue {
    inner: Arc<Inner>,
    next_id: AtomicU64,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        self.driver.abort();
        // Requests still waiting learn that the queue is gone.
        self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl CompletionQueue {
    /// Creates a CQ of `depth` entries and starts its driver on the current
    /// tokio runtime.
    pub fn new(ctx: &Arc<Context>, depth: i32) -> Result<Arc<Self>> {
        // SAFETY: ctx is live.
        let ch = NonNull::new(unsafe { sys::ibv_create_comp_channel(ctx.ptr.as_ptr()) })
            .ok_or_else(|| RdmaError::last_os("ibv_create_comp_channel"))?;
        // SAFETY: ctx and channel are live; no cq_context is used.
        let cq = unsafe { sys::ibv_create_cq(ctx.ptr.as_ptr(), depth, std::ptr::null_mut(), ch.as_ptr(), 0) };
        let Some(cq) = NonNull::new(cq) else {
            let e = RdmaError::last_os("ibv_create_cq");
            // SAFETY: created above, not used by anything.
            unsafe { sys::ibv_destroy_comp_channel(ch.as_ptr()) };
            return Err(e);
        };
        let inner = Arc::new(Inner { cq, channel: ch, waiters: Mutex::default(), _ctx: ctx.clone() });
        // SAFETY: the channel is live; its fd belongs to it.
        let fd = unsafe { (*ch.as_ptr()).fd };
        // SAFETY: fcntl on a valid fd owned by the channel.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above; non-blocking so ibv_get_cq_event never blocks the runtime.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(RdmaError::last_os("fcntl(O_NONBLOCK)"));
        }
        // SAFETY: the fd belongs to the completion channel, which `inner`
        // keeps open for longer than the driver (and so the AsyncFd) lives;
        // the AsyncFd never closes it.
        let afd = unsafe { AsyncFd::register_with_interest(ChannelFd(fd), tokio::io::Interest::READABLE) }
            .map_err(|e| RdmaError::Os { op: "AsyncFd", source: std::io::Error::other(e.to_string()) })?;
        let driver = tokio::spawn(drive(inner.clone(), afd));
        Ok(Arc::new(Self { inner, next_id: AtomicU64::new(1), driver }))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.inner.cq.as_ptr()
    }

    /// A work-request id and the receiver its completion will arrive on.
    fn expect(&self) -> (u64, oneshot::Receiver<Result<()>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(id, tx);
        (id, rx)
    }

    /// Posts one signaled work request over `len` bytes at `local_off` of
    /// `local` (`post` gets its id) and waits for its completion. The
    /// region comes back either way, with the error if the post or the
    /// completion failed.
    pub(crate) async fn run(
        &self,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        post: impl FnOnce(u64, &MemoryRegion) -> Result<()>,
    ) -> PostResult {
        if local_off.checked_add(u64::from(len)).is_none_or(|end| end > local.len()) {
            let e =
                RdmaError::Invalid(format!("{len} bytes at {local_off} outside the {}-byte local region", local.len()));
            return Err((e, local));
        }
        let (wr_id, rx) = self.expect();
        // Posting is synchronous; the work request lives only in `post`, so
        // nothing non-Send is held across the await below.
        if let Err(e) = post(wr_id, &local) {
            self.forget(wr_id);
            return Err((e, local));
        }
        match rx.await {
            Ok(Ok(())) => Ok(local),
            Ok(Err(e)) => Err((e, local)),
            Err(_) => Err((RdmaError::Closed, local)),
        }
    }

    /// Forgets a waiter whose post failed.
    fn forget(&self, id: u64) {
        self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }
}

/// A completion's outcome.
fn wc_result(wc: &sys::ibv_wc) -> Result<()> {
    if wc.status == sys::IBV_WC_SUCCESS {
        return Ok(());
    }
    // SAFETY: ibv_wc_status_str returns a pointer to a static string.
    let s = unsafe { std::ffi::CStr::from_ptr(sys::ibv_wc_status_str(wc.status)) };
    Err(RdmaError::Completion { status: s.to_string_lossy().into_owned(), vendor_err: wc.vendor_err })
}

/// Drains completions, then arms the channel and waits for it.
async fn drive(inner: Arc<Inner>, afd: AsyncFd<ChannelFd>) {
    let mut wcs: [sys::ibv_wc; 16] = Default::default();
    loop {
        loop {
            // SAFETY: cq is live; wcs has room for 16 entries.
            let n = unsafe { sys::ibv_poll_cq(inner.cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            let mut waiters = inner.waiters.lock().unwrap_or_else(|p| p.into_inner());
            for wc in &wcs[..n as usize] {
                if let Some(tx) = waiters.remove(&wc.wr_id) {
                    let _ = tx.send(wc_result(wc));
                }
            }
        }
        // SAFETY: cq is live; arming for the next completion.
        if unsafe { sys::ibv_req_notify_cq(inner.cq.as_ptr(), 0) } != 0 {
            tracing::error!("ibv_req_notify_cq failed; completion driver stops");
            return;
        }
        // A completion may have landed between the last poll and arming.
        let mut wc: sys::ibv_wc = Default::default();
        // SAFETY: cq is live; `wc` has room for one entry.
        let n = unsafe { sys::ibv_poll_cq(inner.cq.as_ptr(), 1, &mut wc) };
        if n > 0 {
            if let Some(tx) = inner.waiters.lock().unwrap_or_else(|p| p.into_inner()).remove(&wc.wr_id) {
                let _ = tx.send(wc_result(&wc));
            }
            continue;
        }
        let Ok(mut guard) = afd.readable().await else { return };
        let mut ev_cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut ev_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: channel is live and non-blocking; out-params are valid.
        let r = unsafe { sys::ibv_get_cq_event(inner.channel.as_ptr(), &mut ev_cq, &mut ev_ctx) };
        if r == 0 {
            // SAFETY: one event received from this CQ is acknowledged.
            unsafe { sys::ibv_ack_cq_events(ev_cq, 1) };
        } else {
            guard.clear_ready();
        }
    }
}
