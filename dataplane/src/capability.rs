//! Descriptors are capabilities. A grant binds one window of one region to
//! one tenant, one request and one direction, under a random key; every
//! access presents the key and is checked for key, bounds and direction.
//! Dropping the [`Capability`] (when the request completes) revokes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ring::rand::{SecureRandom, SystemRandom};

use crate::landing::{Landing, Moving};
use crate::memory::RegionMemory;

/// Which one-sided operation a grant allows the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The remote writes into the window (an S3 GET).
    RemoteWrite,
    /// The remote reads from the window (an S3 PUT / UploadPart).
    RemoteRead,
}

/// What to expose.
#[derive(Debug, Clone)]
pub struct Grant {
    pub memory: Arc<dyn RegionMemory>,
    /// Window start within `memory`.
    pub offset: u64,
    pub len: u64,
    pub access: Access,
    pub tenant: String,
    pub request_id: String,
}

/// The key a remote presents: rkey (32 bits) + DCT field (24 bits) + the
/// window's random base address (52 bits; the low 12 are zero) — 108 random
/// bits, all checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub rkey: u32,
    pub dct: u32,
}

struct Entry {
    grant: Grant,
    base: u64,
    landing: Arc<Landing>,
    /// Descriptors are short-lived even if a request hangs: past this, the
    /// grant is refused (and counted) although not yet revoked.
    expires: std::time::Instant,
}

/// How long a descriptor stays usable by default: far longer than one part
/// takes, far shorter than a leaked descriptor would be useful for.
pub const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(120);

/// Why an access was refused (each is counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    #[error("no such descriptor (wrong key, or revoked)")]
    UnknownKey,
    #[error("access outside the descriptor's window")]
    OutOfWindow,
    #[error("the descriptor does not allow this direction")]
    WrongDirection,
    #[error("the descriptor has expired")]
    Expired,
}

impl Rejection {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::UnknownKey => "unknown_key",
            Self::OutOfWindow => "out_of_window",
            Self::WrongDirection => "wrong_direction",
            Self::Expired => "expired",
        }
    }
}

/// Rejection counters, by reason.
#[derive(Debug, Default)]
pub struct RejectionCounts {
    pub unknown_key: AtomicU64,
    pub out_of_window: AtomicU64,
    pub wrong_direction: AtomicU64,
    pub expired: AtomicU64,
}

impl RejectionCounts {
    pub fn total(&self) -> u64 {
        self.unknown_key.load(Ordering::Relaxed)
            + self.out_of_window.load(Ordering::Relaxed)
            + self.wrong_direction.load(Ordering::Relaxed)
            + self.expired.load(Ordering::Relaxed)
    }
}

/// The live grants of one transport endpoint.
pub struct CapabilityTable {
    entries: Mutex<HashMap<Key, Entry>>,
    rng: SystemRandom,
    ttl: std::time::Duration,
    pub rejections: RejectionCounts,
}

/// A live grant; revoked on drop.
pub struct Capability {
    table: Arc<CapabilityTable>,
    pub key: Key,
    /// Base "address" of the window as the remote sees it.
    pub base: u64,
    pub len: u64,
    /// The operations the owner served on the window.
    pub landing: Arc<Landing>,
}

impl std::fmt::Debug for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capability").field("len", &self.len).finish_non_exhaustive()
    }
}

impl Drop for Capability {
    fn drop(&mut self) {
        self.table.entries.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
        // An operation already checked copies nothing more, and a copy
        // under way has ended when this returns.
        self.landing.revoke();
    }
}

/// The window a checked access may touch.
pub struct Checked {
    pub memory: Arc<dyn RegionMemory>,
    /// Offset within `memory` where the access starts.
    pub offset: u64,
    /// The access, counted on its window until it is finished or dropped.
    pub moving: Moving,
}

impl CapabilityTable {
    pub fn new() -> Arc<Self> {
        Self::with_ttl(DEFAULT_TTL)
    }

