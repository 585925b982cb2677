//! A client connection's session with the agent, and riding through agent
//! restarts.
//!
//! The shim keeps what it needs to register every region again (the
//! region's memfd, or its DOCA export), and names regions to clients by ids
//! of its own. When the agent answers UNAUTHENTICATED for a session (it
//! restarted, or the session's lease ran out), the shim opens a new session,
//! registers the regions again and retries the call once; the renew loop
//! does the same ahead of time for sessions the agent no longer knows. So
//! loaders keep their connection and their regions across an agent restart:
//! calls in flight when it died fail with AGENT_UNAVAILABLE, later ones
//! succeed.
//!
//! Every session holds the [`SessionContext`] (what all sessions share);
//! handlers reach the agent only through a [`Session`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_proto::common::{Capabilities, ErrorCode};
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::agent_link::AgentLink;
use crate::agent_session::open_agent_session;
pub(crate) use crate::agent_session::session_gone;
use crate::config::{ShimConfig, ShimLimits};
use crate::error::ShimError;
use crate::memory::{ExportGuard, MemoryBackend, RegionSource};

/// What every session of this shim shares, and all the session layer uses:
/// the agent link, who this shim is, the tenants' secrets, how regions are
/// exported, the configuration (limits and the shim's part of the
/// capabilities) and the registry the renew loop walks. Built once at
/// startup (`server::run`); each [`Session`] holds it.
pub struct SessionContext {
    agent: Arc<AgentLink>,
    shim_id: String,
    /// Per tenant, the secret proven to the agent (never sent).
    secrets: HashMap<String, Vec<u8>>,
    memory: MemoryBackend,
    config: Arc<ShimConfig>,
    registry: Registry,
    /// Single GETs sent together (`[agent] coalesce_gets`).
    coalescer: Option<Arc<crate::coalesce::Coalescer>>,
    /// Single GETs on long-lived calls (`[agent] get_stream`).
    get_streams: Option<Arc<crate::get_stream::GetStreams>>,
}

/// The counters of how single GETs go to the agent (`ShimMetrics`).
pub struct GetCounters {
    pub coalesced: prometheus::IntCounter,
    pub streamed: prometheus::IntCounter,
    pub framed_links: prometheus::IntCounter,
    pub framed_gets: prometheus::IntCounter,
}

impl SessionContext {
    pub fn new(
        agent: Arc<AgentLink>,
        shim_id: String,
        secrets: HashMap<String, Vec<u8>>,
        memory: MemoryBackend,
        config: Arc<ShimConfig>,
        counters: GetCounters,
    ) -> Self {
        let GetCounters { coalesced, streamed, framed_links, framed_gets } = counters;
        let coalescer = config.agent.coalesce_gets.then(|| crate::coalesce::Coalescer::new(coalesced));
        let framed = agent.framed_target().map(|target| crate::get_stream::FramedTo {
            target,
            links: framed_links,
            gets: framed_gets,
        });
        let get_streams = config
            .agent
            .get_stream
            .then(|| crate::get_stream::GetStreams::new(agent.every_channel(), streamed, framed));
        Self { agent, shim_id, secrets, memory, config, registry: Registry::default(), coalescer, get_streams }
    }

    /// Where single GETs go to be sent together, if they are.
    pub fn coalescer(&self) -> Option<Arc<crate::coalesce::Coalescer>> {
        self.coalescer.clone()
    }

    /// The long-lived calls single GETs go on, if they do.
    pub fn get_streams(&self) -> Option<Arc<crate::get_stream::GetStreams>> {
        self.get_streams.clone()
    }

    /// Whether this shim can open sessions for `tenant` (it has its secret).
    pub fn serves(&self, tenant: &str) -> bool {
        self.secrets.contains_key(tenant)
    }

    /// How regions are exported to the agent.
    pub fn memory(&self) -> &MemoryBackend {
        &self.memory
    }

    pub fn limits(&self) -> &ShimLimits {
        &self.config.limits
    }

    fn grpc(&self) -> AgentClient<Channel> {
        self.agent.grpc()
    }
}

