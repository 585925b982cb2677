//! An in-memory S3 bucket behind the [`S3Client`] seam, for tests of the
//! transfer logic (here, and in other crates with the `mock` feature): objects with ETags and full-object CRC64NVMEs,
//! ranges, `If-Match`, ListObjectsV2 pages, multipart uploads, Content-MD5
//! and the data path token (declined, ignored, or served over the real TCP
//! one-sided transport). By default it treats checksums as S3 does; in
//! [`MockStore::rgw_like`] mode as Ceph RGW 16.2 does. It records every
//! request it answers.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use sluice_dataplane::s3_names::{BYTES_HEADER, FITS_HEADER, REPLY_HEADER};
use sluice_dataplane::tcp::TcpRemote;
use sluice_dataplane::Token;

use super::client::{ListQuery, PartOf, PutBody, RangedGet, RdmaToken, Reply, S3Client, S3Future, Target};
use super::error::S3Error;
use super::model::{ListPage, ObjectMeta};

/// The kind of an S3 request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Head,
    Get,
    List,
    Delete,
    Put,
    UploadPart,
    Create,
    Complete,
    Abort,
}

/// One request the mock answered.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub op: Op,
    pub endpoint: String,
    pub key: String,
    /// GET: `first..=last`.
    pub range: Option<(u64, u64)>,
    pub if_match: Option<String>,
    /// It carried a data path token.
    pub rdma: bool,
    /// PUT, UploadPart, CreateMultipartUpload: the request's headers.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    /// A request header, if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// What the store does with a data path token.
#[derive(Clone)]
pub enum RdmaMode {
    /// 501, as a store without RDMA answers.
    Decline,
    /// Serves the request as plain HTTP, without `x-amz-rdma-reply`.
    Ignore,
    /// Moves the bytes over the TCP one-sided transport.
    Serve(TcpRemote),
    /// Reports this many bytes fewer than asked (after moving them all).
    Short(TcpRemote, u64),
    /// Reports every byte of a GET moved without sending one (a store that
    /// says more than it did); declines PUTs.
    Phantom,
}

#[derive(Clone)]
struct Object {
    data: Bytes,
    etag: String,
    headers: Vec<(String, String)>,
}

struct Upload {
    key: String,
    headers: Vec<(String, String)>,
    parts: BTreeMap<u64, (String, Bytes)>,
}

struct State {
    objects: BTreeMap<String, Object>,
    uploads: HashMap<String, Upload>,
    calls: Vec<Recorded>,
    versions: u64,
    ignore_if_match: bool,
    /// Moves the bytes whatever `x-sluice-rdma-object-max` says (a store
    /// other than Sluice's gateway).
    ignore_object_max: bool,
    rdma: RdmaMode,
    /// See [`MockStore::rgw_like`].
    rgw: bool,
    /// See [`MockStore::on_head`].
    on_head: Option<Arc<dyn Fn() + Send + Sync>>,
}

/// An in-memory bucket. Cheap to clone (clones share the bucket).
#[derive(Clone)]
pub struct MockStore {
    state: Arc<Mutex<State>>,
}

fn crc64(data: &[u8]) -> u64 {
    let mut d = sluice_dataplane::crc64::digest();
    d.update(data);
    d.finalize()
}

fn b64(v: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(v.to_be_bytes())
}

fn md5_of(data: &[u8]) -> [u8; 16] {
    use md5::Digest;
    let mut out = [0u8; 16];
    out.copy_from_slice(&md5::Md5::digest(data));
    out
}

fn err(status: u16, code: &str, key: &str) -> S3Error {
    S3Error::from_response(status, &format!("<Error><Code>{code}</Code><Message>mock</Message></Error>"), Some(key))
}

