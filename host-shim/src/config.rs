//! Shim configuration (TOML). See `deploy/shim.example.toml`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

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
pub struct ShimConfig {
    /// The local API socket data loaders connect to.
    pub socket: PathBuf,
    /// Permission bits of `socket` (octal in TOML: 0o660). Who may connect is
    /// still decided per caller by `[[callers]]`.
    #[serde(default = "default_mode")]
    pub socket_mode: u32,
    pub agent: AgentLink,
    #[serde(default)]
    pub limits: ShimLimits,
    /// Which local users act as which tenant. First match wins.
    pub callers: Vec<CallerRule>,
    /// Per tenant, the file (mode 0600) holding the secret this shim proves
    /// to the agent when it opens a session for that tenant (the agent's
    /// `shim_secret_file`). Relative paths are relative to the config file.
    #[serde(default)]
    pub tenant_secrets: std::collections::BTreeMap<String, PathBuf>,
    /// This shim's id as the agent sees it (the agent may restrict tenants
    /// to listed shims). Default: the host name.
    #[serde(default)]
    pub shim_id: Option<String>,
    /// The operations endpoint: `/metrics` (Prometheus) and `/ready` (the
    /// agent answers). Off when absent.
    #[serde(default)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How the agent reaches registered regions: `colocated` (memfds over
    /// the agent's memory socket; the agent runs on this host) or `doca`
    /// (regions exported over PCIe to the agent on this host's BlueField;
    /// needs DOCA and a shim built with the `doca` feature).
    #[serde(default)]
    pub memory_backend: MemoryBackendKind,
    /// `[doca]`, required with `memory_backend = "doca"`.
    #[serde(default)]
    pub doca: Option<ShimDocaConfig>,
    /// Threads that run the shim's async work. The shim only moves control
    /// messages (object bytes never pass through it), and one thread spares
    /// it the cross-thread wake-ups that cost more than the work itself on
    /// small requests (on 4 KiB batched GETs: 28 instead of 36 µs of CPU per
    /// object, no change at 64 MiB).
    #[serde(default = "default_worker_threads")]
    pub worker_threads: usize,
}

fn default_worker_threads() -> usize {
    1
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryBackendKind {
    #[default]
    Colocated,
    Doca,
}

/// `[doca]` in shim.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimDocaConfig {
    /// The BlueField's PCI function on this host (`lspci -d 15b3:` shows
    /// it, e.g. `3b:00.0`) or its verbs name (`mlx5_0`).
    pub device: String,
}

fn default_mode() -> u32 {
    0o666
}

/// How to reach the agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLink {
    /// `unix:/path/to/agent.sock`, `https://host:port` (mutual TLS, with
    /// `[agent.tls]`) or `http://host:port` (plaintext, with `insecure`).
    pub grpc: String,
    /// The agent's memory socket (co-located mode): region memfds go here.
    /// Not used with `memory_backend = "doca"`.
    #[serde(default)]
    pub memory_socket: PathBuf,
    /// `[agent.tls]`: this shim's certificate and the CA the agent's is
    /// signed by (`sluice certs` issues them).
    #[serde(default)]
    pub tls: Option<AgentTls>,
    /// Allows a plaintext `http://` agent address: only on a trusted link.
    #[serde(default)]
    pub insecure: bool,
    /// Connections to the agent, calls dealt round robin over them. An
    /// agent with `[runtime] per_core = true` serves each connection on one
    /// of its cores, so there this bounds how many of its cores one shim
    /// keeps busy: at least the agent's core count.
    #[serde(default = "default_agent_connections")]
    pub connections: usize,
    /// Concurrent single GETs of one agent session that arrive together
    /// go to the agent as one batch call, each with its own request id,
    /// deadline and answer (`coalesce.rs`); a GET alone goes as before.
    #[serde(default = "default_true")]
    pub coalesce_gets: bool,
    /// Single GETs go to the agent as messages of one long-lived call per
    /// connection (`get_stream.rs`) instead of a call each, where the
    /// agent serves it; `coalesce_gets` then applies only to an agent that
    /// does not.
    #[serde(default = "default_true")]
    pub get_stream: bool,
    /// Those streams go without HTTP/2: the same messages framed on a
    /// connection of their own to the agent's address (`framed_link.rs`),
    /// over the link's TLS where it has it, where the agent serves it (an
    /// older agent gets `GetStream` calls).
    #[serde(default = "default_true")]
    pub framed_gets: bool,
}

fn default_true() -> bool {
    true
}

fn default_agent_connections() -> usize {
    8
}

/// Most connections one shim opens to the agent.
const MAX_AGENT_CONNECTIONS: usize = 64;

