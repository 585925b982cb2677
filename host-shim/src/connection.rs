//! One client connection: identity, handshake, pipelined requests, regions.
//!
//! Requests are read in order; each is then served on its own task, so a slow
//! GET never holds up a HEAD behind it. Responses go out through one writer
//! task, which keeps frames (and their descriptors) whole.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use sluice_proto::agent as apb;
use sluice_proto::auth;
use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};
use sluice_proto::{encode_frame, Message, MAX_FRAME_LEN, SHIM_PROTOCOL_VERSION};
use sluice_shm::{FrameError, FrameReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Mutex, Semaphore};
use tracing::{debug, info, warn, Instrument};

use crate::error::ShimError;
use crate::memory::ExportGuard;
use crate::path::{list_path, object_path};
use crate::server::Shared;

/// A response on its way out, with the descriptor it carries (if any).
struct Outgoing {
    frame: Vec<u8>,
    fd: Option<OwnedFd>,
}

/// Per-connection state once the handshake is done.
struct Session {
    id: String,
    tenant: String,
    /// Regions registered on this connection: id -> length, and what keeps
    /// its export valid (DOCA) until the agent has released it.
    regions: Mutex<HashMap<String, (u64, ExportGuard)>>,
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
    let stream = Arc::new(stream);
    let (tx, mut rx) = mpsc::channel::<Outgoing>(256);
    let writer_stream = stream.clone();
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let fds: Vec<_> = out.fd.as_ref().map(|f| f.as_fd()).into_iter().collect();
            if let Err(e) = sluice_shm::send_with_fds(&writer_stream, &out.frame, &fds).await {
                debug!(error = %e, "client write failed");
                break;
            }
        }
    });

    let span = tracing::info_span!("client", uid, gid, pid);
    let session = read_loop(&shared, stream, tx, uid, gid).instrument(span.clone()).await;
    if let Some(s) = session {
        let req = apb::CloseSessionRequest { session_id: s.id.clone() };
        if let Err(e) = shared.agent.grpc.clone().close_session(req).await {
            warn!(parent: &span, error = %e, "closing the agent session failed");
        }
        let n = s.regions.lock().await.len();
        info!(parent: &span, tenant = %s.tenant, released_regions = n, "client disconnected");
    }
    let _ = writer.await;
}

fn error_frame(id: u64, request_id: String, e: &ShimError) -> Outgoing {
    let resp = pb::Response { id, request_id, result: Some(Res::Error(e.detail())) };
    Outgoing { frame: encode_frame(&resp), fd: None }
}