/// A region as the agent knows it.
enum AgentRegion {
    /// Registered; the agent's id for it.
    Id(String),
    /// Could not be registered again after an agent restart (why).
    Lost(String),
}

struct Region {
    len: u64,
    /// The connection that registered it (released when that connection
    /// ends, if it joined the session; with the session otherwise).
    conn: u64,
    /// The agent's id for it in the current agent session.
    agent_id: AgentRegion,
    source: Arc<RegionSource>,
    /// Keeps a DOCA export valid until the agent has released the region.
    _guard: ExportGuard,
}

struct Inner {
    agent_session: String,
    /// What the agent answered for the current agent session, with the
    /// shim's part filled in (the agent's config may change across its
    /// restarts).
    capabilities: Arc<Capabilities>,
    /// The agent takes GetMany items with contexts of their own (so single
    /// GETs may be sent together).
    item_contexts: bool,
    /// The agent serves GetStream.
    get_stream: bool,
    /// Bumped each time the agent session is replaced.
    generation: u64,
    regions: HashMap<String, Region>,
    /// Registrations on their way, per connection: they count against
    /// `max_regions_per_connection` from their start, so requests sent at
    /// once cannot all pass the check before any is kept.
    registering: HashMap<u64, usize>,
    closed: bool,
}

/// A session bound to a connection at Hello: the session, the tenant's
/// namespaces and what the session can do.
pub type Bound = (Arc<Session>, Vec<String>, Arc<Capabilities>);

/// A registration on its way ([`Session::reserve_region`]).
pub struct RegionSlot<'s> {
    session: &'s Session,
    conn: u64,
}

impl Drop for RegionSlot<'_> {
    fn drop(&mut self) {
        let mut inner = self.session.inner();
        if let Some(n) = inner.registering.get_mut(&self.conn) {
            *n -= 1;
            if *n == 0 {
                inner.registering.remove(&self.conn);
            }
        }
    }
}

/// One client connection, as the session knows it: which regions are its
/// own, and whether it has ended (a region registered after that is not
/// kept).
#[derive(Debug)]
pub struct ConnectionTag {
    pub id: u64,
    /// Set (under the session's lock) when a joined connection leaves.
    gone: std::sync::atomic::AtomicBool,
}

impl ConnectionTag {
    pub fn new(id: u64) -> Self {
        Self { id, gone: std::sync::atomic::AtomicBool::new(false) }
    }
}

/// Longest the shim waits for the agent to release a connection's regions
/// (all of a joined connection's together, or a whole session's).
const RELEASE_WAIT: Duration = Duration::from_secs(60);
/// How long the exports of a session whose close the agent did not
/// confirm are kept: its lease (15 s by default) and the wait for
/// transfers at release (30 s) are long over by then.
const UNCONFIRMED_HOLD: Duration = Duration::from_secs(600);
/// Longest each step of re-opening a session (the open, each region's
/// registration) may take.
const REOPEN_STEP: Duration = Duration::from_secs(30);

/// Who opened a session: only the same process may join it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// One client connection's session (and the session of the connections of
/// the same process that joined it: `Hello.join`).
pub struct Session {
    pub tenant: String,
    ctx: Arc<SessionContext>,
    inner: Mutex<Inner>,
    /// One re-establishment at a time.
    reopen: tokio::sync::Mutex<()>,
    /// The process of the connection that opened it.
    owner: Peer,
    /// What a connection of `owner` names to join it (hex of 16 random bytes).
    join_token: String,
    /// Set when the opening connection ends: joined connections close too.
    ended: tokio::sync::watch::Sender<bool>,
    /// The tenant's namespaces, as the agent answered at open.
    namespaces: Vec<String>,
    /// Regions a request the shim gave up on may still be written into.
    doubts: crate::in_doubt::Doubts,
}

/// The agent-side names a call needs, taken together so they belong to the
/// same agent session.
pub struct Snapshot {
    pub session_id: String,
    /// The agent's id of the region the call names ("" for none).
    pub region_id: String,
    /// The agent session takes GetMany items with contexts of their own.
    pub item_contexts: bool,
    /// The agent serves GetStream.
    pub get_stream: bool,
    generation: u64,
}

