//! Concurrent single GETs of one agent session, sent as one `GetMany`.
//!
//! A loader that reads with many threads, each calling `get`, makes one
//! agent call per object. A unary call costs the agent and the shim far
//! more than an item of a batch: at 4 KiB and 16 in flight on the 2-core
//! machine, 100 µs of agent CPU and 72 µs of shim CPU per single GET
//! against 64 and 30 per batch item (`bench/results/loaders.json`).
//!
//! A GET of a session with no other GET in flight goes straight out as a
//! `Get` of its own, as before (one at a time pays nothing). One that finds
//! others in flight is queued; the first to queue starts a task that waits
//! one turn of the runtime (every frame the shim has already read is
//! handled meanwhile) and then sends whatever queued in one call — or, if
//! it is still alone, as a `Get` of its own. Items keep their own request id and deadline
//! (`GetItem.request_id`, `timeout_ms`), their own answer and their own
//! error; a failure of the call as a whole (the agent no longer knows the
//! session, the agent went away) is every item's, as it would have been
//! for each call alone, and `Session::call` retries each the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use sluice_proto::agent::{self as apb, agent_client::AgentClient};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Most GETs in one coalesced call (the agent runs up to 64 items of a
/// batch at once).
pub const MAX_COALESCED: usize = 64;

type Answer = Result<apb::GetReply, tonic::Status>;

struct Queued {
    req: apb::GetRequest,
    tx: oneshot::Sender<Answer>,
}

/// One session's GETs: those waiting for the next call, and how many are
/// in flight in all (queued, sent, or going alone).
#[derive(Default)]
struct SessionGets {
    queued: Vec<Queued>,
    in_flight: usize,
}

/// The GETs waiting for their session's next call.
pub struct Coalescer {
    sessions: Mutex<HashMap<String, SessionGets>>,
    /// GETs sent inside a shared call (not counting lone ones).
    coalesced: IntCounter,
}

/// Counts one GET in flight for its session until dropped (answered, or
/// its caller gone).
struct InFlight<'a> {
    owner: &'a Coalescer,
    session: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut sessions = self.owner.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sessions.get_mut(&self.session) {
            s.in_flight = s.in_flight.saturating_sub(1);
            // No entry outlives its session's last GET.
            if s.in_flight == 0 && s.queued.is_empty() {
                sessions.remove(&self.session);
            }
        }
    }
}

impl Coalescer {
    /// Sessions with GETs in flight (tests: entries must not outlive them).
    #[cfg(test)]
    fn sessions_held(&self) -> usize {
        self.sessions.lock().unwrap().len()
    }

    pub fn new(coalesced: IntCounter) -> Arc<Self> {
        Arc::new(Self { sessions: Mutex::new(HashMap::new()), coalesced })
    }

    /// Sends `req` over `agent` — alone, or with the other GETs of its
    /// session that arrive by the next turn of the runtime; answers as
    /// `agent.get` would.
    pub async fn get(
        self: &Arc<Self>,
        mut agent: AgentClient<Channel>,
        req: apb::GetRequest,
    ) -> Result<tonic::Response<apb::GetReply>, tonic::Status> {
        let session = req.session_id.clone();
        let (tx, rx) = oneshot::channel();
        let (alone, first) = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let s = sessions.entry(session.clone()).or_default();
            s.in_flight += 1;
            if s.in_flight == 1 {
                (Some(req), false)
            } else {
                s.queued.push(Queued { req, tx });
                (None, s.queued.len() == 1)
            }
        };
        let _in_flight = InFlight { owner: self, session: session.clone() };
        if let Some(req) = alone {
            return agent.get(req).await;
        }
        if first {
            // A task of its own: the call must go out even if this
            // caller's request is abandoned meanwhile.
            let this = self.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let batch = {
                    let mut sessions = this.sessions.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(s) = sessions.get_mut(&session) else { return };
                    let batch = std::mem::take(&mut s.queued);
                    // Their callers may all have gone meanwhile.
                    if s.in_flight == 0 {
                        sessions.remove(&session);
                    }
                    batch
                };
                this.send(agent, session, batch).await;
            });
        }
        match rx.await {
            Ok(answer) => answer.map(tonic::Response::new),
            Err(_) => Err(tonic::Status::unavailable("the coalesced call to the agent was dropped")),
        }
    }

    async fn send(&self, agent: AgentClient<Channel>, session: String, mut batch: Vec<Queued>) {
        let mut rest = Vec::new();
        while !batch.is_empty() {
            if batch.len() > MAX_COALESCED {
                rest = batch.split_off(MAX_COALESCED);
            }
            match batch.len() {
                1 => {
                    let Some(one) = batch.pop() else { break };
                    let answer = agent.clone().get(one.req).await.map(tonic::Response::into_inner);
                    let _ = one.tx.send(answer);
                }
                n => {
                    self.coalesced.inc_by(n as u64);
                    one_call(agent.clone(), &session, std::mem::take(&mut batch)).await;
                }
            }
            batch = std::mem::take(&mut rest);
        }
    }
}

