//! Inline encryption of a namespace's objects (`encryption = "aes-256-gcm"`):
//! the agent seals on PUT and opens on GET with `sluice-crypt`'s chunked
//! AES-256-GCM format (docs/encryption-format.md), under the tenant's master
//! key. Objects are bound to bucket and full key (namespace prefix included),
//! so a copy to another key does not open.
//!
//! The bytes pass through the agent (staged): ciphertext moves over HTTP, the
//! host region only ever receives authenticated plaintext, one chunk at a
//! time. A GET whose object fails authentication returns `INTEGRITY` and the
//! request is not reported as filled. HEAD and LIST report plaintext sizes
//! (from the `sluice-*` user metadata, checked against the header on GET).

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sluice_crypt::{CryptError, Metadata, ObjectOpener, ObjectSealer, HEADER_LEN, TAG_LEN};

use super::call::{enter, Call, ObjectRead, ObjectWrite, RegionSlice};
use super::chunk_keys::{off_thread, Keyed};
use super::client::{header, Body, PartOf, PutBody, RangedGet};
use super::encryption::Encryption;
use super::error::S3Error;
use super::get::GetOutcome;
use super::integrity::{self, Digests, Upload};
use super::model::ObjectMeta;
use super::put::PutOutcome;
use super::store::ObjectStore;
use super::token_path::Via;
use super::write_fence::WriteFence;
use super::xml;
use crate::hostmem::HostRegion;

/// Maps format errors: tampering and malformed objects are integrity
/// failures; key problems are the agent's own.
fn crypt_err(e: CryptError) -> S3Error {
    match e {
        CryptError::Integrity
        | CryptError::BadHeader(_)
        | CryptError::UnsupportedVersion(_)
        | CryptError::BadMetadata(_)
        | CryptError::BadCiphertextLength { .. }
        | CryptError::ChunkLength { .. } => S3Error::Integrity(e.to_string()),
        CryptError::RangeOutOfBounds { .. } => S3Error::InvalidRange(e.to_string()),
        other => S3Error::Encryption(other.to_string()),
    }
}

/// Maps errors of reading an object back. Its header and metadata come
/// from the store, so what the format refuses in them (a chunk size, a
/// size, a name, a chunk index, a key id the tenant does not have) is the
/// object's failing, not the agent's: INTEGRITY, saying so.
fn open_err(e: CryptError) -> S3Error {
    match e {
        CryptError::UnknownKey { .. } => S3Error::Integrity(format!(
            "the object's header names a key this agent does not have ({e}): it was sealed under a key since \
             removed from the key directory, or its header was altered"
        )),
        CryptError::InvalidChunkSize(_)
        | CryptError::TooLarge { .. }
        | CryptError::InvalidName { .. }
        | CryptError::ChunkIndex { .. } => S3Error::Integrity(format!("the stored object is malformed: {e}")),
        other => crypt_err(other),
    }
}

fn blocking_err(e: tokio::task::JoinError) -> S3Error {
    S3Error::Encryption(format!("crypto task failed: {e}"))
}

/// Where decrypted bytes go: plaintext `[start, end)` lands in `region` at
/// `offset`.
#[derive(Clone)]
struct Dest {
    region: Arc<dyn HostRegion>,
    offset: u64,
    start: u64,
    end: u64,
    /// Closed when the GET ends: a decrypt still running on its blocking
    /// thread then writes nothing more ([`WriteFence`]).
    fence: Arc<WriteFence>,
}

/// Opens `chunks` held in `buf` (stored bytes from `buf_from`) and writes
/// their plaintext, clipped to the requested range, into the region. A chunk
/// is written only once it has authenticated.
fn open_into(
    opener: &ObjectOpener,
    mut buf: Vec<u8>,
    buf_from: u64,
    chunks: std::ops::Range<u32>,
    dst: &Dest,
) -> Result<(), S3Error> {
    let layout = opener.layout();
    for i in chunks {
        let r = layout.chunk_ciphertext_range(i).map_err(open_err)?;
        let slice = buf
            .get_mut((r.start - buf_from) as usize..(r.end - buf_from) as usize)
            .ok_or_else(|| S3Error::Integrity("chunk outside the fetched bytes".into()))?;
        let plain = opener.open_chunk(i, slice).map_err(open_err)?;
        let at = layout.chunk_plaintext_offset(i);
        let (lo, hi) = (dst.start.max(at), dst.end.min(at + plain.len() as u64));
        if lo < hi {
            let Some(_writing) = dst.fence.enter() else {
                give_buffer(buf);
                return Err(S3Error::Destination("the GET ended before its bytes were written".into()));
            };
            dst.region
                .write_at(dst.offset + (lo - dst.start), &plain[(lo - at) as usize..(hi - at) as usize])
                .map_err(|e| S3Error::Destination(e.to_string()))?;
        }
    }
    give_buffer(buf);
    Ok(())
}

