//! Sluice per-tenant quotas and fair scheduling.
//!
//! One [`Qos`] per agent, shared by all connections. Per request:
//!
//! ```text
//! let permit = qos.admit(tenant, object_len).await?;   // requests/s, in-flight bytes
//! let _mem = qos.reserve_memory(tenant, buf_len)?;     // registered (pinned) memory
//! for chunk in chunks {
//!     let _slot = permit.chunk(chunk.len()).await?;    // bytes/s pacing, then DRR slot
//!     move_chunk(chunk).await;
//! }
//! ```
//!
//! How each limit behaves, and why:
//! * `requests_per_sec`: token bucket (burst = 1 s worth); when empty the
//!   request is *refused* at once with [`QosError::RateLimited`] carrying
//!   `retry_after`, so clients back off and the refusal shows in metrics.
//! * `max_inflight_bytes`: the request *waits* (FIFO per tenant, bounded by
//!   [`QosConfig::queue_timeout`], then [`QosError::Busy`]); a request larger
//!   than the whole budget is refused with [`QosError::TooLarge`].
//! * `bytes_per_sec`: *paced*, never refused: [`Permit::pace`] sleeps so the
//!   tenant's long-run rate is the limit (burst = 1/20 s of rate).
//! * `max_registered_bytes`: *refused* at once ([`QosError::MemoryQuota`]);
//!   registration happens on the connection path where waiting would stall it.
//! * fairness: [`Qos::slot`] bounds chunks in flight across all tenants to
//!   [`QosConfig::global_slots`] and, when contended, serves tenants by deficit
//!   round robin weighted by [`Limits::weight`], cost = chunk bytes.
//!
//! Limits are hot-reloadable with [`Qos::update`] (the agent calls it on SIGHUP
//! or from its admin API). Every refusal is counted ([`Qos::refusals`]) and
//! passed to the optional observer for metrics.

#![forbid(unsafe_code)]

mod bucket;
mod drr;
mod error;
mod tenant;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

pub use drr::Slot;
pub use error::QosError;
pub use tenant::{MemoryReservation, Permit};

use drr::{Acquire, Scheduler};
use tenant::{Admission, Tenant};

/// `Busy::resource` when waiting for in-flight budget.
pub const RESOURCE_INFLIGHT: &str = "max_inflight_bytes";
/// `Busy::resource` when waiting for a global transfer slot.
pub const RESOURCE_SLOTS: &str = "transfer_slots";
/// Tenant label used in [`Qos::refusals`] for tenants that are not configured
/// (e.g. `UnknownTenant`, or `slot()` callers with made-up names), so that
/// arbitrary names cannot grow the counter map without bound. The observer
/// still gets the full error; it should apply the same care to metric labels.
pub const UNKNOWN_TENANT_LABEL: &str = "<unknown>";

/// Per-tenant limits; `None` means unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub bytes_per_sec: Option<u64>,
    pub requests_per_sec: Option<u64>,
    pub max_inflight_bytes: Option<u64>,
    pub max_registered_bytes: Option<u64>,
    /// Share of the transfer scheduler relative to other tenants (>= 1).
    pub weight: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bytes_per_sec: None,
            requests_per_sec: None,
            max_inflight_bytes: None,
            max_registered_bytes: None,
            weight: 1,
        }
    }
}

impl Limits {
    fn validate(&self, tenant: &str) -> Result<(), QosError> {
        let invalid = |reason| Err(QosError::InvalidLimits { tenant: tenant.to_owned(), reason });
        // Zero rates would mean "wait forever" for pacing and an ill-defined
        // retry_after; a tenant meant to be blocked should be removed instead.
        if self.bytes_per_sec == Some(0) {
            return invalid("bytes_per_sec must be > 0 (omit it for unlimited)");
        }
        if self.requests_per_sec == Some(0) {
            return invalid("requests_per_sec must be > 0 (omit it for unlimited)");
        }
        if self.weight == 0 {
            return invalid("weight must be >= 1");
        }
        Ok(())
    }
}

/// Agent-wide settings, fixed at construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosConfig {
    /// Transfer chunks in flight across all tenants (at least 1).
    pub global_slots: usize,
    /// How long `admit` waits for in-flight budget and `slot` for a slot
    /// before failing with [`QosError::Busy`].
    pub queue_timeout: Duration,
    /// DRR quantum for weight 1, in bytes. Smaller interleaves more finely.
    pub quantum_bytes: u64,
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig { global_slots: 64, queue_timeout: Duration::from_secs(30), quantum_bytes: 256 * 1024 }
    }
}

