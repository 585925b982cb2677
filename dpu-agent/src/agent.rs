//! The agent's domain service: tenants, sessions, regions and the object
//! operations. gRPC handlers (see `grpc.rs`) are thin adapters over this.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, Instrument};

use crate::capabilities::Capabilities;
use crate::config::{AgentConfig, Limits, NamespaceConfig};
use crate::error::AgentError;
use crate::hostmem::{HostMemory, HostRegion, MemoryKind, RegionExport};
use crate::identity::{SessionRequest, ShimAuth, ShimOrigin};
use crate::ids::random_id;
use crate::metrics::Metrics;
use crate::model::{Permission, Placement};
use crate::quota::Quotas;
use crate::requests::{DeleteObject, GetObject, HeadObject, ListObjects, PutObject, RequestCtx};
use crate::s3::call::{Call, ObjectRead, ObjectWrite, RegionSlice};
use crate::s3::client::S3Client;
use crate::s3::model::{DataPathUsed, ListPage, ObjectMeta};
use crate::s3::setup::{Failover, Signers, StoreParts};
use crate::s3::store::{ObjectStore, S3Counters};
use crate::s3::token_path::Fallback;
use crate::session::{Registered, Scoped, Session, Sessions};
use crate::startup::StartupError;
use crate::transports::RunningTransports;

struct Tenant {
    namespaces: HashMap<String, Arc<ObjectStore>>,
}

/// The path label and fallback summary for a transfer.
/// A degraded namespace (its transport is unavailable) says so first.
fn path_of(
    rdma_parts: u32,
    fallbacks: &[Fallback],
    degraded: Option<&Fallback>,
    placement: Placement,
) -> (DataPathUsed, String) {
    let reason = degraded.or(fallbacks.first()).map(|f| format!("{}: {}", f.kind, f.message)).unwrap_or_default();
    if rdma_parts > 0 && fallbacks.is_empty() {
        (if placement == Placement::Staged { DataPathUsed::RdmaStaged } else { DataPathUsed::Rdma }, reason)
    } else {
        (DataPathUsed::Http, reason)
    }
}

/// What a GET or PUT did, for the caller (`grpc.rs` turns it into the
/// wire's `TransferReport`).
#[derive(Debug, Clone)]
pub struct TransferSummary {
    pub bytes: u64,
    pub data_path: DataPathUsed,
    pub fallback_reason: String,
    pub elapsed: Duration,
    pub parts: u32,
    pub etag: String,
    /// GET only: size of the whole object.
    pub object_size: u64,
    /// Why the bytes could not be checked end to end; `None`: they were.
    pub unverified: Option<String>,
}

/// A session the agent opened, and what it can do.
#[derive(Debug, Clone)]
pub struct OpenedSession {
    pub id: String,
    /// The tenant's namespaces, sorted.
    pub namespaces: Vec<String>,
    pub capabilities: Capabilities,
}

/// A snapshot of a session's counters.
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub regions: u32,
    pub registered_bytes: u64,
}

/// Where a namespace's S3 requests go instead of signed HTTP, by tenant
/// and namespace (`Agent::from_parts`).
pub type ClientFor<'a> = &'a dyn Fn(&str, &NamespaceConfig) -> Arc<dyn S3Client>;

/// What an agent is built with besides its config: the host memory it
/// reaches, its metrics, and the one-sided transports already started.
pub struct AgentParts<'a> {
    pub memory: Arc<dyn HostMemory>,
    pub metrics: Arc<Metrics>,
    pub transports: &'a RunningTransports,
}

/// The agent.
pub struct Agent {
    tenants: HashMap<String, Tenant>,
    sessions: Sessions,
    memory: Arc<dyn HostMemory>,
    metrics: Arc<Metrics>,
    limits: Limits,
    auth: ShimAuth,
    /// Per-tenant quotas and the fair transfer scheduler.
    quotas: Quotas,
    /// Every namespace's request signer (credentials rotate on SIGHUP).
    signers: Signers,
    /// The regions each tenant holds over all its sessions.
    region_places: crate::tenant_places::TenantPlaces,
    /// The endpoints' health and the upload journal (`s3::setup`).
    failover: Arc<Failover>,
}

