//! The shim's operations after the handshake: each checks what it can
//! locally (paths, region ownership, descriptors), then makes one agent call
//! through the caller's [`Session`] (which re-opens the agent session and
//! retries once if the agent restarted).
//!
//! A handler gets the session from the connection, which resolves it in one
//! place (`connection::Caller::session`): there is no other way to get one,
//! so no operation runs outside the caller's session and tenant.

use std::os::fd::{AsFd, OwnedFd};

use sluice_proto::agent as apb;
use sluice_proto::common::MemoryKind;
use sluice_proto::shim::{self as pb, request::Op, response::Result as Res};

use crate::error::ShimError;
use crate::requests::{GetObject, ListObjects, ObjectKey, PutObject, RequestCtx};
use crate::session::{ConnectionTag, Session};

/// Serves one request after the handshake, in the caller's session `s`, for
/// connection `conn` (a region registered belongs to it).
pub async fn handle(
    s: &Session,
    conn: &ConnectionTag,
    op: Op,
    fd: Option<OwnedFd>,
    ctx: &RequestCtx,
) -> Result<(Res, Option<OwnedFd>), ShimError> {
    let res = match op {
        Op::Hello(_) => return Err(ShimError::Protocol("Hello was already sent on this connection".into())),
        Op::Register(r) => return register(s, conn, r, fd).await,
        // Served by `batch::get_batch` (its answers are many frames).
        Op::GetBatch(_) => return Err(ShimError::Protocol("a GetBatch cannot be served here".into())),
        Op::Release(r) => {
            s.release(&r.region_id, ctx.deadline).await?;
            Res::Released(pb::Released {})
        }
        Op::Get(g) => {
            let get = GetObject::try_from(g)?;
            s.doubts().settled(&get.region, ctx.deadline).await?;
            let (coalescer, streams) = (s.coalescer(), s.get_streams());
            let reply = s
                .call(Some(&get.region), |snap, mut agent| {
                    // Only an agent that serves GetStream gets GETs on it;
                    // only one that keeps each item's own request id and
                    // deadline gets GETs together.
                    let streams = streams.clone().filter(|_| snap.get_stream);
                    let coalescer = coalescer.clone().filter(|_| snap.item_contexts);
                    let req = get.request(ctx, snap.session_id, snap.region_id);
                    async move {
                        match (streams, coalescer) {
                            (Some(st), _) => st.get(agent, req).await.map(tonic::Response::new),
                            (None, Some(c)) => c.get(agent, req).await,
                            (None, None) => agent.get(req).await,
                        }
                    }
                })
                .await?;
            Res::Get(pb::GetResult { report: reply.report, object_size: reply.object_size, etag: reply.etag })
        }
        Op::Put(p) => {
            let put = PutObject::try_from(p)?;
            s.doubts().settled(&put.region, ctx.deadline).await?;
            let reply = s
                .call(Some(&put.region), |snap, mut agent| {
                    let req = put.request(ctx, snap.session_id, snap.region_id);
                    async move { agent.put(req).await }
                })
                .await?;
            Res::Put(pb::PutResult { report: reply.report, etag: reply.etag })
        }
        Op::Head(h) => {
            let object = ObjectKey::parse(&h.path)?;
            let reply = s
                .call(None, |snap, mut agent| {
                    let req = object.head(ctx, snap.session_id);
                    async move { agent.head(req).await }
                })
                .await?;
            Res::Head(reply.object.unwrap_or_default())
        }
        Op::List(l) => {
            let list = ListObjects::try_from(l)?;
            let reply = s
                .call(None, |snap, mut agent| {
                    let req = list.request(ctx, snap.session_id);
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
            let object = ObjectKey::parse(&d.path)?;
            s.call(None, |snap, mut agent| {
                let req = object.delete(ctx, snap.session_id);
                async move { agent.delete(req).await }
            })
            .await?;
            Res::Deleted(pb::Deleted {})
        }
        Op::Stats(_) => {
            let r = s
                .call(None, |snap, mut agent| async move {
                    agent.stats(apb::StatsRequest { session_id: snap.session_id }).await
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
    s: &Session,
    conn: &ConnectionTag,
    r: pb::Register,
    fd: Option<OwnedFd>,
) -> Result<(Res, Option<OwnedFd>), ShimError> {
    if r.length == 0 {
        return Err(ShimError::BadRequest("region length must be > 0".into()));
    }
    let max_region_bytes = s.limits().max_region_bytes;
    if r.length > max_region_bytes {
        return Err(ShimError::Limit(format!(
            "region of {} bytes exceeds max_region_bytes {max_region_bytes}",
            r.length
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
    let memory = s.memory();
    let ours = memory.kinds();
    let kind = if gpu { MemoryKind::GpuDmabuf } else { ours.first().copied().unwrap_or(MemoryKind::Memfd) };
    if ours.contains(&kind) {
        crate::capabilities::check_region(&s.capabilities(), kind)?;
    }
    // The connection's place for the region is taken before anything is
    // created or pinned (DOCA pins up to max_region_bytes per region): a
    // connection at its limit cannot have the shim pin memory only to
    // refuse it afterwards.
    let slot = s.reserve_region(conn)?;
    let (source, guard, give_back) = if gpu {
        let fd = fd.ok_or_else(|| ShimError::BadRequest("a GPU region needs its dma-buf fd attached".into()))?;
        let at = sluice_shm::DmabufHandOver { offset: r.dmabuf_offset, len: r.length, gpu_address: r.gpu_address };
        let (source, guard) = memory.prepare_dmabuf(fd, at).await?;
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
        let (source, guard) = memory.prepare_shared_off_runtime(fd, r.length).await?;
        (source, guard, give_back)
    };
    let region_id = s.register(conn, slot, r.length, source, guard).await?;
    let res = Res::Registered(pb::Registered { region_id, length: r.length, fd_attached: give_back.is_some() });
    Ok((res, give_back))
}
