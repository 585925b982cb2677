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

use crate::agent::{Agent, TransferReport};
use crate::error::AgentError;
use crate::requests::GetObject;

/// Most items of one batch in flight in the agent at once. The tenant's
/// admission (requests/s, in-flight bytes) and the fair scheduler still
/// apply to each; this only keeps one batch from spawning unbounded work.
pub const BATCH_CONCURRENCY: usize = 64;

pub use crate::model::MAX_BATCH_ITEMS;

impl Agent {
    /// Runs `items` for session `session_id`; yields `(index, result)` as
    /// each finishes. `timeout_ms` (0: the namespace's default per item)
    /// counts from the batch's arrival, so a batch never outlives it.
    /// Dropping the stream cancels the items still running.
    pub fn get_many(
        self: &Arc<Self>,
        session_id: String,
        request_id: String,
        items: Vec<GetObject>,
        timeout_ms: u32,
    ) -> Result<impl Stream<Item = (u32, Result<TransferReport, AgentError>)> + Send + 'static, AgentError> {
        if items.len() > MAX_BATCH_ITEMS {
            return Err(AgentError::BadRequest(format!("a batch of {} items exceeds {MAX_BATCH_ITEMS}", items.len())));
        }
        // An unknown session fails the call as a whole (the shim re-opens
        // it and sends the batch again), not item by item.
        self.session_exists(&session_id)?;
        let arrived = Instant::now();
        let (session_id, request_id): (Arc<str>, Arc<str>) = (session_id.into(), request_id.into());
        let agent = self.clone();
        let stream = futures::stream::iter(items.into_iter().enumerate())
            .map(move |(i, item)| {
                let (agent, session_id, request_id) = (agent.clone(), session_id.clone(), request_id.clone());
                async move {
                    let index = u32::try_from(i).unwrap_or(u32::MAX);
                    let timeout_ms = match remaining(timeout_ms, arrived) {
                        Ok(ms) => ms,
                        Err(limit) => return (index, Err(AgentError::DeadlineExceeded(limit))),
                    };
                    let rid = format!("{request_id}.{i}");
                    let res = agent.get(&session_id, &rid, timeout_ms, &item).await;
                    (index, res)
                }
            })
            .buffer_unordered(BATCH_CONCURRENCY);
        Ok(stream)
    }
}

/// What is left of a batch's `timeout_ms` for an item starting now (0 stays
/// 0: the namespace's default); `Err(limit)` when nothing is left.
fn remaining(timeout_ms: u32, arrived: Instant) -> Result<u32, Duration> {
    if timeout_ms == 0 {
        return Ok(0);
    }
    let limit = Duration::from_millis(u64::from(timeout_ms));
    let left = limit.saturating_sub(arrived.elapsed());
    match u32::try_from(left.as_millis()).unwrap_or(u32::MAX) {
        0 => Err(limit),
        ms => Ok(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_deadline_counts_from_its_arrival() {
        assert_eq!(remaining(0, Instant::now() - Duration::from_secs(100)), Ok(0));
        let left = remaining(5000, Instant::now() - Duration::from_millis(1000)).unwrap();
        assert!((3900..=4000).contains(&left), "{left}");
        assert_eq!(remaining(100, Instant::now() - Duration::from_millis(200)), Err(Duration::from_millis(100)));
    }
}
