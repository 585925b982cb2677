//! The one-sided transports the agent runs, and which one each namespace
//! gets.
//!
//! * `tcp`: one software owner for everybody (descriptors are capability
//!   entries; the table isolates them).
//! * `verbs-rc` and `dc`: one protection domain **per tenant** — a tenant's
//!   windows are registered in its own PD, reached only through its own
//!   rdma_cm listener or DC target, so an rkey of tenant A means nothing on
//!   B's connections even if leaked.
//!
//! A namespace asking for `dc` on a device without mlx5 DC falls back to
//! `verbs-rc` (when `[dataplane] verbs_listen` is set) or to HTTP — loudly:
//! a warning at startup, and on every request the fallback counter
//! (`reason="dc_unavailable"`) and the request's `fallback_reason`.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_dataplane::dc::{DcDevice, DcOwner};
use sluice_dataplane::tcp::TcpOwner;
use sluice_dataplane::verbs::VerbsOwner;
use sluice_dataplane::{Transport, TransportKind};
use tracing::{info, warn};

use crate::config::{AgentConfig, NamespaceConfig};
use crate::metrics::Metrics;
use crate::model::DataPathMode;
use crate::s3::token_path::Fallback;

/// Errors starting a transport the configuration requires.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportStartError {
    #[error("binding the tcp data plane at {at}: {source}")]
    Tcp { at: std::net::SocketAddr, source: std::io::Error },
    #[error("verbs RC transport for tenant {tenant:?}: {why}")]
    Verbs { tenant: String, why: String },
}

/// A namespace whose transport cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum ChooseError {
    #[error("namespace {namespace:?} wants {transport} but that transport is not running")]
    NotRunning { namespace: String, transport: TransportKind },
    #[error("namespace {namespace:?} wants dc but [dataplane.dc] is not configured")]
    DcNotConfigured { namespace: String },
}

/// What a namespace moves its bytes with.
pub struct Chosen {
    /// `None`: plain HTTP.
    pub transport: Option<(Arc<dyn Transport>, TransportKind)>,
    /// Set when the configured transport is unavailable and this is the
    /// fallback: reported on every request.
    pub degraded: Option<Fallback>,
}

/// The running transports.
#[derive(Default)]
pub struct RunningTransports {
    tcp: Option<Arc<TcpOwner>>,
    /// Per tenant.
    verbs: HashMap<String, Arc<VerbsOwner>>,
    /// Per tenant: the DC owner, or why DC is unavailable.
    dc: HashMap<String, Result<Arc<DcOwner>, String>>,
}

fn wants(cfg: &AgentConfig, transport: TransportKind) -> impl Iterator<Item = &str> + '_ {
    cfg.tenants
        .iter()
        .filter(move |t| t.namespaces.iter().any(|n| n.data_path != DataPathMode::Http && n.transport == transport))
        .map(|t| t.name.as_str())
}

