//! Connections (or address handles) to memory owners, kept for reuse,
//! made outside any lock and bounded in number.
//!
//! The peer a transfer goes to is named by the client's token. Connecting
//! under one lock over the whole cache let a token naming an owner that
//! never answers (rdma_cm waits seconds) stall every other tenant's
//! transfers behind it, and a cache that only grew let tokens naming ever
//! new peers take a queue pair or address handle each, without end.
//! Here each peer has its own slot: transfers to the same peer wait for
//! one connect, others go on; at most `max` peers are kept, the least
//! recently used idle one making room for a new one; and a peer nobody
//! used for `idle_max` is let go (with the registered buffers it holds).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

struct Slot<V> {
    cell: Arc<OnceCell<Arc<V>>>,
    last_used: Instant,
}

impl<V> Slot<V> {
    /// Nobody uses it now: connected and held by the cache alone, or a
    /// connect nobody waits for any more.
    fn idle(&self) -> bool {
        match self.cell.get() {
            Some(v) => Arc::strong_count(v) == 1,
            None => Arc::strong_count(&self.cell) == 1,
        }
    }
}

/// Peers by key, each connected once and shared.
pub(crate) struct PeerCache<K, V> {
    slots: Mutex<HashMap<K, Slot<V>>>,
    max: usize,
    idle_max: Duration,
    /// When idle peers were last let go.
    swept: Mutex<Instant>,
}

/// Why no connection came: the cache is full of peers in use, or the
/// connect failed.
#[derive(Debug)]
pub(crate) enum CacheError<E> {
    Full(usize),
    Connect(E),
}

impl<K: Hash + Eq + Clone, V> PeerCache<K, V> {
    pub fn new(max: usize, idle_max: Duration) -> Self {
        Self { slots: Mutex::default(), max: max.max(1), idle_max, swept: Mutex::new(Instant::now()) }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<K, Slot<V>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peer's connection, made with `connect` if there is none; callers
    /// for the same peer share one attempt, others are not held up by it.
    pub async fn get_or_connect<F, Fut, E>(&self, key: &K, connect: F) -> Result<Arc<V>, CacheError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let cell = {
            let mut slots = self.slots();
            let now = Instant::now();
            self.sweep(&mut slots, now);
            if let Some(slot) = slots.get_mut(key) {
                slot.last_used = now;
                slot.cell.clone()
            } else {
                if slots.len() >= self.max && !Self::evict_one(&mut slots) {
                    return Err(CacheError::Full(self.max));
                }
                let cell = Arc::new(OnceCell::new());
                slots.insert(key.clone(), Slot { cell: cell.clone(), last_used: now });
                cell
            }
        };
        match cell.get_or_try_init(|| async { connect().await.map(Arc::new) }).await {
            Ok(v) => Ok(v.clone()),
            Err(e) => {
                // A failed attempt leaves no slot behind (the next caller
                // tries afresh), unless another caller's attempt succeeded.
                let mut slots = self.slots();
                if slots.get(key).is_some_and(|s| Arc::ptr_eq(&s.cell, &cell) && s.cell.get().is_none()) {
                    slots.remove(key);
                }
                Err(CacheError::Connect(e))
            }
        }
    }

    /// Lets go of peers idle for `idle_max` (looked for every tenth of it).
    fn sweep(&self, slots: &mut HashMap<K, Slot<V>>, now: Instant) {
        let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(*swept) < self.idle_max / 10 {
            return;
        }
        *swept = now;
        slots.retain(|_, s| !s.idle() || now.saturating_duration_since(s.last_used) < self.idle_max);
    }

    /// Drops the least recently used idle peer; false when all are in use.
    fn evict_one(slots: &mut HashMap<K, Slot<V>>) -> bool {
        let oldest = slots.iter().filter(|(_, s)| s.idle()).min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone());
        match oldest {
            Some(k) => slots.remove(&k).is_some(),
            None => false,
        }
    }

    /// Forgets a peer (its connection broke); in-flight users keep theirs.
    pub fn remove(&self, key: &K) {
        self.slots().remove(key);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slow_peer_holds_up_only_its_own_callers() {
        let cache: Arc<PeerCache<u32, u32>> = Arc::new(PeerCache::new(8, Duration::from_secs(60)));
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let slow = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or_connect(&1, || async {
                        let _ = wait.await;
                        Err::<u32, &str>("no answer")
                    })
                    .await
                    .map(|v| *v)
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let other =
            tokio::time::timeout(Duration::from_secs(5), cache.get_or_connect(&2, || async { Ok::<u32, &str>(20) }))
                .await
                .expect("another peer is not held up by the slow connect");
        assert_eq!(*other.expect("connected"), 20);
        drop(release);
        assert!(matches!(slow.await.ok(), Some(Err(CacheError::Connect("no answer")))));
        assert_eq!(cache.len(), 1, "the failed attempt left no slot");
    }

    #[tokio::test]
    async fn callers_for_one_peer_share_one_connect() {
        let cache: PeerCache<u32, u32> = PeerCache::new(8, Duration::from_secs(60));
        let connects = std::sync::atomic::AtomicU32::new(0);
        let connect = || async {
            connects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<u32, ()>(7)
        };
        let (a, b) = tokio::join!(cache.get_or_connect(&1, connect), cache.get_or_connect(&1, connect));
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(connects.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn peers_are_bounded_and_idle_ones_make_room() {
        let cache: PeerCache<u32, u32> = PeerCache::new(2, Duration::from_secs(60));
        let ok = |v| move || async move { Ok::<u32, ()>(v) };
        let held = cache.get_or_connect(&1, ok(1)).await.expect("1");
        drop(cache.get_or_connect(&2, ok(2)).await.expect("2"));
        // 2 is idle: it makes room for 3.
        let held3 = cache.get_or_connect(&3, ok(3)).await.expect("3");
        assert_eq!(cache.len(), 2);
        // 1 and 3 in use: a fourth peer is refused, nothing is dropped.
        assert!(matches!(cache.get_or_connect(&4, ok(4)).await, Err(CacheError::Full(2))));
        assert_eq!(cache.len(), 2);
        drop((held, held3));
        assert_eq!(*cache.get_or_connect(&4, ok(4)).await.expect("room again"), 4);
    }

    #[tokio::test]
    async fn peers_nobody_used_for_a_while_are_let_go() {
        let cache: PeerCache<u32, u32> = PeerCache::new(8, Duration::from_millis(100));
        let ok = |v| move || async move { Ok::<u32, ()>(v) };
        let held = cache.get_or_connect(&1, ok(1)).await.expect("1");
        drop(cache.get_or_connect(&2, ok(2)).await.expect("2"));
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(cache.get_or_connect(&3, ok(3)).await.expect("3"));
        let mut kept: Vec<u32> = cache.slots().keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [1, 3], "2 went idle and was let go; 1 is in use");
        drop(held);
    }
}
