//! What a memory owner knows of the one-sided operations on one window:
//! which bytes landed, whether an operation on it broke off or was
//! refused, and whether the window was revoked.
//!
//! Why: on the `tcp` transport the owner itself moves the bytes, on a
//! connection of its own, so the remote's word that a WRITE is done (the
//! gateway's HTTP reply) is not what makes the bytes be there. A remote
//! may even answer its requester before the owner has read the payload (a
//! posted WRITE, [`crate::tcp::wire::FEATURE_POSTED`]). The requester waits
//! here until the bytes it was told of have landed ([`Landing::settle`]):
//! the span from the window's start, each byte of it written by a WRITE
//! that finished (a sum of bytes would let a store that writes one range
//! twice pass). Revoking the window ([`Landing::revoke`], when its
//! capability is dropped) waits for a copy under way and lets no other
//! start, so no byte reaches the caller's memory once its request has
//! ended, however it ended (answered, failed or cancelled).
//!
//! On a NIC transport the NIC moves the bytes and nothing is tracked here
//! (an RC WRITE is complete at the remote before it answers).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// Most separate spans a window records; a remote that leaves more gaps
/// breaks the window (see `add_span`).
const MAX_SPANS: usize = 64;

/// One window's operations, as its owner saw them.
#[derive(Debug, Default)]
pub struct Landing {
    /// Window-relative `[start, end)` spans that finished WRITEs covered,
    /// sorted and merged.
    spans: Mutex<Vec<(u64, u64)>>,
    /// Operations checked and not yet finished or dropped.
    moving: AtomicU32,
    /// Operations ever checked (see [`Landing::began_after_settling`]).
    started: AtomicU64,
    /// `started` when the bytes last settled, plus one (0: never).
    settled_at: AtomicU64,
    /// Copies between memory and a socket under way (see [`Landing::revoke`]).
    in_copy: AtomicU32,
    revoked: AtomicBool,
    broke: AtomicBool,
    notify: Notify,
}

/// Returns once `count` (copies under way, each a few MiB at most) is 0:
/// spinning first, then yielding, then sleeping 50 µs at a time.
pub fn wait_until_zero(count: &AtomicU32) {
    let mut spins = 0u32;
    while count.load(Ordering::SeqCst) != 0 {
        spins = spins.saturating_add(1);
        if spins < 64 {
            std::hint::spin_loop();
        } else if spins < 1024 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Why the bytes a requester was told of are not all there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsettled {
    #[error("an operation on the window broke off before its last byte, or was refused")]
    Broke,
    #[error("{landed} of {expected} bytes landed in the window within {waited:?}")]
    Missing { landed: u64, expected: u64, waited: Duration },
    #[error("an operation began on the window after its bytes had landed, and may have changed them")]
    Late,
}

impl Landing {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// An operation at window offset `at` starts (it was checked against
    /// the window).
    pub fn start(self: &Arc<Self>, at: u64) -> Moving {
        // `moving` before `started`, and `settle` reads them the other way
        // round: an operation it does not see moving is counted after the
        // count it keeps.
        self.moving.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        Moving { landing: self.clone(), at, finished: false }
    }

    /// Whether an operation broke off or an access to the window was refused.
    pub fn is_broken(&self) -> bool {
        self.broke.load(Ordering::SeqCst)
    }

    /// Whether an operation began on the window after its bytes last
    /// settled (`settle` returned `Ok`): a late or repeated WRITE, which
    /// may have changed them before the window was revoked. Asked once the
    /// window is revoked, the answer is final.
    pub fn began_after_settling(&self) -> bool {
        match self.settled_at.load(Ordering::SeqCst) {
            0 => false,
            at => self.started.load(Ordering::SeqCst) != at - 1,
        }
    }

    /// An access to the window was refused (out of it, the wrong
    /// direction, expired): a requester waiting on it stops waiting.
    pub fn refused(&self) {
        self.broke.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// The bytes from the window's start that finished WRITEs covered.
    pub fn landed(&self) -> u64 {
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        match spans.first() {
            Some(&(0, end)) => end,
            _ => 0,
        }
    }

    /// Whether the window was revoked: operations on it stop.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::SeqCst)
    }

    /// Revokes the window. No copy starts after this returns, and a copy
    /// under way (one non-blocking read or write of a few MiB at most; for
    /// memory behind a bounce buffer, its DMA too) has ended. The copy's side marks itself first and then looks at
    /// `revoked`, and this side the other way round (both sequentially
    /// consistent), so one of them always sees the other.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
        wait_until_zero(&self.in_copy);
        self.notify.notify_waiters();
    }

    /// Resolves once the window is revoked (an operation waiting on its
    /// remote stops then, rather than holding the memory).
    pub async fn revoked(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_revoked() {
                return;
            }
            notified.await;
        }
    }

    /// Waits (at most `wait`) until the first `expected` bytes of the
    /// window have landed and no operation is moving bytes. Returns at
    /// once when they already have (the usual case: the remote answered
    /// after its WRITE).
    pub async fn settle(&self, expected: u64, wait: Duration) -> Result<(), Unsettled> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the check
            // and the wait still wakes it.
            notified.as_mut().enable();
            let started = self.started.load(Ordering::SeqCst);
            // `moving` before `broke`: an operation marks itself broken
            // before it stops moving, so one that broke just now is seen.
            let moving = self.moving.load(Ordering::SeqCst);
            if self.broke.load(Ordering::SeqCst) {
                return Err(Unsettled::Broke);
            }
            if moving == 0 && self.landed() >= expected {
                self.settled_at.store(started + 1, Ordering::SeqCst);
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Unsettled::Missing { landed: self.landed(), expected, waited: wait });
            }
        }
    }

    fn add_span(&self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        if spans.len() >= MAX_SPANS {
            // A remote scattering tiny WRITEs over the window: no remote of
            // ours does (it writes from the start, in order), and the
            // record stays small.
            drop(spans);
            self.refused();
            return;
        }
        spans.push((start, end));
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for &(s, e) in spans.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *spans = merged;
    }
}

