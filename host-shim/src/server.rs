//! The top of the shim: binds the local API socket, builds each layer's
//! state from the config (the agent link, the memory backend, the session
//! layer, the connections' shared state, the metrics) and serves clients.
//! Each module gets only what it uses; nothing below imports this one.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::agent_link::AgentLink;
use crate::config::ShimConfig;
use crate::connection::ConnectionContext;
use crate::error::StartupError;
use crate::memory::MemoryBackend;
use crate::metrics::ShimMetrics;
use crate::session::SessionContext;

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
    let agent = Arc::new(AgentLink::new(&cfg.agent)?);
    // Before serving: clients wait in the listen backlog meanwhile.
    agent.warm(std::time::Duration::from_secs(1)).await;
    let shim_id = cfg.shim_id.clone().unwrap_or_else(host_name);
    let mut secrets = HashMap::new();
    for (tenant, path) in &cfg.tenant_secrets {
        let secret = sluice_proto::auth::read_secret_file(path)
            .map_err(|source| StartupError::TenantSecret { tenant: tenant.clone(), source })?;
        secrets.insert(tenant.clone(), secret);
    }
    let memory = MemoryBackend::open(&cfg)?;
    let metrics = Arc::new(ShimMetrics::new().map_err(|e| StartupError::Metrics(e.to_string()))?);
    let ops_listener = match cfg.metrics_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|source| StartupError::Bind {
            what: "metrics_listen",
            at: addr.to_string(),
            source,
        })?),
        None => None,
    };
    let socket = cfg.socket.clone();
    let config = Arc::new(cfg);
    let sessions = Arc::new(SessionContext::new(
        agent.clone(),
        shim_id,
        secrets,
        memory,
        config.clone(),
        crate::session::GetCounters {
            coalesced: metrics.coalesced_gets.clone(),
            streamed: metrics.streamed_gets.clone(),
            framed_links: metrics.framed_links.clone(),
            framed_gets: metrics.framed_gets.clone(),
        },
    ));
    if let Some(streams) = sessions.get_streams() {
        streams.warm();
    }
    let connections = Arc::new(ConnectionContext::new(config.clone(), sessions.clone(), metrics.clone()));
    let renew = tokio::spawn(sessions.clone().renew_loop());
    // The agent check feeds /ready and `systemctl status`.
    let mut ops = vec![tokio::spawn(metrics.clone().check_agent_forever(agent))];
    if let Some(l) = ops_listener {
        info!(metrics = ?l.local_addr().ok(), "operations endpoint: /metrics, /ready");
        ops.push(tokio::spawn(sluice_telemetry::serve(metrics.clone(), l)));
    }
    info!(socket = %socket.display(), agent = %config.agent.grpc, memory = sessions.memory().name(), "shim ready");
    sluice_telemetry::notify_ready();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    tokio::spawn(crate::connection::serve(connections.clone(), stream));
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