/// Ciphertext buffers, reused: a fresh multi-MiB allocation per part costs
/// page faults that show up as a large share of an encrypted GET's CPU.
static BUFFERS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
/// Buffers kept for reuse.
const POOLED: usize = 16;

fn take_buffer(capacity: usize) -> Vec<u8> {
    let mut pool = BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
    match pool.iter().position(|b| b.capacity() >= capacity) {
        Some(i) => pool.swap_remove(i),
        None => Vec::with_capacity(capacity),
    }
}

fn give_buffer(mut b: Vec<u8>) {
    b.clear();
    let mut pool = BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
    if pool.len() < POOLED && b.capacity() <= 64 << 20 {
        pool.push(b);
    }
}

/// Reads a response body into one buffer sized for `expected` bytes.
async fn read_body(mut body: Body, expected: u64) -> Result<Vec<u8>, S3Error> {
    let mut out = take_buffer(expected as usize);
    while let Some(c) = body.next().await {
        out.extend_from_slice(&c?);
        if out.len() as u64 > expected {
            break;
        }
    }
    Ok(out)
}

/// The `sluice-*` user metadata of a HEAD response (`x-amz-meta-` stripped).
fn metadata_of(headers: &http::HeaderMap) -> Result<Option<Metadata>, S3Error> {
    let pairs = headers.iter().filter_map(|(k, v)| {
        let name = k.as_str().strip_prefix("x-amz-meta-")?;
        Some((name.to_owned(), v.to_str().ok()?.to_owned()))
    });
    Metadata::from_pairs(pairs).map_err(open_err)
}

impl ObjectStore {
    /// HEAD with the plaintext size of an encrypted object.
    pub(super) async fn head_encrypted(&self, key: &str, request_id: &str) -> Result<ObjectMeta, S3Error> {
        let (mut meta, enc) = self.head_with_metadata(key, request_id).await?;
        // Without its metadata the object is not one this namespace can
        // read (its GET is refused too): its stored size is not its size.
        let m = enc.ok_or_else(|| {
            S3Error::Integrity(format!(
                "{key} carries no encryption metadata: it was not written encrypted, or its metadata was removed"
            ))
        })?;
        meta.size = m.plaintext_len;
        Ok(meta)
    }

    async fn head_with_metadata(&self, key: &str, request_id: &str) -> Result<(ObjectMeta, Option<Metadata>), S3Error> {
        let full = &self.full_key(key);
        let base = self.next_base();
        self.retrying(|attempt| async move {
            let headers = self.client.head(self.at(base, attempt, full, request_id)).await?;
            Ok((xml::meta_from_headers(key, &headers)?, metadata_of(&headers)?))
        })
        .await
    }

    /// Bytes `[from, to)` of the stored (encrypted) object, guarded by its ETag.
    async fn fetch_bytes(
        &self,
        full: &str,
        from: u64,
        to: u64,
        etag: &str,
        request_id: &str,
    ) -> Result<Vec<u8>, S3Error> {
        let base = self.next_base();
        self.retrying(|attempt| async move {
            let resp =
                self.client.get(self.at(base, attempt, full, request_id), Self::part_get(from, to, etag)).await?;
            if resp.status != http::StatusCode::PARTIAL_CONTENT {
                return Err(S3Error::Protocol(format!("ranged GET answered {}", resp.status)));
            }
            let body = read_body(resp.body, to - from).await?;
            if body.len() as u64 != to - from {
                // A short body is a truncated object or a broken transfer.
                return Err(S3Error::Integrity(format!("asked for {} bytes, got {}", to - from, body.len())));
            }
            Ok(body)
        })
        .await
    }

