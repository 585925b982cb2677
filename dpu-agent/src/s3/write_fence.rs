//! Writes into a caller's region from blocking threads, stopped when the
//! request that started them ends.
//!
//! Why: a blocking task goes on after the future that awaited it is
//! dropped (its deadline passed, it was cancelled, its stream went away).
//! A decrypt that went on writing would put bytes into memory that the
//! caller was already told this request no longer writes, over whatever
//! it read into that memory since. Once the [`Fenced`] guard the request
//! holds is dropped, no write starts, and a write under way has ended —
//! the way a one-sided transport's window is revoked
//! (`sluice_dataplane::Landing::revoke`).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Whether writes may still start, and how many are under way.
#[derive(Debug, Default)]
pub(super) struct WriteFence {
    closed: AtomicBool,
    writing: AtomicU32,
}

/// A write under way; ends when dropped.
pub(super) struct Writing<'a>(&'a WriteFence);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.writing.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WriteFence {
    /// A fence and the guard that closes it when dropped (the request's).
    pub(super) fn new() -> (Arc<Self>, Fenced) {
        let fence = Arc::new(Self::default());
        (fence.clone(), Fenced(fence))
    }

    /// Before each write: `None` once the fence is closed (write nothing).
    /// Hold the guard for the write, and no longer: closing waits for it.
    /// The writer marks itself and then looks at `closed`, the closer the
    /// other way round (both sequentially consistent), so one of them
    /// always sees the other.
    pub(super) fn enter(&self) -> Option<Writing<'_>> {
        self.writing.fetch_add(1, Ordering::SeqCst);
        let guard = Writing(self);
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Lets no write start, and returns once the one under way (one
    /// chunk's plaintext: at most a few MiB of copy) has ended.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        sluice_dataplane::landing::wait_until_zero(&self.writing);
    }
}

/// Held by the request: dropped (the request ended, however it ended), the
/// fence closes.
pub(super) struct Fenced(Arc<WriteFence>);

impl Drop for Fenced {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn closing_waits_for_the_write_under_way_and_stops_the_next() {
        let (fence, fenced) = WriteFence::new();
        let writing = fence.enter().expect("open");
        let closer = std::thread::spawn(move || drop(fenced));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!closer.is_finished(), "closing waits for the write under way");
        drop(writing);
        closer.join().unwrap();
        assert!(fence.enter().is_none(), "no write starts once closed");
        assert_eq!(fence.writing.load(Ordering::SeqCst), 0);
    }
}
