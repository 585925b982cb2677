//! The agent's readiness (`GET /ready` on `metrics_listen`): it can serve
//! when every namespace's store answers a one-key listing signed with the
//! namespace's credentials (reachable, signature accepted, bucket there).
//! Its transports and DOCA devices were opened at start, or it would not
//! have started. Stores are probed in the background, so a probe scrape
//! never waits on S3.

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
}

impl Health {
    pub fn readiness(&self) -> Readiness {
        let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        let Some(stores) = stores.as_ref() else { return Readiness::not_ready("probing the stores") };
        let mut detail = String::new();
        for (ns, r) in stores {
            match r {
                Ok(()) => detail.push_str(&format!("{ns}: store ok\n")),
                Err(e) => detail.push_str(&format!("{ns}: {e}\n")),
            }
        }
        Readiness { ready: stores.values().all(Result::is_ok), detail }
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
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }
}
