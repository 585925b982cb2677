//! Sessions: what a shim opened for one tenant, the regions it registered,
//! and the lease that lets the agent reclaim them when the shim dies.
//!
//! Every call that names a session renews it, and a live shim renews all its
//! sessions with `Renew` (every third of the lease). A session nobody named
//! for a whole lease belongs to a shim that died (killed, partitioned,
//! restarted): the agent closes it and releases its regions, so neither
//! memory nor the tenant's registered-bytes quota leaks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::AgentError;
use crate::hostmem::HostRegion;
use crate::identity::ShimOrigin;
use crate::tenant_places::{Place, TenantPlaces};

/// Per-session counters reported by Stats.
#[derive(Default)]
pub struct SessionStats {
    pub requests: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    pub fallbacks: AtomicU64,
}

/// A registered region and its share of the tenant's registered-memory
/// quota, given back when the entry is dropped (release or session close).
pub(crate) struct Registered {
    pub region: Arc<dyn HostRegion>,
    pub _quota: sluice_qos::MemoryReservation,
    /// Its place among the tenant's regions (`max_regions_per_tenant`).
    pub _place: Place,
}

pub(crate) struct Session {
    pub tenant: String,
    /// Where the connection that opened it came from: the session id is
    /// honoured only from there.
    pub origin: ShimOrigin,
    pub regions: Mutex<HashMap<String, Registered>>,
    pub stats: SessionStats,
    /// When a call or a Renew last named it (ms since the table's epoch).
    last_seen_ms: AtomicU64,
    /// Its place among the tenant's sessions (`max_sessions_per_tenant`).
    _place: Place,
}

impl Session {
    pub fn regions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Registered>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn registered_bytes(regions: &HashMap<String, Registered>) -> u64 {
        regions.values().map(|r| r.region.len()).sum()
    }
}

/// A session resolved for one request: open (and renewed by it) and used
/// from the origin that opened it. [`Sessions::scoped`] is the only way to
/// get one, so an operation that takes a `&Scoped` cannot have skipped
/// either check.
pub struct Scoped {
    id: Arc<str>,
    session: Arc<Session>,
}

impl Scoped {
    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tenant the session acts for.
    pub fn tenant(&self) -> &str {
        &self.session.tenant
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }
}

/// The agent's open sessions.
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
    epoch: Instant,
    lease: Duration,
    places: TenantPlaces,
}