    /// The first bytes `[0, to)` of the stored object (or all of it if
    /// shorter), with the stored size and ETag: the header, and for a read
    /// from the start the first chunks too, in one round trip.
    async fn fetch_head_bytes(&self, full: &str, to: u64, request_id: &str) -> Result<(Vec<u8>, u64, String), S3Error> {
        let base = self.next_base();
        self.retrying(|attempt| async move {
            let req = RangedGet { first: 0, last: to - 1, ..Default::default() };
            let resp = self.client.get(self.at(base, attempt, full, request_id), req).await?;
            let etag = resp.header("etag").to_owned();
            let total = match resp.headers.get("content-range").and_then(|v| v.to_str().ok()) {
                Some(cr) => cr.rsplit('/').next().and_then(|t| t.parse().ok()),
                None => header(&resp.headers, "content-length").parse().ok(),
            }
            .ok_or_else(|| S3Error::Protocol("ranged GET without a usable Content-Range".into()))?;
            let want = to.min(total);
            let mut body = read_body(resp.body, want).await?;
            if (body.len() as u64) < want {
                return Err(S3Error::Integrity(format!("asked for {want} bytes, got {}", body.len())));
            }
            body.truncate(want as usize);
            Ok((body, total, etag))
        })
        .await
    }

    /// Decrypts plaintext `[start, start+length)` of `key` into `region` at
    /// `offset`. The header is fetched first (with the first chunks when
    /// reading from the start); it authenticates the object's size and
    /// layout, so no HEAD is needed.
    pub(super) async fn get_encrypted(
        &self,
        enc: &Encryption,
        read: &ObjectRead<'_>,
        into: &RegionSlice<'_>,
        call: &Call<'_>,
    ) -> Result<GetOutcome, S3Error> {
        let ObjectRead { key, start, length, if_match } = *read;
        let RegionSlice { region, offset, room } = *into;
        let Call { request_id, gate } = *call;
        let full = self.full_key(key);
        let chunk_guess = u64::from(enc.chunk_size);
        let per_part_guess = (self.tuning.get_part_size / chunk_guess).max(1);
        let first_to = if start == 0 {
            HEADER_LEN as u64 + per_part_guess * (chunk_guess + TAG_LEN as u64)
        } else {
            HEADER_LEN as u64
        };
        let slot = enter(gate, first_to).await?;
        let (prefetched, stored, etag) = self.fetch_head_bytes(&full, first_to, request_id).await?;
        drop(slot);
        super::get::check_if_match(if_match, &etag)?;
        if prefetched.len() < HEADER_LEN || prefetched[..4] != sluice_crypt::MAGIC {
            // A plaintext object where only ciphertext may be is refused: a
            // store-side attacker must not be able to substitute plaintext.
            return Err(S3Error::Integrity("the object is not encrypted in this encrypted namespace".into()));
        }
        let (cipher, provider, tenant, bucket) =
            (enc.cipher.clone(), enc.provider.clone(), self.tenant.clone(), self.bucket.clone());
        let (key, header) = (full.clone(), prefetched[..HEADER_LEN].to_vec());
        let opener = off_thread(move || {
            ObjectOpener::new_with_cipher(&*cipher, &*provider, &tenant, &bucket, &key, &header).map(Keyed::new)
        })
        .await?
        .map_err(open_err)?;
        let layout = *opener.layout();
        if stored != layout.ciphertext_len() {
            return Err(S3Error::Integrity(format!(
                "stored size {stored} is not that of the {}-byte object its header describes",
                layout.plaintext_len()
            )));
        }
        let size = layout.plaintext_len();
        if start >= size && !(start == 0 && size == 0) {
            return Err(S3Error::InvalidRange(format!("bytes {start}- of a {size}-byte object")));
        }
        let end = length.map_or(size, |l| start.saturating_add(l).min(size));
        let needed = end - start;
        if region.check(offset, needed).is_err() || offset > region.len() || needed > room {
            return Err(S3Error::DoesNotFit {
                needed,
                offset,
                region_len: region.len().min(offset.saturating_add(room)),
            });
        }
        let opener = Arc::new(opener);
        let chunks = if needed == 0 {
            0..1 // an empty object: its one empty final chunk must still open
        } else {
            layout.plan_range(start, needed).map_err(open_err)?.chunks()
        };
        // Chunks already in the first response (from the start only).
        let mut have = chunks.start;
        while have < chunks.end && layout.chunk_ciphertext_range(have).map_err(open_err)?.end <= prefetched.len() as u64
        {
            have += 1;
        }
        // Dropped with this future (answered, failed, past its deadline or
        // cancelled): no decrypt writes into the region after that.
        let (fence, _fenced) = WriteFence::new();
        let dst = Dest { region: region.clone(), offset, start, end, fence };
        let mut vias = Vec::new();
        if have > chunks.start {
            let (o, d, first) = (opener.clone(), dst.clone(), chunks.start);
            tokio::task::spawn_blocking(move || open_into(&o, prefetched, 0, first..have, &d))
                .await
                .map_err(blocking_err)??;
            vias.push(Via::Http);
        }
        let per_part = (self.tuning.get_part_size / u64::from(layout.chunk_size())).max(1) as u32;
        let (full, etag) = (&full, &etag);
        let groups = (have..chunks.end).step_by(per_part as usize).map(|first| {
            let last = (first + per_part).min(chunks.end); // exclusive
            let (opener, dst) = (opener.clone(), dst.clone());
            async move {
                let from = layout.chunk_ciphertext_range(first).map_err(open_err)?.start;
                let to = layout.chunk_ciphertext_range(last - 1).map_err(open_err)?.end;
                let _slot = enter(gate, to - from).await?;
                let cipher = self.fetch_bytes(full, from, to, etag, request_id).await?;
                // Decrypt off the async threads; only authenticated plaintext
                // reaches the region.
                tokio::task::spawn_blocking(move || open_into(&opener, cipher, from, first..last, &dst))
                    .await
                    .map_err(blocking_err)??;
                Ok::<_, S3Error>(Via::Http)
            }
        });
        let rest: Vec<Via> =
            futures::stream::iter(groups).buffer_unordered(self.tuning.max_concurrency).try_collect().await?;
        vias.extend(rest);
        // Every chunk written was authenticated: verified, ranged or not.
        Ok(GetOutcome::from_parts(needed, size, etag.clone(), vias, None))
    }

