//! Per-tenant state: rate buckets, in-flight bytes with a FIFO wait queue, and
//! registered-memory accounting, plus the RAII handles that give them back.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::bucket::TokenBucket;
use crate::{lock, Limits, QosError};

/// Bytes/s bucket depth as a fraction of one second. Small so that a burst
/// after idling cannot skew a measurement window much (1/20 s of rate is 1%
/// of a 5 s window), yet a few timer ticks deep so pacing sleeps stay coarse.
const BYTES_BURST_DIVISOR: u64 = 20;

/// What an in-flight waiter is told when it leaves the queue.
#[derive(Debug)]
enum Grant {
    Admitted,
    /// A reload lowered the limit below this request's size.
    TooLarge {
        limit: u64,
    },
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    bytes: u64,
    tx: oneshot::Sender<Grant>,
}

#[derive(Debug)]
pub(crate) struct TenantState {
    pub(crate) limits: Limits,
    /// False once a reload drops the tenant. The state is kept (not deleted) so
    /// outstanding permits still release into the right counters and a tenant
    /// re-added later does not start from a clean slate while old work runs.
    pub(crate) configured: bool,
    requests: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
    pub(crate) inflight: u64,
    pub(crate) registered: u64,
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

#[derive(Debug)]
pub(crate) struct Tenant {
    pub(crate) name: String,
    pub(crate) state: Mutex<TenantState>,
}

/// Outcome of the synchronous part of admission.
pub(crate) enum Admission {
    Now,
    Queued(WaitGuard),
}

impl Tenant {
    pub(crate) fn new(name: String, limits: Limits) -> Arc<Self> {
        let now = Instant::now();
        let state = TenantState {
            requests: limits.requests_per_sec.map(|r| TokenBucket::new(r, r, now)),
            bytes: limits.bytes_per_sec.map(|r| TokenBucket::new(r, r / BYTES_BURST_DIVISOR, now)),
            limits,
            configured: true,
            inflight: 0,
            registered: 0,
            waiters: VecDeque::new(),
            next_id: 0,
        };
        Arc::new(Tenant { name, state: Mutex::new(state) })
    }

    /// Hot reload: keep buckets (clamped) and all accounting; then re-run the
    /// queue since a raised (or lowered) in-flight limit changes who fits.
    pub(crate) fn reconfigure(&self, limits: Limits) {
        let now = Instant::now();
        let mut st = lock(&self.state);
        st.requests = match (st.requests.take(), limits.requests_per_sec) {
            (Some(mut b), Some(r)) => {
                b.reconfigure(r, r, now);
                Some(b)
            }
            (None, Some(r)) => Some(TokenBucket::new(r, r, now)),
            (_, None) => None,
        };
        st.bytes = match (st.bytes.take(), limits.bytes_per_sec) {
            (Some(mut b), Some(r)) => {
                b.reconfigure(r, r / BYTES_BURST_DIVISOR, now);
                Some(b)
            }
            (None, Some(r)) => Some(TokenBucket::new(r, r / BYTES_BURST_DIVISOR, now)),
            (_, None) => None,
        };
        st.limits = limits;
        st.configured = true;
        st.dispatch();
    }

    /// Checks that refuse immediately, then either takes the in-flight bytes or
    /// joins the FIFO queue.
    pub(crate) fn try_admit(self: &Arc<Self>, bytes: u64) -> Result<Admission, QosError> {
        let mut st = lock(&self.state);
        if !st.configured {
            return Err(QosError::UnknownTenant { tenant: self.name.clone() });
        }
        if let Some(limit) = st.limits.max_inflight_bytes.filter(|&l| bytes > l) {
            return Err(QosError::TooLarge { tenant: self.name.clone(), requested: bytes, limit });
        }
        if let Some(bucket) = st.requests.as_mut() {
            if let Err(retry_after) = bucket.try_take(1, Instant::now()) {
                let limit = st.limits.requests_per_sec.unwrap_or(0);
                return Err(QosError::RateLimited {
                    tenant: self.name.clone(),
                    kind: "requests_per_sec",
                    limit,
                    retry_after,
                });
            }
        }
        // Only bypass the queue when nobody waits: otherwise small requests
        // would keep overtaking a large one forever.
        if st.waiters.is_empty() && st.fits(bytes) {
            st.inflight = st.inflight.saturating_add(bytes);
            return Ok(Admission::Now);
        }
        let (tx, rx) = oneshot::channel();
        let id = st.next_id;
        st.next_id += 1;
        st.waiters.push_back(Waiter { id, bytes, tx });
        Ok(Admission::Queued(WaitGuard { tenant: Arc::clone(self), id, bytes, rx, done: false }))
    }

    pub(crate) fn release_inflight(&self, bytes: u64) {
        let mut st = lock(&self.state);
        st.inflight = st.inflight.saturating_sub(bytes);
        st.dispatch();
    }

    pub(crate) fn queued(&self) -> usize {
        lock(&self.state).waiters.len()
    }
}

impl TenantState {
    fn fits(&self, bytes: u64) -> bool {
        self.limits.max_inflight_bytes.is_none_or(|l| self.inflight.saturating_add(bytes) <= l)
    }

