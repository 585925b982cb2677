//! Reading and writing one object: conditional requests, ranges, checksums.

use std::io::Write;
use std::ops::Range as Span;
use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use super::{b64, Checksums, DirStore, ObjectMeta, TempFile};

/// An object opened for a GET or HEAD whose preconditions held.
pub struct Opened {
    pub file: std::fs::File,
    pub meta: ObjectMeta,
    pub modified: SystemTime,
    /// The bytes to send and whether that is a range of the object.
    pub span: Span<u64>,
    pub ranged: bool,
}

/// The conditional headers of a GET or HEAD.
#[derive(Default, Clone)]
pub struct Preconditions {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    pub if_modified_since: Option<Timestamp>,
    pub if_unmodified_since: Option<Timestamp>,
}

fn seconds(t: SystemTime) -> i64 {
    time::OffsetDateTime::from(t).unix_timestamp()
}

fn ts_seconds(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

fn matches(cond: &ETagCondition, etag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == etag,
    }
}

impl Preconditions {
    /// RFC 9110 section 13.2.2, as S3 applies it: If-Match (else
    /// If-Unmodified-Since) failing is 412; then If-None-Match (else
    /// If-Modified-Since) failing is 304.
    pub fn check(&self, etag: &str, modified: SystemTime) -> S3Result<()> {
        let m = seconds(modified);
        match (&self.if_match, &self.if_unmodified_since) {
            (Some(c), _) if !matches(c, etag) => {
                return Err(s3_error!(PreconditionFailed, "If-Match: the object's ETag is \"{etag}\""))
            }
            (None, Some(t)) if m > ts_seconds(t) => {
                return Err(s3_error!(PreconditionFailed, "If-Unmodified-Since: the object was modified since"))
            }
            _ => {}
        }
        match (&self.if_none_match, &self.if_modified_since) {
            (Some(c), _) if matches(c, etag) => Err(S3Error::new(S3ErrorCode::NotModified)),
            (None, Some(t)) if m <= ts_seconds(t) => Err(S3Error::new(S3ErrorCode::NotModified)),
            _ => Ok(()),
        }
    }
}

/// Opens `key` for a GET/HEAD: preconditions, then the range.
pub fn open(
    store: &DirStore,
    bucket: &str,
    key: &str,
    pre: &Preconditions,
    range: Option<Range>,
    part_number: Option<i32>,
) -> S3Result<Opened> {
    let (file, meta, st) = store.open_object(bucket, key).map_err(super::s3::store_error)?;
    let modified = st.modified().unwrap_or(std::time::UNIX_EPOCH);
    pre.check(&meta.etag, modified)?;
    if let Some(n) = part_number {
        // Parts are not kept apart once an upload completes; part 1 of a
        // single-part object is the object.
        if n != 1 || meta.parts.is_some_and(|p| p > 1) {
            return Err(s3_error!(InvalidPart, "this store serves partNumber=1 of single-part objects only"));
        }
    }
    let size = meta.size;
    let (span, ranged) = match range {
        None => (0..size, false),
        Some(r) => {
            // No byte of an empty object is satisfiable, a suffix range's
            // neither (it was answered 206 with `bytes 0-0/0`).
            let s = r.check(size).ok().filter(|s| !s.is_empty()).ok_or_else(|| {
                s3_error!(
                    InvalidRange,
                    "the range {} is not satisfiable for a {size}-byte object",
                    r.to_header_string()
                )
            })?;
            (s, true)
        }
    };
    Ok(Opened { file, meta, modified, span, ranged })
}

/// The user-visible fields both GET and HEAD return.
fn with_checksums(meta: &ObjectMeta, whole: bool, mode: Option<&ChecksumMode>) -> (Checksums, Option<ChecksumType>) {
    // As S3: only when asked for (x-amz-checksum-mode: ENABLED) and only
    // for the whole object.
    let want = mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED));
    if !want || !whole {
        return (Checksums::default(), None);
    }
    (meta.checksums.clone(), Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT)))
}