    /// A table whose descriptors expire `ttl` after they are granted.
    pub fn with_ttl(ttl: std::time::Duration) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::default(),
            rng: SystemRandom::new(),
            ttl,
            rejections: RejectionCounts::default(),
        })
    }

    fn random_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        // getrandom failing is not recoverable (ring documents it as
        // practically impossible on Linux).
        self.rng.fill(&mut b).expect("system random number generator failed");
        u64::from_le_bytes(b)
    }

    /// Grants access; the capability lives until dropped.
    pub fn grant(self: &Arc<Self>, grant: Grant) -> Capability {
        let len = grant.len;
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let r = self.random_u64();
            let key = Key { rkey: r as u32, dct: ((r >> 32) as u32) & 0xff_ffff };
            // Page-aligned random base, with room for the window below 2^64.
            let base = (self.random_u64() & !0xfff) >> 1;
            if key.rkey == 0 || entries.contains_key(&key) {
                continue;
            }
            let landing = Landing::new();
            let expires = std::time::Instant::now() + self.ttl;
            entries.insert(key, Entry { grant, base, landing: landing.clone(), expires });
            return Capability { table: self.clone(), key, base, len, landing };
        }
    }

    /// Checks one access of `len` bytes at remote address `addr`.
    ///
    /// A key is only half of a descriptor: an access that does not start in
    /// the window of a live key is refused as an unknown key, whatever else
    /// is wrong with it. So the answer says nothing of whether a key alone
    /// exists (which would let a peer guess the key and the base apart,
    /// far cheaper than both), and only an access that names the window
    /// (key and base) makes a requester waiting on it stop waiting.
    pub fn check(&self, key: Key, addr: u64, len: u64, access: Access) -> Result<Checked, Rejection> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let named = |e: &Entry| addr >= e.base && addr - e.base < e.grant.len.max(1);
        let result = match entries.get(&key) {
            Some(e) if !named(e) => Err(Rejection::UnknownKey),
            None => Err(Rejection::UnknownKey),
            Some(e) if e.grant.access != access => Err(Rejection::WrongDirection),
            Some(e) if std::time::Instant::now() > e.expires => Err(Rejection::Expired),
            Some(e) => {
                let inside = addr >= e.base && addr.checked_add(len).is_some_and(|end| end <= e.base + e.grant.len);
                if inside {
                    Ok(Checked {
                        memory: e.grant.memory.clone(),
                        offset: e.grant.offset + (addr - e.base),
                        moving: e.landing.start(addr - e.base),
                    })
                } else {
                    Err(Rejection::OutOfWindow)
                }
            }
        };
        if let Err(r) = &result {
            // A requester waiting on that window need not wait longer.
            if let Some(e) = entries.get(&key).filter(|e| *r != Rejection::UnknownKey && named(e)) {
                e.landing.refused();
            }
            let c = match r {
                Rejection::UnknownKey => &self.rejections.unknown_key,
                Rejection::OutOfWindow => &self.rejections.out_of_window,
                Rejection::WrongDirection => &self.rejections.wrong_direction,
                Rejection::Expired => &self.rejections.expired,
            };
            c.fetch_add(1, Ordering::Relaxed);
            // Guesses are counted, not logged one by one (a peer could
            // flood the log); a refused access to a real window is news.
            if *r == Rejection::UnknownKey {
                tracing::debug!(addr, len, "descriptor access rejected: unknown key");
            } else {
                tracing::warn!(reason = r.as_str(), addr, len, "descriptor access rejected");
            }
        }
        result
    }

    /// Live grants (for metrics and tests).
    pub fn live(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::SharedRegion;

    fn region() -> Arc<dyn RegionMemory> {
        Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("t", 1 << 16).unwrap()))
    }

    fn grant(access: Access) -> Grant {
        Grant { memory: region(), offset: 4096, len: 1000, access, tenant: "a".into(), request_id: "r".into() }
    }

    #[test]
    fn checks_key_bounds_and_direction() {
        let t = CapabilityTable::new();
        let cap = t.grant(grant(Access::RemoteWrite));
        let ok = t.check(cap.key, cap.base + 10, 990, Access::RemoteWrite).unwrap();
        assert_eq!(ok.offset, 4106);
        assert_eq!(t.check(cap.key, cap.base + 10, 991, Access::RemoteWrite).err(), Some(Rejection::OutOfWindow));
        assert_eq!(t.check(cap.key, cap.base, 1, Access::RemoteRead).err(), Some(Rejection::WrongDirection));
        // Not starting in the window: the key alone is not told apart from
        // a made-up one.
        for addr in [cap.base - 1, cap.base + 1000, u64::MAX, 0] {
            assert_eq!(t.check(cap.key, addr, 2, Access::RemoteWrite).err(), Some(Rejection::UnknownKey));
            assert_eq!(t.check(cap.key, addr, 0, Access::RemoteRead).err(), Some(Rejection::UnknownKey));
        }
        let forged = Key { rkey: cap.key.rkey ^ 1, dct: cap.key.dct };
        assert_eq!(t.check(forged, cap.base, 1, Access::RemoteWrite).err(), Some(Rejection::UnknownKey));
        assert_eq!(t.rejections.total(), 11);
    }

    /// Only an access naming the window (key and base) stops its requester
    /// waiting: probes with the key alone cannot break another's transfer.
    #[test]
    fn probes_without_the_base_break_no_window() {
        let t = CapabilityTable::new();
        let cap = t.grant(grant(Access::RemoteWrite));
        for addr in [0, cap.base - 4096, cap.base + 4096] {
            let _ = t.check(cap.key, addr, 1, Access::RemoteRead);
        }
        assert!(!cap.landing.is_broken());
        let _ = t.check(cap.key, cap.base, 1, Access::RemoteRead);
        assert!(cap.landing.is_broken(), "a wrong access to the window itself is reported");
    }

    #[test]
    fn dropping_revokes() {
        let t = CapabilityTable::new();
        let cap = t.grant(grant(Access::RemoteRead));
        let (key, base) = (cap.key, cap.base);
        assert_eq!(t.live(), 1);
        drop(cap);
        assert_eq!(t.live(), 0);
        assert_eq!(t.check(key, base, 1, Access::RemoteRead).err(), Some(Rejection::UnknownKey));
    }

    #[test]
    fn descriptors_expire() {
        let t = CapabilityTable::with_ttl(std::time::Duration::from_millis(30));
        let cap = t.grant(grant(Access::RemoteWrite));
        assert!(t.check(cap.key, cap.base, 1, Access::RemoteWrite).is_ok());
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(t.check(cap.key, cap.base, 1, Access::RemoteWrite).err(), Some(Rejection::Expired));
        assert_eq!(t.rejections.expired.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn keys_are_distinct() {
        let t = CapabilityTable::new();
        let caps: Vec<_> = (0..100).map(|_| t.grant(grant(Access::RemoteRead))).collect();
        let keys: std::collections::HashSet<_> = caps.iter().map(|c| c.key).collect();
        assert_eq!(keys.len(), 100);
    }
}
