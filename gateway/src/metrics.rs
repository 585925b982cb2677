//! The gateway's operations endpoint (`metrics_listen`): Prometheus
//! metrics (`sluice_gateway_*`: S3 requests by operation and status,
//! latency, object bytes in and out by data path, open connections,
//! descriptors, memory) and readiness: the embedded store's bucket
//! directories are there, or the upstream S3 endpoint accepts connections.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use sluice_dataplane::s3_names::{BYTES_HEADER, REPLY_HEADER, TOKEN_HEADER};
use sluice_telemetry::Readiness;

/// Time between checks of an upstream store.
const CHECK_EVERY: Duration = Duration::from_secs(15);

/// What the gateway serves from, for readiness.
#[derive(Debug, Clone)]
pub enum Backing {
    /// The embedded store: these bucket directories must exist.
    Directory(Vec<PathBuf>),
    /// Another S3 endpoint (`host:port`), checked in the background.
    Upstream(String),
}

pub struct GatewayMetrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    bytes: IntCounterVec,
    /// Open client connections.
    pub connections: IntGauge,
    process: sluice_telemetry::ProcessGauges,
    backing: Backing,
    /// The last upstream check: `None` before the first.
    upstream: Mutex<Option<Result<(), String>>>,
}

/// The S3 operation a request is, from its method and query (the label of
/// every metric; s3s decides the same from the same parts).
pub fn operation(method: &http::Method, uri: &http::Uri) -> &'static str {
    let query = uri.query().unwrap_or("");
    let has = |name: &str| query.split('&').any(|kv| kv.split('=').next() == Some(name));
    // Path style: "/bucket" or "/bucket/" is a bucket, anything longer a key.
    let object = uri.path().trim_start_matches('/').split_once('/').is_some_and(|(_, key)| !key.is_empty());
    // Sub-resources of an object (ACLs, tags, attributes, the parts of an
    // upload) are metadata, not the object's bytes.
    let sub = ["uploadId", "acl", "tagging", "attributes", "retention", "legal-hold"].iter().any(|q| has(q));
    match *method {
        http::Method::GET if object && sub => "get_metadata",
        http::Method::GET if object => "get",
        http::Method::GET => "list",
        http::Method::HEAD => "head",
        http::Method::PUT if object && has("uploadId") => "upload_part",
        http::Method::PUT if object => "put",
        http::Method::PUT => "create_bucket",
        http::Method::POST if has("uploads") => "create_multipart",
        http::Method::POST if has("uploadId") => "complete_multipart",
        http::Method::POST if has("delete") => "delete_objects",
        http::Method::DELETE if has("uploadId") => "abort_multipart",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

fn header_u64(h: &http::HeaderMap, name: &str) -> u64 {
    h.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

impl GatewayMetrics {
    pub fn new(backing: Backing) -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("sluice_gateway".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "S3 requests, by operation and HTTP status"),
            &["op", "status"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new("request_duration_seconds", "S3 request latency until the response head")
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0]),
            &["op"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "bytes_total",
                "Object bytes: direction in (PUT bodies, one-sided READs) or out (GET bodies, one-sided WRITEs), by data path",
            ),
            &["direction", "data_path"],
        )?;
        let connections = IntGauge::new("connections", "Open client connections")?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        let process = sluice_telemetry::ProcessGauges::register(&registry, "gateway")?;
        Ok(Self { registry, requests, latency, bytes, connections, process, backing, upstream: Mutex::new(None) })
    }

    /// Counts one answered request: `rdma_asked` (it carried a token) and
    /// `sent` (its body's content-length) come from the request.
    fn observe(&self, op: &str, rdma_asked: bool, sent: u64, resp: &http::Response<s3s::Body>, elapsed: Duration) {
        let status = resp.status();
        self.requests.with_label_values(&[op, status.as_str()]).inc();
        self.latency.with_label_values(&[op]).observe(elapsed.as_secs_f64());
        if !status.is_success() {
            return;
        }
        let rdma = rdma_asked && resp.headers().contains_key(REPLY_HEADER);
        let (path, moved) = if rdma {
            ("rdma", header_u64(resp.headers(), BYTES_HEADER))
        } else if matches!(op, "put" | "upload_part") {
            ("http", sent)
        } else {
            ("http", header_u64(resp.headers(), "content-length"))
        };
        match op {
            "get" => self.bytes.with_label_values(&["out", path]).inc_by(moved),
            "put" | "upload_part" => self.bytes.with_label_values(&["in", path]).inc_by(moved),
            _ => {}
        }
    }

    /// Checks an upstream store every [`CHECK_EVERY`] until dropped (and
    /// a directory store once), for `/ready` and `systemctl status`.
    pub async fn check_upstream(self: Arc<Self>) {
        use sluice_telemetry::Endpoints;
        let Backing::Upstream(addr) = self.backing.clone() else {
            sluice_telemetry::notify_status(&self.readiness());
            return;
        };
        loop {
            let r = match tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(&addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
                Err(_) => Err(format!("no connection to {addr} within 3 s")),
            };
            *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            sluice_telemetry::notify_status(&self.readiness());
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }
}