fn user_metadata(meta: &ObjectMeta) -> Option<Metadata> {
    (!meta.metadata.is_empty()).then(|| meta.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub fn get_output(o: &Opened, mode: Option<&ChecksumMode>) -> GetObjectOutput {
    let m = &o.meta;
    let (sums, sum_type) = with_checksums(m, !o.ranged || o.span == (0..m.size), mode);
    GetObjectOutput {
        accept_ranges: Some("bytes".into()),
        content_length: Some((o.span.end - o.span.start) as i64),
        content_range: o.ranged.then(|| format!("bytes {}-{}/{}", o.span.start, o.span.end.max(1) - 1, m.size)),
        e_tag: Some(ETag::Strong(m.etag.clone())),
        last_modified: Some(o.modified.into()),
        content_type: m.content_type.clone(),
        content_encoding: m.content_encoding.clone(),
        content_disposition: m.content_disposition.clone(),
        content_language: m.content_language.clone(),
        cache_control: m.cache_control.clone(),
        metadata: user_metadata(m),
        checksum_crc64nvme: sums.crc64nvme,
        checksum_crc32: sums.crc32,
        checksum_crc32c: sums.crc32c,
        checksum_sha1: sums.sha1,
        checksum_sha256: sums.sha256,
        checksum_type: sum_type,
        parts_count: m.parts.map(|p| p as i32),
        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        ..Default::default()
    }
}

pub fn head_output(o: &Opened, mode: Option<&ChecksumMode>) -> HeadObjectOutput {
    let g = get_output(o, mode);
    HeadObjectOutput {
        accept_ranges: g.accept_ranges,
        content_length: g.content_length,
        content_range: g.content_range,
        e_tag: g.e_tag,
        last_modified: g.last_modified,
        content_type: g.content_type,
        content_encoding: g.content_encoding,
        content_disposition: g.content_disposition,
        content_language: g.content_language,
        cache_control: g.cache_control,
        metadata: g.metadata,
        checksum_crc64nvme: g.checksum_crc64nvme,
        checksum_crc32: g.checksum_crc32,
        checksum_crc32c: g.checksum_crc32c,
        checksum_sha1: g.checksum_sha1,
        checksum_sha256: g.checksum_sha256,
        checksum_type: g.checksum_type,
        parts_count: g.parts_count,
        storage_class: g.storage_class,
        ..Default::default()
    }
}

/// What the client said the body's digests are (headers or trailers).
#[derive(Default, Clone, Debug)]
pub struct Expected {
    pub content_md5: Option<String>,
    pub sums: Checksums,
    /// `x-amz-sdk-checksum-algorithm` / `x-amz-checksum-algorithm`: a
    /// checksum that will arrive in a trailer.
    pub algorithm: Option<String>,
}

impl Expected {
    fn hasher(&self) -> ChecksumHasher {
        let mut h = ChecksumHasher::default();
        let alg = self.algorithm.as_deref().map(str::to_ascii_uppercase);
        let alg = alg.as_deref();
        if self.sums.crc32.is_some() || alg == Some("CRC32") {
            h.crc32 = Some(Default::default());
        }
        if self.sums.crc32c.is_some() || alg == Some("CRC32C") {
            h.crc32c = Some(Default::default());
        }
        if self.sums.sha1.is_some() || alg == Some("SHA1") {
            h.sha1 = Some(Default::default());
        }
        if self.sums.sha256.is_some() || alg == Some("SHA256") {
            h.sha256 = Some(Default::default());
        }
        // Always: the full-object CRC64NVME every object carries.
        h.crc64nvme = Some(Default::default());
        h
    }

    /// Takes checksums sent as trailers (aws-chunked uploads).
    pub fn add_trailers(&mut self, trailers: Option<s3s::TrailingHeaders>) -> S3Result<()> {
        let Some(map) = trailers.and_then(|t| t.take()) else { return Ok(()) };
        let get = |name: &str| -> S3Result<Option<String>> {
            map.get(name)
                .map(|v| v.to_str().map(str::to_owned).map_err(|_| s3_error!(InvalidArgument, "{name} is not ASCII")))
                .transpose()
        };
        for (name, slot) in [
            ("x-amz-checksum-crc32", &mut self.sums.crc32),
            ("x-amz-checksum-crc32c", &mut self.sums.crc32c),
            ("x-amz-checksum-sha1", &mut self.sums.sha1),
            ("x-amz-checksum-sha256", &mut self.sums.sha256),
            ("x-amz-checksum-crc64nvme", &mut self.sums.crc64nvme),
        ] {
            if let Some(v) = get(name)? {
                *slot = Some(v);
            }
        }
        Ok(())
    }
}

/// A body received into a temporary file, with its digests.
pub struct Received {
    pub tmp: TempFile,
    pub md5: [u8; 16],
    pub sums: Checksums,
    pub size: u64,
}

struct Sink {
    file: std::fs::File,
    md5: s3s::crypto::Md5,
    sums: ChecksumHasher,
    buf: Vec<u8>,
}

const BLOCK: usize = 1 << 20;

/// Streams `body` into a temporary file, hashing as it goes (off the async
/// threads, a block at a time). `expect_len`, when given, must match.
pub async fn receive(
    store: &Arc<DirStore>,
    body: Option<StreamingBlob>,
    expected: &Expected,
    expect_len: Option<i64>,
) -> S3Result<Received> {
    let s = store.clone();
    let mut tmp = tokio::task::spawn_blocking(move || s.temp_file())
        .await
        .map_err(S3Error::internal_error)?
        .map_err(super::s3::store_error)?;
    let file = tmp.file.take().expect("fresh temp file");
    let mut sink = Some(Sink { file, md5: s3s::crypto::Md5::new(), sums: expected.hasher(), buf: Vec::new() });
    let mut size = 0u64;
    let flush = |mut k: Sink, data: Vec<u8>| async move {
        tokio::task::spawn_blocking(move || {
            k.md5.update(&data);
            k.sums.update(&data);
            k.file.write_all(&data).map(|()| {
                k.buf = data;
                k.buf.clear();
                k
            })
        })
        .await
        .map_err(S3Error::internal_error)?
        .map_err(|e| super::s3::store_error(super::StoreError::Io { what: "writing the object".into(), source: e }))
    };
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "the request body failed: {e}"))?;
            size += chunk.len() as u64;
            let k = sink.as_mut().expect("sink is back after each flush");
            k.buf.extend_from_slice(&chunk);
            if k.buf.len() >= BLOCK {
                let mut k = sink.take().expect("sink");
                let data = std::mem::take(&mut k.buf);
                sink = Some(flush(k, data).await?);
            }
        }
    }
    let mut k = sink.take().expect("sink");
    let data = std::mem::take(&mut k.buf);
    let k = flush(k, data).await?;
    if let Some(n) = expect_len {
        if n >= 0 && n as u64 != size {
            return Err(s3_error!(IncompleteBody, "Content-Length said {n} bytes; the body had {size}"));
        }
    }
    let md5: [u8; 16] = k.md5.finalize();
    let got = k.sums.finalize();
    tmp.file = None;
    let sums = Checksums {
        crc64nvme: got.checksum_crc64nvme,
        crc32: got.checksum_crc32,
        crc32c: got.checksum_crc32c,
        sha1: got.checksum_sha1,
        sha256: got.checksum_sha256,
    };
    Ok(Received { tmp, md5, sums, size })
}

