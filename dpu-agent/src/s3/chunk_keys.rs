//! Openers and sealers are made, and their chunk keys dropped, off the
//! async threads.
//!
//! Why: making one looks the tenant's master key up (with a key directory,
//! a file read) and makes the chunk key, and with the DOCA engine making
//! and dropping a chunk key take the engine's lock, which blocking threads
//! hold for a whole chunk (up to 16 MiB through the engine). On a runtime
//! thread either would hold up every tenant's requests behind one tenant's
//! encrypted transfers.

use std::ops::Deref;

use super::error::S3Error;

/// Runs `f` on a blocking thread.
pub(super) async fn off_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Result<R, S3Error> {
    tokio::task::spawn_blocking(f).await.map_err(|e| S3Error::Encryption(format!("crypto task failed: {e}")))
}

/// An opener or sealer whose key is dropped on a blocking thread (when
/// dropped inside a runtime; in place otherwise).
pub(super) struct Keyed<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Keyed<T> {
    pub(super) fn new(inner: T) -> Self {
        Self(Some(inner))
    }
}

impl<T: Send + 'static> Deref for Keyed<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // `Some` from `new` until `drop` takes it.
        self.0.as_ref().unwrap_or_else(|| unreachable!("a Keyed is only emptied when dropped"))
    }
}

impl<T: Send + 'static> Drop for Keyed<T> {
    fn drop(&mut self) {
        let Some(inner) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || drop(inner))),
            Err(_) => drop(inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the thread it is dropped on.
    struct Marks(std::sync::mpsc::Sender<String>);

    impl Drop for Marks {
        fn drop(&mut self) {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            let _ = self.0.send(name);
        }
    }

    #[tokio::test]
    async fn a_key_is_dropped_off_the_async_threads() {
        let (tx, rx) = std::sync::mpsc::channel();
        let runtime_thread = std::thread::current().name().unwrap_or("").to_owned();
        let made = off_thread(move || Keyed::new(Marks(tx))).await.unwrap();
        assert!(made.0.is_some());
        drop(made);
        let on = tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap())
            .await
            .unwrap();
        assert_ne!(on, runtime_thread, "dropped on the runtime's own thread");
    }
}
