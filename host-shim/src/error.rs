//! Shim errors; each becomes a typed `ErrorDetail` on the wire.

use sluice_proto::common::{ErrorCode, ErrorDetail};

/// Why the shim could not start (it then exits). Requests fail with
/// [`ShimError`] instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    #[error("socket {}: {source}", path.display())]
    Socket { path: std::path::PathBuf, source: std::io::Error },
    #[error("[agent] grpc = {address:?}: {source}")]
    AgentAddress { address: String, source: tonic::transport::Error },
    #[error("[agent.tls]: {0}")]
    Tls(String),
    #[error("[agent] grpc = {0:?}: no host to connect to")]
    AgentHost(String),
    #[error("binding {what} at {at}: {source}")]
    Bind { what: &'static str, at: String, source: std::io::Error },
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("tenant {tenant:?}: shim secret: {source}")]
    TenantSecret { tenant: String, source: sluice_proto::auth::SecretFileError },
    #[error("memory_backend = \"doca\" needs a [doca] table")]
    DocaConfig,
    #[error("memory backend: {0}")]
    Memory(Box<ShimError>),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShimError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("caller uid {uid} gid {gid} is not mapped to any tenant in the shim config")]
    UnknownCaller { uid: u32, gid: u32 },
    #[error("unsupported protocol version {got}; this shim speaks {want}")]
    Version { got: u32, want: u32 },
    #[error("region {0:?} does not belong to this connection (never registered, or released)")]
    UnknownRegion(String),
    #[error("limit reached: {0}")]
    Limit(String),
    #[error("shared memory: {0}")]
    Memory(#[from] sluice_shm::ShmError),
    #[error("agent unreachable: {0}")]
    AgentUnavailable(String),
    /// The region was registered, but could not be registered again with
    /// the agent after it restarted.
    #[error("region {0:?} was lost when the agent restarted ({1}); release it and register it again")]
    RegionLost(String, String),
    /// The request's deadline passed before the agent answered.
    #[error(
        "no answer from the agent within the request's deadline of {} ms; until the agent ends the request, \
         new requests into its region wait",
        .0.as_millis()
    )]
    DeadlineExceeded(std::time::Duration),
    /// A region an earlier request may still be writing into (the shim gave
    /// up on it; `in_doubt.rs`) stayed so until this request's deadline.
    #[error(
        "region {0:?} may still be written by an earlier request the shim stopped waiting for (the agent has \
         not ended it); nothing was started; try again later"
    )]
    InDoubt(String),
    /// The connection did something the shim never allows (no Hello in
    /// time, too many connections); it is closed after this is sent.
    #[error("{0}")]
    Refused(String),
    /// Not possible with this shim's memory backend, build or hardware.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The memory backend (DOCA) failed on a valid request.
    #[error("memory backend: {0}")]
    Backend(String),
    /// An error the agent reported, passed through unchanged.
    #[error("{}", .0.message)]
    Agent(ErrorDetail),
}

impl ShimError {
    /// The typed code clients get.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Agent(d) => ErrorCode::try_from(d.code).unwrap_or(ErrorCode::Internal),
            other => other.own_code(),
        }
    }

    pub fn detail(&self) -> ErrorDetail {
        match self {
            Self::Agent(d) => d.clone(),
            other => ErrorDetail::new(other.own_code(), self.to_string()),
        }
    }

    fn own_code(&self) -> ErrorCode {
        match self {
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::Protocol(_) => ErrorCode::Protocol,
            Self::UnknownCaller { .. } => ErrorCode::UnknownTenant,
            Self::Version { .. } => ErrorCode::UnsupportedVersion,
            Self::UnknownRegion(_) => ErrorCode::UnknownRegion,
            Self::Limit(_) => ErrorCode::ResourceExhausted,
            Self::Memory(sluice_shm::ShmError::FileTooSmall { .. }) => ErrorCode::RegionTooSmall,
            Self::Memory(_) => ErrorCode::BadRequest,
            Self::AgentUnavailable(_) => ErrorCode::AgentUnavailable,
            Self::RegionLost(..) => ErrorCode::UnknownRegion,
            Self::DeadlineExceeded(_) | Self::InDoubt(_) => ErrorCode::DeadlineExceeded,
            Self::Refused(_) => ErrorCode::ResourceExhausted,
            Self::Unsupported(_) => ErrorCode::Unsupported,
            Self::Backend(_) => ErrorCode::Internal,
            Self::Agent(_) => ErrorCode::Internal,
        }
    }
}

/// The typed code in an agent's error status, if it carries one.
pub fn agent_code(status: &tonic::Status) -> Option<ErrorCode> {
    sluice_proto::status::detail_of(status).and_then(|d| ErrorCode::try_from(d.code).ok())
}

impl From<tonic::Status> for ShimError {
    fn from(s: tonic::Status) -> Self {
        if let Some(d) = sluice_proto::status::detail_of(&s) {
            return Self::Agent(d);
        }
        // No error detail: the agent's code never answered. The link
        // failed (connection refused or broken, TLS refused, a plaintext
        // shim on a TLS listener, the deadline): say why, with the causes
        // tonic keeps in the source chain ("operation was canceled" alone
        // says nothing).
        let mut why = s.message().to_owned();
        let mut src = std::error::Error::source(&s);
        while let Some(e) = src {
            let m = e.to_string();
            if !why.contains(&m) {
                why.push_str(": ");
                why.push_str(&m);
            }
            src = e.source();
        }
        if s.code() != tonic::Code::DeadlineExceeded {
            why.push_str(crate::link_kind::hint());
        }
        match s.code() {
            tonic::Code::DeadlineExceeded => Self::AgentUnavailable(format!("deadline: {why}")),
            _ => Self::AgentUnavailable(why),
        }
    }
}
