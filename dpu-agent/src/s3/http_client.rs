//! The agent's [`S3Client`]: each request built, SigV4-signed with the
//! namespace's credentials and sent over one shared HTTP(S) connection pool.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sluice_dataplane::s3_names::{OBJECT_MAX_HEADER, REPLY_HEADER, TOKEN_HEADER, TRANSPORT_HEADER};

use super::client::{ListQuery, PartOf, PutBody, RangedGet, RdmaToken, Reply, S3Client, S3Future, Target};
use super::endpoints::first_byte_deadline;
use super::error::S3Error;
use super::http1::{self, Http1};
use super::model::ListPage;
use super::sigv4::Keys;
use super::{sigv4, xml};
use crate::config::S3Tuning;

/// Characters S3 wants encoded in a key path: all but unreserved and '/'.
const PATH: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
/// Query values: all but unreserved.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// What goes in the body, for signing and sending.
enum Payload {
    /// No body.
    Empty,
    /// A small body held in memory (signed with its SHA-256).
    Bytes(bytes::Bytes),
    /// A streamed body of known length (signed as UNSIGNED-PAYLOAD).
    Stream { body: reqwest::Body, len: u64 },
}

/// A request under construction.
struct Spec<'a> {
    method: http::Method,
    endpoint: &'a str,
    key: Option<&'a str>,
    query: Vec<(&'static str, String)>,
    headers: Vec<(&'static str, String)>,
    payload: Payload,
}

impl<'a> Spec<'a> {
    fn new(method: http::Method, endpoint: &'a str) -> Self {
        Self { method, endpoint, key: None, query: Vec::new(), headers: Vec::new(), payload: Payload::Empty }
    }
    fn key(mut self, key: &'a str) -> Self {
        self.key = Some(key);
        self
    }
    fn query(mut self, name: &'static str, value: &str) -> Self {
        self.query.push((name, value.to_owned()));
        self
    }
    fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
    fn headers(mut self, headers: &[(&'static str, String)]) -> Self {
        self.headers.extend(headers.iter().cloned());
        self
    }
    fn payload(mut self, payload: Payload) -> Self {
        self.payload = payload;
        self
    }
    fn token(self, rdma: &Option<RdmaToken>) -> Self {
        let Some(t) = rdma else { return self };
        let spec = self.header(TOKEN_HEADER, t.token.clone());
        match t.transport {
            Some(m) => spec.header(TRANSPORT_HEADER, m.to_owned()),
            None => spec,
        }
    }
}

/// Bytes read from a region per body chunk.
const BODY_CHUNK: u64 = 1 << 20;

/// A streamed body over `[offset, offset+len)` of a region.
fn region_body(region: std::sync::Arc<dyn crate::hostmem::HostRegion>, offset: u64, len: u64) -> Payload {
    let end = offset + len;
    let stream = futures::stream::unfold(offset, move |pos| {
        let region = region.clone();
        async move {
            if pos >= end {
                return None;
            }
            let n = (end - pos).min(BODY_CHUNK) as usize;
            let mut buf = bytes::BytesMut::zeroed(n);
            let item = region
                .read_at(pos, &mut buf)
                .map(|()| bytes::Bytes::from(buf))
                .map_err(|e| std::io::Error::other(e.to_string()));
            Some((item, pos + n as u64))
        }
    });
    Payload::Stream { body: reqwest::Body::wrap_stream(stream), len }
}

/// Builds an HTTP client (one connection pool), shared by the namespaces
/// that trust the same roots. https:// endpoints are verified against the
/// built-in Mozilla roots, the system's store (`SSL_CERT_FILE` /
/// `SSL_CERT_DIR` when set) and `extra_roots` (a namespace's `ca_file`).
pub fn pool(
    tuning: &S3Tuning,
    extra_roots: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<reqwest::Client, S3Error> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(tuning.connect_timeout_ms))
        .read_timeout(Duration::from_millis(tuning.read_timeout_ms))
        .tcp_nodelay(true)
        .pool_max_idle_per_host(64)
        .tls_built_in_webpki_certs(true)
        .tls_built_in_native_certs(true);
    for der in extra_roots {
        let cert = reqwest::Certificate::from_der(der)
            .map_err(|e| S3Error::Protocol(format!("a CA certificate for the HTTP client: {e}")))?;
        b = b.add_root_certificate(cert);
    }
    b.build().map_err(|e| S3Error::Protocol(format!("building HTTP client: {e}")))
}

/// SigV4 over HTTP(S) to one bucket, with one namespace's credentials.
pub struct HttpClient {
    http: reqwest::Client,
    bucket: String,
    /// Replaced whole when the credentials rotate; each request signs with
    /// the signer current when it is built (a retry after a rotation signs
    /// with the new keys).
    signer: std::sync::RwLock<Arc<sigv4::Signer>>,
    /// See `first_byte`; `None`: only the pool's read timeout.
    first_byte: Option<Duration>,
    /// GETs and HEADs to `http://` endpoints go here, GET bodies read
    /// straight into the region (`[s3] direct_gets`); `None`: all through
    /// reqwest.
    direct: Option<Arc<Http1>>,
}

impl HttpClient {
    pub fn new(http: reqwest::Client, bucket: String, keys: Keys, region: String) -> Self {
        let signer = Arc::new(sigv4::Signer::new(keys, region));
        Self { http, bucket, signer: std::sync::RwLock::new(signer), first_byte: None, direct: None }
    }

    /// Sends GETs and HEADs to plain-HTTP endpoints on `direct`'s connections.
    pub fn with_direct_gets(mut self, direct: Option<Arc<Http1>>) -> Self {
        self.direct = direct;
        self
    }

    /// Fails requests that go `limit` without progress (`first_byte`).
    pub fn with_first_byte_timeout(mut self, limit: Option<Duration>) -> Self {
        self.first_byte = limit;
        self
    }

    fn signer(&self) -> Arc<sigv4::Signer> {
        self.signer.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Signs from now on with these keys (a new session token included).
    /// `false`: they are the ones in use.
    pub fn rotate(&self, keys: &Keys) -> bool {
        let mut signer = self.signer.write().unwrap_or_else(|p| p.into_inner());
        if signer.has_keys(keys) {
            return false;
        }
        let region = signer.region().to_owned();
        *signer = Arc::new(sigv4::Signer::new(keys.clone(), region));
        true
    }

    /// The access key requests are signed as.
    pub fn access_key(&self) -> String {
        self.signer().access_key().to_owned()
    }

    /// Signs and sends `spec`; transport failures become retryable errors,
    /// a non-2xx status an error (see the [`S3Client`] contract).
    async fn send(&self, spec: Spec<'_>, at: &Target<'_>) -> Result<reqwest::Response, S3Error> {
        let rdma = spec.headers.iter().any(|(n, _)| *n == TOKEN_HEADER);
        let req = self.build(spec, at.request_id)?.build().map_err(S3Error::from_reqwest)?;
        // An RDMA answer waits for the one-sided transfer: no first-byte
        // deadline, only the read timeout.
        let limit = first_byte_deadline(self.first_byte, at.attempt).filter(|_| !rdma);
        let resp = super::first_byte::execute(&self.http, req, limit, at.endpoint).await?;
        check(resp, Some(at.key), rdma).await
    }

    /// Signs `spec` into a request ready to send; it owns everything it
    /// needs, so it can be sent from a task of its own.
    fn build(&self, spec: Spec<'_>, request_id: &str) -> Result<reqwest::RequestBuilder, S3Error> {
        let p = self.prepare(&spec)?;
        let signed = self.sign(&spec.method, &p, SystemTime::now());
        let mut rb = self
            .http
            .request(spec.method.clone(), &p.url)
            .header("x-sluice-request-id", request_id)
            .header("x-amz-date", signed.amz_date)
            .header("x-amz-content-sha256", p.payload_sha256)
            .header("authorization", signed.authorization);
        if let Some(token) = signed.security_token {
            rb = rb.header("x-amz-security-token", token);
        }
        for (n, v) in p.headers {
            if n != "host" {
                rb = rb.header(n, v);
            }
        }
        Ok(match spec.payload {
            Payload::Empty => rb,
            Payload::Bytes(b) => rb.body(reqwest::Body::from(b)),
            Payload::Stream { body, .. } => rb.body(body),
        })
    }

    /// The connections for a request to `endpoint`, if it goes over them:
    /// plain HTTP, no path in the endpoint.
    fn direct_for(&self, endpoint: &str) -> Option<&Arc<Http1>> {
        let plain = endpoint.strip_prefix("http://").is_some_and(|rest| !rest.contains('/'));
        self.direct.as_ref().filter(|_| plain)
    }

    /// A GET or HEAD (bodyless `spec`) on a connection of `direct`: the
    /// signed request head written by hand (the same headers reqwest would
    /// send), a GET's body left on the socket for the caller to read into
    /// its region. Errors as [`check`] makes them.
    async fn send_direct(
        &self,
        direct: &Arc<Http1>,
        spec: Spec<'_>,
        at: &Target<'_>,
        asked: u64,
    ) -> Result<Reply, S3Error> {
        let rdma = spec.headers.iter().any(|(n, _)| *n == TOKEN_HEADER);
        let no_body = spec.method == http::Method::HEAD;
        let p = self.prepare(&spec)?;
        let signed = self.sign(&spec.method, &p, SystemTime::now());
        let mut head = Vec::with_capacity(p.url.len() + 768);
        head.extend_from_slice(spec.method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(&p.url.as_bytes()[p.path_start..]);
        head.extend_from_slice(b" HTTP/1.1\r\n");
        let fixed = [
            ("x-sluice-request-id", at.request_id),
            ("x-amz-date", signed.amz_date.as_str()),
            ("x-amz-content-sha256", p.payload_sha256.as_str()),
            ("authorization", signed.authorization.as_str()),
        ];
        let token = signed.security_token.as_deref().map(|t| ("x-amz-security-token", t));
        for (n, v) in p.headers.iter().map(|(n, v)| (*n, v.as_str())).chain(fixed).chain(token) {
            // Values come from the config, the caller and earlier replies;
            // none may end the header early, nor carry other control bytes
            // (which reqwest, on the other path, refuses too).
            if v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                return Err(S3Error::Protocol(format!("header {n} would carry a control character")));
            }
            head.extend_from_slice(n.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        debug_assert_eq!(p.headers[0].0, "host");
        let authority = p.headers[0].1.as_str();
        // An RDMA answer waits for the one-sided transfer: no first-byte
        // deadline, only the read timeout.
        let first_byte = first_byte_deadline(self.first_byte, at.attempt).filter(|_| !rdma);
        let req = http1::Request { endpoint: at.endpoint, authority, head, asked, first_byte, no_body };
        let resp = direct.get(req).await?;
        if !resp.status.is_success() {
            if let Some(e) = declined(rdma, resp.status, &resp.headers) {
                return Err(e);
            }
            let body = read_capped(resp.body, 64 << 10).await;
            return Err(S3Error::from_response(resp.status.as_u16(), &body, Some(at.key)).naming_bucket(&self.bucket));
        }
        Ok(Reply { status: resp.status, headers: resp.headers, body: resp.body })
    }

    fn sign(&self, method: &http::Method, p: &Prepared<'_>, now: SystemTime) -> sigv4::Signed {
        let headers: Vec<(&str, &str)> = p.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.signer().sign(method.as_str(), p.path(), p.query(), &headers, &p.payload_sha256, now)
    }

    /// The URL, signed headers and payload hash of `spec`.
    fn prepare<'s>(&self, spec: &'s Spec<'_>) -> Result<Prepared<'s>, S3Error> {
        let host = host_of(spec.endpoint)?;
        let mut url = String::with_capacity(spec.endpoint.len() + self.bucket.len() + 96);
        url.push_str(spec.endpoint);
        let path_start = url.len();
        url.push('/');
        url.push_str(&self.bucket);
        if let Some(k) = spec.key {
            url.push('/');
            url.extend(utf8_percent_encode(k, PATH));
        }
        let path_end = url.len();
        // Sorted, so the query sent is also SigV4's canonical query string.
        let mut query: Vec<(&str, &str)> = spec.query.iter().map(|(n, v)| (*n, v.as_str())).collect();
        query.sort_unstable();
        for (i, (n, v)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(n);
            url.push('=');
            url.extend(utf8_percent_encode(v, QUERY));
        }
        let mut headers: Vec<(&'s str, String)> = Vec::with_capacity(spec.headers.len() + 2);
        headers.push(("host", host));
        headers.extend(spec.headers.iter().map(|(n, v)| (*n, v.clone())));
        let (payload_sha256, len) = match &spec.payload {
            Payload::Empty => (sigv4::EMPTY_SHA256.to_owned(), 0),
            Payload::Bytes(b) => (sigv4::payload_sha256(b), b.len() as u64),
            Payload::Stream { len, .. } => (sigv4::UNSIGNED_PAYLOAD.to_owned(), *len),
        };
        if !matches!(spec.payload, Payload::Empty) || spec.method == http::Method::PUT {
            headers.push(("content-length", len.to_string()));
        }
        Ok(Prepared { url, path_start, path_end, headers, payload_sha256 })
    }
}

impl S3Client for HttpClient {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move {
            let spec =
                Spec::new(http::Method::HEAD, at.endpoint).key(at.key).header("x-amz-checksum-mode", "ENABLED".into());
            if let Some(direct) = self.direct_for(at.endpoint) {
                return Ok(self.send_direct(direct, spec, &at, 0).await?.headers);
            }
            Ok(self.send(spec, &at).await?.headers().clone())
        })
    }

    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        Box::pin(async move {
            let mut spec = Spec::new(http::Method::GET, at.endpoint)
                .key(at.key)
                .header("range", format!("bytes={}-{}", req.first, req.last));
            if let Some(etag) = req.if_match {
                spec = spec.header("if-match", etag.to_owned());
            }
            if req.checksum_mode {
                spec = spec.header("x-amz-checksum-mode", "ENABLED".into());
            }
            if let Some(max) = req.object_max {
                spec = spec.header(OBJECT_MAX_HEADER, max.to_string());
            }
            let spec = spec.token(&req.rdma);
            if let Some(direct) = self.direct_for(at.endpoint) {
                return self.send_direct(direct, spec, &at, req.last.saturating_sub(req.first).saturating_add(1)).await;
            }
            let resp = self.send(spec, &at).await?;
            let (status, headers) = (resp.status(), resp.headers().clone());
            let body = super::client::Body::from_stream(resp.bytes_stream().map_err(S3Error::from_reqwest));
            Ok(Reply { status, headers, body })
        })
    }

    fn list<'a>(&'a self, at: Target<'a>, q: ListQuery<'a>) -> S3Future<'a, ListPage> {
        Box::pin(async move {
            let mut spec = Spec::new(http::Method::GET, at.endpoint).query("list-type", "2").query("prefix", q.prefix);
            if !q.continuation_token.is_empty() {
                spec = spec.query("continuation-token", q.continuation_token);
            }
            if q.max_keys > 0 {
                spec = spec.query("max-keys", &q.max_keys.to_string());
            }
            if !q.delimiter.is_empty() {
                spec = spec.query("delimiter", q.delimiter);
            }
            let at = Target { key: "", ..at };
            let body = self.send(spec, &at).await?.text().await.map_err(S3Error::from_reqwest)?;
            xml::parse_list(&body)
        })
    }

    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        Box::pin(async move {
            self.send(Spec::new(http::Method::DELETE, at.endpoint).key(at.key), &at).await?;
            Ok(())
        })
    }

    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move {
            let mut spec = Spec::new(http::Method::PUT, at.endpoint).key(at.key).headers(headers);
            if let Some(p) = part {
                spec = spec.query("partNumber", &p.number.to_string()).query("uploadId", p.upload_id);
            }
            let spec = match body {
                PutBody::Bytes(b) => spec.payload(Payload::Bytes(b)),
                PutBody::Region { region, offset, len } => spec.payload(region_body(region, offset, len)),
                PutBody::Rdma { token, .. } => spec.token(&Some(token)),
            };
            Ok(self.send(spec, &at).await?.headers().clone())
        })
    }

    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        Box::pin(async move {
            let spec = Spec::new(http::Method::POST, at.endpoint).key(at.key).query("uploads", "").headers(headers);
            xml::parse_upload_id(&self.send(spec, &at).await?.text().await.map_err(S3Error::from_reqwest)?)
        })
    }

    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        Box::pin(async move {
            let spec = Spec::new(http::Method::POST, at.endpoint)
                .key(at.key)
                .query("uploadId", upload_id)
                .header("content-type", "application/xml".into())
                .payload(Payload::Bytes(xml::complete_body(etags).into()));
            xml::parse_complete(&self.send(spec, &at).await?.text().await.map_err(S3Error::from_reqwest)?)
        })
    }

    fn list_uploads<'a>(&'a self, at: Target<'a>, prefix: &'a str) -> S3Future<'a, Vec<super::uploads::Listed>> {
        Box::pin(async move {
            let spec = Spec::new(http::Method::GET, at.endpoint).query("uploads", "").query("prefix", prefix);
            let body = self.send(spec, &Target { key: "", ..at }).await?.text().await.map_err(S3Error::from_reqwest)?;
            super::uploads::parse_listed(&body)
        })
    }

    fn count_parts<'a>(&'a self, at: Target<'a>, upload_id: &'a str) -> S3Future<'a, usize> {
        Box::pin(async move {
            let spec = Spec::new(http::Method::GET, at.endpoint).key(at.key).query("uploadId", upload_id);
            let body = self.send(spec, &at).await?.text().await.map_err(S3Error::from_reqwest)?;
            Ok(super::uploads::count_listed_parts(&body))
        })
    }

    fn get_lifecycle<'a>(&'a self, at: Target<'a>) -> S3Future<'a, Option<String>> {
        Box::pin(async move {
            let spec = Spec::new(http::Method::GET, at.endpoint).query("lifecycle", "");
            match self.send(spec, &Target { key: "", ..at }).await {
                Ok(resp) => Ok(Some(resp.text().await.map_err(S3Error::from_reqwest)?)),
                // NoSuchLifecycleConfiguration (a 404 that is not NoSuchBucket).
                Err(S3Error::NoSuchKey(_)) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    fn put_lifecycle<'a>(&'a self, at: Target<'a>, xml: String) -> S3Future<'a, ()> {
        Box::pin(async move {
            use base64::Engine as _;
            use md5::Digest as _;
            // S3 refuses PutBucketLifecycleConfiguration without a digest.
            let md5 = base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(xml.as_bytes()));
            let spec = Spec::new(http::Method::PUT, at.endpoint)
                .query("lifecycle", "")
                .header("content-md5", md5)
                .header("content-type", "application/xml".into())
                .payload(Payload::Bytes(xml.into()));
            self.send(spec, &Target { key: "", ..at }).await?;
            Ok(())
        })
    }

    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        // Signed now (the caller's strings are borrowed), sent later.
        let spec = Spec::new(http::Method::DELETE, at.endpoint).key(at.key).query("uploadId", upload_id);
        let (req, key) = (self.build(spec, at.request_id), at.key.to_owned());
        Box::pin(async move {
            let resp = req?.send().await.map_err(S3Error::from_reqwest)?;
            match check(resp, Some(&key), false).await {
                // NoSuchUpload: already gone (completed or aborted).
                Ok(_) | Err(S3Error::NoSuchKey(_)) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }
}

/// Passes a success response through; turns anything else into an
/// [`S3Error`]. With a data path token, a declined token is
/// [`S3Error::RdmaDeclined`].
/// A failed reply to a request carrying a data path token that declines
/// the token (HTTP 501, or `x-amz-rdma-reply: 501`).
fn declined(rdma: bool, status: http::StatusCode, headers: &http::HeaderMap) -> Option<S3Error> {
    let said = status == http::StatusCode::NOT_IMPLEMENTED
        || headers.get(REPLY_HEADER).is_some_and(|v| v.as_bytes() == b"501");
    (rdma && said)
        .then(|| S3Error::RdmaDeclined(format!("the store declined RDMA (HTTP {status}, {REPLY_HEADER}: 501)")))
}

async fn check(resp: reqwest::Response, key: Option<&str>, rdma: bool) -> Result<reqwest::Response, S3Error> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    if let Some(e) = declined(rdma, status, resp.headers()) {
        return Err(e);
    }
    // URLs are path-style: the bucket is the path's first segment (named in
    // a NoSuchBucket whose body does not name it).
    let bucket = resp.url().path_segments().and_then(|mut s| s.next()).unwrap_or_default().to_owned();
    // Error bodies are small; cap what we read so a broken server cannot make us buffer much.
    let body =
        read_capped(super::client::Body::from_stream(resp.bytes_stream().map_err(S3Error::from_reqwest)), 64 << 10)
            .await;
    Err(S3Error::from_response(status.as_u16(), &body, key).naming_bucket(&bucket))
}

async fn read_capped(mut body: super::client::Body, cap: usize) -> String {
    let mut out = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        out.extend_from_slice(&chunk[..chunk.len().min(cap - out.len())]);
        if out.len() >= cap {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request's parts before signing.
struct Prepared<'s> {
    url: String,
    path_start: usize,
    path_end: usize,
    /// Signed headers (names lower case), `host` first.
    headers: Vec<(&'s str, String)>,
    payload_sha256: String,
}

impl Prepared<'_> {
    fn path(&self) -> &str {
        &self.url[self.path_start..self.path_end]
    }
    fn query(&self) -> &str {
        self.url.get(self.path_end + 1..).unwrap_or("")
    }
}

/// `host[:port]` of an endpoint URL, as the Host header carries it.
/// The `Host` header a request to `endpoint` carries, as signed: without
/// the scheme's default port, as the URL parser under reqwest writes it
/// (signing `store:443` while `store` is sent fails every request with
/// SignatureDoesNotMatch).
fn host_of(endpoint: &str) -> Result<String, S3Error> {
    let (rest, default_port) = match (endpoint.strip_prefix("http://"), endpoint.strip_prefix("https://")) {
        (Some(rest), _) => (rest, ":80"),
        (_, Some(rest)) => (rest, ":443"),
        _ => return Err(S3Error::Protocol(format!("endpoint {endpoint:?} is not an http(s) URL"))),
    };
    let host = rest.split('/').next().unwrap_or(rest);
    Ok(host.strip_suffix(default_port).unwrap_or(host).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signed_host_is_the_one_sent() {
        for (endpoint, host) in [
            ("http://store:80", "store"),
            ("https://store:443/", "store"),
            ("http://store:443", "store:443"),
            ("https://store:80", "store:80"),
            ("http://10.0.0.1:9000", "10.0.0.1:9000"),
            ("https://[fd00::1]:443", "[fd00::1]"),
            ("http://[fd00::1]:8080", "[fd00::1]:8080"),
        ] {
            assert_eq!(host_of(endpoint).unwrap(), host, "{endpoint}");
            // As reqwest (the url crate) writes the Host header.
            let url = reqwest::Url::parse(endpoint).unwrap();
            let sent = match url.port() {
                Some(p) => format!("{}:{p}", url.host_str().unwrap()),
                None => url.host_str().unwrap().to_owned(),
            };
            assert_eq!(sent, host, "{endpoint}");
        }
    }

    #[test]
    fn keys_are_encoded_like_s3_expects() {
        let enc: String = utf8_percent_encode("dir/a b+ü~.txt", PATH).collect();
        assert_eq!(enc, "dir/a%20b%2B%C3%BC~.txt");
        let q: String = utf8_percent_encode("a/b c", QUERY).collect();
        assert_eq!(q, "a%2Fb%20c");
    }

    #[test]
    fn host_header() {
        assert_eq!(host_of("http://127.0.0.1:9000").unwrap(), "127.0.0.1:9000");
        assert_eq!(host_of("https://s3.example.com/").unwrap(), "s3.example.com");
        assert!(host_of("ftp://x").is_err());
    }

    /// A loopback server that answers one request with `reply` and hands
    /// back the request's bytes.
    async fn answer_once(reply: &'static str) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // The head, then the body Content-Length announces.
            loop {
                let n = sock.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&req).to_ascii_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if req.len() >= end + 4 + len || n == 0 {
                        break;
                    }
                }
            }
            sock.write_all(reply.as_bytes()).await.unwrap();
            req
        });
        (endpoint, task)
    }

    fn client() -> HttpClient {
        let keys = Keys { access_key: "AK".into(), secret_key: "SK".into(), session_token: None };
        HttpClient::new(pool(&Default::default(), &[]).unwrap(), "data".into(), keys, "us-east-1".into())
    }

    /// A region body goes as one plain UNSIGNED-PAYLOAD body with its
    /// checksums in signed headers — never aws-chunked with trailing
    /// checksums, which RGW 16.2 refuses.
    #[tokio::test]
    async fn uploads_carry_checksums_in_signed_headers_never_in_trailers() {
        let (ep, server) = answer_once("HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n").await;
        let region: std::sync::Arc<dyn crate::hostmem::HostRegion> = std::sync::Arc::new(
            sluice_dataplane::SharedRegion::new(sluice_shm::MappedRegion::create("t", 100).unwrap()),
        );
        let digests = super::super::integrity::Digests::of(&[0u8; 100], true);
        let headers = digests.headers();
        let at = Target { endpoint: &ep, key: "k", request_id: "r", attempt: 0 };
        let part = Some(PartOf { upload_id: "u", number: 1 });
        client().put(at, part, &headers, PutBody::Region { region, offset: 0, len: 100 }).await.unwrap();
        let req = String::from_utf8_lossy(&server.await.unwrap()).to_ascii_lowercase();
        let (head, body) = req.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("x-amz-content-sha256: unsigned-payload"), "{head}");
        assert!(head.contains("content-length: 100") && body.len() == 100, "{head}");
        for absent in ["x-amz-trailer", "aws-chunked", "x-amz-decoded-content-length", "streaming-"] {
            assert!(!head.contains(absent), "{absent}: {head}");
        }
        let signed = head.lines().find(|l| l.starts_with("authorization:")).unwrap();
        assert!(signed.contains("content-md5") && signed.contains("x-amz-checksum-crc64nvme"), "{signed}");
    }

    /// A store that answers a PUT later than the first-byte deadline: the
    /// first try is cut short at the deadline, a retry (`attempt` 1) waits
    /// twice as long and gets the answer.
    #[tokio::test]
    async fn a_retried_put_waits_twice_the_first_byte_deadline() {
        let limit = Duration::from_millis(200);
        let slow = |attempt: u32| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let ep = format!("http://{}", listener.local_addr().unwrap());
            let server = tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 64 << 10];
                let _ = sock.read(&mut buf).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = sock.write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n").await;
            });
            let at = Target { endpoint: &ep, key: "k", request_id: "r", attempt };
            let body = PutBody::Bytes(bytes::Bytes::from_static(b"abc"));
            let t0 = std::time::Instant::now();
            let r = client().with_first_byte_timeout(Some(limit)).put(at, None, &[], body).await;
            server.abort();
            (r, t0.elapsed())
        };
        let (first, took) = slow(0).await;
        let e = first.unwrap_err();
        assert!(e.is_retryable() && e.to_string().contains("made no progress within 200 ms"), "{e}");
        assert!(took < Duration::from_millis(290), "{took:?}");
        let (retry, took) = slow(1).await;
        retry.unwrap();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert_eq!(super::super::endpoints::first_byte_deadline(Some(limit), 9), Some(limit * 8), "at most 8x");
    }

    /// RGW's NoSuchBucket body may not name the bucket: the request does.
    fn direct_client() -> HttpClient {
        let direct = Http1::new(Duration::from_secs(2), Duration::from_secs(2));
        client().with_direct_gets(Some(direct))
    }

    #[tokio::test]
    async fn over_its_own_connections_a_declined_token_and_errors_read_as_through_reqwest() {
        let token = Some(RdmaToken { token: "t".into(), transport: Some("tcp") });
        for (reply, want) in [
            ("HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n", "declined"),
            ("HTTP/1.1 400 Bad Request\r\nx-amz-rdma-reply: 501\r\nContent-Length: 0\r\n\r\n", "declined"),
            (
                "HTTP/1.1 404 Not Found\r\nContent-Length: 57\r\n\r\n<Error><Code>NoSuchKey</Code><Message>m</Message></Error>",
                "nosuchkey",
            ),
        ] {
            let (ep, server) = answer_once(reply).await;
            let at = Target { endpoint: &ep, key: "k", request_id: "r", attempt: 0 };
            let req = RangedGet { first: 0, last: 9, rdma: token.clone(), ..Default::default() };
            let e = direct_client().get(at, req).await.err().unwrap();
            let sent = String::from_utf8(server.await.unwrap()).unwrap().to_ascii_lowercase();
            assert!(sent.starts_with("get /data/k http/1.1\r\n") && sent.contains("x-amz-rdma-token: t"), "{sent}");
            match want {
                "declined" => assert!(matches!(e, S3Error::RdmaDeclined(_)), "{reply}: {e}"),
                _ => assert!(matches!(&e, S3Error::NoSuchKey(k) if k == "k"), "{reply}: {e}"),
            }
        }
    }

    #[tokio::test]
    async fn a_header_value_with_a_line_break_is_never_sent() {
        let at = Target { endpoint: "http://127.0.0.1:9", key: "k", request_id: "r", attempt: 0 };
        let req = RangedGet { first: 0, last: 9, if_match: Some("\"e\"\r\nx-evil: 1"), ..Default::default() };
        let e = direct_client().get(at, req).await.err().unwrap();
        assert!(matches!(e, S3Error::Protocol(_)) && e.to_string().contains("if-match"), "{e}");
    }

    #[tokio::test]
    async fn a_missing_bucket_is_named_from_the_request() {
        let body = "<Error><Code>NoSuchBucket</Code><RequestId>tx</RequestId></Error>";
        let reply: &'static str = Box::leak(
            format!("HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_boxed_str(),
        );
        let (ep, server) = answer_once(reply).await;
        let at = Target { endpoint: &ep, key: "k", request_id: "r", attempt: 0 };
        let e = client().delete(at).await.unwrap_err();
        server.await.unwrap();
        assert_eq!(e.to_string(), "no such bucket \"data\" on the store");
    }

    /// The agent's signer against aws-sigv4's full signer (the settings the
    /// agent used it with), for every kind of request the agent sends and
    /// keys and values that need encoding.
    #[test]
    fn signatures_match_aws_sigv4() {
        let ns: crate::config::NamespaceConfig = toml::from_str(
            "name = \"d\"\nendpoints = [\"http://127.0.0.1:9000\"]\nbucket = \"data\"\ncredentials = \"c\"\nregion = \"eu-west-3\"\n",
        )
        .unwrap();
        let (ak, sk) = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
        // Long-term keys, and temporary ones with a session token.
        for token in [None, Some("FwoGZXIvYXdzEJr//////////wEaDH+token/with=chars")] {
            signatures_match_for(ak, sk, token, &ns);
        }
    }

    fn signatures_match_for(ak: &str, sk: &str, token: Option<&str>, ns: &crate::config::NamespaceConfig) {
        use aws_sigv4::http_request::{
            sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
            UriPathNormalizationMode,
        };
        let keys = Keys { access_key: ak.into(), secret_key: sk.into(), session_token: token.map(str::to_owned) };
        let store =
            HttpClient::new(pool(&Default::default(), &[]).unwrap(), ns.bucket.clone(), keys, ns.region.clone());
        let creds = aws_credential_types::Credentials::new(ak, sk, token.map(str::to_owned), None, "test");
        let identity = creds.into();
        let ep = "http://127.0.0.1:9000";
        let odd_key = "dir/a b+ü~.txt=&%?#[x]";
        let specs = vec![
            Spec::new(http::Method::GET, ep).key("bench/4KiB/obj-00001").header("range", "bytes=0-4095".into()),
            Spec::new(http::Method::GET, ep)
                .key(odd_key)
                .header("range", "bytes=0-9".into())
                .header("if-match", "\"abc\"".into())
                .header("x-amz-checksum-mode", "ENABLED".into()),
            Spec::new(http::Method::HEAD, ep).key(odd_key),
            Spec::new(http::Method::DELETE, ep).key("k"),
            Spec::new(http::Method::GET, ep)
                .query("list-type", "2")
                .query("prefix", "a b/ü+=&")
                .query("continuation-token", "tok/+=="),
            Spec::new(http::Method::POST, ep)
                .key("big")
                .query("uploads", "")
                .header("content-type", "  text/plain;   charset=utf-8 ".into()),
            Spec::new(http::Method::PUT, ep)
                .key("big")
                .query("uploadId", "2~abc/def+=")
                .query("partNumber", "7")
                .header("x-amz-checksum-crc64nvme", "AAAAAAAAAAA=".into())
                .payload(Payload::Stream { body: reqwest::Body::from(vec![0u8; 5]), len: 5 }),
            Spec::new(http::Method::POST, ep)
                .key("big")
                .query("uploadId", "u")
                .header("content-type", "application/xml".into())
                .payload(Payload::Bytes(bytes::Bytes::from_static(b"<CompleteMultipartUpload/>"))),
            Spec::new(http::Method::PUT, ep).key("empty").header("x-amz-meta-sluice-enc", "v1".into()),
        ];
        let times = [1_795_607_999u64, 951_782_400, 4_107_542_399];
        for (i, spec) in specs.iter().enumerate() {
            for t in times {
                let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
                let p = store.prepare(spec).unwrap();
                let ours = store.sign(&spec.method, &p, now);

                let mut settings = SigningSettings::default();
                settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
                settings.percent_encoding_mode = PercentEncodingMode::Single;
                settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
                let params = aws_sigv4::sign::v4::SigningParams::builder()
                    .identity(&identity)
                    .region("eu-west-3")
                    .name("s3")
                    .time(now)
                    .settings(settings)
                    .build()
                    .unwrap()
                    .into();
                let body = match &spec.payload {
                    Payload::Empty => SignableBody::Bytes(&[]),
                    Payload::Bytes(b) => SignableBody::Bytes(b),
                    Payload::Stream { .. } => SignableBody::UnsignedPayload,
                };
                let req = SignableRequest::new(
                    spec.method.as_str(),
                    p.url.as_str(),
                    p.headers.iter().map(|(n, v)| (*n, v.as_str())),
                    body,
                )
                .unwrap();
                let (instructions, _) = sign(req, &params).unwrap().into_parts();
                let theirs: std::collections::HashMap<&str, &str> = instructions.headers().collect();
                assert_eq!(theirs["authorization"], ours.authorization, "request {i} at {t}");
                assert_eq!(theirs.get("x-amz-security-token").copied(), ours.security_token.as_deref());
                assert_eq!(theirs["x-amz-date"], ours.amz_date, "request {i} at {t}");
                assert_eq!(theirs["x-amz-content-sha256"], p.payload_sha256, "request {i} at {t}");
            }
        }
    }
}
