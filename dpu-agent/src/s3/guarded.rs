//! The [`S3Client`] a namespace's requests go through, wrapped around the
//! one that sends them: it tells each endpoint's health what became of
//! every request (`endpoints`), holds requests to the first-byte deadline,
//! resumes a GET body that breaks or stalls on another endpoint, and
//! journals the multipart uploads the agent starts (`uploads`).
//!
//! Deadlines: a request without a body must start being answered within
//! `first_byte_timeout_ms`, and a GET body may not go that long without a
//! chunk. A PUT's deadline (the store must keep taking its body, then
//! answer) is the HTTP client's, which sees the body go out. Requests with
//! an RDMA token keep only the read timeout: their answer waits for the
//! one-sided transfer.
//!
//! A GET body that breaks (a reset, a gateway killed mid-body, a stall past
//! the deadline) is not fetched again from its start: the rest of its range
//! is asked for from another endpoint, pinned with `If-Match` to the ETag
//! of the first reply and checked to be of the same object, and streamed on
//! in the same body. The caller sees one body, bytes exact, or an error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::body::{BodySource, Landing};
use super::client::{Body, ListQuery, PartOf, PutBody, RangedGet, Reply, S3Client, S3Future, Target};
use super::endpoints::{classify, deadline_error, first_byte_deadline, Endpoint, EndpointSet, FailureKind};
use super::error::S3Error;
use super::model::ListPage;
use super::uploads::UploadLog;

/// Marks its key a suspect when dropped: a CreateMultipartUpload whose
/// caller went away before the answer came (`std::mem::forget` it once the
/// answer is in).
struct Unanswered<'a>(Option<(&'a UploadLog, &'a str)>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some((log, key)) = self.0 {
            log.suspect(key);
        }
    }
}

/// Wraps the client that sends a namespace's requests.
pub(super) struct Guarded {
    inner: Arc<dyn S3Client>,
    set: Arc<EndpointSet>,
    first_byte: Option<Duration>,
    /// How many times one GET body may be continued elsewhere.
    resumes: u32,
    /// Counts continuations (they are retries).
    retries: prometheus::IntCounter,
    uploads: Option<UploadLog>,
}

impl Guarded {
    pub fn new(
        inner: Arc<dyn S3Client>,
        set: Arc<EndpointSet>,
        first_byte: Option<Duration>,
        resumes: u32,
        retries: prometheus::IntCounter,
        uploads: Option<UploadLog>,
    ) -> Self {
        Self { inner, set, first_byte, resumes, retries, uploads }
    }

    /// Sends `fut` to `at.endpoint` (within the first-byte deadline when
    /// `timed`) and tells the endpoint's health how it went.
    async fn call<T>(
        &self,
        at: &Target<'_>,
        timed: bool,
        fut: impl Future<Output = Result<T, S3Error>>,
    ) -> Result<T, S3Error> {
        let ep = self.set.member(at.endpoint);
        let was_up = ep.is_some_and(|e| e.is_up());
        let limit = if timed { first_byte_deadline(self.first_byte, at.attempt) } else { None };
        let r = within(limit, at.endpoint, fut).await;
        if let Some(ep) = ep {
            record(&self.set, ep, was_up, &r);
        }
        r
    }
}

/// `fut`, failed as a missed deadline if it takes longer than `limit`.
async fn within<T>(
    limit: Option<Duration>,
    endpoint: &str,
    fut: impl Future<Output = Result<T, S3Error>>,
) -> Result<T, S3Error> {
    match limit {
        None => fut.await,
        Some(d) => tokio::time::timeout(d, fut).await.unwrap_or_else(|_| {
            Err(deadline_error(endpoint, "before the first byte of its answer; [failover] first_byte_timeout_ms", d))
        }),
    }
}

/// Tells `ep` (of `set`) what became of a request sent while it was
/// (`was_up`) or was not up.
fn record<T>(set: &EndpointSet, ep: &Endpoint, was_up: bool, r: &Result<T, S3Error>) {
    match r.as_ref().err().and_then(|e| classify(e).map(|k| (k, e))) {
        Some((kind, e)) => {
            set.failed(ep, kind, &e.to_string());
        }
        None => ep.answered(was_up),
    }
}