impl Snapshot {
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    hex::encode(b)
}

impl Session {
    /// Opens the agent session for a client that completed Hello; returns
    /// the tenant's namespaces and what the session can do.
    pub async fn open(ctx: &Arc<SessionContext>, tenant: &str, owner: Peer) -> Result<Bound, ShimError> {
        let opened = open_agent_session(&**ctx, tenant).await?;
        let s = Arc::new(Self {
            tenant: tenant.to_owned(),
            ctx: ctx.clone(),
            inner: Mutex::new(Inner {
                agent_session: opened.id,
                capabilities: opened.capabilities.clone(),
                item_contexts: opened.item_contexts,
                get_stream: opened.get_stream,
                generation: 0,
                regions: HashMap::new(),
                registering: HashMap::new(),
                closed: false,
            }),
            reopen: tokio::sync::Mutex::new(()),
            owner,
            join_token: random_id(),
            ended: tokio::sync::watch::channel(false).0,
            namespaces: opened.namespaces.clone(),
            doubts: Default::default(),
        });
        ctx.registry.add(&s);
        Ok((s, opened.namespaces, opened.capabilities))
    }

    /// What a connection of the same process names to join this session.
    pub fn join_token(&self) -> &str {
        &self.join_token
    }

    /// The open session `token` names, for a connection of `peer`: only
    /// the process that opened it may join it, and only while the
    /// connection that opened it is open. Every refusal reads the same
    /// (nothing tells another process that a session exists).
    pub fn join(ctx: &SessionContext, token: &str, tenant: &str, peer: Peer) -> Result<Bound, ShimError> {
        // (A hash map's lookup time says nothing useful about a 128-bit
        // random token: its hasher is keyed at random.)
        let found = ctx.registry.by_token(token).filter(|s| !s.inner().closed);
        match found {
            // A peer whose pid the kernel did not say never matches.
            Some(s) if s.owner == peer && peer.pid > 0 && s.tenant == tenant => {
                let caps = s.capabilities();
                let namespaces = s.namespaces.clone();
                Ok((s, namespaces, caps))
            }
            _ => Err(ShimError::BadRequest(
                "Hello.join names no open session of this process (its connection closed, or the token is wrong)"
                    .into(),
            )),
        }
    }

