//! The Sluice storage-side gateway: an S3 server (built on `s3s`) in front of
//! a local directory ([`store`]) or another S3 endpoint (`upstream`), with
//! SigV4 verification always on and the S3-over-RDMA token data path
//! ([`token_path`]), over HTTP or, with `[tls]`, HTTPS ([`tls`]).
//!
//! It is Sluice's embedded default store and the peer that the agent's data
//! paths are tested against.

#![forbid(unsafe_code)]

mod backend_errors;
mod conn_limits;
pub mod expiry;
pub mod front;
pub mod metrics;
pub mod store;
pub mod tls;
pub mod token_path;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use serde::Deserialize;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// Errors raised while configuring or starting the gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error("reading config {path}: {source}")]
    ReadConfig { path: PathBuf, source: std::io::Error },
    /// toml's message and where, never its quote of the line (which may
    /// hold an inline secret; this error is logged).
    #[error("parsing config {path}: {message} (line {line}, column {column})")]
    ParseConfig { path: PathBuf, message: String, line: usize, column: usize },
    #[error("invalid config: {0}")]
    Invalid(String),
    #[error("preparing data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("opening the file store: {0}")]
    Store(String),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("writing the bound address to {path}: {source}")]
    AddrFile { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// One access key the gateway accepts.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("access_key", &self.access_key).field("secret_key", &"<redacted>").finish()
    }
}

/// Gateway configuration (TOML; see `deploy/gateway.example.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to serve S3 on. Port 0 picks a free port.
    pub listen: SocketAddr,
    /// Directory holding one sub-directory per bucket.
    pub data_dir: PathBuf,
    /// Buckets created at start-up if missing.
    #[serde(default)]
    pub buckets: Vec<String>,
    /// Accepted access keys. At least one: SigV4 verification is always on.
    pub credentials: Vec<Credential>,
    /// If set, the bound address (`host:port`) is written here once listening.
    #[serde(default)]
    pub addr_file: Option<PathBuf>,
    /// The S3-over-RDMA data path.
    #[serde(default)]
    pub rdma: RdmaConfig,
    /// What the gateway serves: its local directory (default) or another S3
    /// endpoint, which thereby gains an RDMA data path.
    #[serde(default)]
    pub backend: BackendConfig,
    /// A connection that does not finish sending a request's headers within
    /// this time (including an idle keep-alive connection) is closed, so
    /// idle or trickling clients cannot pile up. With `[tls]`, the same
    /// limit holds for the TLS handshake before it.
    #[serde(default = "default_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// A connection on which nothing moves either way for this long is
    /// closed: a client that stopped sending the body it announced, or
    /// stopped reading its response. Longer than `[rdma]
    /// transfer_timeout_ms`, because a request served over RDMA sends
    /// nothing on its connection until the transfer is done.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Most client connections open at once; more wait to be accepted.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Incomplete multipart uploads (directory backend).
    #[serde(default)]
    pub multipart: MultipartConfig,
    /// The operations endpoint: `/metrics` (Prometheus) and `/ready` (the
    /// bucket directories are there, or the upstream store accepts
    /// connections). Off when absent.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// `[tls]`: serve HTTPS on `listen` with this certificate and key;
    /// absent, plain HTTP.
    #[serde(default)]
    pub tls: tls::TlsConfig,
}

fn default_header_timeout_ms() -> u64 {
    10_000
}

fn default_idle_timeout_ms() -> u64 {
    120_000
}

fn default_max_connections() -> usize {
    4096
}

/// `[multipart]`: what happens to uploads nobody completes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultipartConfig {
    /// An incomplete upload with no activity for this long is removed with
    /// its parts (checked at start and every `sweep_every_secs`), like S3's
    /// AbortIncompleteMultipartUpload lifecycle rule.
    pub expire_after_secs: u64,
    /// How often to look for expired uploads.
    pub sweep_every_secs: u64,
}

impl Default for MultipartConfig {
    fn default() -> Self {
        Self { expire_after_secs: 24 * 3600, sweep_every_secs: 600 }
    }
}

/// The store behind the gateway.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum BackendConfig {
    /// Objects are files under `data_dir/<bucket>/`.
    #[default]
    Directory,
    /// Proxy to another S3 endpoint; bucket names pass through.
    Upstream {
        endpoint: String,
        #[serde(default = "default_region")]
        region: String,
        access_key: String,
        #[serde(default)]
        secret_key: Option<String>,
        #[serde(default)]
        secret_key_file: Option<PathBuf>,
    },
}