/// Checks the received digests against what the client sent (BadDigest on
/// any difference); returns the checksums to store.
pub fn verify(r: &Received, expected: &Expected) -> S3Result<Checksums> {
    if let Some(want) = &expected.content_md5 {
        if *want != b64(&r.md5) {
            return Err(s3_error!(BadDigest, "Content-MD5 {want} does not match the body ({})", b64(&r.md5)));
        }
    }
    let pairs = [
        ("crc64nvme", &expected.sums.crc64nvme, &r.sums.crc64nvme),
        ("crc32", &expected.sums.crc32, &r.sums.crc32),
        ("crc32c", &expected.sums.crc32c, &r.sums.crc32c),
        ("sha1", &expected.sums.sha1, &r.sums.sha1),
        ("sha256", &expected.sums.sha256, &r.sums.sha256),
    ];
    for (name, want, got) in pairs {
        if let Some(w) = want {
            if Some(w) != got.as_ref() {
                return Err(s3_error!(
                    BadDigest,
                    "x-amz-checksum-{name} {w} does not match the body ({})",
                    got.as_deref().unwrap_or("not computed")
                ));
            }
        }
    }
    // The hasher ran exactly the algorithms asked for (plus CRC64NVME,
    // always), and each one sent matched: keep them all.
    Ok(r.sums.clone())
}

