//! Batches of GETs (a loader's `get_many`): one control-channel call for
//! many objects, each item run like a single [`Agent::get`] (admitted,
//! scheduled fairly, checked, counted) and answered as soon as it finishes.
//!
//! Why batches: on a BlueField the shim→agent hop crosses PCIe and the
//! agent runs on a few Arm cores, so a call per 4 KiB sample costs more in
//! round trips and per-call work (HTTP/2 frames, spans, lookups) than the
//! sample itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use crate::agent::{Agent, TransferSummary};
use crate::error::AgentError;
use crate::requests::{GetObject, RequestCtx};
use crate::session::Scoped;

/// Most items of one batch in flight in the agent at once. The tenant's
/// admission (requests/s, in-flight bytes) and the fair scheduler still
/// apply to each; this only keeps one batch from spawning unbounded work.
pub const BATCH_CONCURRENCY: usize = 64;

pub use crate::model::MAX_BATCH_ITEMS;

impl Agent {
    /// Runs `items` for session `scoped` (an unknown session failed the
    /// call as a whole before: the shim re-opens it and sends the batch
    /// again); yields `(index, result)` as each finishes. Item `i`'s
    /// request id is `ctx`'s with `.i`; `ctx`'s timeout (none: the
    /// namespace's default per item) counts from the batch's arrival, so a
    /// batch never outlives it. Dropping the stream cancels the items still
    /// running.
    ///
    /// An item with a context of its own (a caller's single GET the shim
    /// coalesced into the batch) runs under that: its request id, and its
    /// timeout counted from the batch's arrival.
    pub fn get_many(
        self: &Arc<Self>,
        scoped: Scoped,
        items: Vec<(GetObject, Option<RequestCtx>)>,
        ctx: RequestCtx,
    ) -> Result<impl Stream<Item = (u32, Result<TransferSummary, AgentError>)> + Send + 'static, AgentError> {
        if items.len() > MAX_BATCH_ITEMS {
            return Err(AgentError::BadRequest(format!("a batch of {} items exceeds {MAX_BATCH_ITEMS}", items.len())));
        }
        let arrived = Instant::now();
        let (agent, scoped, ctx) = (self.clone(), Arc::new(scoped), Arc::new(ctx));
        let stream = futures::stream::iter(items.into_iter().enumerate())
            .map(move |(i, (item, own))| {
                let (agent, scoped, ctx) = (agent.clone(), scoped.clone(), ctx.clone());
                async move {
                    let index = u32::try_from(i).unwrap_or(u32::MAX);
                    let (request_id, limit) = match own {
                        Some(own) => (own.request_id, own.timeout),
                        None => (format!("{}.{i}", ctx.request_id), ctx.timeout),
                    };
                    let timeout = match remaining(limit, arrived) {
                        Ok(t) => t,
                        Err(limit) => return (index, Err(AgentError::DeadlineExceeded(limit))),
                    };
                    let item_ctx = RequestCtx { request_id, timeout };
                    // Each item names the session again, as a call of its own
                    // would: it renews it, and fails once it is closed.
                    let res = match agent.rescoped(&scoped) {
                        Ok(s) => agent.get(&s, &item, &item_ctx).await,
                        Err(e) => Err(e),
                    };
                    (index, res)
                }
            })
            .buffer_unordered(BATCH_CONCURRENCY);
        // Quiet: the set's own yield after each poll would wake another
        // runtime worker (crate::quiet).
        Ok(crate::quiet::Quiet::new(stream))
    }
}

/// What is left of a batch's `timeout` for an item starting now, in whole
/// milliseconds (`None` stays `None`: the namespace's default);
/// `Err(timeout)` when nothing is left.
fn remaining(timeout: Option<Duration>, arrived: Instant) -> Result<Option<Duration>, Duration> {
    let Some(limit) = timeout else {
        return Ok(None);
    };
    let left = limit.saturating_sub(arrived.elapsed());
    match u64::try_from(left.as_millis()).unwrap_or(u64::MAX) {
        0 => Err(limit),
        ms => Ok(Some(Duration::from_millis(ms))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_deadline_counts_from_its_arrival() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(remaining(None, Instant::now() - Duration::from_secs(100)), Ok(None));
        let left = remaining(ms(5000), Instant::now() - Duration::from_millis(1000)).unwrap().unwrap();
        assert!((3900..=4000).contains(&left.as_millis()), "{left:?}");
        assert_eq!(remaining(ms(100), Instant::now() - Duration::from_millis(200)), Err(Duration::from_millis(100)));
    }
}