    /// Seals chunks `[first, last)` of `[offset, offset+len)` of `region`,
    /// prefixed with the header when `first == 0`; with the body's digests
    /// (its MD5 too when `md5`).
    async fn sealed_part(
        sealer: Arc<Keyed<ObjectSealer>>,
        header: Option<Bytes>,
        region: Arc<dyn HostRegion>,
        offset: u64,
        (first, last): (u32, u32),
        md5: bool,
    ) -> Result<(Bytes, Digests), S3Error> {
        tokio::task::spawn_blocking(move || -> Result<(Bytes, Digests), S3Error> {
            let layout = *sealer.layout();
            let mut out = header.map(|h| h.to_vec()).unwrap_or_default();
            let plain: u64 = (first..last).map(|i| layout.chunk_plaintext_len(i).map_or(0, |n| n as u64)).sum();
            out.reserve((plain + u64::from(last - first) * TAG_LEN as u64) as usize);
            for i in first..last {
                // Read straight into the body and seal in place there.
                let n = layout.chunk_plaintext_len(i).map_err(crypt_err)?;
                let at = out.len();
                out.resize(at + n, 0);
                region
                    .read_at(offset + layout.chunk_plaintext_offset(i), &mut out[at..])
                    .map_err(|e| S3Error::Destination(e.to_string()))?;
                let tag = sealer.seal_in_place_detached(i, &mut out[at..]).map_err(crypt_err)?;
                out.extend_from_slice(&tag);
            }
            let digests = Digests::of(&out, md5);
            Ok((Bytes::from(out), digests))
        })
        .await
        .map_err(blocking_err)?
    }

