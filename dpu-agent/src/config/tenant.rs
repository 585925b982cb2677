//! `[[tenants]]`: who may open sessions (the shim secret, shim ids,
//! origins, client certificate names), the tenant's QoS limits and its
//! namespaces.

use std::collections::HashSet;
use std::path::PathBuf;

use serde::Deserialize;

use super::s3::{NamespaceConfig, NamespaceConfigError, NamespaceRefs};

/// An invalid tenant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantConfigError {
    #[error("tenant names must be unique and non-empty ({name:?})")]
    Name { name: String },
    #[error(
        "tenant {tenant:?}: limits: bytes_per_sec and requests_per_sec must be > 0 (omit for unlimited), weight >= 1"
    )]
    Limits { tenant: String },
    #[error("tenant {tenant:?}: shim origin {origin:?} is not \"unix\" or an IP address")]
    ShimOrigin { tenant: String, origin: String },
    #[error("tenant {tenant:?}: namespace names must be unique, non-empty, without '/' ({namespace:?})")]
    NamespaceName { tenant: String, namespace: String },
    #[error("tenant {tenant:?} has encrypted namespaces, and its name is bound into their objects: {why}")]
    EncryptedName { tenant: String, why: String },
    #[error(transparent)]
    Namespace(#[from] NamespaceConfigError),
}

/// Checks every tenant, and that their names are unique.
pub fn validate_tenants(tenants: &[TenantConfig], refs: &NamespaceRefs<'_>) -> Result<(), TenantConfigError> {
    let mut seen = HashSet::new();
    for t in tenants {
        if t.name.is_empty() || !seen.insert(&t.name) {
            return Err(TenantConfigError::Name { name: t.name.clone() });
        }
        t.validate(refs)?;
    }
    Ok(())
}

/// A tenant's QoS limits (`[tenants.limits]`); every limit is optional
/// (absent = unlimited). Hot-reloadable: SIGHUP re-reads them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Object bytes per second (GET and PUT together). Paced, never refused.
    pub bytes_per_sec: Option<u64>,
    /// Requests per second (burst: one second's worth). Beyond it requests
    /// are refused with QUOTA_EXCEEDED and a retry-after hint.
    pub requests_per_sec: Option<u64>,
    /// Bytes of transfers in flight at once; further requests wait (up to
    /// `[qos] queue_timeout_ms`), a single larger request is refused.
    pub max_inflight_bytes: Option<u64>,
    /// Host memory the tenant may have registered, over all its sessions.
    pub max_registered_bytes: Option<u64>,
    /// Share of the transfer scheduler relative to other tenants (>= 1).
    pub weight: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            bytes_per_sec: None,
            requests_per_sec: None,
            max_inflight_bytes: None,
            max_registered_bytes: None,
            weight: 1,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// File (mode 0600) with the secret a shim must prove it holds to open
    /// sessions for this tenant (the shim has the same file). Relative paths
    /// are relative to the config file.
    pub shim_secret_file: PathBuf,
    /// Shim ids allowed to serve this tenant; empty: any shim with the secret.
    #[serde(default)]
    pub shims: Vec<String>,
    /// Where this tenant's shims may connect from: "unix" (the agent's
    /// socket) or IP addresses. Empty: anywhere. An address is what the
    /// connection claims; `[tenants.nic]` pins each host function to its
    /// addresses at the NIC (see `identity::ShimOrigin`).
    #[serde(default)]
    pub shim_origins: Vec<String>,
    /// QoS limits (`[tenants.limits]`); absent: unlimited, weight 1.
    #[serde(default)]
    pub limits: TenantLimits,
    pub namespaces: Vec<NamespaceConfig>,
    /// `[tenants.nic]`: the tenant's host functions and what they may reach
    /// (with `[nic]`).
    #[serde(default)]
    pub nic: Option<crate::nic::config::TenantNic>,
    /// Names a shim's client certificate must carry (one of) to open this
    /// tenant's sessions over TLS. Default: the tenant's name.
    #[serde(default)]
    pub tls_client_names: Vec<String>,
}

impl TenantConfig {
    /// [`Self::tls_client_names`], defaulted.
    pub fn tls_client_names(&self) -> Vec<String> {
        if self.tls_client_names.is_empty() {
            vec![self.name.clone()]
        } else {
            self.tls_client_names.clone()
        }
    }

    /// Checks the tenant's limits, origins and namespaces (whose names must
    /// be unique within it).
    pub fn validate(&self, refs: &NamespaceRefs<'_>) -> Result<(), TenantConfigError> {
        let tenant = || self.name.clone();
        let l = &self.limits;
        if l.bytes_per_sec == Some(0) || l.requests_per_sec == Some(0) || l.weight == 0 {
            return Err(TenantConfigError::Limits { tenant: tenant() });
        }
        if let Some(o) = self.shim_origins.iter().find(|o| *o != "unix" && o.parse::<std::net::IpAddr>().is_err()) {
            return Err(TenantConfigError::ShimOrigin { tenant: tenant(), origin: o.clone() });
        }
        let mut seen = HashSet::new();
        for ns in &self.namespaces {
            if ns.name.is_empty() || ns.name.contains('/') || !seen.insert(&ns.name) {
                return Err(TenantConfigError::NamespaceName { tenant: tenant(), namespace: ns.name.clone() });
            }
            ns.validate(refs)?;
        }
        // Encrypted objects bind the tenant's name (and its key directory
        // is named after it): a name the format refuses would fail every
        // encrypted GET and PUT at run time.
        if self.namespaces.iter().any(|ns| ns.encryption == sluice_crypt::EncryptionPolicy::Aes256Gcm) {
            sluice_crypt::check_tenant(&self.name)
                .map_err(|e| TenantConfigError::EncryptedName { tenant: tenant(), why: e.to_string() })?;
        }
        Ok(())
    }
}
