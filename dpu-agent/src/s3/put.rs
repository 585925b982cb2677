//! PutObject from host memory: one streamed PUT up to the multipart threshold,
//! above it a multipart upload whose parts go up concurrently. Bodies are read
//! from the region in chunks as the socket takes them (no whole-object copy).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};

use super::rdma::{Fallback, Via};
use super::request::{Payload, Spec};
use super::{enter, error, xml, Gate, ObjectStore, S3Error};
use crate::hostmem::HostRegion;

/// Bytes read from the region per body chunk.
const BODY_CHUNK: u64 = 1 << 20;

/// What a PUT stored.
#[derive(Debug, Clone)]
pub struct PutOutcome {
    pub etag: String,
    /// S3 requests that carried data (1, or the number of parts).
    pub parts: u32,
    /// Parts that moved over RDMA.
    pub rdma_parts: u32,
    /// Parts meant for RDMA that went over HTTP, and why.
    pub fallbacks: Vec<Fallback>,
}

impl PutOutcome {
    pub(super) fn from_parts(etag: String, vias: &[Via]) -> Self {
        Self {
            etag,
            parts: vias.len() as u32,
            rdma_parts: vias.iter().filter(|v| matches!(v, Via::Rdma)).count() as u32,
            fallbacks: vias
                .iter()
                .filter_map(|v| if let Via::Fallback(f) = v { Some(f.clone()) } else { None })
                .collect(),
        }
    }
}

/// A streamed body over `[offset, offset+len)` of the region.
fn region_body(region: Arc<dyn HostRegion>, offset: u64, len: u64) -> Payload {
    let end = offset + len;
    let stream = futures::stream::unfold(offset, move |pos| {
        let region = region.clone();
        async move {
            if pos >= end {
                return None;
            }
            let n = (end - pos).min(BODY_CHUNK) as usize;
            let mut buf = BytesMut::zeroed(n);
            let item = region
                .read_at(pos, &mut buf)
                .map(|()| Bytes::from(buf))
                .map_err(|e| std::io::Error::other(e.to_string()));
            Some((item, pos + n as u64))
        }
    });
    Payload::Stream { body: reqwest::Body::wrap_stream(stream), len }
}

