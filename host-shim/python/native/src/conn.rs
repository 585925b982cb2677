//! The native reader's connection: the Rust client, the runtime that drives
//! it, and the scratch regions results are read into before they are
//! copied into Python `bytes`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_client::{BatchGet, Client, ClientError, Code, Region, Transfer};

/// Smallest scratch region (as the Python client's `SCRATCH_MIN`).
const SCRATCH_MIN: u64 = 1 << 20;
/// Slot of an object of unknown size before any was seen (`FIRST_SIZE_GUESS`).
pub const FIRST_SIZE_GUESS: u64 = 256 << 10;
/// The most the slot of an unknown-size object grows to (`MAX_SIZE_GUESS`).
pub const MAX_SIZE_GUESS: u64 = 64 << 20;
/// Most items in one GetBatch (the shim's limit, `MAX_BATCH_ITEMS`).
pub const MAX_BATCH_ITEMS: usize = 1024;
/// How often a waiting call lets Python run its signal handlers.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Why `Conn::block_on` did not run its future to the end.
pub enum Stopped {
    /// A Python signal handler raised (Ctrl-C): the future was dropped
    /// part way, so a request may be half sent or its answer half read.
    Signal(PyErr),
    /// Not possible here (a signal handler using the reader while a call
    /// of the same thread waits, or the reader closed).
    Refused(PyErr),
}

/// The connection and everything that lives as long as it.
pub struct Conn {
    /// The client's reader task and every request run on this runtime,
    /// driven by whichever caller is inside `block_on` (no thread of its
    /// own: a caller alone on the reader never wakes another thread).
    rt: Option<tokio::runtime::Runtime>,
    client: Option<Arc<Client>>,
    /// Free scratch regions, kept for reuse up to `scratch_budget` bytes.
    scratch: Mutex<Vec<Region>>,
    scratch_budget: u64,
    pub batch_bytes: u64,
    /// Slot for an object of unknown size: the largest size seen lately,
    /// rounded up to a power of two (loaders read samples of similar size).
    size_guess: AtomicU64,
    /// The process that made the runtime: a forked child must not touch it.
    pub pid: u32,
    /// Releases sent by tasks not yet driven to their end ([`Conn::settle`]).
    releasing: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // The runtime's and the connection's state belong to the parent;
            // a child has no threads behind them. Leak them.
            std::mem::forget(self.client.take());
            std::mem::forget(self.rt.take());
            return;
        }
        if let Some(rt) = self.rt.take() {
            let inside = rt.enter();
            self.scratch.lock().unwrap_or_else(|p| p.into_inner()).clear();
            drop(self.client.take());
            drop(inside);
            rt.shutdown_background();
        }
    }
}

pub fn pow2(n: u64) -> u64 {
    n.max(1).next_power_of_two()
}

fn scratch_size(n: u64) -> u64 {
    let n = n.max(SCRATCH_MIN);
    let p = n.next_power_of_two();
    if p - n <= n / 4 {
        p
    } else {
        (n + 4095) & !4095
    }
}

/// Room for one item in a shared scratch region (64-byte aligned).
pub fn slot(span: u64) -> u64 {
    (span.max(1) + 63) & !63
}

impl Conn {
    pub fn new(rt: tokio::runtime::Runtime, client: Client, scratch_budget: u64, batch_bytes: u64) -> Self {
        Self {
            rt: Some(rt),
            client: Some(Arc::new(client)),
            scratch: Mutex::new(Vec::new()),
            scratch_budget,
            batch_bytes: batch_bytes.max(1),
            size_guess: AtomicU64::new(FIRST_SIZE_GUESS),
            pid: std::process::id(),
            releasing: Mutex::new(Vec::new()),
        }
    }

    pub fn client(&self) -> Option<&Arc<Client>> {
        self.client.as_ref()
    }

    pub fn size_guess(&self) -> u64 {
        self.size_guess.load(Ordering::Relaxed)
    }

    /// An unknown-size read of `bytes` succeeded: the next one's slot, at
    /// most [`MAX_SIZE_GUESS`] (as the Python path's `_learn_size`; only
    /// successes teach it, or a too-large object would make every later
    /// read fail to register its slot).
    pub fn saw(&self, bytes: u64) {
        self.size_guess.store(pow2(bytes).min(MAX_SIZE_GUESS), Ordering::Relaxed);
    }