async fn read_loop(
    shared: &Arc<Shared>,
    stream: Arc<UnixStream>,
    tx: mpsc::Sender<Outgoing>,
    uid: u32,
    gid: u32,
) -> Option<Arc<Session>> {
    let mut reader = FrameReader::new(stream, MAX_FRAME_LEN);
    let mut session: Option<Arc<Session>> = None;
    let permits = Arc::new(Semaphore::new(shared.config.limits.max_in_flight_per_connection));
    loop {
        let frame = match reader.next_frame().await {
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
        let id = req.id;
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
                    frame: encode_frame(&pb::Response { id, request_id, result: Some(Res::Hello(ok)) }),
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
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (shared, tx) = (shared.clone(), tx.clone());
        let span = tracing::info_span!("request", request_id = %request_id, tenant = %s.tenant);
        tokio::spawn(
            async move {
                let out = match handle(&shared, &s, op, fd, &request_id).await {
                    Ok((result, fd)) => {
                        Outgoing { frame: encode_frame(&pb::Response { id, request_id, result: Some(result) }), fd }
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
    let secret = shared.secrets.get(&tenant).ok_or(ShimError::UnknownCaller { uid, gid })?;
    let (shim_id, timestamp_ms, nonce) = (shared.shim_id.clone(), auth::now_ms(), auth::new_nonce());
    let proof = auth::session_proof(secret, &tenant, &shim_id, timestamp_ms, &nonce);
    let req = apb::OpenSessionRequest { tenant: tenant.clone(), shim_id, timestamp_ms, nonce: nonce.to_vec(), proof };
    let reply = shared.agent.grpc.clone().open_session(req).await?.into_inner();
    info!(tenant = %tenant, client = %h.client, "client connected");
    *session =
        Some(Arc::new(Session { id: reply.session_id, tenant: tenant.clone(), regions: Mutex::new(HashMap::new()) }));
    Ok(pb::HelloOk { version: SHIM_PROTOCOL_VERSION, tenant, namespaces: reply.namespaces })
}

async fn check_region(s: &Session, region_id: &str) -> Result<(), ShimError> {
    if s.regions.lock().await.contains_key(region_id) {
        Ok(())
    } else {
        Err(ShimError::UnknownRegion(region_id.to_owned()))
    }
}

/// Serves one request after the handshake.
async fn handle(
    shared: &Shared,
    s: &Session,
    op: Op,
    fd: Option<OwnedFd>,
    request_id: &str,
) -> Result<(Res, Option<OwnedFd>), ShimError> {
    let mut agent = shared.agent.grpc.clone();
    let sid = s.id.clone();
    let rid = request_id.to_owned();
    Ok((
        match op {
            Op::Hello(_) => unreachable_hello()?,
            Op::Register(r) => {
                if r.length == 0 {
                    return Err(ShimError::BadRequest("region length must be > 0".into()));
                }
                if r.length > shared.config.limits.max_region_bytes {
                    return Err(ShimError::Limit(format!(
                        "region of {} bytes exceeds max_region_bytes {}",
                        r.length, shared.config.limits.max_region_bytes
                    )));
                }
                let gpu = r.kind == pb::RegionKind::GpuDmabuf as i32;
                if r.kind != pb::RegionKind::SharedMemory as i32 && !gpu {
                    return Err(ShimError::BadRequest(format!("unknown region kind {}", r.kind)));
                }
                let (export, guard, give_back) = if gpu {
                    let fd =
                        fd.ok_or_else(|| ShimError::BadRequest("a GPU region needs its dma-buf fd attached".into()))?;
                    let (export, guard) = shared.memory.export_dmabuf(fd, r.dmabuf_offset, r.length, r.gpu_address)?;
                    (export, guard, None)
                } else {
                    let (fd, give_back) = match fd {
                        Some(fd) => {
                            let file = std::fs::File::from(fd);
                            let actual =
                                file.metadata().map_err(|e| ShimError::BadRequest(format!("fstat: {e}")))?.len();
                            if actual < r.length {
                                return Err(ShimError::Memory(sluice_shm::ShmError::FileTooSmall {
                                    wanted: r.length,
                                    actual,
                                }));
                            }
                            (OwnedFd::from(file), false)
                        }
                        None => (sluice_shm::create_memfd(&format!("sluice-{}", s.tenant), r.length)?, true),
                    };
                    let (export, guard) = shared.memory.export_shared(&shared.agent, &fd, r.length).await?;
                    (export, guard, give_back.then_some(fd))
                };
                let reply = agent
                    .register_region(apb::RegisterRegionRequest {
                        session_id: sid,
                        length: r.length,
                        export: Some(export),
                    })
                    .await?
                    .into_inner();
                s.regions.lock().await.insert(reply.region_id.clone(), (r.length, guard));
                let res = Res::Registered(pb::Registered {
                    region_id: reply.region_id,
                    length: r.length,
                    fd_attached: give_back.is_some(),
                });
                return Ok((res, give_back));
            }
            Op::Release(r) => {
                check_region(s, &r.region_id).await?;
                agent
                    .release_region(apb::ReleaseRegionRequest { session_id: sid, region_id: r.region_id.clone() })
                    .await?;
                s.regions.lock().await.remove(&r.region_id);
                Res::Released(pb::Released {})
            }
            Op::Get(g) => {
                let (ns, key) = object_path(&g.path)?;
                check_region(s, &g.region_id).await?;
                let reply = agent
                    .get(apb::GetRequest {
                        session_id: sid,
                        request_id: rid,
                        namespace: ns.into(),
                        key: key.into(),
                        range: g.range,
                        region_id: g.region_id,
                        offset: g.offset,
                    })
                    .await?
                    .into_inner();
                Res::Get(pb::GetResult { report: reply.report, object_size: reply.object_size, etag: reply.etag })
            }
            Op::Put(p) => {
                let (ns, key) = object_path(&p.path)?;
                check_region(s, &p.region_id).await?;
                let reply = agent
                    .put(apb::PutRequest {
                        session_id: sid,
                        request_id: rid,
                        namespace: ns.into(),
                        key: key.into(),
                        region_id: p.region_id,
                        offset: p.offset,
                        length: p.length,
                        content_type: p.content_type,
                    })
                    .await?
                    .into_inner();
                Res::Put(pb::PutResult { report: reply.report, etag: reply.etag })
            }
            Op::Head(h) => {
                let (ns, key) = object_path(&h.path)?;
                let reply = agent
                    .head(apb::HeadRequest { session_id: sid, request_id: rid, namespace: ns.into(), key: key.into() })
                    .await?
                    .into_inner();
                Res::Head(reply.object.unwrap_or_default())
            }
            Op::List(l) => {
                let (ns, prefix) = list_path(&l.path)?;
                let reply = agent
                    .list(apb::ListRequest {
                        session_id: sid,
                        request_id: rid,
                        namespace: ns.into(),
                        prefix: prefix.into(),
                        continuation_token: l.continuation_token,
                        max_keys: l.max_keys,
                        delimiter: l.delimiter,
                    })
                    .await?
                    .into_inner();
                Res::List(pb::ListPage {
                    objects: reply.objects,
                    common_prefixes: reply.common_prefixes,
                    next_continuation_token: reply.next_continuation_token,
                })
            }
            Op::Delete(d) => {
                let (ns, key) = object_path(&d.path)?;
                agent
                    .delete(apb::DeleteRequest {
                        session_id: sid,
                        request_id: rid,
                        namespace: ns.into(),
                        key: key.into(),
                    })
                    .await?;
                Res::Deleted(pb::Deleted {})
            }
            Op::Stats(_) => {
                let r = agent.stats(apb::StatsRequest { session_id: sid }).await?.into_inner();
                Res::Stats(pb::StatsResult {
                    requests: r.requests,
                    bytes_read: r.bytes_read,
                    bytes_written: r.bytes_written,
                    errors: r.errors,
                    fallbacks: r.fallbacks,
                    regions: r.regions,
                    registered_bytes: r.registered_bytes,
                })
            }
        },
        None,
    ))
}

/// Hello is answered inline by the read loop and never reaches `handle`.
fn unreachable_hello() -> Result<Res, ShimError> {
    Err(ShimError::Protocol("Hello was already handled".into()))
}
