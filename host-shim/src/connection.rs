//! One client connection: identity, per-user connection limits, the Hello
//! deadline, pipelined requests with deadlines.
//!
//! Requests are read in order; each is then served on its own task, so a slow
//! GET never holds up a HEAD behind it. Responses go out through one writer
//! task, which keeps frames (and their descriptors) whole.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};
use sluice_proto::{encode_frame, Message, MAX_FRAME_LEN, SHIM_PROTOCOL_VERSION};
use sluice_shm::{FrameError, FrameReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn, Instrument};

use crate::config::ShimLimits;
use crate::error::ShimError;
use crate::server::Shared;
use crate::session::Session;

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

fn new_request_id() -> String {
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    hex::encode(b)
}

/// Serves one client until it disconnects, then releases everything it held.
pub async fn serve(shared: Arc<Shared>, stream: UnixStream) {
    let (uid, gid, pid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid(), c.pid().unwrap_or(0)),
        Err(e) => {
            warn!(error = %e, "SO_PEERCRED failed; dropping connection");
            return;
        }
    };
    shared.metrics.connections.inc();
    struct Open<'a>(&'a prometheus::IntGauge);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let _open = Open(&shared.metrics.connections);
    let _slot = match shared.connections.admit(uid, &shared.config.limits) {
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
            if let Err(e) = sluice_shm::send_with_fds(&writer_stream, &frame, &fds).await {
                debug!(error = %e, "client write failed");
                break;
            }
        }
    });

    let span = tracing::info_span!("client", uid, gid, pid);
    let session = read_loop(&shared, stream, tx, uid, gid).instrument(span.clone()).await;
    if let Some(s) = session {
        s.close(&shared).instrument(span).await;
    }
    let _ = writer.await;
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
    shared: &Arc<Shared>,
    stream: Arc<UnixStream>,
    tx: mpsc::Sender<Outgoing>,
    uid: u32,
    gid: u32,
) -> Option<Arc<Session>> {
    let limits = &shared.config.limits;
    let mut reader = FrameReader::new(stream, MAX_FRAME_LEN);
    let mut session: Option<Arc<Session>> = None;
    let permits = Arc::new(Semaphore::new(limits.max_in_flight_per_connection));
    let hello_by = Instant::now() + Duration::from_millis(limits.hello_timeout_ms);
    loop {
        // Until Hello succeeds the connection is on a clock: an idle or
        // trickling peer cannot hold a slot (and an fd) for long.
        let next = if session.is_some() {
            reader.next_frame().await
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
        let req = match pb::Request::decode(frame.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                // Framing is intact, so the connection can go on.
                let _ = tx
                    .send(error_frame(0, String::new(), &ShimError::Protocol(format!("undecodable request: {e}"))))
                    .await;
                continue;
            }
        };
        let (id, timeout_ms) = (req.id, req.timeout_ms);
        let request_id = if req.request_id.is_empty() { new_request_id() } else { req.request_id };
        let Some(op) = req.op else {
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
                    let e = ShimError::Protocol("Register says fd_attached but no descriptor came with it".into());
                    let _ = tx.send(error_frame(id, request_id, &e)).await;
                    continue;
                }
            },
            _ => None,
        };
        let stray = reader.discard_fds();
        if stray > 0 {
            warn!(stray, "client sent descriptors no request claimed; closed them");
        }

        if let Op::Hello(h) = op {
            let out = match hello(shared, &mut session, h, uid, gid).await {
                Ok(ok) => Outgoing {
                    frame: encode_frame(&pb::Response { id, request_id, result: Some(Res::Hello(ok)), item: 0 }),
                    fd: None,
                },
                Err(e) => error_frame(id, request_id, &e),
            };
            let _ = tx.send(out).await;
            continue;
        }
        let Some(s) = session.clone() else {
            let e = if shared.config.tenant_for(uid, gid).is_none() {
                ShimError::UnknownCaller { uid, gid }
            } else {
                ShimError::Protocol("send Hello first".into())
            };
            let _ = tx.send(error_frame(id, request_id, &e)).await;
            continue;
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
        let (shared, tx) = (shared.clone(), tx.clone());
        let limit = match timeout_ms {
            0 => Duration::from_millis(shared.config.limits.request_timeout_ms),
            ms => Duration::from_millis(u64::from(ms)) + DEADLINE_GRACE,
        };
        let span = tracing::info_span!("request", request_id = %request_id, tenant = %s.tenant);
        let (op_name, started) = (crate::metrics::op_label(&op), std::time::Instant::now());
        tokio::spawn(
            async move {
                if let Op::GetBatch(b) = op {
                    let mut open = crate::batch::Open::new(b.items.len());
                    let mut out = BatchFrames { id, request_id: request_id.clone(), tx };
                    let work = crate::batch::get_batch(&shared, &s, b, &request_id, timeout_ms, &mut open, &mut out);
                    let failed = match tokio::time::timeout(limit, work).await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e),
                        Err(_) => Some(ShimError::DeadlineExceeded(limit)),
                    };
                    let code = failed.as_ref().map(|e| e.code().as_str_name());
                    shared.metrics.observe(op_name, code, started.elapsed());
                    if let Some(e) = failed {
                        debug!(error = %e, "batch failed");
                        open.fail_rest(&mut out, &e).await;
                    }
                    drop(permit);
                    return;
                }
                let work = crate::handlers::handle(&shared, &s, op, fd, &request_id, timeout_ms);
                let result = match tokio::time::timeout(limit, work).await {
                    Ok(r) => r,
                    Err(_) => Err(ShimError::DeadlineExceeded(limit)),
                };
                let code = result.as_ref().err().map(|e| e.code().as_str_name());
                shared.metrics.observe(op_name, code, started.elapsed());
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
                let _ = tx.send(out).await;
                drop(permit);
            }
            .instrument(span),
        );
    }
    session
}

async fn hello(
    shared: &Shared,
    session: &mut Option<Arc<Session>>,
    h: pb::Hello,
    uid: u32,
    gid: u32,
) -> Result<pb::HelloOk, ShimError> {
    if h.version != SHIM_PROTOCOL_VERSION {
        return Err(ShimError::Version { got: h.version, want: SHIM_PROTOCOL_VERSION });
    }
    if session.is_some() {
        return Err(ShimError::Protocol("Hello was already sent on this connection".into()));
    }
    let tenant = shared.config.tenant_for(uid, gid).ok_or(ShimError::UnknownCaller { uid, gid })?.to_owned();
    if !shared.secrets.contains_key(&tenant) {
        return Err(ShimError::UnknownCaller { uid, gid });
    }
    let (s, namespaces, caps) = tokio::time::timeout(OPEN_TIMEOUT, Session::open(shared, &tenant))
        .await
        .map_err(|_| ShimError::AgentUnavailable("the agent did not open a session in time".into()))??;
    tracing::info!(tenant = %tenant, client = %h.client, "client connected");
    *session = Some(s);
    Ok(pb::HelloOk { version: SHIM_PROTOCOL_VERSION, tenant, namespaces, capabilities: Some((*caps).clone()) })
}