    /// Resolves when the connection that opened the session has ended
    /// (a joined connection then closes too).
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.ended.subscribe();
        async move {
            let _ = rx.wait_for(|ended| *ended).await;
        }
    }

    /// Regions a request the shim gave up on may still be written into.
    pub fn doubts(&self) -> &crate::in_doubt::Doubts {
        &self.doubts
    }

    /// How regions are exported to the agent (a handler prepares a region
    /// with it before [`Self::register`]).
    pub fn memory(&self) -> &MemoryBackend {
        &self.ctx.memory
    }

    pub fn limits(&self) -> &ShimLimits {
        self.ctx.limits()
    }

    /// Where single GETs go to be sent together, if they are.
    pub fn coalescer(&self) -> Option<Arc<crate::coalesce::Coalescer>> {
        self.ctx.coalescer()
    }

    /// The long-lived calls single GETs go on, if they do.
    pub fn get_streams(&self) -> Option<Arc<crate::get_stream::GetStreams>> {
        self.ctx.get_streams()
    }

    /// The agent's gRPC client, for a call that handles a lost session
    /// itself (a streaming batch); others go through [`Self::call`].
    pub fn agent(&self) -> AgentClient<Channel> {
        self.ctx.grpc()
    }

    /// What the current agent session can do.
    pub fn capabilities(&self) -> Arc<Capabilities> {
        self.inner().capabilities.clone()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more region of connection `conn`, held until the
    /// registration ends (kept or not), or the connection's limit. Taken
    /// before the region is made or pinned.
    pub fn reserve_region(&self, conn: &ConnectionTag) -> Result<RegionSlot<'_>, ShimError> {
        self.region_slot(conn.id)
    }

    fn region_slot(&self, conn: u64) -> Result<RegionSlot<'_>, ShimError> {
        let max = self.limits().max_regions_per_connection;
        let mut inner = self.inner();
        let held = inner.regions.values().filter(|r| r.conn == conn).count();
        let on_the_way = inner.registering.entry(conn).or_insert(0);
        if held + *on_the_way >= max {
            return Err(ShimError::Limit(format!("{max} regions per connection (max_regions_per_connection)")));
        }
        *on_the_way += 1;
        Ok(RegionSlot { session: self, conn })
    }

    /// The current agent session and, if `region` is given, the agent's id
    /// for that region of this connection.
    pub fn snapshot(&self, region: Option<&str>) -> Result<Snapshot, ShimError> {
        let inner = self.inner();
        let region_id = match region {
            None => String::new(),
            Some(id) => match inner.regions.get(id).map(|r| &r.agent_id) {
                None => return Err(ShimError::UnknownRegion(id.to_owned())),
                Some(AgentRegion::Id(agent_id)) => agent_id.clone(),
                Some(AgentRegion::Lost(why)) => return Err(ShimError::RegionLost(id.to_owned(), why.clone())),
            },
        };
        Ok(Snapshot {
            session_id: inner.agent_session.clone(),
            region_id,
            item_contexts: inner.item_contexts,
            get_stream: inner.get_stream,
            generation: inner.generation,
        })
    }

    /// The current agent session and the agent's ids of `regions` (each
    /// checked on its own), taken together under one lock so they belong to
    /// the same agent session.
    pub fn snapshot_many<'a>(
        &self,
        regions: impl Iterator<Item = &'a str>,
    ) -> (Snapshot, Vec<Result<String, ShimError>>) {
        let inner = self.inner();
        let ids = regions
            .map(|id| match inner.regions.get(id).map(|r| &r.agent_id) {
                None => Err(ShimError::UnknownRegion(id.to_owned())),
                Some(AgentRegion::Id(agent_id)) => Ok(agent_id.clone()),
                Some(AgentRegion::Lost(why)) => Err(ShimError::RegionLost(id.to_owned(), why.clone())),
            })
            .collect();
        let snap = Snapshot {
            session_id: inner.agent_session.clone(),
            region_id: String::new(),
            item_contexts: inner.item_contexts,
            get_stream: inner.get_stream,
            generation: inner.generation,
        };
        (snap, ids)
    }

    /// Runs one agent call (`f` gets the agent names and a client); if the
    /// agent no longer knows the session, opens a new one (registering the
    /// regions again) and runs it once more.
    pub async fn call<T, F, Fut>(&self, region: Option<&str>, mut f: F) -> Result<T, ShimError>
    where
        F: FnMut(Snapshot, AgentClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let snap = self.snapshot(region)?;
        let generation = snap.generation;
        match f(snap, self.agent()).await {
            Ok(r) => Ok(r.into_inner()),
            Err(status) if session_gone(&status) => {
                self.reestablish(generation).await?;
                Ok(f(self.snapshot(region)?, self.agent()).await?.into_inner())
            }
            Err(status) => Err(status.into()),
        }
    }

    /// Registers a region with the agent for connection `conn` and returns
    /// the shim's id for it.
    pub async fn register(
        &self,
        conn: &ConnectionTag,
        slot: RegionSlot<'_>,
        len: u64,
        source: RegionSource,
        guard: ExportGuard,
    ) -> Result<String, ShimError> {
        let _slot = slot;
        let source = Arc::new(source);
        // Twice at most: once more if the agent session changed meanwhile.
        for _ in 0..2 {
            let snap = self.snapshot(None)?;
            let export = self.ctx.memory.export_again(&self.ctx.agent, &source).await?;
            let session_id = snap.session_id.clone();
            let req = apb::RegisterRegionRequest { session_id: snap.session_id, length: len, export: Some(export) };
            match self.agent().register_region(req).await {
                Ok(reply) => {
                    let region_id = reply.into_inner().region_id;
                    // Not while a session re-open runs: it lists the regions
                    // to register again before this one is in the table, and
                    // bumps the generation only once done, so this region
                    // would keep the old session's id, neither registered
                    // again nor marked lost. After it, the generation says.
                    let _settled = self.reopen.lock().await;
                    let kept = {
                        let mut inner = self.inner();
                        if inner.generation != snap.generation || inner.closed {
                            None // registered in a session that has just been replaced
                        } else if conn.gone.load(Ordering::Relaxed) {
                            Some(None)
                        } else {
                            let id = random_id();
                            let agent_id = AgentRegion::Id(region_id.clone());
                            let region =
                                Region { len, conn: conn.id, agent_id, source: source.clone(), _guard: guard.clone() };
                            inner.regions.insert(id.clone(), region);
                            Some(Some(id))
                        }
                    };
                    match kept {
                        Some(Some(id)) => return Ok(id),
                        Some(None) => {
                            // A joined connection that ended while this was
                            // on its way: nobody would ever release it. In a
                            // task of its own, so the request's deadline
                            // cannot cut it short.
                            let req = apb::ReleaseRegionRequest { session_id, region_id };
                            let mut agent = self.agent();
                            tokio::spawn(async move {
                                let _ = tokio::time::timeout(RELEASE_WAIT, agent.release_region(req)).await;
                            });
                            return Err(ShimError::Refused("the connection ended while registering".into()));
                        }
                        None => {}
                    }
                }
                Err(status) if session_gone(&status) => self.reestablish(snap.generation).await?,
                Err(status) => return Err(status.into()),
            }
        }
        Err(ShimError::AgentUnavailable("the agent session changed twice while registering; try again".into()))
    }

    /// Releases a region in the agent, then here; first waits (until `by`)
    /// for a request the shim gave up on to end there, so nothing is still
    /// written into the region once the client is told it is released.
    pub async fn release(&self, region_id: &str, by: std::time::Instant) -> Result<(), ShimError> {
        self.doubts.settled(region_id, by).await?;
        let lost = matches!(
            self.inner().regions.get(region_id).map(|r| matches!(r.agent_id, AgentRegion::Lost(_))),
            Some(true)
        );
        if !lost {
            let released = self
                .call(Some(region_id), |snap, mut agent| async move {
                    agent
                        .release_region(apb::ReleaseRegionRequest {
                            session_id: snap.session_id,
                            region_id: snap.region_id,
                        })
                        .await
                })
                .await;
            match released {
                Ok(_) => {}
                // Gone at the agent already: an earlier Release of it that
                // this shim stopped waiting for (its deadline) went through
                // there. Kept here, the region would hold its descriptor
                // and place until the connection closed, every Release of
                // it refused.
                Err(ShimError::Agent(d)) if d.code == ErrorCode::UnknownRegion as i32 => {
                    debug!(region = %region_id, "released: the agent no longer had it");
                }
                Err(e) => return Err(e),
            }
        }
        self.inner().regions.remove(region_id).map(|_| ()).ok_or_else(|| ShimError::UnknownRegion(region_id.into()))
    }

    /// Replaces the agent session after the agent lost it, unless that was
    /// done already since `seen` was current; registers every region again.
    pub async fn reestablish(&self, seen: u64) -> Result<(), ShimError> {
        let _one = self.reopen.lock().await;
        let todo: Vec<(String, u64, Arc<RegionSource>)> = {
            let inner = self.inner();
            if inner.closed {
                return Err(ShimError::AgentUnavailable("the connection is closing".into()));
            }
            if inner.generation != seen {
                return Ok(());
            }
            inner.regions.iter().map(|(id, r)| (id.clone(), r.len, r.source.clone())).collect()
        };
        // Each step within a deadline: an agent that accepts calls and never
        // answers must not hold this (and every register waiting on it).
        let opened =
            tokio::time::timeout(REOPEN_STEP, open_agent_session(&*self.ctx, &self.tenant)).await.map_err(|_| {
                ShimError::AgentUnavailable(format!("the agent did not open a session in {REOPEN_STEP:?}"))
            })??;
        let session_id = opened.id;
        let mut again = Vec::with_capacity(todo.len());
        let mut lost = 0usize;
        for (id, len, source) in todo {
            let res = async {
                let export = self.ctx.memory.export_again(&self.ctx.agent, &source).await?;
                let req =
                    apb::RegisterRegionRequest { session_id: session_id.clone(), length: len, export: Some(export) };
                let registered =
                    tokio::time::timeout(REOPEN_STEP, self.agent().register_region(req)).await.map_err(|_| {
                        ShimError::AgentUnavailable(format!("the agent did not register a region in {REOPEN_STEP:?}"))
                    })?;
                Ok::<_, ShimError>(registered?.into_inner().region_id)
            }
            .await;
            if let Err(e) = &res {
                lost += 1;
                warn!(tenant = %self.tenant, region = %id, error = %e, "could not register a region again");
            }
            again.push((id, res.map_or_else(|e| AgentRegion::Lost(e.to_string()), AgentRegion::Id)));
        }
        let mut inner = self.inner();
        inner.agent_session = session_id;
        inner.capabilities = opened.capabilities;
        inner.item_contexts = opened.item_contexts;
        inner.get_stream = opened.get_stream;
        inner.generation += 1;
        let n = again.len();
        for (id, agent_id) in again {
            if let Some(r) = inner.regions.get_mut(&id) {
                r.agent_id = agent_id;
            }
        }
        info!(tenant = %self.tenant, regions = n, lost, "re-opened the agent session (the agent restarted or expired it)");
        Ok(())
    }

    /// Ends the session when its client disconnects: the agent releases the
    /// regions (waiting for transfers still using them), then the shim drops
    /// what backed them.
    pub async fn close(&self) {
        // Requests the shim gave up on end first (closing the agent session
        // releases their regions, which the client may then reuse).
        if !self.doubts.all_settled(std::time::Instant::now() + RELEASE_WAIT).await {
            warn!(tenant = %self.tenant, "requests the agent never ended still hold regions; closing anyway");
        }
        let session_id = {
            let mut inner = self.inner();
            inner.closed = true;
            inner.agent_session.clone()
        };
        self.ended.send_replace(true);
        self.ctx.registry.forget(&self.join_token);
        let req = apb::CloseSessionRequest { session_id };
        let mut agent = self.agent();
        let closed = match tokio::time::timeout(RELEASE_WAIT, agent.close_session(req)).await {
            Ok(Ok(_)) => true,
            // A session the agent already forgot (restart, expiry) is closed.
            Ok(Err(status)) if session_gone(&status) => true,
            Ok(Err(e)) => {
                warn!(tenant = %self.tenant, error = %e, "closing the agent session failed; its lease will");
                false
            }
            Err(_) => {
                warn!(tenant = %self.tenant, "closing the agent session timed out; its lease will");
                false
            }
        };
        let regions = std::mem::take(&mut self.inner().regions);
        info!(tenant = %self.tenant, released_regions = regions.len(), "client disconnected");
        if !closed && !regions.is_empty() {
            // The agent has not said it stopped using them: their exports
            // (a DOCA mapping the DPU may still DMA into) are kept until
            // its lease has surely released them, not torn down now.
            tokio::spawn(async move {
                tokio::time::sleep(UNCONFIRMED_HOLD).await;
                drop(regions);
            });
        }
    }

    /// A joined connection ended: releases the regions it registered,
    /// together, for at most `RELEASE_WAIT` (the session stays with the
    /// connection that opened it). One it registers from now on is not
    /// kept. A region the agent did not release in time stays until the
    /// session closes (the agent may still be writing into it).
    pub async fn leave(&self, conn: &ConnectionTag) {
        let (ids, closed) = {
            let inner = self.inner();
            conn.gone.store(true, Ordering::Relaxed);
            let ids: Vec<String> =
                inner.regions.iter().filter(|(_, r)| r.conn == conn.id).map(|(id, _)| id.clone()).collect();
            (ids, inner.closed)
        };
        if closed || ids.is_empty() {
            return; // a closed session released everything
        }
        let by = std::time::Instant::now() + RELEASE_WAIT;
        let releases = futures::future::join_all(ids.iter().map(|id| self.release(id, by)));
        match tokio::time::timeout(RELEASE_WAIT, releases).await {
            Ok(results) => {
                for (id, r) in ids.iter().zip(results) {
                    if let Err(e) = r {
                        debug!(tenant = %self.tenant, region = %id, error = %e, "releasing a joined connection's region");
                    }
                }
            }
            Err(_) => {
                warn!(tenant = %self.tenant, "releasing a joined connection's regions timed out; they go with the session")
            }
        }
    }
}

