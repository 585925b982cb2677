//! Agent configuration (TOML). See `deploy/agent.example.toml` for a
//! commented example. Credentials live only here (or in files this names);
//! nothing in it is ever sent to the host.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_crypt::EncryptionPolicy;
use sluice_dataplane::transport::TransportKind;

pub mod failover;
pub mod uploads;

pub use crate::model::{DataPathMode, Permission, Placement};

/// Errors reading or validating the config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing {path}: {source}")]
    Parse { path: PathBuf, source: toml::de::Error },
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// gRPC control plane on TCP (the DPU's address). Port 0 picks one.
    #[serde(default)]
    pub grpc_listen: Option<SocketAddr>,
    /// gRPC control plane on a Unix socket (co-located mode).
    #[serde(default)]
    pub grpc_socket: Option<PathBuf>,
    /// Unix socket where a co-located shim hands over region memfds.
    pub memory_socket: PathBuf,
    /// Permission bits of `grpc_socket` and `memory_socket` (octal in TOML:
    /// 0o660): only the shim's user or group should reach them.
    #[serde(default = "default_socket_mode")]
    pub socket_mode: u32,
    /// Prometheus metrics (`GET /metrics`). Port 0 picks one.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// If set, a small TOML file with the bound addresses is written here.
    #[serde(default)]
    pub addr_file: Option<PathBuf>,
    #[serde(default)]
    pub s3: S3Tuning,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub dataplane: DataplaneConfig,
    /// How host regions are reached (`[host_memory]`): co-located memfds
    /// (default) or DOCA exports on a BlueField.
    #[serde(default)]
    pub host_memory: crate::hostmem::HostMemoryConfig,
    /// Agent-wide settings of the per-tenant QoS layer (`[qos]`).
    #[serde(default)]
    pub qos: QosSettings,
    /// Master keys for namespaces with `encryption = "aes-256-gcm"`.
    #[serde(default)]
    pub encryption: EncryptionConfig,
    /// Named S3 credentials, referenced by namespaces.
    #[serde(default)]
    pub credentials: BTreeMap<String, CredentialConfig>,
    pub tenants: Vec<TenantConfig>,
    /// `[nic]`: isolate tenants at the NIC (Open vSwitch rules); absent: no
    /// rules are installed.
    #[serde(default)]
    pub nic: Option<crate::nic::config::NicConfig>,
    /// `[tls]`: mutual TLS on the TCP gRPC listeners (or `insecure = true`).
    #[serde(default)]
    pub tls: crate::tls::TlsConfig,
    /// State kept across restarts (the upload journal, `config::uploads`);
    /// default `/var/lib/sluice/agent`. Relative to this file.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// `[uploads]`: uploads left by a killed agent (`config::uploads`).
    #[serde(default)]
    pub uploads: uploads::UploadsConfig,
    /// `[failover]`: endpoint health and deadlines (`config::failover`).
    #[serde(default)]
    pub failover: failover::FailoverConfig,
}

fn default_socket_mode() -> u32 {
    0o660
}

/// Per-session resource limits and the lease that reclaims dead shims'
/// sessions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Most regions a session may hold.
    pub max_regions_per_session: usize,
    /// Most bytes of memory a session may register.
    pub max_registered_bytes_per_session: u64,
    /// A session that no call and no Renew names for this long belongs to
    /// a shim that died: it is closed and its regions are released. Live
    /// shims renew every third of it.
    pub session_lease_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_regions_per_session: 4096, max_registered_bytes_per_session: 64 << 30, session_lease_ms: 15_000 }
    }
}

/// A namespace's request deadline when its config does not set one.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Agent-wide QoS settings: the fair transfer scheduler shared by all
/// tenants. Fixed at startup (a reload only changes per-tenant limits).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QosSettings {
    /// Transfers in flight across all tenants; when they are all taken,
    /// tenants are served by weighted deficit round robin (cost = bytes).
    pub global_slots: usize,
    /// How long a request waits for in-flight budget or a transfer slot
    /// before it is refused (QUOTA_EXCEEDED).
    pub queue_timeout_ms: u64,
}

