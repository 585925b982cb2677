//! Single GETs over one long-lived `GetStream` call per agent connection.
//!
//! A unary `Get` costs a new HTTP/2 stream per object: request and
//! response headers, trailers, and a task on each side. For 4 KiB objects
//! that is a large part of what the shim and the agent spend per GET, and
//! a GET alone (one at a time) cannot share a batch. Here each GET is one
//! message on a stream opened once per connection, and its answer one
//! message back (`dpu-agent/src/get_stream.rs` is the other side).
//!
//! Every GET keeps its own request id, deadline, answer and error, as with
//! the coalescer (`coalesce.rs`), which is what an agent without
//! `OpenSessionReply.get_stream` still gets. GETs queued while the stream
//! was busy go out in one message. A GET whose caller has gone (a client's
//! deadline, a closed connection) is cancelled at the agent, or not sent
//! at all if it had not gone out yet. A stream carries at most
//! [`STREAM_BUDGET`] GETs waiting (the agent refuses GETs past its own,
//! higher limit); past that a GET takes the next stream with room, or goes
//! as a call of its own. When the stream fails (the agent restarted or
//! went away), every GET waiting on it fails as a unary call in flight
//! would, with the call's status, and the next GET opens a new stream. An
//! agent that turns out not to serve streams at all (UNIMPLEMENTED) gets
//! calls from then on.
//!
//! The stream goes without HTTP/2 where the agent serves it (`[agent]
//! framed_gets`, `framed_link.rs`): the same messages, on a connection of
//! its own to the agent's address (Unix socket, TCP, or TCP with the link's
//! TLS). An agent that does not answer the framed preface (or over TLS
//! chooses `h2`) gets `GetStream` calls from then on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use sluice_proto::agent::{self as apb, agent_client::AgentClient};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// Most GETs the shim puts in one message (they queued while the stream
/// was busy).
const GETS_PER_MESSAGE: usize = 64;
/// Most GETs waiting on one stream. The agent runs up to 512 per stream
/// and refuses more at once (`dpu-agent/src/get_stream.rs`); past this
/// budget the shim uses another stream, or a call of its own.
pub const STREAM_BUDGET: usize = 256;
/// Most messages queued for a stream whose call has not taken them (a
/// stalled stream): past it, GETs go elsewhere.
const MAX_QUEUED: usize = 4096;
/// Longest request id the agent takes (`dpu-agent/src/get_stream.rs`); the
/// shim refuses longer ones when a request comes (`connection.rs`).
pub(crate) const MAX_REQUEST_ID: usize = 256;
/// Largest GET (encoded) a stream carries; larger ones (a key near the
/// client frame's 1 MiB) go as calls. A message of [`GETS_PER_MESSAGE`]
/// such GETs stays far below the 4 MiB either end of a stream takes, so no
/// caller's GETs can make a message the agent refuses, which would end the
/// stream, and fail every GET waiting on it, other tenants' too.
const MAX_STREAMED_GET: usize = 16 << 10;
// A message of the largest GETs a stream takes (each with its session id,
// index and framing: well under 64 bytes more) fits what either end takes.
const _: () = assert!(GETS_PER_MESSAGE * (MAX_STREAMED_GET + 64) < sluice_proto::framed_gets::MAX_FRAME);

type Answer<T = apb::GetReply> = Result<T, tonic::Status>;

/// Where framed GETs go (the agent's address), and their counters.
pub struct FramedTo {
    pub target: Arc<crate::framed_link::Target>,
    /// Framed connections opened.
    pub links: prometheus::IntCounter,
    /// GETs sent on them.
    pub gets: prometheus::IntCounter,
}

/// Framed GETs to the agent (`framed_link.rs`).
struct Framed {
    to: FramedTo,
    /// The agent turned out not to serve them.
    off: AtomicBool,
}

enum Outbound {
    Get(apb::StreamedGet),
    Cancel(u32),
}

