//! Limits on client connections that the HTTP server itself does not hold:
//! how many are open at once, and how long one may sit with nothing moving.
//!
//! hyper's header deadline covers a request's head only. A client that sent
//! its head and then stops sending the body it announced, or stops reading
//! the response, would otherwise hold its connection, its task and (for a
//! PUT) a half-written temporary file for as long as it likes; enough of
//! them and nobody else gets served. [`Idle`] ends such a connection once
//! neither direction has moved for the configured time, and [`Admission`]
//! bounds the connections open at once so a flood waits in the kernel's
//! accept queue instead of in the gateway's memory.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tracing::warn;

/// A connection whose reads and writes both stop making progress for
/// `limit` fails with `TimedOut`, which ends it.
///
/// The clock only runs while the server waits on the connection: hyper
/// also polls the read side while a request is being served (to notice a
/// client that hung up), so the limit must be longer than any request may
/// take to serve without sending a byte (an RDMA transfer, see the
/// config's check against `transfer_timeout_ms`).
pub struct Idle<T> {
    inner: T,
    limit: Duration,
    /// When a read or write last moved bytes (or the connection opened).
    last_progress: Instant,
    /// Armed while an operation is pending; fires at `last_progress + limit`.
    timer: Pin<Box<Sleep>>,
}

impl<T> Idle<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        let now = Instant::now();
        Self { inner, limit, last_progress: now, timer: Box::pin(tokio::time::sleep_until(now + limit)) }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Called when an operation is pending: fails once nothing has moved for
    /// the whole limit, else makes sure this task wakes when it would.
    fn check_stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let due = self.last_progress + self.limit;
        if self.timer.deadline() != due {
            self.timer.as_mut().reset(due);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("nothing sent or received for {:?}", self.limit),
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Idle<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.check_stalled(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Idle<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.check_stalled(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    self.progressed();
                }
                Poll::Ready(r)
            }
            Poll::Pending => self.check_stalled(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.check_stalled(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending => self.check_stalled(cx).map(Err),
            ready => ready,
        }
    }
}

/// At most `max` client connections open at once; the accept loop takes a
/// place before it accepts, so the rest wait in the listen backlog.
pub struct Admission {
    places: Arc<Semaphore>,
    max: usize,
    /// When the last "full" warning was logged (one per minute at most).
    warned: Option<Instant>,
}

impl Admission {
    pub fn new(max: usize) -> Self {
        Self { places: Arc::new(Semaphore::new(max)), max, warned: None }
    }

    /// A place for the next connection, held until it closes.
    pub async fn place(&mut self) -> OwnedSemaphorePermit {
        if let Ok(p) = self.places.clone().try_acquire_owned() {
            return p;
        }
        if self.warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            self.warned = Some(Instant::now());
            warn!(max_connections = self.max, "client connections at max_connections; new ones wait to be accepted");
        }
        // The semaphore is never closed.
        match self.places.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => unreachable!("the admission semaphore is never closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test's panic is its failure report
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_a_busy_one_does_not() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut idle = Idle::new(a, Duration::from_secs(5));
        // Bytes every 3 s keep it open past the limit.
        let feeder = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                b.write_all(b"x").await.unwrap();
            }
            b // kept open, silent from here on
        });
        let mut got = [0u8; 1];
        for _ in 0..4 {
            idle.read_exact(&mut got).await.unwrap();
        }
        let _b = feeder.await.unwrap();
        let t0 = Instant::now();
        let e = idle.read(&mut got).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(5), "fails at the limit after the last byte");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_times_out() {
        let (a, _b) = tokio::io::duplex(16);
        let mut idle = Idle::new(a, Duration::from_secs(2));
        let e = idle.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn admission_holds_the_next_until_a_place_frees() {
        let mut adm = Admission::new(2);
        let p1 = adm.place().await;
        let _p2 = adm.place().await;
        assert!(tokio::time::timeout(Duration::from_millis(50), adm.place()).await.is_err(), "a third waits");
        drop(p1);
        let _p3 = tokio::time::timeout(Duration::from_secs(5), adm.place()).await.expect("a freed place is taken");
    }
}
