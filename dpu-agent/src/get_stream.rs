//! `GetStream`: one long-lived call per shim connection that carries single
//! GETs as they come.
//!
//! Why: a unary `Get` costs an HTTP/2 stream, request and response headers
//! (HPACK both ways), trailers and a server task per object. At 4 KiB that
//! is a large share of what the agent and the shim spend per GET, and one
//! GET at a time cannot be coalesced into a batch. On the stream each GET
//! is one message in and one message out.
//!
//! The checks are those of a `Get` call: every GET names its session,
//! which is looked up against where the stream was opened from (the same
//! connection, so the same origin a call on it would have), renewed, and
//! authorised per namespace inside `Agent::get`. Each GET keeps its own
//! request id and deadline, and runs in a task of its own, as a unary call
//! does.
//!
//! What a shim cannot do with it (each bound below has a test):
//! * **Stall the connection.** The stream's messages are always read, so
//!   unread data never holds HTTP/2's connection window (which would stall
//!   Renew and every other call on it). A GET beyond [`STREAM_IN_FLIGHT`]
//!   running is refused at once, RESOURCE_EXHAUSTED.
//! * **Freeze GETs.** They run in their own tasks and hand their answers to
//!   the stream's driver task, not to the HTTP/2 body pump, so a peer that
//!   stops reading answers does not stop transfers mid-way (holding the
//!   store's transfer slots, past their deadlines).
//! * **Pile up memory.** Answers the peer has not taken are bounded
//!   ([`ANSWERS_UNSENT`], each at most [`MAX_REQUEST_ID`] of echoed request
//!   id); beyond that the stream ends, RESOURCE_EXHAUSTED. A message may
//!   start at most [`MAX_GETS_PER_MESSAGE`] GETs; more, a GET without its
//!   item, an index already running (or twice in the message) or a longer
//!   request id end the stream with INVALID_ARGUMENT (a shim does none of
//!   these), before any GET of that message starts.
//! * **Leave a GET unanswered.** A GET task that panics answers INTERNAL.
//! * **Keep the agent from stopping.** On shutdown new GETs are refused at
//!   once (UNAVAILABLE), and the stream ends when those running are
//!   answered.
//!
//! Cancels are applied after the GETs of the same message start (the shim
//! may send a GET and its cancel together), and dropping the stream (the
//! shim went away, or reset it) stops every GET still running.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use sluice_proto::agent as pb;
use sluice_proto::common::{ErrorCode, ErrorDetail};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::error::AgentError;
use crate::requests::RequestCtx;

/// Most GETs of one stream running at once (the shim keeps its own budget
/// below this: `host-shim/src/get_stream.rs`).
pub const STREAM_IN_FLIGHT: usize = 512;
/// Most GETs one message may start.
pub const MAX_GETS_PER_MESSAGE: usize = 256;
/// Most answers waiting for the peer to take them before the stream ends
/// (a shim that reads has at most its budget of GETs, 256, waiting).
pub const ANSWERS_UNSENT: usize = 1024;
/// Longest request id a streamed GET may carry (echoed in its answer, so it
/// bounds what untaken answers hold); the shim sends longer ones as calls.
pub const MAX_REQUEST_ID: usize = 256;
/// Answers handed to the HTTP/2 body at once.
const ANSWERS_QUEUED: usize = 256;
/// How long the stream's own error waits for room behind its answers.
const FINAL_STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

pub type Answer = Result<pb::GetManyItem, Status>;

/// Runs one GET: (session id, item, context) -> its result. The gRPC
/// service makes it (`grpc.rs`: the session looked up against the stream's
/// origin, then `Agent::get`), so this module knows nothing of either.
pub type RunGet = Arc<dyn Fn(String, pb::GetItem, RequestCtx) -> BoxFuture<'static, GetResult> + Send + Sync>;
pub type GetResult = pb::get_many_item::Result;

/// The answer stream of one `GetStream` call over `inbound`, each GET run
/// by `run` in a task of its own under a driver task (see the module
/// docs); `stop` becoming true is the agent stopping.
pub fn start<S>(run: RunGet, inbound: S, stop: Option<watch::Receiver<bool>>) -> ReceiverStream<Answer>
where
    S: Stream<Item = Result<pb::GetStreamRequest, Status>> + Unpin + Send + 'static,
{
    let (answers, rx) = mpsc::channel(ANSWERS_QUEUED);
    tokio::spawn(Driver::new(run, answers).run(inbound, stop));
    ReceiverStream::new(rx)
}

/// A GET running in a task of its own, and which of the GETs ever started
/// under its index it is (an answer of an earlier one is not its answer).
struct Running {
    generation: u64,
    task: tokio::task::AbortHandle,
}