/// The GETs waiting for an answer on one stream.
#[derive(Default)]
struct Waiting {
    answers: HashMap<u32, oneshot::Sender<Answer>>,
    next_index: u32,
    /// The stream ended: nothing more will be answered on it.
    ended: bool,
}

/// One open (or opening) `GetStream` call.
struct Link {
    to_agent: mpsc::UnboundedSender<Outbound>,
    waiting: Mutex<Waiting>,
    /// Messages queued for the agent and not yet taken by the call's body
    /// (a stalled stream takes no more GETs past [`MAX_QUEUED`]).
    queued: AtomicUsize,
}

/// Ends the link when its task ends, however it ends (a panic included):
/// no GET waits on a link nobody answers.
struct EndOnDrop(Arc<Link>, Option<tonic::Status>);

impl EndOnDrop {
    fn finish(mut self, status: tonic::Status) {
        self.1 = Some(status);
    }
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        let status =
            self.1.take().unwrap_or_else(|| tonic::Status::internal("the GET stream's task ended unexpectedly"));
        self.0.end(&status);
    }
}

impl Link {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens the stream, in a task of its own that answers each GET as the
    /// agent does: framed on `framed`'s socket where it is served, else a
    /// call on `agent`. An agent that refuses the call itself as
    /// UNIMPLEMENTED sets `off`.
    fn open(mut agent: AgentClient<Channel>, off: Arc<AtomicBool>, framed: Option<Arc<Framed>>) -> Arc<Self> {
        let (to_agent, outbound) = mpsc::unbounded::<Outbound>();
        let link = Arc::new(Self { to_agent, waiting: Mutex::new(Waiting::default()), queued: AtomicUsize::new(0) });
        let weak = Arc::downgrade(&link);
        let body = outbound
            .ready_chunks(GETS_PER_MESSAGE)
            .map(move |chunk| message(chunk, weak.upgrade().as_deref()))
            .filter(|m| std::future::ready(!m.gets.is_empty() || !m.cancel.is_empty()));
        let ending = EndOnDrop(link.clone(), None);
        tokio::spawn(async move {
            if let Some(f) = framed.filter(|f| !f.off.load(Ordering::Relaxed)) {
                match crate::framed_link::open(&f.to.target).await {
                    crate::framed_link::Opened::Framed(conn) => {
                        f.to.links.inc();
                        let link = ending.0.clone();
                        let answers =
                            crate::framed_link::exchange(conn, body, f.to.gets.clone(), move |st| link.end(&st));
                        let status = ending.0.answer_all(answers).await;
                        return ending.finish(status);
                    }
                    crate::framed_link::Opened::NotServed(why) => {
                        if !f.off.swap(true, Ordering::Relaxed) {
                            tracing::info!(%why, "the agent does not serve framed GETs; GET streams go as calls");
                        }
                    }
                    // This stream goes as a call; the next tries again.
                    crate::framed_link::Opened::Failed(why) => {
                        tracing::debug!(%why, "a framed GET stream failed to open")
                    }
                }
            }
            let status = match agent.get_stream(body).await {
                Err(status) => {
                    // Only the call's own refusal says so: a GET's answer
                    // may be UNIMPLEMENTED too (UNSUPPORTED, one GET's).
                    if status.code() == tonic::Code::Unimplemented && !off.swap(true, Ordering::Relaxed) {
                        tracing::warn!(%status, "the agent does not serve GetStream; single GETs go as calls");
                    }
                    status
                }
                Ok(reply) => ending.0.answer_all(reply.into_inner()).await,
            };
            ending.finish(status);
        });
        link
    }

