//! Rust client for the Sluice host shim's local socket API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::ClientError> {
//! let client = sluice_client::Client::connect("/run/sluice/shim.sock").await?;
//! let region = client.register(64 << 20).await?;
//! let got = client.get("data/train/shard-0001", &region, 0, None).await?;
//! let bytes = &region.as_slice()[..got.bytes as usize];
//! # let _ = bytes; Ok(()) }
//! ```
//!
//! Requests may be issued concurrently from many tasks on one client; they are
//! pipelined on the one connection.
//!
//! GPU memory of this process is a region too ([`Client::register_gpu`],
//! then [`Client::get_gpu`], [`Client::get_many_gpu`], [`Client::put_gpu`]):
//! bytes pass through pinned staging lanes and the GPU's copy engines, in
//! this process (see the `gpu` module). CUDA is loaded at run time
//! ([`cuda`]); without it those calls fail with `UNSUPPORTED`.

#![forbid(unsafe_code)]

mod error;
mod gpu;
mod gpu_ops;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sluice_proto::common::{ByteRange, DataPath, ErrorCode, ObjectInfo, TransferReport};
use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};
use sluice_proto::{encode_frame, Message, MAX_FRAME_LEN, SHIM_PROTOCOL_VERSION};
use sluice_shm::{FrameReader, MappedRegion};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, Mutex};

pub use sluice_proto::common::ErrorCode as Code;
pub use sluice_proto::common::ObjectInfo as Object;
pub use sluice_proto::common::{Capabilities, MemoryKind, NamespaceCapabilities};

pub use error::ClientError;
pub use gpu::{GpuBatchGet, GpuOptions, GpuRegion, GpuTransfer, PinRegions, DEFAULT_LANE_BYTES, DEFAULT_STAGING_BYTES};
/// The CUDA layer the GPU calls use (its driver, host model and types).
pub use sluice_cuda as cuda;

tokio::task_local! {
    /// A deadline for the requests sent inside [`with_timeout`], in ms (0:
    /// the namespace's), instead of the client's own.
    static CALL_TIMEOUT_MS: u64;
}

/// Runs `f` with its requests carrying `timeout` (`None`: the namespace's
/// deadline) instead of the client's [`Client::set_timeout`]: how callers
/// sharing one client give each call its own deadline.
pub async fn with_timeout<F: std::future::Future>(timeout: Option<std::time::Duration>, f: F) -> F::Output {
    CALL_TIMEOUT_MS.scope(timeout_ms(timeout), f).await
}

fn timeout_ms(timeout: Option<std::time::Duration>) -> u64 {
    timeout.map_or(0, |t| t.as_millis().clamp(1, u128::from(u32::MAX)) as u64)
}

/// A registered shared-memory region, mapped in this process.
#[derive(Debug)]
pub struct Region {
    id: String,
    map: Arc<MappedRegion>,
    /// Pinned for CUDA ([`PinRegions`]); holds the mapping, so the memory
    /// is unpinned before it is unmapped.
    pinned: Option<Arc<sluice_cuda::PinnedHost>>,
}

impl Region {
    fn new(id: String, map: MappedRegion) -> Self {
        Self { id, map: Arc::new(map), pinned: None }
    }
    /// Whether the region is pinned for CUDA: copies between it and a GPU
    /// run at the copy engines' full speed.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }
    pub(crate) fn memory(&self) -> Arc<dyn sluice_cuda::HostMemory> {
        self.map.clone()
    }
    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn len(&self) -> u64 {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// The region's bytes. Do not hold this across a request that writes
    /// into the region.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_slice()
    }
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        Ok(self.map.write_at(offset, data)?)
    }
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), ClientError> {
        Ok(self.map.read_at(offset, out)?)
    }
    /// The region's memory file (sealed: it can neither shrink nor grow).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.map.fd()
    }
}

/// How a transfer went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub request_id: String,
    pub bytes: u64,
    /// "http", "rdma", "rdma-staged".
    pub data_path: &'static str,
    /// Empty unless the request fell back from its configured data path.
    pub fallback_reason: String,
    pub elapsed_us: u64,
    pub parts: u32,
    pub etag: String,
    /// GET: size of the whole object; PUT: bytes stored.
    pub object_size: u64,
    /// The bytes were checked end to end (GET: against the object's
    /// CRC64NVME, or by decryption; PUT: the store confirmed them). false
    /// when nothing could check them, or the agent is older than the check.
    pub verified: bool,
    /// Why `verified` is false ("" when it is true).
    pub unverified_reason: String,
}