/// A tenant's current consumption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub inflight_bytes: u64,
    pub registered_bytes: u64,
    /// Waiters for in-flight budget plus waiters for a transfer slot.
    pub queued: usize,
}

/// Called on every refusal (outside QoS locks), e.g. to bump a Prometheus
/// counter labelled with `err.tenant()` and `err.kind()`.
pub type RefusalObserver = Arc<dyn Fn(&QosError) + Send + Sync>;

/// Called for every transfer slot granted, with the tenant that asked and how
/// long it waited for the fair scheduler (zero when a slot was free), e.g. to
/// feed a per-tenant histogram: the scheduler's promise (a small request waits
/// behind a chunk or two per slot, never behind a whole transfer) is then
/// visible in production, not only in tests. The wait ends when the waiting
/// task runs again, so it includes that task's wake-up. Called outside QoS
/// locks.
pub type SlotWaitObserver = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// Optional callbacks for metrics.
#[derive(Clone, Default)]
pub struct Observers {
    pub refusals: Option<RefusalObserver>,
    pub slot_waits: Option<SlotWaitObserver>,
}

/// Per-tenant quotas and the fair transfer scheduler. Cheap to clone.
#[derive(Clone)]
pub struct Qos {
    inner: Arc<Inner>,
}

struct Inner {
    config: QosConfig,
    tenants: RwLock<HashMap<String, Arc<Tenant>>>,
    sched: drr::Shared,
    refusals: Mutex<HashMap<(String, &'static str), u64>>,
    observers: Observers,
}

impl fmt::Debug for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qos").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

/// Locks ignoring poisoning: every critical section leaves the state consistent
/// before anything that could panic, and a QoS layer that wedges after one
/// panicking task would take the whole agent down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn weights(tenants: &HashMap<String, Limits>) -> HashMap<String, u32> {
    tenants.iter().map(|(name, l)| (name.clone(), l.weight)).collect()
}

fn validate_all(tenants: &HashMap<String, Limits>) -> Result<(), QosError> {
    tenants.iter().try_for_each(|(name, limits)| limits.validate(name))
}

impl Qos {
    pub fn new(config: QosConfig, tenants: HashMap<String, Limits>) -> Result<Qos, QosError> {
        Self::with_observers(config, tenants, Observers::default())
    }

    pub fn with_observer(
        config: QosConfig,
        tenants: HashMap<String, Limits>,
        observer: RefusalObserver,
    ) -> Result<Qos, QosError> {
        Self::with_observers(config, tenants, Observers { refusals: Some(observer), slot_waits: None })
    }

    pub fn with_observers(
        config: QosConfig,
        tenants: HashMap<String, Limits>,
        observers: Observers,
    ) -> Result<Qos, QosError> {
        validate_all(&tenants)?;
        let sched = Scheduler::new(config.global_slots, config.quantum_bytes, weights(&tenants));
        let tenants = tenants.into_iter().map(|(name, l)| (name.clone(), Tenant::new(name, l))).collect();
        Ok(Qos {
            inner: Arc::new(Inner {
                config,
                tenants: RwLock::new(tenants),
                sched: Arc::new(Mutex::new(sched)),
                refusals: Mutex::new(HashMap::new()),
                observers,
            }),
        })
    }

    /// Hot reload. All-or-nothing: if any entry is invalid nothing changes.
    /// Existing permits, reservations and slots stay valid; buckets keep their
    /// level (clamped to the new burst); tenants missing from `tenants` are
    /// refused from now on (`UnknownTenant`) while their outstanding work drains.
    pub fn update(&self, tenants: HashMap<String, Limits>) -> Result<(), QosError> {
        validate_all(&tenants)?;
        lock(&self.inner.sched).set_weights(weights(&tenants));
        let mut map = self.inner.tenants.write().unwrap_or_else(PoisonError::into_inner);
        for (name, tenant) in map.iter() {
            if !tenants.contains_key(name) {
                lock(&tenant.state).configured = false;
            }
        }
        for (name, limits) in tenants {
            match map.get(&name) {
                Some(tenant) => tenant.reconfigure(limits),
                None => {
                    map.insert(name.clone(), Tenant::new(name, limits));
                }
            }
        }
        Ok(())
    }

    /// The limits currently configured for `tenant`.
    pub fn limits(&self, tenant: &str) -> Option<Limits> {
        let t = self.tenant(tenant)?;
        let st = lock(&t.state);
        st.configured.then(|| st.limits.clone())
    }

