//! The client's errors.

use sluice_proto::common::ErrorCode;

/// Errors from the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The shim (or the agent behind it) refused or failed the request.
    #[error("{message} [{code:?}, request {request_id}]")]
    Shim {
        code: ErrorCode,
        message: String,
        request_id: String,
        /// `REGION_TOO_SMALL`: the bytes the data needs (0: unknown).
        needed_bytes: u64,
    },
    #[error("connecting to the shim at {path}: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("shim connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the shim closed the connection")]
    Disconnected,
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("shared memory: {0}")]
    Memory(#[from] sluice_shm::ShmError),
    /// No answer within the client's timeout (the shim and agent were told
    /// the same deadline and stop the request too).
    #[error("no answer from the shim within {0:?}")]
    Timeout(std::time::Duration),
    /// A transfer to or from GPU memory refused or failed in this process
    /// (e.g. `RegionTooSmall` before any byte reached the GPU).
    #[error("{message} [{code:?}{}]", if request_id.is_empty() { String::new() } else { format!(", request {request_id}") })]
    Gpu { code: ErrorCode, message: String, request_id: String },
    /// CUDA refused: no driver or device here (`UNSUPPORTED`), or memory
    /// that is not this process's GPU memory (`BAD_REQUEST`).
    #[error(transparent)]
    Cuda(#[from] sluice_cuda::CudaError),
}

impl ClientError {
    /// The typed code, for errors the shim reported.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Shim { code, .. } | Self::Gpu { code, .. } => Some(*code),
            Self::Cuda(e) if e.is_bad_request() => Some(ErrorCode::BadRequest),
            Self::Cuda(_) => Some(ErrorCode::Unsupported),
            _ => None,
        }
    }

    /// `REGION_TOO_SMALL`: how many bytes the data needs, as the shim said
    /// (0 when it could not say, and for every other error).
    pub fn needed_bytes(&self) -> u64 {
        match self {
            Self::Shim { needed_bytes, .. } => *needed_bytes,
            _ => 0,
        }
    }
}
