//! A countdown failure wrapper around any [`S3Client`]: rules say which
//! request of a kind fails, how, and how many times, so a test can break
//! exactly the third part GET or the second UploadPart and watch what the
//! transfer logic does about it.

use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;

use super::client::{Body, ListQuery, PartOf, PutBody, RangedGet, Reply, S3Client, S3Future, Target};
use super::error::S3Error;
use super::mock::Op;
use super::model::ListPage;

/// What an armed rule does to the request it hits.
#[derive(Clone)]
pub enum Failure {
    /// Fails it with this error before it reaches the store.
    Error(fn() -> S3Error),
    /// Lets it through; its body breaks after this many bytes.
    BreakBody(u64),
    /// Runs this first (e.g. replaces the object), then lets it through.
    Before(Arc<dyn Fn() + Send + Sync>),
    /// Never answers (the caller's deadline or cancellation must end it).
    Hang,
    /// Lets it through with byte `n` of its body inverted (a GET's reply
    /// body, or a PUT's body on its way): damage nobody reports.
    Flip(u64),
}

struct Rule {
    op: Op,
    /// Matching requests to let through before the rule fires.
    skip: u32,
    /// How many matching requests it then hits.
    times: u32,
    failure: Failure,
}

/// Wraps `inner`, failing the requests its rules pick.
pub struct Failing {
    inner: Arc<dyn S3Client>,
    rules: Mutex<Vec<Rule>>,
    /// Every request seen, with the endpoint it went to (failed ones too).
    seen: Mutex<Vec<(Op, String)>>,
}

/// A 503 SlowDown, as a throttling store answers.
pub fn slow_down() -> S3Error {
    S3Error::from_response(503, "<Error><Code>SlowDown</Code><Message>reduce your rate</Message></Error>", None)
}

/// A connection the store never accepted.
pub fn refused() -> S3Error {
    S3Error::Connection { message: "connection refused".into(), attempts: 1 }
}

impl Failing {
    pub fn new(inner: Arc<dyn S3Client>) -> Self {
        Self { inner, rules: Mutex::new(Vec::new()), seen: Mutex::new(Vec::new()) }
    }

    /// After `skip` requests of kind `op` went through, the next `times`
    /// get `failure`.
    pub fn fail(self, op: Op, skip: u32, times: u32, failure: Failure) -> Self {
        self.lock_rules().push(Rule { op, skip, times, failure });
        self
    }

    /// The endpoints requests of kind `op` went to, in order.
    pub fn endpoints(&self, op: Op) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, e)| e.clone())
            .collect()
    }

    fn lock_rules(&self) -> MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request of kind `op` down every rule for it; the failure of
    /// the first rule that fires.
    fn arm(&self, op: Op, at: &Target<'_>) -> Option<Failure> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).push((op, at.endpoint.to_owned()));
        let mut fired = None;
        for r in self.lock_rules().iter_mut().filter(|r| r.op == op) {
            if r.skip > 0 {
                r.skip -= 1;
            } else if r.times > 0 && fired.is_none() {
                r.times -= 1;
                fired = Some(r.failure.clone());
            }
        }
        fired
    }

    /// Applies a fired failure that ends the request before the store.
    async fn before(f: &Option<Failure>) -> Result<(), S3Error> {
        match f {
            Some(Failure::Error(e)) => Err(e()),
            Some(Failure::Before(run)) => {
                run();
                Ok(())
            }
            Some(Failure::Hang) => futures::future::pending().await,
            Some(Failure::BreakBody(_) | Failure::Flip(_)) | None => Ok(()),
        }
    }
}

/// `body`, broken after `after` bytes.
fn broken(body: Body, after: u64) -> Body {
    let mut left = after;
    let chunks = body.into_stream().scan(false, move |ended, chunk| {
        if *ended {
            return futures::future::ready(None);
        }
        let item = match chunk {
            Ok(c) if (c.len() as u64) <= left => {
                left -= c.len() as u64;
                Ok(c)
            }
            Ok(c) if left > 0 => {
                let part = c.slice(..left as usize);
                left = 0;
                Ok(part)
            }
            Ok(_) => {
                *ended = true;
                Err(S3Error::TransferFailed { message: "connection reset (injected)".into(), attempts: 1 })
            }
            Err(e) => Err(e),
        };
        futures::future::ready(Some(item))
    });
    Body::from_stream(chunks)
}

/// `body` with byte `at` inverted.
fn flipped(body: Body, at: u64) -> Body {
    let chunks = body.into_stream().scan(0u64, move |pos, chunk| {
        let item = chunk.map(|c| {
            let start = *pos;
            *pos += c.len() as u64;
            if (start..*pos).contains(&at) {
                let mut m = bytes::BytesMut::from(&c[..]);
                m[(at - start) as usize] ^= 0xff;
                m.freeze()
            } else {
                c
            }
        });
        futures::future::ready(Some(item))
    });
    Body::from_stream(chunks)
}

/// A PUT body with byte `at` inverted (sent from memory).
fn flipped_put(body: PutBody, at: u64) -> Result<PutBody, S3Error> {
    let mut data = match body {
        PutBody::Bytes(b) => b.to_vec(),
        PutBody::Region { region, offset, len } => {
            let mut out = vec![0u8; len as usize];
            region.read_at(offset, &mut out).map_err(|e| S3Error::Destination(e.to_string()))?;
            out
        }
        rdma @ PutBody::Rdma { .. } => return Ok(rdma),
    };
    if let Some(b) = data.get_mut(at as usize) {
        *b ^= 0xff;
    }
    Ok(PutBody::Bytes(data.into()))
}

impl S3Client for Failing {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        let f = self.arm(Op::Head, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            self.inner.head(at).await
        })
    }

    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        let f = self.arm(Op::Get, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            let mut reply = self.inner.get(at, req).await?;
            match f {
                Some(Failure::BreakBody(after)) => reply.body = broken(reply.body, after),
                Some(Failure::Flip(n)) => reply.body = flipped(reply.body, n),
                _ => {}
            }
            Ok(reply)
        })
    }

    fn list<'a>(&'a self, at: Target<'a>, query: ListQuery<'a>) -> S3Future<'a, ListPage> {
        let f = self.arm(Op::List, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            self.inner.list(at, query).await
        })
    }

    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        let f = self.arm(Op::Delete, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            self.inner.delete(at).await
        })
    }

    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        let f = self.arm(if part.is_some() { Op::UploadPart } else { Op::Put }, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            let body = match f {
                Some(Failure::Flip(n)) => flipped_put(body, n)?,
                _ => body,
            };
            self.inner.put(at, part, headers, body).await
        })
    }

    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        let f = self.arm(Op::Create, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            self.inner.create_upload(at, headers).await
        })
    }

    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        let f = self.arm(Op::Complete, &at);
        Box::pin(async move {
            Self::before(&f).await?;
            self.inner.complete_upload(at, upload_id, etags).await
        })
    }

    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        // Aborts are made ahead and sent until one works: not armed here,
        // so rules count only aborts that were sent.
        self.inner.abort_upload(at, upload_id)
    }
}