impl ObjectStore {
    /// Stores `[offset, offset+len)` of `region` as `key`. The caller has
    /// checked the window against the region.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_from(
        &self,
        key: &str,
        region: &Arc<dyn HostRegion>,
        offset: u64,
        len: u64,
        content_type: &str,
        request_id: &str,
        gate: Gate<'_>,
    ) -> Result<PutOutcome, S3Error> {
        if let Some(enc) = &self.encryption {
            return self.put_encrypted(enc, key, region, offset, len, content_type, request_id, gate).await;
        }
        let full = self.full_key(key);
        if len > self.tuning.multipart_threshold {
            return self.put_multipart(&full, region, offset, len, content_type, request_id, gate).await;
        }
        let _slot = enter(gate, len).await?;
        let base = self.next_base();
        let mut via = Via::Http;
        if let Some(r) = self.rdma_for(len) {
            match self.put_rdma(r, &full, None, region, offset, len, content_type, base, request_id).await? {
                Ok(etag) => return Ok(PutOutcome::from_parts(etag, &[Via::Rdma])),
                Err(f) => {
                    tracing::warn!(kind = f.kind, reason = %f.message, "RDMA PUT fell back to HTTP");
                    via = Via::Fallback(f);
                }
            }
        }
        let etag = self
            .retrying(|attempt| {
                let full = &full;
                async move {
                    let mut spec = Spec::new(http::Method::PUT, self.endpoint(base, attempt))
                        .key(full)
                        .payload(region_body(region.clone(), offset, len));
                    if !content_type.is_empty() {
                        spec = spec.header("content-type", content_type.to_owned());
                    }
                    let resp = error::check(self.send(spec, request_id).await?, Some(full)).await?;
                    Ok(etag_of(&resp))
                }
            })
            .await?;
        Ok(PutOutcome::from_parts(etag, &[via]))
    }

    #[allow(clippy::too_many_arguments)]
    async fn put_multipart(
        &self,
        full: &str,
        region: &Arc<dyn HostRegion>,
        offset: u64,
        len: u64,
        content_type: &str,
        request_id: &str,
        gate: Gate<'_>,
    ) -> Result<PutOutcome, S3Error> {
        let base = self.next_base();
        let headers: Vec<(&'static str, String)> =
            if content_type.is_empty() { vec![] } else { vec![("content-type", content_type.to_owned())] };
        let upload_id = self.create_upload(full, base, request_id, &headers).await?;

        let part = self.tuning.put_part_size;
        let count = len.div_ceil(part);
        let upload = upload_id.as_str();
        let uploads = (0..count).map(|i| async move {
            let from = i * part;
            let n = part.min(len - from);
            let number = (i + 1).to_string();
            let _slot = enter(gate, n).await?;
            let mut via = Via::Http;
            if let Some(r) = self.rdma_for(n) {
                match self.put_rdma(r, full, Some((i + 1, upload)), region, offset + from, n, "", base + i as usize, request_id).await? {
                    Ok(etag) => return Ok((i, etag, Via::Rdma)),
                    Err(f) => {
                        tracing::warn!(kind = f.kind, reason = %f.message, part = i + 1, "RDMA UploadPart fell back to HTTP");
                        via = Via::Fallback(f);
                    }
                }
            }
            let etag = self
                .retrying(|attempt| {
                    let number = number.clone();
                    async move {
                        let spec = Spec::new(http::Method::PUT, self.endpoint(base + i as usize, attempt))
                            .key(full)
                            .query("partNumber", &number)
                            .query("uploadId", upload)
                            .payload(region_body(region.clone(), offset + from, n));
                        let resp = error::check(self.send(spec, request_id).await?, Some(full)).await?;
                        Ok(etag_of(&resp))
                    }
                })
                .await?;
            Ok::<_, S3Error>((i, etag, via))
        });
        let result: Result<Vec<(u64, String, Via)>, S3Error> =
            futures::stream::iter(uploads).buffer_unordered(self.tuning.max_concurrency).try_collect().await;
        let mut etags = match result {
            Ok(v) => v,
            Err(e) => {
                self.abort_multipart(full, upload, base, request_id).await;
                return Err(e);
            }
        };
        etags.sort_by_key(|(i, _, _)| *i);
        let vias: Vec<Via> = etags.iter().map(|(_, _, v)| v.clone()).collect();
        let etags: Vec<String> = etags.into_iter().map(|(_, e, _)| e).collect();
        let etag = self.complete_upload(full, upload, &etags, base, request_id).await?;
        Ok(PutOutcome::from_parts(etag, &vias))
    }

    /// CreateMultipartUpload; `headers` adds the object's headers (content
    /// type, user metadata).
    pub(super) async fn create_upload(
        &self,
        full: &str,
        base: usize,
        request_id: &str,
        headers: &[(&'static str, String)],
    ) -> Result<String, S3Error> {
        self.retrying(|attempt| async move {
            let mut spec = Spec::new(http::Method::POST, self.endpoint(base, attempt)).key(full).query("uploads", "");
            for (k, v) in headers {
                spec = spec.header(k, v.clone());
            }
            let resp = error::check(self.send(spec, request_id).await?, Some(full)).await?;
            xml::parse_upload_id(&resp.text().await.map_err(S3Error::from_reqwest)?)
        })
        .await
    }

    /// CompleteMultipartUpload with the parts' ETags in order; aborts the
    /// upload if completing fails.
    pub(super) async fn complete_upload(
        &self,
        full: &str,
        upload: &str,
        etags: &[String],
        base: usize,
        request_id: &str,
    ) -> Result<String, S3Error> {
        let body = Bytes::from(xml::complete_body(etags));
        let done = self
            .retrying(|attempt| {
                let body = body.clone();
                async move {
                    let spec = Spec::new(http::Method::POST, self.endpoint(base, attempt))
                        .key(full)
                        .query("uploadId", upload)
                        .header("content-type", "application/xml".into())
                        .payload(Payload::Bytes(body));
                    let resp = error::check(self.send(spec, request_id).await?, Some(full)).await?;
                    xml::parse_complete(&resp.text().await.map_err(S3Error::from_reqwest)?)
                }
            })
            .await;
        if done.is_err() {
            self.abort_multipart(full, upload, base, request_id).await;
        }
        done
    }

    /// Best effort: a failed upload should not leave parts behind.
    pub(super) async fn abort_multipart(&self, full: &str, upload: &str, base: usize, request_id: &str) {
        let spec = Spec::new(http::Method::DELETE, self.endpoint(base, 0)).key(full).query("uploadId", upload);
        match self.send(spec, request_id).await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => tracing::warn!(status = %r.status(), upload, "aborting multipart upload failed"),
            Err(e) => tracing::warn!(error = %e, upload, "aborting multipart upload failed"),
        }
    }
}

pub(super) fn etag_of(resp: &reqwest::Response) -> String {
    resp.headers().get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}
