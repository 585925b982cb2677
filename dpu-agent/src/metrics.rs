//! Prometheus metrics, labelled by tenant, namespace, operation and data path,
//! served on `GET /metrics` (with `GET /ready`, see `health.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::net::TcpListener;

/// All agent metrics.
pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub bytes: IntCounterVec,
    pub latency: HistogramVec,
    pub errors: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub s3_retries: IntCounter,
    pub sessions: IntGauge,
    /// Open framed-GET connections of co-located shims (`framed_gets.rs`).
    pub framed_connections: IntGauge,
    pub regions: IntGaugeVec,
    pub registered_bytes: IntGaugeVec,
    /// Refused session opens, by tenant and reason.
    pub auth_failures: IntCounterVec,
    /// Requests refused by a namespace ACL or key scoping.
    pub access_denied: IntCounterVec,
    /// Requests and registrations refused by a tenant quota, by tenant and
    /// limit (`kind`: requests_per_sec, max_inflight_bytes, busy_slots, ...).
    /// Tenants that are not configured count as `<unknown>`.
    pub quota_refusals: IntCounterVec,
    /// How long each transfer chunk waited for a slot of the fair (DRR)
    /// scheduler, by tenant (`<unknown>` for names not configured). A small
    /// request should wait behind a chunk or two per global slot, never
    /// behind a whole large transfer.
    pub slot_wait: HistogramVec,
    /// Sessions closed by the agent because their shim stopped renewing them.
    pub sessions_expired: IntCounterVec,
    /// Multipart uploads the agent aborted, by why (`failed`: a part or the
    /// completion failed; `cancelled`: the request was dropped mid-way —
    /// its shim died or its deadline passed; `left`: a previous run left it
    /// open, aborted at start).
    pub multipart_aborts: IntCounterVec,
    /// Each store endpoint's health (`store_endpoint_up{endpoint}`,
    /// `store_endpoint_ejections_total`, `store_endpoint_failbacks_total`,
    /// `store_endpoint_failures_total{endpoint,kind}`).
    pub endpoints: crate::s3::endpoints::EndpointMetrics,
    /// The NIC guard's counters (`nic_drift_total{reason}`,
    /// `nic_rules_in_place`, `nic_foreign_flows`).
    pub nic: crate::nic::guard::GuardMetrics,
    /// This process's open descriptors and resident memory, read at scrape.
    process: sluice_telemetry::ProcessGauges,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("sluice_agent".into()), None)?;
        let op_labels = &["tenant", "namespace", "op", "data_path"];
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "Requests handled, by outcome"),
            &["tenant", "namespace", "op", "data_path", "outcome"],
        )?;
        let bytes = IntCounterVec::new(Opts::new("bytes_total", "Object bytes moved"), op_labels)?;
        let latency = HistogramVec::new(
            HistogramOpts::new("request_duration_seconds", "Request latency").buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            op_labels,
        )?;
        let errors = IntCounterVec::new(
            Opts::new("errors_total", "Failed requests by error kind"),
            &["tenant", "namespace", "op", "kind"],
        )?;
        let fallbacks = IntCounterVec::new(
            Opts::new("fallbacks_total", "Requests that fell back from the configured data path"),
            &["tenant", "namespace", "op", "reason"],
        )?;
        let s3_retries =
            IntCounter::new("s3_retries_total", "S3 requests retried after 5xx/throttling/connection errors")?;
        let sessions = IntGauge::new("sessions", "Open sessions")?;
        let framed_connections = IntGauge::new(
            "framed_get_connections",
            "Open framed-GET connections (single GETs without HTTP/2) from co-located shims",
        )?;
        let regions = IntGaugeVec::new(Opts::new("regions", "Registered host regions"), &["tenant"])?;
        let registered_bytes =
            IntGaugeVec::new(Opts::new("registered_bytes", "Bytes of registered host memory"), &["tenant"])?;
        let auth_failures = IntCounterVec::new(
            Opts::new("auth_failures_total", "Refused session opens (bad proof, replay, origin, ...)"),
            &["tenant", "reason"],
        )?;
        let access_denied = IntCounterVec::new(
            Opts::new("access_denied_total", "Requests refused by a namespace ACL or key scoping"),
            &["tenant", "namespace", "op"],
        )?;
        let quota_refusals = IntCounterVec::new(
            Opts::new("quota_refusals_total", "Requests and registrations refused by a tenant quota"),
            &["tenant", "kind"],
        )?;
        let slot_wait = HistogramVec::new(
            HistogramOpts::new(
                "slot_wait_seconds",
                "Time each transfer chunk waited for a fair-scheduler slot (0 when one was free)",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 1.0,
                5.0, 30.0,
            ]),
            &["tenant"],
        )?;
        let sessions_expired = IntCounterVec::new(
            Opts::new("sessions_expired_total", "Sessions closed because their shim stopped renewing them"),
            &["tenant"],
        )?;
        let multipart_aborts = IntCounterVec::new(
            Opts::new("multipart_aborts_total", "Multipart uploads aborted by the agent"),
            &["reason"],
        )?;
        let endpoints = crate::s3::endpoints::EndpointMetrics {
            up: IntGaugeVec::new(
                Opts::new("store_endpoint_up", "1 while a store endpoint gets requests, 0 while it is ejected"),
                &["endpoint"],
            )?,
            ejections: IntCounterVec::new(
                Opts::new("store_endpoint_ejections_total", "Times a store endpoint was ejected after failures"),
                &["endpoint"],
            )?,
            failbacks: IntCounterVec::new(
                Opts::new("store_endpoint_failbacks_total", "Times an ejected store endpoint came back"),
                &["endpoint"],
            )?,
            failures: IntCounterVec::new(
                Opts::new(
                    "store_endpoint_failures_total",
                    "Requests that failed their store endpoint (refused, deadline, broken, 5xx)",
                ),
                &["endpoint", "kind"],
            )?,
        };
        registry.register(Box::new(endpoints.up.clone()))?;
        registry.register(Box::new(endpoints.ejections.clone()))?;
        registry.register(Box::new(endpoints.failbacks.clone()))?;
        registry.register(Box::new(endpoints.failures.clone()))?;
        let nic = crate::nic::guard::GuardMetrics {
            drift: IntCounterVec::new(
                Opts::new(
                    "nic_drift_total",
                    "Times the bridge did not hold the agent's NIC rules (flows, meters, fail_mode, fragments) \
                     or could not be checked (unreachable); each was restored",
                ),
                &["reason"],
            )?,
            in_place: IntGauge::new("nic_rules_in_place", "1 while the bridge holds the agent's NIC rules")?,
            foreign_flows: IntGauge::new("nic_foreign_flows", "Flows on the bridge the agent did not install")?,
        };
        registry.register(Box::new(nic.drift.clone()))?;
        registry.register(Box::new(nic.in_place.clone()))?;
        registry.register(Box::new(nic.foreign_flows.clone()))?;
        let process = sluice_telemetry::ProcessGauges::register(&registry, "agent process")?;
        registry.register(Box::new(sessions_expired.clone()))?;
        registry.register(Box::new(multipart_aborts.clone()))?;
        registry.register(Box::new(quota_refusals.clone()))?;
        registry.register(Box::new(slot_wait.clone()))?;
        registry.register(Box::new(auth_failures.clone()))?;
        registry.register(Box::new(access_denied.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(fallbacks.clone()))?;
        registry.register(Box::new(s3_retries.clone()))?;
        registry.register(Box::new(sessions.clone()))?;
        registry.register(Box::new(framed_connections.clone()))?;
        registry.register(Box::new(regions.clone()))?;
        registry.register(Box::new(registered_bytes.clone()))?;
        Ok(Self {
            registry,
            requests,
            bytes,
            latency,
            errors,
            fallbacks,
            s3_retries,
            sessions,
            framed_connections,
            regions,
            registered_bytes,
            auth_failures,
            access_denied,
            quota_refusals,
            slot_wait,
            sessions_expired,
            multipart_aborts,
            endpoints,
            nic,
            process,
        })
    }

    /// Records one finished request.
    pub fn observe(
        &self,
        tenant: &str,
        namespace: &str,
        op: &str,
        data_path: &str,
        elapsed: Duration,
        result: Result<u64, &str>,
    ) {
        let labels = [tenant, namespace, op, data_path];
        self.latency.with_label_values(&labels).observe(elapsed.as_secs_f64());
        match result {
            Ok(bytes) => {
                self.requests.with_label_values(&[tenant, namespace, op, data_path, "ok"]).inc();
                if bytes > 0 {
                    self.bytes.with_label_values(&labels).inc_by(bytes);
                }
            }
            Err(kind) => {
                self.requests.with_label_values(&[tenant, namespace, op, data_path, "error"]).inc();
                self.errors.with_label_values(&[tenant, namespace, op, kind]).inc();
            }
        }
    }

    /// Exposes the transport's descriptor rejections (wrong key, out of
    /// window, wrong direction) as `sluice_agent_descriptor_rejections_total`.
    pub fn watch_rejections(&self, table: std::sync::Arc<sluice_dataplane::CapabilityTable>) {
        let c = prometheus::IntCounterVec::new(
            Opts::new("descriptor_rejections_total", "Remote accesses refused by descriptor checks"),
            &["reason"],
        );
        let Ok(c) = c else { return };
        if self.registry.register(Box::new(c.clone())).is_err() {
            return;
        }
        tokio::spawn(async move {
            use std::sync::atomic::Ordering::Relaxed;
            let r = &table.rejections;
            loop {
                for (reason, v) in [
                    ("unknown_key", r.unknown_key.load(Relaxed)),
                    ("out_of_window", r.out_of_window.load(Relaxed)),
                    ("wrong_direction", r.wrong_direction.load(Relaxed)),
                    ("expired", r.expired.load(Relaxed)),
                ] {
                    let cur = c.with_label_values(&[reason]);
                    cur.inc_by(v.saturating_sub(cur.get()));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        self.process.render(&self.registry)
    }
}

/// Binds the operations endpoint (`/metrics`, `/ready`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