struct Driver {
    run: RunGet,
    answers: mpsc::Sender<Answer>,
    running: HashMap<u32, Running>,
    generation: u64,
    /// GET tasks' answers, to the driver: (index, generation, answer).
    done_tx: mpsc::UnboundedSender<(u32, u64, pb::GetManyItem)>,
    done_rx: mpsc::UnboundedReceiver<(u32, u64, pb::GetManyItem)>,
    /// Answers the body has no room for yet.
    unsent: VecDeque<Answer>,
    stopping: bool,
}

/// Why the stream ends early.
enum End {
    /// The peer is gone (its side failed, or it dropped the answers).
    Gone,
    /// The peer left too many answers untaken.
    Unread,
    /// The peer broke the rules: the stream ends with this status.
    Refused(Status),
}

impl Driver {
    fn new(run: RunGet, answers: mpsc::Sender<Answer>) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            run,
            answers,
            running: HashMap::new(),
            generation: 0,
            done_tx,
            done_rx,
            unsent: VecDeque::new(),
            stopping: false,
        }
    }

    async fn run<S>(mut self, mut inbound: S, stop: Option<watch::Receiver<bool>>)
    where
        S: Stream<Item = Result<pb::GetStreamRequest, Status>> + Unpin,
    {
        let mut inbound_open = true;
        let mut stop = stop;
        let ended = loop {
            if (!inbound_open || self.stopping) && self.running.is_empty() && self.unsent.is_empty() {
                break None;
            }
            let room = if self.unsent.is_empty() { None } else { Some(self.answers.clone()) };
            tokio::select! {
                biased;
                () = self.answers.closed() => break Some(End::Gone),
                () = stopped(&mut stop), if !self.stopping => {
                    tracing::debug!(running = self.running.len(), "GetStream: the agent is stopping");
                    self.stopping = true;
                }
                Some((index, generation, item)) = self.done_rx.recv() => {
                    if self.finished(index, generation) {
                        if let Err(end) = self.answer(Ok(item)) {
                            break Some(end);
                        }
                    }
                }
                permit = reserve(room) => match permit {
                    Some(permit) => {
                        if let Some(a) = self.unsent.pop_front() {
                            permit.send(a);
                        }
                    }
                    None => break Some(End::Gone),
                },
                msg = inbound.next(), if inbound_open => match msg {
                    Some(Ok(msg)) => {
                        if let Err(end) = self.take(msg) {
                            break Some(end);
                        }
                    }
                    // The shim closed its side: answer what runs, then end.
                    None => inbound_open = false,
                    // A message refused before it was decoded (the framed
                    // reader counts its GETs): ended as `take` would.
                    Some(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                        break Some(End::Refused(status));
                    }
                    Some(Err(status)) => {
                        tracing::debug!(%status, "GetStream: the shim's side failed; stopping its GETs");
                        break Some(End::Gone);
                    }
                },
            }
        };
        for r in self.running.values() {
            r.task.abort();
        }
        match ended {
            Some(End::Refused(status)) => {
                tracing::warn!(%status, "GetStream ended: the shim broke its rules");
                // After the answers already queued, if the peer takes them.
                let _ = tokio::time::timeout(FINAL_STATUS_WAIT, self.answers.send(Err(status))).await;
            }
            Some(End::Unread) => {
                let status = Status::resource_exhausted(format!(
                    "more than {ANSWERS_UNSENT} answers left untaken on this GetStream"
                ));
                let _ = tokio::time::timeout(FINAL_STATUS_WAIT, self.answers.send(Err(status))).await;
            }
            Some(End::Gone) | None => {}
        }
    }

    /// Whether the answer of the GET started as `generation` under `index`
    /// is to be sent: only the GET now under that index answers for it,
    /// not one stopped meanwhile (its index perhaps used again).
    fn finished(&mut self, index: u32, generation: u64) -> bool {
        let current = self.running.get(&index).is_some_and(|r| r.generation == generation);
        if current {
            self.running.remove(&index);
        }
        current
    }

    /// Queues `a` for the peer; the stream ends once the peer leaves too
    /// many untaken.
    fn answer(&mut self, a: Answer) -> Result<(), End> {
        if self.unsent.is_empty() {
            match self.answers.try_send(a) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(End::Gone),
                Err(mpsc::error::TrySendError::Full(a)) => self.unsent.push_back(a),
            }
        } else {
            self.unsent.push_back(a);
        }
        if self.unsent.len() > ANSWERS_UNSENT {
            tracing::warn!(unsent = self.unsent.len(), "GetStream: the shim does not take its answers; ending it");
            return Err(End::Unread);
        }
        Ok(())
    }

    fn refuse(&mut self, index: u32, detail: ErrorDetail) -> Result<(), End> {
        self.answer(Ok(pb::GetManyItem { index, result: Some(pb::get_many_item::Result::Error(detail)) }))
    }

    /// Starts the GETs of `msg`, then stops those it cancels.
    fn take(&mut self, msg: pb::GetStreamRequest) -> Result<(), End> {
        if msg.gets.len() > MAX_GETS_PER_MESSAGE {
            let n = msg.gets.len();
            return Err(End::Refused(Status::invalid_argument(format!(
                "{n} GETs in one GetStream message; at most {MAX_GETS_PER_MESSAGE}"
            ))));
        }
        if msg.cancel.len() > sluice_proto::framed_gets::MAX_CANCELS_IN_FRAME {
            let n = msg.cancel.len();
            return Err(End::Refused(Status::invalid_argument(format!(
                "{n} cancels in one GetStream message; at most {}",
                sluice_proto::framed_gets::MAX_CANCELS_IN_FRAME
            ))));
        }
        // The whole message is checked before any of it starts.
        let mut indexes = std::collections::HashSet::with_capacity(msg.gets.len());
        for get in &msg.gets {
            let index = get.index;
            let Some(item) = &get.item else {
                return Err(End::Refused(Status::invalid_argument(format!("GET {index} came without its item"))));
            };
            if self.running.contains_key(&index) || !indexes.insert(index) {
                return Err(End::Refused(Status::invalid_argument(format!(
                    "GET {index} is already running on this stream"
                ))));
            }
            if item.request_id.len() > MAX_REQUEST_ID {
                return Err(End::Refused(Status::invalid_argument(format!(
                    "GET {index}: a request id of {} bytes; at most {MAX_REQUEST_ID} on a GetStream",
                    item.request_id.len()
                ))));
            }
        }
        for get in msg.gets {
            let index = get.index;
            let Some(item) = get.item else { continue };
            if self.stopping {
                let detail = ErrorDetail {
                    code: ErrorCode::AgentUnavailable as i32,
                    message: "the agent is stopping; retry".into(),
                    needed_bytes: 0,
                };
                self.refuse(index, detail)?;
                continue;
            }
            if self.running.len() >= STREAM_IN_FLIGHT {
                let e = AgentError::ResourceExhausted(format!("{STREAM_IN_FLIGHT} GETs running on this stream"));
                self.refuse(index, e.detail())?;
                continue;
            }
            self.generation += 1;
            let generation = self.generation;
            let ctx = RequestCtx::new(item.request_id.clone(), item.timeout_ms);
            let (work, done) = ((self.run)(get.session_id, item, ctx), self.done_tx.clone());
            let task = tokio::spawn(async move {
                // Answered even if the GET panics: its slot is freed and its
                // caller told (an abort's answer is dropped: not running).
                let mut answering = Answering { index, generation, done: Some(done) };
                let result = work.await;
                answering.send(result);
            });
            self.running.insert(index, Running { generation, task: task.abort_handle() });
        }
        for index in msg.cancel {
            if let Some(r) = self.running.remove(&index) {
                r.task.abort();
            }
        }
        Ok(())
    }
}

