//! One client connection: identity, per-user connection limits, the Hello
//! deadline, pipelined requests with deadlines.
//!
//! Requests are read in order; each is then served on its own task, so a slow
//! GET never holds up a HEAD behind it. Responses go out through one writer
//! task, which keeps frames (and their descriptors) whole.
//!
//! Every request but Hello runs in the session Hello opened for the tenant
//! the caller's uid/gid map to: `Caller::session` is the one place a
//! request finds its session, and handlers take nothing else.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};
use sluice_proto::{encode_frame, Message, MAX_FRAME_LEN, SHIM_PROTOCOL_VERSION};
use sluice_shm::{FrameError, FrameReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn, Instrument};

use crate::config::{ShimConfig, ShimLimits};
use crate::error::ShimError;
use crate::in_doubt::LATE_WAIT;
use crate::metrics::ShimMetrics;
use crate::requests::RequestCtx;
use crate::session::{ConnectionTag, Peer, Session, SessionContext};

/// Extra time past a client's deadline for the agent's own DEADLINE_EXCEEDED
/// answer to come back before the shim gives up waiting.
const DEADLINE_GRACE: Duration = Duration::from_secs(2);
/// Longest the shim waits for the agent to open a session at Hello.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the shim waits to deliver a refusal to a client that is not
/// reading.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// `Response.item` of an answer about a whole GetBatch (refused as such).
pub const WHOLE_BATCH: u32 = u32::MAX;

/// Most bytes of queued frames the writer joins into one write.
const COALESCE_BYTES: usize = 64 << 10;

/// What every connection shares, and all a connection uses: the config
/// (callers and limits), the session layer (to open a session at Hello),
/// the open connections and the metrics.
pub struct ConnectionContext {
    config: Arc<ShimConfig>,
    sessions: Arc<SessionContext>,
    counts: ConnectionCounts,
    metrics: Arc<ShimMetrics>,
    /// Numbers connections (which one registered a region).
    next_conn: AtomicU64,
}

impl ConnectionContext {
    pub fn new(config: Arc<ShimConfig>, sessions: Arc<SessionContext>, metrics: Arc<ShimMetrics>) -> Self {
        Self { config, sessions, counts: ConnectionCounts::default(), metrics, next_conn: AtomicU64::new(1) }
    }

    /// Open connections, per uid.
    pub fn counts(&self) -> &ConnectionCounts {
        &self.counts
    }
}

/// Who is on the other end of a connection.
enum Caller {
    /// Before Hello: only Hello is served.
    Unbound(Peer),
    /// After Hello: the session opened for the tenant the caller's uid/gid
    /// map to, or joined (`joined`: opened by another connection of the
    /// same process). Every later request of the connection runs in it.
    Bound { session: Arc<Session>, joined: bool },
}

impl Caller {
    /// The session a request runs in: the check every request but Hello
    /// passes, and the only way a handler gets a session.
    fn session(&self, config: &ShimConfig) -> Result<Arc<Session>, ShimError> {
        match self {
            Self::Bound { session, .. } => Ok(session.clone()),
            Self::Unbound(Peer { uid, gid, .. }) => Err(if config.tenant_for(*uid, *gid).is_none() {
                ShimError::UnknownCaller { uid: *uid, gid: *gid }
            } else {
                ShimError::Protocol("send Hello first".into())
            }),
        }
    }
}

/// A response on its way out, with the descriptor it carries (if any).
struct Outgoing {
    frame: Vec<u8>,
    fd: Option<OwnedFd>,
}

/// Open connections, per uid and in total.
#[derive(Default)]
pub struct ConnectionCounts {
    per_uid: Mutex<HashMap<u32, usize>>,
}

/// One admitted connection; counted until dropped.
pub struct ConnectionSlot<'a> {
    counts: &'a ConnectionCounts,
    uid: u32,
}

