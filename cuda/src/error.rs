//! Why a CUDA operation could not be done.

/// Errors of the CUDA layer. Callers branch on the variant: a missing
/// driver or device means "GPU memory is not available here"
/// ([`CudaError::is_unavailable`]); an address or window the caller got
/// wrong is their request's fault ([`CudaError::is_bad_request`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// `libcuda.so.1` (or `$SLUICE_LIBCUDA`) could not be opened, or `cuInit` failed.
    #[error("no CUDA driver: {path} could not be loaded ({reason}); GPU memory is unavailable on this machine")]
    NoDriver { path: String, reason: String },
    /// The driver lacks a call Sluice needs (too old for it).
    #[error("the CUDA driver at {path} has no {symbol} (driver too old?)")]
    MissingSymbol { path: String, symbol: &'static str },
    /// No such device ordinal.
    #[error("no CUDA device {device} (this machine has {count})")]
    NoDevice { device: u32, count: u32 },
    /// A driver call returned an error.
    #[error("{call} failed: {name} ({code})")]
    Call { call: &'static str, code: i32, name: String },
    /// The address is not GPU memory this process can use.
    #[error(
        "address {ptr:#x} is not GPU memory of this process ({reason}): another process's, freed, or never allocated"
    )]
    NotDeviceMemory { ptr: u64, reason: String },
    /// A window, length, device or memory kind the caller got wrong.
    #[error("{0}")]
    Invalid(String),
    /// Something this driver cannot do (e.g. the host model has no dma-buf).
    #[error("{0}")]
    Unsupported(String),
}

impl CudaError {
    /// The caller named memory it cannot use here (maps to BAD_REQUEST).
    pub fn is_bad_request(&self) -> bool {
        matches!(self, Self::NotDeviceMemory { .. } | Self::Invalid(_))
    }

    /// There is no usable CUDA here at all (no driver, too old a driver,
    /// or the driver found no GPU).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::NoDriver { .. } | Self::MissingSymbol { .. })
            || matches!(self, Self::Call { code, .. } if *code == crate::driver::CUDA_ERROR_NO_DEVICE)
    }

    /// The CUDA error code of a failed call.
    pub fn code(&self) -> Option<i32> {
        match self {
            Self::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}