/// Sends a GET task's answer to the driver; dropped unsent (the GET
/// panicked, or was stopped), an INTERNAL error.
struct Answering {
    index: u32,
    generation: u64,
    done: Option<mpsc::UnboundedSender<(u32, u64, pb::GetManyItem)>>,
}

impl Answering {
    fn send(&mut self, result: GetResult) {
        if let Some(done) = self.done.take() {
            let _ =
                done.send((self.index, self.generation, pb::GetManyItem { index: self.index, result: Some(result) }));
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let detail = ErrorDetail {
            code: ErrorCode::Internal as i32,
            message: "the GET ended unanswered".into(),
            needed_bytes: 0,
        };
        self.send(GetResult::Error(detail));
    }
}

/// Resolves once `stop` says the agent is stopping (never without one).
async fn stopped(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        // A dropped sender (the agent's `run` gone) stops too.
        Some(rx) => {
            let _ = rx.wait_for(|s| *s).await;
        }
        None => std::future::pending().await,
    }
}

/// A permit to hand the body one answer (`None`: the body is gone); never
/// resolves without `to` (nothing to send).
async fn reserve(to: Option<mpsc::Sender<Answer>>) -> Option<mpsc::OwnedPermit<Answer>> {
    match to {
        Some(tx) => tx.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "get_stream_tests.rs"]
mod tests;
