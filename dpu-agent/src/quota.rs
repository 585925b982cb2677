//! Glue between the agent's configuration and `sluice_qos`: builds the one
//! [`Qos`] the agent shares across tenants (with refusals counted in
//! `sluice_agent_quota_refusals_total{tenant,kind}` and every transfer slot's
//! wait for the fair scheduler in `sluice_agent_slot_wait_seconds{tenant}`),
//! and re-applies per-tenant
//! limits from the config file on reload (SIGHUP).
//!
//! What is reloadable: every tenant's `[tenants.limits]`. What is not (logged
//! and ignored until a restart): the `[qos]` section (the scheduler is sized at
//! startup) and the set of tenants (their namespaces, credentials and shim
//! secrets are wired at startup; a tenant missing from the new file keeps its
//! current limits).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounterVec};
use sluice_qos::{Limits, Observers, Qos, QosConfig, QosError, UNKNOWN_TENANT_LABEL};

use crate::config::{AgentConfig, QosSettings, TenantLimits};

/// A tenant's `[tenants.limits]` as QoS limits.
pub fn limits_of(l: &TenantLimits) -> Limits {
    Limits {
        bytes_per_sec: l.bytes_per_sec,
        requests_per_sec: l.requests_per_sec,
        max_inflight_bytes: l.max_inflight_bytes,
        max_registered_bytes: l.max_registered_bytes,
        weight: l.weight,
    }
}

/// The `[qos]` section as scheduler settings (DRR quantum: the library default).
pub fn qos_config(s: &QosSettings) -> QosConfig {
    QosConfig {
        global_slots: s.global_slots,
        queue_timeout: Duration::from_millis(s.queue_timeout_ms),
        ..QosConfig::default()
    }
}

/// Every configured tenant's limits.
pub fn tenant_limits(cfg: &AgentConfig) -> HashMap<String, Limits> {
    cfg.tenants.iter().map(|t| (t.name.clone(), limits_of(&t.limits))).collect()
}

/// The agent's QoS layer and what it was built from.
#[derive(Clone, Debug)]
pub struct Quotas {
    qos: Qos,
    /// Tenants known at startup: the only ones that can have sessions.
    tenants: Arc<BTreeSet<String>>,
    settings: QosSettings,
}

impl Quotas {
    /// Builds the QoS layer; every refusal increments `refusals{tenant,kind}`
    /// and every granted transfer slot observes its wait in
    /// `slot_waits{tenant}`, with tenants not in the config labelled
    /// `<unknown>` so that made-up names cannot grow the metrics without bound.
    pub fn new(cfg: &AgentConfig, refusals: IntCounterVec, slot_waits: HistogramVec) -> Result<Self, QosError> {
        let tenants: Arc<BTreeSet<String>> = Arc::new(cfg.tenants.iter().map(|t| t.name.clone()).collect());
        let known = Arc::clone(&tenants);
        let observer = Arc::new(move |err: &QosError| {
            let tenant = err.tenant();
            let label = if known.contains(tenant) && !matches!(err, QosError::UnknownTenant { .. }) {
                tenant
            } else {
                UNKNOWN_TENANT_LABEL
            };
            refusals.with_label_values(&[label, err.kind()]).inc();
        });
        // Resolved once: a slot is granted per chunk, on the data path.
        let waits: HashMap<String, Histogram> =
            tenants.iter().map(|t| (t.clone(), slot_waits.with_label_values(&[t.as_str()]))).collect();
        let unknown_waits = slot_waits.with_label_values(&[UNKNOWN_TENANT_LABEL]);
        let slot_wait = Arc::new(move |tenant: &str, waited: Duration| {
            waits.get(tenant).unwrap_or(&unknown_waits).observe(waited.as_secs_f64());
        });
        let observers = Observers { refusals: Some(observer), slot_waits: Some(slot_wait) };
        let qos = Qos::with_observers(qos_config(&cfg.qos), tenant_limits(cfg), observers)?;
        Ok(Self { qos, tenants, settings: cfg.qos.clone() })
    }

