//! `sluice._native`: the Python client's bytes-returning reads
//! (`Client.get_bytes(path)`, `Client.get_many(paths)`) done by the Rust
//! client, with the interpreter lock released while the request is out.
//!
//! Why: in Python every call costs ~90 µs of interpreter time (the
//! operation's generator, the scratch checkout, encoding, decoding, the
//! result; docs/performance.md), and threads calling `get_bytes` queue for
//! the one interpreter lock. Here a call holds the lock only to take its
//! arguments and to copy the bytes into the `bytes` it returns.
//!
//! The reader has a shim connection of its own (its own session) and its
//! own scratch regions, kept for reuse up to a budget like the Python
//! client's. Errors come back as `NativeError(kind, code, message,
//! request_id, needed_bytes)`; `sluice._native_reads` turns them into the
//! client's typed exceptions, so a caller sees the same errors either way.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use sluice_client::{BatchGet, Client, ClientError, Code, Region, Transfer};

pyo3::create_exception!(
    _native,
    NativeError,
    PyException,
    "A failed native read: args are (kind, code, message, request_id, needed_bytes)."
);

/// Smallest scratch region (as the Python client's `SCRATCH_MIN`).
const SCRATCH_MIN: u64 = 1 << 20;
/// Slot of an object of unknown size before any was seen (`FIRST_SIZE_GUESS`).
const FIRST_SIZE_GUESS: u64 = 256 << 10;
/// Most items in one GetBatch (the shim's limit, `MAX_BATCH_ITEMS`).
const MAX_BATCH_ITEMS: usize = 1024;
/// Copies at least this big run with the interpreter lock released.
const UNLOCKED_COPY: usize = 256 << 10;
/// Results at least this big get huge pages where the kernel has them (a
/// fresh mapping whatever `malloc`'s thresholds: a fault per 2 MiB, not per
/// 4 KiB; as `sluice._bigcopy` does).
const HUGE_PAGE_COPY: usize = 32 << 20;

/// How often a waiting call lets Python run its signal handlers.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The connection and everything that lives as long as it.
struct Conn {
    /// The client's reader task and every request run on this runtime,
    /// driven by whichever caller is inside `block_on` (no thread of its
    /// own: a caller alone on the reader never wakes another thread).
    rt: Option<tokio::runtime::Runtime>,
    client: Option<Arc<Client>>,
    scratch: Mutex<Vec<Region>>,
    scratch_budget: u64,
    batch_bytes: u64,
    size_guess: AtomicU64,
    /// The process that made the runtime: a forked child must not touch it.
    pid: u32,
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
            let _inside = rt.enter();
            self.scratch.lock().unwrap_or_else(|p| p.into_inner()).clear();
            drop(self.client.take());
            drop(_inside);
            rt.shutdown_background();
        }
    }
}