impl ConnectionCounts {
    fn admit(&self, uid: u32, limits: &ShimLimits) -> Result<ConnectionSlot<'_>, ShimError> {
        let mut map = self.per_uid.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = map.values().sum();
        let mine = map.get(&uid).copied().unwrap_or(0);
        if total >= limits.max_connections {
            return Err(ShimError::Refused(format!(
                "the shim has {total} connections open (max_connections); try again later"
            )));
        }
        if mine >= limits.max_connections_per_uid {
            return Err(ShimError::Refused(format!(
                "uid {uid} has {mine} connections open (max_connections_per_uid); close some first"
            )));
        }
        *map.entry(uid).or_default() += 1;
        Ok(ConnectionSlot { counts: self, uid })
    }

    /// Open connections of `uid` (for tests and logs).
    pub fn of(&self, uid: u32) -> usize {
        self.per_uid.lock().unwrap_or_else(|p| p.into_inner()).get(&uid).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        let mut map = self.counts.per_uid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.uid);
            }
        }
    }
}

/// A request id for a request that came without one: a keyed hash
/// (SipHash, its key drawn once per process) of a counter. As unlikely to
/// repeat as the random ids it replaces, and as unrevealing: a tenant's ids
/// say nothing of how many requests others made between its own (a bare
/// counter would). Drawing each id from the kernel cost a system call per
/// request.
fn new_request_id() -> String {
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = std::hash::BuildHasher::hash_one(KEY.get_or_init(std::hash::RandomState::new), n);
    format!("{id:016x}")
}

/// Serves one client until it disconnects, then releases everything it held.
pub async fn serve(ctx: Arc<ConnectionContext>, stream: UnixStream) {
    let (uid, gid, pid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid(), c.pid().unwrap_or(-1)),
        Err(e) => {
            warn!(error = %e, "SO_PEERCRED failed; dropping connection");
            return;
        }
    };
    ctx.metrics.connections.inc();
    struct Open<'a>(&'a prometheus::IntGauge);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let _open = Open(&ctx.metrics.connections);
    let _slot = match ctx.counts.admit(uid, &ctx.config.limits) {
        Ok(slot) => slot,
        Err(e) => {
            warn!(uid, pid, error = %e, "connection refused");
            let frame = error_frame(0, String::new(), &e).frame;
            let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, sluice_shm::send_with_fds(&stream, &frame, &[])).await;
            return;
        }
    };
    let stream = Arc::new(stream);
    let (tx, mut rx) = mpsc::channel::<Outgoing>(256);
    let writer_stream = stream.clone();
    let write_wait = Duration::from_millis(ctx.config.limits.client_write_timeout_ms);
    let writer = tokio::spawn(async move {
        // Frames without descriptors that are queued together go out in one
        // write (a batch's answers finishing at once cost one syscall here
        // and one wake-up in the client, not one each).
        let mut held: Option<Outgoing> = None;
        loop {
            let first = match held.take() {
                Some(out) => out,
                None => match rx.recv().await {
                    Some(out) => out,
                    None => break,
                },
            };
            let (frame, fd) = if first.fd.is_some() {
                (first.frame, first.fd)
            } else {
                let mut frame = first.frame;
                while frame.len() < COALESCE_BYTES {
                    match rx.try_recv() {
                        Ok(next) if next.fd.is_none() => frame.extend_from_slice(&next.frame),
                        Ok(next) => {
                            held = Some(next);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                (frame, None)
            };
            let fds: Vec<_> = fd.as_ref().map(|f| f.as_fd()).into_iter().collect();
            let failed =
                match tokio::time::timeout(write_wait, sluice_shm::send_with_fds(&writer_stream, &frame, &fds)).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!("the client took none of its answers for {write_wait:?}")),
                };
            if let Some(why) = failed {
                debug!(%why, "client write failed; disconnecting it");
                // The read side ends too: the connection's requests stop
                // being read and its session is closed (answers nobody
                // takes would otherwise hold its requests and regions).
                let _ = sluice_shm::shutdown(&writer_stream);
                break;
            }
        }
    });

    let conn = Arc::new(ConnectionTag::new(ctx.next_conn.fetch_add(1, Ordering::Relaxed)));
    let span = tracing::info_span!("client", uid, gid, pid, conn = conn.id);
    let peer = Peer { uid, gid, pid };
    let caller = read_loop(&ctx, stream, tx, peer, &conn).instrument(span.clone()).await;
    match caller {
        Caller::Bound { session, joined: false } => session.close().instrument(span).await,
        Caller::Bound { session, joined: true } => session.leave(&conn).instrument(span).await,
        Caller::Unbound(_) => {}
    }
    let _ = writer.await;
}

