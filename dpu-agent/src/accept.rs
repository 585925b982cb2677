//! The accept loops' common step: the next connection of a listener's
//! stream, riding out failed accepts.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};

/// How long a failed accept (out of descriptors and the like) pauses the
/// loop: it would fail again at once, and spinning takes a core.
const PAUSE_AFTER_FAILED_ACCEPT: Duration = Duration::from_millis(50);

/// The next connection of `conns`; `None` once it ends or `until`
/// resolves first. A failed accept is logged (`what` names the listener)
/// and, after a short pause, the next is awaited.
pub async fn next_conn<C, S>(conns: &mut Pin<&mut S>, until: impl Future<Output = ()>, what: &str) -> Option<C>
where
    S: Stream<Item = std::io::Result<C>> + ?Sized,
{
    let mut until = std::pin::pin!(until);
    loop {
        let next = tokio::select! {
            c = conns.next() => c,
            () = &mut until => return None,
        };
        match next? {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "accepting {what} failed");
                tokio::time::sleep(PAUSE_AFTER_FAILED_ACCEPT).await;
            }
        }
    }
}
