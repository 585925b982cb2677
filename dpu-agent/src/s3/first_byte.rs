//! The first-byte deadline of the HTTP client: a request fails once the
//! store has gone `[failover] first_byte_timeout_ms` without progress —
//! without taking the next chunk of the request's body, or, with the body
//! all taken, without answering. A hung gateway (it accepts connections,
//! its kernel buffers a few MiB of the body, nothing answers) then costs a
//! request that deadline, not the read timeout; a large PUT to a live
//! store makes progress all along and is never cut short.
//!
//! Progress is seen from the body's side: hyper asks for the next chunk
//! once it has written the previous one to the socket, which it can only
//! do while the store reads.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;

use super::endpoints::deadline_error;
use super::error::S3Error;

/// When a request last made progress.
#[derive(Clone)]
struct Progress {
    start: Instant,
    /// Milliseconds after `start`.
    last_ms: Arc<AtomicU64>,
}

impl Progress {
    fn new() -> Self {
        Self { start: Instant::now(), last_ms: Arc::default() }
    }

    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A body whose every chunk taken (and its end) counts as progress.
struct Watched<S> {
    inner: S,
    progress: Progress,
}

impl<S: Stream + Unpin> Stream for Watched<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if polled.is_ready() {
            self.progress.touch();
        }
        polled
    }
}

/// Request bodies are handed to hyper in chunks of at most this (a body
/// held in memory too), so that progress is seen as it goes out. What the
/// socket buffers hold (a few MiB) is not seen: a store that reads a body
/// slower than that much per deadline is cut short.
const CHUNK: usize = 256 << 10;

/// Sends `req` on `http`; with `limit`, fails it (retryably) once it has
/// gone that long without progress.
pub(super) async fn execute(
    http: &reqwest::Client,
    mut req: reqwest::Request,
    limit: Option<Duration>,
    endpoint: &str,
) -> Result<reqwest::Response, S3Error> {
    let Some(limit) = limit else {
        return http.execute(req).await.map_err(S3Error::from_reqwest);
    };
    let progress = Progress::new();
    if let Some(body) = req.body_mut().take() {
        *req.body_mut() = Some(watched(body, progress.clone()));
    }
    let mut sent = std::pin::pin!(http.execute(req));
    loop {
        let seen = progress.last();
        match tokio::time::timeout_at((seen + limit).into(), &mut sent).await {
            Ok(r) => return r.map_err(S3Error::from_reqwest),
            Err(_) if progress.last() > seen => continue,
            Err(_) => {
                return Err(deadline_error(
                    endpoint,
                    "neither taking the request's body nor answering; [failover] first_byte_timeout_ms",
                    limit,
                ))
            }
        }
    }
}

/// `body`, in chunks of at most [`CHUNK`], each taken counted as progress.
fn watched(body: reqwest::Body, progress: Progress) -> reqwest::Body {
    use futures::StreamExt;
    let chunks = match body.as_bytes() {
        // In memory: cut into chunks (one large chunk would show no
        // progress until all of it was written).
        Some(bytes) => {
            let bytes = bytes::Bytes::copy_from_slice(bytes);
            let pieces: Vec<Result<bytes::Bytes, reqwest::Error>> =
                (0..bytes.len()).step_by(CHUNK).map(|i| Ok(bytes.slice(i..(i + CHUNK).min(bytes.len())))).collect();
            futures::stream::iter(pieces).boxed()
        }
        None => http_body_util::BodyDataStream::new(body)
            .flat_map(|chunk| {
                let pieces: Vec<Result<bytes::Bytes, reqwest::Error>> = match chunk {
                    Ok(b) => (0..b.len()).step_by(CHUNK).map(|i| Ok(b.slice(i..(i + CHUNK).min(b.len())))).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(pieces)
            })
            .boxed(),
    };
    reqwest::Body::wrap_stream(Watched { inner: chunks, progress })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limit() -> Duration {
        Duration::from_millis(300)
    }

    fn put(endpoint: &str, len: usize) -> reqwest::Request {
        let body = reqwest::Body::from(vec![7u8; len]);
        reqwest::Client::new().put(format!("{endpoint}/b/k")).header("content-length", len).body(body).build().unwrap()
    }

    /// A server that accepts and never answers: the request fails at the
    /// deadline, not the read timeout.
    #[tokio::test]
    async fn a_server_that_never_answers_costs_the_deadline() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = format!("http://{}", l.local_addr().unwrap());
        let hold = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let http = reqwest::Client::builder().read_timeout(Duration::from_secs(30)).build().unwrap();
        let t0 = Instant::now();
        let req = http.get(format!("{ep}/b/k")).build().unwrap();
        let e = execute(&http, req, Some(limit()), &ep).await.unwrap_err();
        let took = t0.elapsed();
        assert!(took >= limit() && took < limit() * 3, "{took:?}");
        assert!(e.is_retryable() && e.to_string().contains("made no progress within 300 ms"), "{e}");
        hold.abort();
    }

    /// A body the server takes slowly but steadily is never cut short,
    /// however long it takes in all; one it stops taking fails at the
    /// deadline.
    #[tokio::test]
    async fn a_body_taken_steadily_lives_one_not_taken_fails() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = format!("http://{}", l.local_addr().unwrap());
        let len = 32usize << 20;
        let server = tokio::spawn(async move {
            // First connection: read slowly (longer than the deadline in
            // all), then answer.
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0usize;
            while got < len {
                got += s.read(&mut buf).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.unwrap();
            // Second: read nothing at all.
            let (s2, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop((s, s2));
        });
        let http = reqwest::Client::new();
        let t0 = Instant::now();
        let r = execute(&http, put(&ep, len), Some(limit()), &ep).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            t0.elapsed() > limit(),
            "the upload outlasted the deadline ({:?}) and still went through",
            t0.elapsed()
        );
        let t0 = Instant::now();
        let e = execute(&http, put(&ep, len), Some(limit()), &ep).await.unwrap_err();
        assert!(t0.elapsed() < limit() * 4, "{:?}", t0.elapsed());
        assert!(e.to_string().contains("neither taking"), "{e}");
        server.abort();
    }
}
