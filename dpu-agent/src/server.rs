//! Wires the agent together: memory socket, gRPC on TCP and/or a Unix
//! socket, metrics; writes the bound addresses; runs until shutdown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tracing::{info, warn};

use crate::agent::Agent;
use crate::config::AgentConfig;
use crate::grpc::GrpcService;
use crate::hostmem::colocated::ColocatedMemory;
use crate::hostmem::{BackendKind, HostMemory};
use crate::listeners::Listeners;
use crate::metrics::Metrics;
use crate::nic::guard::NicGuard;
use crate::nic::ovs::Ofctl;
use crate::nic::policy::{rules, RuleSet, TenantRules};
use crate::nic::NicError;
use crate::startup::StartupError;
use crate::transports::{RunningTransports, TransportStartError};

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    #[error("binding {what} at {at}: {source}")]
    Bind { what: &'static str, at: String, source: std::io::Error },
    #[error("writing {path}: {source}")]
    AddrFile { path: PathBuf, source: std::io::Error },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error(transparent)]
    Dataplane(#[from] TransportStartError),
    #[error("host memory backend: {0}")]
    HostMemory(String),
    #[error(transparent)]
    Nic(#[from] NicError),
    #[error("[runtime]: {0}")]
    Cores(#[from] crate::cores::CoresError),
}

/// Where the agent ended up listening.
#[derive(Debug, Clone)]
pub struct BoundAddrs {
    pub grpc: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

fn bind_unix(what: &'static str, path: &Path, mode: u32) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| ServeError::Bind { what, at: path.display().to_string(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A stale socket from a previous run would make bind fail.
    if path.exists() {
        std::fs::remove_file(path).map_err(err)?;
    }
    let l = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    Ok(l)
}

/// The configured host-memory backend, and the co-located one's handle
/// when it needs its memory socket served.
type Backend = (Arc<dyn HostMemory>, Option<Arc<ColocatedMemory>>);

fn host_memory(cfg: &AgentConfig, transports: &RunningTransports) -> Result<Backend, ServeError> {
    match cfg.host_memory.backend {
        BackendKind::Colocated => {
            // GPU memory as dma-bufs, when the verbs device registers them.
            let m = ColocatedMemory::with_gpu(transports.gpu_path());
            Ok((m.clone(), Some(m)))
        }
        BackendKind::Doca => doca_memory(cfg).map(|m| (m, None)),
    }
}

#[cfg(feature = "doca")]
fn doca_memory(cfg: &AgentConfig) -> Result<Arc<dyn HostMemory>, ServeError> {
    let d =
        cfg.host_memory.doca.as_ref().ok_or_else(|| ServeError::HostMemory("[host_memory.doca] is missing".into()))?;
    let m = crate::hostmem::doca::DocaMemory::open(d).map_err(|e| ServeError::HostMemory(e.to_string()))?;
    Ok(m)
}

#[cfg(not(feature = "doca"))]
fn doca_memory(_cfg: &AgentConfig) -> Result<Arc<dyn HostMemory>, ServeError> {
    Err(ServeError::HostMemory(
        "[host_memory] backend = \"doca\", but this sluice-agent was built without the `doca` feature \
         (cargo build -p sluice-agent --features doca; the Debian package has it)"
            .into(),
    ))
}

/// How long the agent waits at shutdown for its calls to finish: the
/// longest request deadline of any namespace, and a margin for answers.
fn shutdown_grace(cfg: &AgentConfig) -> std::time::Duration {
    let longest = cfg.tenants.iter().flat_map(|t| &t.namespaces).map(|n| n.request_timeout_ms).max().unwrap_or(0);
    std::time::Duration::from_millis(longest) + std::time::Duration::from_secs(10)
}

/// Runs the agent until `shutdown` resolves. With `config_path` (the file
/// `cfg` came from), SIGHUP re-reads it and applies the tenants' QoS limits.
pub async fn run(
    cfg: AgentConfig,
    config_path: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    crate::tls::install_crypto_provider();
    let metrics = Arc::new(Metrics::new()?);
    let transports = RunningTransports::start(&cfg, &metrics).await?;
    let (memory, colocated) = host_memory(&cfg, &transports)?;
    let agent = Arc::new(Agent::new(&cfg, memory, metrics.clone(), &transports)?);
    // Sessions of shims that died are closed within a lease.
    tokio::spawn(agent.clone().reap_sessions());
    // The store probes feed /ready and `systemctl status`.
    let probe_timeout = std::time::Duration::from_millis(cfg.failover.probe_timeout_ms);
    let health = Arc::new(crate::health::Health::new(&agent, probe_timeout));
    // Ejected endpoints are checked until they answer again.
    tokio::spawn(agent.failover().registry.clone().check_forever());
    start_upload_cleanup(&cfg, &agent, &metrics);
    // The NIC rules are in place (and guarded) before any listener opens.
    let nic = NicSlot {
        guard: Arc::default(),
        metrics: metrics.nic.clone(),
        health: health.clone(),
        listeners: listener_ports(&cfg),
    };
    nic.apply(&cfg).await?;

    // A reload whose NIC rules cannot be applied stops the agent (the rules
    // in place stay: fail closed).
    let (fatal_tx, mut fatal_rx) = tokio::sync::mpsc::channel::<NicError>(1);
    if let Some(path) = config_path {
        // Registered before "ready": SIGHUP's default action would kill us.
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|source| ServeError::Bind { what: "SIGHUP handler", at: path.display().to_string(), source })?;
        tokio::spawn(reload_on_sighup(hup, path, agent.clone(), nic.clone(), fatal_tx));
    }

    if let Some(colocated) = colocated {
        let mem_listener = bind_unix("memory socket", &cfg.memory_socket, cfg.socket_mode)?;
        tokio::spawn(colocated.serve(mem_listener));
    }

    let mut bound = BoundAddrs { grpc: None, metrics: None };
    tokio::spawn(health.clone().probe_forever(agent.clone()));
    if let Some(addr) = cfg.metrics_listen {
        let l = crate::metrics::bind(addr).await.map_err(|source| ServeError::Bind {
            what: "metrics",
            at: addr.to_string(),
            source,
        })?;
        bound.metrics = l.local_addr().ok();
        let endpoints = crate::health::AgentEndpoints { metrics: metrics.clone(), health };
        tokio::spawn(sluice_telemetry::serve(Arc::new(endpoints), l));
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // TCP listeners speak mutual TLS, or plaintext only when the config
    // says `insecure = true`.
    let tls = cfg.tls.acceptor().map_err(StartupError::from)?;
    if cfg.tls.insecure {
        warn!("[tls] insecure = true: the TCP control channel is plaintext; use it only on a trusted link");
    }
    let cores = crate::cores::Cores::start(&cfg.runtime)?.map(Arc::new);
    let mut listeners = Listeners::new(stop_rx.clone(), cores, tls, metrics.clone());
    if let Some(addr) = cfg.grpc_listen {
        let l = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind {
            what: "gRPC",
            at: addr.to_string(),
            source,
        })?;
        bound.grpc = l.local_addr().ok();
        listeners.tcp(l, GrpcService::new(agent.clone()).stopping_on(stop_rx.clone()), "");
    }
    // Each tenant's own listener: its sessions are bound to it.
    for (tenant, addr) in tenant_listeners(&cfg)? {
        let l = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind {
            what: "a tenant's gRPC listener",
            at: format!("{addr} (tenant {tenant})"),
            source,
        })?;
        listeners.tcp(l, GrpcService::for_listener(agent.clone(), &tenant).stopping_on(stop_rx.clone()), &tenant);
        info!(tenant, %addr, "tenant listener");
    }
    if let Some(path) = &cfg.grpc_socket {
        let l = bind_unix("gRPC socket", path, cfg.socket_mode)?;
        listeners.unix(l, GrpcService::new(agent.clone()).stopping_on(stop_rx.clone()));
    }
    let mut servers = listeners.servers;

    if let Some(path) = &cfg.addr_file {
        let text = format!(
            "grpc = \"{}\"\nmetrics = \"{}\"\n",
            bound.grpc.map(|a| a.to_string()).unwrap_or_default(),
            bound.metrics.map(|a| a.to_string()).unwrap_or_default()
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| ServeError::AddrFile { path: path.clone(), source })?;
    }
    info!(grpc = ?bound.grpc, grpc_socket = ?cfg.grpc_socket, metrics = ?bound.metrics,
          memory_socket = %cfg.memory_socket.display(), "agent ready");
    sluice_telemetry::notify_ready();

    tokio::select! {
        () = shutdown => {}
        Some(e) = fatal_rx.recv() => return Err(e.into()),
        Some(res) = servers.join_next() => {
            // A server ending on its own is an error worth surfacing.
            if let Ok(Err(e)) = res {
                return Err(e.into());
            }
        }
    }
    info!("agent shutting down");
    let _ = stop_tx.send(true);
    // Calls in flight finish within their deadlines (the longest of any
    // namespace); a peer that keeps a call open past them (one that stops
    // reading its answers) does not keep the agent from stopping.
    let grace = shutdown_grace(&cfg);
    let drained = tokio::time::timeout(grace, async { while servers.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(?grace, "calls still open past every deadline at shutdown; ending them");
        servers.abort_all();
    }
    let _ = std::fs::remove_file(&cfg.memory_socket);
    if let Some(p) = &cfg.grpc_socket {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Aborts the multipart uploads the last run left open, and from then on
/// those whose abort fails, in the background (a store that is down must
/// not keep the agent from starting); and, when `[uploads]
/// abort_incomplete_after_days` allows it, gives each namespace's bucket
/// the lifecycle rule for the uploads no journal names.
fn start_upload_cleanup(cfg: &AgentConfig, agent: &Arc<Agent>, metrics: &Metrics) {
    if let Some(journal) = &agent.failover().journal {
        let aborted = metrics.multipart_aborts.with_label_values(&["left"]);
        tokio::spawn(crate::s3::sweeper::sweep_forever(journal.clone(), agent.stores(), aborted));
    }
    let Some(days) = cfg.uploads.abort_incomplete_after_days else { return };
    let stores = agent.stores();
    tokio::spawn(async move {
        for (ns, store) in stores {
            match store.ensure_abort_rule(days).await {
                Ok(change) => info!(namespace = %ns, days, ?change, "lifecycle rule for incomplete multipart uploads"),
                Err(e) => warn!(namespace = %ns, error = %e,
                    "cannot set the bucket's lifecycle rule for incomplete multipart uploads (needs \
                     s3:GetLifecycleConfiguration and s3:PutLifecycleConfiguration)"),
            }
        }
    });
}

/// The rule set `[nic]` asks for, if the config has one (tenants without
/// `[tenants.nic]` get no function), with the agent's MAC resolved.
pub fn nic_rules(cfg: &AgentConfig) -> Option<Result<RuleSet, NicError>> {
    let nic = cfg.nic.as_ref()?;
    let tenants: Vec<TenantRules<'_>> = cfg
        .tenants
        .iter()
        .filter_map(|t| {
            Some(TenantRules { name: &t.name, nic: t.nic.as_ref()?, bytes_per_sec: t.limits.bytes_per_sec })
        })
        .collect();
    Some(crate::nic::agent_mac(nic).and_then(|mac| rules(nic, mac, &tenants)))
}

/// Each tenant's own listener (`[tenants.nic] listener_port` on the
/// agent's `[nic] agent_address`).
fn tenant_listeners(cfg: &AgentConfig) -> Result<Vec<(String, SocketAddr)>, NicError> {
    cfg.tenants
        .iter()
        .filter_map(|t| Some((t, t.nic.as_ref()?)))
        .map(|(t, n)| match &cfg.nic {
            Some(nic) => Ok((t.name.clone(), SocketAddr::from((nic.agent_address, n.listener_port)))),
            None => Err(NicError::Config(format!("tenant {:?} has [tenants.nic] but the agent has no [nic]", t.name))),
        })
        .collect()
}

/// The bridge the agent programs (as configured at start) and its guard.
type Guarded = Option<(crate::nic::config::NicConfig, Arc<NicGuard>)>;

/// The NIC guard once the agent programs a bridge, and what it reports to.
#[derive(Clone)]
struct NicSlot {
    guard: Arc<std::sync::Mutex<Guarded>>,
    metrics: crate::nic::guard::GuardMetrics,
    health: Arc<crate::health::Health>,
    /// The tenants and their listener ports as bound at start: rules for
    /// others would send a tenant's functions to a listener that serves
    /// another tenant, or to none.
    listeners: std::collections::BTreeMap<String, Option<u16>>,
}

/// Each tenant's `[tenants.nic] listener_port` (none without a NIC part).
fn listener_ports(cfg: &AgentConfig) -> std::collections::BTreeMap<String, Option<u16>> {
    cfg.tenants.iter().map(|t| (t.name.clone(), t.nic.as_ref().map(|n| n.listener_port))).collect()
}

impl NicSlot {
    /// Makes the bridge hold `cfg`'s NIC rules and keeps them there
    /// (nothing without `[nic]`, or with `program_ovs = false`).
    async fn apply(&self, cfg: &AgentConfig) -> Result<(), NicError> {
        let current = self.guard.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(nic) = cfg.nic.clone() else {
            if current.is_some() {
                warn!(
                    "[nic] was removed from the config: the rules in place stay and are still guarded until a restart"
                );
            }
            return Ok(());
        };
        if !nic.program_ovs {
            info!(bridge = %nic.bridge, "NIC rules not programmed (program_ovs = false)");
            return Ok(());
        }
        if let Some((was, _)) = &current {
            if (&was.bridge, &was.ofctl_target, &was.ovs_rundir) != (&nic.bridge, &nic.ofctl_target, &nic.ovs_rundir) {
                return Err(NicError::Config(format!(
                    "[nic] bridge {:?} (ofctl_target, ovs_rundir) changed: moving the rules to another bridge needs a restart",
                    was.bridge
                )));
            }
        }
        // A tenant removed loses its flows (its access ends at once); one
        // added, or a listener port changed, needs the listeners bound at
        // start to change too.
        if let Some((name, port)) = listener_ports(cfg).into_iter().find(|(n, p)| self.listeners.get(n) != Some(p)) {
            return Err(NicError::Config(format!(
                "tenant {name:?} was added, or its [tenants.nic] listener_port changed (now {port:?}): the listeners \
                 were bound at start, and rules for it would send its functions to another tenant's listener or to \
                 none; restart the agent"
            )));
        }
        let rules = match nic_rules(cfg) {
            Some(r) => r?,
            None => return Ok(()),
        };
        let bridge = rules.bridge.clone();
        let metrics = self.metrics.clone();
        let switch = Ofctl::new(&nic).with_timeout(crate::nic::guard::CHECK_TIMEOUT_SECS);
        // ovs-ofctl is a child process: off the async workers.
        let (guard, applied) = tokio::task::spawn_blocking(move || match current {
            Some((_, g)) => g.apply(rules).map(|a| (g, a)),
            None => NicGuard::start(Box::new(switch), rules, metrics),
        })
        .await
        .map_err(|e| NicError::Ovs { command: "reconcile".into(), message: e.to_string() })??;
        let mut slot = self.guard.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            guard
                .watch()
                .map_err(|e| NicError::Ovs { command: "starting the NIC guard".into(), message: e.to_string() })?;
            self.health.watch_nic(guard.status());
        }
        *slot = Some((nic, guard));
        info!(
            bridge,
            added = applied.flows_added,
            removed = applied.flows_removed,
            unchanged = applied.unchanged,
            meters_set = applied.meters_set,
            meters_removed = applied.meters_removed,
            "NIC rules in place"
        );
        Ok(())
    }
}

/// On every SIGHUP: re-read the config file once and apply its credentials,
/// NIC rules and QoS limits; a file that cannot be read or parsed changes
/// nothing; a valid file whose NIC rules cannot be applied is fatal
/// (`fatal`). Every SIGHUP ends with exactly one line, "SIGHUP: reload done"
/// or "SIGHUP: config not re-read", so that operators (and tests) can tell a
/// reload has finished.
async fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    path: PathBuf,
    agent: Arc<Agent>,
    nic: NicSlot,
    fatal: tokio::sync::mpsc::Sender<NicError>,
) {
    while hup.recv().await.is_some() {
        let cfg = match AgentConfig::from_file(&path) {
            Ok(cfg) => cfg,
            Err(e) => {
                tracing::error!(
                    config = %path.display(),
                    error = %e,
                    "SIGHUP: config not re-read; keeping the running keys, NIC rules and QoS limits"
                );
                continue;
            }
        };
        let mut failures = 0usize;
        for change in agent.signers().rotate(&cfg) {
            match change {
                Ok(c) => info!(config = %path.display(), change = %c, "SIGHUP: credentials rotated"),
                Err(e) => {
                    failures += 1;
                    tracing::error!(config = %path.display(), error = %e, "SIGHUP: credentials")
                }
            }
        }
        match nic.apply(&cfg).await {
            Ok(()) => {}
            // Refused before anything changed: the running rules stay.
            Err(e @ (NicError::Config(_) | NicError::AgentMac(_) | NicError::UnknownPort { .. })) => {
                failures += 1;
                tracing::error!(config = %path.display(), error = %e, "SIGHUP: NIC rules not changed")
            }
            Err(e) => {
                tracing::error!(config = %path.display(), error = %e, "SIGHUP: NIC rules cannot be applied; stopping");
                let _ = fatal.send(e).await;
                return;
            }
        }
        match agent.quotas().apply(&cfg) {
            Ok(changes) if changes.is_empty() => info!(config = %path.display(), "SIGHUP: QoS limits unchanged"),
            Ok(changes) => {
                for c in &changes {
                    info!(config = %path.display(), change = %c, "SIGHUP: QoS limits reloaded");
                }
            }
            Err(e) => {
                failures += 1;
                tracing::error!(config = %path.display(), error = %e, "SIGHUP: QoS limits not changed")
            }
        }
        info!(config = %path.display(), failures, "SIGHUP: reload done");
    }
}