    pub fn config(&self) -> &QosConfig {
        &self.inner.config
    }

    fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.inner.tenants.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    fn known_tenant(&self, name: &str) -> Result<Arc<Tenant>, QosError> {
        self.tenant(name).ok_or_else(|| self.refuse(QosError::UnknownTenant { tenant: name.to_owned() }))
    }

    /// Count and report a refusal, then hand it back to the caller.
    fn refuse(&self, err: QosError) -> QosError {
        let configured = !matches!(err, QosError::UnknownTenant { .. })
            && self.tenant(err.tenant()).is_some_and(|t| lock(&t.state).configured);
        let label = if configured { err.tenant() } else { UNKNOWN_TENANT_LABEL };
        let label = label.to_owned();
        *lock(&self.inner.refusals).entry((label, err.kind())).or_insert(0) += 1;
        if let Some(observer) = &self.inner.observers.refusals {
            observer(&err);
        }
        err
    }

    /// Admit a request that will move `bytes`: may refuse at once (unknown
    /// tenant, requests/s, too large) or wait for in-flight budget (then `Busy`
    /// after the queue timeout). Cancellation-safe: dropping the future while
    /// it waits gives back everything it had been granted.
    pub async fn admit(&self, tenant: &str, bytes: u64) -> Result<Permit, QosError> {
        let t = self.known_tenant(tenant)?;
        let admission = t.try_admit(bytes).map_err(|e| self.refuse(e))?;
        if let Admission::Queued(guard) = admission {
            let timeout = self.inner.config.queue_timeout;
            match tokio::time::timeout(timeout, guard.wait()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.refuse(e)),
                Err(_) => {
                    let resource = RESOURCE_INFLIGHT;
                    return Err(self.refuse(QosError::Busy { tenant: tenant.to_owned(), resource, waited: timeout }));
                }
            }
        }
        Ok(Permit { qos: self.clone(), tenant: t, bytes })
    }

    /// Account `bytes` of registered (pinned) memory; refused at once if it
    /// would exceed `max_registered_bytes`. Released when the reservation drops.
    pub fn reserve_memory(&self, tenant: &str, bytes: u64) -> Result<MemoryReservation, QosError> {
        let t = self.known_tenant(tenant)?;
        t.reserve_memory(bytes).map_err(|e| self.refuse(e))
    }

    /// One global transfer slot for a chunk of `cost_bytes`, granted by
    /// weighted DRR when contended. Any tenant name is accepted (unknown ones
    /// get weight 1): admission control is `admit`'s job. Fails with `Busy`
    /// after the queue timeout. Cancellation-safe.
    pub async fn slot(&self, tenant: &str, cost_bytes: u64) -> Result<Slot, QosError> {
        let guard = match Scheduler::acquire(&self.inner.sched, tenant, cost_bytes) {
            Acquire::Now => {
                self.slot_granted(tenant, Duration::ZERO);
                return Ok(Slot { sched: Arc::clone(&self.inner.sched) });
            }
            Acquire::Queued(guard) => guard,
        };
        let queued_at = tokio::time::Instant::now();
        let timeout = self.inner.config.queue_timeout;
        let waited = match tokio::time::timeout(timeout, guard.wait()).await {
            Ok(Some(slot)) => {
                self.slot_granted(tenant, queued_at.elapsed());
                return Ok(slot);
            }
            Ok(None) => Duration::ZERO,
            Err(_) => timeout,
        };
        Err(self.refuse(QosError::Busy { tenant: tenant.to_owned(), resource: RESOURCE_SLOTS, waited }))
    }

    fn slot_granted(&self, tenant: &str, waited: Duration) {
        if let Some(observer) = &self.inner.observers.slot_waits {
            observer(tenant, waited);
        }
    }

    /// Current usage of a configured tenant.
    pub fn snapshot(&self, tenant: &str) -> Option<Usage> {
        let t = self.tenant(tenant)?;
        let (inflight_bytes, registered_bytes, configured) = {
            let st = lock(&t.state);
            (st.inflight, st.registered, st.configured)
        };
        if !configured {
            return None;
        }
        let queued = t.queued() + lock(&self.inner.sched).queued(tenant);
        Some(Usage { inflight_bytes, registered_bytes, queued })
    }

    /// Refusal counts by (tenant, [`QosError::kind`]) since construction.
    pub fn refusals(&self) -> HashMap<(String, &'static str), u64> {
        lock(&self.inner.refusals).clone()
    }
}