/// Every live session of this shim, renewed with the agent in one call.
impl crate::agent_session::OpenWith for SessionContext {
    fn grpc(&self) -> AgentClient<Channel> {
        self.agent.grpc()
    }
    fn shim_id(&self) -> &str {
        &self.shim_id
    }
    fn secret(&self, tenant: &str) -> Option<&[u8]> {
        self.secrets.get(tenant).map(Vec::as_slice)
    }
    fn memory(&self) -> &MemoryBackend {
        &self.memory
    }
    fn config(&self) -> &ShimConfig {
        &self.config
    }
    fn learned_lease(&self, ms: u64) {
        if ms > 0 {
            self.registry.lease_ms.store(ms, Ordering::Relaxed);
        }
    }
}

struct Registry {
    sessions: Mutex<Vec<Weak<Session>>>,
    /// Open sessions by join token (a join is one lookup, whatever the
    /// number of sessions).
    by_token: Mutex<HashMap<String, Weak<Session>>>,
    /// The agent's session lease, learned at each session open.
    lease_ms: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Self { sessions: Mutex::default(), by_token: Mutex::default(), lease_ms: AtomicU64::new(15_000) }
    }
}

impl Registry {
    fn add(&self, s: &Arc<Session>) {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::downgrade(s));
        self.by_token.lock().unwrap_or_else(|p| p.into_inner()).insert(s.join_token.clone(), Arc::downgrade(s));
    }

    fn forget(&self, token: &str) {
        self.by_token.lock().unwrap_or_else(|p| p.into_inner()).remove(token);
    }

    fn by_token(&self, token: &str) -> Option<Arc<Session>> {
        self.by_token.lock().unwrap_or_else(|p| p.into_inner()).get(token).and_then(Weak::upgrade)
    }

    /// Live sessions with their current agent ids and generations.
    fn live(&self) -> Vec<(Arc<Session>, String, u64)> {
        let mut list = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter()
            .filter_map(Weak::upgrade)
            .filter_map(|s| {
                let (id, generation, closed) = {
                    let inner = s.inner();
                    (inner.agent_session.clone(), inner.generation, inner.closed)
                };
                (!closed).then_some((s, id, generation))
            })
            .collect()
    }
}

