//! PutObject from host memory: one streamed PUT up to the multipart threshold,
//! above it a multipart upload whose parts go up concurrently. Bodies are read
//! from the region in chunks as the socket takes them (no whole-object copy).

use futures::{StreamExt, TryStreamExt};

use super::call::{enter, Call, ObjectWrite, PartPut};
use super::client::{PartOf, PutBody};
use super::error::S3Error;
use super::integrity::{self, Digests, Upload};
use super::store::ObjectStore;
use super::token_path::{Fallback, Via};

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
    /// Why the store cannot be said to have stored exactly the bytes sent;
    /// `None`: it can (see [`integrity::Digests::check_reply`]).
    pub unverified: Option<String>,
}

impl PutOutcome {
    pub(super) fn from_parts(etag: String, vias: &[Via], unverified: Option<&str>) -> Self {
        Self {
            unverified: unverified.map(str::to_owned),
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
    pub async fn put_from(&self, write: &ObjectWrite<'_>, call: &Call<'_>) -> Result<PutOutcome, S3Error> {
        let ObjectWrite { key, region, offset, length: len, content_type } = *write;
        let Call { request_id, gate } = *call;
        // A region only the NIC reaches (GPU memory on a co-located agent)
        // is refused before any upload starts.
        self.check_reach(region.as_ref(), super::gpu::Direction::Put)?;
        if let Some(enc) = &self.encryption {
            return self.put_encrypted(enc, write, call).await;
        }
        let full = self.full_key(key);
        if len > self.tuning.multipart_threshold {
            let put = self.put_multipart(&full, write, call).await;
            // A completion a hung gateway holds: a new upload (`endpoints::held_elsewhere`).
            return match put {
                Err(e) if super::endpoints::held_elsewhere(&e) => {
                    tracing::warn!(error = %e, "the upload's completion is held by a hung gateway; uploading again");
                    self.put_multipart(&full, write, call).await
                }
                put => put,
            };
        }
        let _slot = enter(gate, len).await?;
        let base = self.next_base();
        let mut via = Via::Http;
        if let Some(r) = self.rdma_for(len) {
            // The object's CRC64NVME goes in its metadata (and is the PUT's checksum).
            let crc = super::token_path::crc64nvme_of(region, offset, len).await?;
            let meta = [(integrity::META_CRC64NVME, integrity::b64(crc))];
            let put = PartPut {
                full: &full,
                part: None,
                region,
                offset,
                len,
                content_type,
                extra: &meta,
                crc: Some(crc),
                base,
                request_id,
            };
            let sent = self.put_rdma(r, put);
            match sent.await? {
                // The serving side checked the CRC as it READ the bytes
                // (docs/s3-over-rdma.md): a mismatch would have stored nothing.
                Ok(etag) => return Ok(PutOutcome::from_parts(etag, &[Via::Rdma], None)),
                Err(f) => {
                    tracing::warn!(kind = f.kind, reason = %f.message, "RDMA PUT fell back to HTTP");
                    via = Via::Fallback(f);
                }
            }
        }
        // A store that checks the CRC refuses damaged bytes and keeps it as
        // the object's checksum; one that does not checks Content-MD5. The
        // metadata keeps the CRC for reads whatever the store does.
        let digests = Digests::of_region(region, offset, len, !self.learned.crc_checked(Upload::Put)).await?;
        let mut headers = digests.headers();
        headers.push((integrity::META_CRC64NVME, integrity::b64(digests.crc)));
        if !content_type.is_empty() {
            headers.push(("content-type", content_type.to_owned()));
        }
        let (full, headers, digests) = (&full, &headers, &digests);
        let (etag, confirmed) = self
            .retrying(|attempt| async move {
                let body = PutBody::Region { region: region.clone(), offset, len };
                let at = self.at(base, attempt, full, request_id);
                let reply = self.client.put(at, None, headers, body).await?;
                let proof = self.upload_proof(at.endpoint, Upload::Put, digests, &reply)?;
                Ok((etag_of(&reply), proof.confirmed))
            })
            .await?;
        Ok(PutOutcome::from_parts(etag, &[via], (!confirmed).then_some(integrity::UNCONFIRMED_UPLOAD)))
    }

    async fn put_multipart(&self, full: &str, write: &ObjectWrite<'_>, call: &Call<'_>) -> Result<PutOutcome, S3Error> {
        let ObjectWrite { region, offset, length: len, content_type, .. } = *write;
        let Call { request_id, gate } = *call;
        let base = self.next_base();
        let part = self.tuning.put_part_size;
        let count = len.div_ceil(part);
        let span = |i: u64| (i * part, part.min(len - i * part));
        // Every part's CRC64NVME first: the object's, combined from them,
        // goes in its metadata at CreateMultipartUpload (the one request
        // that sets it), where even a store that keeps no checksums
        // returns it with every GET.
        let crcs: Vec<u64> = futures::stream::iter(0..count)
            .map(|i| super::token_path::crc64nvme_of(region, offset + span(i).0, span(i).1))
            .buffered(self.tuning.max_concurrency)
            .try_collect()
            .await?;
        let object_crc = (0..count).fold(None, |acc, i| Some(integrity::combine(acc, crcs[i as usize], span(i).1)));
        let mut headers = vec![(integrity::META_CRC64NVME, integrity::b64(object_crc.unwrap_or(0)))];
        if !content_type.is_empty() {
            headers.push(("content-type", content_type.to_owned()));
        }
        let upload = self.create_upload(full, base, request_id, &headers).await?;

        let md5 = !self.learned.crc_checked(Upload::Part);
        let (upload_id, crcs) = (upload.id(), &crcs);
        let uploads = (0..count).map(|i| async move {
            let upload = upload_id;
            let (from, n) = span(i);
            let _slot = enter(gate, n).await?;
            let mut via = Via::Http;
            if let Some(r) = self.rdma_for(n) {
                let crc = Some(crcs[i as usize]);
                let put = PartPut {
                    full,
                    part: Some((i + 1, upload)),
                    region,
                    offset: offset + from,
                    len: n,
                    content_type: "",
                    extra: &[],
                    crc,
                    base: base + i as usize,
                    request_id,
                };
                match self.put_rdma(r, put).await? {
                    // The serving side checked the CRC as it READ the part.
                    Ok(etag) => return Ok((i, UploadedPart { etag, via: Via::Rdma, md5: None, confirmed: true })),
                    Err(f) => {
                        tracing::warn!(kind = f.kind, reason = %f.message, part = i + 1, "RDMA UploadPart fell back to HTTP");
                        via = Via::Fallback(f);
                    }
                }
            }
            let digests = match md5 {
                true => Digests::of_region(region, offset + from, n, true).await?,
                false => Digests { crc: crcs[i as usize], md5: None },
            };
            // Summed again with the MD5: the bytes sent are those summed
            // now, and the object's metadata holds the first pass's CRC. A
            // region written meanwhile would store an object whose every
            // whole read then fails its check, reported as a success here.
            if digests.crc != crcs[i as usize] {
                return Err(super::integrity::region_changed(i + 1));
            }
            let headers = digests.headers();
            let (headers, digests) = (&headers, &digests);
            let part = Some(PartOf { upload_id: upload, number: i + 1 });
            let (etag, confirmed) = self
                .retrying(|attempt| async move {
                    let body = PutBody::Region { region: region.clone(), offset: offset + from, len: n };
                    let at = self.at(base + i as usize, attempt, full, request_id);
                    let reply = self.client.put(at, part, headers, body).await?;
                    let proof = self.upload_proof(at.endpoint, Upload::Part, digests, &reply)?;
                    Ok((etag_of(&reply), proof.confirmed))
                })
                .await?;
            Ok::<_, S3Error>((i, UploadedPart { etag, via, md5: digests.md5, confirmed }))
        });
        let result: Result<Vec<(u64, UploadedPart)>, S3Error> =
            futures::stream::iter(uploads).buffer_unordered(self.tuning.max_concurrency).try_collect().await;
        let mut parts = match result {
            Ok(v) => v,
            Err(e) => {
                upload.failed();
                return Err(e);
            }
        };
        parts.sort_by_key(|(i, _)| *i);
        let parts: Vec<UploadedPart> = parts.into_iter().map(|(_, p)| p).collect();
        let vias: Vec<Via> = parts.iter().map(|p| p.via.clone()).collect();
        let etags: Vec<String> = parts.iter().map(|p| p.etag.clone()).collect();
        let md5s: Vec<Option<[u8; 16]>> = parts.iter().map(|p| p.md5).collect();
        let etag = self.complete_upload(upload, &etags, &md5s).await?;
        let confirmed = parts.iter().all(|p| p.confirmed);
        Ok(PutOutcome::from_parts(etag, &vias, (!confirmed).then_some(integrity::UNCONFIRMED_UPLOAD)))
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
    /// aborted if completing fails. `md5s`: each part's MD5, where it was
    /// computed (for a store that answers without the object's ETag).
    pub(super) async fn complete_upload(
        &self,
        mut upload: MultipartUpload<'_>,
        etags: &[String],
        md5s: &[Option<[u8; 16]>],
    ) -> Result<String, S3Error> {
        let (full, base, request_id) = (upload.full, upload.base, upload.request_id);
        let upload_id = upload.id.clone();
        let upload_id = upload_id.as_str();
        let done = self
            .retrying(|attempt| self.client.complete_upload(self.at(base, attempt, full, request_id), upload_id, etags))
            .await;
        match done {
            Ok(etag) if etag.is_empty() => {
                upload.done = true;
                Ok(self.etag_of_completed(full, base, request_id, md5s).await)
            }
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

/// One part as stored.
struct UploadedPart {
    etag: String,
    via: Via,
    /// Its MD5, where it was computed.
    md5: Option<[u8; 16]>,
    /// The store's reply proved it holds exactly these bytes.
    confirmed: bool,
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