    /// Hands each answer to its GET until the stream ends; returns why it
    /// ended.
    async fn answer_all(&self, answers: impl Stream<Item = Answer<apb::GetManyItem>>) -> tonic::Status {
        let mut answers = std::pin::pin!(answers);
        loop {
            let item = match answers.next().await {
                Some(Ok(item)) => item,
                None => return tonic::Status::unavailable("the agent ended the GET stream"),
                Some(Err(status)) => return status,
            };
            // Cancelled meanwhile (its caller gone): nobody to answer.
            let Some(tx) = self.waiting().answers.remove(&item.index) else { continue };
            let answer = match item.result {
                Some(apb::get_many_item::Result::Ok(r)) => Ok(r),
                Some(apb::get_many_item::Result::Error(d)) => Err(sluice_proto::status::to_status(&d)),
                None => Err(tonic::Status::internal("the agent answered a GET without a result")),
            };
            let _ = tx.send(answer);
        }
    }

    /// The stream is over: every GET still waiting fails with `status`.
    fn end(&self, status: &tonic::Status) {
        let answers = {
            let mut w = self.waiting();
            w.ended = true;
            std::mem::take(&mut w.answers)
        };
        if !answers.is_empty() {
            tracing::debug!(%status, waiting = answers.len(), "GET stream to the agent ended");
        }
        for (_, tx) in answers {
            let _ = tx.send(Err(status.clone()));
        }
        self.to_agent.close_channel();
    }

    /// Sends `req`, unless the stream has ended or has [`STREAM_BUDGET`]
    /// GETs waiting.
    fn send(self: &Arc<Self>, req: apb::GetRequest) -> Sent {
        let (tx, rx) = oneshot::channel();
        let index = {
            let mut w = self.waiting();
            let stalled = self.queued.load(Ordering::Relaxed) >= MAX_QUEUED;
            if w.ended || w.answers.len() >= STREAM_BUDGET || stalled {
                return Sent::No(req);
            }
            let mut index = w.next_index;
            while w.answers.contains_key(&index) {
                index = index.wrapping_add(1);
            }
            w.next_index = index.wrapping_add(1);
            w.answers.insert(index, tx);
            index
        };
        let session_id = req.session_id.clone();
        let get = apb::StreamedGet { index, session_id, item: Some(crate::coalesce::item_of(req)) };
        let pending = Pending { link: self.clone(), index, answered: false };
        // A closed channel: the stream has just ended, and `end` answers it.
        self.queue(Outbound::Get(get));
        Sent::Yes(pending, rx)
    }

    fn queue(&self, o: Outbound) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.to_agent.unbounded_send(o).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One message of what queued: a GET whose caller has gone meanwhile is
/// not sent (nor its cancel), so the agent never starts it.
fn message(chunk: Vec<Outbound>, link: Option<&Link>) -> apb::GetStreamRequest {
    if let Some(l) = link {
        // Each was counted before it was queued.
        l.queued.fetch_sub(chunk.len(), Ordering::Relaxed);
    }
    let mut msg = apb::GetStreamRequest::default();
    let waiting = link.map(Link::waiting);
    let mut unsent = Vec::new();
    for o in chunk {
        match o {
            Outbound::Get(g) => match &waiting {
                Some(w) if !w.answers.contains_key(&g.index) => unsent.push(g.index),
                _ => msg.gets.push(g),
            },
            Outbound::Cancel(i) if unsent.contains(&i) => {}
            Outbound::Cancel(i) => msg.cancel.push(i),
        }
    }
    msg
}

/// What `Link::send` did with a GET.
enum Sent {
    Yes(Pending, oneshot::Receiver<Answer>),
    /// Not sent (the stream ended, or has its budget of GETs waiting):
    /// the GET back.
    No(apb::GetRequest),
}

/// A GET sent and not yet answered; dropped before its answer (its caller
/// gone), it is cancelled at the agent.
struct Pending {
    link: Arc<Link>,
    index: u32,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered && self.link.waiting().answers.remove(&self.index).is_some() {
            self.link.queue(Outbound::Cancel(self.index));
        }
    }
}

