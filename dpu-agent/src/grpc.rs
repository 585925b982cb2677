//! gRPC adapters: protobuf in, domain call, protobuf out. Errors convert to
//! `tonic::Status` in one place (`From<AgentError>`).

use std::sync::Arc;

use sluice_proto::agent as pb;
use sluice_proto::agent::agent_server::Agent as AgentRpc;
use sluice_proto::auth::SessionClaim;
use sluice_proto::common::{DataPath, ObjectInfo, TransferReport};
use tonic::{Request, Response, Status};

use crate::agent::{self, Agent};
use crate::error::AgentError;
use crate::hostmem::{MemoryKind, RegionExport};
use crate::identity::{SessionRequest, ShimOrigin};
use crate::requests::{DeleteObject, GetObject, HeadObject, ListObjects, PutObject, RequestCtx};
use crate::s3::model::{DataPathUsed, ObjectMeta};
use crate::session::Scoped;
use crate::tls::ClientCert;

/// Capabilities to and from protobuf.
mod caps {
    use sluice_proto::common as pb;
    use sluice_proto::common::Capabilities as PbCaps;

    use crate::capabilities::{Capabilities, NamespaceCaps};
    use crate::hostmem::MemoryKind;
    use crate::model::{DataPathMode, Permission, Placement};
    use crate::s3::model::StoreChecksums;
    use sluice_dataplane::TransportKind;

    pub fn memory_from_pb(k: pb::MemoryKind) -> Option<MemoryKind> {
        match k {
            pb::MemoryKind::Memfd => Some(MemoryKind::Memfd),
            pb::MemoryKind::DocaHost => Some(MemoryKind::DocaHost),
            pb::MemoryKind::GpuDmabuf => Some(MemoryKind::GpuDmabuf),
            pb::MemoryKind::Unspecified => None,
        }
    }

    fn memory(k: MemoryKind) -> i32 {
        (match k {
            MemoryKind::Memfd => pb::MemoryKind::Memfd,
            MemoryKind::DocaHost => pb::MemoryKind::DocaHost,
            MemoryKind::GpuDmabuf => pb::MemoryKind::GpuDmabuf,
        }) as i32
    }

    fn namespace(n: &NamespaceCaps) -> pb::NamespaceCapabilities {
        let access = n
            .access
            .iter()
            .map(|a| {
                (match a {
                    Permission::Read => pb::Access::Read,
                    Permission::Write => pb::Access::Write,
                    Permission::List => pb::Access::List,
                    Permission::Delete => pb::Access::Delete,
                }) as i32
            })
            .collect();
        let data_path = match n.data_path {
            DataPathMode::Http => pb::DataPathMode::Http,
            DataPathMode::Rdma => pb::DataPathMode::Rdma,
            DataPathMode::Auto => pb::DataPathMode::Auto,
        };
        let transport = match n.transport {
            None => pb::Transport::HttpOnly,
            Some(TransportKind::Tcp) => pb::Transport::Tcp,
            Some(TransportKind::VerbsRc) => pb::Transport::VerbsRc,
            Some(TransportKind::Dc) => pb::Transport::Dc,
        };
        let placement = match n.placement {
            Placement::Direct => pb::Placement::Direct,
            Placement::Staged => pb::Placement::Staged,
        };
        let encryption = if n.encrypted { pb::Encryption::Aes256Gcm } else { pb::Encryption::None };
        let store_checksums = match n.store_checksums {
            StoreChecksums::Unknown => pb::StoreChecksums::Unspecified,
            StoreChecksums::Kept => pb::StoreChecksums::Kept,
            StoreChecksums::Ignored => pb::StoreChecksums::Ignored,
        };
        pb::NamespaceCapabilities {
            name: n.name.clone(),
            access,
            data_path: data_path as i32,
            transport: transport as i32,
            degraded_reason: n.degraded.clone().unwrap_or_default(),
            placement: placement as i32,
            encryption: encryption as i32,
            max_object_bytes: n.max_object_bytes,
            max_window_bytes: n.max_window_bytes,
            get_part_bytes: n.get_part_bytes,
            put_part_bytes: n.put_part_bytes,
            rdma_min_bytes: n.rdma_min_bytes,
            request_timeout_ms: u32::try_from(n.request_timeout.as_millis()).unwrap_or(u32::MAX),
            store_checksums: store_checksums as i32,
        }
    }