impl Default for QosSettings {
    fn default() -> Self {
        Self { global_slots: 64, queue_timeout_ms: 30_000 }
    }
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

/// How the agent talks to S3.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Tuning {
    /// GETs larger than this are split into ranged GETs of this size.
    pub get_part_size: u64,
    /// PUTs larger than this use multipart upload.
    pub multipart_threshold: u64,
    /// Part size for multipart upload (S3 minimum: 5 MiB except the last).
    pub put_part_size: u64,
    /// Ranged GETs / parts in flight per request.
    pub max_concurrency: usize,
    /// Attempts per S3 request (1 = no retry). Only 5xx, throttling and
    /// connection errors are retried; 4xx never are.
    pub max_attempts: u32,
    /// First retry delay; doubles each attempt (with jitter).
    pub retry_base_ms: u64,
    /// Connect timeout.
    pub connect_timeout_ms: u64,
    /// Longest silence on a connection before the request fails.
    pub read_timeout_ms: u64,
}

impl Default for S3Tuning {
    fn default() -> Self {
        Self {
            get_part_size: 8 << 20,
            multipart_threshold: 16 << 20,
            put_part_size: 8 << 20,
            max_concurrency: 8,
            max_attempts: 4,
            retry_base_ms: 50,
            connect_timeout_ms: 3000,
            read_timeout_ms: 30_000,
        }
    }
}

/// An S3 access key; the secret comes inline or from a file (preferred).
/// Temporary credentials (STS) add their session token, also inline or
/// from a file; all of them are read again on SIGHUP.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub access_key: String,
    #[serde(default)]
    pub secret_key: Option<String>,
    #[serde(default)]
    pub secret_key_file: Option<PathBuf>,
    #[serde(default)]
    pub session_token: Option<String>,
    #[serde(default)]
    pub session_token_file: Option<PathBuf>,
}

impl std::fmt::Debug for CredentialConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialConfig")
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<redacted>"))
            .field("secret_key_file", &self.secret_key_file)
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .field("session_token_file", &self.session_token_file)
            .finish()
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// The name the tenant uses (`name/key`).
    pub name: String,
    /// One or more S3 endpoints (`http://host:port`) serving the same data.
    pub endpoints: Vec<String>,
    /// PEM CA certificate(s) trusted for the https:// endpoints besides the
    /// built-in and system roots (`s3::store_tls`); relative to this file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    pub bucket: String,
    /// Prepended to every key; lets tenants share a bucket without overlap.
    #[serde(default)]
    pub prefix: String,
    #[serde(default = "default_region")]
    pub region: String,
    /// Name of an entry in `[credentials]`.
    pub credentials: String,
    /// How object bytes move: `http` (the body), `rdma` (x-amz-rdma-token on
    /// every GET part and PUT), or `auto` (RDMA for parts of at least
    /// `rdma_min_bytes`, HTTP below; the first GET part, which learns the
    /// object's size, goes over HTTP). RDMA falls back to HTTP loudly.
    #[serde(default)]
    pub data_path: DataPathMode,
    /// The one-sided transport the endpoints serve: `tcp` (software),
    /// `verbs-rc` (RDMA reliable connections, needs `[dataplane]
    /// verbs_listen`) or `dc` (mlx5 DC, the standard token; needs
    /// `[dataplane.dc]`). Tokens are only ever sent to endpoints configured
    /// for their transport.
    #[serde(default, deserialize_with = "from_name")]
    pub transport: TransportKind,
    /// `direct`: the store writes into / reads from the host region itself.
    /// `staged`: through an agent-side buffer, copied into the region after
    /// each part (encrypted namespaces never use RDMA; they are staged over
    /// HTTP, where the agent decrypts).
    #[serde(default)]
    pub placement: Placement,
    /// In `auto` mode, parts smaller than this go over HTTP.
    #[serde(default = "default_rdma_min")]
    pub rdma_min_bytes: u64,
    /// What the tenant may do here: any of "read", "write", "list", "delete".
    #[serde(default = "all_permissions")]
    pub access: Vec<Permission>,
    /// `none` (default) or `aes-256-gcm`: the agent encrypts on PUT and
    /// decrypts on GET under the tenant's master key; bytes then pass
    /// through the agent (staged, over HTTP). See docs/encryption-format.md.
    #[serde(default, deserialize_with = "from_name")]
    pub encryption: EncryptionPolicy,
    /// Plaintext bytes per sealed chunk for new objects (power of two,
    /// 4 KiB..16 MiB). Ranged GETs decrypt whole chunks.
    #[serde(default = "default_encryption_chunk")]
    pub encryption_chunk_bytes: u32,
    /// End-to-end deadline of a request in this namespace, and the most a
    /// caller may ask for (callers may ask for less). A request past it is
    /// cancelled and fails with DEADLINE_EXCEEDED.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Check whole-object GETs against the object's CRC64NVME (the store's,
    /// and the one the agent keeps in the object's metadata: see
    /// docs/integrity.md): damaged bytes fail with INTEGRITY. HTTP parts
    /// are summed as they stream; RDMA parts are read back once.
    #[serde(default = "yes")]
    pub verify_checksums: bool,
}

