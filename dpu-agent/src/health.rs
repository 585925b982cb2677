//! The agent's readiness (`GET /ready` on `metrics_listen`): it can serve
//! when every namespace's store answers a one-key listing signed with the
//! namespace's credentials (reachable, signature accepted, bucket there).
//! Its transports and DOCA devices were opened at start, or it would not
//! have started; the answer also says which host memory it reaches and
//! each namespace's transport (and why, when it runs on a fallback).
//! Stores are probed in the background, so a probe scrape never waits on S3.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_telemetry::Readiness;

use crate::agent::Agent;

/// Time between store probes.
const PROBE_EVERY: Duration = Duration::from_secs(15);
/// Longest a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The last probe of each namespace (`tenant/namespace`).
#[derive(Default)]
pub struct Health {
    stores: Mutex<Option<BTreeMap<String, Result<(), String>>>>,
    /// What was opened at start: host memory, each namespace's transport.
    opened: String,
    /// The NIC guard's view, when the agent programs a bridge: the agent
    /// is not ready while its rules are not verified on it.
    nic: std::sync::OnceLock<Arc<crate::nic::guard::NicStatus>>,
}

impl Health {
    /// The readiness of `agent`, whose devices and transports are open.
    pub fn new(agent: &Agent) -> Self {
        let memory = agent.memory_capabilities();
        let gpu_direct = memory.kinds.contains(&crate::hostmem::MemoryKind::GpuDmabuf);
        let mut opened = match (&memory.gpu_staging, gpu_direct) {
            (Some(gpu), _) => format!("host memory: DOCA exports of host and GPU memory ({gpu})\n"),
            (None, true) => "host memory: co-located memfds; GPU memory as dma-bufs registered with the verbs \
                             device (direct RDMA placement only)\n"
                .to_owned(),
            (None, false) => "host memory: co-located memfds\n".to_owned(),
        };
        for (name, store) in agent.stores() {
            let c = store.capabilities(&name);
            let transport = c.transport.map_or("none (HTTP)", |t| t.as_str());
            match c.degraded {
                Some(why) => opened.push_str(&format!("{name}: transport {transport}, degraded: {why}\n")),
                None => opened.push_str(&format!("{name}: transport {transport}\n")),
            }
        }
        Self { stores: Mutex::default(), opened, nic: Default::default() }
    }

    /// Readiness also requires the NIC rules in place.
    pub fn watch_nic(&self, status: Arc<crate::nic::guard::NicStatus>) {
        let _ = self.nic.set(status);
    }

    pub fn readiness(&self) -> Readiness {
        let nic = self.nic.get().map(|s| s.get());
        // Failures first: `systemctl status` shows the first line.
        let mut detail = String::new();
        if let Some((false, why)) = &nic {
            detail.push_str(&format!("{why}\n"));
        }
        let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        let Some(stores) = stores.as_ref() else {
            return Readiness::not_ready(format!("{detail}probing the stores\n{}", self.opened));
        };
        for (ns, r) in stores.iter().filter(|(_, r)| r.is_err()).chain(stores.iter().filter(|(_, r)| r.is_ok())) {
            match r {
                Ok(()) => detail.push_str(&format!("{ns}: store ok\n")),
                Err(e) => detail.push_str(&format!("{ns}: {e}\n")),
            }
        }
        if let Some((true, what)) = &nic {
            detail.push_str(&format!("{what}\n"));
        }
        detail.push_str(&self.opened);
        let nic_ok = nic.is_none_or(|(in_place, _)| in_place);
        Readiness { ready: nic_ok && stores.values().all(Result::is_ok), detail }
    }

    /// Probes every namespace's store now and then, for as long as the
    /// agent runs.
    pub async fn probe_forever(self: Arc<Self>, agent: Arc<Agent>) {
        loop {
            let mut stores = BTreeMap::new();
            for (name, store) in agent.stores() {
                let r = match tokio::time::timeout(PROBE_TIMEOUT, store.list_page("", "", 1, "", "ready-probe")).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
                };
                if let Err(e) = &r {
                    tracing::warn!(namespace = %name, error = %e, "readiness: store probe failed");
                }
                stores.insert(name, r);
            }
            *self.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
            sluice_telemetry::notify_status(&self.readiness());
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_store_is_the_first_reason() {
        let h = Health::default();
        let mut stores = BTreeMap::new();
        stores.insert("alpha/data".to_owned(), Ok(()));
        stores.insert("beta/x".to_owned(), Err("cannot reach the store".to_owned()));
        *h.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
        let r = h.readiness();
        assert!(!r.ready);
        assert_eq!(r.summary(), "not ready: beta/x: cannot reach the store");
        assert!(r.detail.contains("alpha/data: store ok"), "{}", r.detail);
    }
}
