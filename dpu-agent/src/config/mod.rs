//! Agent configuration (TOML). See `deploy/agent.example.toml` for a
//! commented example. Credentials live only here (or in files this names);
//! nothing in it is ever sent to the host.

//!
//! One file per section, each with its own validated type and error
//! (Firecracker's `vmm_config/` is the model): `tenant.rs`, `s3.rs`
//! (namespaces and `[s3]`), `credentials.rs` (and reading secrets),
//! `dataplane.rs`, `encryption.rs`, `failover.rs`, `uploads.rs`; `[nic]`
//! is `nic/config.rs`, `[tls]` is `tls.rs`, `[host_memory]` is `hostmem`.
//! [`ConfigError`] wraps the sections' errors.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_crypt::EncryptionPolicy;

pub mod credentials;
pub mod dataplane;
pub mod encryption;
pub mod failover;
pub mod s3;
pub mod tenant;
pub mod uploads;

pub use credentials::{CredentialConfig, CredentialConfigError, SecretError};
pub use dataplane::{DataplaneConfig, DcConfig};
pub use encryption::{CipherEngine, EncryptionConfig, EncryptionConfigError};
pub use s3::{NamespaceConfig, NamespaceConfigError, NamespaceRefs, S3Tuning, S3TuningError, DEFAULT_REQUEST_TIMEOUT};
pub use tenant::{TenantConfig, TenantConfigError, TenantLimits};

use crate::model::DataPathMode;