fn default_region() -> String {
    "us-east-1".into()
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Directory => f.write_str("Directory"),
            Self::Upstream { endpoint, region, access_key, .. } => f
                .debug_struct("Upstream")
                .field("endpoint", endpoint)
                .field("region", region)
                .field("access_key", access_key)
                .finish_non_exhaustive(),
        }
    }
}

/// Which one-sided transports the gateway serves for `x-amz-rdma-token`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RdmaConfig {
    /// Serve Sluice's `tcp` software transport.
    pub tcp: bool,
    /// Largest single one-sided operation; transfers are split into pieces
    /// of at most this size (the protocol's limit is 1 GiB).
    pub max_op_bytes: u64,
    /// Serve the verbs RC transport (needs an RDMA device on this machine).
    pub verbs: bool,
    /// Serve standard tokens through mlx5 DC (`[rdma.dc]`); absent, they are
    /// declined with 501 so clients fall back.
    pub dc: Option<DcConfig>,
    /// Networks (CIDR) a token's owner address may be in. The gateway moves
    /// bytes to and from the address a token names, so only the networks
    /// where Sluice agents live belong here; default loopback only.
    pub allowed_clients: Vec<String>,
    /// Longest one one-sided transfer may take; then the request ends with
    /// 500 RDMATransferFailed (an owner that accepted and went silent).
    pub transfer_timeout_ms: u64,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            tcp: true,
            max_op_bytes: sluice_dataplane::MAX_OP_BYTES,
            verbs: false,
            dc: None,
            allowed_clients: vec!["127.0.0.0/8".into(), "::1/128".into()],
            transfer_timeout_ms: 60_000,
        }
    }
}

impl RdmaConfig {
    /// `allowed_clients`, parsed.
    pub fn allowed_networks(&self) -> Result<Vec<ipnet::IpNet>, GatewayError> {
        self.allowed_clients
            .iter()
            .map(|c| {
                c.parse::<ipnet::IpNet>().or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from)).map_err(
                    |_| {
                        GatewayError::Invalid(format!(
                            "[rdma] allowed_clients: {c:?} is not an address or CIDR network"
                        ))
                    },
                )
            })
            .collect()
    }
}

/// The mlx5 device the gateway's DC initiator runs on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcConfig {
    /// Verbs device name, e.g. "mlx5_0".
    pub device: String,
    /// Port, 1-based.
    #[serde(default = "one")]
    pub port: u8,
    /// Source GID index; absent picks the RoCE v2 entry with an IPv4 address.
    #[serde(default)]
    pub gid_index: Option<u8>,
    /// DC access key, the same on every peer (peers default to 0xffeeddcc).
    #[serde(default = "default_dc_key")]
    pub key: u64,
}

fn one() -> u8 {
    1
}

fn default_dc_key() -> u64 {
    sluice_dataplane::dc::DEFAULT_DC_KEY
}

impl DcConfig {
    fn settings(&self) -> sluice_dataplane::dc::DcSettings {
        sluice_dataplane::dc::DcSettings {
            device: self.device.clone(),
            port: self.port,
            gid_index: self.gid_index,
            key: self.key,
        }
    }
}

/// Wraps `inner` with the RDMA data path the config asks for. A configured
/// DC device that cannot do DC is a startup error, not a silent 501.
fn with_rdma<S: s3s::S3>(
    inner: S,
    cfg: &RdmaConfig,
    local: Option<std::sync::Arc<store::DirStore>>,
) -> Result<front::Front<S>, GatewayError> {
    let mut g = front::Front::new(inner, cfg.tcp, cfg.max_op_bytes, local)
        .with_limits(cfg.allowed_networks()?, std::time::Duration::from_millis(cfg.transfer_timeout_ms));
    if cfg.verbs {
        g = g.with_verbs();
    }
    if let Some(dc) = &cfg.dc {
        let remote = sluice_dataplane::dc::DcDevice::open(&dc.settings())
            .and_then(|d| d.remote())
            .map_err(|e| GatewayError::Invalid(format!("[rdma.dc] on {:?}: {e}", dc.device)))?;
        info!(device = %dc.device, port = dc.port, "serving standard tokens through mlx5 DC");
        g = g.with_dc(remote);
    }
    Ok(g)
}

