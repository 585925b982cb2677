//! Regions the agent may still be writing into after the shim stopped
//! waiting for it.
//!
//! The agent gets each request's deadline and stops its transfers before it
//! answers DEADLINE_EXCEEDED, so normally its answer ends a request. When
//! it is later than that by the shim's grace (an overloaded or stalled
//! agent, a call queued behind others), the shim answers the client itself
//! — but the agent has not said that the request's transfers stopped. Its
//! bytes could then land in the region after a later request into the same
//! region succeeded, and that request's bytes would be wrong.
//!
//! So a request the shim gave up on keeps waiting for the agent's answer in
//! the background (for at most [`LATE_WAIT`]), and holds its regions *in
//! doubt* until then: a new GET or PUT into such a region, or its release,
//! waits for the answer (within its own deadline) instead of starting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::ShimError;

/// Longest a request the shim gave up on keeps waiting for the agent's
/// answer before its regions are let go anyway (the agent's own release
/// then waits for transfers still using them).
pub const LATE_WAIT: Duration = Duration::from_secs(60);

/// The regions (the shim's ids) of one session in doubt, each with how many
/// given-up requests hold it.
#[derive(Default)]
pub struct Doubts {
    held: Mutex<HashMap<String, usize>>,
    settled: Notify,
}

/// Holds regions in doubt until dropped (the late answer came, or
/// [`LATE_WAIT`] passed).
pub struct InDoubt<'a> {
    doubts: &'a Doubts,
    regions: Vec<String>,
}

impl Drop for InDoubt<'_> {
    fn drop(&mut self) {
        let mut held = self.doubts.held();
        for r in &self.regions {
            if let Some(n) = held.get_mut(r) {
                *n -= 1;
                if *n == 0 {
                    held.remove(r);
                }
            }
        }
        drop(held);
        self.doubts.settled.notify_waiters();
    }
}

impl Doubts {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Puts `regions` in doubt until the guard is dropped.
    pub fn hold(&self, regions: Vec<String>) -> InDoubt<'_> {
        let mut held = self.held();
        for r in &regions {
            *held.entry(r.clone()).or_insert(0) += 1;
        }
        InDoubt { doubts: self, regions }
    }

    /// Whether `region` is in doubt now.
    pub fn is_held(&self, region: &str) -> bool {
        self.held().contains_key(region)
    }

    /// Waits until `region` is not in doubt, or refuses at `by`.
    pub async fn settled(&self, region: &str, by: Instant) -> Result<(), ShimError> {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check, so a drop between the check and
            // the wait is not missed.
            notified.as_mut().enable();
            if !self.is_held(region) {
                return Ok(());
            }
            if tokio::time::timeout_at(by.into(), notified).await.is_err() {
                return Err(ShimError::InDoubt(region.to_owned()));
            }
        }
    }

    /// Waits until no region is in doubt; false if some still are at `by`.
    pub async fn all_settled(&self, by: Instant) -> bool {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.held().is_empty() {
                return true;
            }
            if tokio::time::timeout_at(by.into(), notified).await.is_err() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_region_in_doubt_waits_for_the_late_answer_and_no_other_does() {
        let doubts = Doubts::default();
        let held = doubts.hold(vec!["r1".into(), "r2".into()]);
        let twice = doubts.hold(vec!["r1".into()]);
        let soon = Instant::now() + Duration::from_millis(50);
        doubts.settled("r3", soon).await.expect("another region starts at once");
        let e = doubts.settled("r1", soon).await.expect_err("r1 is in doubt");
        assert!(matches!(&e, ShimError::InDoubt(r) if r == "r1"), "{e}");
        assert_eq!(e.code(), sluice_proto::common::ErrorCode::DeadlineExceeded);
        assert!(!doubts.all_settled(Instant::now() + Duration::from_millis(10)).await);

        let by = Instant::now() + Duration::from_secs(5);
        let waiter = async {
            doubts.settled("r1", by).await.expect("r1 settles once both answers came");
            Instant::now()
        };
        let answers = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(held);
            assert!(doubts.is_held("r1") && !doubts.is_held("r2"), "r1 is still held by the other request");
            tokio::time::sleep(Duration::from_millis(30)).await;
            let at = Instant::now();
            drop(twice);
            at
        };
        let (settled_at, last_answer_at) = tokio::join!(waiter, answers);
        assert!(settled_at >= last_answer_at, "r1 settled before the last request holding it ended");
        assert!(doubts.all_settled(Instant::now()).await);
    }
}
