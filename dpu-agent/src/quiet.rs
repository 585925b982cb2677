//! [`Quiet`]: a stream of concurrent work polled without waking its task
//! for nothing.
//!
//! `FuturesUnordered` (and so `buffer_unordered`) wakes its own task every
//! time it has polled each of its futures once and all were pending — a
//! yield, so that one set cannot starve other tasks. On a multi-threaded
//! tokio runtime a task that wakes itself during its poll is put back on a
//! run queue and another worker is woken to take it: a futex wake and two
//! context switches. With one GET running (one at a time), that was every
//! poll of the first GetStream, which polled its GETs in one such set: 3.9
//! `futex` calls and 6.5 context switches per GET in the agent against none
//! and 3.8 for a unary `Get` (docs/performance.md). `GetMany` batches and
//! the parts of one GET still poll their work this way.
//!
//! `Quiet` gives the inner stream a waker of its own. A wake that comes
//! while the inner stream is being polled (its own yield, or a future made
//! ready meanwhile) makes `Quiet` poll it again at once instead; a wake
//! after the poll wakes the task as usual. After [`MAX_REPOLLS`] polls in a
//! row that each asked for another, it yields for real, so a stream whose
//! futures keep waking themselves (tokio's cooperative budget spent) still
//! lets other tasks run.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::Stream;
use futures::task::{waker_ref, ArcWake, AtomicWaker};

/// Polls in a row, each woken during the last, before a real yield.
pub const MAX_REPOLLS: usize = 4;

/// The waker the inner stream sees.
#[derive(Default)]
struct Relay {
    /// The task's own waker, for wakes after a poll.
    task: AtomicWaker,
    /// The inner stream is being polled now.
    polling: AtomicBool,
    /// It was woken while being polled.
    woken: AtomicBool,
}

impl ArcWake for Relay {
    fn wake_by_ref(arc: &Arc<Self>) {
        // SeqCst on both sides: either the poller sees `woken` after it
        // clears `polling`, or this wake sees `polling` cleared and wakes
        // the task.
        if arc.polling.load(SeqCst) {
            arc.woken.store(true, SeqCst);
            if arc.polling.load(SeqCst) {
                return;
            }
        }
        arc.task.wake();
    }
}

/// `inner`, polled as described in the module docs.
pub struct Quiet<S> {
    inner: S,
    relay: Arc<Relay>,
}

impl<S> Quiet<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, relay: Arc::new(Relay::default()) }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S: Stream + Unpin> Stream for Quiet<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        this.relay.task.register(cx.waker());
        let waker = waker_ref(&this.relay);
        let mut inner_cx = Context::from_waker(&waker);
        for _ in 0..MAX_REPOLLS {
            this.relay.woken.store(false, SeqCst);
            this.relay.polling.store(true, SeqCst);
            let polled = Pin::new(&mut this.inner).poll_next(&mut inner_cx);
            this.relay.polling.store(false, SeqCst);
            match polled {
                Poll::Ready(item) => return Poll::Ready(item),
                Poll::Pending if this.relay.woken.swap(false, SeqCst) => continue,
                Poll::Pending => return Poll::Pending,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream::{FuturesUnordered, StreamExt};
    use std::sync::atomic::AtomicUsize;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl ArcWake for Count {
        fn wake_by_ref(arc: &Arc<Self>) {
            arc.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_set_that_yields_after_polling_its_futures_does_not_wake_its_task() {
        let (tx, rx) = futures::channel::oneshot::channel::<u32>();
        let set = FuturesUnordered::new();
        set.push(rx);
        let count = Arc::new(Count::default());
        let waker = waker_ref(&count);
        let mut cx = Context::from_waker(&waker);
        // Bare, the set wakes its task after polling its one future.
        let mut bare = FuturesUnordered::new();
        let (_tx2, rx2) = futures::channel::oneshot::channel::<u32>();
        bare.push(rx2);
        assert!(bare.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(count.0.load(SeqCst), 1, "FuturesUnordered yields by waking its task");
        // Quiet: no wake until the future is ready; then one, and the item.
        let mut quiet = Quiet::new(set);
        assert!(quiet.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(count.0.load(SeqCst), 1, "no wake for the set's own yield");
        tx.send(7).unwrap();
        assert_eq!(count.0.load(SeqCst), 2, "a wake after the poll reaches the task");
        assert_eq!(quiet.poll_next_unpin(&mut cx), Poll::Ready(Some(Ok(7))));
        assert_eq!(quiet.poll_next_unpin(&mut cx), Poll::Ready(None));
    }

    /// A stream that wakes itself on every poll and never finishes.
    struct Restless(usize);
    impl Stream for Restless {
        type Item = ();
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<()>> {
            self.0 += 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_stream_that_keeps_waking_itself_still_yields() {
        let count = Arc::new(Count::default());
        let waker = waker_ref(&count);
        let mut cx = Context::from_waker(&waker);
        let mut quiet = Quiet::new(Restless(0));
        assert!(quiet.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(quiet.get_ref().0, MAX_REPOLLS, "polled again at most MAX_REPOLLS times");
        assert_eq!(count.0.load(SeqCst), 1, "then a real yield");
    }
}