impl GatewayConfig {
    /// Reads and validates a TOML config file.
    pub fn from_file(path: &Path) -> Result<Self, GatewayError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| GatewayError::ReadConfig { path: path.to_owned(), source })?;
        let mut cfg: Self = toml::from_str(&text).map_err(|e: toml::de::Error| {
            let (line, column) = sluice_telemetry::line_and_column(&text, e.span().map_or(0, |s| s.start));
            GatewayError::ParseConfig { path: path.to_owned(), message: e.message().to_owned(), line, column }
        })?;
        cfg.tls.resolve(path.parent().unwrap_or(Path::new(".")));
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.credentials.is_empty() {
            return Err(GatewayError::Invalid(
                "at least one [[credentials]] entry is required (SigV4 verification is always on)".into(),
            ));
        }
        for c in &self.credentials {
            if c.access_key.is_empty() || c.secret_key.is_empty() {
                return Err(GatewayError::Invalid("credentials need a non-empty access_key and secret_key".into()));
            }
        }
        for b in &self.buckets {
            store::keys::check_bucket(b).map_err(|e| GatewayError::Invalid(e.to_string()))?;
        }
        self.rdma.allowed_networks()?;
        if self.rdma.transfer_timeout_ms == 0 {
            return Err(GatewayError::Invalid("[rdma] transfer_timeout_ms must be > 0".into()));
        }
        if self.header_timeout_ms == 0 {
            return Err(GatewayError::Invalid("header_timeout_ms must be > 0".into()));
        }
        if self.idle_timeout_ms <= self.rdma.transfer_timeout_ms {
            return Err(GatewayError::Invalid(format!(
                "idle_timeout_ms ({}) must be longer than [rdma] transfer_timeout_ms ({}): a request served \
                 over RDMA sends nothing on its connection until its transfer ends",
                self.idle_timeout_ms, self.rdma.transfer_timeout_ms
            )));
        }
        if self.max_connections == 0 {
            return Err(GatewayError::Invalid("max_connections must be > 0".into()));
        }
        if self.multipart.expire_after_secs == 0 || self.multipart.sweep_every_secs == 0 {
            return Err(GatewayError::Invalid("[multipart] expire_after_secs and sweep_every_secs must be > 0".into()));
        }
        self.tls.validate()?;
        Ok(())
    }
}

/// A bound, ready-to-serve gateway.
pub struct Gateway {
    listener: TcpListener,
    service: metrics::Measured,
    /// The operations endpoint, when `metrics_listen` is set.
    ops: Option<(TcpListener, std::sync::Arc<metrics::GatewayMetrics>)>,
    header_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
    max_connections: usize,
    /// HTTPS, when `[tls]` is configured.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The directory store's root and the expiry settings (none upstream:
    /// an S3 store expires uploads with its own lifecycle rules).
    sweep: Option<(PathBuf, MultipartConfig)>,
}