/// What a failure tells Python: (kind, code, message, request id, needed bytes).
type Failure = (&'static str, i32, String, String, u64);

fn failure(e: &ClientError) -> Failure {
    let kind = match e {
        ClientError::Shim { .. } | ClientError::Gpu { .. } | ClientError::Cuda(_) => "shim",
        ClientError::Connect { .. } => "connect",
        ClientError::Disconnected | ClientError::Io(_) => "disconnected",
        ClientError::Timeout(_) => "timeout",
        _ => "protocol",
    };
    let (message, request_id) = match e {
        ClientError::Shim { message, request_id, .. } | ClientError::Gpu { message, request_id, .. } => {
            (message.clone(), request_id.clone())
        }
        other => (other.to_string(), String::new()),
    };
    (kind, e.code().map_or(0, |c| c as i32), message, request_id, e.needed_bytes())
}

fn raise(e: &ClientError) -> PyErr {
    NativeError::new_err(failure(e))
}

fn closed() -> PyErr {
    NativeError::new_err(("closed", 0, "the client is closed".to_owned(), String::new(), 0u64))
}

/// A transfer as the tuple `sluice.Transfer` is made from.
fn transfer_tuple(t: &Transfer) -> (String, u64, &'static str, String, u64, u32, String, u64, bool, String) {
    (
        t.request_id.clone(),
        t.bytes,
        t.data_path,
        t.fallback_reason.clone(),
        t.elapsed_us,
        t.parts,
        t.etag.clone(),
        t.object_size,
        t.verified,
        t.unverified_reason.clone(),
    )
}

fn pow2(n: u64) -> u64 {
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

fn slot(span: u64) -> u64 {
    (span.max(1) + 63) & !63
}

impl Conn {
    fn rt(&self) -> PyResult<&tokio::runtime::Runtime> {
        self.rt.as_ref().ok_or_else(closed)
    }

    fn client(&self) -> PyResult<&Client> {
        self.client.as_deref().ok_or_else(closed)
    }

    /// Runs `f` on the runtime with the interpreter lock released. Every
    /// `SIGNAL_CHECK` it takes the lock to run Python's signal handlers, so
    /// Ctrl-C interrupts a call that waits on a slow store: `f` is then
    /// dropped (its scratch region is unmapped here and never reused; the
    /// shim keeps its registration until the connection closes).
    fn block_on<F, T>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        F: Future<Output = T> + Send,
        T: Send,
    {
        let rt = self.rt()?;
        py.detach(|| {
            rt.block_on(async {
                tokio::pin!(f);
                loop {
                    tokio::select! {
                        out = &mut f => return Ok(out),
                        () = tokio::time::sleep(SIGNAL_CHECK) => Python::attach(|py| py.check_signals())?,
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

    /// Keeps `region` for reuse if the budget allows; otherwise it is
    /// released with the shim in the background, by a task the next
    /// caller's `block_on` drives (no caller waits for it).
    fn give_back(&self, region: Region, reuse: bool) {
        if reuse && region.len() <= self.scratch_budget {
            let mut free = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
            let kept: u64 = free.iter().map(Region::len).sum();
            if kept + region.len() <= self.scratch_budget {
                free.push(region);
                return;
            }
        }
        // A region a request may still write into (it timed out, or the
        // connection broke) is never reused; the shim keeps it alive until
        // its GET is over.
        if let (Some(rt), Some(client)) = (self.rt.as_ref(), self.client.as_ref()) {
            let id = region.id().to_owned();
            drop(region);
            let client = Arc::clone(client);
            rt.spawn(async move {
                // A failure only means the connection is gone, which
                // releases the region too.
                let _ = client.release_id(&id).await;
            });
        }
    }

    /// One object into a scratch region: read at the known, hinted or
    /// guessed size; if it is bigger, again at the size the shim says.
    async fn get_into_scratch(
        &self,
        path: &str,
        size_hint: u64,
    ) -> (Result<(Region, Transfer), ClientError>, Option<Region>) {
        let Some(client) = self.client.as_deref() else {
            return (Err(ClientError::Disconnected), None);
        };
        let mut want = if size_hint > 0 { size_hint } else { self.size_guess.load(Ordering::Relaxed) };
        for attempt in 0..4 {
            let region = match self.checkout(client, want.max(1)).await {
                Ok(r) => r,
                Err(e) => return (Err(e), None),
            };
            match client.get(path, &region, 0, None).await {
                Ok(t) => {
                    self.size_guess.store(pow2(t.bytes), Ordering::Relaxed);
                    return (Ok((region, t)), None);
                }
                Err(e) if e.code() == Some(Code::RegionTooSmall) && attempt < 3 => {
                    want = e.needed_bytes();
                    if want == 0 {
                        match client.head(path).await {
                            Ok(info) => want = info.size,
                            Err(e) => return (Err(e), Some(region)),
                        }
                    }
                    self.size_guess.store(pow2(want), Ordering::Relaxed);
                    // Nothing was written: the region is free again.
                    self.scratch.lock().unwrap_or_else(|p| p.into_inner()).push(region);
                }
                Err(e) => return (Err(e), Some(region)),
            }
        }
        (Err(ClientError::Protocol("the object kept growing while it was read".into())), None)
    }
}

/// Copies `len` bytes of `region` from `offset` into a new `bytes`.
fn bytes_of<'py>(py: Python<'py>, region: &Region, offset: u64, len: u64) -> PyResult<Bound<'py, PyBytes>> {
    let len = usize::try_from(len)
        .map_err(|_| NativeError::new_err(("protocol", 0, "result too large".to_owned(), String::new(), 0u64)))?;
    let start = offset as usize;
    let src = region.as_slice().get(start..start + len).ok_or_else(|| {
        NativeError::new_err((
            "protocol",
            0,
            "the shim reported more bytes than the region holds".to_owned(),
            String::new(),
            0u64,
        ))
    })?;
    if len < UNLOCKED_COPY {
        return Ok(PyBytes::new(py, src));
    }
    // SAFETY: `PyBytes_FromStringAndSize(NULL, len)` returns a new, owned,
    // uninitialised bytes object of `len` bytes (or NULL with an exception
    // set, turned into Err by `assume_owned_or_err`). Nothing else can see
    // it before it is returned, so filling its buffer in place, with the
    // interpreter lock released, is how the C API means it to be used.
    let obj = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len as pyo3::ffi::Py_ssize_t),
        )?
    };
    // SAFETY: `obj` is the bytes object made above; `PyBytes_AsString`
    // returns its buffer of `len` bytes (plus the trailing NUL).
    let dst = unsafe { pyo3::ffi::PyBytes_AsString(obj.as_ptr()) }.cast::<u8>();
    let dst_addr = dst as usize;
    py.detach(move || {
        if len >= HUGE_PAGE_COPY {
            let page = 4096usize;
            let first = (dst_addr + page - 1) & !(page - 1);
            let end = (dst_addr + len) & !(page - 1);
            if end > first {
                // SAFETY: madvise only advises on pages wholly inside the
                // buffer we own; failure (no THP) is harmless.
                unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
            }
        }
        // SAFETY: `dst_addr` is the buffer of the unshared bytes object
        // above, `len` bytes long; `src` is `len` bytes of the mapping,
        // which `region` keeps mapped for the whole copy.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst_addr as *mut u8, len) };
    });
    // SAFETY: the object is a bytes object (made by PyBytes_FromStringAndSize).
    Ok(unsafe { obj.cast_into_unchecked() })
}

/// A reader with a shim connection of its own. Thread-safe: callers on
/// many threads share it, with the interpreter lock released while they
/// wait.
#[pyclass(frozen, module = "sluice._native")]
struct Reader {
    conn: RwLock<Option<Arc<Conn>>>,
}

impl Reader {
    fn conn(&self) -> PyResult<Arc<Conn>> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(closed)
    }
}

fn timeout_of(seconds: Option<f64>) -> Option<Duration> {
    seconds.filter(|s| *s > 0.0).map(Duration::from_secs_f64)
}

#[pymethods]
impl Reader {
    /// Connects to the shim at `socket` and says hello.
    #[new]
    #[pyo3(signature = (socket, connect_timeout=30.0, scratch_bytes=256 << 20, batch_bytes=256 << 20))]
    fn new(
        py: Python<'_>,
        socket: String,
        connect_timeout: Option<f64>,
        scratch_bytes: u64,
        batch_bytes: u64,
    ) -> PyResult<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            NativeError::new_err(("connect", 0, format!("starting the native runtime: {e}"), String::new(), 0u64))
        })?;
        let connect = async {
            match timeout_of(connect_timeout) {
                Some(t) => {
                    tokio::time::timeout(t, Client::connect(&socket)).await.unwrap_or(Err(ClientError::Timeout(t)))
                }
                None => Client::connect(&socket).await,
            }
        };
        let client = py.detach(|| rt.block_on(connect)).map_err(|e| raise(&e))?;
        let conn = Conn {
            rt: Some(rt),
            client: Some(Arc::new(client)),
            scratch: Mutex::new(Vec::new()),
            scratch_budget: scratch_bytes,
            batch_bytes: batch_bytes.max(1),
            size_guess: AtomicU64::new(FIRST_SIZE_GUESS),
            pid: std::process::id(),
        };
        Ok(Self { conn: RwLock::new(Some(Arc::new(conn))) })
    }

    /// The tenant the shim mapped this process to.
    fn tenant(&self) -> PyResult<String> {
        Ok(self.conn()?.client()?.tenant().to_owned())
    }

    /// Reads `path` whole; returns `(bytes, transfer_tuple)`. `timeout`:
    /// the request's deadline in seconds (`None`: the namespace's).
    #[pyo3(signature = (path, size_hint=0, timeout=None))]
    fn get_bytes<'py>(
        &self,
        py: Python<'py>,
        path: String,
        size_hint: u64,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let conn = self.conn()?;
        let within = timeout_of(timeout);
        let (got, spare) =
            conn.block_on(py, sluice_client::with_timeout(within, conn.get_into_scratch(&path, size_hint)))?;
        if let Some(region) = spare {
            let reuse = matches!(&got, Err(ClientError::Shim { .. }));
            conn.give_back(region, reuse);
        }
        let (region, t) = got.map_err(|e| raise(&e))?;
        let data = bytes_of(py, &region, 0, t.bytes);
        conn.give_back(region, true);
        (data?, transfer_tuple(&t)).into_pyobject(py)
    }

    /// Reads every path whole, in batches; never raises for one item's
    /// failure. Returns one tuple per path: `(True, bytes, transfer_tuple)`
    /// or `(False, kind, code, message, request_id, needed_bytes)`.
    #[pyo3(signature = (paths, timeout=None))]
    fn get_many<'py>(&self, py: Python<'py>, paths: Vec<String>, timeout: Option<f64>) -> PyResult<Bound<'py, PyList>> {
        let conn = self.conn()?;
        let client = conn.client()?;
        let within = timeout_of(timeout);
        let mut out: Vec<Option<Bound<'py, PyAny>>> = (0..paths.len()).map(|_| None).collect();
        let mut again: Vec<(usize, u64)> = Vec::new();
        let mut next = 0;
        while next < paths.len() {
            let guess = slot(conn.size_guess.load(Ordering::Relaxed));
            let take = (((conn.batch_bytes / guess).max(1)) as usize).min(MAX_BATCH_ITEMS).min(paths.len() - next);
            let chunk = next..next + take;
            next += take;
            let items: Vec<BatchGet> = chunk
                .clone()
                .enumerate()
                .map(|(k, i)| BatchGet {
                    path: paths[i].clone(),
                    region_id: String::new(),
                    offset: k as u64 * guess,
                    range: None,
                    max_bytes: guess,
                    if_match: String::new(),
                })
                .collect();
            let total = guess * take as u64;
            let batch = async {
                let region = conn.checkout(client, total).await?;
                let items: Vec<BatchGet> =
                    items.into_iter().map(|i| BatchGet { region_id: region.id().to_owned(), ..i }).collect();
                let got = client.get_many(&items).await;
                Ok::<_, ClientError>((region, got))
            };
            let (region, got) =
                conn.block_on(py, sluice_client::with_timeout(within, batch))?.map_err(|e| raise(&e))?;
            let results = match got {
                Ok(r) => r,
                // Refused as a whole: each item's failure, as in Python.
                Err(e @ ClientError::Shim { .. }) => {
                    let f = failure(&e);
                    conn.give_back(region, true);
                    for i in chunk {
                        out[i] = Some((false, f.0, f.1, f.2.clone(), f.3.clone(), f.4).into_pyobject(py)?.into_any());
                    }
                    continue;
                }
                Err(e) => {
                    conn.give_back(region, false);
                    return Err(raise(&e));
                }
            };
            let mut seen = 0u64;
            for ((k, i), r) in chunk.enumerate().zip(results) {
                match r {
                    Ok(t) => {
                        seen = seen.max(t.bytes);
                        let data = bytes_of(py, &region, k as u64 * guess, t.bytes)?;
                        out[i] = Some((true, data, transfer_tuple(&t)).into_pyobject(py)?.into_any());
                    }
                    Err(e) if e.code() == Some(Code::RegionTooSmall) => {
                        seen = seen.max(e.needed_bytes());
                        again.push((i, e.needed_bytes()));
                    }
                    Err(e) => {
                        let (kind, code, message, request_id, needed) = failure(&e);
                        out[i] = Some((false, kind, code, message, request_id, needed).into_pyobject(py)?.into_any());
                    }
                }
            }
            conn.give_back(region, true);
            if seen > 0 {
                conn.size_guess.store(pow2(seen), Ordering::Relaxed);
            }
        }
        // Items bigger than their slot: one at a time, at the size the shim said.
        for (i, need) in again {
            let (got, spare) =
                conn.block_on(py, sluice_client::with_timeout(within, conn.get_into_scratch(&paths[i], need)))?;
            if let Some(region) = spare {
                let reuse = matches!(&got, Err(ClientError::Shim { .. }));
                conn.give_back(region, reuse);
            }
            out[i] = Some(match got {
                Ok((region, t)) => {
                    let data = bytes_of(py, &region, 0, t.bytes);
                    conn.give_back(region, true);
                    (true, data?, transfer_tuple(&t)).into_pyobject(py)?.into_any()
                }
                Err(e) => {
                    let (kind, code, message, request_id, needed) = failure(&e);
                    (false, kind, code, message, request_id, needed).into_pyobject(py)?.into_any()
                }
            });
        }
        PyList::new(py, out.into_iter().map(|o| o.unwrap_or_else(|| py.None().into_bound(py))))
    }

    /// This connection's session counters: (requests, bytes_read,
    /// bytes_written, errors, fallbacks, regions, registered_bytes).
    fn stats(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64, u64, u32, u64)> {
        let conn = self.conn()?;
        let client = conn.client()?;
        let s = conn.block_on(py, client.stats())?.map_err(|e| raise(&e))?;
        Ok((s.requests, s.bytes_read, s.bytes_written, s.errors, s.fallbacks, s.regions, s.registered_bytes))
    }

    /// Closes the connection once the calls in flight are done; later
    /// calls raise `NativeError("closed", ...)`.
    fn close(&self, py: Python<'_>) {
        let conn = self.conn.write().unwrap_or_else(|p| p.into_inner()).take();
        // Dropping the last reference shuts the runtime down: not with the
        // interpreter lock held.
        py.detach(move || drop(conn));
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).is_none()
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Reader>()?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    Ok(())
}