/// The shim's GET streams: one per agent connection, GETs dealt over them
/// in turn.
pub struct GetStreams {
    channels: Vec<AgentClient<Channel>>,
    links: Vec<Mutex<Option<Arc<Link>>>>,
    next: AtomicUsize,
    /// GETs sent on a stream.
    streamed: prometheus::IntCounter,
    /// Streams turned out not to be served: every GET goes as a call.
    off: Arc<AtomicBool>,
    framed: Option<Arc<Framed>>,
}

impl GetStreams {
    /// Streams over `channels`; framed to `framed`'s address (counting
    /// them), if given, where the agent serves it.
    pub fn new(
        channels: Vec<AgentClient<Channel>>,
        streamed: prometheus::IntCounter,
        framed: Option<FramedTo>,
    ) -> Arc<Self> {
        let links = channels.iter().map(|_| Mutex::new(None)).collect();
        let framed = framed.map(|to| Arc::new(Framed { to, off: AtomicBool::new(false) }));
        let off = Arc::new(AtomicBool::new(false));
        Arc::new(Self { channels, links, next: AtomicUsize::new(0), streamed, off, framed })
    }

    /// Framed connections opened so far (none without framing).
    pub fn framed_opened(&self) -> usize {
        self.framed.as_ref().map_or(0, |f| f.to.links.get() as usize)
    }

    /// Whether the agent turned out not to serve framed GETs.
    pub fn framed_off(&self) -> bool {
        self.framed.as_ref().is_some_and(|f| f.off.load(Ordering::Relaxed))
    }

    /// Opens every connection's stream now, so the descriptors they take
    /// (at the agent too) are settled before clients come. One that fails
    /// ends, and the next GET on its connection opens another.
    pub fn warm(&self) {
        for i in 0..self.channels.len() {
            self.link(i);
        }
    }

