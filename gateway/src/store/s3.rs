//! The directory store as an `s3s` S3 service.

use std::sync::Arc;

use http::StatusCode;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};

use super::object::{self, Attributes, Expected, Preconditions};
use super::{keys, list, multipart, Checksums, DirStore, KeyError, StoreError, WriteCond};

/// The S3 face of a [`DirStore`].
#[derive(Clone)]
pub struct Store(pub Arc<DirStore>);

/// A store error as the S3 error a client should see.
pub fn store_error(e: StoreError) -> S3Error {
    let custom = |code: &str, status: StatusCode, msg: String| {
        let mut e = S3Error::with_message(S3ErrorCode::Custom(code.to_owned().into()), msg);
        e.set_status_code(status);
        e
    };
    match e {
        StoreError::NoSuchBucket(b) => s3_error!(NoSuchBucket, "the bucket {b:?} does not exist"),
        StoreError::NoSuchKey(k) => s3_error!(NoSuchKey, "no object with key {k:?}"),
        StoreError::Precondition(m) => s3_error!(PreconditionFailed, "{m}"),
        StoreError::Key(k @ (KeyError::TooLong(_) | KeyError::SegmentTooLong(_))) => {
            s3_error!(KeyTooLongError, "{k}")
        }
        StoreError::Key(k @ KeyError::BadBucket(_)) => s3_error!(InvalidBucketName, "{k}"),
        StoreError::Key(k @ KeyError::Conflict { .. }) => custom("KeyConflict", StatusCode::BAD_REQUEST, k.to_string()),
        StoreError::Key(k @ KeyError::Empty) => s3_error!(InvalidArgument, "{k}"),
        StoreError::Abandoned => s3_error!(InternalError, "{e}"),
        StoreError::Io { what, source } if source.kind() == std::io::ErrorKind::StorageFull => {
            tracing::warn!(%what, "the store is out of space");
            custom(
                "InsufficientStorage",
                StatusCode::INSUFFICIENT_STORAGE,
                format!("the store is out of space: {what}: {source}"),
            )
        }
        StoreError::Io { what, source } => {
            tracing::warn!(%what, error = %source, "the store failed a request");
            s3_error!(InternalError, "backend error: {what}: {source}")
        }
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> S3Result<T> + Send + 'static) -> S3Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(S3Error::internal_error)?
}

/// Set when the request it belongs to is dropped (its connection ended, the
/// idle limit included) while a blocking task works for it: that task then
/// commits nothing ([`DirStore::commit_object_unless`]).
struct GoneOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl GoneOnDrop {
    fn new() -> Self {
        Self(Default::default())
    }

    fn flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.0.clone()
    }
}

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A key this store can hold (checked before a body is read).
fn check_key(key: &str) -> S3Result<()> {
    keys::key_to_path(key).map(|_| ()).map_err(|e| store_error(e.into()))
}

fn preconditions(
    if_match: Option<ETagCondition>,
    if_none_match: Option<ETagCondition>,
    if_modified_since: Option<Timestamp>,
    if_unmodified_since: Option<Timestamp>,
) -> Preconditions {
    Preconditions { if_match, if_none_match, if_modified_since, if_unmodified_since }
}

/// Opens an object for a GET: what both the HTTP body and the one-sided
/// transfer (`crate::rdma`) serve from, so both send exactly the bytes of
/// the version whose ETag they report.
pub async fn open_for_get(store: &Arc<DirStore>, input: &GetObjectInput) -> S3Result<object::Opened> {
    let pre = preconditions(
        input.if_match.clone(),
        input.if_none_match.clone(),
        input.if_modified_since.clone(),
        input.if_unmodified_since.clone(),
    );
    let (s, b, k, r, pn) = (store.clone(), input.bucket.clone(), input.key.clone(), input.range, input.part_number);
    blocking(move || object::open(&s, &b, &k, &pre, r, pn)).await
}

/// The standard attributes of a PutObject, CopyObject or
/// CreateMultipartUpload input.
macro_rules! attributes {
    ($i:expr) => {
        Attributes {
            content_type: $i.content_type,
            content_encoding: $i.content_encoding,
            content_disposition: $i.content_disposition,
            content_language: $i.content_language,
            cache_control: $i.cache_control,
            metadata: $i.metadata,
        }
    };
}

