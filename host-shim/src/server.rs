//! The shim's listener: binds the local API socket and serves clients.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::agent_link::AgentLink;
use crate::config::ShimConfig;
use crate::error::StartupError;

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
    /// Served on `metrics_listen` with the shim's readiness.
    pub metrics: Arc<crate::metrics::ShimMetrics>,
}

/// Binds the socket (replacing a stale one) with the configured mode.
pub fn bind(cfg: &ShimConfig) -> Result<UnixListener, StartupError> {
    let path = &cfg.socket;
    let io = |source: std::io::Error| StartupError::Socket { path: path.clone(), source };
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
pub async fn run(cfg: ShimConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), StartupError> {
    let listener = bind(&cfg)?;
    let agent = AgentLink::new(&cfg.agent)?;
    let shim_id = cfg.shim_id.clone().unwrap_or_else(host_name);
    let mut secrets = std::collections::HashMap::new();
    for (tenant, path) in &cfg.tenant_secrets {
        let secret = sluice_proto::auth::read_secret_file(path)
            .map_err(|source| StartupError::TenantSecret { tenant: tenant.clone(), source })?;
        secrets.insert(tenant.clone(), secret);
    }
    let memory = crate::memory::MemoryBackend::open(&cfg)?;
    let metrics = Arc::new(crate::metrics::ShimMetrics::new().map_err(|e| StartupError::Metrics(e.to_string()))?);
    let ops_listener = match cfg.metrics_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|source| StartupError::Bind {
            what: "metrics_listen",
            at: addr.to_string(),
            source,
        })?),
        None => None,
    };
    let socket = cfg.socket.clone();
    let shared = Arc::new(Shared {
        config: cfg,
        agent,
        shim_id,
        secrets,
        memory,
        sessions: Default::default(),
        connections: Default::default(),
        metrics,
    });
    let renew = tokio::spawn(crate::session::Registry::renew_loop(shared.clone()));
    // The agent check feeds /ready and `systemctl status`.
    let mut ops = vec![tokio::spawn(crate::metrics::ShimMetrics::check_agent_forever(shared.clone()))];
    if let Some(l) = ops_listener {
        info!(metrics = ?l.local_addr().ok(), "operations endpoint: /metrics, /ready");
        ops.push(tokio::spawn(sluice_telemetry::serve(shared.metrics.clone(), l)));
    }
    info!(socket = %socket.display(), agent = %shared.config.agent.grpc, memory = shared.memory.name(), "shim ready");
    sluice_telemetry::notify_ready();
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
    for t in ops {
        t.abort();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> ShimConfig {
        toml::from_str(include_str!("../../deploy/shim.example.toml")).unwrap()
    }

    /// Each way a shim cannot start has its own error, naming what to fix.
    #[tokio::test]
    async fn startup_failures_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = example();
        cfg.socket = dir.path().join("s.sock");
        cfg.agent.grpc = "not a uri".into();
        let e = run(cfg.clone(), async {}).await.unwrap_err();
        assert!(matches!(&e, StartupError::AgentAddress { address, .. } if address == "not a uri"), "{e}");

        let mut cfg = example();
        cfg.socket = dir.path().join("s.sock");
        cfg.tenant_secrets.clear();
        cfg.memory_backend = crate::config::MemoryBackendKind::Doca;
        cfg.doca = None;
        let e = run(cfg, async {}).await.unwrap_err();
        assert!(matches!(e, StartupError::DocaConfig), "{e}");

        let mut cfg = example();
        cfg.socket = dir.path().join("s.sock");
        cfg.tenant_secrets.clear();
        cfg.tenant_secrets.insert("alpha".into(), dir.path().join("missing-secret"));
        let e = run(cfg, async {}).await.unwrap_err();
        assert!(matches!(&e, StartupError::TenantSecret { tenant, .. } if tenant == "alpha"), "{e}");

        let mut cfg = example();
        cfg.socket = std::path::PathBuf::from("/proc/sluice-cannot-be-here/s.sock");
        let e = run(cfg, async {}).await.unwrap_err();
        assert!(matches!(e, StartupError::Socket { .. }), "{e}");
        assert!(e.to_string().contains("/proc/sluice-cannot-be-here"), "{e}");
    }
}