fn headers_of(pairs: &[(&str, String)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (n, v) in pairs {
        if let (Ok(n), Ok(v)) = (http::HeaderName::try_from(*n), http::HeaderValue::try_from(v.as_str())) {
            h.insert(n, v);
        }
    }
    h
}

/// A body delivered in 64 KiB chunks, as a socket would.
fn chunked(data: Bytes) -> super::client::Body {
    let chunks: Vec<Result<Bytes, S3Error>> =
        (0..data.len()).step_by(64 << 10).map(|i| Ok(data.slice(i..(i + (64 << 10)).min(data.len())))).collect();
    super::client::Body::from_stream(futures::stream::iter(chunks))
}

impl Default for MockStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MockStore {
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                objects: BTreeMap::new(),
                uploads: HashMap::new(),
                calls: Vec::new(),
                versions: 0,
                ignore_if_match: false,
                ignore_object_max: false,
                rdma: RdmaMode::Decline,
                rgw: false,
                on_head: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `data` as `key` (a new version, with a new ETag).
    pub fn insert(&self, key: &str, data: impl Into<Bytes>) {
        self.lock().store(key, data.into(), Vec::new(), None);
    }

    /// Treats checksums as Ceph RGW 16.2 does: `x-amz-checksum-*` is
    /// neither checked, kept nor returned; Content-MD5 is checked; ETags
    /// are MD5s (a multipart object's from its parts'), and
    /// CompleteMultipartUpload answers with an empty one.
    pub fn rgw_like(&self) {
        self.lock().rgw = true;
    }

    /// A stored object's ETag.
    pub fn etag(&self, key: &str) -> Option<String> {
        self.lock().objects.get(key).map(|o| o.etag.clone())
    }

    /// The bytes stored as `key`.
    pub fn object(&self, key: &str) -> Option<Bytes> {
        self.lock().objects.get(key).map(|o| o.data.clone())
    }

    /// A stored object's user and content headers.
    pub fn object_headers(&self, key: &str) -> Vec<(String, String)> {
        self.lock().objects.get(key).map(|o| o.headers.clone()).unwrap_or_default()
    }

    /// Multipart uploads neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.lock().uploads.len()
    }

    /// Every request answered so far.
    pub fn calls(&self) -> Vec<Recorded> {
        self.lock().calls.clone()
    }

    /// Answered requests of kind `op`.
    pub fn count(&self, op: Op) -> usize {
        self.lock().calls.iter().filter(|c| c.op == op).count()
    }

    /// Makes the store ignore `If-Match` (as some do).
    pub fn ignore_if_match(&self) {
        self.lock().ignore_if_match = true;
    }

    /// Makes the store ignore `x-sluice-rdma-object-max` (as any store
    /// but Sluice's gateway does).
    pub fn ignore_object_max(&self) {
        self.lock().ignore_object_max = true;
    }

    /// Runs `f` as each HEAD arrives (to look at the agent's state then).
    pub fn on_head(&self, f: impl Fn() + Send + Sync + 'static) {
        self.lock().on_head = Some(Arc::new(f));
    }

    pub fn set_rdma(&self, mode: RdmaMode) {
        self.lock().rdma = mode;
    }

    fn record(&self, op: Op, at: &Target<'_>) {
        self.record_call(Recorded {
            op,
            endpoint: at.endpoint.to_owned(),
            key: at.key.to_owned(),
            range: None,
            if_match: None,
            rdma: false,
            headers: Vec::new(),
        });
    }

    fn record_call(&self, call: Recorded) {
        self.lock().calls.push(call);
    }

    async fn rdma_get(&self, mode: RdmaMode, token: &RdmaToken, data: Bytes) -> Result<Option<u64>, S3Error> {
        let (remote, short) = match mode {
            RdmaMode::Decline => return Err(S3Error::RdmaDeclined("the mock declines RDMA".into())),
            RdmaMode::Ignore => return Ok(None),
            RdmaMode::Phantom => return Ok(Some(data.len() as u64)),
            RdmaMode::Serve(r) => (r, 0),
            RdmaMode::Short(r, by) => (r, by),
        };
        let t = Token::parse(&token.token).map_err(|e| err(400, "InvalidRDMAToken", &e.to_string()))?;
        let len = data.len() as u64;
        let body = futures::stream::iter([Ok::<_, std::io::Error>(data)]);
        remote.write_stream(&t, len, body).await.map_err(|e| err(500, "RDMATransferFailed", &e.to_string()))?;
        Ok(Some(len - short))
    }

    async fn rdma_put(&self, mode: RdmaMode, token: &RdmaToken, len: u64) -> Result<(Bytes, Option<u64>), S3Error> {
        let (remote, short) = match mode {
            RdmaMode::Decline | RdmaMode::Phantom => {
                return Err(S3Error::RdmaDeclined("the mock declines RDMA".into()))
            }
            // A store that ignores the token stores the empty body.
            RdmaMode::Ignore => return Ok((Bytes::new(), None)),
            RdmaMode::Serve(r) => (r, 0),
            RdmaMode::Short(r, by) => (r, by),
        };
        let t = Token::parse(&token.token).map_err(|e| err(400, "InvalidRDMAToken", &e.to_string()))?;
        let mut out = BytesMut::new();
        let mut s = std::pin::pin!(remote.read_stream(&t, len));
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.map_err(|e| err(500, "RDMATransferFailed", &e.to_string()))?);
        }
        Ok((out.freeze(), Some(len - short)))
    }
}