/// Errors reading or validating the config. Every invalid value reads
/// "invalid config: " and then what its section says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Only toml's message and where: its own Display quotes the line,
    /// which may hold an inline secret (`secret_key = "..."` misspelt),
    /// and this error is logged.
    #[error("parsing {path}: {message} (line {line}, column {column})")]
    Parse { path: PathBuf, message: String, line: usize, column: usize },
    #[error("invalid config: set grpc_listen, grpc_socket, or both")]
    NoListener,
    #[error("invalid config: no [[tenants]] configured")]
    NoTenants,
    #[error("invalid config: socket_mode {0:o} is not a permission mode")]
    SocketMode(u32),
    #[error("invalid config: limits: session_lease_ms must be >= 100")]
    SessionLease,
    #[error("invalid config: limits: max_regions_per_session, max_sessions_per_tenant and max_regions_per_tenant must be >= 1")]
    ZeroLimit,
    #[error("invalid config: qos: global_slots >= 1 and queue_timeout_ms >= 1")]
    Qos,
    #[error("invalid config: [runtime] {0}")]
    Runtime(String),
    #[error("invalid config: {0}")]
    Tls(#[from] crate::tls::TlsConfigError),
    #[error("invalid config: {0}")]
    HostMemory(#[from] crate::hostmem::HostMemoryConfigError),
    #[error("invalid config: {0}")]
    Failover(#[from] failover::FailoverConfigError),
    #[error("invalid config: {0}")]
    Uploads(#[from] uploads::UploadsConfigError),
    #[error("invalid config: {0}")]
    Encryption(#[from] EncryptionConfigError),
    #[error("invalid config: {0}")]
    Tenant(#[from] TenantConfigError),
    #[error("invalid config: {0}")]
    Credentials(#[from] CredentialConfigError),
    #[error("invalid config: {0}")]
    S3(#[from] S3TuningError),
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
    /// `[runtime]`: per-core runtimes for the control connections.
    #[serde(default)]
    pub runtime: crate::cores::RuntimeConfig,
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
    /// Most sessions one tenant may hold open (a shim opens one per client
    /// connection), over all its shims.
    pub max_sessions_per_tenant: usize,
    /// Most regions one tenant may hold over all its sessions. Each is a
    /// mapping in the agent, and the kernel allows a process about 65,000
    /// (`vm.max_map_count`): this keeps one tenant from taking them all.
    pub max_regions_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_regions_per_session: 4096,
            max_registered_bytes_per_session: 64 << 30,
            session_lease_ms: 15_000,
            max_sessions_per_tenant: 4096,
            max_regions_per_tenant: 16_384,
        }
    }
}

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

/// [`ConfigError::Parse`] for `e`, found in `text`: where, never the text.
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, column) = sluice_telemetry::line_and_column(text, e.span().map_or(0, |s| s.start));
    ConfigError::Parse { path: path.into(), message: e.message().to_owned(), line, column }
}

impl AgentConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut cfg: Self = toml::from_str(&text).map_err(|e| parse_error(path, &text, &e))?;
        // Relative secret files are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        for c in cfg.credentials.values_mut() {
            c.resolve(base);
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

    /// Checks each section, and the references between them serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.grpc_listen.is_none() && self.grpc_socket.is_none() {
            return Err(ConfigError::NoListener);
        }
        if self.tenants.is_empty() {
            return Err(ConfigError::NoTenants);
        }
        let tcp = self.grpc_listen.is_some() || self.tenants.iter().any(|t| t.nic.is_some());
        self.tls.validate(tcp)?;
        if self.socket_mode > 0o777 {
            return Err(ConfigError::SocketMode(self.socket_mode));
        }
        if self.runtime.per_core && self.host_memory.backend == crate::hostmem::BackendKind::Doca {
            // A DOCA copy blocks its thread until the DMA is done; a shared
            // runtime's worker hands its other tasks away meanwhile, a
            // per-core runtime could not, and every connection on that
            // core would wait behind the copy.
            return Err(ConfigError::Runtime(
                "per_core = true does not work with [host_memory] backend = \"doca\" yet (its copies block \
                 their thread): leave per_core off"
                    .into(),
            ));
        }
        if self.runtime.threads > crate::cores::MAX_THREADS {
            return Err(ConfigError::Runtime(format!(
                "threads = {}: at most {} (0: one per CPU the agent may run on)",
                self.runtime.threads,
                crate::cores::MAX_THREADS
            )));
        }
        self.host_memory.validate()?;
        self.failover.validate()?;
        self.uploads.validate()?;
        self.encryption.validate()?;
        let refs = NamespaceRefs {
            dc: self.dataplane.dc.is_some(),
            verbs_listen: self.dataplane.verbs_listen.is_some(),
            key_dir: self.encryption.key_dir.is_some(),
            credentials: &self.credentials,
        };
        tenant::validate_tenants(&self.tenants, &refs)?;
        for (name, c) in &self.credentials {
            c.validate(name)?;
        }
        if self.limits.session_lease_ms < 100 {
            return Err(ConfigError::SessionLease);
        }
        let l = &self.limits;
        if l.max_regions_per_session == 0 || l.max_sessions_per_tenant == 0 || l.max_regions_per_tenant == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        if self.qos.global_slots == 0 || self.qos.queue_timeout_ms == 0 {
            return Err(ConfigError::Qos);
        }
        let namespaces = || self.tenants.iter().flat_map(|t| &t.namespaces);
        let encrypted = namespaces().any(|n| n.encryption != EncryptionPolicy::None);
        let rdma = namespaces().any(|n| n.data_path != DataPathMode::Http);
        self.s3.validate(encrypted, rdma)?;
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

#[cfg(test)]
mod tests {
    use sluice_dataplane::transport::TransportKind;

    use super::*;

    const EXAMPLE: &str = include_str!("../../../deploy/agent.example.toml");

    /// A config that does not parse is reported by line and column, never
    /// by quoting the line: it may hold a secret (a misspelt key beside an
    /// inline `secret_key`, an unterminated quote), and the error is logged.
    #[test]
    fn a_parse_error_names_where_and_quotes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("agent.toml");
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        std::fs::write(&path, format!("[credentials.main]\naccess_key = \"AK\"\nsecrte_key = \"{secret}\"\n")).unwrap();
        let e = AgentConfig::from_file(&path).unwrap_err().to_string();
        assert!(!e.contains(secret), "{e}");
        assert!(e.contains("line 3") && e.contains("secrte_key"), "{e}");
        std::fs::write(&path, format!("[credentials.main]\nsecret_key = \"{secret}\n")).unwrap();
        let e = AgentConfig::from_file(&path).unwrap_err().to_string();
        assert!(!e.contains(secret) && e.contains("line 2"), "{e}");
    }

    #[test]
    fn example_config_parses() {
        let cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        cfg.validate().unwrap();
        assert!(!cfg.tenants.is_empty());
    }

    #[test]
    fn runtime_section_is_checked() {
        let mut cfg: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        assert_eq!(cfg.runtime, crate::cores::RuntimeConfig::default(), "the example shows the defaults");
        cfg.runtime.per_core = true;
        cfg.validate().unwrap();
        cfg.runtime.threads = crate::cores::MAX_THREADS + 1;
        assert!(cfg.validate().unwrap_err().to_string().contains("[runtime] threads"));
        cfg.runtime.threads = 4;
        cfg.host_memory.backend = crate::hostmem::BackendKind::Doca;
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("per_core = true") && e.contains("doca"), "{e}");
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

    /// What the encrypted path would refuse at run time is refused when the
    /// config is read: a tenant name the format does not take, chunk sizes
    /// it does not have, GET parts too large to hold while they decrypt.
    #[test]
    fn encrypted_namespaces_are_checked_for_what_would_fail_every_request() {
        let encrypted = || -> AgentConfig {
            let mut c: AgentConfig = toml::from_str(EXAMPLE).unwrap();
            c.encryption.key_dir = Some("/etc/sluice/keys".into());
            c.tenants[0].namespaces[0].encryption = EncryptionPolicy::Aes256Gcm;
            c
        };
        encrypted().validate().unwrap();
        let mut c = encrypted();
        c.tenants[0].name = "Acme Corp".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("\"Acme Corp\" has encrypted namespaces") && e.contains("A-Za-z0-9._-"), "{e}");
        let mut c = encrypted();
        c.tenants[0].namespaces[0].encryption_previous_chunk_bytes = vec![1 << 20, 3000];
        assert!(c.validate().unwrap_err().to_string().contains("encryption_previous_chunk_bytes"));
        let mut c = encrypted();
        c.s3.get_part_size = 2 << 30;
        assert!(c.validate().unwrap_err().to_string().contains("get_part_size must be <= 1073741824"));
        let mut c: AgentConfig = toml::from_str(EXAMPLE).unwrap();
        c.s3.get_part_size = 2 << 30;
        c.validate().unwrap();
        c.s3.get_part_size = 6 << 30;
        assert!(c.validate().unwrap_err().to_string().contains("get_part_size must be <= 5368709120"));
    }

    #[test]
    fn each_section_reports_what_it_did_before_the_split() {
        // The messages operators and scripts match, word for word.
        let example = || -> AgentConfig { toml::from_str(EXAMPLE).unwrap() };
        let fails = |cfg: AgentConfig| cfg.validate().unwrap_err().to_string();
        let mut c = example();
        c.socket_mode = 0o1777;
        assert_eq!(fails(c), "invalid config: socket_mode 1777 is not a permission mode");
        let mut c = example();
        let t = c.tenants[0].clone();
        c.tenants.push(t.clone());
        assert_eq!(fails(c), format!("invalid config: tenant names must be unique and non-empty ({:?})", t.name));
        let mut c = example();
        c.tenants[0].limits.weight = 0;
        assert_eq!(
            fails(c),
            format!(
                "invalid config: tenant {:?}: limits: bytes_per_sec and requests_per_sec must be > 0 (omit for \
                 unlimited), weight >= 1",
                t.name
            )
        );
        let mut c = example();
        c.tenants[0].namespaces[0].endpoints = vec!["ftp://x".into()];
        let ns = c.tenants[0].namespaces[0].name.clone();
        assert_eq!(
            fails(c),
            format!("invalid config: namespace {ns:?}: endpoint \"ftp://x\" must start with http:// or https://")
        );
        let mut c = example();
        c.s3.multipart_threshold = 1;
        assert_eq!(fails(c), "invalid config: s3: multipart_threshold must be >= put_part_size");
        let mut c = example();
        c.limits.session_lease_ms = 1;
        assert_eq!(fails(c), "invalid config: limits: session_lease_ms must be >= 100");
        let mut c = example();
        let cred = c.credentials.values_mut().next().unwrap();
        (cred.secret_key, cred.secret_key_file) = (Some("s".into()), Some("f".into()));
        assert!(fails(c).ends_with("set exactly one of secret_key and secret_key_file"));
    }
}