/// Receives the body of a PutObject or UploadPart input and checks it
/// against the digests the client sent (headers or trailers).
macro_rules! receive_checked {
    ($self:ident, $i:ident, $req:ident) => {{
        let sums = Checksums {
            crc64nvme: $i.checksum_crc64nvme,
            crc32: $i.checksum_crc32,
            crc32c: $i.checksum_crc32c,
            sha1: $i.checksum_sha1,
            sha256: $i.checksum_sha256,
        };
        let algorithm = $i.checksum_algorithm.as_ref().map(|a| a.as_str().to_owned());
        let mut expected = Expected { content_md5: $i.content_md5, sums, algorithm };
        let received = object::receive(&$self.0, $i.body, &expected, $i.content_length).await?;
        expected.add_trailers($req.trailing_headers)?;
        let sums = object::verify(&received, &expected)?;
        (received, sums)
    }};
}

fn write_cond(if_match: Option<ETagCondition>, if_none_match: Option<ETagCondition>) -> S3Result<WriteCond> {
    Ok(match (if_match, if_none_match) {
        (Some(ETagCondition::ETag(e)), _) => WriteCond::IfMatch(e.value().to_owned()),
        (Some(ETagCondition::Any), _) => return Err(s3_error!(NotImplemented, "If-Match: * on a write")),
        (None, Some(ETagCondition::Any)) => WriteCond::IfAbsent,
        (None, Some(_)) => return Err(s3_error!(NotImplemented, "If-None-Match with an ETag on a write (only *)")),
        (None, None) => WriteCond::Always,
    })
}

fn owner() -> Owner {
    Owner { display_name: Some("sluice".into()), id: Some("sluice".into()) }
}