impl SessionContext {
    /// Renews every live session each third of the lease; sessions the
    /// agent no longer knows are re-opened right away, so their regions are
    /// back before the client's next call.
    pub async fn renew_loop(self: Arc<Self>) {
        loop {
            let lease = Duration::from_millis(self.registry.lease_ms.load(Ordering::Relaxed));
            let every = (lease / 3).clamp(Duration::from_millis(30), Duration::from_secs(10));
            tokio::time::sleep(every).await;
            let live = self.registry.live();
            if live.is_empty() {
                continue;
            }
            let session_ids = live.iter().map(|(_, id, _)| id.clone()).collect();
            let mut agent = self.grpc();
            let unknown = match tokio::time::timeout(every, agent.renew(apb::RenewRequest { session_ids })).await {
                Ok(Ok(reply)) => reply.into_inner().unknown_session_ids,
                Ok(Err(e)) => {
                    debug!(error = %e, "renewing sessions failed (agent unreachable?)");
                    continue;
                }
                Err(_) => {
                    debug!("renewing sessions timed out");
                    continue;
                }
            };
            for (s, id, generation) in live {
                // One re-open per session at a time: with a hung agent, a
                // task per tick would pile up behind the first.
                if unknown.contains(&id) && s.reopen.try_lock().is_ok() {
                    tokio::spawn(async move {
                        if let Err(e) = s.reestablish(generation).await {
                            warn!(tenant = %s.tenant, error = %e, "re-opening an agent session failed; retrying later");
                        }
                    });
                }
            }
        }
    }
}