impl Agent {
    /// Builds the agent from its config: one S3 client per namespace, sharing
    /// one connection pool (`s3::setup`).
    pub fn new(
        cfg: &AgentConfig,
        memory: Arc<dyn HostMemory>,
        metrics: Arc<Metrics>,
        transports: &RunningTransports,
    ) -> Result<Self, StartupError> {
        Self::build(cfg, AgentParts { memory, metrics, transports }, None)
    }

    /// Builds the agent from its config and `parts`, each namespace sending
    /// its S3 requests through `client(tenant, namespace)` instead of
    /// signed HTTP: the test seam (`s3::mock`'s in-memory store, or
    /// `s3::failing` around any client, with the `mock` feature).
    pub fn from_parts(cfg: &AgentConfig, parts: AgentParts<'_>, client: ClientFor<'_>) -> Result<Self, StartupError> {
        Self::build(cfg, parts, Some(client))
    }

    fn build(
        cfg: &AgentConfig,
        AgentParts { memory, metrics, transports }: AgentParts<'_>,
        client: Option<ClientFor<'_>>,
    ) -> Result<Self, StartupError> {
        let counters =
            S3Counters { retries: metrics.s3_retries.clone(), multipart_aborts: metrics.multipart_aborts.clone() };
        let failover = Arc::new(Failover::from_config(cfg, Some(metrics.endpoints.clone()))?);
        let parts = StoreParts::from_config(cfg, counters, failover.clone())?;
        let mut signers = Signers::default();
        let mut tenants = HashMap::new();
        for t in &cfg.tenants {
            let mut namespaces = HashMap::new();
            for ns in &t.namespaces {
                let chosen = transports.choose(&t.name, ns)?;
                let store = match client {
                    Some(client) => ObjectStore::on_client(&parts, cfg, &t.name, ns, chosen, client(&t.name, ns))?,
                    None => {
                        let (store, signer) = ObjectStore::for_namespace(&parts, cfg, &t.name, ns, chosen)?;
                        signers.add(&ns.credentials, &format!("{}/{}", t.name, ns.name), signer);
                        store
                    }
                };
                namespaces.insert(ns.name.clone(), Arc::new(store));
            }
            tenants.insert(t.name.clone(), Tenant { namespaces });
        }
        let auth = ShimAuth::from_config(cfg)?;
        let quotas = Quotas::new(cfg, metrics.quota_refusals.clone(), metrics.slot_wait.clone())?;
        let limits = cfg.limits.clone();
        let sessions =
            Sessions::new(Duration::from_millis(cfg.limits.session_lease_ms), cfg.limits.max_sessions_per_tenant);
        let region_places = crate::tenant_places::TenantPlaces::new(cfg.limits.max_regions_per_tenant, "regions");
        Ok(Self { tenants, sessions, memory, metrics, limits, auth, quotas, signers, region_places, failover })
    }

