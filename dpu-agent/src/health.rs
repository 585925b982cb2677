//! The agent's readiness (`GET /ready` on `metrics_listen`): it can serve
//! when every namespace has an endpoint that serves it — one whose health
//! is up (`s3::endpoints`: not ejected) and that answered the last one-key
//! listing signed with the namespace's credentials (reachable, signature
//! accepted, bucket there). A namespace with an endpoint down but another
//! serving is ready but degraded, and `/ready` names the endpoint; it is
//! not ready only when no endpoint serves. Each endpoint is probed on its
//! own with its own short deadline, so one that hangs fails its probe, not
//! the namespace's. Its transports and DOCA devices were opened at start,
//! or it would not have started; the answer also says which host memory it
//! reaches and each namespace's transport (and why, when it runs on a
//! fallback). Stores are probed in the background, so a probe scrape never
//! waits on S3; endpoint health is read live.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_telemetry::Readiness;

use crate::agent::Agent;
use crate::s3::endpoints::{EndpointStatus, NotServing};
use crate::s3::store::ObjectStore;

/// Time between store probes.
const PROBE_EVERY: Duration = Duration::from_secs(15);

/// A namespace's last probe, one result per endpoint, and its store (for
/// the endpoints' live health).
struct Probed {
    endpoints: Vec<(String, Result<(), NotServing>)>,
    /// When the probe started.
    at: Instant,
    store: Option<Arc<ObjectStore>>,
}

/// The readiness of the agent.
#[derive(Default)]
pub struct Health {
    /// By `tenant/namespace`; `None` until the first probe.
    stores: Mutex<Option<BTreeMap<String, Probed>>>,
    /// What was opened at start: host memory, each namespace's transport.
    opened: String,
    /// The NIC guard's view, when the agent programs a bridge: the agent
    /// is not ready while its rules are not verified on it.
    nic: std::sync::OnceLock<Arc<crate::nic::guard::NicStatus>>,
    /// Each endpoint probe's deadline.
    probe_timeout: Duration,
}

/// How one namespace stands.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Down,
    Degraded,
    Ok,
}

/// A namespace's verdict and its line in `/ready`, from each endpoint's
/// probe (started `at`) and (when known) its live health, which is fresher:
/// an endpoint ejected since the probe is down; one that failed the probe
/// but answered since (it came back, or it was only slower than the probe's
/// deadline under load) serves.
fn namespace_line(
    ns: &str,
    probes: &[(String, Result<(), NotServing>)],
    at: Instant,
    live: &[EndpointStatus],
) -> (Verdict, String) {
    let serving: Vec<(&str, Result<(), String>)> = probes
        .iter()
        .map(|(url, probed)| {
            let now = live.iter().find(|s| &s.url == url);
            let r = match (now, probed) {
                (Some(s), _) if !s.up => Err(match s.down_for {
                    Some(d) => format!("ejected {:.1} s ago: {}", d.as_secs_f64(), s.last_error),
                    None => s.last_error.clone(),
                }),
                (_, Ok(())) => Ok(()),
                (Some(s), Err(NotServing::Endpoint(_))) if s.last_answer.is_some_and(|t| t > at) => Ok(()),
                (_, Err(e)) => Err(e.to_string()),
            };
            (url.as_str(), r)
        })
        .collect();
    let up: Vec<&str> = serving.iter().filter(|(_, r)| r.is_ok()).map(|(u, _)| *u).collect();
    let down: Vec<String> =
        serving.iter().filter_map(|(u, r)| r.as_ref().err().map(|e| format!("endpoint {u} is down ({e})"))).collect();
    match (up.is_empty(), down.is_empty()) {
        (false, true) => (Verdict::Ok, format!("{ns}: store ok")),
        (false, false) => {
            (Verdict::Degraded, format!("{ns}: degraded: {}; served by {}", down.join("; "), up.join(", ")))
        }
        (true, _) if serving.len() == 1 => {
            (Verdict::Down, format!("{ns}: {}", serving[0].1.as_ref().err().cloned().unwrap_or_default()))
        }
        (true, _) => (Verdict::Down, format!("{ns}: no endpoint serves: {}", down.join("; "))),
    }
}

impl Health {
    /// The readiness of `agent`, whose devices and transports are open.
    pub fn new(agent: &Agent, probe_timeout: Duration) -> Self {
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
        Self { stores: Mutex::default(), opened, nic: Default::default(), probe_timeout }
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
        let mut lines: Vec<(Verdict, String)> = stores
            .iter()
            .map(|(ns, p)| {
                let live = p.store.as_ref().map(|s| s.endpoint_status()).unwrap_or_default();
                namespace_line(ns, &p.endpoints, p.at, &live)
            })
            .collect();
        // Down, then degraded, then ok; by name within each.
        lines.sort();
        for (_, line) in &lines {
            detail.push_str(line);
            detail.push('\n');
        }
        if let Some((true, what)) = &nic {
            detail.push_str(&format!("{what}\n"));
        }
        detail.push_str(&self.opened);
        let nic_ok = nic.is_none_or(|(in_place, _)| in_place);
        Readiness { ready: nic_ok && lines.iter().all(|(v, _)| *v != Verdict::Down), detail }
    }