/// The standard attributes of a new object.
#[derive(Default)]
pub struct Attributes {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub content_disposition: Option<String>,
    pub content_language: Option<String>,
    pub cache_control: Option<String>,
    pub metadata: Option<Metadata>,
}

impl Attributes {
    pub fn into_meta(self, etag: String, checksums: Checksums) -> ObjectMeta {
        ObjectMeta {
            etag,
            content_type: self.content_type,
            content_encoding: self.content_encoding,
            content_disposition: self.content_disposition,
            content_language: self.content_language,
            cache_control: self.cache_control,
            metadata: self.metadata.unwrap_or_default().into_iter().collect(),
            checksums,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs(secs)
    }
    fn ts(secs: u64) -> Timestamp {
        at(secs).into()
    }
    fn etag(v: &str) -> ETagCondition {
        ETagCondition::ETag(ETag::Strong(v.into()))
    }
    fn code(r: S3Result<()>) -> Option<String> {
        r.err().map(|e| e.code().as_str().to_owned())
    }

    #[test]
    fn preconditions_follow_s3() {
        let t = at(1_000_000);
        let p = |f: &dyn Fn(&mut Preconditions)| {
            let mut p = Preconditions::default();
            f(&mut p);
            code(p.check("abc", t))
        };
        assert_eq!(p(&|_| {}), None);
        assert_eq!(p(&|p| p.if_match = Some(etag("abc"))), None);
        assert_eq!(p(&|p| p.if_match = Some(ETagCondition::Any)), None);
        assert_eq!(p(&|p| p.if_match = Some(etag("other"))).as_deref(), Some("PreconditionFailed"));
        assert_eq!(p(&|p| p.if_none_match = Some(etag("abc"))).as_deref(), Some("NotModified"));
        assert_eq!(p(&|p| p.if_none_match = Some(etag("other"))), None);
        assert_eq!(p(&|p| p.if_modified_since = Some(ts(1_000_000))).as_deref(), Some("NotModified"));
        assert_eq!(p(&|p| p.if_modified_since = Some(ts(999_999))), None);
        assert_eq!(p(&|p| p.if_unmodified_since = Some(ts(999_999))).as_deref(), Some("PreconditionFailed"));
        assert_eq!(p(&|p| p.if_unmodified_since = Some(ts(1_000_000))), None);
        // If-Match holding overrides If-Unmodified-Since; If-None-Match
        // not matching overrides If-Modified-Since (S3's documented pairs).
        assert_eq!(
            p(&|p| {
                p.if_match = Some(etag("abc"));
                p.if_unmodified_since = Some(ts(1));
            }),
            None
        );
        assert_eq!(
            p(&|p| {
                p.if_none_match = Some(etag("other"));
                p.if_modified_since = Some(ts(2_000_000));
            }),
            None
        );
    }
}