fn transfer(r: Option<TransferReport>, etag: String, object_size: u64) -> Transfer {
    let r = r.unwrap_or_default();
    Transfer {
        request_id: r.request_id,
        bytes: r.bytes,
        data_path: match DataPath::try_from(r.data_path) {
            Ok(DataPath::Http) => "http",
            Ok(DataPath::Rdma) => "rdma",
            Ok(DataPath::RdmaStaged) => "rdma-staged",
            _ => "unknown",
        },
        fallback_reason: r.fallback_reason,
        elapsed_us: r.elapsed_us,
        parts: r.parts,
        etag,
        object_size,
        verified: r.verified,
        unverified_reason: r.unverified_reason,
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectInfo>,
    pub common_prefixes: Vec<String>,
    pub next_continuation_token: String,
}

/// Session counters.
pub type Stats = pb::StatsResult;

struct Reply {
    resp: pb::Response,
    fd: Option<OwnedFd>,
}

/// Who waits for the answers to a request id.
enum Waiter {
    /// One answer.
    One(oneshot::Sender<Reply>),
    /// A GetBatch: one answer per item, until the caller has them all.
    Many(tokio::sync::mpsc::UnboundedSender<pb::Response>),
}

type Pending = std::sync::Mutex<HashMap<u64, Waiter>>;

/// Regions the shim registered for this client that nothing holds any
/// more: registered by a request whose caller stopped waiting (cancelled,
/// timed out), or staging dropped mid-request. Released with the shim at
/// the next registration or GPU request, so they do not count against the
/// session's limits until the connection ends.
type Orphans = std::sync::Mutex<Vec<String>>;

/// `Response.item` of an answer about a whole batch (refused as such).
const WHOLE_BATCH: u32 = u32::MAX;

/// One GET of a [`Client::get_many`] batch.
#[derive(Debug, Clone)]
pub struct BatchGet {
    /// "namespace/key".
    pub path: String,
    pub region_id: String,
    pub offset: u64,
    /// `(start, Some(len))`, or `(start, None)` to the end; `None`: all.
    pub range: Option<(u64, Option<u64>)>,
    /// Most bytes the data may take from `offset` (a slot of a shared
    /// region); 0 = up to the region's end.
    pub max_bytes: u64,
    /// The ETag the object must have (empty: any version).
    pub if_match: String,
}

/// The request deadline of a new client (the agent's default namespace
/// deadline is the same).
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// How long past a request's deadline the client waits for the shim's own
/// DEADLINE_EXCEEDED answer before giving up locally.
const ANSWER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A connection to the shim.
pub struct Client {
    stream: Arc<UnixStream>,
    write: Mutex<()>,
    pending: Arc<Pending>,
    next_id: AtomicU64,
    /// Deadline of each request in ms (0: none; the namespace's applies).
    timeout_ms: AtomicU64,
    tenant: String,
    namespaces: Vec<String>,
    capabilities: Capabilities,
    /// What another connection of this process names to join this one's
    /// session (empty from a shim older than joining).
    join_token: String,
    gpu: gpu::GpuState,
    orphans: Arc<Orphans>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Client {
    /// Connects and performs the versioned handshake.
    pub async fn connect(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        Self::connect_with(path, GpuOptions::default()).await
    }

    /// As [`Client::connect`], with GPU settings (the CUDA driver, staging,
    /// pinning of host regions).
    pub async fn connect_with(path: impl AsRef<Path>, gpu: GpuOptions) -> Result<Self, ClientError> {
        Self::connect_joining(path, gpu, "").await
    }

    /// As [`Client::connect_with`], joining the session of another
    /// connection of this process: `join` is its [`Client::join_token`]
    /// (empty: open a session of its own). This connection then names the
    /// other's regions by id ([`Client::get_by_id`]); the regions it
    /// registers itself are released when it closes, and the shim closes it
    /// when the other connection closes. A shim refuses a token of another
    /// process, or of a connection that has closed (`BAD_REQUEST`).
    pub async fn connect_joining(path: impl AsRef<Path>, gpu: GpuOptions, join: &str) -> Result<Self, ClientError> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })?;
        let stream = Arc::new(stream);
        let pending: Arc<Pending> = Arc::default();
        let orphans: Arc<Orphans> = Arc::default();
        let reader = tokio::spawn(read_loop(stream.clone(), pending.clone(), orphans.clone()));
        let mut client = Self {
            stream,
            write: Mutex::new(()),
            pending,
            next_id: AtomicU64::new(1),
            timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            tenant: String::new(),
            namespaces: Vec::new(),
            capabilities: Capabilities::default(),
            join_token: String::new(),
            gpu: gpu::GpuState::new(gpu),
            orphans,
            reader,
        };
        let hello = Op::Hello(pb::Hello {
            version: SHIM_PROTOCOL_VERSION,
            client: format!("sluice-client/{}", env!("CARGO_PKG_VERSION")),
            join: join.to_owned(),
        });
        match client.call(hello, None, "").await?.resp.result {
            Some(Res::Hello(ok)) => {
                client.tenant = ok.tenant;
                client.namespaces = ok.namespaces;
                client.capabilities = ok.capabilities.unwrap_or_default();
                client.join_token = ok.join_token;
                Ok(client)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Sets the end-to-end deadline of the requests this client sends from
    /// now on (`None`: the namespace's default, which is also the most the
    /// agent allows). The shim and agent get the same deadline and stop the
    /// request when it passes (DEADLINE_EXCEEDED); the client stops waiting
    /// a moment later ([`ClientError::Timeout`]).
    pub fn set_timeout(&self, timeout: Option<std::time::Duration>) {
        self.timeout_ms.store(timeout_ms(timeout), Ordering::Relaxed);
    }

    /// The tenant the shim mapped this process to.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Namespaces the tenant may use.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// What this connection can do, as the shim and agent told it at the
    /// handshake: the region memory both can handle, and per namespace the
    /// access, data path, transport, placement, encryption and limits.
    /// Requests outside it fail with UNSUPPORTED before any byte moves.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// What another connection of this process passes to
    /// [`Client::connect_joining`] to share this one's session and regions
    /// (empty: the shim does not offer joining).
    pub fn join_token(&self) -> &str {
        &self.join_token
    }

    async fn call(
        &self,
        op: Op,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        request_id: &str,
    ) -> Result<Reply, ClientError> {
        let (tx, rx) = oneshot::channel();
        let (id, timeout_ms) = self.send(op, fd, request_id, Waiter::One(tx)).await?;
        let reply = if timeout_ms == 0 {
            rx.await.map_err(|_| ClientError::Disconnected)?
        } else {
            let wait = std::time::Duration::from_millis(timeout_ms) + ANSWER_GRACE;
            match tokio::time::timeout(wait, rx).await {
                Ok(r) => r.map_err(|_| ClientError::Disconnected)?,
                Err(_) => {
                    self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    return Err(ClientError::Timeout(wait));
                }
            }
        };
        if let Some(Res::Error(e)) = &reply.resp.result {
            return Err(ClientError::Shim {
                code: ErrorCode::try_from(e.code).unwrap_or(ErrorCode::Internal),
                message: e.message.clone(),
                request_id: reply.resp.request_id.clone(),
                needed_bytes: e.needed_bytes,
            });
        }
        Ok(reply)
    }

    /// Sends one request whose answers go to `waiter`; returns its id and
    /// the deadline it carried (ms, 0: none).
    async fn send(
        &self,
        op: Op,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        request_id: &str,
        waiter: Waiter,
    ) -> Result<(u64, u64), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(id, waiter);
        let timeout_ms = CALL_TIMEOUT_MS.try_with(|ms| *ms).unwrap_or_else(|_| self.timeout_ms.load(Ordering::Relaxed));
        let frame = encode_frame(&pb::Request {
            id,
            request_id: request_id.to_owned(),
            op: Some(op),
            timeout_ms: timeout_ms.min(u64::from(u32::MAX)) as u32,
        });
        let sent = {
            let _w = self.write.lock().await;
            let fds: Vec<_> = fd.into_iter().collect();
            sluice_shm::send_with_fds(&self.stream, &frame, &fds).await
        };
        if let Err(e) = sent {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            return Err(e.into());
        }
        Ok((id, timeout_ms))
    }

    /// Reads many objects with one request (one frame each way per item
    /// finishing, one agent call for the batch). Returns one result per
    /// item, in order; an item's failure never fails the others. `Err` only
    /// when the batch as a whole could not be served (refused, connection
    /// lost, no answer in time).
    pub async fn get_many(&self, items: &[BatchGet]) -> Result<Vec<Result<Transfer, ClientError>>, ClientError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let op = Op::GetBatch(pb::GetBatch {
            items: items
                .iter()
                .map(|i| pb::Get {
                    path: i.path.clone(),
                    range: i.range.map(|(start, length)| ByteRange { start, length }),
                    region_id: i.region_id.clone(),
                    offset: i.offset,
                    max_bytes: i.max_bytes,
                    if_match: i.if_match.clone(),
                })
                .collect(),
        });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (id, timeout_ms) = self.send(op, None, "", Waiter::Many(tx)).await?;
        let mut out: Vec<Option<Result<Transfer, ClientError>>> = (0..items.len()).map(|_| None).collect();
        let mut left = items.len();
        let collect = async {
            while left > 0 {
                let resp = rx.recv().await.ok_or(ClientError::Disconnected)?;
                let result = match resp.result {
                    Some(Res::Get(g)) => Ok(transfer(g.report, g.etag, g.object_size)),
                    Some(Res::Error(e)) => {
                        let err = ClientError::Shim {
                            code: ErrorCode::try_from(e.code).unwrap_or(ErrorCode::Internal),
                            message: e.message,
                            request_id: resp.request_id,
                            needed_bytes: e.needed_bytes,
                        };
                        if resp.item == WHOLE_BATCH {
                            return Err(err);
                        }
                        Err(err)
                    }
                    other => Err(unexpected(other)),
                };
                if let Some(slot @ None) = out.get_mut(resp.item as usize) {
                    *slot = Some(result);
                    left -= 1;
                }
            }
            Ok(())
        };
        let done = if timeout_ms == 0 {
            collect.await
        } else {
            let wait = std::time::Duration::from_millis(timeout_ms) + ANSWER_GRACE;
            tokio::time::timeout(wait, collect).await.unwrap_or(Err(ClientError::Timeout(wait)))
        };
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        done?;
        Ok(out.into_iter().map(|r| r.unwrap_or(Err(ClientError::Disconnected))).collect())
    }

    /// Registers a new shared-memory region of `len` bytes, created by the
    /// shim. It is pinned for CUDA as [`GpuOptions::pin_regions`] says
    /// ([`Region::is_pinned`]).
    pub async fn register(&self, len: u64) -> Result<Region, ClientError> {
        let region = self.register_unpinned(len).await?;
        self.pin_or_release(region).await
    }

    /// A new region, never pinned here (lanes pin their own).
    pub(crate) async fn register_unpinned(&self, len: u64) -> Result<Region, ClientError> {
        self.release_orphans().await;
        let reply = self.call(Op::Register(pb::Register { length: len, ..Default::default() }), None, "").await?;
        match (reply.resp.result, reply.fd) {
            (Some(Res::Registered(r)), Some(fd)) if r.fd_attached => {
                Ok(Region::new(r.region_id, MappedRegion::map(fd, r.length)?))
            }
            (Some(Res::Registered(_)), None) => Err(ClientError::Protocol("Registered without a descriptor".into())),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Registers memory this process already has: `map`'s memfd (pinned
    /// for CUDA as [`Client::register`] pins).
    pub async fn register_mapped(&self, map: MappedRegion) -> Result<Region, ClientError> {
        self.release_orphans().await;
        let op = Op::Register(pb::Register { length: map.len(), fd_attached: true, ..Default::default() });
        let reply = self.call(op, Some(map.fd()), "").await?;
        match reply.resp.result {
            Some(Res::Registered(r)) => self.pin_or_release(Region::new(r.region_id, map)).await,
            other => Err(unexpected(other)),
        }
    }

    /// Pins a new region for CUDA if so configured; a failure that must
    /// fail the registration (`PinRegions::Always`) releases it first.
    async fn pin_or_release(&self, mut region: Region) -> Result<Region, ClientError> {
        match self.gpu.pin_new(&region) {
            Ok(pinned) => {
                region.pinned = pinned;
                Ok(region)
            }
            Err(e) => {
                let _ = self.release_id(&region.id).await;
                Err(e.into())
            }
        }
    }

    /// Registers `len` bytes of a memory file this process made and maps
    /// itself; returns the region id. The shim accepts only a memfd sealed
    /// against shrinking (`F_SEAL_SHRINK`), since the agent maps it too;
    /// anything else is BAD_REQUEST.
    pub async fn register_fd(&self, fd: std::os::fd::BorrowedFd<'_>, len: u64) -> Result<String, ClientError> {
        let op = Op::Register(pb::Register { length: len, fd_attached: true, ..Default::default() });
        match self.call(op, Some(fd), "").await?.resp.result {
            Some(Res::Registered(r)) => Ok(r.region_id),
            other => Err(unexpected(other)),
        }
    }

    /// Registers GPU memory: `len` bytes at `offset` of a CUDA dma-buf
    /// (`cuMemGetHandleForAddressRange`) whose range starts at CUDA address
    /// `gpu_address`. Returns the region id (release it with
    /// [`release_id`](Self::release_id)). Needs a shim with the DOCA memory
    /// backend; elsewhere the shim answers `UNSUPPORTED`.
    pub async fn register_dmabuf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: u64,
        gpu_address: u64,
    ) -> Result<String, ClientError> {
        let op = Op::Register(pb::Register {
            length: len,
            fd_attached: true,
            kind: pb::RegionKind::GpuDmabuf as i32,
            dmabuf_offset: offset,
            gpu_address,
        });
        match self.call(op, Some(fd), "").await?.resp.result {
            Some(Res::Registered(r)) => Ok(r.region_id),
            other => Err(unexpected(other)),
        }
    }

    /// Releases the regions in [`Orphans`], one at a time (a release sent
    /// is done by the shim even if this caller stops waiting).
    pub(crate) async fn release_orphans(&self) {
        loop {
            let Some(id) = self.orphans.lock().unwrap_or_else(|p| p.into_inner()).pop() else { return };
            if let Err(e) = self.release_id(&id).await {
                tracing::debug!(region = %id, error = %e, "releasing an abandoned region");
            }
        }
    }

    /// Releases a region (the shim and agent drop their mappings).
    pub async fn release(&self, region: Region) -> Result<(), ClientError> {
        self.release_id(&region.id).await
    }

    /// Releases by id (also how a caller would try someone else's id).
    pub async fn release_id(&self, region_id: &str) -> Result<(), ClientError> {
        self.call(Op::Release(pb::Release { region_id: region_id.to_owned() }), None, "").await.map(|_| ())
    }

    /// Reads `path` ("ns/key"), or `range` of it (`(start, Some(len))`, or
    /// `(start, None)` to the end), into `region` at `offset`.
    pub async fn get(
        &self,
        path: &str,
        region: &Region,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<Transfer, ClientError> {
        self.get_by_id(path, region.id(), offset, range).await
    }

    /// As [`Client::get`], naming the region by id.
    pub async fn get_by_id(
        &self,
        path: &str,
        region_id: &str,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<Transfer, ClientError> {
        self.get_pinned(path, region_id, offset, range, "").await
    }

    /// As [`Client::get_by_id`], but only from the object version with ETag
    /// `if_match` (as a [`Transfer`] returned it; empty: any): another
    /// version fails with `PreconditionFailed`, writing nothing. How one
    /// object is read in several ranged GETs without mixing versions.
    pub async fn get_pinned(
        &self,
        path: &str,
        region_id: &str,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
        if_match: &str,
    ) -> Result<Transfer, ClientError> {
        let op = Op::Get(pb::Get {
            path: path.to_owned(),
            range: range.map(|(start, length)| ByteRange { start, length }),
            region_id: region_id.to_owned(),
            offset,
            max_bytes: 0,
            if_match: if_match.to_owned(),
        });
        match self.call(op, None, "").await?.resp.result {
            Some(Res::Get(g)) => Ok(transfer(g.report, g.etag, g.object_size)),
            other => Err(unexpected(other)),
        }
    }

    /// Stores `len` bytes of `region` from `offset` as `path`.
    pub async fn put(&self, path: &str, region: &Region, offset: u64, len: u64) -> Result<Transfer, ClientError> {
        self.put_by_id(path, region.id(), offset, len, "").await
    }

    /// As [`Client::put`], naming the region by id, with a content type.
    pub async fn put_by_id(
        &self,
        path: &str,
        region_id: &str,
        offset: u64,
        len: u64,
        content_type: &str,
    ) -> Result<Transfer, ClientError> {
        let op = Op::Put(pb::Put {
            path: path.to_owned(),
            region_id: region_id.to_owned(),
            offset,
            length: len,
            content_type: content_type.to_owned(),
        });
        match self.call(op, None, "").await?.resp.result {
            Some(Res::Put(p)) => Ok(transfer(p.report, p.etag, len)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn head(&self, path: &str) -> Result<ObjectInfo, ClientError> {
        match self.call(Op::Head(pb::Head { path: path.to_owned() }), None, "").await?.resp.result {
            Some(Res::Head(o)) => Ok(o),
            other => Err(unexpected(other)),
        }
    }

    /// One page of objects under `path` ("ns" or "ns/prefix").
    pub async fn list_page(
        &self,
        path: &str,
        continuation_token: &str,
        max_keys: u32,
        delimiter: &str,
    ) -> Result<ListPage, ClientError> {
        let op = Op::List(pb::List {
            path: path.to_owned(),
            continuation_token: continuation_token.to_owned(),
            max_keys,
            delimiter: delimiter.to_owned(),
        });
        match self.call(op, None, "").await?.resp.result {
            Some(Res::List(l)) => Ok(ListPage {
                objects: l.objects,
                common_prefixes: l.common_prefixes,
                next_continuation_token: l.next_continuation_token,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Every object under `path`, following continuation tokens.
    pub async fn list_all(&self, path: &str) -> Result<Vec<ObjectInfo>, ClientError> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self.list_page(path, &token, 0, "").await?;
            out.extend(page.objects);
            if page.next_continuation_token.is_empty() {
                return Ok(out);
            }
            token = page.next_continuation_token;
        }
    }

    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.call(Op::Delete(pb::Delete { path: path.to_owned() }), None, "").await.map(|_| ())
    }

    pub async fn stats(&self) -> Result<Stats, ClientError> {
        match self.call(Op::Stats(pb::Stats {}), None, "").await?.resp.result {
            Some(Res::Stats(s)) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// Sends raw bytes on the connection (for protocol tests).
    /// Ends the connection now, for every caller: requests waiting for an
    /// answer fail with [`ClientError::Disconnected`], later ones fail to
    /// send. The shim releases this connection's regions. (Dropping the
    /// client ends it too, but only once no call holds it.)
    pub fn shutdown(&self) {
        use std::os::fd::AsRawFd;
        // The read loop sees the end of the stream and wakes every waiter.
        let _ = nix::sys::socket::shutdown(self.stream.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }

    /// The connection's socket descriptor, for a process forked since the
    /// client was made: the child closes its copy (and must then forget the
    /// client, never drop it) so the shim sees the connection end with the
    /// parent.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.as_raw_fd()
    }

    #[doc(hidden)]
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<(), ClientError> {
        let _w = self.write.lock().await;
        Ok(sluice_shm::send_with_fds(&self.stream, bytes, &[]).await?)
    }
}

fn unexpected(r: Option<Res>) -> ClientError {
    ClientError::Protocol(format!("unexpected response {r:?}"))
}

/// Routes responses to waiting calls; when the connection ends, every
/// waiting call sees `Disconnected`. A region registered for a caller that
/// no longer waits goes to `orphans`.
async fn read_loop(stream: Arc<UnixStream>, pending: Arc<Pending>, orphans: Arc<Orphans>) {
    let orphan = |resp: pb::Response| {
        if let Some(Res::Registered(r)) = resp.result {
            orphans.lock().unwrap_or_else(|p| p.into_inner()).push(r.region_id);
        }
    };
    let mut reader = FrameReader::new(stream, MAX_FRAME_LEN);
    while let Ok(Some(frame)) = reader.next_frame().await {
        let Ok(resp) = pb::Response::decode(frame.as_slice()) else { break };
        let fd = match &resp.result {
            Some(Res::Registered(r)) if r.fd_attached => reader.take_fd(),
            _ => None,
        };
        if resp.id == 0 {
            // A connection-level error not tied to a request (e.g. an
            // undecodable frame we sent); nothing waits for it.
            tracing::warn!(?resp, "shim reported a connection-level error");
            continue;
        }
        let mut map = pending.lock().unwrap_or_else(|p| p.into_inner());
        match map.remove(&resp.id) {
            Some(Waiter::One(tx)) => {
                drop(map);
                if let Err(reply) = tx.send(Reply { resp, fd }) {
                    orphan(reply.resp);
                }
            }
            Some(Waiter::Many(tx)) => {
                // The caller removes it once it has every item.
                let id = resp.id;
                if tx.send(resp).is_ok() {
                    map.insert(id, Waiter::Many(tx));
                }
            }
            None => {
                drop(map);
                orphan(resp);
            }
        }
    }
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