impl Sessions {
    /// Sessions renewed within `lease`, at most `max_per_tenant` of one tenant.
    pub fn new(lease: Duration, max_per_tenant: usize) -> Self {
        Self {
            map: Mutex::default(),
            epoch: Instant::now(),
            lease,
            places: TenantPlaces::new(max_per_tenant, "sessions"),
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session, unless the tenant holds `max_per_tenant` already.
    pub fn open(&self, id: String, tenant: &str, origin: &ShimOrigin) -> Result<Arc<Session>, AgentError> {
        let place = self.places.take(tenant)?;
        let s = Arc::new(Session {
            tenant: tenant.to_owned(),
            origin: origin.clone(),
            regions: Mutex::default(),
            stats: SessionStats::default(),
            last_seen_ms: AtomicU64::new(self.now_ms()),
            _place: place,
        });
        self.map().insert(id, s.clone());
        Ok(s)
    }

    /// The session, renewed; `UnknownSession` if it is not open.
    pub fn get(&self, id: &str) -> Result<Arc<Session>, AgentError> {
        let s = self.map().get(id).cloned().ok_or(AgentError::UnknownSession)?;
        s.last_seen_ms.store(self.now_ms(), Ordering::Relaxed);
        Ok(s)
    }

    /// Session `id` for a request from `origin`: refused (after
    /// `other_origin` saw it) when it was opened from elsewhere, so a leaked
    /// id is useless there; `UnknownSession` unless it is open. Renews it.
    pub fn scoped(
        &self,
        id: &str,
        origin: &ShimOrigin,
        other_origin: impl FnOnce(&Session),
    ) -> Result<Scoped, AgentError> {
        // Checked before the lookup renews it: a call from another origin
        // must not keep a session alive either.
        if let Some(s) = self.map().get(id).filter(|s| s.origin != *origin).cloned() {
            other_origin(&s);
            return Err(AgentError::Unauthenticated("this session was opened from another origin".into()));
        }
        Ok(Scoped { id: id.into(), session: self.get(id)? })
    }

    /// `scoped` again, renewed, for a later step of the same call (a
    /// batch's next item); `UnknownSession` once it was closed or expired.
    pub fn refresh(&self, scoped: &Scoped) -> Result<Scoped, AgentError> {
        Ok(Scoped { id: scoped.id.clone(), session: self.get(&scoped.id)? })
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.map().remove(id)
    }

    /// Renews the sessions among `ids` that are open and were opened from
    /// `origin`; returns the ids that are not (unknown, expired, another
    /// origin's), which the shim must re-open.
    pub fn renew(&self, ids: &[String], origin: &ShimOrigin) -> Vec<String> {
        let now = self.now_ms();
        let map = self.map();
        ids.iter()
            .filter(|id| match map.get(id.as_str()) {
                Some(s) if s.origin == *origin => {
                    s.last_seen_ms.store(now, Ordering::Relaxed);
                    false
                }
                _ => true,
            })
            .cloned()
            .collect()
    }

    /// Removes and returns every session not named for a whole lease.
    pub fn take_expired(&self) -> Vec<(String, Arc<Session>)> {
        let now = self.now_ms();
        let lease = self.lease.as_millis() as u64;
        let mut map = self.map();
        let dead: Vec<String> = map
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last_seen_ms.load(Ordering::Relaxed)) > lease)
            .map(|(id, _)| id.clone())
            .collect();
        dead.into_iter().filter_map(|id| map.remove(&id).map(|s| (id, s))).collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_unless_named() {
        let t = Sessions::new(Duration::from_millis(40), 16);
        t.open("a".into(), "alpha", &ShimOrigin::Unix).expect("open");
        t.open("b".into(), "alpha", &ShimOrigin::Unix).expect("open");
        t.open("c".into(), "alpha", &ShimOrigin::Unix).expect("open");
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(15));
            assert!(t.get("a").is_ok());
            let unknown = t.renew(&["b".into(), "zz".into()], &ShimOrigin::Unix);
            assert_eq!(unknown, ["zz"]);
        }
        let expired: Vec<String> = t.take_expired().into_iter().map(|(id, _)| id).collect();
        assert_eq!(expired, ["c"], "only the session nobody named");
        assert_eq!(t.len(), 2);
        assert!(matches!(t.get("c"), Err(AgentError::UnknownSession)));
    }

    #[test]
    fn a_session_is_scoped_only_from_its_origin() {
        let t = Sessions::new(Duration::from_secs(10), 16);
        t.open("a".into(), "alpha", &ShimOrigin::Unix).expect("open");
        let other = ShimOrigin::Network { ip: "10.0.0.9".parse().expect("ip"), cert: None };
        let mut seen = None;
        let e = t.scoped("a", &other, |s| seen = Some(s.tenant.clone())).err().expect("refused");
        assert!(matches!(e, AgentError::Unauthenticated(_)) && seen.as_deref() == Some("alpha"), "{e}");
        let s = t.scoped("a", &ShimOrigin::Unix, |_| unreachable!()).expect("its own origin");
        assert_eq!((s.id(), s.tenant()), ("a", "alpha"));
        assert!(matches!(t.scoped("zz", &ShimOrigin::Unix, |_| ()), Err(AgentError::UnknownSession)));
        t.remove("a");
        assert!(matches!(t.refresh(&s), Err(AgentError::UnknownSession)), "closed since");
    }

    #[test]
    fn renewals_from_another_origin_do_not_count() {
        let t = Sessions::new(Duration::from_millis(10), 16);
        t.open("a".into(), "alpha", &ShimOrigin::Unix).expect("open");
        let other = ShimOrigin::Network { ip: "10.0.0.9".parse().expect("ip"), cert: None };
        assert_eq!(t.renew(&["a".into()], &other), ["a"]);
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(t.take_expired().len(), 1);
    }

    #[test]
    fn a_tenant_opens_at_most_its_sessions_and_expired_ones_give_places_back() {
        let t = Sessions::new(Duration::from_millis(10), 2);
        t.open("a".into(), "alpha", &ShimOrigin::Unix).expect("first");
        t.open("b".into(), "alpha", &ShimOrigin::Unix).expect("second");
        let e = t.open("c".into(), "alpha", &ShimOrigin::Unix).err().expect("a third is refused");
        assert!(matches!(e, AgentError::ResourceExhausted(_)), "{e}");
        assert!(t.get("c").is_err(), "nothing was opened");
        t.open("d".into(), "beta", &ShimOrigin::Unix).expect("another tenant is not held back");
        t.remove("a");
        t.open("e".into(), "alpha", &ShimOrigin::Unix).expect("a closed session's place");
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(t.take_expired().len(), 3);
        t.open("f".into(), "alpha", &ShimOrigin::Unix).expect("expired sessions' places");
        t.open("g".into(), "alpha", &ShimOrigin::Unix).expect("expired sessions' places");
    }
}