    pub fn qos(&self) -> &Qos {
        &self.qos
    }

    /// Applies `cfg`'s tenant limits (all or nothing); see the module docs for
    /// what is ignored. Returns one line per tenant whose limits changed.
    pub fn apply(&self, cfg: &AgentConfig) -> Result<Vec<String>, QosError> {
        if cfg.qos != self.settings {
            tracing::warn!(running = ?self.settings, file = ?cfg.qos, "[qos] changes need a restart; ignored");
        }
        let mut new = tenant_limits(cfg);
        for name in new.keys().filter(|n| !self.tenants.contains(*n)) {
            tracing::warn!(tenant = %name, "tenant added to the config: needs a restart; its limits are ignored");
        }
        new.retain(|name, _| self.tenants.contains(name));
        let mut changes = Vec::new();
        for name in self.tenants.iter() {
            let old = self.qos.limits(name).unwrap_or_default();
            match new.get(name) {
                Some(l) if *l != old => changes.push(format!("{name}: {}", describe_change(&old, l))),
                Some(_) => {}
                None => {
                    tracing::warn!(tenant = %name, "tenant removed from the config: needs a restart; keeping its limits");
                    new.insert(name.clone(), old);
                }
            }
        }
        self.qos.update(new)?;
        Ok(changes)
    }
}

fn fmt_limit(v: Option<u64>) -> String {
    v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string())
}