impl Gateway {
    /// Prepares the store and binds the listener (so the address is known
    /// before serving starts).
    pub async fn bind(cfg: &GatewayConfig) -> Result<Self, GatewayError> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|source| GatewayError::DataDir { path: cfg.data_dir.clone(), source })?;
        for b in &cfg.buckets {
            let dir = cfg.data_dir.join(b);
            std::fs::create_dir_all(&dir).map_err(|source| GatewayError::DataDir { path: dir, source })?;
        }
        let mut keys = SimpleAuth::new();
        for c in &cfg.credentials {
            keys.register(c.access_key.clone(), c.secret_key.clone().into());
        }
        let auth = store::Auth(keys);
        if cfg.rdma.max_op_bytes == 0 || cfg.rdma.max_op_bytes > sluice_dataplane::MAX_OP_BYTES {
            return Err(GatewayError::Invalid("rdma.max_op_bytes must be between 1 and 1 GiB".into()));
        }
        let mut sweep = None;
        let service = match &cfg.backend {
            BackendConfig::Directory => {
                let dir = std::sync::Arc::new(
                    store::DirStore::open(&cfg.data_dir).map_err(|e| GatewayError::Store(e.to_string()))?,
                );
                sweep = Some((dir.uploads_dir(), cfg.multipart.clone()));
                let mut b = S3ServiceBuilder::new(with_rdma(store::Store(dir.clone()), &cfg.rdma, Some(dir))?);
                b.set_auth(auth);
                b.build()
            }
            BackendConfig::Upstream { endpoint, region, access_key, secret_key, secret_key_file } => {
                let secret = match (secret_key, secret_key_file) {
                    (Some(s), _) => s.clone(),
                    (None, Some(p)) => std::fs::read_to_string(p)
                        .map(|s| s.trim().to_owned())
                        .map_err(|source| GatewayError::ReadConfig { path: p.clone(), source })?,
                    (None, None) => {
                        return Err(GatewayError::Invalid("backend: set secret_key or secret_key_file".into()))
                    }
                };
                let proxy = upstream::proxy(endpoint, region, access_key, &secret)?;
                let mut b = S3ServiceBuilder::new(with_rdma(proxy, &cfg.rdma, None)?);
                b.set_auth(auth);
                b.build()
            }
        };

        let ops = match cfg.metrics_listen {
            None => None,
            Some(addr) => {
                let backing = match &cfg.backend {
                    BackendConfig::Directory => {
                        metrics::Backing::Directory(cfg.buckets.iter().map(|b| cfg.data_dir.join(b)).collect())
                    }
                    BackendConfig::Upstream { endpoint, .. } => metrics::Backing::Upstream(host_port(endpoint)),
                };
                let m = std::sync::Arc::new(metrics::GatewayMetrics::new(backing)?);
                let l = TcpListener::bind(addr).await.map_err(|source| GatewayError::Bind { addr, source })?;
                info!(addr = %l.local_addr().map_err(|source| GatewayError::Bind { addr, source })?,
                      "operations endpoint (/metrics, /ready)");
                Some((l, m))
            }
        };
        let service = metrics::Measured { inner: service, metrics: ops.as_ref().map(|(_, m)| m.clone()) };
        // Certificate and key are checked before the port is taken.
        let tls = cfg.tls.acceptor()?;
        let listener =
            TcpListener::bind(cfg.listen).await.map_err(|source| GatewayError::Bind { addr: cfg.listen, source })?;
        let local = listener.local_addr().map_err(|source| GatewayError::Bind { addr: cfg.listen, source })?;
        if let Some(path) = &cfg.addr_file {
            write_atomically(path, &local.to_string())
                .map_err(|source| GatewayError::AddrFile { path: path.clone(), source })?;
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        info!(addr = %local, url = %format_args!("{scheme}://{local}"), data_dir = %cfg.data_dir.display(),
              buckets = ?cfg.buckets, backend = ?cfg.backend, rdma_tcp = cfg.rdma.tcp, "gateway listening");
        let header_timeout = std::time::Duration::from_millis(cfg.header_timeout_ms);
        let idle_timeout = std::time::Duration::from_millis(cfg.idle_timeout_ms);
        let max_connections = cfg.max_connections;
        Ok(Self { listener, service, ops, header_timeout, idle_timeout, max_connections, tls, sweep })
    }

    /// The address the gateway is listening on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then drains connections (up to 10 s).
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let ops = self.ops.map(|(listener, m)| {
            let endpoints: std::sync::Arc<dyn sluice_telemetry::Endpoints> = m.clone();
            (tokio::spawn(sluice_telemetry::serve(endpoints, listener)), tokio::spawn(m.check_upstream()))
        });
        let sweeper = self.sweep.clone().map(|(root, m)| {
            let (expire, every) = (Duration::from_secs(m.expire_after_secs), Duration::from_secs(m.sweep_every_secs));
            tokio::spawn(expiry::run(root, expire, every))
        });
        // HTTP/1 only (S3 clients speak it): every connection is then under
        // the header deadline from its first byte, where protocol detection
        // would wait for a preface without one.
        let mut http = ConnBuilder::new(TokioExecutor::new()).http1_only();
        http.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(self.header_timeout);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut admission = conn_limits::Admission::new(self.max_connections);
        sluice_telemetry::notify_ready();
        loop {
            let place = tokio::select! {
                place = admission.place() => place,
                () = shutdown.as_mut() => break,
            };
            let (socket, peer) = tokio::select! {
                res = self.listener.accept() => match res {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        // Out of descriptors, typically: a pause instead
                        // of a busy loop.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
                () = shutdown.as_mut() => break,
            };
            let _ = socket.set_nodelay(true);
            let open = (metrics::ConnectionGuard::new(&self.service.metrics), place);
            let socket = conn_limits::Idle::new(socket, self.idle_timeout);
            let Some(acceptor) = &self.tls else {
                let conn = http.serve_connection(TokioIo::new(socket), self.service.clone());
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    let _ = conn.await;
                    drop(open);
                });
                continue;
            };
            // The handshake runs in the connection's task, under the header
            // deadline, so a slow or silent client holds up no other.
            let (acceptor, http, service, watcher) =
                (acceptor.clone(), http.clone(), self.service.clone(), graceful.watcher());
            let deadline = self.header_timeout;
            tokio::spawn(async move {
                let _open = open;
                let tls = match tokio::time::timeout(deadline, acceptor.accept(socket)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return warn!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => return warn!(%peer, "TLS handshake timed out"),
                };
                let _ = watcher.watch(http.serve_connection(TokioIo::new(tls), service).into_owned()).await;
            });
        }
        info!("gateway shutting down");
        if let Some(s) = sweeper {
            s.abort();
        }
        if let Some((serve, check)) = ops {
            serve.abort();
            check.abort();
        }
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(10)) => warn!("connections still open after 10 s; closing"),
        }
    }
}