impl S3Client for Guarded {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move { self.call(&at, true, self.inner.head(at)).await })
    }

    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        Box::pin(async move {
            let rdma = req.rdma.is_some();
            let mut reply = self.call(&at, !rdma, self.inner.get(at, req.clone())).await?;
            let Some(ep) = self.set.member(at.endpoint).cloned() else { return Ok(reply) };
            if rdma {
                return Ok(reply);
            }
            let resume = Resume::of(self, &at, &req, &reply);
            let body = std::mem::replace(&mut reply.body, Body::empty());
            let set = self.set.clone();
            let idle = first_byte_deadline(self.first_byte, at.attempt);
            reply.body = watch(BodyWatch { body, idle, set, endpoint: ep, resume, done: false });
            Ok(reply)
        })
    }

    fn list<'a>(&'a self, at: Target<'a>, query: ListQuery<'a>) -> S3Future<'a, ListPage> {
        Box::pin(async move { self.call(&at, true, self.inner.list(at, query)).await })
    }

    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        Box::pin(async move { self.call(&at, true, self.inner.delete(at)).await })
    }

    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        // Untimed here: only the HTTP client sees whether the store keeps
        // taking the body.
        Box::pin(async move { self.call(&at, false, self.inner.put(at, part, headers, body)).await })
    }

    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        Box::pin(async move {
            // Dropped while the request is out (the caller cancelled, or its
            // deadline passed), the store may have created an upload no one
            // will know the id of: a suspect, as an unanswered one is.
            let unanswered = Unanswered(self.uploads.as_ref().map(|log| (log, at.key)));
            let created = self.call(&at, true, self.inner.create_upload(at, headers)).await;
            std::mem::forget(unanswered);
            // Sent, never answered (a hung gateway): it may still create the
            // upload when it wakes, an upload no one knows the id of.
            if let (Err(e), Some(log)) = (&created, &self.uploads) {
                if matches!(classify(e), Some(FailureKind::Deadline | FailureKind::Broken)) {
                    log.suspect(at.key);
                }
            }
            let id = created?;
            // Journaled before the caller has the id, so before any part is
            // sent: an agent killed from here on leaves an upload its next
            // start aborts.
            if let Some(log) = &self.uploads {
                log.started(at.key, &id).await;
            }
            Ok(id)
        })
    }

    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        Box::pin(async move {
            let etag = self.call(&at, true, self.inner.complete_upload(at, upload_id, etags)).await?;
            if let Some(log) = &self.uploads {
                log.ended(upload_id);
            }
            Ok(etag)
        })
    }

    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        let fut = self.inner.abort_upload(at, upload_id);
        let ep = self.set.member(at.endpoint).cloned();
        let was_up = ep.as_ref().is_some_and(|e| e.is_up());
        let (limit, endpoint, id, log, set) =
            (self.first_byte, at.endpoint.to_owned(), upload_id.to_owned(), self.uploads.clone(), self.set.clone());
        Box::pin(async move {
            let r = within(limit, &endpoint, fut).await;
            if let Some(ep) = ep {
                record(&set, &ep, was_up, &r);
            }
            match (&r, log) {
                (Ok(()), Some(log)) => log.ended(&id),
                // Aborted later by the sweeper (`uploads::sweep`).
                (Err(_), Some(log)) => log.abandoned(&id),
                _ => {}
            }
            r
        })
    }

    fn list_uploads<'a>(&'a self, at: Target<'a>, prefix: &'a str) -> S3Future<'a, Vec<super::uploads::Listed>> {
        Box::pin(async move { self.call(&at, true, self.inner.list_uploads(at, prefix)).await })
    }

    fn count_parts<'a>(&'a self, at: Target<'a>, upload_id: &'a str) -> S3Future<'a, usize> {
        Box::pin(async move { self.call(&at, true, self.inner.count_parts(at, upload_id)).await })
    }

    fn get_lifecycle<'a>(&'a self, at: Target<'a>) -> S3Future<'a, Option<String>> {
        Box::pin(async move { self.call(&at, true, self.inner.get_lifecycle(at)).await })
    }

    fn put_lifecycle<'a>(&'a self, at: Target<'a>, xml: String) -> S3Future<'a, ()> {
        Box::pin(async move { self.call(&at, true, self.inner.put_lifecycle(at, xml)).await })
    }
}

