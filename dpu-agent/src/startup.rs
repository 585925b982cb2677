//! Why the agent could not be built from its configuration (it then does
//! not start). Each part that starts returns its own error; this wraps
//! them, so it sits above all of them. Operations fail with
//! [`crate::error::AgentError`] instead.

/// Why the agent did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartupError {
    #[error("[tls]: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Store(#[from] crate::s3::setup::StoreSetupError),
    #[error(transparent)]
    ShimSecret(#[from] crate::identity::ShimSecretError),
    #[error(transparent)]
    Transport(#[from] crate::transports::ChooseError),
    #[error("quotas: {0}")]
    Quotas(#[from] sluice_qos::QosError),
}