/// Objects of a listing page with their metadata (objects deleted since
/// the walk are left out).
async fn describe(
    store: &Arc<DirStore>,
    bucket: &str,
    page: list::Page,
    with_owner: bool,
    url: bool,
) -> S3Result<(Vec<Object>, Vec<CommonPrefix>)> {
    let (s, b) = (store.clone(), bucket.to_owned());
    let objects = blocking(move || {
        let mut out = Vec::with_capacity(page.objects.len());
        for (key, _) in page.objects {
            match s.open_object(&b, &key) {
                Ok((_, meta, st)) => out.push(Object {
                    e_tag: Some(ETag::Strong(meta.etag)),
                    last_modified: Some(st.modified().unwrap_or(std::time::UNIX_EPOCH).into()),
                    size: Some(meta.size as i64),
                    storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                    checksum_algorithm: meta
                        .checksums
                        .crc64nvme
                        .is_some()
                        .then(|| vec![ChecksumAlgorithm::from_static(ChecksumAlgorithm::CRC64NVME)]),
                    checksum_type: meta
                        .checksums
                        .crc64nvme
                        .is_some()
                        .then(|| ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
                    owner: with_owner.then(owner),
                    key: Some(if url { keys::url_encode(&key) } else { key }),
                    ..Default::default()
                }),
                Err(StoreError::NoSuchKey(_)) => {}
                Err(e) => return Err(store_error(e)),
            }
        }
        Ok(out)
    })
    .await?;
    let prefixes = page
        .prefixes
        .into_iter()
        .map(|p| CommonPrefix { prefix: Some(if url { keys::url_encode(&p) } else { p }) })
        .collect();
    Ok((objects, prefixes))
}

fn wants_url(e: &Option<EncodingType>) -> S3Result<bool> {
    match e.as_ref().map(|e| e.as_str()) {
        None => Ok(false),
        Some(s) if s.eq_ignore_ascii_case("url") => Ok(true),
        Some(s) => Err(s3_error!(InvalidArgument, "encoding-type {s:?}: only \"url\" is supported")),
    }
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must be >= 0")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn enc(url: bool, s: Option<String>) -> Option<String> {
    s.map(|s| if url { keys::url_encode(&s) } else { s })
}

fn token_encode(key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

fn token_decode(t: &str) -> S3Result<String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not one this store issued"))
}

/// One page of a listing, described.
struct Listed {
    url: bool,
    max: usize,
    truncated: bool,
    last: Option<String>,
    contents: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
}

impl Store {
    #[allow(clippy::too_many_arguments)]
    async fn list(
        &self,
        bucket: &str,
        encoding: &Option<EncodingType>,
        max_keys_: Option<i32>,
        prefix: &Option<String>,
        delimiter: &Option<String>,
        after: Option<String>,
        with_owner: bool,
    ) -> S3Result<Listed> {
        let url = wants_url(encoding)?;
        let max = max_keys(max_keys_)?;
        let dir = self.0.bucket_dir(bucket).map_err(store_error)?;
        let (prefix, delim) = (prefix.clone().unwrap_or_default(), delimiter.clone());
        let page =
            blocking(move || list::page(&dir, &prefix, delim.as_deref(), after.as_deref(), max).map_err(store_error))
                .await?;
        let (truncated, last) = (page.truncated, page.last.clone());
        let (contents, prefixes) = describe(&self.0, bucket, page, with_owner, url).await?;
        Ok(Listed { url, max, truncated, last, contents, prefixes })
    }
}

#[async_trait::async_trait]
impl S3 for Store {
    async fn list_buckets(&self, _: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let s = self.0.clone();
        let names = blocking(move || s.buckets().map_err(store_error)).await?;
        let buckets = names
            .into_iter()
            .map(|(name, t)| Bucket { name: Some(name), creation_date: Some(t.into()), ..Default::default() })
            .collect();
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets), owner: Some(owner()), ..Default::default() }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let (s, b) = (self.0.clone(), req.input.bucket.clone());
        if !blocking(move || s.create_bucket(&b).map_err(store_error)).await? {
            return Err(s3_error!(BucketAlreadyOwnedByYou, "the bucket {:?} exists and is yours", req.input.bucket));
        }
        Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{}", req.input.bucket)) }))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        self.0.bucket_dir(&req.input.bucket).map_err(store_error)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.0.bucket_dir(&req.input.bucket).map_err(store_error)?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let (s, b) = (self.0.clone(), req.input.bucket.clone());
        if !blocking(move || s.delete_bucket(&b).map_err(store_error)).await? {
            return Err(s3_error!(BucketNotEmpty, "the bucket {:?} still holds objects", req.input.bucket));
        }
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let o = open_for_get(&self.0, &req.input).await?;
        let mut out = object::get_output(&o, req.input.checksum_mode.as_ref());
        let body = sluice_dataplane::file::span_stream(o.file, o.span.start, o.span.end - o.span.start, 1 << 20);
        out.body = Some(StreamingBlob::wrap(body));
        let mut resp = S3Response::new(out);
        if o.ranged {
            resp.status = Some(StatusCode::PARTIAL_CONTENT);
        }
        Ok(resp)
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = req.input;
        let pre = preconditions(i.if_match, i.if_none_match, i.if_modified_since, i.if_unmodified_since);
        let (s, b, k, r, pn) = (self.0.clone(), i.bucket, i.key, i.range, i.part_number);
        let o = blocking(move || object::open(&s, &b, &k, &pre, r, pn)).await?;
        Ok(S3Response::new(object::head_output(&o, i.checksum_mode.as_ref())))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let i = req.input;
        self.0.bucket_dir(&i.bucket).map_err(store_error)?;
        check_key(&i.key)?;
        let cond = write_cond(i.if_match, i.if_none_match)?;
        let (received, sums) = receive_checked!(self, i, req);
        let attrs = attributes!(i);
        let meta = attrs.into_meta(hex::encode(received.md5), sums);
        let (s, b, k) = (self.0.clone(), i.bucket, i.key);
        let guard = GoneOnDrop::new();
        let gone = guard.flag();
        let meta =
            blocking(move || s.commit_object_unless(&b, &k, received.tmp, meta, &cond, &gone).map_err(store_error))
                .await?;
        drop(guard);
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(meta.etag)),
            checksum_crc64nvme: meta.checksums.crc64nvme,
            checksum_crc32: meta.checksums.crc32,
            checksum_crc32c: meta.checksums.crc32c,
            checksum_sha1: meta.checksums.sha1,
            checksum_sha256: meta.checksums.sha256,
            checksum_type: Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            ..Default::default()
        }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let i = req.input;
        let CopySource::Bucket { bucket: sb, key: sk, .. } = &i.copy_source else {
            return Err(s3_error!(NotImplemented, "copy sources other than bucket/key"));
        };
        let (sb, sk) = (sb.to_string(), sk.to_string());
        check_key(&i.key)?;
        let pre = preconditions(
            i.copy_source_if_match,
            i.copy_source_if_none_match,
            i.copy_source_if_modified_since,
            i.copy_source_if_unmodified_since,
        );
        let replace = i.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let attrs = attributes!(i);
        let (s, b, k) = (self.0.clone(), i.bucket, i.key);
        let guard = GoneOnDrop::new();
        let gone = guard.flag();
        let meta = blocking(move || {
            let o = object::open(&s, &sb, &sk, &pre, None, None).map_err(|e| {
                // A source precondition that fails is 412 for a copy, never 304.
                if *e.code() == S3ErrorCode::NotModified {
                    s3_error!(PreconditionFailed, "copy source not modified")
                } else {
                    e
                }
            })?;
            s.bucket_dir(&b).map_err(store_error)?;
            let mut tmp = s.temp_file().map_err(store_error)?;
            let mut out = tmp.file.take().expect("fresh temp file");
            let mut src = o.file;
            std::io::copy(&mut src, &mut out)
                .map_err(|e| store_error(StoreError::Io { what: "copying the object".into(), source: e }))?;
            drop(out);
            let mut meta = if replace { attrs.into_meta(String::new(), Checksums::default()) } else { o.meta.clone() };
            meta.etag = o.meta.etag.clone();
            meta.checksums = o.meta.checksums.clone();
            meta.parts = o.meta.parts;
            s.commit_object_unless(&b, &k, tmp, meta, &WriteCond::Always, &gone).map_err(store_error)
        })
        .await?;
        drop(guard);
        let result = CopyObjectResult {
            e_tag: Some(ETag::Strong(meta.etag)),
            last_modified: Some(std::time::SystemTime::now().into()),
            ..Default::default()
        };
        Ok(S3Response::new(CopyObjectOutput { copy_object_result: Some(result), ..Default::default() }))
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let (s, b, k) = (self.0.clone(), req.input.bucket, req.input.key);
        blocking(move || s.delete_object(&b, &k).map_err(store_error)).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let i = req.input;
        self.0.bucket_dir(&i.bucket).map_err(store_error)?;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys per DeleteObjects"));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let (s, b) = (self.0.clone(), i.bucket);
        let keys_: Vec<String> = i.delete.objects.into_iter().map(|o| o.key).collect();
        let (deleted, errors) = blocking(move || {
            let (mut deleted, mut errors) = (Vec::new(), Vec::new());
            for k in keys_ {
                match s.delete_object(&b, &k) {
                    Ok(()) if quiet => {}
                    Ok(()) => deleted.push(DeletedObject { key: Some(k), ..Default::default() }),
                    Err(e) => {
                        let e = store_error(e);
                        errors.push(Error {
                            code: Some(e.code().as_str().to_owned()),
                            message: e.message().map(str::to_owned),
                            key: Some(k),
                            ..Default::default()
                        });
                    }
                }
            }
            Ok((deleted, errors))
        })
        .await?;
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: (!deleted.is_empty()).then_some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let Listed { url, max, truncated, last, contents, prefixes } =
            self.list(&i.bucket, &i.encoding_type, i.max_keys, &i.prefix, &i.delimiter, i.marker.clone(), true).await?;
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: enc(url, i.prefix),
            delimiter: enc(url, i.delimiter),
            marker: enc(url, i.marker),
            next_marker: if truncated { enc(url, last) } else { None },
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            contents: (!contents.is_empty()).then_some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let resume = i.continuation_token.as_deref().map(token_decode).transpose()?;
        // Resume after the later of the token and start-after.
        let after = match (resume, i.start_after.clone()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let owner = i.fetch_owner == Some(true);
        let Listed { url, max, truncated, last, contents, prefixes } =
            self.list(&i.bucket, &i.encoding_type, i.max_keys, &i.prefix, &i.delimiter, after, owner).await?;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: enc(url, i.prefix),
            delimiter: enc(url, i.delimiter),
            start_after: enc(url, i.start_after),
            continuation_token: i.continuation_token,
            next_continuation_token: if truncated { last.as_deref().map(token_encode) } else { None },
            key_count: Some((contents.len() + prefixes.len()) as i32),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            contents: (!contents.is_empty()).then_some(contents),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = req.input;
        let attrs = attributes!(i);
        let up = multipart::Upload {
            bucket: i.bucket.clone(),
            key: i.key.clone(),
            meta: attrs.into_meta(String::new(), Checksums::default()),
            checksum_algorithm: i.checksum_algorithm.as_ref().map(|a| a.as_str().to_owned()),
        };
        let s = self.0.clone();
        let id = blocking(move || s.create_upload(&up).map_err(store_error)).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            checksum_algorithm: i.checksum_algorithm,
            ..Default::default()
        }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let i = req.input;
        let (dir, _) = self.0.upload(&i.upload_id, &i.bucket, &i.key)?;
        // Checked before the body is taken (put_part checks again): a part
        // number out of range was refused only after up to 5 GiB were stored.
        let max = super::multipart::MAX_PART_NUMBER;
        if !(1..=max).contains(&i.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to {max}, not {}", i.part_number));
        }
        // A part on its way keeps the upload from expiring (crate::expiry).
        let _ = std::fs::File::options()
            .write(true)
            .open(dir.join("upload.json"))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        let (received, sums) = receive_checked!(self, i, req);
        let (s, n) = (self.0.clone(), i.part_number);
        let info = blocking(move || s.put_part(&dir, n, received)).await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(info.etag)),
            checksum_crc64nvme: sums.crc64nvme,
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let full_crc = req.headers.get("x-amz-checksum-crc64nvme").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let i = req.input;
        let (dir, up) = self.0.upload(&i.upload_id, &i.bucket, &i.key)?;
        let cond = write_cond(i.if_match, i.if_none_match)?;
        let listed: Vec<(i32, String)> = i
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.part_number.unwrap_or(0), p.e_tag.map(|e| e.value().to_owned()).unwrap_or_default()))
            .collect();
        let s = self.0.clone();
        let guard = GoneOnDrop::new();
        let gone = guard.flag();
        let meta = blocking(move || s.complete_upload(&dir, up, &listed, full_crc.as_deref(), &cond, &gone)).await?;
        drop(guard);
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            location: Some(format!("/{}/{}", i.bucket, i.key)),
            e_tag: Some(ETag::Strong(meta.etag)),
            checksum_type: Some(ChecksumType::from_static(ChecksumType::FULL_OBJECT)),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = req.input;
        let (dir, _) = self.0.upload(&i.upload_id, &i.bucket, &i.key)?;
        let s = self.0.clone();
        blocking(move || s.abort_upload(&dir).map_err(store_error)).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let i = req.input;
        let (dir, _) = self.0.upload(&i.upload_id, &i.bucket, &i.key)?;
        let marker = i.part_number_marker.unwrap_or(0);
        let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let s = self.0.clone();
        let all = blocking(move || s.parts(&dir).map_err(store_error)).await?;
        let mut parts: Vec<Part> = all
            .range(marker.saturating_add(1)..)
            .map(|(n, (info, when))| Part {
                part_number: Some(*n),
                e_tag: Some(ETag::Strong(info.etag.clone())),
                size: Some(info.size as i64),
                last_modified: Some((*when).into()),
                ..Default::default()
            })
            .take(max + 1)
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            part_number_marker: Some(marker),
            next_part_number_marker: parts.last().and_then(|p| p.part_number).filter(|_| truncated),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        let (s, b) = (self.0.clone(), i.bucket.clone());
        let all = blocking(move || s.uploads(&b).map_err(store_error)).await?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = i.max_uploads.map_or(1000, |m| m.clamp(1, 1000)) as usize;
        let (key_marker, id_marker) =
            (i.key_marker.clone().unwrap_or_default(), i.upload_id_marker.clone().unwrap_or_default());
        let page = uploads_page(all, &prefix, &key_marker, &id_marker, max);
        let next = page.truncated.then(|| page.uploads.last().cloned()).flatten();
        let uploads: Vec<MultipartUpload> = page
            .uploads
            .into_iter()
            .map(|(id, key, when)| MultipartUpload {
                key: Some(key),
                upload_id: Some(id),
                initiated: Some(when.into()),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix,
            key_marker: i.key_marker,
            upload_id_marker: i.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_key_marker: next.as_ref().map(|(_, key, _)| key.clone()),
            next_upload_id_marker: next.map(|(id, _, _)| id),
            uploads: Some(uploads),
            ..Default::default()
        }))
    }
}