impl State {
    /// Stores a new version; its ETag is `etag`, else the MD5 (RGW-like),
    /// else one of the mock's own (unique per version, like an SSE ETag
    /// that is no MD5).
    fn store(&mut self, key: &str, data: Bytes, headers: Vec<(String, String)>, etag: Option<String>) -> String {
        self.versions += 1;
        let etag = match etag {
            Some(e) => e,
            None if self.rgw => format!("\"{}\"", hex::encode(md5_of(&data))),
            None => format!("\"{:016x}-{}\"", crc64(&data), self.versions),
        };
        self.objects.insert(key.to_owned(), Object { data, etag: etag.clone(), headers });
        etag
    }

    /// The checksum headers of a whole object, where the store keeps them.
    fn checksums(&self, data: &[u8]) -> Vec<(&'static str, String)> {
        if self.rgw {
            return Vec::new();
        }
        vec![("x-amz-checksum-crc64nvme", b64(crc64(data))), ("x-amz-checksum-type", "FULL_OBJECT".into())]
    }
}

fn object_headers(o: &Object) -> Vec<(&str, String)> {
    let mut h: Vec<(&str, String)> =
        vec![("etag", o.etag.clone()), ("last-modified", httpdate::fmt_http_date(std::time::UNIX_EPOCH))];
    h.extend(o.headers.iter().map(|(n, v)| (n.as_str(), v.clone())));
    h
}

/// Reads a PUT body that is not a token.
fn body_bytes(body: PutBody) -> Result<Bytes, S3Error> {
    match body {
        PutBody::Bytes(b) => Ok(b),
        PutBody::Region { region, offset, len } => {
            let mut out = vec![0u8; len as usize];
            region.read_at(offset, &mut out).map_err(|e| S3Error::Destination(e.to_string()))?;
            Ok(out.into())
        }
        PutBody::Rdma { .. } => Err(S3Error::Protocol("not a body".into())),
    }
}

