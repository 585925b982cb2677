//! GetBatch: a loader's batch of GETs in one frame, forwarded to the agent
//! as one streaming GetMany call. Every item is answered exactly once, as
//! soon as it is done: a bad path or a foreign region fails only its own
//! item; a batch the agent cannot take (or a deadline, or an agent that
//! dies mid-way) answers every item still open with the reason.

use futures::StreamExt;
use sluice_proto::agent as apb;
use sluice_proto::common::ErrorDetail;
use sluice_proto::shim::{self as pb, response::Result as Res};

use crate::error::ShimError;
use crate::requests::{GetObject, RequestCtx};
use crate::session::{session_gone, Session};

/// Where item answers go: the connection's writer.
pub trait Answer {
    /// Sends the answer to item `index`.
    fn answer(&mut self, index: u32, result: Res) -> impl std::future::Future<Output = ()> + Send;
}

/// Tracks which items are still open, so each gets exactly one answer —
/// also when the shim gave up on the batch (its items answered with the
/// reason) while the agent's late answers still come (dropped).
pub struct Open(std::sync::Mutex<OpenItems>);

struct OpenItems {
    open: Vec<bool>,
    left: usize,
}

impl Open {
    pub fn new(n: usize) -> Self {
        Self(std::sync::Mutex::new(OpenItems { open: vec![true; n], left: n }))
    }

    fn items(&self) -> std::sync::MutexGuard<'_, OpenItems> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `index` answered; false if it was not open (a duplicate or an
    /// index the agent should never have sent).
    fn close(&self, index: usize) -> bool {
        let mut items = self.items();
        match items.open.get_mut(index) {
            Some(o) if *o => {
                *o = false;
                items.left -= 1;
                true
            }
            _ => false,
        }
    }

    fn is_open(&self, index: usize) -> bool {
        self.items().open.get(index).copied().unwrap_or(false)
    }

    fn left(&self) -> usize {
        self.items().left
    }

    /// Answers every item still open with `e`.
    pub async fn fail_rest(&self, out: &mut impl Answer, e: &ShimError) {
        let closed: Vec<usize> = {
            let mut items = self.items();
            let closed = (0..items.open.len()).filter(|&i| items.open[i]).collect::<Vec<_>>();
            for &i in &closed {
                items.open[i] = false;
            }
            items.left = 0;
            closed
        };
        if closed.is_empty() {
            return;
        }
        let detail = e.detail();
        for i in closed {
            out.answer(i as u32, Res::Error(detail.clone())).await;
        }
    }
}

/// Serves `batch` in the caller's session `s`; answers items through
/// `out`, marking them in `open`. An `Err` is for the items still open (the
/// caller answers them with it).
pub async fn get_batch(
    s: &Session,
    batch: pb::GetBatch,
    ctx: &RequestCtx,
    open: &Open,
    out: &mut impl Answer,
) -> Result<(), ShimError> {
    // Checked locally first: each item's path and region; the rest go to
    // the agent in one call. `sent[k]` is the batch index of agent item k.
    let mut parsed: Vec<(usize, GetObject)> = Vec::with_capacity(batch.items.len());
    for (i, g) in batch.items.into_iter().enumerate() {
        match GetObject::try_from(g) {
            Ok(get) => parsed.push((i, get)),
            Err(e) => {
                open.close(i);
                out.answer(i as u32, Res::Error(e.detail())).await;
            }
        }
    }
    if parsed.is_empty() {
        return Ok(());
    }
    // Regions a request the shim gave up on may still be written into are
    // waited for (`in_doubt.rs`); an item whose region stays so fails alone.
    for (i, get) in &parsed {
        if let Err(e) = s.doubts().settled(&get.region, ctx.deadline).await {
            open.close(*i);
            out.answer(*i as u32, Res::Error(e.detail())).await;
        }
    }
    for attempt in 0..2 {
        parsed.retain(|(i, _)| open.is_open(*i));
        let (snap, region_ids) = s.snapshot_many(parsed.iter().map(|(_, get)| get.region.as_str()));
        let mut items = Vec::with_capacity(parsed.len());
        let mut sent = Vec::with_capacity(parsed.len());
        for ((i, get), region_id) in parsed.iter().zip(region_ids) {
            match region_id {
                Ok(region_id) => {
                    items.push(get.item(region_id));
                    sent.push(*i);
                }
                Err(e) => {
                    open.close(*i);
                    out.answer(*i as u32, Res::Error(e.detail())).await;
                }
            }
        }
        if items.is_empty() {
            return Ok(());
        }
        let generation = snap.generation();
        let req = apb::GetManyRequest {
            session_id: snap.session_id,
            request_id: ctx.request_id.clone(),
            timeout_ms: ctx.agent_timeout_ms(),
            items,
        };
        let mut stream = match s.agent().get_many(req).await {
            Ok(r) => r.into_inner(),
            Err(status) if attempt == 0 && session_gone(&status) => {
                // The agent restarted or expired the session: re-open it
                // (registering the regions again) and send the batch again.
                s.reestablish(generation).await?;
                continue;
            }
            Err(status) => return Err(status.into()),
        };
        while let Some(msg) = stream.next().await {
            let item = msg?;
            let Some(&i) = sent.get(item.index as usize) else {
                tracing::warn!(index = item.index, "the agent answered an item it was not sent; ignored");
                continue;
            };
            if !open.close(i) {
                continue;
            }
            let res = match item.result {
                Some(apb::get_many_item::Result::Ok(r)) => {
                    Res::Get(pb::GetResult { report: r.report, object_size: r.object_size, etag: r.etag })
                }
                Some(apb::get_many_item::Result::Error(d)) => Res::Error(d),
                None => Res::Error(ErrorDetail::new(
                    sluice_proto::common::ErrorCode::Internal,
                    "the agent answered an item without a result",
                )),
            };
            out.answer(i as u32, res).await;
        }
        if open.left() > 0 {
            return Err(ShimError::AgentUnavailable("the agent ended the batch before answering every item".into()));
        }
        return Ok(());
    }
    Err(ShimError::AgentUnavailable("the agent session changed twice during the batch; try again".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Collect(Vec<(u32, Res)>);
    impl Answer for Collect {
        async fn answer(&mut self, index: u32, result: Res) {
            self.0.push((index, result));
        }
    }

    #[tokio::test]
    async fn every_item_is_answered_once() {
        let open = Open::new(4);
        let mut out = Collect(Vec::new());
        assert!(open.close(1));
        assert!(!open.close(1), "a second answer to one item is dropped");
        assert!(!open.close(9), "an index out of the batch is dropped");
        open.fail_rest(&mut out, &ShimError::AgentUnavailable("gone".into())).await;
        let idx: Vec<u32> = out.0.iter().map(|(i, _)| *i).collect();
        assert_eq!(idx, vec![0, 2, 3]);
        open.fail_rest(&mut out, &ShimError::AgentUnavailable("again".into())).await;
        assert_eq!(out.0.len(), 3, "nothing is answered twice");
    }
}