/// `[agent.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTls {
    /// CA (PEM) that signed the agent's certificate.
    pub ca: PathBuf,
    /// This shim's client certificate (PEM); it must name the tenants it
    /// serves (see the agent's `tls_client_names`).
    pub cert: PathBuf,
    /// Its private key (PEM); keep it 0600.
    pub key: PathBuf,
    /// The name to check the agent's certificate for (default: the host of
    /// `grpc`).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl AgentTls {
    /// Reads the three files once: the gRPC link and framed GETs are both
    /// set up from these bytes, so they cannot see different files.
    pub fn read(&self) -> std::io::Result<AgentTlsPem> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| std::io::Error::new(e.kind(), format!("reading {}: {e}", p.display())))
        };
        Ok(AgentTlsPem { ca: read(&self.ca)?, cert: read(&self.cert)?, key: read(&self.key)?, files: self.clone() })
    }
}

/// `[agent.tls]` as read ([`AgentTls::read`]): PEM bytes, and the table
/// they were read from (to name a file in errors).
#[derive(Clone)]
pub struct AgentTlsPem {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub files: AgentTls,
}

/// What one client may hold in the shim. The shim is shared by every local
/// user, so each bound keeps one of them from starving the rest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShimLimits {
    /// Largest single region a client may register.
    pub max_region_bytes: u64,
    /// Requests a single connection may have in flight (a GetBatch is one).
    pub max_in_flight_per_connection: usize,
    /// Items in one GetBatch (its frame must also fit in 1 MiB).
    pub max_batch_items: usize,
    /// Regions one connection may hold (the shim keeps each region's memfd
    /// so it can register it again after an agent restart).
    pub max_regions_per_connection: usize,
    /// Connections one local user (uid) may have open at once. A Python
    /// client using its native read path holds two, so the default leaves
    /// room for 64 such loader processes.
    pub max_connections_per_uid: usize,
    /// Connections open at once, all users together.
    pub max_connections: usize,
    /// A connection that has not completed Hello this long after it was
    /// accepted is closed.
    pub hello_timeout_ms: u64,
    /// Deadline of a request whose client gave none (the agent's namespace
    /// deadline usually ends it first), and the longest a client may give.
    /// The agent is given the request's deadline and answers when it passes,
    /// once its transfers have stopped; the shim waits that plus a little
    /// grace for the answer to come back.
    pub request_timeout_ms: u64,
    /// A client that takes none of a frame of answers for this long (it
    /// stopped reading, and its socket is full) is disconnected: it would
    /// otherwise hold its requests, regions and connection for good.
    pub client_write_timeout_ms: u64,
}

impl Default for ShimLimits {
    fn default() -> Self {
        Self {
            max_region_bytes: 16 << 30,
            max_in_flight_per_connection: 256,
            max_batch_items: 1024,
            max_regions_per_connection: 256,
            max_connections_per_uid: 128,
            max_connections: 1024,
            hello_timeout_ms: 5_000,
            request_timeout_ms: 900_000,
            client_write_timeout_ms: 60_000,
        }
    }
}

/// Maps a caller (SO_PEERCRED) to a tenant. `uid` and/or `gid`; a rule with
/// neither matches everyone (use with care).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerRule {
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    pub tenant: String,
}

