//! Typed refusals. Every refusal names the tenant and the limit so that both the
//! caller (who may retry) and the operator (who reads metrics and logs) can tell
//! which quota tripped.

use std::time::Duration;

/// Why the QoS layer refused (or could not configure) a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    /// `admit` and `reserve_memory` only serve configured tenants: an unknown
    /// tenant getting default limits would let anyone bypass quotas by
    /// inventing names.
    #[error("tenant {tenant:?} is not configured for QoS")]
    UnknownTenant { tenant: String },

    /// A token-bucket rate limit is exhausted. Refused immediately rather than
    /// queued so that callers see back-pressure and can retry after `retry_after`.
    #[error("tenant {tenant:?} exceeded {kind} limit of {limit}/s; retry after {retry_after:?}")]
    RateLimited { tenant: String, kind: &'static str, limit: u64, retry_after: Duration },

    /// A single request larger than the whole in-flight budget could never be
    /// admitted, so waiting for it would only burn the timeout.
    #[error("tenant {tenant:?} request of {requested} bytes exceeds max_inflight_bytes of {limit}")]
    TooLarge { tenant: String, requested: u64, limit: u64 },

    /// Waited the configured queue timeout for `resource` without being served.
    #[error("tenant {tenant:?} timed out after {waited:?} waiting for {resource}")]
    Busy { tenant: String, resource: &'static str, waited: Duration },

    /// Registering more memory would exceed the tenant's pinned-memory budget.
    #[error(
        "tenant {tenant:?} registered-memory quota exceeded: requested {requested} bytes with {in_use} in use, \
         limit {limit}"
    )]
    MemoryQuota { tenant: String, limit: u64, requested: u64, in_use: u64 },

    /// A configuration (initial or hot-reloaded) was rejected; nothing was applied.
    #[error("invalid QoS limits for tenant {tenant:?}: {reason}")]
    InvalidLimits { tenant: String, reason: &'static str },
}

impl QosError {
    /// Stable, low-cardinality label for metrics (`refusals_total{kind=...}`).
    pub fn kind(&self) -> &'static str {
        match self {
            QosError::UnknownTenant { .. } => "unknown_tenant",
            QosError::RateLimited { kind, .. } => kind,
            QosError::TooLarge { .. } => "max_inflight_bytes",
            QosError::Busy { resource, .. } => match *resource {
                crate::RESOURCE_INFLIGHT => "busy_inflight",
                _ => "busy_slots",
            },
            QosError::MemoryQuota { .. } => "max_registered_bytes",
            QosError::InvalidLimits { .. } => "invalid_limits",
        }
    }

    /// The tenant the error is about.
    pub fn tenant(&self) -> &str {
        match self {
            QosError::UnknownTenant { tenant }
            | QosError::RateLimited { tenant, .. }
            | QosError::TooLarge { tenant, .. }
            | QosError::Busy { tenant, .. }
            | QosError::MemoryQuota { tenant, .. }
            | QosError::InvalidLimits { tenant, .. } => tenant,
        }
    }
}