/// `host:port` of an endpoint URL (`http://h:p/...`), for connection checks.
fn host_port(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
    let authority = rest.split('/').next().unwrap_or(rest);
    let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    match (has_port, scheme) {
        (true, _) => authority.to_owned(),
        (false, "https") => format!("{authority}:443"),
        (false, _) => format!("{authority}:80"),
    }
}

/// Writes `contents` to `path` via a temporary file and rename, so a reader
/// polling for the file never sees it half-written.
pub fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_endpoints_to_host_and_port() {
        assert_eq!(host_port("http://10.0.0.5:9000"), "10.0.0.5:9000");
        assert_eq!(host_port("https://s3.example.com/"), "s3.example.com:443");
        assert_eq!(host_port("http://minio"), "minio:80");
    }

    #[test]
    fn config_requires_credentials() {
        let cfg: GatewayConfig = toml::from_str(
            r#"listen = "127.0.0.1:0"
data_dir = "/tmp/x"
credentials = []"#,
        )
        .unwrap();
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn example_config_and_backends_parse() {
        let cfg: GatewayConfig = toml::from_str(include_str!("../../deploy/gateway.example.toml")).unwrap();
        cfg.validate().unwrap();
        assert!(matches!(cfg.backend, BackendConfig::Directory));
        assert!(cfg.rdma.tcp);
        let up: GatewayConfig = toml::from_str(
            r#"listen = "127.0.0.1:0"
data_dir = "/tmp/x"
[[credentials]]
access_key = "a"
secret_key = "b"
[backend]
kind = "upstream"
endpoint = "http://127.0.0.1:1"
access_key = "u"
secret_key = "SECRET"
"#,
        )
        .unwrap();
        assert!(matches!(up.backend, BackendConfig::Upstream { .. }));
        assert!(!format!("{:?}", up.backend).contains("SECRET"));
        let bad = toml::from_str::<GatewayConfig>(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"/x\"\ncredentials = []\n[backend]\nkind = \"ftp\"\n",
        );
        assert!(bad.is_err());
    }

    /// A DC device that is absent (or cannot do DC) stops the gateway with
    /// an error naming the section, never a silent 501 for every token.
    #[tokio::test]
    async fn dc_without_a_dc_device_is_a_startup_error() {
        let dir = tempfile::tempdir().unwrap();
        let cfg: GatewayConfig = toml::from_str(&format!(
            r#"listen = "127.0.0.1:0"
data_dir = "{}"
[[credentials]]
access_key = "a"
secret_key = "b"
[rdma.dc]
device = "mlx5_0"
key = 0xffeeddcc
"#,
            dir.path().display()
        ))
        .unwrap();
        let dc = cfg.rdma.dc.as_ref().unwrap();
        assert_eq!((dc.port, dc.gid_index, dc.key), (1, None, 0xffee_ddcc));
        let err = Gateway::bind(&cfg).await.err().expect("no mlx5 device here");
        let msg = err.to_string();
        assert!(msg.contains("[rdma.dc]") && msg.contains("mlx5_0"), "{msg}");
    }

    #[test]
    fn credential_debug_redacts_secret() {
        let c = Credential { access_key: "AK".into(), secret_key: "SECRET".into() };
        assert!(!format!("{c:?}").contains("SECRET"));
    }
}