    /// Runs `f` on the runtime with the interpreter lock released. Every
    /// `SIGNAL_CHECK` it takes the lock to run Python's signal handlers, so
    /// Ctrl-C interrupts a call that waits on a slow store.
    pub fn block_on<F, T>(&self, py: Python<'_>, f: F) -> Result<T, Stopped>
    where
        F: Future<Output = T> + Send,
        T: Send,
    {
        let rt = self.rt.as_ref().ok_or_else(|| Stopped::Refused(PyRuntimeError::new_err("the reader is closed")))?;
        if tokio::runtime::Handle::try_current().is_ok() {
            // A signal handler run from inside a waiting call (below).
            return Err(Stopped::Refused(PyRuntimeError::new_err(
                "sluice: a signal handler cannot read through the client while a call of the same thread waits",
            )));
        }
        py.detach(|| {
            rt.block_on(async {
                tokio::pin!(f);
                loop {
                    tokio::select! {
                        out = &mut f => return Ok(out),
                        () = tokio::time::sleep(SIGNAL_CHECK) => {
                            Python::attach(|py| py.check_signals()).map_err(Stopped::Signal)?;
                        }
                    }
                }
            })
        })
    }

    /// A free scratch region of at least `n` bytes, or a new one.
    async fn checkout(&self, client: &Client, n: u64) -> Result<Region, ClientError> {
        let found = {
            let mut free = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
            let best =
                free.iter().enumerate().filter(|(_, r)| r.len() >= n).min_by_key(|(_, r)| r.len()).map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        match found {
            Some(r) => Ok(r),
            None => client.register(scratch_size(n)).await,
        }
    }

    /// Keeps `region` for reuse if the budget allows, making room by
    /// dropping smaller free regions (smallest first) if that is enough, as
    /// the Python client's pool does. What is not kept is released with
    /// the shim by a task the next call's `block_on` drives. A region a
    /// request may still write into (`reuse` false: it timed out, or the
    /// connection broke) is never reused.
    pub fn give_back(&self, region: Region, reuse: bool) {
        let mut out = Vec::new();
        if reuse && region.len() <= self.scratch_budget {
            let mut free = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
            let kept: u64 = free.iter().map(Region::len).sum();
            let over = (kept + region.len()).saturating_sub(self.scratch_budget);
            let room: u64 = free.iter().filter(|r| r.len() < region.len()).map(Region::len).sum();
            if over == 0 || room >= over {
                let mut freed = 0;
                while freed < over {
                    let Some(i) = free
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.len() < region.len())
                        .min_by_key(|(_, r)| r.len())
                        .map(|(i, _)| i)
                    else {
                        break;
                    };
                    let r = free.swap_remove(i);
                    freed += r.len();
                    out.push(r);
                }
                free.push(region);
            } else {
                out.push(region);
            }
        } else {
            out.push(region);
        }
        for r in out {
            self.release(r);
        }
    }

    fn release(&self, region: Region) {
        if let (Some(rt), Some(client)) = (self.rt.as_ref(), self.client.as_ref()) {
            let id = region.id().to_owned();
            drop(region);
            let client = Arc::clone(client);
            let task = rt.spawn(async move {
                // A failure only means the connection is gone, which
                // releases the region too.
                let _ = client.release_id(&id).await;
            });
            let mut releasing = self.releasing.lock().unwrap_or_else(|p| p.into_inner());
            releasing.retain(|t| !t.is_finished());
            releasing.push(task);
        }
    }

    /// Waits for the releases sent so far (inside `block_on`): the
    /// session's counters then show them.
    pub fn settle(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let tasks = std::mem::take(&mut *self.releasing.lock().unwrap_or_else(|p| p.into_inner()));
        async move {
            for t in tasks {
                let _ = t.await;
            }
        }
    }

    /// One object into a scratch region: read at the known, hinted or
    /// guessed size; if it is bigger, again at the size the shim says (a
    /// HEAD only if it could not say). On failure, the region (if any) to
    /// give back, and whether it may be reused.
    pub async fn get_into_scratch(
        &self,
        path: &str,
        size_hint: u64,
    ) -> Result<(Region, Transfer), (ClientError, Option<Region>)> {
        let Some(client) = self.client.as_deref() else {
            return Err((ClientError::Disconnected, None));
        };
        let mut want = if size_hint > 0 { size_hint } else { self.size_guess() };
        for attempt in 0..4 {
            let region = self.checkout(client, want.max(1)).await.map_err(|e| (e, None))?;
            match client.get(path, &region, 0, None).await {
                Ok(t) => {
                    self.saw(t.bytes);
                    return Ok((region, t));
                }
                Err(e) if e.code() == Some(Code::RegionTooSmall) && attempt < 3 => {
                    // Nothing was written: the region is free again.
                    self.give_back(region, true);
                    want = e.needed_bytes();
                    if want == 0 {
                        want = client.head(path).await.map_err(|e| (e, None))?.size;
                    }
                }
                Err(e) => return Err((e, Some(region))),
            }
        }
        Err((ClientError::Protocol("the object kept growing while it was read".into()), None))
    }

    /// One GetBatch of whole objects into slots of one scratch region:
    /// `(path, offset, slot)` per item. Returns the region and each item's
    /// result (or the batch's failure, with the region to give back).
    pub async fn batch_into_scratch(
        &self,
        items: &[(&str, u64, u64)],
        total: u64,
    ) -> Result<(Region, Result<Vec<Result<Transfer, ClientError>>, ClientError>), ClientError> {
        let client = self.client.as_deref().ok_or(ClientError::Disconnected)?;
        let region = self.checkout(client, total).await?;
        let batch: Vec<BatchGet> = items
            .iter()
            .map(|(path, offset, slot)| BatchGet {
                path: (*path).to_owned(),
                region_id: region.id().to_owned(),
                offset: *offset,
                range: None,
                max_bytes: *slot,
                if_match: String::new(),
            })
            .collect();
        let got = client.get_many(&batch).await;
        Ok((region, got))
    }
}
