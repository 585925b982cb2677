//! The shim's listener: binds the local API socket and serves clients.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::agent_link::AgentLink;
use crate::config::ShimConfig;
use crate::error::ShimError;

/// State every connection shares.
pub struct Shared {
    pub config: ShimConfig,
    pub agent: AgentLink,
    pub shim_id: String,
    /// Per tenant, the secret proven to the agent (never sent).
    pub secrets: std::collections::HashMap<String, Vec<u8>>,
    /// How regions are exported to the agent.
    pub memory: crate::memory::MemoryBackend,
    /// Every live session, renewed with the agent in one call.
    pub sessions: crate::session::Registry,
    /// Open client connections per uid (the limits are in `config`).
    pub connections: crate::connection::ConnectionCounts,
}

/// Binds the socket (replacing a stale one) with the configured mode.
pub fn bind(cfg: &ShimConfig) -> Result<UnixListener, ShimError> {
    let path = &cfg.socket;
    let io = |e: std::io::Error| ShimError::BadRequest(format!("socket {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    if path.exists() {
        std::fs::remove_file(path).map_err(io)?;
    }
    let l = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode)).map_err(io)?;
    Ok(l)
}

/// Serves clients until `shutdown` resolves.
pub async fn run(cfg: ShimConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ShimError> {
    let listener = bind(&cfg)?;
    let agent = AgentLink::new(&cfg.agent)?;
    let shim_id = cfg.shim_id.clone().unwrap_or_else(host_name);
    let mut secrets = std::collections::HashMap::new();
    for (tenant, path) in &cfg.tenant_secrets {
        let secret = sluice_proto::auth::read_secret_file(path).map_err(|e| ShimError::BadRequest(e.to_string()))?;
        secrets.insert(tenant.clone(), secret);
    }
    let memory = crate::memory::MemoryBackend::open(&cfg)?;
    let socket = cfg.socket.clone();
    let shared = Arc::new(Shared {
        config: cfg,
        agent,
        shim_id,
        secrets,
        memory,
        sessions: Default::default(),
        connections: Default::default(),
    });
    let renew = tokio::spawn(crate::session::Registry::renew_loop(shared.clone()));
    info!(socket = %socket.display(), agent = %shared.config.agent.grpc, memory = shared.memory.name(), "shim ready");
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    tokio::spawn(crate::connection::serve(shared.clone(), stream));
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            () = shutdown.as_mut() => break,
        }
    }
    info!("shim shutting down");
    renew.abort();
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// The machine's host name (the default shim id).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