/// Closes the descriptors that came with frames already read and that no
/// request claimed (every path of a frame ends here, handled or refused).
fn discard_stray_fds<S: AsRef<tokio::net::UnixStream>>(reader: &mut FrameReader<S>) {
    let stray = reader.discard_fds();
    if stray > 0 {
        warn!(stray, "client sent descriptors no request claimed; closed them");
    }
}

fn error_frame(id: u64, request_id: String, e: &ShimError) -> Outgoing {
    let resp = pb::Response { id, request_id, result: Some(Res::Error(e.detail())), item: 0 };
    Outgoing { frame: encode_frame(&resp), fd: None }
}

/// Answers of one GetBatch, each a frame of its own with the batch's id.
struct BatchFrames {
    id: u64,
    request_id: String,
    tx: mpsc::Sender<Outgoing>,
}

impl crate::batch::Answer for BatchFrames {
    async fn answer(&mut self, item: u32, result: Res) {
        let resp = pb::Response { id: self.id, request_id: self.request_id.clone(), item, result: Some(result) };
        let _ = self.tx.send(Outgoing { frame: encode_frame(&resp), fd: None }).await;
    }
}

async fn read_loop(
    ctx: &Arc<ConnectionContext>,
    stream: Arc<UnixStream>,
    tx: mpsc::Sender<Outgoing>,
    peer: Peer,
    conn: &Arc<ConnectionTag>,
) -> Caller {
    let limits = &ctx.config.limits;
    let mut reader = FrameReader::new(stream, MAX_FRAME_LEN);
    let mut caller = Caller::Unbound(peer);
    // A joined connection ends with the connection that opened its session.
    let mut ended: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = Box::pin(std::future::pending());
    let permits = Arc::new(Semaphore::new(limits.max_in_flight_per_connection));
    let hello_by = Instant::now() + Duration::from_millis(limits.hello_timeout_ms);
    loop {
        // Until Hello succeeds the connection is on a clock: an idle or
        // trickling peer cannot hold a slot (and an fd) for long.
        let next = if matches!(caller, Caller::Bound { .. }) {
            tokio::select! {
                next = reader.next_frame() => next,
                () = &mut ended => {
                    let e = ShimError::Refused("the connection whose session this one joined has closed".into());
                    debug!(error = %e, "closing connection");
                    let _ = tx.send(error_frame(0, String::new(), &e)).await;
                    break;
                }
            }
        } else {
            match tokio::time::timeout_at(hello_by, reader.next_frame()).await {
                Ok(r) => r,
                Err(_) => {
                    let e = ShimError::Refused(format!("no Hello within {} ms; closing", limits.hello_timeout_ms));
                    debug!(error = %e, "closing connection");
                    let _ = tx.send(error_frame(0, String::new(), &e)).await;
                    break;
                }
            }
        };
        let frame = match next {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(FrameError::TooLarge { len, max }) => {
                // The stream cannot be resynchronised after a bad length: say why, then close.
                let e = ShimError::Protocol(format!("frame of {len} bytes exceeds {max}"));
                warn!(error = %e, "closing connection");
                let _ = tx.send(error_frame(0, String::new(), &e)).await;
                break;
            }
            Err(e) => {
                debug!(error = %e, "connection read ended");
                break;
            }
        };
        // Counted before decoding: a frame of empty batch items (2 bytes
        // each, over a hundred decoded) is refused as the batch would be.
        let items = sluice_proto::entries::count(&frame, &[19], 1, sluice_proto::entries::Kind::Messages).ok();
        if let Some(n) = items.filter(|&n| n > limits.max_batch_items) {
            discard_stray_fds(&mut reader);
            let id = sluice_proto::entries::top_varint(&frame, 1).unwrap_or(0);
            let e = ShimError::BadRequest(format!(
                "a GetBatch needs 1 to {} items (max_batch_items), not {n}",
                limits.max_batch_items
            ));
            let resp =
                pb::Response { id, request_id: String::new(), item: WHOLE_BATCH, result: Some(Res::Error(e.detail())) };
            let _ = tx.send(Outgoing { frame: encode_frame(&resp), fd: None }).await;
            continue;
        }
        let req = match pb::Request::decode(frame.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                // Framing is intact, so the connection can go on; any
                // descriptor that came with the frame is closed.
                discard_stray_fds(&mut reader);
                let _ = tx
                    .send(error_frame(0, String::new(), &ShimError::Protocol(format!("undecodable request: {e}"))))
                    .await;
                continue;
            }
        };
        let (id, timeout_ms) = (req.id, req.timeout_ms);
        let request_id = if req.request_id.is_empty() { new_request_id() } else { req.request_id };
        // The agent takes request ids of at most this much (they are
        // echoed in every answer and log line of the request).
        if request_id.len() > crate::get_stream::MAX_REQUEST_ID {
            discard_stray_fds(&mut reader);
            let e = ShimError::BadRequest(format!(
                "a request id of {} bytes; at most {}",
                request_id.len(),
                crate::get_stream::MAX_REQUEST_ID
            ));
            let _ = tx.send(error_frame(id, String::new(), &e)).await;
            continue;
        }
        let Some(op) = req.op else {
            discard_stray_fds(&mut reader);
            let _ = tx
                .send(error_frame(id, request_id, &ShimError::BadRequest("request without an operation".into())))
                .await;
            continue;
        };
        // Descriptors are claimed here, in frame order, before any task runs.
        let fd = match &op {
            Op::Register(r) if r.fd_attached => match reader.take_fd() {
                Some(fd) => Some(fd),
                None => {
                    discard_stray_fds(&mut reader);
                    let e = ShimError::Protocol("Register says fd_attached but no descriptor came with it".into());
                    let _ = tx.send(error_frame(id, request_id, &e)).await;
                    continue;
                }
            },
            _ => None,
        };
        discard_stray_fds(&mut reader);

        if let Op::Hello(h) = op {
            let joining = !h.join.is_empty();
            let out = match hello(ctx, &mut caller, h).await {
                Ok(ok) => {
                    if let Caller::Bound { session, joined: true } = &caller {
                        ended = Box::pin(session.ended());
                    }
                    Outgoing {
                        frame: encode_frame(&pb::Response { id, request_id, result: Some(Res::Hello(ok)), item: 0 }),
                        fd: None,
                    }
                }
                Err(e) if joining => {
                    // A wrong token costs a connection: guessing is not a
                    // loop of frames on one.
                    let _ = tx.send(error_frame(id, request_id, &e)).await;
                    break;
                }
                Err(e) => error_frame(id, request_id, &e),
            };
            let _ = tx.send(out).await;
            continue;
        }
        let s = match caller.session(&ctx.config) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(error_frame(id, request_id, &e)).await;
                continue;
            }
        };
        if let Op::GetBatch(b) = &op {
            let n = b.items.len();
            if n == 0 || n > limits.max_batch_items {
                // Refused as a whole, in one frame (never one per item: a
                // frame of empty items must not become a flood of answers).
                let e = ShimError::BadRequest(format!(
                    "a GetBatch needs 1 to {} items (max_batch_items), not {n}",
                    limits.max_batch_items
                ));
                let resp = pb::Response { id, request_id, item: WHOLE_BATCH, result: Some(Res::Error(e.detail())) };
                let out = Outgoing { frame: encode_frame(&resp), fd: None };
                let _ = tx.send(out).await;
                continue;
            }
        }
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        // A client's own deadline, but never past the operator's: a request
        // (and the connection place it holds) cannot be kept for weeks. The
        // agent always gets that deadline, and the shim waits a little
        // longer: the agent stops a request's transfers before it answers
        // DEADLINE_EXCEEDED, so its answer, not the shim giving up first,
        // ends the request (a request the shim gave up on could still be
        // writing into the region when the client retried into it; with no
        // deadline, a batch's items each had the namespace's deadline from
        // when they started, far past the shim's).
        let timeout_ms = agent_deadline_ms(timeout_ms, limits.request_timeout_ms);
        let limit = Duration::from_millis(u64::from(timeout_ms)) + DEADLINE_GRACE;
        let span = tracing::info_span!("request", request_id = %request_id, tenant = %s.tenant);
        let served = Served {
            id,
            conn: conn.clone(),
            req: RequestCtx::new(request_id, timeout_ms),
            limit,
            op: crate::metrics::op_label(&op),
            started: std::time::Instant::now(),
            metrics: ctx.metrics.clone(),
            tx: tx.clone(),
        };
        tokio::spawn(
            async move {
                served.run(&s, op, fd).await;
                drop(permit);
            }
            .instrument(span),
        );
    }
    caller
}