/// A GET body being streamed, watched for stalls and breaks.
struct BodyWatch {
    body: Body,
    /// The longest wait for the next chunk.
    idle: Option<Duration>,
    set: Arc<EndpointSet>,
    /// Where the bytes come from now.
    endpoint: Arc<Endpoint>,
    /// How to continue elsewhere; `None`: the reply cannot be continued
    /// (no ETag to pin the rest to, no `Content-Range`).
    resume: Option<Resume>,
    done: bool,
}

/// What continuing a GET body needs.
struct Resume {
    inner: Arc<dyn S3Client>,
    set: Arc<EndpointSet>,
    key: String,
    request_id: String,
    etag: String,
    /// The next byte the body owes, the last it owes, the object's size.
    next: u64,
    last: u64,
    total: u64,
    left: u32,
    /// Resumes tried so far (each a retry: see [`first_byte_deadline`]).
    tried: u32,
    first_byte: Option<Duration>,
    retries: prometheus::IntCounter,
}

impl Resume {
    /// How `reply` to `req` could be continued, if it can.
    fn of(g: &Guarded, at: &Target<'_>, req: &RangedGet<'_>, reply: &Reply) -> Option<Self> {
        let etag = reply.header("etag");
        let (a, b, total) = content_range(reply.header("content-range"))?;
        if reply.status != http::StatusCode::PARTIAL_CONTENT || etag.is_empty() || a != req.first || g.resumes == 0 {
            return None;
        }
        Some(Self {
            inner: g.inner.clone(),
            set: g.set.clone(),
            key: at.key.to_owned(),
            request_id: at.request_id.to_owned(),
            etag: etag.to_owned(),
            next: a,
            last: b,
            total,
            left: g.resumes,
            tried: at.attempt,
            first_byte: g.first_byte,
            retries: g.retries.clone(),
        })
    }

    /// Asks another endpoint than `failed` for the rest of the range, of
    /// the same object version; the new body and where it comes from.
    async fn continue_after(&mut self, failed: Arc<Endpoint>) -> Result<(Body, Arc<Endpoint>), S3Error> {
        let mut failed = failed;
        loop {
            self.left -= 1;
            self.retries.inc();
            let ep = self.set.pick_other(failed.url(), self.left as usize).clone();
            tracing::warn!(from = %failed.url(), to = %ep.url(), at_byte = self.next, last = self.last,
                "GET body broke; resuming it from the byte reached on another endpoint");
            let was_up = ep.is_up();
            let req = RangedGet { first: self.next, last: self.last, if_match: Some(&self.etag), ..Default::default() };
            self.tried += 1;
            let at = Target { endpoint: ep.url(), key: &self.key, request_id: &self.request_id, attempt: self.tried };
            let limit = first_byte_deadline(self.first_byte, self.tried);
            let r = within(limit, ep.url(), self.inner.get(at, req)).await.and_then(|r| self.check(r));
            record(&self.set, &ep, was_up, &r);
            match r {
                Ok(reply) => return Ok((reply.body, ep)),
                Err(e) if e.is_retryable() && self.left > 0 => failed = ep,
                Err(e) => return Err(e),
            }
        }
    }

    /// The continuation must be the rest of the same object: the same
    /// ETag (a store may ignore `If-Match`) and size, from the byte asked.
    fn check(&self, reply: Reply) -> Result<Reply, S3Error> {
        let etag = reply.header("etag");
        let range = content_range(reply.header("content-range"));
        if !etag.is_empty() && etag != self.etag || range.is_some_and(|(_, _, t)| t != self.total) {
            return Err(S3Error::PreconditionFailed(format!(
                "the object changed while it was read (ETag {} at the start, {etag} when resuming at byte {}); \
                 nothing was returned",
                self.etag, self.next
            )));
        }
        match range {
            Some((a, b, _))
                if reply.status == http::StatusCode::PARTIAL_CONTENT && a == self.next && b == self.last =>
            {
                Ok(reply)
            }
            _ => Err(S3Error::Protocol(format!(
                "asked for bytes {}-{} to resume a GET, got {} {:?}",
                self.next,
                self.last,
                reply.status,
                reply.header("content-range")
            ))),
        }
    }
}

