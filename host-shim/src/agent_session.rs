//! Opening a session at the agent: the epoch it names, the tenant's proof,
//! and what the agent answers (its namespaces and what the session can do).

use std::sync::Arc;

use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_proto::auth;
use sluice_proto::common::{Capabilities, ErrorCode};
use tonic::transport::Channel;

use crate::config::ShimConfig;
use crate::error::{agent_code, ShimError};
use crate::memory::MemoryBackend;

/// What opening a session needs of the shim (`session::SessionContext`).
pub(crate) trait OpenWith: Sync {
    fn grpc(&self) -> AgentClient<Channel>;
    fn shim_id(&self) -> &str;
    /// The secret tenant `tenant` proves to the agent.
    fn secret(&self, tenant: &str) -> Option<&[u8]>;
    fn memory(&self) -> &MemoryBackend;
    fn config(&self) -> &ShimConfig;
    /// The agent's session lease, as it answered.
    fn learned_lease(&self, ms: u64);
}

/// Whether an agent error means "that session is gone" (a restart, or an
/// expired lease): re-opening it is the cure.
pub(crate) fn session_gone(status: &tonic::Status) -> bool {
    agent_code(status) == Some(ErrorCode::Unauthenticated)
}

/// An agent session as the agent opened it.
pub(crate) struct AgentSession {
    pub(crate) id: String,
    pub(crate) namespaces: Vec<String>,
    pub(crate) capabilities: Arc<Capabilities>,
    pub(crate) item_contexts: bool,
    pub(crate) get_stream: bool,
}

/// The agent's current epoch, which the session proof must name. Asked
/// before every open: after an agent restart the epoch is new, and a proof
/// for the old one is refused.
async fn agent_epoch(ctx: &impl OpenWith) -> Result<Vec<u8>, ShimError> {
    match ctx.grpc().get_epoch(apb::GetEpochRequest {}).await {
        Ok(reply) => Ok(reply.into_inner().epoch),
        Err(status) if status.code() == tonic::Code::Unimplemented => Err(ShimError::AgentUnavailable(
            "the agent does not answer GetEpoch: it is older than this shim; upgrade sluice-agent".into(),
        )),
        Err(status) => Err(status.into()),
    }
}

/// Opens an agent session for `tenant`, proving the tenant's secret and
/// saying which region memory this shim registers.
pub(crate) async fn open_agent_session(ctx: &impl OpenWith, tenant: &str) -> Result<AgentSession, ShimError> {
    match try_open_agent_session(ctx, tenant).await {
        // The agent restarted between GetEpoch and OpenSession (the old
        // one answered the first): one more try, with the new epoch.
        Err(OpenError::Agent(status)) if epoch_refused(&status) => {
            tracing::info!(tenant, "the agent restarted while a session was opening; asking its new epoch");
            try_open_agent_session(ctx, tenant).await.map_err(ShimError::from)
        }
        other => other.map_err(ShimError::from),
    }
}

/// A refusal because the proof named another agent epoch (see the agent's
/// identity.rs: the message is stable, the code is UNAUTHENTICATED).
fn epoch_refused(status: &tonic::Status) -> bool {
    session_gone(status) && status.message().contains("another agent epoch")
}

/// Why one attempt to open failed: the agent's answer kept whole, so the
/// caller can tell an epoch refusal from the rest.
enum OpenError {
    Agent(tonic::Status),
    Shim(ShimError),
}

impl From<OpenError> for ShimError {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Agent(s) => s.into(),
            OpenError::Shim(e) => e,
        }
    }
}

async fn try_open_agent_session(ctx: &impl OpenWith, tenant: &str) -> Result<AgentSession, OpenError> {
    let secret =
        ctx.secret(tenant).ok_or_else(|| OpenError::Shim(ShimError::BadRequest(format!("no secret for {tenant}"))))?;
    let epoch = agent_epoch(ctx).await.map_err(OpenError::Shim)?;
    let (shim_id, timestamp_ms, nonce) = (ctx.shim_id().to_owned(), auth::now_ms(), auth::new_nonce());
    let claim = auth::SessionClaim { tenant, shim_id: &shim_id, epoch: &epoch, timestamp_ms, nonce: &nonce };
    let proof = auth::session_proof(secret, &claim);
    let shim_memory = ctx.memory().kinds().into_iter().map(|k| k as i32).collect();
    let req = apb::OpenSessionRequest {
        tenant: tenant.to_owned(),
        shim_id,
        timestamp_ms,
        nonce: nonce.to_vec(),
        proof,
        shim_memory,
        epoch,
    };
    let reply = ctx.grpc().open_session(req).await.map_err(OpenError::Agent)?.into_inner();
    ctx.learned_lease(u64::from(reply.lease_ms));
    let agent = crate::capabilities::from_agent(reply.capabilities, ctx.memory(), tenant);
    let capabilities = Arc::new(crate::capabilities::for_clients(agent, ctx.memory(), ctx.config()));
    Ok(AgentSession {
        id: reply.session_id,
        namespaces: reply.namespaces,
        capabilities,
        item_contexts: reply.item_contexts,
        get_stream: reply.get_stream,
    })
}