    /// Probes every endpoint of every namespace now and then, for as long
    /// as the agent runs.
    pub async fn probe_forever(self: Arc<Self>, agent: Arc<Agent>) {
        let timeout = self.probe_timeout;
        loop {
            let runs = agent.stores().into_iter().map(|(name, store)| async move {
                let at = Instant::now();
                let endpoints = store.probe_endpoints(timeout).await;
                for (url, r) in &endpoints {
                    if let Err(e) = r {
                        tracing::warn!(namespace = %name, endpoint = %url, error = %e, "readiness: store probe failed");
                    }
                }
                (name, Probed { endpoints, at, store: Some(store) })
            });
            let stores: BTreeMap<String, Probed> = futures::future::join_all(runs).await.into_iter().collect();
            *self.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
            sluice_telemetry::notify_status(&self.readiness());
            tokio::time::sleep(PROBE_EVERY).await;
        }
    }
}

/// What the agent's operations endpoint shows.
pub struct AgentEndpoints {
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub health: std::sync::Arc<Health>,
}

impl sluice_telemetry::Endpoints for AgentEndpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }
    fn readiness(&self) -> sluice_telemetry::Readiness {
        self.health.readiness()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probed(results: &[(&str, Result<(), &str>)]) -> Probed {
        let endpoints = results.iter().map(|(u, r)| ((*u).to_owned(), r.map_err(down))).collect();
        Probed { endpoints, at: Instant::now(), store: None }
    }

    fn down(e: &str) -> NotServing {
        NotServing::Endpoint(e.to_owned())
    }

    #[test]
    fn a_failing_store_is_the_first_reason() {
        let h = Health::default();
        let mut stores = BTreeMap::new();
        stores.insert("alpha/data".to_owned(), probed(&[("http://a", Ok(()))]));
        stores.insert("beta/x".to_owned(), probed(&[("http://b", Err("cannot reach the store"))]));
        *h.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
        let r = h.readiness();
        assert!(!r.ready);
        assert_eq!(r.summary(), "not ready: beta/x: cannot reach the store");
        assert!(r.detail.contains("alpha/data: store ok"), "{}", r.detail);
    }

    /// One endpoint down (by its probe, or ejected by its health) and
    /// another serving: ready, degraded, the endpoint named; none serving:
    /// not ready, each named.
    #[test]
    fn a_namespace_with_one_endpoint_down_is_ready_but_degraded() {
        let h = Health::default();
        let mut stores = BTreeMap::new();
        stores.insert("alpha/data".to_owned(), probed(&[("http://a", Ok(())), ("http://b", Err("no answer"))]));
        stores.insert("alpha/ok".to_owned(), probed(&[("http://a", Ok(()))]));
        *h.stores.lock().unwrap_or_else(|p| p.into_inner()) = Some(stores);
        let r = h.readiness();
        assert!(r.ready, "{}", r.detail);
        assert_eq!(
            r.summary(),
            "ready: alpha/data: degraded: endpoint http://b is down (no answer); served by http://a"
        );

        // Live health beats the last probe: the probe passed, but the
        // endpoint has been ejected since.
        let at = Instant::now();
        let live = [EndpointStatus {
            url: "http://a".into(),
            up: false,
            last_error: "connection refused".into(),
            down_for: Some(Duration::from_millis(1500)),
            last_answer: None,
        }];
        let (v, line) = namespace_line("n", &[("http://a".into(), Ok(())), ("http://b".into(), Ok(()))], at, &live);
        assert_eq!(v, Verdict::Degraded);
        assert_eq!(
            line,
            "n: degraded: endpoint http://a is down (ejected 1.5 s ago: connection refused); served by http://b"
        );

        // ... and back since its probe failed (it answered since): ok;
        // not answered since: down; an error of the namespace's (a 403)
        // stands until the next probe.
        let back = [EndpointStatus { up: true, down_for: None, last_answer: Some(Instant::now()), ..live[0].clone() }];
        let (v, _) = namespace_line("n", &[("http://a".into(), Err(down("refused")))], at, &back);
        assert_eq!(v, Verdict::Ok);
        let (v, _) = namespace_line("n", &[("http://a".into(), Err(down("hung")))], Instant::now(), &back);
        assert_eq!(v, Verdict::Down);
        let denied = NotServing::Namespace("the store denied access".into());
        let (v, line) = namespace_line("n", &[("http://a".into(), Err(denied))], at, &back);
        assert_eq!((v, line.as_str()), (Verdict::Down, "n: the store denied access"));

        let both = [("http://a".to_owned(), Err(down("refused"))), ("http://b".to_owned(), Err(down("hung")))];
        let (v, line) = namespace_line("n", &both, at, &[]);
        assert_eq!(v, Verdict::Down);
        assert_eq!(
            line,
            "n: no endpoint serves: endpoint http://a is down (refused); endpoint http://b is down (hung)"
        );
    }
}
