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
//! authorised per namespace inside [`Agent::get`]. Each GET keeps its own
//! request id and deadline. A stream runs at most [`STREAM_IN_FLIGHT`] GETs
//! at once: beyond that it stops reading (HTTP/2 flow control then holds the
//! shim back), so one shim cannot make the agent hold unbounded work. A
//! message with more GETs than [`MAX_GETS_PER_MESSAGE`] has the excess
//! refused, each with its own error. Dropping the stream (the shim went
//! away, or reset it) cancels every GET still running.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{AbortHandle, Abortable};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use sluice_proto::agent as pb;
use tonic::{Status, Streaming};

use crate::agent::{Agent, TransferSummary};
use crate::error::AgentError;
use crate::identity::ShimOrigin;
use crate::quiet::Quiet;
use crate::requests::{GetObject, RequestCtx};

/// Most GETs of one stream running at once.
pub const STREAM_IN_FLIGHT: usize = 256;
/// Most GETs one message may start.
pub const MAX_GETS_PER_MESSAGE: usize = 256;

/// What a running GET ends with: its index, request id, result, and whether
/// it was tracked (has an entry in `running_ids` to remove).
type Finished = (u32, String, Result<TransferSummary, AgentError>, bool);
type Running = Pin<Box<dyn Future<Output = Option<Finished>> + Send>>;

/// The answer stream of one `GetStream` call (see the module docs).
pub struct GetStream {
    agent: Arc<Agent>,
    origin: ShimOrigin,
    /// The shim's messages; `None` once it has closed its side.
    inbound: Option<Streaming<pb::GetStreamRequest>>,
    /// Quiet: a set's own yield would wake another runtime worker per poll.
    running: Quiet<FuturesUnordered<Running>>,
    /// Index -> how to stop it, for the GETs running now.
    running_ids: HashMap<u32, AbortHandle>,
    /// Resolves when the agent shuts down: the stream then takes no more
    /// GETs, answers those running and ends (the servers' graceful
    /// shutdown waits for every call).
    stopping: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl GetStream {
    pub fn new(
        agent: Arc<Agent>,
        origin: ShimOrigin,
        inbound: Streaming<pb::GetStreamRequest>,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Self {
        let stopping = stop.map(|mut rx| -> Pin<Box<dyn Future<Output = ()> + Send>> {
            Box::pin(async move {
                // A dropped sender (the agent's `run` gone) stops too.
                let _ = rx.wait_for(|s| *s).await;
            })
        });
        Self {
            agent,
            origin,
            inbound: Some(inbound),
            running: Quiet::new(FuturesUnordered::new()),
            running_ids: HashMap::new(),
            stopping,
        }
    }

    /// Starts the GETs of `msg` and stops those it cancels.
    fn take(&mut self, msg: pb::GetStreamRequest) {
        for index in msg.cancel {
            if let Some(h) = self.running_ids.remove(&index) {
                h.abort();
            }
        }
        for (n, get) in msg.gets.into_iter().enumerate() {
            let index = get.index;
            let refuse = |this: &mut Self, request_id: String, e: AgentError| {
                this.running.get_mut().push(Box::pin(std::future::ready(Some((index, request_id, Err(e), false)))));
            };
            let Some(item) = get.item else {
                refuse(self, String::new(), AgentError::BadRequest("a streamed GET without an item".into()));
                continue;
            };
            if n >= MAX_GETS_PER_MESSAGE {
                let e = AgentError::BadRequest(format!("more than {MAX_GETS_PER_MESSAGE} GETs in one message"));
                refuse(self, item.request_id, e);
                continue;
            }
            if self.running_ids.contains_key(&index) {
                let e = AgentError::BadRequest(format!("GET {index} is already running on this stream"));
                refuse(self, item.request_id, e);
                continue;
            }
            let ctx = RequestCtx::new(item.request_id.clone(), item.timeout_ms);
            let (agent, origin, session_id) = (self.agent.clone(), self.origin.clone(), get.session_id);
            let work = async move {
                // Looked up per GET, as a call of its own would be: it
                // renews the session, and fails once it is closed.
                let res = match agent.scoped(&session_id, &origin) {
                    Ok(s) => agent.get(&s, &GetObject::from(item), &ctx).await,
                    Err(e) => Err(e),
                };
                (index, ctx.request_id, res, true)
            };
            let (handle, registration) = AbortHandle::new_pair();
            self.running_ids.insert(index, handle);
            // A stopped GET ends with nothing to answer.
            self.running.get_mut().push(Box::pin(async move { Abortable::new(work, registration).await.ok() }));
        }
    }
}

impl Stream for GetStream {
    type Item = Result<pb::GetManyItem, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(stopping) = this.stopping.as_mut() {
            if stopping.as_mut().poll(cx).is_ready() {
                tracing::debug!(
                    running = this.running.get_ref().len(),
                    "GetStream: the agent is stopping; ending the stream"
                );
                this.stopping = None;
                this.inbound = None;
            }
        }
        // Read what the shim sent while there is room to run it.
        while this.running.get_ref().len() < STREAM_IN_FLIGHT {
            let Some(inbound) = this.inbound.as_mut() else { break };
            match inbound.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(msg))) => this.take(msg),
                Poll::Ready(Some(Err(status))) => {
                    // The shim's side broke: nobody is left to answer.
                    tracing::debug!(%status, "GetStream: the shim's side failed; stopping its GETs");
                    return Poll::Ready(None);
                }
                // The shim closed its side: answer what runs, then end.
                Poll::Ready(None) => this.inbound = None,
                Poll::Pending => break,
            }
        }
        loop {
            match this.running.poll_next_unpin(cx) {
                Poll::Ready(Some(None)) => continue,
                Poll::Ready(Some(Some((index, request_id, res, tracked)))) => {
                    if tracked {
                        this.running_ids.remove(&index);
                    }
                    let result = match res {
                        Ok(out) => pb::get_many_item::Result::Ok(crate::grpc::get_reply(&request_id, out)),
                        Err(e) => pb::get_many_item::Result::Error(e.detail()),
                    };
                    // The body polls again until Pending, which reads on.
                    return Poll::Ready(Some(Ok(pb::GetManyItem { index, result: Some(result) })));
                }
                // Nothing running: done if the shim is, else wait for it
                // (its stream holds the waker).
                Poll::Ready(None) if this.inbound.is_none() => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}