impl RunningTransports {
    /// Starts what the namespaces need (needs a tokio runtime).
    pub async fn start(cfg: &AgentConfig, metrics: &Metrics) -> Result<Self, TransportStartError> {
        let mut me = Self::default();
        if wants(cfg, TransportKind::Tcp).next().is_some() {
            let at = cfg.dataplane.tcp_listen;
            let (owner, listener) = TcpOwner::bind(at, cfg.dataplane.tcp_advertise)
                .await
                .map_err(|source| TransportStartError::Tcp { at, source })?;
            info!(addr = %owner.advertised(), "tcp data-plane transport listening");
            metrics.watch_rejections(owner.table().clone());
            tokio::spawn(owner.clone().serve(listener));
            me.tcp = Some(owner);
        }
        if let Some(dc) = &cfg.dataplane.dc {
            let device = DcDevice::open(&dc.settings()).map_err(|e| e.to_string());
            for tenant in wants(cfg, TransportKind::Dc) {
                let owner = device.as_ref().map_err(Clone::clone).and_then(|d| d.owner().map_err(|e| e.to_string()));
                match &owner {
                    Ok(o) => info!(tenant, dct = o.dct_number(), "mlx5 DC target ready"),
                    Err(why) => warn!(tenant, device = %dc.device, why = %why,
                        "mlx5 DC is unavailable: namespaces configured for dc fall back to verbs-rc or HTTP"),
                }
                me.dc.insert(tenant.to_owned(), owner);
            }
        }
        if let Some(ip) = cfg.dataplane.verbs_listen {
            // verbs-rc namespaces, and dc namespaces whose DC is unavailable.
            let dc_down = me.dc.iter().filter(|(_, o)| o.is_err()).map(|(t, _)| t.as_str());
            let tenants: std::collections::BTreeSet<&str> = wants(cfg, TransportKind::VerbsRc).chain(dc_down).collect();
            for tenant in tenants {
                let owner = VerbsOwner::bind(ip)
                    .map_err(|e| TransportStartError::Verbs { tenant: tenant.to_owned(), why: e.to_string() })?;
                info!(tenant, ip = %ip, port = owner.port(), "verbs RC data-plane transport listening");
                me.verbs.insert(tenant.to_owned(), owner);
            }
        }
        Ok(me)
    }

    /// Whether a co-located agent can take GPU memory: only through a
    /// running verbs transport (verbs RC or DC; the tcp transport copies
    /// with the CPU) whose device registers dma-bufs. Probed once, at
    /// start; a device that cannot is logged, and the capability exchange
    /// then offers no GPU memory (regions refused up front).
    pub fn gpu_path(&self) -> crate::hostmem::gpu::GpuPath {
        use crate::hostmem::gpu::{DmabufDevice, GpuPath};
        let mut pds = self.verbs.values().map(|o| o.pd()).chain(self.dc.values().flatten().map(|o| o.pd()));
        let Some(pd) = pds.next() else {
            return GpuPath::Unavailable(
                "no verbs transport runs (GPU memory needs a namespace with data_path = \"rdma\" over verbs-rc or dc)"
                    .into(),
            );
        };
        match DmabufDevice::probe(pd) {
            Ok(device) => {
                info!(device = device.name(), "GPU memory (dma-buf) regions: registered with the verbs device");
                GpuPath::Available(device)
            }
            Err(why) => {
                warn!(why = %why, "GPU memory (dma-buf) regions are not offered: the verbs device cannot register them");
                GpuPath::Unavailable(why)
            }
        }
    }

    /// The transport for `ns` of `tenant`.
    pub fn choose(&self, tenant: &str, ns: &NamespaceConfig) -> Result<Chosen, ChooseError> {
        if ns.data_path == DataPathMode::Http {
            return Ok(Chosen { transport: None, degraded: None });
        }
        let verbs = || self.verbs.get(tenant).map(|v| (v.clone() as Arc<dyn Transport>, TransportKind::VerbsRc));
        let running = |t: Option<(Arc<dyn Transport>, TransportKind)>| {
            t.map(|t| Chosen { transport: Some(t), degraded: None })
                .ok_or_else(|| ChooseError::NotRunning { namespace: ns.name.clone(), transport: ns.transport })
        };
        match ns.transport {
            TransportKind::Tcp => running(self.tcp.clone().map(|t| (t as Arc<dyn Transport>, TransportKind::Tcp))),
            TransportKind::VerbsRc => running(verbs()),
            TransportKind::Dc => match self.dc.get(tenant) {
                Some(Ok(o)) => Ok(Chosen { transport: Some((o.clone(), TransportKind::Dc)), degraded: None }),
                Some(Err(why)) => {
                    let to = verbs();
                    let via = if to.is_some() { "verbs-rc" } else { "HTTP" };
                    let degraded = Fallback::new("dc_unavailable", format!("mlx5 DC unavailable ({why}); using {via}"));
                    Ok(Chosen { transport: to, degraded: Some(degraded) })
                }
                None => Err(ChooseError::DcNotConfigured { namespace: ns.name.clone() }),
            },
        }
    }
}
