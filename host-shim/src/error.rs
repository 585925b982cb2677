//! Shim errors; each becomes a typed `ErrorDetail` on the wire.

use sluice_proto::common::{ErrorCode, ErrorDetail};

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
    pub fn detail(&self) -> ErrorDetail {
        let code = match self {
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::Protocol(_) => ErrorCode::Protocol,
            Self::UnknownCaller { .. } => ErrorCode::UnknownTenant,
            Self::Version { .. } => ErrorCode::UnsupportedVersion,
            Self::UnknownRegion(_) => ErrorCode::UnknownRegion,
            Self::Limit(_) => ErrorCode::ResourceExhausted,
            Self::Memory(sluice_shm::ShmError::FileTooSmall { .. }) => ErrorCode::RegionTooSmall,
            Self::Memory(_) => ErrorCode::BadRequest,
            Self::AgentUnavailable(_) => ErrorCode::StoreUnavailable,
            Self::Unsupported(_) => ErrorCode::Unsupported,
            Self::Backend(_) => ErrorCode::Internal,
            Self::Agent(d) => return d.clone(),
        };
        ErrorDetail::new(code, self.to_string())
    }
}

impl From<tonic::Status> for ShimError {
    fn from(s: tonic::Status) -> Self {
        use sluice_proto::Message;
        if let Ok(d) = ErrorDetail::decode(s.details()) {
            if d.code != 0 {
                return Self::Agent(d);
            }
        }
        match s.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown => Self::AgentUnavailable(s.message().to_owned()),
            _ => Self::Agent(ErrorDetail::new(ErrorCode::Internal, format!("agent: {}", s.message()))),
        }
    }
}
