//! The agent's operation error and its one conversion to a gRPC status.
//! Why the agent did not start is `startup::StartupError`.

use sluice_proto::common::{ErrorCode, ErrorDetail};

use crate::hostmem::MemError;
use crate::s3::error::S3Error;

/// Everything an agent operation can fail with. Each variant maps to one
/// [`ErrorCode`] so the shim and clients get a typed error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    #[error("session not found or closed; open a session first")]
    UnknownSession,
    #[error("namespace {0:?} is not configured for this tenant")]
    UnknownNamespace(String),
    #[error("region {0:?} is not registered in this session (never issued, or released)")]
    UnknownRegion(String),
    #[error("the data needs {needed} bytes at offset {offset}, but the region holds {region_len}")]
    RegionTooSmall { needed: u64, offset: u64, region_len: u64 },
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    #[error("access denied: {0}")]
    AccessDenied(String),
    #[error("limit reached: {0}")]
    ResourceExhausted(String),
    /// Outside what the session's capabilities offer (refused before any
    /// byte moves).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tenant quota (requests/s, in-flight bytes, registered memory, or
    /// waiting too long for the fair scheduler) refused the request. Rate
    /// refusals carry `retry_after` in the message.
    #[error("quota exceeded: {0}")]
    Quota(#[from] sluice_qos::QosError),
    /// The request's end-to-end deadline passed; it was cancelled.
    #[error("the request did not finish within its deadline of {} ms", .0.as_millis())]
    DeadlineExceeded(std::time::Duration),
    #[error(transparent)]
    Memory(#[from] MemError),
    #[error(transparent)]
    S3(#[from] S3Error),
}

/// A peer's string as an error echoes it: at most 128 bytes of it (with
/// its length), so that an answer or a log line is never much longer than
/// its own text, however long the name the peer sent.
pub fn echoed(s: &str) -> String {
    const MAX: usize = 128;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

impl AgentError {
    /// The typed code clients see.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownTenant(_) => ErrorCode::UnknownTenant,
            Self::UnknownSession => ErrorCode::Unauthenticated,
            Self::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
            Self::UnknownRegion(_) => ErrorCode::UnknownRegion,
            Self::RegionTooSmall { .. } => ErrorCode::RegionTooSmall,
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Self::AccessDenied(_) => ErrorCode::AccessDenied,
            Self::ResourceExhausted(_) => ErrorCode::ResourceExhausted,
            Self::Unsupported(_) => ErrorCode::Unsupported,
            Self::Quota(sluice_qos::QosError::UnknownTenant { .. }) => ErrorCode::UnknownTenant,
            Self::Quota(sluice_qos::QosError::InvalidLimits { .. }) => ErrorCode::Internal,
            Self::Quota(_) => ErrorCode::QuotaExceeded,
            Self::DeadlineExceeded(_) => ErrorCode::DeadlineExceeded,
            Self::Memory(e) => crate::hostmem::mem_code(e),
            Self::S3(e) => e.code(),
        }
    }

    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        self.code().as_str_name()
    }

    /// The typed detail clients see (in a status, or a batch item's result).
    pub fn detail(&self) -> ErrorDetail {
        let needed_bytes = match self {
            Self::RegionTooSmall { needed, .. } | Self::S3(S3Error::DoesNotFit { needed, .. }) => *needed,
            _ => 0,
        };
        ErrorDetail { needed_bytes, ..ErrorDetail::new(self.code(), self.to_string()) }
    }
}

impl From<AgentError> for tonic::Status {
    fn from(e: AgentError) -> Self {
        sluice_proto::status::to_status(&e.detail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_string_is_echoed_at_most_128_bytes_long() {
        assert_eq!(echoed("data"), "data");
        let long = "\u{1}".repeat(4 << 20);
        let e = AgentError::UnknownNamespace(echoed(&long));
        assert!(e.to_string().len() < 1024, "{} bytes", e.to_string().len());
        assert!(e.to_string().contains("(4194304 bytes)"), "{e}");
        // Cut on a character boundary.
        assert!(echoed(&"é".repeat(100)).starts_with(&"é".repeat(64)));
    }
}