impl sluice_telemetry::Endpoints for GatewayMetrics {
    fn metrics(&self) -> String {
        self.process.render(&self.registry)
    }

    fn readiness(&self) -> Readiness {
        match &self.backing {
            Backing::Directory(buckets) => {
                let missing: Vec<String> =
                    buckets.iter().filter(|b| !b.is_dir()).map(|b| b.display().to_string()).collect();
                if missing.is_empty() {
                    Readiness::ready(format!("store: {} bucket directories present", buckets.len()))
                } else {
                    Readiness::not_ready(format!("store: bucket directories missing: {}", missing.join(", ")))
                }
            }
            Backing::Upstream(addr) => match &*self.upstream.lock().unwrap_or_else(|p| p.into_inner()) {
                None => Readiness::not_ready(format!("upstream {addr}: not checked yet")),
                Some(Ok(())) => Readiness::ready(format!("upstream {addr}: accepts connections")),
                Some(Err(e)) => Readiness::not_ready(format!("upstream: {e}")),
            },
        }
    }
}

/// The S3 service, counted.
#[derive(Clone)]
pub struct Measured {
    pub inner: s3s::service::S3Service,
    pub metrics: Option<Arc<GatewayMetrics>>,
}

type Answer = Result<http::Response<s3s::Body>, s3s::HttpError>;

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Measured {
    type Response = http::Response<s3s::Body>;
    type Error = s3s::HttpError;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let Some(metrics) = self.metrics.clone() else {
            return Box::pin(hyper::service::Service::call(&self.inner, req));
        };
        let op = operation(req.method(), req.uri());
        // aws-chunked bodies: the object's bytes, not the framing.
        let sent = match header_u64(req.headers(), "x-amz-decoded-content-length") {
            0 => header_u64(req.headers(), "content-length"),
            n => n,
        };
        let rdma_asked = req.headers().contains_key(TOKEN_HEADER);
        let start = Instant::now();
        let answer = hyper::service::Service::call(&self.inner, req);
        Box::pin(async move {
            let resp = answer.await;
            if let Ok(r) = &resp {
                metrics.observe(op, rdma_asked, sent, r, start.elapsed());
            }
            resp
        })
    }
}

/// Keeps the open-connections gauge while a connection lives.
pub struct ConnectionGuard(Option<Arc<GatewayMetrics>>);

impl ConnectionGuard {
    pub fn new(metrics: &Option<Arc<GatewayMetrics>>) -> Self {
        if let Some(m) = metrics {
            m.connections.inc();
        }
        Self(metrics.clone())
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Some(m) = &self.0 {
            m.connections.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_from_method_and_query() {
        let op = |m: &str, u: &str| operation(&m.parse().unwrap_or(http::Method::GET), &u.parse().expect("uri"));
        assert_eq!(op("GET", "/data/a/b.bin"), "get");
        assert_eq!(op("GET", "/data/a/b.bin?tagging"), "get_metadata");
        assert_eq!(op("GET", "/data/big?uploadId=x"), "get_metadata");
        assert_eq!(op("GET", "/data?list-type=2&prefix=a"), "list");
        assert_eq!(op("GET", "/data/"), "list");
        assert_eq!(op("HEAD", "/data/k"), "head");
        assert_eq!(op("PUT", "/data/k?partNumber=2&uploadId=x"), "upload_part");
        assert_eq!(op("PUT", "/data/k"), "put");
        assert_eq!(op("POST", "/data/k?uploads"), "create_multipart");
        assert_eq!(op("POST", "/data/k?uploadId=x"), "complete_multipart");
        assert_eq!(op("DELETE", "/data/k?uploadId=x"), "abort_multipart");
        assert_eq!(op("DELETE", "/data/k"), "delete");
        assert_eq!(op("POST", "/data?delete"), "delete_objects");
    }

    #[test]
    fn ready_when_the_buckets_are_there() {
        use sluice_telemetry::Endpoints;
        let dir = tempfile::tempdir().expect("tempdir");
        let m = GatewayMetrics::new(Backing::Directory(vec![dir.path().join("data")])).expect("metrics");
        assert!(!m.readiness().ready);
        std::fs::create_dir(dir.path().join("data")).expect("mkdir");
        assert!(m.readiness().ready, "{:?}", m.readiness());
        assert!(m.metrics().contains("sluice_gateway_open_fds"));
    }
}