impl S3Client for MockStore {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move {
            self.record(Op::Head, &at);
            let hook = self.lock().on_head.clone();
            if let Some(f) = hook {
                f();
            }
            let st = self.lock();
            let o = st.objects.get(at.key).ok_or_else(|| err(404, "NoSuchKey", at.key))?;
            let mut h = object_headers(o);
            h.push(("content-length", o.data.len().to_string()));
            h.extend(st.checksums(&o.data));
            Ok(headers_of(&h))
        })
    }

    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        Box::pin(async move {
            self.record_call(Recorded {
                op: Op::Get,
                endpoint: at.endpoint.to_owned(),
                key: at.key.to_owned(),
                range: Some((req.first, req.last)),
                if_match: req.if_match.map(str::to_owned),
                rdma: req.rdma.is_some(),
                headers: Vec::new(),
            });
            let (o, mode, sums, object_max) = {
                let st = self.lock();
                let o = st.objects.get(at.key).cloned().ok_or_else(|| err(404, "NoSuchKey", at.key))?;
                if req.if_match.is_some_and(|m| m != o.etag) && !st.ignore_if_match {
                    return Err(err(412, "PreconditionFailed", at.key));
                }
                let sums = st.checksums(&o.data);
                let object_max = req.object_max.filter(|_| !st.ignore_object_max);
                (o, st.rdma.clone(), sums, object_max)
            };
            let size = o.data.len() as u64;
            if req.first >= size {
                return Err(err(416, "InvalidRange", at.key));
            }
            let last = req.last.min(size - 1);
            let data = o.data.slice(req.first as usize..=last as usize);
            let mut h = object_headers(&o);
            h.push(("content-range", format!("bytes {}-{last}/{size}", req.first)));
            h.push(("content-length", data.len().to_string()));
            if req.checksum_mode && req.first == 0 && last + 1 == size {
                h.extend(sums);
            }
            let mut body = chunked(data.clone());
            if let Some(token) = &req.rdma {
                if let Some(max) = object_max.filter(|_| !matches!(mode, RdmaMode::Decline | RdmaMode::Ignore)) {
                    // As Sluice's gateway does: nothing moves for a bigger object.
                    if size > max {
                        h.push((REPLY_HEADER, "206".into()));
                        h.push((BYTES_HEADER, "0".into()));
                        h.push((FITS_HEADER, "no".into()));
                        let headers = headers_of(&h);
                        return Ok(Reply {
                            status: http::StatusCode::PARTIAL_CONTENT,
                            headers,
                            body: super::client::Body::empty(),
                        });
                    }
                    h.push((FITS_HEADER, "yes".into()));
                }
                if let Some(moved) = self.rdma_get(mode, token, data).await? {
                    h.push((REPLY_HEADER, "200".into()));
                    h.push((BYTES_HEADER, moved.to_string()));
                    body = super::client::Body::empty();
                }
            }
            Ok(Reply { status: http::StatusCode::PARTIAL_CONTENT, headers: headers_of(&h), body })
        })
    }

    fn list<'a>(&'a self, at: Target<'a>, q: ListQuery<'a>) -> S3Future<'a, ListPage> {
        Box::pin(async move {
            self.record(Op::List, &at);
            let st = self.lock();
            let max = if q.max_keys == 0 { 1000 } else { q.max_keys as usize };
            let mut page = ListPage::default();
            let mut taken = 0;
            let after = q.continuation_token;
            for (k, o) in st.objects.range(q.prefix.to_owned()..) {
                if !k.starts_with(q.prefix) {
                    break;
                }
                if !after.is_empty() && k.as_str() <= after {
                    continue;
                }
                if taken == max {
                    page.next_continuation_token =
                        page.objects.last().map(|m: &ObjectMeta| m.key.clone()).unwrap_or_default();
                    break;
                }
                let rest = &k[q.prefix.len()..];
                if let Some(i) = rest.find(q.delimiter).filter(|_| !q.delimiter.is_empty()) {
                    let p = format!("{}{}", q.prefix, &rest[..i + q.delimiter.len()]);
                    if page.common_prefixes.last() != Some(&p) {
                        page.common_prefixes.push(p);
                    }
                    continue;
                }
                taken += 1;
                page.objects.push(ObjectMeta {
                    key: k.clone(),
                    size: o.data.len() as u64,
                    etag: o.etag.clone(),
                    last_modified_unix_ms: 0,
                    content_type: String::new(),
                    crc64nvme: None,
                    agent_crc64nvme: None,
                });
            }
            Ok(page)
        })
    }

    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        Box::pin(async move {
            self.record(Op::Delete, &at);
            self.lock().objects.remove(at.key);
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
            let token = if let PutBody::Rdma { token, .. } = &body { Some(token.clone()) } else { None };
            self.record_call(Recorded {
                op: if part.is_some() { Op::UploadPart } else { Op::Put },
                endpoint: at.endpoint.to_owned(),
                key: at.key.to_owned(),
                range: None,
                if_match: None,
                rdma: token.is_some(),
                headers: headers.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect(),
            });
            let (data, moved) = match token {
                Some(t) => {
                    let mode = self.lock().rdma.clone();
                    self.rdma_put(mode, &t, body.size()).await?
                }
                None => (body_bytes(body)?, None),
            };
            let sent = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
            let md5 = md5_of(&data);
            if sent("content-md5").is_some_and(|w| w != base64::engine::general_purpose::STANDARD.encode(md5)) {
                return Err(err(400, "BadDigest", at.key));
            }
            let rgw = self.lock().rgw;
            let crc = sent("x-amz-checksum-crc64nvme").filter(|_| !rgw);
            if crc.is_some_and(|w| w != b64(crc64(&data))) {
                return Err(err(400, "BadDigest", at.key));
            }
            let kept: Vec<(String, String)> = headers
                .iter()
                .filter(|(n, _)| *n == "content-type" || n.starts_with("x-amz-meta-"))
                .map(|(n, v)| ((*n).to_owned(), v.clone()))
                .collect();
            let mut st = self.lock();
            let etag = match part {
                None => st.store(at.key, data, kept, None),
                Some(p) => {
                    let etag = match rgw {
                        true => format!("\"{}\"", hex::encode(md5)),
                        false => format!("\"part-{:016x}\"", crc64(&data)),
                    };
                    let up = st.uploads.get_mut(p.upload_id).ok_or_else(|| err(404, "NoSuchUpload", at.key))?;
                    up.parts.insert(p.number, (etag.clone(), data));
                    etag
                }
            };
            let mut h = vec![("etag", etag)];
            // As S3: the checksum it checked, echoed.
            if let Some(c) = crc {
                h.push(("x-amz-checksum-crc64nvme", c.to_owned()));
            }
            if let Some(m) = moved {
                h.push((REPLY_HEADER, "200".into()));
                h.push((BYTES_HEADER, m.to_string()));
            }
            Ok(headers_of(&h))
        })
    }

    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        Box::pin(async move {
            self.record_call(Recorded {
                op: Op::Create,
                endpoint: at.endpoint.to_owned(),
                key: at.key.to_owned(),
                range: None,
                if_match: None,
                rdma: false,
                headers: headers.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect(),
            });
            let mut st = self.lock();
            st.versions += 1;
            let id = format!("upload-{}", st.versions);
            let headers = headers.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect();
            st.uploads.insert(id.clone(), Upload { key: at.key.to_owned(), headers, parts: BTreeMap::new() });
            Ok(id)
        })
    }

    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        Box::pin(async move {
            self.record(Op::Complete, &at);
            let mut st = self.lock();
            let up = st.uploads.get(upload_id).ok_or_else(|| err(404, "NoSuchUpload", at.key))?;
            if up.key != at.key || up.parts.len() != etags.len() {
                return Err(err(400, "InvalidPart", at.key));
            }
            let mut data = BytesMut::new();
            let mut md5s = Vec::new();
            for (i, want) in etags.iter().enumerate() {
                match up.parts.get(&(i as u64 + 1)) {
                    Some((etag, bytes)) if etag == want => {
                        data.extend_from_slice(bytes);
                        md5s.extend_from_slice(&md5_of(bytes));
                    }
                    _ => return Err(err(400, "InvalidPart", at.key)),
                }
            }
            let headers = up.headers.clone();
            st.uploads.remove(upload_id);
            if !st.rgw {
                return Ok(st.store(at.key, data.freeze(), headers, None));
            }
            // RGW 16.2: S3's multipart ETag kept, but not told.
            let etag = format!("\"{}-{}\"", hex::encode(md5_of(&md5s)), etags.len());
            st.store(at.key, data.freeze(), headers, Some(etag));
            Ok(String::new())
        })
    }

    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        // Recorded when sent: callers make several and send until one works.
        let call = Recorded {
            op: Op::Abort,
            endpoint: at.endpoint.to_owned(),
            key: at.key.to_owned(),
            range: None,
            if_match: None,
            rdma: false,
            headers: Vec::new(),
        };
        let (this, id) = (self.clone(), upload_id.to_owned());
        Box::pin(async move {
            this.record_call(call);
            this.lock().uploads.remove(&id);
            Ok(())
        })
    }
}
