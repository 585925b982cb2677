//! Prometheus metrics, labelled by tenant, namespace, operation and data path,
//! served on `GET /metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
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
        registry.register(Box::new(quota_refusals.clone()))?;
        registry.register(Box::new(auth_failures.clone()))?;
        registry.register(Box::new(access_denied.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(fallbacks.clone()))?;
        registry.register(Box::new(s3_retries.clone()))?;
        registry.register(Box::new(sessions.clone()))?;
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
            regions,
            registered_bytes,
            auth_failures,
            access_denied,
            quota_refusals,
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
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_else(|e| format!("# encode error: {e}\n"))
    }
}

/// Serves `GET /metrics` on `listener` forever.
pub async fn serve(metrics: std::sync::Arc<Metrics>, listener: TcpListener) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                async move {
                    let resp = if req.uri().path() == "/metrics" {
                        hyper::Response::builder()
                            .header("content-type", "text/plain; version=0.0.4")
                            .body(Full::new(Bytes::from(metrics.render())))
                    } else {
                        hyper::Response::builder().status(404).body(Full::new(Bytes::from_static(b"try /metrics\n")))
                    };
                    Ok::<_, Infallible>(resp.unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()))))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