/// One `GetMany` for `batch`; every item answered exactly once.
async fn one_call(mut agent: AgentClient<Channel>, session: &str, batch: Vec<Queued>) {
    let (items, mut waiting): (Vec<apb::GetItem>, Vec<Option<oneshot::Sender<Answer>>>) =
        batch.into_iter().map(|q| (item_of(q.req), Some(q.tx))).unzip();
    let req = apb::GetManyRequest { session_id: session.to_owned(), request_id: String::new(), timeout_ms: 0, items };
    let mut stream = match agent.get_many(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            for tx in waiting.into_iter().flatten() {
                let _ = tx.send(Err(status.clone()));
            }
            return;
        }
    };
    let mut failed = None;
    loop {
        match stream.message().await {
            Ok(Some(item)) => {
                let Some(tx) = waiting.get_mut(item.index as usize).and_then(Option::take) else {
                    tracing::warn!(index = item.index, "the agent answered an item it was not sent, or twice; ignored");
                    continue;
                };
                let answer = match item.result {
                    Some(apb::get_many_item::Result::Ok(r)) => Ok(r),
                    Some(apb::get_many_item::Result::Error(d)) => Err(sluice_proto::status::to_status(&d)),
                    None => Err(tonic::Status::internal("the agent answered an item without a result")),
                };
                let _ = tx.send(answer);
            }
            Ok(None) => break,
            Err(status) => {
                failed = Some(status);
                break;
            }
        }
    }
    let failed =
        failed.unwrap_or_else(|| tonic::Status::unavailable("the agent ended the call before answering every GET"));
    for tx in waiting.into_iter().flatten() {
        let _ = tx.send(Err(failed.clone()));
    }
}

/// A single GET as an item that keeps its own request id and deadline.
fn item_of(r: apb::GetRequest) -> apb::GetItem {
    let apb::GetRequest {
        session_id: _,
        request_id,
        namespace,
        key,
        range,
        region_id,
        offset,
        timeout_ms,
        max_bytes,
        if_match,
    } = r;
    apb::GetItem { namespace, key, range, region_id, offset, max_bytes, if_match, request_id, timeout_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose every call fails at once: no agent behind it.
    fn no_agent() -> AgentClient<Channel> {
        let channel = tonic::transport::Endpoint::from_static("http://agent.local").connect_with_connector_lazy(
            tower::service_fn(|_| async {
                Err::<hyper_util::rt::TokioIo<tokio::net::UnixStream>, _>(std::io::Error::other("no agent"))
            }),
        );
        AgentClient::new(channel)
    }

    fn get(session: &str, n: usize) -> apb::GetRequest {
        apb::GetRequest { session_id: session.into(), request_id: format!("r{n}"), ..Default::default() }
    }

    #[tokio::test]
    async fn every_get_is_answered_and_no_session_entry_outlives_its_gets() {
        let c = Coalescer::new(IntCounter::new("t", "t").unwrap());
        let calls = (0..30).map(|n| {
            let c = c.clone();
            async move { c.get(no_agent(), get(["a", "b", "c"][n % 3], n)).await }
        });
        let answers = futures::future::join_all(calls).await;
        assert!(answers.iter().all(|a| a.as_ref().is_err_and(|s| s.code() == tonic::Code::Unavailable)));
        assert!(c.coalesced.get() > 0, "some went together");
        assert_eq!(c.sessions_held(), 0);

        // Callers that give up while queued or in flight leave nothing.
        for n in 0..20 {
            let call = c.get(no_agent(), get("d", n));
            let _ = tokio::time::timeout(std::time::Duration::from_micros(1), call).await;
        }
        let t0 = std::time::Instant::now();
        while c.sessions_held() > 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "session entries leaked");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn an_item_keeps_every_field_of_the_get() {
        let r = apb::GetRequest {
            session_id: "s".into(),
            request_id: "r-1".into(),
            namespace: "ns".into(),
            key: "k".into(),
            range: Some(sluice_proto::common::ByteRange { start: 3, length: Some(4) }),
            region_id: "reg".into(),
            offset: 5,
            timeout_ms: 6,
            max_bytes: 7,
            if_match: "\"e\"".into(),
        };
        let i = item_of(r.clone());
        assert_eq!((i.request_id.as_str(), i.timeout_ms), ("r-1", 6));
        assert_eq!((i.namespace, i.key, i.range, i.region_id), (r.namespace, r.key, r.range, r.region_id));
        assert_eq!((i.offset, i.max_bytes, i.if_match), (5, 7, r.if_match));
    }
}