    /// Encrypts `[offset, offset+len)` of `region` and stores it as `key`.
    pub(super) async fn put_encrypted(
        &self,
        enc: &Encryption,
        write: &ObjectWrite<'_>,
        call: &Call<'_>,
    ) -> Result<PutOutcome, S3Error> {
        let ObjectWrite { key, region, offset, length: len, content_type } = *write;
        let Call { request_id, gate } = *call;
        let full = self.full_key(key);
        let (cipher, provider, tenant, bucket) =
            (enc.cipher.clone(), enc.provider.clone(), self.tenant.clone(), self.bucket.clone());
        let (key, chunk_size) = (full.clone(), enc.chunk_size);
        let (header, sealer) = off_thread(move || {
            ObjectSealer::new_with_cipher(&*cipher, &*provider, &tenant, &bucket, &key, len, chunk_size)
                .map(|(header, sealer)| (header, Keyed::new(sealer)))
        })
        .await?
        .map_err(crypt_err)?;
        let meta: Vec<(&'static str, String)> = sealer.metadata().to_pairs();
        let layout = *sealer.layout();
        let sealer = Arc::new(sealer);
        let header = Bytes::copy_from_slice(&header);
        let chunks = layout.chunk_count();
        let per_part =
            u32::try_from(super::store::chunks_per_part(self.tuning.put_part_size, enc.chunk_size)).unwrap_or(u32::MAX);
        let mut headers: Vec<(&'static str, String)> =
            meta.iter().map(|(k, v)| (meta_header_name(k), v.clone())).collect();
        if !content_type.is_empty() {
            headers.push(("content-type", content_type.to_owned()));
        }
        // Ciphertext bodies are signed with their SHA-256, which the store
        // checks; the digests add the CRC (and Content-MD5 where the store
        // does not check the CRC), whose echo or MD5 ETag proves the bytes
        // stored. Reads need no metadata CRC: every chunk authenticates.
        if layout.ciphertext_len() <= self.tuning.multipart_threshold {
            let _slot = enter(gate, layout.ciphertext_len()).await?;
            let md5 = !self.learned.crc_checked(Upload::Put);
            let (body, digests) =
                Self::sealed_part(sealer, Some(header), region.clone(), offset, (0, chunks), md5).await?;
            headers.extend(digests.headers());
            let (headers, digests) = (&headers, &digests);
            let base = self.next_base();
            let (etag, confirmed) = self
                .retrying(|attempt| {
                    let (full, body) = (&full, PutBody::Bytes(body.clone()));
                    async move {
                        let at = self.at(base, attempt, full, request_id);
                        let reply = self.client.put(at, None, headers, body).await?;
                        let proof = self.upload_proof(at.endpoint, Upload::Put, digests, &reply)?;
                        Ok((super::put::etag_of(&reply), proof.confirmed))
                    }
                })
                .await?;
            let unverified = (!confirmed).then_some(integrity::UNCONFIRMED_UPLOAD);
            return Ok(PutOutcome::from_parts(etag, &[Via::Http], unverified));
        }
        let headers = &headers;
        // Multipart: each part holds whole chunks; the first also the header.
        let base = self.next_base();
        let full = &full;
        let upload = self.create_upload(full, base, request_id, headers).await?;
        let upload_id = upload.id();
        let md5 = !self.learned.crc_checked(Upload::Part);
        let parts = (0..chunks).step_by(per_part as usize).enumerate().map(|(i, first)| {
            let (sealer, header, upload) = (sealer.clone(), header.clone(), upload_id);
            async move {
                let last = (first + per_part).min(chunks);
                let _slot = enter(gate, u64::from(last - first) * u64::from(enc.chunk_size)).await?;
                let header = (first == 0).then_some(header);
                let (body, digests) =
                    Self::sealed_part(sealer, header, region.clone(), offset, (first, last), md5).await?;
                let part = Some(PartOf { upload_id: upload, number: i as u64 + 1 });
                let sums = digests.headers();
                let (sums, digests) = (&sums, &digests);
                let (etag, confirmed) = self
                    .retrying(|attempt| {
                        let body = PutBody::Bytes(body.clone());
                        async move {
                            let at = self.at(base + i, attempt, full, request_id);
                            let reply = self.client.put(at, part, sums, body).await?;
                            let proof = self.upload_proof(at.endpoint, Upload::Part, digests, &reply)?;
                            Ok((super::put::etag_of(&reply), proof.confirmed))
                        }
                    })
                    .await?;
                Ok::<_, S3Error>((i, etag, digests.md5, confirmed))
            }
        });
        let done: Result<Vec<_>, S3Error> =
            futures::stream::iter(parts).buffer_unordered(self.tuning.max_concurrency).try_collect().await;
        let mut done = match done {
            Ok(v) => v,
            Err(e) => {
                upload.failed();
                return Err(e);
            }
        };
        done.sort_by_key(|(i, ..)| *i);
        let etags: Vec<String> = done.iter().map(|(_, e, ..)| e.clone()).collect();
        let md5s: Vec<Option<[u8; 16]>> = done.iter().map(|(_, _, m, _)| *m).collect();
        let etag = self.complete_upload(upload, &etags, &md5s).await?;
        let unverified = (!done.iter().all(|(.., c)| *c)).then_some(integrity::UNCONFIRMED_UPLOAD);
        Ok(PutOutcome::from_parts(etag, &vec![Via::Http; etags.len()], unverified))
    }
}

/// `x-amz-meta-<name>` as a static header name (the metadata names are
/// fixed by the format).
fn meta_header_name(name: &str) -> &'static str {
    match name {
        sluice_crypt::META_ENC => "x-amz-meta-sluice-enc",
        sluice_crypt::META_PLAIN_SIZE => "x-amz-meta-sluice-plain-size",
        sluice_crypt::META_CHUNK => "x-amz-meta-sluice-chunk",
        sluice_crypt::META_KEY_ID => "x-amz-meta-sluice-key-id",
        _ => "x-amz-meta-sluice-unknown",
    }
}

#[cfg(test)]
#[path = "crypto_tests.rs"]
mod tests;