/// "bytes_per_sec 1000 -> 2000, weight 1 -> 2".
fn describe_change(old: &Limits, new: &Limits) -> String {
    let mut parts = Vec::new();
    for (name, a, b) in [
        ("bytes_per_sec", old.bytes_per_sec, new.bytes_per_sec),
        ("requests_per_sec", old.requests_per_sec, new.requests_per_sec),
        ("max_inflight_bytes", old.max_inflight_bytes, new.max_inflight_bytes),
        ("max_registered_bytes", old.max_registered_bytes, new.max_registered_bytes),
    ] {
        if a != b {
            parts.push(format!("{name} {} -> {}", fmt_limit(a), fmt_limit(b)));
        }
    }
    if old.weight != new.weight {
        parts.push(format!("weight {} -> {}", old.weight, new.weight));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use prometheus::Opts;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn config(alpha_limits: &str, extra_tenant: bool) -> String {
        let mut s = String::from(
            "grpc_socket = \"/tmp/x.sock\"\nmemory_socket = \"/tmp/m.sock\"\n\
             [credentials.c]\naccess_key = \"a\"\nsecret_key = \"s\"\n\
             [[tenants]]\nname = \"alpha\"\nshim_secret_file = \"a.secret\"\n",
        );
        s.push_str(alpha_limits);
        s.push_str(
            "\n[[tenants.namespaces]]\nname = \"d\"\nendpoints = [\"http://127.0.0.1:1\"]\nbucket = \"b\"\n\
             credentials = \"c\"\n",
        );
        s.push_str(
            "[[tenants]]\nname = \"beta\"\nshim_secret_file = \"b.secret\"\n[[tenants.namespaces]]\nname = \"d\"\n\
             endpoints = [\"http://127.0.0.1:1\"]\nbucket = \"b\"\ncredentials = \"c\"\n",
        );
        if extra_tenant {
            s.push_str(
                "[[tenants]]\nname = \"gamma\"\nshim_secret_file = \"g.secret\"\n[[tenants.namespaces]]\n\
                 name = \"d\"\nendpoints = [\"http://127.0.0.1:1\"]\nbucket = \"b\"\ncredentials = \"c\"\n",
            );
        }
        s
    }

    fn parse(text: &str) -> AgentConfig {
        let cfg: AgentConfig = toml::from_str(text).unwrap();
        cfg.validate().unwrap();
        cfg
    }

    fn counter() -> IntCounterVec {
        IntCounterVec::new(Opts::new("quota_refusals_total", "test"), &["tenant", "kind"]).unwrap()
    }

    fn waits() -> HistogramVec {
        HistogramVec::new(prometheus::HistogramOpts::new("slot_wait_seconds", "test"), &["tenant"]).unwrap()
    }

    #[test]
    fn config_limits_convert_and_default_to_unlimited() {
        let cfg = parse(&config(
            "[tenants.limits]\nbytes_per_sec = 1000\nrequests_per_sec = 5\nmax_inflight_bytes = 2048\n\
             max_registered_bytes = 4096\nweight = 3\n",
            false,
        ));
        let limits = tenant_limits(&cfg);
        assert_eq!(
            limits["alpha"],
            Limits {
                bytes_per_sec: Some(1000),
                requests_per_sec: Some(5),
                max_inflight_bytes: Some(2048),
                max_registered_bytes: Some(4096),
                weight: 3,
            }
        );
        assert_eq!(limits["beta"], Limits::default());
        // The inline-table form is the same table.
        let inline = parse(&config("limits = { bytes_per_sec = 1000, weight = 2 }\n", false));
        assert_eq!(
            tenant_limits(&inline)["alpha"],
            Limits { bytes_per_sec: Some(1000), weight: 2, ..Limits::default() }
        );
        // [qos] defaults, and its conversion.
        assert_eq!(cfg.qos, QosSettings { global_slots: 64, queue_timeout_ms: 30_000 });
        let qc = qos_config(&QosSettings { global_slots: 3, queue_timeout_ms: 1500 });
        assert_eq!((qc.global_slots, qc.queue_timeout), (3, Duration::from_millis(1500)));
    }

    #[test]
    fn bad_limits_are_rejected_at_load() {
        for bad in ["bytes_per_sec = 0", "requests_per_sec = 0", "weight = 0", "bogus = 1"] {
            let text = config(&format!("[tenants.limits]\n{bad}\n"), false);
            let rejected = toml::from_str::<AgentConfig>(&text)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map_err(|e| e.to_string()));
            assert!(rejected.is_err(), "{bad} accepted");
        }
        let mut cfg = parse(&config("", false));
        cfg.qos.global_slots = 0;
        assert!(cfg.validate().is_err());
    }

    /// What the agent's SIGHUP does with the file: read and check it, then
    /// apply its limits.
    fn reload(quotas: &Quotas, path: &std::path::Path) -> Result<Vec<String>, String> {
        let cfg = AgentConfig::from_file(path).map_err(|e| format!("config: {e}"))?;
        quotas.apply(&cfg).map_err(|e| format!("limits: {e}"))
    }

    #[tokio::test]
    async fn reload_applies_changes_and_keeps_old_limits_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let cfg = parse(&config("[tenants.limits]\nbytes_per_sec = 1000\n", false));
        let quotas = Quotas::new(&cfg, counter(), waits()).unwrap();
        let qos = quotas.qos();
        assert_eq!(qos.limits("alpha").unwrap().bytes_per_sec, Some(1000));

        std::fs::write(&path, config("[tenants.limits]\nbytes_per_sec = 2000\nweight = 2\n", false)).unwrap();
        let changes = reload(&quotas, &path).unwrap();
        assert_eq!(changes, vec!["alpha: bytes_per_sec 1000 -> 2000, weight 1 -> 2".to_owned()]);
        assert_eq!(qos.limits("alpha").unwrap(), Limits { bytes_per_sec: Some(2000), weight: 2, ..Limits::default() });

        // Unparsable, or invalid: an error, and the running limits stay.
        std::fs::write(&path, "this is not toml").unwrap();
        assert!(reload(&quotas, &path).unwrap_err().starts_with("config:"));
        std::fs::write(&path, config("[tenants.limits]\nrequests_per_sec = 0\n", false)).unwrap();
        assert!(reload(&quotas, &path).is_err());
        assert!(reload(&quotas, &dir.path().join("missing.toml")).is_err());
        assert_eq!(qos.limits("alpha").unwrap().bytes_per_sec, Some(2000));

        // Unchanged file: nothing to report. Added tenants are ignored (they
        // need a restart), so they stay unknown to QoS.
        std::fs::write(&path, config("[tenants.limits]\nbytes_per_sec = 2000\nweight = 2\n", true)).unwrap();
        assert!(reload(&quotas, &path).unwrap().is_empty());
        assert!(qos.limits("gamma").is_none());

        // Back to unlimited.
        std::fs::write(&path, config("", false)).unwrap();
        let changes = reload(&quotas, &path).unwrap();
        assert_eq!(changes, vec!["alpha: bytes_per_sec 2000 -> unlimited, weight 2 -> 1".to_owned()]);
        assert_eq!(qos.limits("alpha").unwrap(), Limits::default());
    }

    #[tokio::test]
    async fn a_tenant_missing_from_the_new_file_keeps_its_limits() {
        let cfg = parse(&config("[tenants.limits]\nmax_registered_bytes = 4096\n", false));
        let quotas = Quotas::new(&cfg, counter(), waits()).unwrap();
        let mut without_alpha = cfg.clone();
        without_alpha.tenants.retain(|t| t.name != "alpha");
        assert!(quotas.apply(&without_alpha).unwrap().is_empty());
        assert_eq!(quotas.qos().limits("alpha").unwrap().max_registered_bytes, Some(4096));
        assert!(quotas.qos().reserve_memory("alpha", 4096).is_ok());
    }

    #[tokio::test]
    async fn refusals_are_counted_with_bounded_tenant_labels() {
        let cfg = parse(&config("[tenants.limits]\nmax_registered_bytes = 4096\nrequests_per_sec = 1\n", false));
        let refusals = counter();
        let quotas = Quotas::new(&cfg, refusals.clone(), waits()).unwrap();
        let qos = quotas.qos();
        let held = qos.reserve_memory("alpha", 4 * 1024).unwrap();
        assert!(matches!(qos.reserve_memory("alpha", 1), Err(QosError::MemoryQuota { .. })));
        drop(held);
        qos.reserve_memory("alpha", 4 * 1024).unwrap();
        assert!(qos.admit("alpha", 0).await.is_ok());
        assert!(matches!(qos.admit("alpha", 0).await, Err(QosError::RateLimited { .. })));
        for name in ["mallory", "eve"] {
            assert!(qos.admit(name, MIB).await.is_err());
        }
        let get = |t: &str, k: &str| refusals.with_label_values(&[t, k]).get();
        assert_eq!(get("alpha", "max_registered_bytes"), 1);
        assert_eq!(get("alpha", "requests_per_sec"), 1);
        assert_eq!(get(UNKNOWN_TENANT_LABEL, "unknown_tenant"), 2);
        assert_eq!(get("mallory", "unknown_tenant"), 0);
    }

    #[tokio::test]
    async fn slot_waits_are_observed_with_bounded_tenant_labels() {
        let cfg = parse(&config("", false));
        let waits = waits();
        let quotas = Quotas::new(&cfg, counter(), waits.clone()).unwrap();
        let qos = quotas.qos();
        drop(qos.slot("alpha", MIB).await.unwrap());
        drop(qos.slot("beta", MIB).await.unwrap());
        drop(qos.slot("mallory", MIB).await.unwrap());
        drop(qos.slot("eve", MIB).await.unwrap());
        let count = |t: &str| waits.with_label_values(&[t]).get_sample_count();
        assert_eq!((count("alpha"), count("beta"), count(UNKNOWN_TENANT_LABEL)), (1, 1, 2));
        // Only configured names and the shared label exist as series.
        let series: usize = prometheus::core::Collector::collect(&waits).iter().map(|f| f.get_metric().len()).sum();
        assert_eq!(series, 3);
    }
}
