//! PutObject from host memory: one streamed PUT up to the multipart threshold,
//! above it a multipart upload whose parts go up concurrently. Bodies are read
//! from the region in chunks as the socket takes them (no whole-object copy).

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::client::{PartOf, PutBody};
use super::token_path::{Fallback, Via};
use super::{enter, Gate, ObjectStore, S3Error};
use crate::hostmem::HostRegion;

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
        // A region only the NIC reaches (GPU memory on a co-located agent)
        // is refused before any upload starts.
        self.check_reach(region.as_ref(), super::gpu::Direction::Put)?;
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
        // The store checks the bytes against it and keeps it as the
        // object's full-object checksum (returned on GET and HEAD).
        let mut headers =
            vec![("x-amz-checksum-crc64nvme", super::token_path::crc64nvme_header(region, offset, len).await?)];
        if !content_type.is_empty() {
            headers.push(("content-type", content_type.to_owned()));
        }
        let (full, headers) = (&full, &headers);
        let etag = self
            .retrying(|attempt| async move {
                let body = PutBody::Region { region: region.clone(), offset, len };
                let reply = self.client.put(self.at(base, attempt, full, request_id), None, headers, body).await?;
                Ok(etag_of(&reply))
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
        let upload = self.create_upload(full, base, request_id, &headers).await?;

        let part = self.tuning.put_part_size;
        let count = len.div_ceil(part);
        let upload_id = upload.id();
        let uploads = (0..count).map(|i| async move {
            let upload = upload_id;
            let from = i * part;
            let n = part.min(len - from);
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
            let headers = &[("x-amz-checksum-crc64nvme", super::token_path::crc64nvme_header(region, offset + from, n).await?)];
            let part = Some(PartOf { upload_id: upload, number: i + 1 });
            let etag = self
                .retrying(|attempt| async move {
                    let body = PutBody::Region { region: region.clone(), offset: offset + from, len: n };
                    let at = self.at(base + i as usize, attempt, full, request_id);
                    Ok(etag_of(&self.client.put(at, part, headers, body).await?))
                })
                .await?;
            Ok::<_, S3Error>((i, etag, via))
        });
        let result: Result<Vec<(u64, String, Via)>, S3Error> =
            futures::stream::iter(uploads).buffer_unordered(self.tuning.max_concurrency).try_collect().await;
        let mut etags = match result {
            Ok(v) => v,
            Err(e) => {
                upload.failed();
                return Err(e);
            }
        };
        etags.sort_by_key(|(i, _, _)| *i);
        let vias: Vec<Via> = etags.iter().map(|(_, _, v)| v.clone()).collect();
        let etags: Vec<String> = etags.into_iter().map(|(_, e, _)| e).collect();
        let etag = self.complete_upload(upload, &etags).await?;
        Ok(PutOutcome::from_parts(etag, &vias))
    }

    /// CreateMultipartUpload; `headers` adds the object's headers (content
    /// type, user metadata). The upload is aborted when the returned guard
    /// drops before [`ObjectStore::complete_upload`] succeeds.
    pub(super) async fn create_upload<'a>(
        &'a self,
        full: &'a str,
        base: usize,
        request_id: &'a str,
        headers: &[(&'static str, String)],
    ) -> Result<MultipartUpload<'a>, S3Error> {
        let id = self
            .retrying(|attempt| self.client.create_upload(self.at(base, attempt, full, request_id), headers))
            .await?;
        Ok(MultipartUpload { store: self, full, id, base, request_id, failed: false, done: false })
    }

    /// CompleteMultipartUpload with the parts' ETags in order; the upload is
    /// aborted if completing fails.
    pub(super) async fn complete_upload(
        &self,
        mut upload: MultipartUpload<'_>,
        etags: &[String],
    ) -> Result<String, S3Error> {
        let (full, base, request_id) = (upload.full, upload.base, upload.request_id);
        let upload_id = upload.id.clone();
        let upload_id = upload_id.as_str();
        let done = self
            .retrying(|attempt| self.client.complete_upload(self.at(base, attempt, full, request_id), upload_id, etags))
            .await;
        match done {
            Ok(etag) => {
                upload.done = true;
                Ok(etag)
            }
            Err(e) => {
                upload.failed();
                Err(e)
            }
        }
    }
}

/// A multipart upload in progress. Dropped before it completed — a part or
/// the completion failed, or the request itself was dropped mid-way (its
/// shim died, its deadline passed) — it aborts the upload on a task of its
/// own, so no path leaves parts behind in the store. (Uploads whose id never
/// reached the agent are the store's to expire: the gateway does.)
pub(super) struct MultipartUpload<'a> {
    store: &'a ObjectStore,
    full: &'a str,
    id: String,
    base: usize,
    request_id: &'a str,
    failed: bool,
    done: bool,
}

impl MultipartUpload<'_> {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Ends the upload because it failed (aborted as it drops).
    pub fn failed(mut self) {
        self.failed = true;
    }
}

/// Abort attempts, and the pause before each retry.
const ABORT_RETRIES_MS: [u64; 3] = [0, 100, 400];

impl Drop for MultipartUpload<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let reason = if self.failed { "failed" } else { "cancelled" };
        self.store.counters.multipart_aborts.with_label_values(&[reason]).inc();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(upload = %self.id, "no runtime to abort the multipart upload on; the store will expire it");
            return;
        };
        // Made now (the store and key are borrowed), sent later.
        let requests: Vec<_> = (0..ABORT_RETRIES_MS.len() as u32)
            .map(|attempt| {
                let at = self.store.at(self.base, attempt, self.full, self.request_id);
                self.store.client.abort_upload(at, &self.id)
            })
            .collect();
        let upload = std::mem::take(&mut self.id);
        tracing::info!(upload, reason, "aborting multipart upload");
        rt.spawn(async move {
            for (req, pause) in requests.into_iter().zip(ABORT_RETRIES_MS) {
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                match req.await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, upload, "aborting multipart upload failed"),
                }
            }
            tracing::warn!(upload, "giving up aborting the multipart upload; the store will expire it");
        });
    }
}

pub(super) fn etag_of(headers: &http::HeaderMap) -> String {
    super::client::header(headers, "etag").to_owned()
}