/// The deadline the agent gets for a request whose client asked for
/// `asked_ms` (0: none): that, at most the shim's `most_ms`, never none.
fn agent_deadline_ms(asked_ms: u32, most_ms: u64) -> u32 {
    let most = u32::try_from(most_ms).unwrap_or(u32::MAX);
    match asked_ms {
        0 => most,
        ms => ms.min(most),
    }
}

/// One request on its way through its own task: what it answers with and
/// what it is counted as.
struct Served {
    /// The client's frame id.
    id: u64,
    /// Which connection (regions it registers are its own).
    conn: Arc<ConnectionTag>,
    req: RequestCtx,
    /// When the shim stops waiting for the agent.
    limit: Duration,
    /// The metrics label of the operation.
    op: &'static str,
    started: std::time::Instant,
    metrics: Arc<ShimMetrics>,
    tx: mpsc::Sender<Outgoing>,
}

impl Served {
    /// Serves `op` in the caller's session `s` and sends its answers.
    ///
    /// When the agent does not answer within the request's deadline and the
    /// grace after it, the client is answered DEADLINE_EXCEEDED, but the
    /// request goes on waiting for the agent's answer (at most
    /// [`LATE_WAIT`]) with its regions in doubt: until the agent says the
    /// request ended, it may still write into them (`in_doubt.rs`).
    async fn run(self, s: &Session, op: Op, fd: Option<OwnedFd>) {
        let regions = regions_used(&op);
        if let Op::GetBatch(b) = op {
            let open = crate::batch::Open::new(b.items.len());
            let mut out = BatchFrames { id: self.id, request_id: self.req.request_id.clone(), tx: self.tx.clone() };
            let work = crate::batch::get_batch(s, b, &self.req, &open, &mut out);
            tokio::pin!(work);
            let failed = match tokio::time::timeout(self.limit, &mut work).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(ShimError::DeadlineExceeded(self.limit)),
            };
            let code = failed.as_ref().map(|e| e.code().as_str_name());
            self.metrics.observe(self.op, code, self.started.elapsed());
            let Some(e) = failed else { return };
            debug!(error = %e, "batch failed");
            let gave_up = matches!(e, ShimError::DeadlineExceeded(_));
            let in_doubt = gave_up.then(|| s.doubts().hold(regions));
            let mut rest = BatchFrames { id: self.id, request_id: self.req.request_id.clone(), tx: self.tx.clone() };
            open.fail_rest(&mut rest, &e).await;
            if let Some(held) = in_doubt {
                // The items are answered; the agent's late answers to them
                // are dropped (`Open`), and end the doubt.
                late(work, &self.req.request_id).await;
                drop(held);
            }
            return;
        }
        let work = crate::handlers::handle(s, &self.conn, op, fd, &self.req);
        tokio::pin!(work);
        let (result, in_doubt) = match tokio::time::timeout(self.limit, &mut work).await {
            Ok(r) => (r, None),
            Err(_) => (Err(ShimError::DeadlineExceeded(self.limit)), Some(s.doubts().hold(regions))),
        };
        let code = result.as_ref().err().map(|e| e.code().as_str_name());
        self.metrics.observe(self.op, code, self.started.elapsed());
        let (id, request_id) = (self.id, self.req.request_id.clone());
        let out = match result {
            Ok((result, fd)) => {
                let resp = pb::Response { id, request_id, result: Some(result), item: 0 };
                Outgoing { frame: encode_frame(&resp), fd }
            }
            Err(e) => {
                debug!(error = %e, "request failed");
                error_frame(id, request_id, &e)
            }
        };
        let _ = self.tx.send(out).await;
        if let Some(held) = in_doubt {
            late(work, &self.req.request_id).await;
            drop(held);
        }
    }
}

