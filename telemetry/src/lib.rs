//! The operations endpoint every Sluice daemon serves on its
//! `metrics_listen` address: `GET /metrics` (Prometheus text) and
//! `GET /ready` (200 when the daemon can serve, 503 with the reason when it
//! cannot), for Prometheus, the packaged units and the pod's probes.

#![forbid(unsafe_code)]

mod daemon;
pub use daemon::{init_logging, shutdown_signal};

/// Line and column (from 1) of byte `at` of a config file's `text`: where a
/// parse error is, for an error that is logged and must not quote the line
/// (it may hold an inline secret).
pub fn line_and_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..at.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
    (line, column)
}

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Whether a daemon can serve, and why (a line per thing checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub detail: String,
}

impl Readiness {
    pub fn ready(detail: impl Into<String>) -> Self {
        Self { ready: true, detail: detail.into() }
    }
    pub fn not_ready(detail: impl Into<String>) -> Self {
        Self { ready: false, detail: detail.into() }
    }
}

impl Readiness {
    /// One line for `systemctl status`: the verdict and the first reason.
    pub fn summary(&self) -> String {
        let first = self.detail.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        format!("{}{}{first}", if self.ready { "ready" } else { "not ready" }, if first.is_empty() { "" } else { ": " })
    }
}

/// Tells systemd (a `Type=notify` unit) that the daemon is up: its
/// listeners are bound. Nothing happens outside systemd.
pub fn notify_ready() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::debug!(error = %e, "sd_notify READY failed");
    }
}

/// Puts the daemon's readiness in `systemctl status` (STATUS=); called by
/// the daemons' background checks whenever they finish one.
pub fn notify_status(r: &Readiness) {
    let line = r.summary();
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&line)]) {
        tracing::debug!(error = %e, "sd_notify STATUS failed");
    }
}

/// What a daemon exposes.
pub trait Endpoints: Send + Sync + 'static {
    /// The Prometheus text exposition of its metrics.
    fn metrics(&self) -> String;
    /// Whether it can serve now.
    fn readiness(&self) -> Readiness;
}

/// Open descriptors and resident bytes of this process (0 where /proc is
/// unreadable).
pub fn process_usage() -> (i64, i64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64);
    // "VmRSS:    12345 kB" (in kB whatever the page size).
    let rss_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.split_whitespace().next()?.parse().ok()))
        })
        .unwrap_or(0i64);
    (fds, rss_kb * 1024)
}

/// This process's open descriptors and resident memory as the gauges
/// `open_fds` and `resident_bytes` of a daemon's registry, read from /proc
/// at each scrape.
pub struct ProcessGauges {
    open_fds: prometheus::IntGauge,
    resident_bytes: prometheus::IntGauge,
}

impl ProcessGauges {
    /// Registers both gauges; `process` names the daemon in their help.
    pub fn register(registry: &prometheus::Registry, process: &str) -> Result<Self, prometheus::Error> {
        let open_fds = prometheus::IntGauge::new("open_fds", format!("Open file descriptors of the {process}"))?;
        let resident_bytes = prometheus::IntGauge::new("resident_bytes", format!("Resident memory of the {process}"))?;
        registry.register(Box::new(open_fds.clone()))?;
        registry.register(Box::new(resident_bytes.clone()))?;
        Ok(Self { open_fds, resident_bytes })
    }

    /// Reads the process's usage into the gauges, then renders `registry`.
    pub fn render(&self, registry: &prometheus::Registry) -> String {
        let (fds, rss) = process_usage();
        self.open_fds.set(fds);
        self.resident_bytes.set(rss);
        render(registry)
    }
}

/// The text exposition of `registry`.
pub fn render(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap_or_else(|e| format!("# encode error: {e}\n"))
}

/// How long a scraper may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

fn answer(endpoints: &dyn Endpoints, path: &str) -> hyper::Response<Full<Bytes>> {
    let r = match path {
        "/metrics" => hyper::Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(endpoints.metrics()))),
        "/ready" => {
            let r = endpoints.readiness();
            let line = format!("{}\n{}\n", if r.ready { "ready" } else { "not ready" }, r.detail.trim_end());
            hyper::Response::builder()
                .status(if r.ready { 200 } else { 503 })
                .header("content-type", "text/plain")
                .body(Full::new(Bytes::from(line)))
        }
        _ => hyper::Response::builder().status(404).body(Full::new(Bytes::from_static(b"try /metrics or /ready\n"))),
    };
    r.unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// Serves `/metrics` and `/ready` on `listener` until the task is dropped.
pub async fn serve(endpoints: Arc<dyn Endpoints>, listener: TcpListener) {
    serve_with_deadline(endpoints, listener, HEADER_TIMEOUT).await
}

/// [`serve`], with the deadline a connection has to send a request's headers
/// (the first and every later one on a kept-alive connection).
async fn serve_with_deadline(endpoints: Arc<dyn Endpoints>, listener: TcpListener, header_timeout: Duration) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "operations endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let resp = answer(&*endpoints, req.uri().path());
                async move { Ok::<_, Infallible>(resp) }
            });
            // A connection that never finishes its headers is dropped.
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(bool);
    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "x_total 1\n".into()
        }
        fn readiness(&self) -> Readiness {
            Readiness { ready: self.0, detail: "store: ok".into() }
        }
    }

    #[test]
    fn paths() {
        assert_eq!(answer(&Fixed(true), "/ready").status(), 200);
        assert_eq!(answer(&Fixed(false), "/ready").status(), 503);
        assert_eq!(answer(&Fixed(true), "/metrics").status(), 200);
        assert_eq!(answer(&Fixed(true), "/other").status(), 404);
        let (fds, _) = process_usage();
        assert!(fds > 0);
    }

    /// A scraper that connects and says nothing, or keeps its connection
    /// idle after a request, is dropped by the deadline; others are served
    /// meanwhile.
    #[tokio::test]
    async fn silent_and_idle_scrapers_are_dropped_at_the_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let deadline = Duration::from_millis(300);
        let server = tokio::spawn(serve_with_deadline(Arc::new(Fixed(true)), listener, deadline));
        let mut silent = Vec::new();
        for _ in 0..5 {
            silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }

        // Served while the silent ones hold their connections.
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
        let mut buf = vec![0u8; 4096];
        let n = idle.read(&mut buf).await.expect("read");
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 200") && head.contains("x_total 1"), "{head}");

        // Every one of them is closed (EOF) well within a few deadlines.
        for mut s in silent.into_iter().chain([idle]) {
            let r = tokio::time::timeout(deadline * 10, s.read(&mut buf)).await;
            assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "connection still open after {:?}: {r:?}", deadline * 10);
        }
        server.abort();
    }

    #[test]
    fn the_status_line_is_the_verdict_and_the_first_reason() {
        assert_eq!(
            Readiness::not_ready("\nalpha/data: store down\nbeta/x: ok").summary(),
            "not ready: alpha/data: store down"
        );
        assert_eq!(Readiness::ready("").summary(), "ready");
    }
}
