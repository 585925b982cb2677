//! The shim's operations endpoint (`metrics_listen`): Prometheus metrics
//! (`sluice_shim_*`: requests by operation and outcome, latency, open client
//! connections, descriptors, memory) and readiness: the agent answers a
//! call over the configured link (its TLS included), checked in the
//! background every few seconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use sluice_proto::shim::request::Op;
use sluice_telemetry::Readiness;

use crate::agent_link::AgentLink;

/// Time between checks of the agent.
const CHECK_EVERY: Duration = Duration::from_secs(5);

pub struct ShimMetrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    /// Open client connections.
    pub connections: IntGauge,
    /// Single GETs sent to the agent inside a shared call (`coalesce`).
    pub coalesced_gets: prometheus::IntCounter,
    /// Single GETs sent to the agent on a long-lived call (`get_stream`).
    pub streamed_gets: prometheus::IntCounter,
    /// GET streams opened to the agent framed, without HTTP/2.
    pub framed_links: prometheus::IntCounter,
    /// Single GETs sent on those.
    pub framed_gets: prometheus::IntCounter,
    process: sluice_telemetry::ProcessGauges,
    /// The last check of the agent: `None` before the first.
    agent: Mutex<Option<Result<(), String>>>,
}

/// The metrics label of an operation.
pub fn op_label(op: &Op) -> &'static str {
    match op {
        Op::Hello(_) => "hello",
        Op::Register(_) => "register",
        Op::Release(_) => "release",
        Op::Get(_) => "get",
        Op::GetBatch(_) => "get_batch",
        Op::Put(_) => "put",
        Op::Head(_) => "head",
        Op::List(_) => "list",
        Op::Delete(_) => "delete",
        Op::Stats(_) => "stats",
    }
}

impl ShimMetrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("sluice_shim".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "Client requests, by operation and outcome (ok or the error code)"),
            &["op", "outcome"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new("request_duration_seconds", "Client request latency in the shim").buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
            ]),
            &["op"],
        )?;
        let connections = IntGauge::new("connections", "Open client connections")?;
        registry.register(Box::new(connections.clone()))?;
        let process = sluice_telemetry::ProcessGauges::register(&registry, "shim")?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        let coalesced_gets = prometheus::IntCounter::new(
            "agent_gets_coalesced_total",
            "Single GETs sent to the agent together with others of their session in one call",
        )?;
        registry.register(Box::new(coalesced_gets.clone()))?;
        let streamed_gets = prometheus::IntCounter::new(
            "agent_gets_streamed_total",
            "Single GETs sent to the agent as messages of a long-lived GetStream call",
        )?;
        registry.register(Box::new(streamed_gets.clone()))?;
        let framed_links = prometheus::IntCounter::new(
            "agent_framed_links_total",
            "GET streams opened to a co-located agent as framed connections, without HTTP/2 ([agent] framed_gets)",
        )?;
        registry.register(Box::new(framed_links.clone()))?;
        let framed_gets = prometheus::IntCounter::new(
            "agent_gets_framed_total",
            "Single GETs sent to the agent on framed connections (a subset of agent_gets_streamed_total)",
        )?;
        registry.register(Box::new(framed_gets.clone()))?;
        Ok(Self {
            registry,
            requests,
            latency,
            connections,
            coalesced_gets,
            streamed_gets,
            framed_links,
            framed_gets,
            process,
            agent: Mutex::new(None),
        })
    }

    /// Counts a finished request; `error` is its error code name, if any.
    pub fn observe(&self, op: &str, error: Option<&str>, elapsed: Duration) {
        self.requests.with_label_values(&[op, error.unwrap_or("ok")]).inc();
        self.latency.with_label_values(&[op]).observe(elapsed.as_secs_f64());
    }

    /// Checks the agent over every connection of `link` every few
    /// seconds, for as long as the shim runs: calls go over all of them,
    /// so one that fails makes the shim not ready.
    pub async fn check_agent_forever(self: Arc<Self>, link: Arc<AgentLink>) {
        loop {
            let pings = link.every_channel().into_iter().map(|mut agent| async move {
                let ping = agent.renew(sluice_proto::agent::RenewRequest { session_ids: Vec::new() });
                match tokio::time::timeout(CHECK_EVERY, ping).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(crate::error::ShimError::from(e).to_string()),
                    Err(_) => Err(format!("the agent did not answer within {CHECK_EVERY:?}")),
                }
            });
            let r = futures::future::join_all(pings).await.into_iter().collect::<Result<(), String>>();
            *self.agent.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            sluice_telemetry::notify_status(&sluice_telemetry::Endpoints::readiness(&*self));
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }
}

impl sluice_telemetry::Endpoints for ShimMetrics {
    fn metrics(&self) -> String {
        self.process.render(&self.registry)
    }

    fn readiness(&self) -> Readiness {
        match &*self.agent.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Readiness::not_ready("checking the agent"),
            Some(Ok(())) => Readiness::ready("agent: answers"),
            Some(Err(e)) => Readiness::not_ready(format!("agent: {e}")),
        }
    }
}
