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

mod conn;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use conn::{slot, Conn, Stopped, MAX_BATCH_ITEMS};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use sluice_client::{BatchGet, Client, ClientError, Code, GpuOptions, PinRegions, Region, Transfer};

pyo3::create_exception!(
    _native,
    NativeError,
    PyException,
    "A failed native read: args are (kind, code, message, request_id, needed_bytes)."
);

/// Copies at least this big run with the interpreter lock released.
const UNLOCKED_COPY: usize = 256 << 10;
/// Results at least this big get huge pages where the kernel has them (a
/// fresh mapping whatever `malloc`'s thresholds: a fault per 2 MiB, not per
/// 4 KiB; as `sluice._bigcopy` does).
const HUGE_PAGE_COPY: usize = 32 << 20;

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

fn native_error(kind: &'static str, message: &str) -> PyErr {
    NativeError::new_err((kind, 0, message.to_owned(), String::new(), 0u64))
}

/// A transfer as the tuple `sluice.Transfer` is made from.
type TransferTuple = (String, u64, &'static str, String, u64, u32, String, u64, bool, String);

fn transfer_tuple(t: &Transfer) -> TransferTuple {
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

/// A deadline in seconds from Python (`None`, 0, negative, NaN: none; too
/// large for a `Duration`: the most a request can carry).
fn timeout_of(seconds: Option<f64>) -> Option<Duration> {
    seconds
        .filter(|s| *s > 0.0)
        .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::from_secs(u64::from(u32::MAX))))
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
    // set, turned into Err by `from_owned_ptr_or_err`). Nothing else can see
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
    /// Made with a join token: in the Python connection's session.
    joined: bool,
}

impl Reader {
    fn conn(&self) -> PyResult<Arc<Conn>> {
        let conn = self.conn.read().unwrap_or_else(|p| p.into_inner()).clone();
        conn.ok_or_else(|| native_error("closed", "the native reader is closed"))
    }

    /// Takes the connection out (if it is still `conn`) and ends it for
    /// every caller: waiting calls fail with `Disconnected` at once.
    fn end(&self, conn: &Arc<Conn>) {
        let mut slot = self.conn.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
        drop(slot);
        if let Some(client) = conn.client() {
            client.shutdown();
        }
    }

    /// Runs `f` on the connection's runtime. A call interrupted by a signal
    /// may have left a request half sent or an answer half read, so the
    /// connection is not trusted any more: it is ended (the shim releases
    /// its regions) and the client makes a new one for the next call, as
    /// the Python path does.
    fn run<F, T>(&self, py: Python<'_>, conn: &Arc<Conn>, f: F) -> PyResult<T>
    where
        F: std::future::Future<Output = T> + Send,
        T: Send,
    {
        conn.block_on(py, f).map_err(|stopped| match stopped {
            Stopped::Signal(e) => {
                self.end(conn);
                e
            }
            Stopped::Refused(e) => e,
        })
    }

    /// The copy of one item's bytes out of its slot, as Python's tuple.
    fn item<'py>(
        py: Python<'py>,
        region: &Region,
        offset: u64,
        room: u64,
        t: &Transfer,
    ) -> PyResult<Bound<'py, PyAny>> {
        if t.bytes > room {
            return failed(
                py,
                &ClientError::Protocol(format!("the shim reported {} bytes for a slot of {room}", t.bytes)),
            );
        }
        Ok((true, bytes_of(py, region, offset, t.bytes)?, transfer_tuple(t)).into_pyobject(py)?.into_any())
    }
}

/// Whether a read that failed with `e` has stopped writing into its region
/// for good, so the region may serve another read: only errors the agent
/// answered, never the shim's own deadline, a lost agent link, an internal
/// error or a failed connection (after those the agent may still write).
fn stopped_writing(e: &ClientError) -> bool {
    matches!(e, ClientError::Shim { .. })
        && !matches!(e.code(), Some(Code::DeadlineExceeded | Code::AgentUnavailable | Code::Internal))
}

fn failed<'py>(py: Python<'py>, e: &ClientError) -> PyResult<Bound<'py, PyAny>> {
    let (kind, code, message, request_id, needed) = failure(e);
    Ok((false, kind, code, message, request_id, needed).into_pyobject(py)?.into_any())
}

