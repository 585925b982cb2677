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
//! others in flight is queued; the first to queue starts a task that yields
//! once to the runtime (on the shim's single worker, the frames it has
//! already read are handled meanwhile) and then sends whatever queued, in
//! calls of at most [`MAX_COALESCED`] sent at once — or, if it is still
//! alone, as a `Get` of its own. Items keep their own request id and
//! deadline (`GetItem.request_id`, `timeout_ms`: only an agent that says it
//! honours them, `OpenSessionReply.item_contexts`, gets GETs together),
//! their own answer and their own error; a failure of the call as a whole
//! (the agent no longer knows the session, the agent went away) is every
//! item's, as it would have been for each call alone, and `Session::call`
//! retries each the same way. GETs whose callers have gone are not sent,
//! and a call whose callers have all gone is dropped (the agent cancels
//! it), as a unary call would be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use sluice_proto::agent::{self as apb, agent_client::AgentClient};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Most GETs in one coalesced call (the agent runs up to 64 items of a
/// batch at once).
pub const MAX_COALESCED: usize = 64;
/// Largest GET (encoded) that shares a call; larger ones (a key near the
/// client frame's 1 MiB) go alone. A `GetMany` of [`MAX_COALESCED`] such
/// GETs stays far below the 4 MiB message the agent takes, so no caller's
/// large keys can make a call the agent refuses, which would fail every
/// GET in it.
const MAX_COALESCED_GET: usize = 16 << 10;
// The largest call (each item with its framing: well under 64 bytes more)
// fits tonic's default 4 MiB decoding limit, which the agent keeps.
const _: () = assert!(MAX_COALESCED * (MAX_COALESCED_GET + 64) < 4 << 20);

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
        if sluice_proto::Message::encoded_len(&req) > MAX_COALESCED_GET {
            return agent.get(req).await;
        }
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

    /// Sends `batch` in calls of at most [`MAX_COALESCED`], all at once
    /// (one waiting for another would hold a small GET behind a large
    /// one). GETs whose callers have gone are not sent.
    async fn send(&self, agent: AgentClient<Channel>, session: String, mut batch: Vec<Queued>) {
        batch.retain(|q| !q.tx.is_closed());
        let mut calls = Vec::new();
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(MAX_COALESCED));
            let chunk = std::mem::replace(&mut batch, rest);
            if chunk.len() > 1 {
                self.coalesced.inc_by(chunk.len() as u64);
            }
            calls.push(one_call(agent.clone(), &session, chunk));
        }
        futures::future::join_all(calls).await;
    }
}

/// Resolves once every caller still waiting in `waiting` has gone.
async fn all_gone(waiting: &mut [Option<oneshot::Sender<Answer>>]) {
    std::future::poll_fn(|cx| {
        for tx in waiting.iter_mut().flatten() {
            if tx.poll_closed(cx).is_pending() {
                return std::task::Poll::Pending;
            }
        }
        std::task::Poll::Ready(())
    })
    .await;
}

