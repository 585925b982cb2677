//! Which shims may act for which tenant.
//!
//! A shim opens a session for a tenant by proving it holds the tenant's
//! shim secret (`sluice_proto::auth`: an HMAC over tenant, shim id, the
//! agent's epoch, timestamp and nonce). The agent checks, in order: the
//! tenant exists, the connection's origin is one the tenant allows, the shim
//! id is allowed, the timestamp is fresh, the proof names this agent's
//! epoch, the nonce is well-formed, the proof, and that the nonce is new.
//! Every refusal is typed and counted
//! (`sluice_agent_auth_failures_total{reason}`).
//!
//! The seen nonces live in memory and go with a restart; the epoch, new at
//! every start, is what keeps a proof captured before a restart from
//! passing after it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use sluice_proto::auth;

use crate::config::AgentConfig;
use crate::error::AgentError;
use crate::tls::ClientCert;

/// How far a proof's timestamp may be from the agent's clock.
const MAX_SKEW_MS: u64 = 120_000;

/// Where a shim's control connection came from. This is the binding point
/// between a connection and the tenants it may speak for: co-located, the
/// agent's Unix socket or a network address. A network address is what the
/// connection claims. A tenant's own listener (`[tenants.nic]`) is more: the
/// agent's NIC rules let only that tenant's host functions reach it, so the
/// listener a connection arrived on names the tenant, from the wire.
/// Over TLS, the shim's client certificate is part of the origin: a session
/// opened with one certificate is refused with another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShimOrigin {
    Unix,
    Network {
        ip: IpAddr,
        cert: Option<Arc<ClientCert>>,
    },
    /// Through tenant `tenant`'s own listener, from `ip`.
    Listener {
        tenant: Arc<str>,
        ip: IpAddr,
        cert: Option<Arc<ClientCert>>,
    },
}

impl ShimOrigin {
    /// The client certificate the connection was made with (TLS only).
    pub fn cert(&self) -> Option<&ClientCert> {
        match self {
            Self::Unix => None,
            Self::Network { cert, .. } | Self::Listener { cert, .. } => cert.as_deref(),
        }
    }

    fn allowed_by(&self, rules: &[String]) -> bool {
        rules.is_empty()
            || rules.iter().any(|r| match self {
                Self::Unix => r == "unix",
                Self::Network { ip, .. } | Self::Listener { ip, .. } => r.parse::<IpAddr>().is_ok_and(|a| a == *ip),
            })
    }
}

/// What a shim sends to open a session: what it claims, and the proof.
#[derive(Debug, Clone)]
pub struct SessionRequest<'a> {
    pub claim: auth::SessionClaim<'a>,
    pub proof: &'a [u8],
}

struct TenantAuth {
    secret: Vec<u8>,
    shims: Vec<String>,
    origins: Vec<String>,
    /// It has a listener of its own (`[tenants.nic]`): sessions only there.
    listener_only: bool,
    /// Names its shims' client certificates must carry (one of).
    cert_names: Vec<String>,
}

/// The agent's shim authenticator.
pub struct ShimAuth {
    tenants: HashMap<String, TenantAuth>,
    /// This run's epoch: proofs must carry it.
    epoch: [u8; auth::EPOCH_BYTES],
    /// Nonces seen within the skew window (nonce -> when it may be forgotten).
    seen: Mutex<HashMap<Vec<u8>, u64>>,
}

/// A tenant's shim secret cannot be read (the agent does not start).
#[derive(Debug, thiserror::Error)]
#[error("tenant {tenant:?}: shim secret: {source}")]
pub struct ShimSecretError {
    pub tenant: String,
    pub source: auth::SecretFileError,
}

impl ShimAuth {
    /// Reads every tenant's shim secret (files must be mode 0600).
    pub fn from_config(cfg: &AgentConfig) -> Result<Self, ShimSecretError> {
        let mut tenants = HashMap::new();
        for t in &cfg.tenants {
            let secret = auth::read_secret_file(&t.shim_secret_file)
                .map_err(|source| ShimSecretError { tenant: t.name.clone(), source })?;
            let auth = TenantAuth {
                secret,
                shims: t.shims.clone(),
                origins: t.shim_origins.clone(),
                listener_only: t.nic.is_some() && cfg.nic.is_some(),
                cert_names: t.tls_client_names(),
            };
            tenants.insert(t.name.clone(), auth);
        }
        Ok(Self::with_tenants(tenants))
    }