fn yes() -> bool {
    true
}

fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT.as_millis() as u64
}

fn default_encryption_chunk() -> u32 {
    sluice_crypt::DEFAULT_CHUNK_SIZE
}

/// Where tenants' master keys live.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionConfig {
    /// Directory with one subdirectory per tenant holding key files (64 hex
    /// characters, mode 0600, named by key id) and a `current` file naming
    /// the key for new objects. Rotation: add a key, point `current` at it;
    /// old ids stay readable. A key: `head -c 32 /dev/urandom | xxd -p -c 64`.
    pub key_dir: Option<PathBuf>,
    /// Which AES-256-GCM implementation seals and opens chunks: `ring` (the
    /// CPU; default) or `doca` (the BlueField-3 crypto engine; needs an
    /// agent built with the `doca` feature). The stored format is the same.
    #[serde(default)]
    pub engine: CipherEngine,
    /// With `engine = "doca"`: the device (PCI address or `mlx5_N`).
    #[serde(default)]
    pub doca_device: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CipherEngine {
    #[default]
    Ring,
    Doca,
}

fn all_permissions() -> Vec<Permission> {
    vec![Permission::Read, Permission::Write, Permission::List, Permission::Delete]
}

/// A config value by its name (`FromStr`), with the type's own error
/// (which lists the names it knows).
fn from_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let name = String::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

fn default_rdma_min() -> u64 {
    1 << 20
}

/// The agent's side of the one-sided data plane.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataplaneConfig {
    /// Where the `tcp` transport listens for the stores' WRITE/READ
    /// operations. Port 0 picks one.
    pub tcp_listen: std::net::SocketAddr,
    /// Address put in descriptors (default: the bound address).
    pub tcp_advertise: Option<std::net::IpAddr>,
    /// IP address of the RDMA device the verbs RC transport listens on
    /// (rdma_cm); required when a namespace uses `transport = "verbs-rc"`.
    pub verbs_listen: Option<std::net::Ipv4Addr>,
    /// The mlx5 device for `transport = "dc"` namespaces.
    pub dc: Option<DcConfig>,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            tcp_listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            tcp_advertise: None,
            verbs_listen: None,
            dc: None,
        }
    }
}

/// Where the agent's DC targets live (one per tenant, each in the tenant's
/// protection domain).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcConfig {
    /// Verbs device name, e.g. "mlx5_0".
    pub device: String,
    /// Port, 1-based.
    #[serde(default = "default_dc_port")]
    pub port: u8,
    /// Source GID index; absent picks the RoCE v2 entry with an IPv4 address.
    #[serde(default)]
    pub gid_index: Option<u8>,
    /// DC access key, the same on every peer (peers default to 0xffeeddcc).
    #[serde(default = "default_dc_key")]
    pub key: u64,
}

fn default_dc_port() -> u8 {
    1
}

fn default_dc_key() -> u64 {
    sluice_dataplane::dc::DEFAULT_DC_KEY
}

impl DcConfig {
    pub fn settings(&self) -> sluice_dataplane::dc::DcSettings {
        sluice_dataplane::dc::DcSettings {
            device: self.device.clone(),
            port: self.port,
            gid_index: self.gid_index,
            key: self.key,
        }
    }
}

fn default_region() -> String {
    "us-east-1".into()
}