/// One call for `batch` (a `Get` if it is one GET, else a `GetMany`);
/// every item answered exactly once. When every caller has gone, the call
/// is dropped, which cancels what the agent still runs for it (as a unary
/// call's caller going away does).
async fn one_call(mut agent: AgentClient<Channel>, session: &str, batch: Vec<Queued>) {
    if batch.len() == 1 {
        let Some(Queued { req, mut tx }) = batch.into_iter().next() else { return };
        let answer = tokio::select! {
            r = agent.get(req) => Some(r.map(tonic::Response::into_inner)),
            () = tx.closed() => None,
        };
        if let Some(answer) = answer {
            let _ = tx.send(answer);
        }
        return;
    }
    let (items, mut waiting): (Vec<apb::GetItem>, Vec<Option<oneshot::Sender<Answer>>>) =
        batch.into_iter().map(|q| (item_of(q.req), Some(q.tx))).unzip();
    let req = apb::GetManyRequest { session_id: session.to_owned(), request_id: String::new(), timeout_ms: 0, items };
    let opened = tokio::select! {
        r = agent.get_many(req) => Some(r),
        () = all_gone(&mut waiting) => None,
    };
    let mut stream = match opened {
        None => return,
        Some(Ok(r)) => r.into_inner(),
        Some(Err(status)) => {
            for tx in waiting.into_iter().flatten() {
                let _ = tx.send(Err(status.clone()));
            }
            return;
        }
    };
    let mut failed = None;
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            // Nobody left to answer: dropping the stream cancels the rest.
            () = all_gone(&mut waiting) => return,
        };
        match next {
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
pub(crate) fn item_of(r: apb::GetRequest) -> apb::GetItem {
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
    use crate::test_agent::{ok_item, serve, Fake};

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

    /// Starts `n` GETs of session "s" at once (the first goes alone, the
    /// rest queue behind it); their answers in order.
    async fn burst(c: &Arc<Coalescer>, agent: &AgentClient<Channel>, n: usize) -> Vec<Answer> {
        let calls = (0..n).map(|i| {
            let (c, agent) = (c.clone(), agent.clone());
            async move { c.get(agent, get("s", i)).await.map(tonic::Response::into_inner) }
        });
        futures::future::join_all(calls).await
    }

    #[tokio::test]
    async fn each_caller_gets_its_own_item_and_no_other() {
        // The agent answers item 1 twice, an index it was never sent, item
        // 0, then fails the stream: items 0 and 1 get their own answers,
        // every other caller the stream's error, nobody a stranger's.
        let fake = Fake::default();
        *fake.script.lock().unwrap() =
            vec![ok_item(1, "r2"), ok_item(1, "again"), ok_item(99, "stranger"), ok_item(0, "r1")];
        fake.script.lock().unwrap().push(Err(tonic::Status::data_loss("the agent broke off")));
        let agent = serve(fake.clone()).await;
        let c = Coalescer::new(IntCounter::new("t", "t").unwrap());
        let answers = burst(&c, &agent, 5).await;
        assert_eq!(fake.unary.load(std::sync::atomic::Ordering::SeqCst), 1, "the first went alone");
        assert_eq!(*fake.batches.lock().unwrap(), vec![vec!["r1".to_owned(), "r2".into(), "r3".into(), "r4".into()]]);
        let id = |a: &Answer| a.as_ref().ok().and_then(|r| r.report.as_ref()).map(|r| r.request_id.clone());
        assert_eq!(id(&answers[0]).as_deref(), Some("r0"));
        assert_eq!(id(&answers[1]).as_deref(), Some("r1"));
        assert_eq!(id(&answers[2]).as_deref(), Some("r2"));
        for a in &answers[3..] {
            assert_eq!(a.as_ref().unwrap_err().code(), tonic::Code::DataLoss, "{a:?}");
        }
        assert_eq!(c.sessions_held(), 0);
    }

    #[tokio::test]
    async fn a_stream_that_ends_early_fails_the_rest_and_big_bursts_go_in_parallel_calls() {
        let fake = Fake::default();
        *fake.script.lock().unwrap() = vec![ok_item(0, "first")];
        let agent = serve(fake.clone()).await;
        let c = Coalescer::new(IntCounter::new("t", "t").unwrap());
        let answers = burst(&c, &agent, 1 + MAX_COALESCED + 2).await;
        // 1 alone, then 66 queued: one call of 64 and one of 2, both sent.
        let sizes: Vec<usize> = fake.batches.lock().unwrap().iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), MAX_COALESCED + 2, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= MAX_COALESCED), "{sizes:?}");
        let ended =
            answers.iter().filter(|a| a.as_ref().is_err_and(|s| s.message().contains("ended the call"))).count();
        assert_eq!(ended, MAX_COALESCED + 2 - sizes.len(), "all but each call's item 0");
    }

    #[tokio::test]
    async fn callers_that_all_give_up_cancel_their_call() {
        let fake = Fake { pause: Some(std::time::Duration::from_secs(30)), ..Default::default() };
        *fake.script.lock().unwrap() = vec![ok_item(0, "late")];
        let agent = serve(fake.clone()).await;
        let c = Coalescer::new(IntCounter::new("t", "t").unwrap());
        // The first goes alone (answered at once), the other three share a
        // call the agent sits on; their callers give up.
        let _ = tokio::time::timeout(std::time::Duration::from_millis(300), burst(&c, &agent, 4)).await;
        let t0 = std::time::Instant::now();
        while !fake.dropped.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "the abandoned call went on");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        let t0 = std::time::Instant::now();
        while c.sessions_held() > 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(5), "session entries leaked");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
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

    #[tokio::test]
    async fn gets_too_large_to_share_a_call_go_alone() {
        // Keys near the client frame's limit: 64 of them in one call would
        // be over what the agent takes, and every GET in it would fail.
        let fake = Fake::default();
        *fake.script.lock().unwrap() = vec![ok_item(0, "r3"), ok_item(1, "r5"), ok_item(2, "r7")];
        let agent = serve(fake.clone()).await;
        let c = Coalescer::new(IntCounter::new("t", "t").unwrap());
        let calls = (0..8).map(|i| {
            let (c, agent) = (c.clone(), agent.clone());
            let mut req = get("s", i);
            req.key = "k".repeat(if i % 2 == 0 { MAX_COALESCED_GET } else { 1 });
            async move { c.get(agent, req).await.map(tonic::Response::into_inner) }
        });
        let answers = futures::future::join_all(calls).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        // The four large ones went alone; of the small ones the first went
        // alone and the other three together.
        assert_eq!(fake.unary.load(std::sync::atomic::Ordering::SeqCst), 5);
        assert_eq!(*fake.batches.lock().unwrap(), vec![vec!["r3".to_owned(), "r5".into(), "r7".into()]]);
        assert_eq!(c.sessions_held(), 0);
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