    /// A new epoch per authenticator: one per agent start.
    fn with_tenants(tenants: HashMap<String, TenantAuth>) -> Self {
        Self { tenants, epoch: auth::new_epoch(), seen: Mutex::default() }
    }

    /// The epoch shims must sign into their proofs (`GetEpoch`).
    pub fn epoch(&self) -> &[u8; auth::EPOCH_BYTES] {
        &self.epoch
    }

    /// Checks a session request; `Err` says why, with a metrics label.
    pub fn authenticate(
        &self,
        req: &SessionRequest<'_>,
        origin: &ShimOrigin,
        now_ms: u64,
    ) -> Result<(), (&'static str, AgentError)> {
        let denied = |reason: &'static str, msg: String| Err((reason, AgentError::AccessDenied(msg)));
        let unauth = |reason: &'static str, msg: String| Err((reason, AgentError::Unauthenticated(msg)));
        let (claim, tenant) = (&req.claim, req.claim.tenant);
        let Some(t) = self.tenants.get(tenant) else {
            return Err(("unknown_tenant", AgentError::UnknownTenant(tenant.to_owned())));
        };
        // From the wire: a tenant's listener serves that tenant only, and a
        // tenant with a listener is served nowhere else.
        match origin {
            ShimOrigin::Listener { tenant: serves, .. } if **serves != *tenant => {
                return unauth("listener", format!("this listener serves tenant {serves:?} only"));
            }
            ShimOrigin::Listener { .. } => {}
            _ if t.listener_only => {
                return unauth("listener", format!("tenant {tenant:?} opens sessions only on its own listener"));
            }
            _ => {}
        }
        if let Some(cert) = origin.cert() {
            if !cert.names_any(&t.cert_names) {
                return denied(
                    "certificate",
                    format!(
                        "the client certificate names {:?}; tenant {:?} accepts {:?}",
                        cert.names, tenant, t.cert_names
                    ),
                );
            }
        }
        if !origin.allowed_by(&t.origins) {
            return denied("origin", format!("tenant {tenant:?} does not accept shims from {origin:?}"));
        }
        if !t.shims.is_empty() && !t.shims.iter().any(|s| s == claim.shim_id) {
            return denied("shim_id", format!("shim {:?} may not serve tenant {:?}", claim.shim_id, tenant));
        }
        if claim.timestamp_ms.abs_diff(now_ms) > MAX_SKEW_MS {
            return unauth("stale", "session proof is stale or from the future (check the clocks)".into());
        }
        // Before the proof: a shim that fetched the epoch just before the
        // agent restarted should hear "epoch", not "wrong secret".
        if claim.epoch.is_empty() {
            return unauth(
                "no_epoch",
                "the session proof names no agent epoch: this shim is older than the agent; upgrade sluice-shim".into(),
            );
        }
        if claim.epoch != self.epoch {
            return unauth(
                "epoch",
                "the session proof was made for another agent epoch (the agent restarted since, or the proof is replayed); \
                 ask GetEpoch again and make a new proof"
                    .into(),
            );
        }
        if claim.nonce.len() != auth::NONCE_BYTES {
            return unauth("malformed", format!("nonce must be {} bytes", auth::NONCE_BYTES));
        }
        if !auth::verify_session_proof(&t.secret, claim, req.proof) {
            return unauth("bad_proof", format!("the shim does not hold tenant {tenant:?}'s secret"));
        }
        // Only a valid proof records its nonce, so garbage cannot fill the cache.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, until| *until > now_ms);
        if seen.insert(claim.nonce.to_vec(), now_ms + 2 * MAX_SKEW_MS).is_some() {
            return unauth("replay", "session proof replayed".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use auth::SessionClaim;
    use sluice_proto::common::ErrorCode;

    const SECRET: &[u8] = b"alpha-secret-0123456789";

    fn auth_with(origins: &[&str], shims: &[&str]) -> ShimAuth {
        let t = TenantAuth {
            secret: SECRET.to_vec(),
            shims: shims.iter().map(|s| s.to_string()).collect(),
            origins: origins.iter().map(|s| s.to_string()).collect(),
            listener_only: false,
            cert_names: vec!["alpha".to_owned()],
        };
        ShimAuth::with_tenants(HashMap::from([("alpha".to_owned(), t)]))
    }

    /// Signs `claim` with `secret` and asks `a` to admit it.
    fn open(
        a: &ShimAuth,
        secret: &[u8],
        claim: SessionClaim<'_>,
        origin: &ShimOrigin,
        now: u64,
    ) -> Result<(), (&'static str, AgentError)> {
        let proof = auth::session_proof(secret, &claim);
        a.authenticate(&SessionRequest { claim, proof: &proof }, origin, now)
    }

    #[test]
    fn a_client_certificate_must_name_the_tenant() {
        let a = auth_with(&[], &[]);
        let now = 1_000_000_000;
        let cert = |names: &[&str]| {
            Some(Arc::new(ClientCert {
                names: names.iter().map(|n| n.to_string()).collect(),
                fingerprint: names.join(","),
            }))
        };
        let mut n = 0u8;
        let mut check = |cert| {
            n += 1;
            let nonce = [n; 16];
            let claim =
                SessionClaim { tenant: "alpha", shim_id: "s", epoch: a.epoch(), timestamp_ms: now, nonce: &nonce };
            let origin = ShimOrigin::Network { ip: "10.0.0.7".parse().unwrap(), cert };
            open(&a, SECRET, claim, &origin, now).err().map(|(reason, _)| reason)
        };
        assert_eq!(check(cert(&["alpha"])), None);
        assert_eq!(check(cert(&["node-1", "alpha"])), None, "any of its names");
        assert_eq!(check(cert(&["beta"])), Some("certificate"), "another tenant's certificate");
        assert_eq!(check(cert(&[])), Some("certificate"), "a certificate that names nothing");
        assert_eq!(check(None), None, "no TLS (plaintext by configuration): the proof alone");
        // A session is bound to the certificate it was opened with.
        let with = |c| ShimOrigin::Network { ip: "10.0.0.7".parse().unwrap(), cert: c };
        assert_ne!(with(cert(&["alpha"])), with(cert(&["alpha", "other"])));
    }

    #[test]
    fn a_tenants_listener_serves_that_tenant_only() {
        let mut a = auth_with(&[], &[]);
        let now = 1_700_000_000_000;
        let mut n = 0u8;
        let mut check = |a: &ShimAuth, origin: ShimOrigin| {
            n += 1;
            let nonce = [n; 16];
            let claim =
                SessionClaim { tenant: "alpha", shim_id: "s", epoch: a.epoch(), timestamp_ms: now, nonce: &nonce };
            open(a, SECRET, claim, &origin, now).err().map(|(reason, e)| (reason, e.code()))
        };
        let ip = "10.0.0.7".parse().unwrap();
        let listener = |t: &str| ShimOrigin::Listener { tenant: t.into(), ip, cert: None };
        assert_eq!(check(&a, listener("alpha")), None);
        let refused = Some(("listener", ErrorCode::Unauthenticated));
        assert_eq!(check(&a, listener("beta")), refused, "alpha's secret on beta's listener");
        assert_eq!(check(&a, ShimOrigin::Network { ip, cert: None }), None, "no listener of its own: anywhere");
        a.tenants.get_mut("alpha").unwrap().listener_only = true;
        assert_eq!(
            check(&a, ShimOrigin::Network { ip, cert: None }),
            refused,
            "with a listener of its own: only there"
        );
        assert_eq!(check(&a, ShimOrigin::Unix), refused);
        assert_eq!(check(&a, listener("alpha")), None);
    }

    #[test]
    fn checks_tenant_origin_shim_time_replay_and_proof() {
        let a = auth_with(&["unix", "10.0.0.1"], &["node-1"]);
        let now = 1_000_000_000;
        let check = |tenant: &str, shim: &str, ts: u64, nonce: [u8; 16], secret: &[u8], origin: ShimOrigin| {
            let claim = SessionClaim { tenant, shim_id: shim, epoch: a.epoch(), timestamp_ms: ts, nonce: &nonce };
            open(&a, secret, claim, &origin, now).err().map(|(reason, _)| reason)
        };
        let s = SECRET;
        assert_eq!(check("alpha", "node-1", now, [1; 16], s, ShimOrigin::Unix), None);
        assert_eq!(check("alpha", "node-1", now, [1; 16], s, ShimOrigin::Unix), Some("replay"));
        assert_eq!(check("beta", "node-1", now, [2; 16], s, ShimOrigin::Unix), Some("unknown_tenant"));
        let far = ShimOrigin::Network { ip: "10.0.0.2".parse().unwrap(), cert: None };
        assert_eq!(check("alpha", "node-1", now, [3; 16], s, far), Some("origin"));
        let near = ShimOrigin::Network { ip: "10.0.0.1".parse().unwrap(), cert: None };
        assert_eq!(check("alpha", "node-1", now, [4; 16], s, near), None);
        assert_eq!(check("alpha", "node-2", now, [5; 16], s, ShimOrigin::Unix), Some("shim_id"));
        assert_eq!(check("alpha", "node-1", now - 200_000, [6; 16], s, ShimOrigin::Unix), Some("stale"));
        let wrong = b"beta-secret-0123456789";
        assert_eq!(check("alpha", "node-1", now, [7; 16], wrong, ShimOrigin::Unix), Some("bad_proof"));
        // A failed proof does not burn the nonce.
        assert_eq!(check("alpha", "node-1", now, [7; 16], s, ShimOrigin::Unix), None);
    }

    /// The nonce cache goes with a restart; the epoch does not come back:
    /// a proof made for one run of the agent is refused by the next, typed
    /// and with its own reason, and so is a proof with no epoch at all.
    #[test]
    fn a_proof_for_another_agent_epoch_is_refused() {
        // Two runs of the agent with the same tenant and secret.
        let (first, second) = (auth_with(&[], &[]), auth_with(&[], &[]));
        assert_ne!(first.epoch(), second.epoch(), "every start draws a new epoch");
        let now = 1_700_000_000_000;
        let nonce = [1u8; 16];
        let claim =
            SessionClaim { tenant: "alpha", shim_id: "s", epoch: first.epoch(), timestamp_ms: now, nonce: &nonce };
        let proof = auth::session_proof(SECRET, &claim);
        let captured = SessionRequest { claim, proof: &proof };
        assert!(first.authenticate(&captured, &ShimOrigin::Unix, now).is_ok());

        // Replayed at the restarted agent, within the skew window, its
        // nonce unknown there.
        let (reason, e) = second.authenticate(&captured, &ShimOrigin::Unix, now + 1_000).unwrap_err();
        assert_eq!((reason, e.code()), ("epoch", ErrorCode::Unauthenticated), "{e}");
        // The shim retries an open once on this phrase (host-shim session.rs).
        assert!(e.to_string().contains("another agent epoch"), "{e}");
        // Relabelled with the new epoch, the old proof no longer verifies.
        let relabelled = SessionRequest { claim: SessionClaim { epoch: second.epoch(), ..claim }, proof: &proof };
        let (reason, _) = second.authenticate(&relabelled, &ShimOrigin::Unix, now + 1_000).unwrap_err();
        assert_eq!(reason, "bad_proof");

        // A shim older than the agent signs no epoch: told to upgrade.
        let old = SessionClaim { epoch: &[], nonce: &[2; 16], ..claim };
        let (reason, e) = open(&second, SECRET, old, &ShimOrigin::Unix, now).unwrap_err();
        assert_eq!((reason, e.code()), ("no_epoch", ErrorCode::Unauthenticated), "{e}");
        assert!(e.to_string().contains("upgrade"), "{e}");

        // A fresh proof for the new epoch, same nonce as the captured one: in.
        let fresh = SessionClaim { epoch: second.epoch(), ..claim };
        assert!(open(&second, SECRET, fresh, &ShimOrigin::Unix, now + 1_000).is_ok());
    }
}