/// `Content-Range: bytes a-b/total`.
fn content_range(v: &str) -> Option<(u64, u64, u64)> {
    let (span, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, total.parse().ok()?))
}

/// The body of `w`, stall-limited, continued elsewhere when it breaks.
fn watch(w: BodyWatch) -> Body {
    Body::from_source(w)
}

impl BodyWatch {
    /// The body ended: fine when it owed nothing more, a break otherwise (a
    /// gateway killed mid-body can look like this).
    fn ended(&self) -> Option<S3Error> {
        match &self.resume {
            Some(r) if r.next <= r.last => Some(S3Error::TransferFailed {
                message: format!("the body from {} ended at byte {} of {}", self.endpoint.url(), r.next, r.last),
                attempts: 1,
            }),
            _ => None,
        }
    }

    fn stalled(&self, d: Duration) -> S3Error {
        deadline_error(self.endpoint.url(), "between two chunks of a body; [failover] first_byte_timeout_ms", d)
    }

    /// After `err` broke the body: the endpoint is marked, and the body
    /// continues from another one when it can; otherwise the error stands.
    async fn recover(&mut self, err: S3Error) -> Result<(), S3Error> {
        if let Some(kind) = classify(&err) {
            self.set.failed(&self.endpoint, kind, &err.to_string());
        }
        let resumable = err.is_retryable() && self.resume.as_ref().is_some_and(|r| r.left > 0);
        let next = match self.resume.as_mut() {
            Some(r) if resumable => r.continue_after(self.endpoint.clone()).await,
            _ => Err(err),
        };
        match next {
            Ok((body, ep)) => {
                self.body = body;
                self.endpoint = ep;
                Ok(())
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    fn advance(&mut self, n: u64) {
        if let Some(r) = &mut self.resume {
            r.next += n;
        }
    }
}

impl BodySource for BodyWatch {
    fn next_chunk(&mut self) -> BoxFuture<'_, Option<Result<Bytes, S3Error>>> {
        Box::pin(async move {
            if self.done {
                return None;
            }
            loop {
                let item = match self.idle {
                    Some(d) => {
                        tokio::time::timeout(d, self.body.next()).await.unwrap_or_else(|_| Some(Err(self.stalled(d))))
                    }
                    None => self.body.next().await,
                };
                let err = match item {
                    Some(Ok(chunk)) => {
                        self.advance(chunk.len() as u64);
                        return Some(Ok(chunk));
                    }
                    None => self.ended()?,
                    Some(Err(e)) => e,
                };
                if let Err(e) = self.recover(err).await {
                    return Some(Err(e));
                }
            }
        })
    }

    fn read_into<'a>(&'a mut self, to: Landing<'a>) -> BoxFuture<'a, Result<u64, S3Error>> {
        Box::pin(async move {
            if self.done {
                return Ok(0);
            }
            let Landing { region, dst, max, digest } = to;
            loop {
                let landing = Landing { region, dst, max, digest: &mut *digest };
                let got = match self.idle {
                    Some(d) => tokio::time::timeout(d, self.body.read_into(landing))
                        .await
                        .unwrap_or_else(|_| Err(self.stalled(d))),
                    None => self.body.read_into(landing).await,
                };
                let err = match got {
                    Ok(0) => match self.ended() {
                        Some(e) => e,
                        None => return Ok(0),
                    },
                    Ok(n) => {
                        self.advance(n);
                        return Ok(n);
                    }
                    Err(e) => e,
                };
                self.recover(err).await?;
            }
        })
    }
}

#[cfg(test)]
#[path = "guarded_tests.rs"]
mod tests;