/// The regions `op` has the agent use: a GET writes into its region
/// (alone or in a batch), a PUT reads from its (a GET into it while a late
/// PUT still reads would change what that PUT stores), a Release waits at
/// the agent for transfers still using its region (a second Release must
/// not be told "released", and its export torn down, while the first still
/// waits there). Nothing else names one.
fn regions_used(op: &Op) -> Vec<String> {
    match op {
        Op::Get(g) => vec![g.region_id.clone()],
        Op::Put(p) => vec![p.region_id.clone()],
        Op::Release(r) => vec![r.region_id.clone()],
        Op::GetBatch(b) => b.items.iter().map(|i| i.region_id.clone()).collect(),
        _ => Vec::new(),
    }
}

/// Waits, after the shim gave up on a request, for the agent's late answer
/// (which says its transfers stopped), at most [`LATE_WAIT`]; then drops
/// the request (a streamed GET is then cancelled at the agent).
async fn late<F: std::future::Future>(work: std::pin::Pin<&mut F>, request_id: &str) {
    if tokio::time::timeout(LATE_WAIT, work).await.is_err() {
        warn!(
            request_id,
            "the agent never ended a request the shim gave up on; its regions are no longer held back \
             (the agent's release waits for transfers still using them)"
        );
    }
}

/// Hello: checks the version, maps the caller to a tenant and opens its
/// session (or joins the session `join` names, of the same process), which
/// binds the connection (`Caller::Bound`) for good.
async fn hello(ctx: &ConnectionContext, caller: &mut Caller, h: pb::Hello) -> Result<pb::HelloOk, ShimError> {
    if h.version != SHIM_PROTOCOL_VERSION {
        return Err(ShimError::Version { got: h.version, want: SHIM_PROTOCOL_VERSION });
    }
    let &mut Caller::Unbound(peer) = caller else {
        return Err(ShimError::Protocol("Hello was already sent on this connection".into()));
    };
    let Peer { uid, gid, .. } = peer;
    let tenant = ctx.config.tenant_for(uid, gid).ok_or(ShimError::UnknownCaller { uid, gid })?.to_owned();
    if !ctx.sessions.serves(&tenant) {
        return Err(ShimError::UnknownCaller { uid, gid });
    }
    let joined = !h.join.is_empty();
    let (s, namespaces, caps) = if joined {
        Session::join(&ctx.sessions, &h.join, &tenant, peer)?
    } else {
        tokio::time::timeout(OPEN_TIMEOUT, Session::open(&ctx.sessions, &tenant, peer))
            .await
            .map_err(|_| ShimError::AgentUnavailable("the agent did not open a session in time".into()))??
    };
    tracing::info!(tenant = %tenant, client = %h.client, joined, "client connected");
    let join_token = s.join_token().to_owned();
    *caller = Caller::Bound { session: s, joined };
    Ok(pb::HelloOk {
        version: SHIM_PROTOCOL_VERSION,
        tenant: tenant.clone(),
        namespaces,
        capabilities: Some((*caps).clone()),
        join_token,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_agent_always_gets_a_deadline_within_the_shims() {
        assert_eq!(super::agent_deadline_ms(0, 900_000), 900_000);
        assert_eq!(super::agent_deadline_ms(5_000, 900_000), 5_000);
        assert_eq!(super::agent_deadline_ms(u32::MAX, 900_000), 900_000);
        assert_eq!(super::agent_deadline_ms(0, u64::MAX), u32::MAX);
    }

    #[test]
    fn request_ids_made_here_are_distinct_and_sixteen_hex_digits() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| super::new_request_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