#[pymethods]
impl Reader {
    /// Connects to the shim at `socket` and says hello; with `join` (the
    /// Python connection's join token), in that connection's session, so
    /// its regions can be named here (`get_into`).
    #[new]
    #[pyo3(signature = (socket, connect_timeout=30.0, scratch_bytes=256 << 20, batch_bytes=256 << 20, join=String::new()))]
    fn new(
        py: Python<'_>,
        socket: String,
        connect_timeout: Option<f64>,
        scratch_bytes: u64,
        batch_bytes: u64,
        join: String,
    ) -> PyResult<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| native_error("connect", &format!("starting the native runtime: {e}")))?;
        // Scratch only holds results on their way into Python `bytes`:
        // pinning it for CUDA would buy nothing.
        let options = GpuOptions { pin_regions: PinRegions::Never, ..GpuOptions::default() };
        let connect = async {
            match timeout_of(connect_timeout) {
                Some(t) => tokio::time::timeout(t, Client::connect_joining(&socket, options, &join))
                    .await
                    .unwrap_or(Err(ClientError::Timeout(t))),
                None => Client::connect_joining(&socket, options, &join).await,
            }
        };
        let client = py.detach(|| rt.block_on(connect)).map_err(|e| raise(&e))?;
        // Joined only if the shim answered with the same session's token (a
        // shim that ignored `join` opened a session of its own).
        let joined = !join.is_empty() && client.join_token() == join;
        let conn = Conn::new(rt, client, scratch_bytes, batch_bytes);
        Ok(Self { conn: RwLock::new(Some(Arc::new(conn))), joined })
    }

    /// Reads `path` (or `length` bytes of it from `start`; `length` None:
    /// to the end) into the region `region_id` of the session this reader
    /// joined, at `offset`; returns the transfer tuple. As
    /// `Client.get(path, into=region)` of the Python path, with the same
    /// errors (the shim checks the region, the span and the offset).
    #[pyo3(signature = (path, region_id, offset=0, start=None, length=None, timeout=None, if_match=String::new()))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn get_into(
        &self,
        py: Python<'_>,
        path: &str,
        region_id: &str,
        offset: u64,
        start: Option<u64>,
        length: Option<u64>,
        timeout: Option<f64>,
        if_match: String,
    ) -> PyResult<TransferTuple> {
        let conn = self.conn()?;
        let client = Arc::clone(conn.client().ok_or_else(|| native_error("closed", "the native reader is closed"))?);
        let range = start.map(|s| (s, length));
        let got = self.run(
            py,
            &conn,
            sluice_client::with_timeout(timeout_of(timeout), async move {
                client.get_pinned(path, region_id, offset, range, &if_match).await
            }),
        )?;
        got.map(|t| transfer_tuple(&t)).map_err(|e| raise(&e))
    }

    /// Reads every item into a region of the session this reader joined,
    /// in GetBatch requests of at most 1,024 items; never raises for one
    /// item's failure. Items are `(path, region_id, offset, start, length,
    /// if_match)` (`start` None: the whole object; `length` None: to the
    /// end). Returns one tuple per item: `(True, transfer_tuple)` or
    /// `(False, kind, code, message, request_id, needed_bytes)`. As
    /// `Client.get_many(specs)` of the Python path.
    #[pyo3(signature = (items, timeout=None))]
    #[allow(clippy::type_complexity)] // Python's tuples
    fn get_many_into<'py>(
        &self,
        py: Python<'py>,
        items: Vec<(String, String, u64, Option<u64>, Option<u64>, String)>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let conn = self.conn()?;
        let client = Arc::clone(conn.client().ok_or_else(|| native_error("closed", "the native reader is closed"))?);
        let within = timeout_of(timeout);
        let mut out: Vec<Bound<'py, PyAny>> = Vec::with_capacity(items.len());
        // A connection that failed: every item not answered gets its error,
        // as on the Python path (only a timeout is raised).
        let mut broken: Option<ClientError> = None;
        for chunk in items.chunks(MAX_BATCH_ITEMS) {
            if let Some(e) = &broken {
                for _ in chunk {
                    out.push(failed(py, e)?);
                }
                continue;
            }
            let batch: Vec<BatchGet> = chunk
                .iter()
                .map(|(path, region_id, offset, start, length, if_match)| BatchGet {
                    path: path.clone(),
                    region_id: region_id.clone(),
                    offset: *offset,
                    range: start.map(|s| (s, *length)),
                    max_bytes: 0,
                    if_match: if_match.clone(),
                })
                .collect();
            let c = Arc::clone(&client);
            let got =
                self.run(py, &conn, sluice_client::with_timeout(within, async move { c.get_many(&batch).await }))?;
            match got {
                Ok(results) => {
                    for r in results {
                        out.push(match r {
                            Ok(t) => (true, transfer_tuple(&t)).into_pyobject(py)?.into_any(),
                            Err(e) => failed(py, &e)?,
                        });
                    }
                }
                Err(e @ ClientError::Timeout(_)) => return Err(raise(&e)),
                // Refused as a whole, or the connection failed: each
                // item's failure, as in Python.
                Err(e) => {
                    for _ in chunk {
                        out.push(failed(py, &e)?);
                    }
                    if !matches!(e, ClientError::Shim { .. }) {
                        broken = Some(e);
                    }
                }
            }
        }
        PyList::new(py, out)
    }

    /// Waits for the scratch releases this reader has sent (they are
    /// driven by its calls): a joined reader's counters are the session's,
    /// which the Python connection then reads settled.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        let conn = self.conn()?;
        let settled = conn.settle();
        self.run(py, &conn, settled)
    }

    /// Whether this reader joined the Python connection's session (its
    /// regions and counters are that session's).
    #[getter]
    fn joined(&self) -> bool {
        self.joined
    }

    /// Reads `path` whole; returns `(bytes, transfer_tuple)`, or only the
    /// bytes with `transfer=False`. `timeout`: the request's deadline in
    /// seconds (`None`: the namespace's).
    #[pyo3(signature = (path, size_hint=0, timeout=None, transfer=true))]
    fn get_bytes<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        size_hint: u64,
        timeout: Option<f64>,
        transfer: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let conn = self.conn()?;
        let got = self.run(
            py,
            &conn,
            sluice_client::with_timeout(timeout_of(timeout), conn.get_into_scratch(path, size_hint)),
        )?;
        let (region, t) = match got {
            Ok(ok) => ok,
            Err((e, spare)) => {
                if let Some(region) = spare {
                    conn.give_back(region, stopped_writing(&e));
                }
                return Err(raise(&e));
            }
        };
        let data = bytes_of(py, &region, 0, t.bytes);
        conn.give_back(region, true);
        if transfer {
            Ok((data?, transfer_tuple(&t)).into_pyobject(py)?.into_any())
        } else {
            Ok(data?.into_any())
        }
    }

    /// Reads every path whole, in batches; never raises for one item's
    /// failure. Returns one tuple per path: `(True, bytes, transfer_tuple)`
    /// or `(False, kind, code, message, request_id, needed_bytes)`.
    ///
    /// As the Python path: every item in slots of the size seen lately;
    /// those bigger than their slot again in a second round of batches at
    /// the size the shim reported; any still too big (or of a size the
    /// shim could not say) one by one.
    #[pyo3(signature = (paths, timeout=None))]
    fn get_many<'py>(&self, py: Python<'py>, paths: Vec<String>, timeout: Option<f64>) -> PyResult<Bound<'py, PyList>> {
        let conn = self.conn()?;
        let within = timeout_of(timeout);
        let mut out: Vec<Option<Bound<'py, PyAny>>> = (0..paths.len()).map(|_| None).collect();
        // (index, bytes it needs; 0: unknown)
        let mut todo: Vec<(usize, u64)> = (0..paths.len()).map(|i| (i, 0)).collect();
        let mut one_by_one: Vec<(usize, u64)> = Vec::new();
        for round in 0..2 {
            let guess = slot(conn.size_guess());
            let mut again = Vec::new();
            let mut seen = 0u64;
            let mut next = 0;
            while next < todo.len() {
                let mut chunk: Vec<(usize, u64, u64)> = Vec::new(); // (index, offset, slot)
                let mut total = 0u64;
                while next < todo.len() && chunk.len() < MAX_BATCH_ITEMS {
                    let (i, need) = todo[next];
                    let room = if need > 0 { slot(need) } else { guess };
                    if !chunk.is_empty() && total + room > conn.batch_bytes {
                        break;
                    }
                    chunk.push((i, total, room));
                    total += room;
                    next += 1;
                }
                let items: Vec<(&str, u64, u64)> =
                    chunk.iter().map(|&(i, off, room)| (paths[i].as_str(), off, room)).collect();
                let (region, got) = match self.run(
                    py,
                    &conn,
                    sluice_client::with_timeout(within, conn.batch_into_scratch(&items, total)),
                )? {
                    Ok(ok) => ok,
                    // No slot (the shim would not register one that large):
                    // these items' failure, as in Python, not the call's.
                    Err(e @ ClientError::Shim { .. }) => {
                        for &(i, _, _) in &chunk {
                            out[i] = Some(failed(py, &e)?);
                        }
                        continue;
                    }
                    Err(e) => return Err(raise(&e)),
                };
                // Whether nothing may still be written into the region: a
                // request the shim or the connection gave up on may be.
                let mut reuse = true;
                // Every result is taken out before the region goes back,
                // and an error (a failed allocation) only after that.
                let filled: PyResult<()> = (|| {
                    let results = match got {
                        Ok(r) => r,
                        // Refused as a whole: each item's failure, as in Python.
                        Err(e @ ClientError::Shim { .. }) => {
                            reuse = stopped_writing(&e);
                            for &(i, _, _) in &chunk {
                                out[i] = Some(failed(py, &e)?);
                            }
                            return Ok(());
                        }
                        // The connection failed: raised, and the region may
                        // still be written into.
                        Err(e) => {
                            reuse = false;
                            return Err(raise(&e));
                        }
                    };
                    for (&(i, off, room), r) in chunk.iter().zip(results) {
                        match r {
                            Ok(t) => {
                                seen = seen.max(t.bytes);
                                out[i] = Some(Self::item(py, &region, off, room, &t)?);
                            }
                            Err(e) if e.code() == Some(Code::RegionTooSmall) => {
                                if round == 0 && e.needed_bytes() > 0 {
                                    again.push((i, e.needed_bytes()));
                                } else {
                                    one_by_one.push((i, e.needed_bytes()));
                                }
                            }
                            Err(e) => {
                                reuse &= stopped_writing(&e);
                                out[i] = Some(failed(py, &e)?);
                            }
                        }
                    }
                    Ok(())
                })();
                conn.give_back(region, reuse && filled.is_ok());
                filled?;
            }
            if seen > 0 {
                conn.saw(seen);
            }
            todo = again;
            if todo.is_empty() {
                break;
            }
        }
        for (i, need) in one_by_one {
            let got =
                self.run(py, &conn, sluice_client::with_timeout(within, conn.get_into_scratch(&paths[i], need)))?;
            out[i] = Some(match got {
                Ok((region, t)) => {
                    let item = Self::item(py, &region, 0, region.len(), &t);
                    conn.give_back(region, true);
                    item?
                }
                Err((e, spare)) => {
                    if let Some(region) = spare {
                        conn.give_back(region, matches!(e, ClientError::Shim { .. }));
                    }
                    failed(py, &e)?
                }
            });
        }
        PyList::new(py, out.into_iter().map(|o| o.unwrap_or_else(|| py.None().into_bound(py))))
    }

    /// This connection's session counters: (requests, bytes_read,
    /// bytes_written, errors, fallbacks, regions, registered_bytes).
    fn stats(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64, u64, u32, u64)> {
        let conn = self.conn()?;
        let client = Arc::clone(conn.client().ok_or_else(|| native_error("closed", "the native reader is closed"))?);
        let s = self.run(py, &conn, async move { client.stats().await })?.map_err(|e| raise(&e))?;
        Ok((s.requests, s.bytes_read, s.bytes_written, s.errors, s.fallbacks, s.regions, s.registered_bytes))
    }

    /// Ends the connection: calls waiting on it fail with `Disconnected`,
    /// later ones raise `NativeError("closed", ...)`. The shim releases its
    /// regions.
    fn close(&self, py: Python<'_>) {
        let conn = self.conn.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(conn) = conn {
            if let Some(client) = conn.client() {
                client.shutdown();
            }
            // Dropping the last reference shuts the runtime down: not with
            // the interpreter lock held.
            py.detach(move || drop(conn));
        }
    }

    /// In a child forked since the reader was made: closes the child's copy
    /// of the socket (so the shim sees the connection end with the parent)
    /// and forgets the rest, which belongs to the parent's threads.
    fn abandon(&self) {
        let conn = self.conn.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(conn) = conn {
            if conn.pid == std::process::id() {
                *self.conn.write().unwrap_or_else(|p| p.into_inner()) = Some(conn);
                return;
            }
            if let Some(client) = conn.client() {
                let _ = nix::unistd::close(client.socket_fd());
            }
            std::mem::forget(conn);
        }
    }

    /// Whether the connection was closed or ended (by `close()`, or by a
    /// call interrupted by a signal).
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