    pub fn to_pb(c: &Capabilities) -> PbCaps {
        PbCaps {
            agent_memory: c.memory.kinds.iter().copied().map(memory).collect(),
            shim_memory: c.shim_memory.iter().copied().map(memory).collect(),
            max_batch_items: c.max_batch_items,
            max_region_bytes: 0,
            max_registered_bytes: c.max_registered_bytes,
            namespaces: c.namespaces.iter().map(namespace).collect(),
            gpu_staging: c.memory.gpu_staging.clone().unwrap_or_default(),
        }
    }
}

/// The tonic service over the domain agent.
#[derive(Clone)]
pub struct GrpcService {
    agent: Arc<Agent>,
    /// The tenant whose own listener this service answers on, if any.
    listener: Option<Arc<str>>,
    /// It answers on a TCP listener: a peer without an address is never
    /// taken for the Unix socket.
    tcp: bool,
    /// Becomes true when the agent shuts down: long-lived calls
    /// (`GetStream`) then stop taking work and end, or the servers'
    /// graceful shutdown would wait for them forever.
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl GrpcService {
    pub fn new(agent: Arc<Agent>) -> Self {
        Self { agent, listener: None, tcp: false, stop: None }
    }

    /// The service on tenant `tenant`'s own listener (`[tenants.nic]`).
    pub fn for_listener(agent: Arc<Agent>, tenant: &str) -> Self {
        Self { agent, listener: Some(tenant.into()), tcp: true, stop: None }
    }

    /// The service on a TCP listener.
    #[must_use]
    pub fn on_tcp(mut self) -> Self {
        self.tcp = true;
        self
    }

    /// Long-lived calls end once `stop` becomes true.
    #[must_use]
    pub fn stopping_on(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Runs the GETs of one stream opened from `origin` (a `GetStream`
    /// call, or a framed-GETs connection): each looked up against that
    /// origin, as a call of its own would be.
    fn streamed_gets(&self, origin: ShimOrigin) -> crate::get_stream::RunGet {
        let agent = self.agent.clone();
        Arc::new(move |session_id, item, ctx| {
            let (agent, origin) = (agent.clone(), origin.clone());
            Box::pin(async move {
                // Looked up per GET: it renews the session, and fails once
                // it is closed.
                let res = match agent.scoped(&session_id, &origin) {
                    Ok(s) => agent.get(&s, &GetObject::from(item), &ctx).await,
                    Err(e) => Err(e),
                };
                match res {
                    Ok(out) => pb::get_many_item::Result::Ok(get_reply(&ctx.request_id, out)),
                    Err(e) => pb::get_many_item::Result::Error(e.detail()),
                }
            })
        })
    }

    /// Serves framed GETs (`sluice_proto::framed_gets`) on a connection of
    /// this service's listener: its GETs may use the sessions opened from
    /// where it comes from, as a `GetStream` call on it could.
    pub fn serve_framed<C: crate::framed_gets::Conn>(
        &self,
        conn: C,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let open = self.agent.metrics().framed_connections.clone();
        let served = match conn.peer() {
            Ok((addr, cert)) => {
                let origin = self.origin(addr, cert);
                Some(crate::framed_gets::serve(conn, self.streamed_gets(origin), self.stop.clone()))
            }
            Err(e) => {
                // Its origin unknown, it is served nothing.
                tracing::debug!(error = %e, "a framed GET connection without a peer address; closed");
                None
            }
        };
        /// Counted open until dropped (served, or its task aborted).
        struct Open(prometheus::IntGauge);
        impl Drop for Open {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        async move {
            let Some(served) = served else { return };
            open.inc();
            let _open = Open(open);
            served.await;
        }
    }

    /// Where a request came from: the binding point of sessions.
    fn origin_of<T>(&self, req: &Request<T>) -> ShimOrigin {
        // The leaf of the chain TLS verified against the client CA.
        let cert = req.peer_certs().and_then(|chain| chain.first().map(|c| ClientCert::from_der(c)));
        self.origin(req.remote_addr(), cert)
    }

    /// The origin of a connection from `addr` (none: the Unix socket) with
    /// certificate `cert`, on this service's listener.
    fn origin(&self, addr: Option<std::net::SocketAddr>, cert: Option<Arc<ClientCert>>) -> ShimOrigin {
        match (&self.listener, addr) {
            (Some(tenant), addr) => ShimOrigin::Listener {
                tenant: tenant.clone(),
                ip: addr.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip()),
                cert,
            },
            (None, Some(a)) => ShimOrigin::Network { ip: a.ip(), cert },
            // A TCP peer whose address could not be read: an address no
            // shim has, never the Unix socket's sessions.
            (None, None) if self.tcp => ShimOrigin::Network { ip: std::net::Ipv4Addr::UNSPECIFIED.into(), cert },
            (None, None) => ShimOrigin::Unix,
        }
    }

    /// Session `session_id` for `req`: open, and named from where it was
    /// opened. Every session operation of the agent takes the [`Scoped`]
    /// this returns (and nothing else makes one), so no handler can skip
    /// the check.
    fn scoped<T>(&self, req: &Request<T>, session_id: &str) -> Result<Scoped, AgentError> {
        self.agent.scoped(session_id, &self.origin_of(req))
    }
}

fn report(request_id: &str, r: &agent::TransferSummary) -> TransferReport {
    TransferReport {
        request_id: request_id.to_owned(),
        bytes: r.bytes,
        data_path: match r.data_path {
            DataPathUsed::Http => DataPath::Http as i32,
            DataPathUsed::Rdma => DataPath::Rdma as i32,
            DataPathUsed::RdmaStaged => DataPath::RdmaStaged as i32,
        },
        fallback_reason: r.fallback_reason.clone(),
        elapsed_us: r.elapsed.as_micros() as u64,
        parts: r.parts,
        verified: r.unverified.is_none(),
        unverified_reason: r.unverified.clone().unwrap_or_default(),
    }
}

fn info(m: ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        key: m.key,
        size: m.size,
        etag: m.etag,
        last_modified_unix_ms: m.last_modified_unix_ms,
        content_type: m.content_type,
    }
}

fn get_reply(request_id: &str, out: agent::TransferSummary) -> pb::GetReply {
    pb::GetReply { report: Some(report(request_id, &out)), object_size: out.object_size, etag: out.etag }
}

/// The stream of a GetMany call: one item result per message.
type GetManyStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::GetManyItem, Status>> + Send>>;

#[tonic::async_trait]
impl AgentRpc for GrpcService {
    type GetManyStream = GetManyStream;

    async fn get_many(&self, req: Request<pb::GetManyRequest>) -> Result<Response<GetManyStream>, Status> {
        use futures::StreamExt;
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        // Checked before anything is made per item: each item's reply
        // carries the batch's request id, so a long one times many items
        // asked for terabytes.
        let max_id = crate::get_stream::MAX_REQUEST_ID;
        if r.items.len() > crate::model::MAX_BATCH_ITEMS {
            return Err(AgentError::BadRequest(format!(
                "a batch of {} items exceeds {}",
                r.items.len(),
                crate::model::MAX_BATCH_ITEMS
            ))
            .into());
        }
        if r.request_id.len() > max_id || r.items.iter().any(|i| i.request_id.len() > max_id) {
            return Err(AgentError::BadRequest(format!("request ids are at most {max_id} bytes")).into());
        }
        let request_id = r.request_id;
        let n = r.items.len();
        // Items' own request ids (a caller's single GET the shim coalesced).
        let mut own_ids = Vec::with_capacity(n);
        let items: Vec<_> = r
            .items
            .into_iter()
            .map(|mut item| {
                let own = (!item.request_id.is_empty())
                    .then(|| RequestCtx::new(std::mem::take(&mut item.request_id), item.timeout_ms));
                own_ids.push(own.as_ref().map(|c| c.request_id.clone()));
                (GetObject::from(item), own)
            })
            .collect();
        let results = self.agent.get_many(scoped, items, RequestCtx::new(request_id.clone(), r.timeout_ms))?;
        let answer = move |(index, res): (u32, Result<agent::TransferSummary, AgentError>)| {
            let result = match res {
                Ok(out) => {
                    let id = match own_ids.get(index as usize) {
                        Some(Some(own)) => own.clone(),
                        _ => format!("{request_id}.{index}"),
                    };
                    pb::get_many_item::Result::Ok(get_reply(&id, out))
                }
                Err(e) => pb::get_many_item::Result::Error(e.detail()),
            };
            pb::GetManyItem { index, result: Some(result) }
        };
        // The items run in a task of their own, not in the HTTP/2 body
        // pump: a peer that stops reading (a zero window) stops the pump,
        // and items polled only by it would hold the fair scheduler's
        // slots, every tenant's, mid-transfer and past their deadlines.
        // Every answer has room (one per item), so the items always run to
        // their end; a call dropped (the peer reset it or went away) drops
        // the items still running.
        let (tx, rx) = tokio::sync::mpsc::channel(n.max(1));
        tokio::spawn(async move {
            let mut results = std::pin::pin!(results);
            loop {
                tokio::select! {
                    () = tx.closed() => break,
                    next = results.next() => match next {
                        Some(done) => {
                            if tx.try_send(Ok(answer(done))).is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type GetStreamStream = tokio_stream::wrappers::ReceiverStream<Result<pb::GetManyItem, Status>>;

    async fn get_stream(
        &self,
        req: Request<tonic::Streaming<pb::GetStreamRequest>>,
    ) -> Result<Response<Self::GetStreamStream>, Status> {
        // Every GET on it is checked against this call's origin.
        let run = self.streamed_gets(self.origin_of(&req));
        Ok(Response::new(crate::get_stream::start(run, req.into_inner(), self.stop.clone())))
    }

    async fn get_epoch(&self, _req: Request<pb::GetEpochRequest>) -> Result<Response<pb::GetEpochReply>, Status> {
        // No session or proof needed: the epoch is no secret, only what a
        // proof must name to be valid at this run of the agent.
        Ok(Response::new(pb::GetEpochReply { epoch: self.agent.epoch().to_vec() }))
    }

    async fn open_session(
        &self,
        req: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionReply>, Status> {
        // The binding point: where this control connection came from.
        let origin = self.origin_of(&req);
        let r = req.into_inner();
        let ask = SessionRequest {
            claim: SessionClaim {
                tenant: &r.tenant,
                shim_id: &r.shim_id,
                epoch: &r.epoch,
                timestamp_ms: r.timestamp_ms,
                nonce: &r.nonce,
            },
            proof: &r.proof,
        };
        // Unknown kinds (a newer shim) are left out: they cannot be served.
        // Each kind once, however often the shim named it.
        let mut shim_memory: Vec<MemoryKind> = Vec::new();
        for k in r.shim_memory().filter_map(caps::memory_from_pb) {
            if !shim_memory.contains(&k) {
                shim_memory.push(k);
            }
        }
        let opened = self.agent.open_session(&ask, &origin, &shim_memory)?;
        let lease_ms = u32::try_from(self.agent.session_lease().as_millis()).unwrap_or(u32::MAX);
        Ok(Response::new(pb::OpenSessionReply {
            session_id: opened.id,
            namespaces: opened.namespaces,
            lease_ms,
            capabilities: Some(caps::to_pb(&opened.capabilities)),
            item_contexts: true,
            get_stream: true,
        }))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        let origin = self.origin_of(&req);
        let unknown_session_ids = self.agent.renew(&req.into_inner().session_ids, &origin);
        Ok(Response::new(pb::RenewReply { unknown_session_ids }))
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let regions = self.agent.close_session(scoped)?;
        crate::hostmem::quiesce(regions).await;
        Ok(Response::new(pb::CloseSessionReply {}))
    }

    async fn register_region(
        &self,
        req: Request<pb::RegisterRegionRequest>,
    ) -> Result<Response<pb::RegisterRegionReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id);
        // A session named from another origin is refused before anything
        // else; an unknown one once the export is read, so that it is
        // released (`Agent::register_region`).
        if let Err(e @ AgentError::Unauthenticated(_)) = scoped {
            return Err(e.into());
        }
        let r = req.into_inner();
        let export = match r.export {
            Some(pb::register_region_request::Export::ColocatedTicket(ticket)) => RegionExport::Colocated { ticket },
            Some(pb::register_region_request::Export::DocaExport(blob)) => RegionExport::Doca { blob },
            None => {
                return Err(AgentError::BadRequest("RegisterRegion needs an export (ticket or DOCA blob)".into()).into())
            }
        };
        // Off the runtime's threads: importing a DOCA export or a dma-buf
        // calls into the driver (milliseconds), and on a per-core runtime
        // every connection of that core would wait. A registration whose
        // caller has gone by its end stays with the session (released with
        // it, and counted against its limits meanwhile).
        let agent = self.agent.clone();
        let length = r.length;
        let region_id = tokio::task::spawn_blocking(move || agent.register_region(scoped, export, length))
            .await
            .map_err(|e| Status::internal(format!("the registration task failed: {e}")))??;
        Ok(Response::new(pb::RegisterRegionReply { region_id, length }))
    }

    async fn release_region(
        &self,
        req: Request<pb::ReleaseRegionRequest>,
    ) -> Result<Response<pb::ReleaseRegionReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let region = self.agent.release_region(&scoped, &req.get_ref().region_id)?;
        crate::hostmem::quiesce(vec![region]).await;
        Ok(Response::new(pb::ReleaseRegionReply {}))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let ctx = RequestCtx::new(r.request_id.clone(), r.timeout_ms);
        let out = self.agent.get(&scoped, &GetObject::from(r), &ctx).await?;
        Ok(Response::new(get_reply(&ctx.request_id, out)))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let ctx = RequestCtx::new(r.request_id.clone(), r.timeout_ms);
        let out = self.agent.put(&scoped, &PutObject::from(r), &ctx).await?;
        Ok(Response::new(pb::PutReply { report: Some(report(&ctx.request_id, &out)), etag: out.etag }))
    }

    async fn head(&self, req: Request<pb::HeadRequest>) -> Result<Response<pb::HeadReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let ctx = RequestCtx::new(r.request_id.clone(), r.timeout_ms);
        let m = self.agent.head(&scoped, &HeadObject::from(r), &ctx).await?;
        Ok(Response::new(pb::HeadReply { object: Some(info(m)) }))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::ListReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let ctx = RequestCtx::new(r.request_id.clone(), r.timeout_ms);
        let page = self.agent.list(&scoped, &ListObjects::from(r), &ctx).await?;
        Ok(Response::new(pb::ListReply {
            objects: page.objects.into_iter().map(info).collect(),
            common_prefixes: page.common_prefixes,
            next_continuation_token: page.next_continuation_token,
        }))
    }

    async fn delete(&self, req: Request<pb::DeleteRequest>) -> Result<Response<pb::DeleteReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let r = req.into_inner();
        let ctx = RequestCtx::new(r.request_id.clone(), r.timeout_ms);
        self.agent.delete(&scoped, &DeleteObject::from(r), &ctx).await?;
        Ok(Response::new(pb::DeleteReply {}))
    }

    async fn stats(&self, req: Request<pb::StatsRequest>) -> Result<Response<pb::StatsReply>, Status> {
        let scoped = self.scoped(&req, &req.get_ref().session_id)?;
        let s = self.agent.stats(&scoped);
        Ok(Response::new(pb::StatsReply {
            requests: s.requests,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            errors: s.errors,
            fallbacks: s.fallbacks,
            regions: s.regions,
            registered_bytes: s.registered_bytes,
        }))
    }
}
