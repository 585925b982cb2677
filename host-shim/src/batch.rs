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

/// Tracks which items are still open, so each gets exactly one answer.
pub struct Open {
    open: Vec<bool>,
    left: usize,
}

impl Open {
    pub fn new(n: usize) -> Self {
        Self { open: vec![true; n], left: n }
    }

    /// Marks `index` answered; false if it was not open (a duplicate or an
    /// index the agent should never have sent).
    fn close(&mut self, index: usize) -> bool {
        match self.open.get_mut(index) {
            Some(o) if *o => {
                *o = false;
                self.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// Answers every item still open with `e`.
    pub async fn fail_rest(&mut self, out: &mut impl Answer, e: &ShimError) {
        if self.left == 0 {
            return;
        }
        let detail = e.detail();
        for i in 0..self.open.len() {
            if self.close(i) {
                out.answer(i as u32, Res::Error(detail.clone())).await;
            }
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
    open: &mut Open,
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
    for attempt in 0..2 {
        parsed.retain(|(i, _)| open.open[*i]);
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
            timeout_ms: ctx.timeout_ms,
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
        if open.left > 0 {
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
        let mut open = Open::new(4);
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