/// An operation moving bytes of one window. Dropped without
/// [`Moving::finished`], it counts as broken off.
#[derive(Debug)]
pub struct Moving {
    landing: Arc<Landing>,
    /// Where in the window it starts.
    at: u64,
    finished: bool,
}

/// A copy under way (see [`Landing::revoke`]); ends when dropped.
#[derive(Debug)]
pub struct Copying<'a>(&'a Landing);

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.in_copy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Moving {
    pub fn landing(&self) -> &Arc<Landing> {
        &self.landing
    }

    /// Before each copy between the window's memory and a socket: `None`
    /// once the window is revoked (copy nothing). Hold the guard for the
    /// copy, and no longer: revoking waits for it.
    pub fn copy(&self) -> Option<Copying<'_>> {
        let l = &*self.landing;
        l.in_copy.fetch_add(1, Ordering::SeqCst);
        let guard = Copying(l);
        if l.revoked.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// All `bytes` of the operation are in place.
    pub fn finished(mut self, bytes: u64) {
        self.landing.add_span(self.at, self.at.saturating_add(bytes));
        self.finished = true;
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        if !self.finished {
            self.landing.broke.store(true, Ordering::SeqCst);
        }
        // After the span (in `finished`): a waiter that sees nothing moving
        // sees the bytes too.
        self.landing.moving.fetch_sub(1, Ordering::SeqCst);
        self.landing.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settles_when_the_bytes_land_and_not_before() {
        let l = Landing::new();
        let op = l.start(0);
        let wait = Duration::from_millis(50);
        // Nothing landed yet, and one operation still moving.
        assert!(matches!(l.settle(10, wait).await, Err(Unsettled::Missing { landed: 0, expected: 10, .. })));
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.settle(10, Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        op.finished(10);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(l.landed(), 10);
    }

    /// Coverage, not a sum: the same range twice, or a range past a gap,
    /// does not make the window's start land.
    #[tokio::test]
    async fn only_bytes_covered_from_the_start_count() {
        let l = Landing::new();
        l.start(0).finished(100);
        l.start(0).finished(100);
        assert_eq!(l.landed(), 100);
        l.start(150).finished(50);
        assert_eq!(l.landed(), 100, "a gap at 100..150");
        assert!(l.settle(200, Duration::from_millis(20)).await.is_err());
        l.start(100).finished(50);
        assert_eq!(l.landed(), 200);
        assert_eq!(l.settle(200, Duration::from_millis(20)).await, Ok(()));
        // Scattered tiny WRITEs break the window rather than grow its record.
        let l = Landing::new();
        for i in 0..(MAX_SPANS as u64 + 1) {
            l.start(1 + 2 * i).finished(1);
        }
        assert!(l.spans.lock().unwrap().len() <= MAX_SPANS);
        assert_eq!(l.settle(0, Duration::from_millis(20)).await, Err(Unsettled::Broke));
    }

    #[tokio::test]
    async fn an_operation_that_broke_off_or_was_refused_fails_the_settle() {
        let l = Landing::new();
        l.start(0).finished(4);
        drop(l.start(4)); // broke off
        assert_eq!(l.settle(4, Duration::from_secs(1)).await, Err(Unsettled::Broke));
        let l = Landing::new();
        l.refused();
        assert_eq!(l.settle(4, Duration::from_secs(1)).await, Err(Unsettled::Broke));
    }

    /// Revoking waits for a copy under way, and no copy starts after it.
    #[test]
    fn revoke_waits_for_the_copy_under_way_and_stops_the_next() {
        let l = Landing::new();
        let op = l.start(0);
        let copying = op.copy().expect("not revoked yet");
        let (tx, rx) = std::sync::mpsc::channel();
        let revoker = {
            let l = l.clone();
            std::thread::spawn(move || {
                l.revoke();
                tx.send(()).unwrap();
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "revoke returned during a copy");
        drop(copying);
        rx.recv_timeout(Duration::from_secs(5)).expect("revoke returned once the copy ended");
        revoker.join().unwrap();
        assert!(op.copy().is_none(), "no copy after the revocation");
    }
}