    /// Every namespace's store, as `tenant/namespace` (readiness probes).
    pub fn stores(&self) -> Vec<(String, Arc<ObjectStore>)> {
        let mut out: Vec<_> = self
            .tenants
            .iter()
            .flat_map(|(t, tenant)| tenant.namespaces.iter().map(move |(n, s)| (format!("{t}/{n}"), s.clone())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The endpoints' health checks and the upload journal.
    pub fn failover(&self) -> &Arc<Failover> {
        &self.failover
    }

    /// The namespaces' signers (credential rotation: [`Signers::rotate`]).
    pub fn signers(&self) -> &Signers {
        &self.signers
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The QoS layer (hot reload: [`Quotas::apply`]).
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The open session `id`, for a request from `origin`: the one way to
    /// get the [`Scoped`] every session operation takes. A session id
    /// presented from another origin than the one it was opened from is
    /// refused (a leaked id is useless elsewhere); an unknown one is
    /// `UNAUTHENTICATED`. Renews the session (every call that names it
    /// counts).
    pub fn scoped(&self, session_id: &str, origin: &ShimOrigin) -> Result<Scoped, AgentError> {
        self.sessions.scoped(session_id, origin, |s| {
            self.metrics.auth_failures.with_label_values(&[&s.tenant, "origin_mismatch"]).inc();
            tracing::warn!(tenant = %s.tenant, opened_from = ?s.origin, used_from = ?origin, "session used from another origin");
        })
    }

    /// `s` again for a later step of the same call (a batch's next item):
    /// renewed, or `UNAUTHENTICATED` once the session is gone.
    pub fn rescoped(&self, s: &Scoped) -> Result<Scoped, AgentError> {
        self.sessions.refresh(s)
    }

    /// How long a session lives without a call or a Renew naming it.
    pub fn session_lease(&self) -> Duration {
        self.sessions.lease()
    }

    fn store(&self, session: &Session, namespace: &str) -> Result<Arc<ObjectStore>, AgentError> {
        self.tenants
            .get(&session.tenant)
            .and_then(|t| t.namespaces.get(namespace))
            .cloned()
            .ok_or_else(|| AgentError::UnknownNamespace(crate::error::echoed(namespace)))
    }

    /// The session's tenant's namespace, if its ACL grants `perm`. Names are
    /// resolved only among the session's own tenant's namespaces, so another
    /// tenant's namespace is "unknown", never "denied".
    fn authorize(
        &self,
        session: &Session,
        namespace: &str,
        perm: Permission,
        op: &str,
    ) -> Result<Arc<ObjectStore>, AgentError> {
        let store = self.store(session, namespace)?;
        if !store.allows(perm) {
            self.metrics.access_denied.with_label_values(&[&session.tenant, namespace, op]).inc();
            return Err(AgentError::AccessDenied(format!(
                "tenant {:?} has no {:?} access to namespace {namespace:?}",
                session.tenant,
                perm.as_str()
            )));
        }
        Ok(store)
    }

    fn region(&self, session: &Session, region_id: &str) -> Result<Arc<dyn HostRegion>, AgentError> {
        session
            .regions()
            .get(region_id)
            .map(|r| r.region.clone())
            .ok_or_else(|| AgentError::UnknownRegion(crate::error::echoed(region_id)))
    }

    /// The host memory this agent reaches.
    pub fn memory_capabilities(&self) -> crate::hostmem::MemoryCaps {
        self.memory.capabilities()
    }

    /// What a session of `tenant` can do, for a shim that registers
    /// `shim_memory` (capability exchange).
    pub fn capabilities(&self, tenant: &str, shim_memory: &[MemoryKind]) -> Result<Capabilities, AgentError> {
        let t = self.tenants.get(tenant).ok_or_else(|| AgentError::UnknownTenant(tenant.to_owned()))?;
        let mut namespaces: Vec<_> = t.namespaces.iter().map(|(name, store)| store.capabilities(name)).collect();
        namespaces.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Capabilities {
            memory: self.memory.capabilities(),
            shim_memory: shim_memory.to_vec(),
            max_batch_items: crate::model::MAX_BATCH_ITEMS as u32,
            max_registered_bytes: self.limits.max_registered_bytes_per_session,
            namespaces,
        })
    }

    /// This run's epoch, which session proofs must carry (`GetEpoch`): new
    /// at every start, so a proof captured before a restart fails after it.
    pub fn epoch(&self) -> &[u8; sluice_proto::auth::EPOCH_BYTES] {
        self.auth.epoch()
    }

    /// Opens a session for a shim that proved it may act for the tenant,
    /// and tells it what the session can do.
    pub fn open_session(
        &self,
        req: &SessionRequest<'_>,
        origin: &ShimOrigin,
        shim_memory: &[MemoryKind],
    ) -> Result<OpenedSession, AgentError> {
        let (tenant, shim_id) = (req.claim.tenant, req.claim.shim_id);
        if let Err((reason, e)) = self.auth.authenticate(req, origin, sluice_proto::auth::now_ms()) {
            let label = if self.tenants.contains_key(tenant) { tenant } else { "-" };
            self.metrics.auth_failures.with_label_values(&[label, reason]).inc();
            tracing::warn!(tenant, shim_id, ?origin, reason, "session refused");
            return Err(e);
        }
        let capabilities = self.capabilities(tenant, shim_memory)?;
        if !shim_memory.is_empty() && capabilities.usable_memory().is_empty() {
            // Object calls without regions (HEAD, LIST, DELETE) still work;
            // every registration will be refused, so say why once here.
            tracing::warn!(tenant, shim_id, shim = ?shim_memory, agent = ?capabilities.memory.kinds,
                "this shim registers no memory this agent can reach: its regions will be refused");
        }
        let id = random_id();
        if let Err(e) = self.sessions.open(id.clone(), tenant, origin) {
            tracing::warn!(tenant, shim_id, error = %e, "session refused");
            return Err(e);
        }
        self.metrics.sessions.inc();
        info!(tenant, shim_id, "session opened");
        let namespaces = capabilities.namespaces.iter().map(|n| n.name.clone()).collect();
        Ok(OpenedSession { id, namespaces, capabilities })
    }

    /// Closes a session; returns its regions so the caller can wait until
    /// transfers still using them have finished ([`crate::hostmem::quiesce`]).
    pub fn close_session(&self, scoped: Scoped) -> Result<Vec<Arc<dyn HostRegion>>, AgentError> {
        let s = self.sessions.remove(scoped.id()).ok_or(AgentError::UnknownSession)?;
        let regions = self.retire(&s);
        info!(tenant = %s.tenant, released = regions.len(), "session closed");
        Ok(regions)
    }

    /// Takes a removed session's regions out of the gauges; returns them.
    fn retire(&self, s: &Session) -> Vec<Arc<dyn HostRegion>> {
        let regions = std::mem::take(&mut *s.regions());
        self.metrics.regions.with_label_values(&[&s.tenant]).sub(regions.len() as i64);
        self.metrics.registered_bytes.with_label_values(&[&s.tenant]).sub(Session::registered_bytes(&regions) as i64);
        self.metrics.sessions.dec();
        regions.into_values().map(|r| r.region).collect()
    }

    /// Renews the sessions a shim names; returns those it must re-open.
    pub fn renew(&self, ids: &[String], origin: &ShimOrigin) -> Vec<String> {
        self.sessions.renew(ids, origin)
    }

    /// Closes every session whose lease ran out (its shim died) and
    /// releases its regions; returns how many.
    pub fn expire_sessions(&self) -> usize {
        let expired = self.sessions.take_expired();
        for (_, s) in &expired {
            let regions = self.retire(s);
            self.metrics.sessions_expired.with_label_values(&[&s.tenant]).inc();
            tracing::warn!(tenant = %s.tenant, released = regions.len(),
                lease_ms = self.sessions.lease().as_millis() as u64,
                "session expired: its shim stopped renewing it; regions released");
            // Transfers still using a region hold their own reference; the
            // mapping goes when the last of them ends.
        }
        expired.len()
    }

    /// Expires dead sessions every quarter lease, until the agent stops.
    pub async fn reap_sessions(self: Arc<Self>) {
        let every = (self.sessions.lease() / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.expire_sessions();
        }
    }

    /// Registers the region `export` names for session `scoped`, or, if
    /// `scoped` is an error (the session is not open), refuses it; either
    /// refusal releases what the export holds.
    pub fn register_region(
        &self,
        scoped: Result<Scoped, AgentError>,
        export: RegionExport,
        length: u64,
    ) -> Result<String, AgentError> {
        let r = scoped.and_then(|s| self.register_checked(s.session(), export.clone(), length));
        if r.is_err() {
            // Refused before the export was taken: release what it holds
            // (a deposited memfd) now rather than when its ticket expires.
            self.memory.discard(&export);
        }
        r
    }

    fn register_checked(&self, s: &Session, export: RegionExport, length: u64) -> Result<String, AgentError> {
        if length == 0 {
            return Err(AgentError::BadRequest("region length must be > 0".into()));
        }
        let mut regions = s.regions();
        if regions.len() >= self.limits.max_regions_per_session {
            return Err(AgentError::ResourceExhausted(format!(
                "{} regions per session",
                self.limits.max_regions_per_session
            )));
        }
        if Session::registered_bytes(&regions).saturating_add(length) > self.limits.max_registered_bytes_per_session {
            return Err(AgentError::ResourceExhausted(format!(
                "{} registered bytes per session",
                self.limits.max_registered_bytes_per_session
            )));
        }
        // The tenant's quota over all its sessions; refused (not queued):
        // registration is on the connection path.
        let place = self.region_places.take(&s.tenant)?;
        let quota = self.quotas.qos().reserve_memory(&s.tenant, length)?;
        let region = self.memory.import(export, length)?;
        let id = random_id();
        regions.insert(id.clone(), Registered { region, _quota: quota, _place: place });
        self.metrics.regions.with_label_values(&[&s.tenant]).inc();
        self.metrics.registered_bytes.with_label_values(&[&s.tenant]).add(length as i64);
        Ok(id)
    }

    /// Releases a region; returns it so the caller can wait until transfers
    /// still using it have finished ([`crate::hostmem::quiesce`]).
    pub fn release_region(&self, scoped: &Scoped, region_id: &str) -> Result<Arc<dyn HostRegion>, AgentError> {
        let s = scoped.session();
        let r =
            s.regions().remove(region_id).ok_or_else(|| AgentError::UnknownRegion(crate::error::echoed(region_id)))?;
        self.metrics.regions.with_label_values(&[&s.tenant]).dec();
        self.metrics.registered_bytes.with_label_values(&[&s.tenant]).sub(r.region.len() as i64);
        Ok(r.region)
    }

    /// Admits one request of the session's tenant that will move up to
    /// `bytes` (requests/s, in-flight bytes); the permit is held until the
    /// request ends. Refusals are `AgentError::Quota` (QUOTA_EXCEEDED).
    async fn admit(&self, s: &Session, bytes: u64) -> Result<sluice_qos::Permit, AgentError> {
        Ok(self.quotas.qos().admit(&s.tenant, bytes).await?)
    }

    /// Upper bound of what a GET can move into `room` bytes of region:
    /// the range's length if it has one, else the room, capped at the
    /// tenant's in-flight limit (an unknown-size GET then runs alone instead
    /// of being refused for a region larger than the budget).
    fn get_bound(&self, tenant: &str, room: u64, len: Option<u64>) -> u64 {
        match len {
            Some(l) => l.min(room),
            None => {
                let cap = self.quotas.qos().limits(tenant).and_then(|l| l.max_inflight_bytes);
                cap.map_or(room, |c| room.min(c))
            }
        }
    }

    /// The deadline of a request in `namespace`: the caller's timeout if it
    /// gave one, never more than the namespace's `request_timeout_ms`.
    fn deadline(&self, s: &Session, namespace: &str, timeout: Option<Duration>) -> Duration {
        let ns = self
            .tenants
            .get(&s.tenant)
            .and_then(|t| t.namespaces.get(namespace))
            .map_or(crate::config::DEFAULT_REQUEST_TIMEOUT, |st| st.request_timeout());
        timeout.map_or(ns, |t| ns.min(t))
    }

    /// Runs `f` as one request: its deadline, a span with the request id,
    /// metrics, stats. A request past its deadline is dropped where it
    /// stands (every S3 call it made is cancelled and an unfinished
    /// multipart upload aborted) and fails with DEADLINE_EXCEEDED.
    async fn run<T, F>(
        &self,
        s: &Session,
        ctx: &RequestCtx,
        (namespace, op): (&str, &'static str),
        info_of: impl Fn(&T) -> (u64, DataPathUsed),
        f: F,
    ) -> Result<T, AgentError>
    where
        F: std::future::Future<Output = Result<T, AgentError>>,
    {
        let request_id = ctx.request_id.as_str();
        let span = tracing::info_span!("request", request_id, tenant = %s.tenant, namespace, op);
        let start = Instant::now();
        let limit = self.deadline(s, namespace, ctx.timeout);
        let result = match tokio::time::timeout(limit, f.instrument(span.clone())).await {
            Ok(r) => r,
            Err(_) => Err(AgentError::DeadlineExceeded(limit)),
        };
        let elapsed = start.elapsed();
        s.stats.requests.fetch_add(1, Ordering::Relaxed);
        let _g = span.enter();
        match &result {
            Ok(v) => {
                let (n, path) = info_of(v);
                match op {
                    "get" => s.stats.bytes_read.fetch_add(n, Ordering::Relaxed),
                    "put" => s.stats.bytes_written.fetch_add(n, Ordering::Relaxed),
                    _ => 0,
                };
                self.metrics.observe(&s.tenant, namespace, op, path.label(), elapsed, Ok(n));
                tracing::debug!(
                    bytes = n,
                    data_path = path.label(),
                    elapsed_us = elapsed.as_micros() as u64,
                    "request done"
                );
            }
            Err(e) => {
                s.stats.errors.fetch_add(1, Ordering::Relaxed);
                let path = self
                    .tenants
                    .get(&s.tenant)
                    .and_then(|t| t.namespaces.get(namespace))
                    .map_or(DataPathUsed::Http, |st| st.configured_data_path());
                self.metrics.observe(&s.tenant, namespace, op, path.label(), elapsed, Err(e.kind()));
                tracing::info!(error = %e, "request failed");
            }
        }
        result
    }

    /// Fallbacks are loud: a warning (logged where they happen), a counter by
    /// reason, and the session's count.
    fn record_fallbacks(&self, s: &Session, namespace: &str, op: &str, store: &ObjectStore, fallbacks: &[Fallback]) {
        if let Some(d) = store.degraded() {
            // Warned once at startup; per request it is counted and reported.
            tracing::debug!(tenant = %s.tenant, namespace, op, reason = %d.message, "configured transport unavailable");
        }
        let fallbacks: Vec<&Fallback> = store.degraded().into_iter().chain(fallbacks).collect();
        for f in &fallbacks {
            self.metrics.fallbacks.with_label_values(&[&s.tenant, namespace, op, f.kind]).inc();
        }
        if !fallbacks.is_empty() {
            s.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Runs one GET for session `scoped` (no timeout in `ctx`: the
    /// namespace's deadline).
    pub async fn get(&self, scoped: &Scoped, req: &GetObject, ctx: &RequestCtx) -> Result<TransferSummary, AgentError> {
        let s = scoped.session();
        let GetObject { namespace, key, range, region_id, offset, max_bytes, if_match } = req;
        let (namespace, offset, max_bytes) = (namespace.as_str(), *offset, *max_bytes);
        let work = async {
            let store = self.authorize(s, namespace, Permission::Read, "get")?;
            let region = self.region(s, region_id)?;
            check_key(key)?;
            let (start, len) = range.unwrap_or((0, None));
            let t0 = Instant::now();
            // Admitted for its upper bound (requests/s, in-flight bytes); each
            // part is then paced and scheduled fairly inside the S3 client.
            // 0: up to the region's end.
            let room = if max_bytes == 0 { u64::MAX } else { max_bytes };
            let bound = self.get_bound(&s.tenant, region.len().saturating_sub(offset).min(room), len);
            let permit = self.admit(s, bound).await?;
            let into = RegionSlice { region: &region, offset, room };
            let read = ObjectRead { key, start, length: len, if_match: if_match.as_deref() };
            let call = Call { request_id: &ctx.request_id, gate: Some(&permit) };
            let out = store.get_into(&read, &into, &call).await?;
            // A first try that fell back is counted; the path is the parts'.
            let counted: Vec<Fallback> = out.fallbacks.iter().chain(&out.first_try).cloned().collect();
            self.record_fallbacks(s, namespace, "get", &store, &counted);
            let (data_path, fallback_reason) =
                path_of(out.rdma_parts, &out.fallbacks, store.degraded(), store.placement());
            Ok(TransferSummary {
                bytes: out.bytes,
                data_path,
                fallback_reason,
                elapsed: t0.elapsed(),
                parts: out.parts,
                etag: out.etag,
                object_size: out.object_size,
                unverified: out.unverified,
            })
        };
        self.run(s, ctx, (namespace, "get"), |r: &TransferSummary| (r.bytes, r.data_path), work).await
    }

    /// Runs one PUT for session `scoped`.
    pub async fn put(&self, scoped: &Scoped, req: &PutObject, ctx: &RequestCtx) -> Result<TransferSummary, AgentError> {
        let s = scoped.session();
        let PutObject { namespace, key, region_id, offset, length, content_type } = req;
        let (namespace, offset, length) = (namespace.as_str(), *offset, *length);
        let work = async {
            let store = self.authorize(s, namespace, Permission::Write, "put")?;
            let region = self.region(s, region_id)?;
            check_key(key)?;
            region.check(offset, length)?;
            // Refused before an upload starts, not at part 10,001.
            if length > store.max_object_bytes() {
                return Err(AgentError::Unsupported(format!(
                    "a {length}-byte object exceeds the {} bytes a PUT can write to namespace {namespace:?} \
                     (at most {} multipart parts; the agent's [s3] put_part_size sets the part size)",
                    store.max_object_bytes(),
                    crate::model::MAX_PARTS,
                )));
            }
            let t0 = Instant::now();
            // Admitted for its length; each part is paced and scheduled
            // fairly inside the S3 client.
            let permit = self.admit(s, length).await?;
            let write = ObjectWrite { key, region: &region, offset, length, content_type };
            let out = store.put_from(&write, &Call { request_id: &ctx.request_id, gate: Some(&permit) }).await?;
            self.record_fallbacks(s, namespace, "put", &store, &out.fallbacks);
            let (data_path, fallback_reason) =
                path_of(out.rdma_parts, &out.fallbacks, store.degraded(), store.placement());
            Ok(TransferSummary {
                bytes: length,
                data_path,
                fallback_reason,
                elapsed: t0.elapsed(),
                parts: out.parts,
                etag: out.etag,
                object_size: length,
                unverified: out.unverified,
            })
        };
        self.run(s, ctx, (namespace, "put"), |r: &TransferSummary| (r.bytes, r.data_path), work).await
    }

    pub async fn head(&self, scoped: &Scoped, req: &HeadObject, ctx: &RequestCtx) -> Result<ObjectMeta, AgentError> {
        let (s, HeadObject { namespace, key }) = (scoped.session(), req);
        let work = async {
            let store = self.authorize(s, namespace, Permission::Read, "head")?;
            check_key(key)?;
            let _permit = self.admit(s, 0).await?;
            Ok(store.head(key, &ctx.request_id).await?)
        };
        self.run(s, ctx, (namespace, "head"), |_| (0, DataPathUsed::Http), work).await
    }

    pub async fn list(&self, scoped: &Scoped, req: &ListObjects, ctx: &RequestCtx) -> Result<ListPage, AgentError> {
        let (s, ListObjects { namespace, prefix, continuation_token, max_keys, delimiter }) = (scoped.session(), req);
        let work = async {
            let store = self.authorize(s, namespace, Permission::List, "list")?;
            check_prefix(prefix)?;
            let _permit = self.admit(s, 0).await?;
            Ok(store.list_page(prefix, continuation_token, *max_keys, delimiter, &ctx.request_id).await?)
        };
        self.run(s, ctx, (namespace, "list"), |_| (0, DataPathUsed::Http), work).await
    }

    pub async fn delete(&self, scoped: &Scoped, req: &DeleteObject, ctx: &RequestCtx) -> Result<(), AgentError> {
        let (s, DeleteObject { namespace, key }) = (scoped.session(), req);
        let work = async {
            let store = self.authorize(s, namespace, Permission::Delete, "delete")?;
            check_key(key)?;
            let _permit = self.admit(s, 0).await?;
            Ok(store.delete(key, &ctx.request_id).await?)
        };
        self.run(s, ctx, (namespace, "delete"), |_| (0, DataPathUsed::Http), work).await
    }

    pub fn stats(&self, scoped: &Scoped) -> StatsSnapshot {
        let s = scoped.session();
        let regions = s.regions();
        let st = &s.stats;
        StatsSnapshot {
            requests: st.requests.load(Ordering::Relaxed),
            bytes_read: st.bytes_read.load(Ordering::Relaxed),
            bytes_written: st.bytes_written.load(Ordering::Relaxed),
            errors: st.errors.load(Ordering::Relaxed),
            fallbacks: st.fallbacks.load(Ordering::Relaxed),
            regions: regions.len() as u32,
            registered_bytes: Session::registered_bytes(&regions),
        }
    }
}

/// S3 keys are 1..=1024 bytes of UTF-8.
/// Object keys stay inside the namespace's prefix even on stores that map
/// keys to file paths: no `.`/`..` segments, no leading or doubled `/`, no
/// control characters.
fn check_key(key: &str) -> Result<(), AgentError> {
    if key.is_empty() || key.len() > 1024 {
        return Err(AgentError::BadRequest(format!("object keys must be 1 to 1024 bytes (got {})", key.len())));
    }
    // "dir/" folder markers are fine.
    check_key_path(key.strip_suffix('/').unwrap_or(key))
}

/// The same rules for list prefixes (which may be empty or end in `/`).
fn check_prefix(prefix: &str) -> Result<(), AgentError> {
    if prefix.is_empty() {
        return Ok(());
    }
    check_key_path(prefix.strip_suffix('/').unwrap_or(prefix))
}

fn check_key_path(key: &str) -> Result<(), AgentError> {
    if key.chars().any(char::is_control) {
        return Err(AgentError::BadRequest("object keys may not contain control characters".into()));
    }
    if key.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") {
        return Err(AgentError::BadRequest(format!(
            "object key {:?} has an empty, \".\" or \"..\" path segment (keys cannot leave the namespace)",
            crate::error::echoed(key)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_key, check_prefix};

    #[test]
    fn keys_cannot_leave_the_namespace_prefix() {
        for ok in ["a", "a/b.c", "dir/", "x/..y/z", "日本/語"] {
            assert!(check_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../b", "a/../../b", "a/./b", "/abs", "a//b", "..", "a/..", "a\u{0}b", "a\nb"] {
            assert!(check_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_key(&"k".repeat(1025)).is_err());
        assert!(check_prefix("").is_ok() && check_prefix("logs/").is_ok() && check_prefix("logs/2026").is_ok());
        assert!(check_prefix("../").is_err() && check_prefix("a/../").is_err());
    }
}