impl AgentConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut cfg: Self = toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source })?;
        // Relative secret files are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        for c in cfg.credentials.values_mut() {
            for f in [&mut c.secret_key_file, &mut c.session_token_file].into_iter().flatten() {
                if f.is_relative() {
                    *f = base.join(&*f);
                }
            }
        }
        if let Some(d) = &mut cfg.encryption.key_dir {
            if d.is_relative() {
                *d = base.join(&*d);
            }
        }
        cfg.tls.resolve(base);
        cfg.state_dir = cfg.state_dir.take().map(|d| base.join(d));
        resolve_ca_files(&mut cfg, base);
        for t in &mut cfg.tenants {
            if t.shim_secret_file.is_relative() {
                t.shim_secret_file = base.join(&t.shim_secret_file);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks cross-references and values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.grpc_listen.is_none() && self.grpc_socket.is_none() {
            return bad("set grpc_listen, grpc_socket, or both".into());
        }
        if self.tenants.is_empty() {
            return bad("no [[tenants]] configured".into());
        }
        let tcp = self.grpc_listen.is_some() || self.tenants.iter().any(|t| t.nic.is_some());
        self.tls.validate(tcp).map_err(ConfigError::Invalid)?;
        if self.socket_mode > 0o777 {
            return bad(format!("socket_mode {:o} is not a permission mode", self.socket_mode));
        }
        self.host_memory.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.failover.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        self.uploads.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.encryption.engine == CipherEngine::Doca && self.encryption.doca_device.is_none() {
            return bad("[encryption] engine = \"doca\" needs doca_device = \"<PCI address or mlx5_N>\"".into());
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tenants {
            if t.name.is_empty() || !seen.insert(&t.name) {
                return bad(format!("tenant names must be unique and non-empty ({:?})", t.name));
            }
            let l = &t.limits;
            if l.bytes_per_sec == Some(0) || l.requests_per_sec == Some(0) || l.weight == 0 {
                return bad(format!(
                    "tenant {:?}: limits: bytes_per_sec and requests_per_sec must be > 0 (omit for unlimited), \
                     weight >= 1",
                    t.name
                ));
            }
            for o in &t.shim_origins {
                if o != "unix" && o.parse::<std::net::IpAddr>().is_err() {
                    return bad(format!("tenant {:?}: shim origin {o:?} is not \"unix\" or an IP address", t.name));
                }
            }
            let mut ns_seen = std::collections::HashSet::new();
            for ns in &t.namespaces {
                if ns.name.is_empty() || ns.name.contains('/') || !ns_seen.insert(&ns.name) {
                    return bad(format!(
                        "tenant {:?}: namespace names must be unique, non-empty, without '/' ({:?})",
                        t.name, ns.name
                    ));
                }
                if ns.endpoints.is_empty() {
                    return bad(format!("namespace {:?}: at least one endpoint", ns.name));
                }
                for e in &ns.endpoints {
                    if !(e.starts_with("http://") || e.starts_with("https://")) {
                        return bad(format!(
                            "namespace {:?}: endpoint {e:?} must start with http:// or https://",
                            ns.name
                        ));
                    }
                }
                if ns.bucket.is_empty() {
                    return bad(format!("namespace {:?}: bucket is empty", ns.name));
                }
                if ns.request_timeout_ms == 0 {
                    return bad(format!("namespace {:?}: request_timeout_ms must be > 0", ns.name));
                }
                if ns.data_path != DataPathMode::Http
                    && ns.transport == TransportKind::Dc
                    && self.dataplane.dc.is_none()
                {
                    return bad(format!("namespace {:?}: transport \"dc\" needs [dataplane.dc]", ns.name));
                }
                if ns.data_path != DataPathMode::Http
                    && ns.transport == TransportKind::VerbsRc
                    && self.dataplane.verbs_listen.is_none()
                {
                    return bad(format!(
                        "namespace {:?}: transport \"verbs-rc\" needs [dataplane] verbs_listen",
                        ns.name
                    ));
                }
                if ns.encryption == EncryptionPolicy::Aes256Gcm && self.encryption.key_dir.is_none() {
                    return bad(format!("namespace {:?}: encryption needs [encryption] key_dir", ns.name));
                }
                if sluice_crypt::check_chunk_size(u64::from(ns.encryption_chunk_bytes)).is_err() {
                    return bad(format!(
                        "namespace {:?}: encryption_chunk_bytes must be a power of two from 4 KiB to 16 MiB",
                        ns.name
                    ));
                }
                if !self.credentials.contains_key(&ns.credentials) {
                    return bad(format!(
                        "namespace {:?}: credentials {:?} not found in [credentials]",
                        ns.name, ns.credentials
                    ));
                }
            }
        }
        for (name, c) in &self.credentials {
            if c.secret_key.is_some() == c.secret_key_file.is_some() {
                return bad(format!("credentials {name:?}: set exactly one of secret_key and secret_key_file"));
            }
            if c.session_token.is_some() && c.session_token_file.is_some() {
                return bad(format!("credentials {name:?}: set at most one of session_token and session_token_file"));
            }
        }
        if self.limits.session_lease_ms < 100 {
            return bad("limits: session_lease_ms must be >= 100".into());
        }
        if self.qos.global_slots == 0 || self.qos.queue_timeout_ms == 0 {
            return bad("qos: global_slots >= 1 and queue_timeout_ms >= 1".into());
        }
        let s = &self.s3;
        if s.get_part_size == 0 || s.put_part_size < 5 << 20 || s.max_concurrency == 0 || s.max_attempts == 0 {
            return bad("s3: get_part_size > 0, put_part_size >= 5 MiB, max_concurrency >= 1, max_attempts >= 1".into());
        }
        if s.multipart_threshold < s.put_part_size {
            return bad("s3: multipart_threshold must be >= put_part_size".into());
        }
        // S3 refuses single PUTs and parts above 5 GiB: the store would
        // refuse them only once the bytes were on the wire.
        let max_put = crate::model::MAX_SINGLE_PUT_BYTES;
        if s.multipart_threshold > max_put || s.put_part_size > max_put {
            return bad(format!("s3: multipart_threshold and put_part_size must be <= {max_put} (S3's largest PUT)"));
        }
        // Encrypted parts are ciphertext: a 16-byte tag per chunk more (at
        // most 1/256 of 4 KiB chunks), which 4 GiB of plaintext leaves room for.
        let encrypted = self.tenants.iter().flat_map(|t| &t.namespaces).any(|n| n.encryption != EncryptionPolicy::None);
        if encrypted && s.put_part_size > 4 << 30 {
            return bad(format!(
                "s3: with encrypted namespaces put_part_size must be <= {} (parts grow by a tag per chunk)",
                4u64 << 30
            ));
        }
        // One descriptor describes at most 4 GiB - 64 KiB: RDMA parts and
        // single PUTs must fit, larger objects go as a series of parts.
        let rdma = self.tenants.iter().flat_map(|t| &t.namespaces).any(|n| n.data_path != DataPathMode::Http);
        let window = sluice_dataplane::transport::MAX_WINDOW_BYTES;
        if rdma && (s.get_part_size > window || s.multipart_threshold > window) {
            return bad(format!(
                "s3: with RDMA namespaces, get_part_size and multipart_threshold must be <= {window} (one descriptor)"
            ));
        }
        Ok(())
    }
}

/// Makes the namespaces' relative `ca_file`s relative to `base` (the config
/// file's directory).
pub fn resolve_ca_files(cfg: &mut AgentConfig, base: &Path) {
    for ns in cfg.tenants.iter_mut().flat_map(|t| &mut t.namespaces) {
        if let Some(p) = &mut ns.ca_file {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }
}

impl CredentialConfig {
    /// The secret, read from its file if configured that way.
    pub fn load_secret(&self) -> Result<String, ConfigError> {
        match (&self.secret_key, &self.secret_key_file) {
            (Some(s), _) => Ok(s.clone()),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .map_err(|source| ConfigError::Read { path: path.clone(), source }),
            (None, None) => Err(ConfigError::Invalid("credential without a secret".into())),
        }
    }

    /// The session token of temporary credentials, read from its file if
    /// configured that way; `None` for long-term keys.
    pub fn load_session_token(&self) -> Result<Option<String>, ConfigError> {
        let token = match (&self.session_token, &self.session_token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_owned())
                .map_err(|source| ConfigError::Read { path: path.clone(), source })?,
            (None, None) => return Ok(None),
        };
        // It travels as a header value: visible ASCII, as STS issues them.
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::Invalid(format!(
                "the session token of access key {} is empty or not printable ASCII",
                self.access_key
            )));
        }
        Ok(Some(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../deploy/agent.example.toml");

    #[test]
    fn example_config_parses() {
        let cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        cfg.validate().unwrap();
        assert!(!cfg.tenants.is_empty());
    }

    #[test]
    fn example_limits_parse_uncommented() {
        // The commented [tenants.limits] examples, uncommented, are valid.
        let keys = ["bytes_per_sec =", "requests_per_sec =", "max_inflight_bytes =", "max_registered_bytes ="];
        let text: String = EXAMPLE
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if keys.iter().any(|k| rest.starts_with(k)) => format!("{rest}\n"),
                _ => format!("{l}\n"),
            })
            .collect();
        let cfg: AgentConfig = toml::from_str(&text).unwrap();
        cfg.validate().unwrap();
        let l = &cfg.tenants[0].limits;
        let got = (l.bytes_per_sec, l.requests_per_sec, l.max_inflight_bytes, l.max_registered_bytes, l.weight);
        assert_eq!(got, (Some(2 << 30), Some(5000), Some(4 << 30), Some(64 << 30), 1));
        assert_eq!(cfg.qos, QosSettings::default());
    }

    #[test]
    fn missing_credentials_reference_is_rejected() {
        let mut cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        cfg.tenants[0].namespaces[0].credentials = "nope".into();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn dc_transport_needs_its_device_section() {
        let mut cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        let ns = &mut cfg.tenants[0].namespaces[0];
        ns.data_path = DataPathMode::Rdma;
        ns.transport = TransportKind::Dc;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("[dataplane.dc]"), "{err}");
        // The commented example section, uncommented, is what it needs.
        let section: String = EXAMPLE
            .lines()
            .skip_while(|l| !l.starts_with("# [dataplane.dc]"))
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{}\n", l.trim_start_matches("# ")))
            .collect();
        let dc: std::collections::HashMap<String, DcConfig> =
            toml::from_str::<toml::Table>(&section).unwrap()["dataplane"].clone().try_into().unwrap();
        let dc = &dc["dc"];
        assert_eq!((dc.device.as_str(), dc.port, dc.gid_index, dc.key), ("mlx5_0", 1, Some(3), 0xffee_ddcc));
        cfg.dataplane.dc = Some(dc.clone());
        cfg.validate().unwrap();
    }

    #[test]
    fn unknown_names_are_refused_at_parse_time() {
        let with = |transport: &str, encryption: &str| {
            EXAMPLE.replacen("transport = \"tcp\"", &format!("transport = \"{transport}\""), 1).replacen(
                "encryption = \"none\"",
                &format!("encryption = \"{encryption}\""),
                1,
            )
        };
        let err = toml::from_str::<AgentConfig>(&with("carrier-pigeon", "none")).unwrap_err().to_string();
        assert!(err.contains("unknown transport \"carrier-pigeon\"") && err.contains("verbs-rc"), "{err}");
        let err = toml::from_str::<AgentConfig>(&with("tcp", "rot13")).unwrap_err().to_string();
        assert!(err.contains("\"rot13\"") && err.contains("aes-256-gcm"), "{err}");
        let cfg = toml::from_str::<AgentConfig>(&with("verbs-rc", "aes-256-gcm")).unwrap();
        let ns = &cfg.tenants[0].namespaces[0];
        assert_eq!((ns.transport, ns.encryption), (TransportKind::VerbsRc, EncryptionPolicy::Aes256Gcm));
    }

    #[test]
    fn debug_redacts_secret() {
        let c = CredentialConfig {
            access_key: "AK".into(),
            secret_key: Some("S3CR3T".into()),
            secret_key_file: None,
            session_token: Some("T0K3N".into()),
            session_token_file: None,
        };
        assert_eq!(c.load_session_token().unwrap().as_deref(), Some("T0K3N"));
        let bad = CredentialConfig { session_token: Some("a b\n".into()), ..c.clone() };
        assert!(bad.load_session_token().unwrap_err().to_string().contains("printable ASCII"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("S3CR3T") && !shown.contains("T0K3N"), "{shown}");
    }
}