/// One page of ListMultipartUploads.
struct UploadsPage {
    /// (upload id, key, initiated), by key then id.
    uploads: Vec<(String, String, std::time::SystemTime)>,
    truncated: bool,
}

/// The uploads (sorted by key, then id) under `prefix` that come after the
/// markers, as S3 orders them: keys after `key_marker`, and with an
/// `id_marker`, that key's uploads after it too; at most `max`.
fn uploads_page(
    all: Vec<(String, super::multipart::Upload, std::time::SystemTime)>,
    prefix: &str,
    key_marker: &str,
    id_marker: &str,
    max: usize,
) -> UploadsPage {
    let after = |key: &str, id: &str| {
        key_marker.is_empty() || key > key_marker || (key == key_marker && !id_marker.is_empty() && id > id_marker)
    };
    let mut rest = all
        .into_iter()
        .filter(|(id, up, _)| up.key.starts_with(prefix) && after(&up.key, id))
        .map(|(id, up, when)| (id, up.key, when));
    let uploads: Vec<_> = rest.by_ref().take(max).collect();
    UploadsPage { uploads, truncated: rest.next().is_some() }
}

/// Access keys, answering an unknown one as S3 does (InvalidAccessKeyId,
/// 403), not with s3s's NotSignedUp.
pub struct Auth(pub s3s::auth::SimpleAuth);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for Auth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        self.0.lookup(access_key).cloned().ok_or_else(|| {
            s3_error!(InvalidAccessKeyId, "the access key {access_key:?} does not exist in this gateway's records")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(key: &str) -> super::super::multipart::Upload {
        super::super::multipart::Upload {
            bucket: "b".into(),
            key: key.into(),
            meta: Default::default(),
            checksum_algorithm: None,
        }
    }

    /// ListMultipartUploads pages as S3 does: at most `max` a page, said
    /// truncated while more remain, resumed after the key (and upload id)
    /// markers; every upload is listed once.
    #[test]
    fn uploads_are_paged_after_their_markers() {
        let when = std::time::SystemTime::UNIX_EPOCH;
        let mut all = Vec::new();
        for k in ["a", "b", "c"] {
            for id in ["1", "2"] {
                all.push((id.to_owned(), upload(k), when));
            }
        }
        let (mut seen, mut markers) = (Vec::new(), (String::new(), String::new()));
        loop {
            let page = uploads_page(all.clone(), "", &markers.0, &markers.1, 4);
            assert!(page.uploads.len() <= 4);
            seen.extend(page.uploads.iter().map(|(id, key, _)| format!("{key}{id}")));
            let Some((id, key, _)) = page.uploads.last().cloned().filter(|_| page.truncated) else { break };
            markers = (key, id);
        }
        assert_eq!(seen, ["a1", "a2", "b1", "b2", "c1", "c2"]);
        // A key marker alone skips that key's uploads; a prefix filters.
        let page = uploads_page(all.clone(), "", "b", "", 10);
        assert_eq!(page.uploads.iter().map(|u| u.1.as_str()).collect::<Vec<_>>(), ["c", "c"]);
        assert!(!uploads_page(all, "a", "", "", 2).truncated);
    }
}