    /// The stream on connection `i`: the open one, or a new one if none is
    /// open or the last one ended.
    fn link(&self, i: usize) -> Arc<Link> {
        let mut slot = self.links[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match slot.as_ref() {
            Some(link) if !link.waiting().ended => link.clone(),
            _ => {
                let link = Link::open(self.channels[i].clone(), self.off.clone(), self.framed.clone());
                *slot = Some(link.clone());
                link
            }
        }
    }

    /// Sends `req` on the next stream with room and waits for its answer,
    /// as `agent.get(req)` would answer; with every stream at its budget
    /// (or an agent that turned out not to serve streams), as a call of its
    /// own on `agent`.
    pub async fn get(&self, mut agent: AgentClient<Channel>, req: apb::GetRequest) -> Answer {
        let n = self.channels.len();
        let mut req = req;
        // A GET a stream does not take goes as a call of its own.
        let fits =
            req.request_id.len() <= MAX_REQUEST_ID && sluice_proto::Message::encoded_len(&req) <= MAX_STREAMED_GET;
        if n > 0 && fits && !self.off.load(Ordering::Relaxed) {
            let first = self.next.fetch_add(1, Ordering::Relaxed);
            for k in 0..n {
                match self.link((first + k) % n).send(req) {
                    Sent::Yes(pending, rx) => {
                        self.streamed.inc();
                        return self.wait(pending, rx).await;
                    }
                    Sent::No(back) => req = back,
                }
            }
        }
        agent.get(req).await.map(tonic::Response::into_inner)
    }

    async fn wait(&self, mut pending: Pending, rx: oneshot::Receiver<Answer>) -> Answer {
        let answer = rx.await;
        pending.answered = true;
        answer.unwrap_or_else(|_| Err(tonic::Status::unavailable("the GET stream to the agent ended")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_agent::{serve, Fake};
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::Duration;

    fn get(session: &str, n: usize) -> apb::GetRequest {
        apb::GetRequest { session_id: session.into(), request_id: format!("r{n}"), ..Default::default() }
    }

    fn counter() -> prometheus::IntCounter {
        prometheus::IntCounter::new("t", "t").unwrap()
    }

    impl GetStreams {
        /// GETs waiting for an answer on every stream (none may outlive
        /// its caller).
        fn waiting(&self) -> usize {
            self.links.iter().filter_map(|l| l.lock().unwrap().clone()).map(|l| l.waiting().answers.len()).sum()
        }
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        let t0 = std::time::Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn request_id(a: &Answer) -> Option<String> {
        a.as_ref().ok().and_then(|r| r.report.as_ref()).map(|r| r.request_id.clone())
    }

    #[tokio::test]
    async fn each_get_gets_its_own_answer_in_whatever_order_they_come() {
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone(), agent.clone()], counter(), None);
        let calls = (0..40).map(|n| {
            let (streams, agent) = (streams.clone(), agent.clone());
            async move { (n, streams.get(agent.clone(), get(["a", "b"][n % 2], n)).await) }
        });
        for (n, a) in futures::future::join_all(calls).await {
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()), "GET {n}: {a:?}");
        }
        assert_eq!(fake.streams_opened.load(SeqCst), 2, "one call per connection, not per GET");
        assert_eq!(streams.streamed.get(), 40);
        let seen = fake.streamed.lock().unwrap().clone();
        assert!(seen.iter().all(|(_, s, id)| { s == ["a", "b"][id[1..].parse::<usize>().unwrap() % 2] }), "{seen:?}");
        assert_eq!(streams.waiting(), 0);
        // One at a time goes on the same calls.
        for n in 40..45 {
            let a = streams.get(agent.clone(), get("a", n)).await;
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()));
        }
        assert_eq!(fake.streams_opened.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn a_stream_that_ends_fails_its_waiting_gets_and_the_next_get_opens_another() {
        let fake = Fake { stream_hold: true, stream_end_after: Some(6), ..Default::default() };
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        let calls = (0..6).map(|n| {
            let (streams, agent) = (streams.clone(), agent.clone());
            async move { streams.get(agent, get("s", n)).await }
        });
        let answers = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(calls))
            .await
            .expect("every GET answered when the stream ends");
        for a in &answers {
            let st = a.as_ref().unwrap_err();
            assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");
        }
        assert_eq!(streams.waiting(), 0);
        // The next GET opens a new call (it too is held; its caller gives up).
        let _ = tokio::time::timeout(Duration::from_millis(200), streams.get(agent, get("s", 7))).await;
        assert_eq!(fake.streams_opened.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_cancels_its_get_at_the_agent() {
        let fake = Fake { stream_hold: true, ..Default::default() };
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        for n in 0..3 {
            let gone = tokio::time::timeout(Duration::from_millis(100), streams.get(agent.clone(), get("s", n))).await;
            assert!(gone.is_err(), "the agent holds every GET");
        }
        eventually("each abandoned GET cancelled", || fake.cancels.lock().unwrap().len() == 3).await;
        let sent: Vec<u32> = fake.streamed.lock().unwrap().iter().map(|(i, _, _)| *i).collect();
        let mut cancelled = fake.cancels.lock().unwrap().clone();
        cancelled.sort_unstable();
        assert_eq!(cancelled, sent, "the GETs sent, by their indexes");
        assert_eq!(streams.waiting(), 0);
        assert_eq!(fake.streams_opened.load(SeqCst), 1);
    }

    #[tokio::test]
    async fn no_agent_fails_each_get_at_once() {
        let channel = tonic::transport::Endpoint::from_static("http://agent.local").connect_with_connector_lazy(
            tower::service_fn(|_| async {
                Err::<hyper_util::rt::TokioIo<tokio::net::UnixStream>, _>(std::io::Error::other("no agent"))
            }),
        );
        let agent = AgentClient::new(channel);
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        for n in 0..5 {
            let a = tokio::time::timeout(Duration::from_secs(5), streams.get(agent.clone(), get("s", n)))
                .await
                .expect("answered");
            assert_eq!(a.unwrap_err().code(), tonic::Code::Unavailable);
        }
        assert_eq!(streams.waiting(), 0);
    }

    #[tokio::test]
    async fn past_its_budget_a_stream_leaves_gets_to_calls_of_their_own() {
        let fake = Fake { stream_hold: true, ..Default::default() };
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        let held: Vec<_> = (0..STREAM_BUDGET)
            .map(|n| {
                let (streams, agent) = (streams.clone(), agent.clone());
                tokio::spawn(async move { streams.get(agent, get("s", n)).await })
            })
            .collect();
        eventually("the budget is spent", || streams.waiting() == STREAM_BUDGET).await;
        for n in 0..3 {
            let a = streams.get(agent.clone(), get("s", 1000 + n)).await;
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{}", 1000 + n).as_str()));
        }
        assert_eq!(fake.unary.load(SeqCst), 3, "the three past the budget went as calls");
        for h in held {
            h.abort();
        }
        eventually("the held GETs cancelled", || streams.waiting() == 0).await;
    }

    #[test]
    fn a_get_whose_caller_went_before_it_was_sent_is_not_sent() {
        let (tx, _rx) = oneshot::channel();
        let link = Link {
            to_agent: mpsc::unbounded().0,
            waiting: Mutex::new(Waiting::default()),
            queued: AtomicUsize::new(4),
        };
        link.waiting().answers.insert(6, tx);
        let sg = |index| apb::StreamedGet { index, session_id: "s".into(), item: None };
        let chunk = vec![Outbound::Get(sg(5)), Outbound::Cancel(5), Outbound::Get(sg(6)), Outbound::Cancel(7)];
        let m = message(chunk, Some(&link));
        assert_eq!(link.queued.load(Ordering::Relaxed), 0, "all four taken");
        assert_eq!(m.gets.iter().map(|g| g.index).collect::<Vec<_>>(), vec![6]);
        assert_eq!(m.cancel, vec![7], "no cancel for a GET never sent; others' go");
    }

    #[tokio::test]
    async fn only_the_calls_own_unimplemented_turns_streams_off() {
        // A GET's UNSUPPORTED (UNIMPLEMENTED once a status) is that GET's.
        let fake = Fake { stream_unsupported: true, ..Default::default() };
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        for n in 0..3 {
            let a = streams.get(agent.clone(), get("s", n)).await;
            assert_eq!(a.unwrap_err().code(), tonic::Code::Unimplemented);
        }
        assert_eq!((fake.streams_opened.load(SeqCst), fake.unary.load(SeqCst)), (1, 0), "still on the stream");
        // An agent that refuses the call itself: calls from then on.
        let fake = Fake { stream_refused: true, ..Default::default() };
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        let first = streams.get(agent.clone(), get("s", 0)).await;
        assert_eq!(first.unwrap_err().code(), tonic::Code::Unimplemented, "the GET in flight fails with the call");
        for n in 1..4 {
            let a = streams.get(agent.clone(), get("s", n)).await;
            assert_eq!(request_id(&a).as_deref(), Some(format!("r{n}").as_str()));
        }
        assert_eq!((fake.streams_opened.load(SeqCst), fake.unary.load(SeqCst)), (1, 3));
    }

    #[tokio::test]
    async fn gets_a_stream_does_not_take_go_as_calls() {
        let fake = Fake::default();
        let agent = serve(fake.clone()).await;
        let streams = GetStreams::new(vec![agent.clone()], counter(), None);
        // A request id longer than the agent takes on a stream, and a GET
        // larger than a stream carries (a key near the client frame's limit).
        let mut long_id = get("s", 0);
        long_id.request_id = "x".repeat(MAX_REQUEST_ID + 1);
        let mut large = get("s", 1);
        large.key = "k".repeat(MAX_STREAMED_GET);
        for req in [long_id, large] {
            let id = req.request_id.clone();
            let a = streams.get(agent.clone(), req).await;
            assert_eq!(request_id(&a), Some(id));
        }
        assert_eq!(fake.unary.load(SeqCst), 2, "calls of their own");
        assert!(fake.streamed.lock().unwrap().is_empty(), "nothing on the stream");
    }
}