    /// Serve the queue head-first while the head fits.
    fn dispatch(&mut self) {
        while let Some(head) = self.waiters.front() {
            let grant = match self.limits.max_inflight_bytes {
                Some(limit) if head.bytes > limit => Grant::TooLarge { limit },
                _ if self.fits(head.bytes) => Grant::Admitted,
                _ => break,
            };
            let Some(w) = self.waiters.pop_front() else { break };
            let admitted = matches!(grant, Grant::Admitted);
            // The receiver lives in a WaitGuard whose Drop removes the waiter
            // under this same lock, so the send cannot fail; if it ever did,
            // nobody owns the bytes and they must not be counted.
            if w.tx.send(grant).is_ok() && admitted {
                self.inflight = self.inflight.saturating_add(w.bytes);
            }
        }
    }
}

/// A queued in-flight admission. Dropping it (caller gave up, timeout) either
/// leaves the queue or, if it was granted in the meantime, gives the bytes back,
/// so cancellation never leaks budget.
pub(crate) struct WaitGuard {
    tenant: Arc<Tenant>,
    id: u64,
    bytes: u64,
    rx: oneshot::Receiver<Grant>,
    done: bool,
}

impl WaitGuard {
    /// Wait for the grant; `Ok(())` means the bytes are now counted in flight.
    pub(crate) async fn wait(mut self) -> Result<(), QosError> {
        let res = (&mut self.rx).await;
        self.done = true;
        match res {
            Ok(Grant::Admitted) => Ok(()),
            Ok(Grant::TooLarge { limit }) => {
                Err(QosError::TooLarge { tenant: self.tenant.name.clone(), requested: self.bytes, limit })
            }
            // Unreachable while we hold the tenant (see `dispatch`); report as busy.
            Err(_) => Err(QosError::Busy {
                tenant: self.tenant.name.clone(),
                resource: crate::RESOURCE_INFLIGHT,
                waited: std::time::Duration::ZERO,
            }),
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = lock(&self.tenant.state);
        if let Some(pos) = st.waiters.iter().position(|w| w.id == self.id) {
            st.waiters.remove(pos);
        } else if let Ok(Grant::Admitted) = self.rx.try_recv() {
            st.inflight = st.inflight.saturating_sub(self.bytes);
        }
        // A removed head may have been what blocked smaller requests behind it.
        st.dispatch();
    }
}

/// Admission of one request: holds its bytes against `max_inflight_bytes` until
/// dropped, and paces its transfer against `bytes_per_sec`.
#[derive(Debug)]
pub struct Permit {
    pub(crate) qos: crate::Qos,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) bytes: u64,
}

impl Permit {
    pub fn tenant(&self) -> &str {
        &self.tenant.name
    }

    /// Bytes this permit holds in flight.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Call before moving each chunk of `n` bytes: sleeps as long as needed to
    /// keep the tenant (all its concurrent requests together) at `bytes_per_sec`.
    /// Tokens are taken before sleeping, so concurrent callers are served in
    /// call order; if this future is dropped mid-sleep the tokens stay spent
    /// (conservative: the tenant is never credited for data it might have sent).
    pub async fn pace(&self, n: u64) {
        let wait = {
            let mut st = lock(&self.tenant.state);
            match st.bytes.as_mut() {
                Some(bucket) => bucket.reserve(n, Instant::now()),
                None => std::time::Duration::ZERO,
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// `pace(n)` then a fair-scheduler slot costing `n`: the usual per-chunk
    /// step. Pacing comes first so a rate-limited tenant sleeps without holding
    /// one of the agent's global slots.
    pub async fn chunk(&self, n: u64) -> Result<crate::Slot, QosError> {
        self.pace(n).await;
        self.qos.slot(&self.tenant.name, n).await
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.tenant.release_inflight(self.bytes);
    }
}

/// Registered (pinned) memory counted against `max_registered_bytes` until dropped.
#[derive(Debug)]
pub struct MemoryReservation {
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) bytes: u64,
}

impl MemoryReservation {
    pub fn tenant(&self) -> &str {
        &self.tenant.name
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        let mut st = lock(&self.tenant.state);
        st.registered = st.registered.saturating_sub(self.bytes);
    }
}

impl Tenant {
    pub(crate) fn reserve_memory(self: &Arc<Self>, bytes: u64) -> Result<MemoryReservation, QosError> {
        let mut st = lock(&self.state);
        if !st.configured {
            return Err(QosError::UnknownTenant { tenant: self.name.clone() });
        }
        if let Some(limit) = st.limits.max_registered_bytes {
            if st.registered.saturating_add(bytes) > limit {
                return Err(QosError::MemoryQuota {
                    tenant: self.name.clone(),
                    limit,
                    requested: bytes,
                    in_use: st.registered,
                });
            }
        }
        st.registered = st.registered.saturating_add(bytes);
        Ok(MemoryReservation { tenant: Arc::clone(self), bytes })
    }
}
