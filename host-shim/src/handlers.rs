//! The shim's operations after the handshake: each checks what it can
//! locally (paths, region ownership, descriptors), then makes one agent call
//! through the connection's [`Session`] (which re-opens the agent session
//! and retries once if the agent restarted).

use std::os::fd::{AsFd, OwnedFd};

use sluice_proto::agent as apb;
use sluice_proto::common::MemoryKind;
use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};

use crate::error::ShimError;
use crate::path::{list_path, object_path};
use crate::server::Shared;
use crate::session::Session;

/// Serves one request after the handshake. `timeout_ms` is the client's
/// deadline, passed on to the agent (0: the namespace's default).
pub async fn handle(
    shared: &Shared,
    s: &Session,
    op: Op,
    fd: Option<OwnedFd>,
    request_id: &str,
    timeout_ms: u32,
) -> Result<(Res, Option<OwnedFd>), ShimError> {
    let agent = || shared.agent.grpc.clone();
    let rid = request_id.to_owned();
    let res = match op {
        Op::Hello(_) => return Err(ShimError::Protocol("Hello was already sent on this connection".into())),
        Op::Register(r) => return register(shared, s, r, fd).await,
        // Served by `batch::get_batch` (its answers are many frames).
        Op::GetBatch(_) => return Err(ShimError::Protocol("a GetBatch cannot be served here".into())),
        Op::Release(r) => {
            s.release(shared, &r.region_id).await?;
            Res::Released(pb::Released {})
        }
        Op::Get(g) => {
            let (ns, key) = object_path(&g.path)?;
            let reply = s
                .call(shared, Some(&g.region_id), |snap| {
                    let req = apb::GetRequest {
                        session_id: snap.session_id,
                        request_id: rid.clone(),
                        namespace: ns.into(),
                        key: key.into(),
                        range: g.range,
                        region_id: snap.region_id,
                        offset: g.offset,
                        max_bytes: g.max_bytes,
                        timeout_ms,
                        if_match: g.if_match.clone(),
                    };
                    let mut agent = agent();
                    async move { agent.get(req).await }
                })
                .await?;
            Res::Get(pb::GetResult { report: reply.report, object_size: reply.object_size, etag: reply.etag })
        }
        Op::Put(p) => {
            let (ns, key) = object_path(&p.path)?;
            let reply = s
                .call(shared, Some(&p.region_id), |snap| {
                    let req = apb::PutRequest {
                        session_id: snap.session_id,
                        request_id: rid.clone(),
                        namespace: ns.into(),
                        key: key.into(),
                        region_id: snap.region_id,
                        offset: p.offset,
                        length: p.length,
                        content_type: p.content_type.clone(),
                        timeout_ms,
                    };
                    let mut agent = agent();
                    async move { agent.put(req).await }
                })
                .await?;
            Res::Put(pb::PutResult { report: reply.report, etag: reply.etag })
        }
        Op::Head(h) => {
            let (ns, key) = object_path(&h.path)?;
            let reply = s
                .call(shared, None, |snap| {
                    let req = apb::HeadRequest {
                        session_id: snap.session_id,
                        request_id: rid.clone(),
                        namespace: ns.into(),
                        key: key.into(),
                        timeout_ms,
                    };
                    let mut agent = agent();
                    async move { agent.head(req).await }
                })
                .await?;
            Res::Head(reply.object.unwrap_or_default())
        }
        Op::List(l) => {
            let (ns, prefix) = list_path(&l.path)?;
            let reply = s
                .call(shared, None, |snap| {
                    let req = apb::ListRequest {
                        session_id: snap.session_id,
                        request_id: rid.clone(),
                        namespace: ns.into(),
                        prefix: prefix.into(),
                        continuation_token: l.continuation_token.clone(),
                        max_keys: l.max_keys,
                        delimiter: l.delimiter.clone(),
                        timeout_ms,
                    };
                    let mut agent = agent();
                    async move { agent.list(req).await }
                })
                .await?;
            Res::List(pb::ListPage {
                objects: reply.objects,
                common_prefixes: reply.common_prefixes,
                next_continuation_token: reply.next_continuation_token,
            })
        }
        Op::Delete(d) => {
            let (ns, key) = object_path(&d.path)?;
            s.call(shared, None, |snap| {
                let req = apb::DeleteRequest {
                    session_id: snap.session_id,
                    request_id: rid.clone(),
                    namespace: ns.into(),
                    key: key.into(),
                    timeout_ms,
                };
                let mut agent = agent();
                async move { agent.delete(req).await }
            })
            .await?;
            Res::Deleted(pb::Deleted {})
        }
        Op::Stats(_) => {
            let r = s
                .call(shared, None, |snap| {
                    let mut agent = agent();
                    async move { agent.stats(apb::StatsRequest { session_id: snap.session_id }).await }
                })
                .await?;
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
    };
    Ok((res, None))
}

/// Register: a memfd the shim creates (sealed at its size, a duplicate
/// passed back), a client's memfd (only if it is sealed against shrinking:
/// the agent maps it, and a truncated mapping would crash whoever touches
/// it), or a GPU dma-buf.
async fn register(
    shared: &Shared,
    s: &Session,
    r: pb::Register,
    fd: Option<OwnedFd>,
) -> Result<(Res, Option<OwnedFd>), ShimError> {
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
    // A descriptor that is not a dma-buf, or a range outside it, is the
    // caller's mistake whatever the agent reaches: said first.
    if let (true, Some(fd)) = (gpu, &fd) {
        crate::memory::check_dmabuf(fd, r.dmabuf_offset, r.length)?;
    }
    // Before anything is exported: memory the agent cannot reach is refused
    // (memory this shim cannot register is refused below, with its reason).
    let ours = shared.memory.kinds();
    let kind = if gpu { MemoryKind::GpuDmabuf } else { ours.first().copied().unwrap_or(MemoryKind::Memfd) };
    if ours.contains(&kind) {
        crate::capabilities::check_region(&s.capabilities(), kind)?;
    }
    let (source, guard, give_back) = if gpu {
        let fd = fd.ok_or_else(|| ShimError::BadRequest("a GPU region needs its dma-buf fd attached".into()))?;
        let (source, guard) = shared.memory.prepare_dmabuf(fd, r.dmabuf_offset, r.length, r.gpu_address)?;
        (source, guard, None)
    } else {
        let (fd, give_back) = match fd {
            Some(fd) => {
                let actual = sluice_shm::check_sealed(fd.as_fd())?;
                if actual < r.length {
                    return Err(ShimError::Memory(sluice_shm::ShmError::FileTooSmall { wanted: r.length, actual }));
                }
                (fd, None)
            }
            None => {
                let fd = sluice_shm::create_memfd(&format!("sluice-{}", s.tenant), r.length)?;
                let theirs = fd.try_clone().map_err(|e| ShimError::Limit(format!("duplicating a memfd: {e}")))?;
                (fd, Some(theirs))
            }
        };
        let (source, guard) = shared.memory.prepare_shared(fd, r.length)?;
        (source, guard, give_back)
    };
    let region_id = s.register(shared, r.length, source, guard).await?;
    let res = Res::Registered(pb::Registered { region_id, length: r.length, fd_attached: give_back.is_some() });
    Ok((res, give_back))
}
