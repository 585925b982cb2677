//! Errors of the verbs wrapper.

/// A verbs or rdma_cm failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// The kernel has no RDMA support (ENOSYS) or no device is present.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    #[error("{op} failed: {source}")]
    Os { op: &'static str, source: std::io::Error },
    /// A work request completed with an error status (bad rkey, remote
    /// access outside the region, flushed by teardown, ...).
    #[error("work request failed: {status} (vendor error {vendor_err:#x})")]
    Completion { status: String, vendor_err: u32 },
    #[error("{0}")]
    Invalid(String),
    /// The device lacks a feature (e.g. mlx5 DC on Soft-RoCE).
    #[error("{0}")]
    Unsupported(String),
    #[error("the queue pair is closed")]
    Closed,
}

impl RdmaError {
    pub(crate) fn last_os(op: &'static str) -> Self {
        Self::Os { op, source: std::io::Error::last_os_error() }
    }

    /// Maps a negative return with errno, or a positive errno value.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        if ret > 0 {
            Self::Os { op, source: std::io::Error::from_raw_os_error(ret) }
        } else {
            Self::last_os(op)
        }
    }
}

pub type Result<T> = std::result::Result<T, RdmaError>;
