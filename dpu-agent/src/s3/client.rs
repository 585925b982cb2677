//! The seam between the agent's transfer logic and an S3 store: one call
//! per S3 request.
//!
//! [`ObjectStore`](super::store::ObjectStore) decides *which* requests to send —
//! part splitting, retries across endpoints, `If-Match` and version checks,
//! the RDMA→HTTP fallback, quota admission, multipart abort — and an
//! [`S3Client`] sends one of them and says what came back. The agent's
//! client is [`HttpClient`](super::http_client::HttpClient) (SigV4 over
//! HTTP(S)); the unit tests use an in-memory store and a wrapper that fails
//! chosen requests, so that logic is tested without a network.
//!
//! Contract for every implementation: a non-2xx reply is an `Err` built
//! with [`S3Error::from_response`], except a data path token the store
//! declines (HTTP 501 or `x-amz-rdma-reply: 501`), which is
//! [`S3Error::RdmaDeclined`]. Transport failures are `Connection` (nothing
//! came back) or `TransferFailed` (a body broke).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::error::S3Error;
use super::model::ListPage;
use crate::hostmem::HostRegion;

/// What a request's future resolves to.
pub type S3Future<'a, T> = BoxFuture<'a, Result<T, S3Error>>;

pub use super::body::Body;

/// Where one request goes: an endpoint of the namespace and a stored key
/// (the namespace prefix already applied).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub endpoint: &'a str,
    pub key: &'a str,
    /// Sent to the store as `x-sluice-request-id` (ties its logs to ours).
    pub request_id: &'a str,
    /// Which try of the request this is (0: the first). A retry's
    /// first-byte deadline grows with it ([`super::endpoints::first_byte_deadline`]).
    pub attempt: u32,
}

/// A successful reply: status, headers and (for GET) the body.
pub struct Reply {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Body,
}

impl Reply {
    /// A header as text, `""` when absent or not text.
    pub fn header(&self, name: &str) -> &str {
        header(&self.headers, name)
    }
}

/// A header of `h` as text, `""` when absent or not text.
pub fn header<'h>(h: &'h http::HeaderMap, name: &str) -> &'h str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// A data path token on a request (`x-amz-rdma-token`): the store moves the
/// bytes itself, one-sidedly, and the HTTP body stays empty.
#[derive(Clone, Debug)]
pub struct RdmaToken {
    pub token: String,
    /// `x-amz-rdma-transport`, for transports other than RDMA proper.
    pub transport: Option<&'static str>,
}

/// One ranged GET: bytes `first..=last`.
#[derive(Clone, Debug, Default)]
pub struct RangedGet<'a> {
    pub first: u64,
    pub last: u64,
    /// `If-Match`: the store refuses another version with 412.
    pub if_match: Option<&'a str>,
    /// `x-amz-checksum-mode: ENABLED` (the full-object checksum, when the
    /// reply holds the whole object).
    pub checksum_mode: bool,
    pub rdma: Option<RdmaToken>,
    /// `x-sluice-rdma-object-max` (with `rdma`, Sluice's gateway only): no
    /// byte moves unless the whole object is at most this big.
    pub object_max: Option<u64>,
}

/// What a PUT or UploadPart carries.
pub enum PutBody {
    /// A body held in memory (signed with its SHA-256).
    Bytes(Bytes),
    /// `[offset, offset+len)` of a region, streamed as the socket takes it.
    Region { region: Arc<dyn HostRegion>, offset: u64, len: u64 },
    /// No body: the store READs the bytes through the token.
    Rdma { token: RdmaToken, len: u64 },
}

impl PutBody {
    /// The object's (or part's) size.
    pub fn size(&self) -> u64 {
        match self {
            Self::Bytes(b) => b.len() as u64,
            Self::Region { len, .. } | Self::Rdma { len, .. } => *len,
        }
    }
}

/// Which part of which multipart upload a PUT is.
#[derive(Clone, Copy, Debug)]
pub struct PartOf<'a> {
    pub upload_id: &'a str,
    /// 1-based.
    pub number: u64,
}

/// One ListObjectsV2 request (stored keys, the namespace prefix included).
#[derive(Clone, Copy, Debug, Default)]
pub struct ListQuery<'a> {
    pub prefix: &'a str,
    pub continuation_token: &'a str,
    /// 0: the store's default.
    pub max_keys: u32,
    pub delimiter: &'a str,
}

/// One S3 request at a time, against one bucket.
pub trait S3Client: Send + Sync {
    /// HeadObject (with `x-amz-checksum-mode: ENABLED`): the reply headers.
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap>;

    /// A ranged GetObject. The body is not read yet.
    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply>;

    /// One page of ListObjectsV2 (`at.key` is unused).
    fn list<'a>(&'a self, at: Target<'a>, query: ListQuery<'a>) -> S3Future<'a, ListPage>;

    /// DeleteObject.
    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()>;

    /// PutObject, or UploadPart with `part`; `headers` are the object's
    /// (content type, checksum, user metadata). The reply headers.
    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap>;

    /// CreateMultipartUpload: the upload id.
    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String>;

    /// CompleteMultipartUpload with the parts' ETags in order: the ETag.
    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String>;

    /// AbortMultipartUpload; an upload already gone (404) counts as done.
    /// The future owns all it needs: aborts run on tasks of their own,
    /// started while the transfer that needed them is being dropped.
    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()>;

    /// GetBucketLifecycleConfiguration (`at.key` is unused): the XML, `None`
    /// when the bucket has no lifecycle. Stores in memory have none.
    fn get_lifecycle<'a>(&'a self, at: Target<'a>) -> S3Future<'a, Option<String>> {
        let _ = at;
        Box::pin(async { Ok(None) })
    }

    /// ListMultipartUploads of the keys starting with `prefix` (`at.key` is
    /// unused; one page, up to 1000). Stores in memory list none.
    fn list_uploads<'a>(&'a self, at: Target<'a>, prefix: &'a str) -> S3Future<'a, Vec<super::uploads::Listed>> {
        let _ = (at, prefix);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// ListParts of upload `upload_id` of `at.key` (its first page): how
    /// many parts it has. An upload that is gone is `NoSuchKey`.
    fn count_parts<'a>(&'a self, at: Target<'a>, upload_id: &'a str) -> S3Future<'a, usize> {
        let _ = (at, upload_id);
        Box::pin(async { Ok(0) })
    }

    /// PutBucketLifecycleConfiguration with `xml` (replaces the bucket's
    /// whole lifecycle; see `uploads`).
    fn put_lifecycle<'a>(&'a self, at: Target<'a>, xml: String) -> S3Future<'a, ()> {
        let _ = (at, xml);
        Box::pin(async { Err(S3Error::Unsupported("this store has no bucket lifecycle".into())) })
    }
}