impl ShimConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        let mut cfg: Self = toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        if let Some(t) = &mut cfg.agent.tls {
            for p in [&mut t.ca, &mut t.cert, &mut t.key] {
                if p.is_relative() {
                    *p = base.join(&*p);
                }
            }
        }
        for f in cfg.tenant_secrets.values_mut() {
            if f.is_relative() {
                *f = base.join(&*f);
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let a = &self.agent;
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if !(1..=MAX_AGENT_CONNECTIONS).contains(&a.connections) {
            return invalid(format!(
                "[agent] connections = {}: use 1 to {MAX_AGENT_CONNECTIONS} (about the agent's core count)",
                a.connections
            ));
        }
        if a.grpc.starts_with("https://") {
            if a.tls.is_none() {
                return invalid(format!(
                    "agent.grpc {:?} is https:// but [agent.tls] is not set (ca, cert, key; `sluice certs`)",
                    a.grpc
                ));
            }
            if a.insecure {
                return invalid("[agent] insecure = true with an https:// address: choose one".into());
            }
        } else if a.grpc.starts_with("http://") {
            if !a.insecure {
                return invalid(format!(
                    "agent.grpc {:?} is plaintext: use https:// with [agent.tls], or set [agent] insecure = true \
                     on a trusted link",
                    a.grpc
                ));
            }
            if a.tls.is_some() {
                return invalid("[agent.tls] is set but agent.grpc is http://: use https://".into());
            }
        } else if a.grpc.starts_with("unix:") {
            if a.tls.is_some() || a.insecure {
                return invalid("[agent.tls] and insecure apply to TCP addresses, not unix:".into());
            }
        } else {
            return invalid(format!("agent.grpc {:?}: use unix:/path, https://host:port or http://host:port", a.grpc));
        }
        if self.callers.iter().any(|c| c.tenant.is_empty()) {
            return Err(ConfigError::Invalid("every [[callers]] rule needs a tenant".into()));
        }
        if let Some(c) = self.callers.iter().find(|c| !self.tenant_secrets.contains_key(&c.tenant)) {
            return Err(ConfigError::Invalid(format!(
                "tenant {:?} has callers but no entry in [tenant_secrets]: the agent would refuse its sessions",
                c.tenant
            )));
        }
        match (self.memory_backend, &self.doca) {
            (MemoryBackendKind::Colocated, _) if self.agent.memory_socket.as_os_str().is_empty() => {
                return Err(ConfigError::Invalid(
                    "agent.memory_socket is required with memory_backend = \"colocated\"".into(),
                ))
            }
            (MemoryBackendKind::Doca, None) => {
                return Err(ConfigError::Invalid(
                    "memory_backend = \"doca\" needs a [doca] section with device = \"<PCI address or mlx5_N>\"".into(),
                ))
            }
            _ => {}
        }
        if !(1..=256).contains(&self.worker_threads) {
            return Err(ConfigError::Invalid(format!("worker_threads must be 1 to 256, not {}", self.worker_threads)));
        }
        let l = &self.limits;
        if l.max_in_flight_per_connection == 0
            || l.max_batch_items == 0
            || l.max_regions_per_connection == 0
            || l.max_connections_per_uid == 0
            || l.max_connections == 0
            || l.hello_timeout_ms == 0
            || l.request_timeout_ms == 0
            || l.client_write_timeout_ms == 0
        {
            return Err(ConfigError::Invalid("every [limits] value must be > 0".into()));
        }
        if self.socket_mode > 0o777 {
            return Err(ConfigError::Invalid(format!("socket_mode {:o} is not a permission mode", self.socket_mode)));
        }
        Ok(())
    }

    /// The tenant for a caller, if any rule matches.
    pub fn tenant_for(&self, uid: u32, gid: u32) -> Option<&str> {
        self.callers
            .iter()
            .find(|r| r.uid.is_none_or(|u| u == uid) && r.gid.is_none_or(|g| g == gid))
            .map(|r| r.tenant.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_parses_and_maps_callers() {
        let cfg: ShimConfig = toml::from_str(include_str!("../../deploy/shim.example.toml")).unwrap();
        cfg.validate().unwrap();
        let rules = ShimConfig {
            callers: vec![
                CallerRule { uid: Some(1000), gid: None, tenant: "alice".into() },
                CallerRule { uid: None, gid: Some(50), tenant: "team".into() },
            ],
            ..cfg
        };
        assert_eq!(rules.tenant_for(1000, 1), Some("alice"));
        assert_eq!(rules.tenant_for(7, 50), Some("team"));
        assert_eq!(rules.tenant_for(7, 7), None);
    }

    #[test]
    fn worker_threads_default_to_one_and_are_bounded() {
        let cfg: ShimConfig = toml::from_str(include_str!("../../deploy/shim.example.toml")).unwrap();
        assert_eq!(cfg.worker_threads, 1);
        let zero = ShimConfig { worker_threads: 0, ..cfg.clone() };
        assert!(zero.validate().unwrap_err().to_string().contains("worker_threads"));
        ShimConfig { worker_threads: 8, ..cfg }.validate().unwrap();
    }

    #[test]
    fn agent_connections_default_to_eight_and_are_bounded() {
        let cfg: ShimConfig = toml::from_str(include_str!("../../deploy/shim.example.toml")).unwrap();
        assert_eq!(cfg.agent.connections, 8);
        for bad in [0, MAX_AGENT_CONNECTIONS + 1] {
            let mut c = cfg.clone();
            c.agent.connections = bad;
            assert!(c.validate().unwrap_err().to_string().contains("[agent] connections"), "{bad}");
        }
        let mut one = cfg;
        one.agent.connections = 1;
        one.validate().unwrap();
    }

    #[test]
    fn memory_backend_settings_are_checked() {
        let example = include_str!("../../deploy/shim.example.toml");
        let doca: String = example
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(r)
                    if r.starts_with("memory_backend =") || r.starts_with("[doca]") || r.starts_with("device =") =>
                {
                    format!("{r}\n")
                }
                _ => format!("{l}\n"),
            })
            .collect();
        let cfg: ShimConfig = toml::from_str(&doca).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.memory_backend, MemoryBackendKind::Doca);
        assert_eq!(cfg.doca.as_ref().map(|d| d.device.as_str()), Some("3b:00.0"));

        let no_section = ShimConfig { doca: None, ..cfg.clone() };
        assert!(no_section.validate().unwrap_err().to_string().contains("[doca]"));
        let mut colocated = ShimConfig { memory_backend: MemoryBackendKind::Colocated, ..cfg };
        colocated.agent.memory_socket = PathBuf::new();
        assert!(colocated.validate().unwrap_err().to_string().contains("memory_socket"));
    }
}
