//! S3 over RDMA, client side: each GET part or PUT carries a descriptor of
//! its window in `x-amz-rdma-token` (SigV4-signed, `UNSIGNED-PAYLOAD`, empty
//! body); the store WRITEs (GET) or READs (PUT) the bytes one-sidedly.
//!
//! Anything short of a clean RDMA reply — 501, a missing `x-amz-rdma-reply`,
//! `RDMATransferFailed`, a short byte count, a transport error — becomes a
//! [`Fallback`] that the caller turns into a plain HTTP transfer, and that is
//! reported per request, counted and logged.

use std::sync::Arc;

use base64::Engine;
use sluice_dataplane::s3_names::{self, BYTES_HEADER, OLD_BYTES_HEADER, REPLY_HEADER};
use sluice_dataplane::{Access, Grant, SharedRegion, Transport, TransportKind};

use super::client::{header, PartOf, PutBody, RdmaToken};
use super::{ObjectStore, S3Error};
use crate::config::{DataPathMode, Placement};
use crate::hostmem::HostRegion;

/// A namespace's RDMA settings.
pub struct TokenPath {
    pub transport: Arc<dyn Transport>,
    pub kind: TransportKind,
    pub mode: DataPathMode,
    pub placement: Placement,
    pub min_bytes: u64,
}

/// Why a part left the RDMA path.
#[derive(Debug, Clone)]
pub struct Fallback {
    /// Short label for metrics: declined, ignored, transfer_failed, short,
    /// transport, dc_unavailable.
    pub kind: &'static str,
    pub message: String,
}

impl Fallback {
    pub(crate) fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

/// How one part moved.
#[derive(Debug, Clone)]
pub enum Via {
    Http,
    Rdma,
    Fallback(Fallback),
}

fn header_u64(headers: &http::HeaderMap, name: &str) -> Option<u64> {
    header(headers, name).trim().parse().ok()
}

/// How many bytes the store says it moved.
fn moved(headers: &http::HeaderMap) -> Option<u64> {
    header_u64(headers, BYTES_HEADER).or_else(|| header_u64(headers, OLD_BYTES_HEADER))
}

/// CRC-64/NVME of a region window, computed off the async threads (a pass
/// over up to gigabytes must not hold up other tenants' small requests).
pub(super) async fn crc64nvme_of(region: &Arc<dyn HostRegion>, offset: u64, len: u64) -> Result<u64, S3Error> {
    let region = region.clone();
    tokio::task::spawn_blocking(move || crc64nvme_u64(region.as_ref(), offset, len))
        .await
        .map_err(|e| S3Error::Destination(format!("checksum task failed: {e}")))?
}

/// [`crc64nvme_of`] as `x-amz-checksum-crc64nvme` wants it.
pub(super) async fn crc64nvme_header(region: &Arc<dyn HostRegion>, offset: u64, len: u64) -> Result<String, S3Error> {
    let sum = crc64nvme_of(region, offset, len).await?;
    Ok(base64::engine::general_purpose::STANDARD.encode(sum.to_be_bytes()))
}

/// CRC-64/NVME of a memory window.
pub(super) fn crc64nvme_u64(mem: &dyn HostRegion, offset: u64, len: u64) -> Result<u64, S3Error> {
    let mut digest = crc64fast_nvme::Digest::new();
    let mut buf = vec![0u8; (1 << 20).min(len.max(1) as usize)];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        mem.read_at(offset + pos, &mut buf[..n]).map_err(|e| S3Error::Destination(e.to_string()))?;
        digest.write(&buf[..n]);
        pos += n as u64;
    }
    Ok(digest.sum64())
}

impl TokenPath {
    /// Where the store should place the bytes: the host region itself, or a
    /// fresh staging buffer.
    fn target(&self, region: &Arc<dyn HostRegion>, dst: u64, len: u64) -> Result<(Arc<dyn HostRegion>, u64), Fallback> {
        match self.placement {
            Placement::Direct => Ok((region.clone(), dst)),
            Placement::Staged => sluice_shm::MappedRegion::create("sluice-stage", len.max(1))
                .map(|m| (Arc::new(SharedRegion::new(m)) as Arc<dyn HostRegion>, 0))
                .map_err(|e| Fallback::new("transport", format!("no staging buffer: {e}"))),
        }
    }

    fn token(&self, token: String) -> RdmaToken {
        RdmaToken { token, transport: self.kind.marker() }
    }
}

/// Classifies a failed RDMA request: real S3 errors pass through, anything
/// about the data path becomes a fallback.
fn classify(e: S3Error) -> Result<Fallback, S3Error> {
    match e {
        S3Error::RdmaDeclined(m) => Ok(Fallback::new("declined", m)),
        S3Error::Server { code, message, .. } if s3_names::is_transfer_failed(&code) => {
            Ok(Fallback::new("transfer_failed", format!("{code}: {message}")))
        }
        S3Error::Rejected { code, message, .. } if s3_names::is_invalid_token(&code) => {
            Ok(Fallback::new("declined", format!("{code}: {message}")))
        }
        S3Error::Server { status, code, message, .. } => {
            Ok(Fallback::new("transfer_failed", format!("HTTP {status} {code}: {message}")))
        }
        e @ (S3Error::Connection { .. } | S3Error::TransferFailed { .. }) => {
            Ok(Fallback::new("transport", e.to_string()))
        }
        e => Err(e),
    }
}

/// A part that would fall back to HTTP fails instead when its region is
/// one only the NIC reaches (GPU memory on a co-located agent): HTTP
/// cannot write there, and the failure names what went wrong with RDMA.
pub(super) fn unless_nic_only(
    region: &dyn HostRegion,
    done: Result<Option<Fallback>, S3Error>,
) -> Result<Option<Fallback>, S3Error> {
    match (done, region.nic_only()) {
        (Ok(Some(f)), Some(why)) => {
            tracing::warn!(kind = f.kind, reason = %f.message, "RDMA GET part failed; GPU memory cannot take it over HTTP");
            Err(S3Error::TransferFailed {
                message: format!(
                    "the RDMA part failed ({}: {}) and cannot go over HTTP instead: {why}",
                    f.kind, f.message
                ),
                attempts: 1,
            })
        }
        (done, _) => done,
    }
}

impl ObjectStore {
    /// GETs `[from, to)` into `region` at `dst` over RDMA. `Ok(None)`: done;
    /// `Ok(Some(f))`: fetch it over HTTP instead; `Err`: a real S3 error
    /// (or an RDMA failure into a region HTTP cannot reach).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn get_part_rdma(
        &self,
        rdma: &TokenPath,
        full: &str,
        from: u64,
        to: u64,
        version: super::get::Version<'_>,
        region: &Arc<dyn HostRegion>,
        dst: u64,
        base: usize,
        request_id: &str,
    ) -> Result<Option<Fallback>, S3Error> {
        let done = self.try_part_rdma(rdma, full, from, to, version, region, dst, base, request_id).await;
        unless_nic_only(region.as_ref(), done)
    }

    #[allow(clippy::too_many_arguments)]
    async fn try_part_rdma(
        &self,
        rdma: &TokenPath,
        full: &str,
        from: u64,
        to: u64,
        version: super::get::Version<'_>,
        region: &Arc<dyn HostRegion>,
        dst: u64,
        base: usize,
        request_id: &str,
    ) -> Result<Option<Fallback>, S3Error> {
        let len = to - from;
        let (mem, off) = match rdma.target(region, dst, len) {
            Ok(t) => t,
            Err(f) => return Ok(Some(f)),
        };
        let grant = Grant {
            memory: mem.clone(),
            offset: off,
            len,
            access: Access::RemoteWrite,
            tenant: self.tenant.clone(),
            request_id: request_id.to_owned(),
        };
        let exposure = match rdma.transport.expose(grant) {
            Ok(e) => e,
            Err(e) => return Ok(Some(Fallback::new("transport", e.to_string()))),
        };
        let mut req = Self::part_get(from, to, version.etag);
        req.rdma = Some(rdma.token(exposure.token.to_string()));
        let reply = self.client.get(self.at(base, 0, full, request_id), req).await;
        // The descriptor dies with the request, whatever happened.
        let done = async {
            let headers = match reply {
                Ok(r) => r.headers,
                Err(e) => return classify(e).map(Some),
            };
            if headers.get(REPLY_HEADER).is_none() {
                return Ok(Some(Fallback::new("ignored", "the store ignored the token (no x-amz-rdma-reply)")));
            }
            // Bytes of another version may already be in the window: fail
            // the read (never fall back and mix).
            version.check(&headers, from, to)?;
            let moved = moved(&headers);
            if moved != Some(len) {
                return Ok(Some(Fallback::new(
                    "short",
                    format!("the store reported {moved:?} bytes for a {len}-byte part"),
                )));
            }
            Ok(None)
        }
        .await;
        drop(exposure);
        if matches!(done, Ok(None)) && rdma.placement == Placement::Staged {
            copy(&mem, 0, region, dst, len)?;
        }
        done
    }

    /// PUTs (or, with `part`, UploadParts) `[offset, offset+len)` of `region`
    /// over RDMA. `Ok(Ok(etag))`: stored; `Ok(Err(f))`: send it over HTTP.
    /// `extra`: more object headers (metadata); `crc`: the window's
    /// CRC64NVME when the caller has it (used unless the bytes are staged).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn put_rdma(
        &self,
        rdma: &TokenPath,
        full: &str,
        part: Option<(u64, &str)>,
        region: &Arc<dyn HostRegion>,
        offset: u64,
        len: u64,
        content_type: &str,
        extra: &[(&'static str, String)],
        crc: Option<u64>,
        base: usize,
        request_id: &str,
    ) -> Result<Result<String, Fallback>, S3Error> {
        let (mem, off) = match rdma.target(region, offset, len) {
            Ok(t) => t,
            Err(f) => return Ok(Err(f)),
        };
        if rdma.placement == Placement::Staged {
            copy(region, offset, &mem, off, len)?;
        }
        // Staged: summed from the copy the store will READ.
        let crc = match crc.filter(|_| rdma.placement == Placement::Direct) {
            Some(c) => super::integrity::b64(c),
            None => crc64nvme_header(&mem, off, len).await?,
        };
        let grant = Grant {
            memory: mem.clone(),
            offset: off,
            len,
            access: Access::RemoteRead,
            tenant: self.tenant.clone(),
            request_id: request_id.to_owned(),
        };
        let exposure = match rdma.transport.expose(grant) {
            Ok(e) => e,
            Err(e) => return Ok(Err(Fallback::new("transport", e.to_string()))),
        };
        let mut headers = vec![("x-amz-checksum-crc64nvme", crc)];
        if part.is_none() && !content_type.is_empty() {
            headers.push(("content-type", content_type.to_owned()));
        }
        headers.extend(extra.iter().cloned());
        let part = part.map(|(number, upload_id)| PartOf { upload_id, number });
        let body = PutBody::Rdma { token: rdma.token(exposure.token.to_string()), len };
        let reply = self.client.put(self.at(base, 0, full, request_id), part, &headers, body).await;
        let result = async {
            let headers = match reply {
                Ok(h) => h,
                // The checksum of an empty body: a store that ignores the
                // token refuses it, and should then get the bytes over HTTP.
                Err(S3Error::Damaged { code, message, .. }) => {
                    return Ok(Err(Fallback::new(
                        "ignored",
                        format!("the store did not read the bytes through the token ({code}: {message})"),
                    )));
                }
                Err(e) => return classify(e).map(Err),
            };
            let etag = header(&headers, "etag").to_owned();
            if headers.get(REPLY_HEADER).is_none() {
                // Never trusted: the store may have stored an empty object.
                return Ok(Err(Fallback::new("ignored", "the store ignored the token on PUT (no x-amz-rdma-reply)")));
            }
            let moved = moved(&headers);
            if moved.is_some_and(|m| m != len) {
                return Ok(Err(Fallback::new("short", format!("the store read {moved:?} of {len} bytes"))));
            }
            Ok(Ok(etag))
        }
        .await;
        drop(exposure);
        result
    }
}

/// Copies `len` bytes between a staging buffer and a host region.
fn copy(
    src: &Arc<dyn HostRegion>,
    src_off: u64,
    dst: &Arc<dyn HostRegion>,
    dst_off: u64,
    len: u64,
) -> Result<(), S3Error> {
    let mut buf = vec![0u8; (1 << 20).min(len.max(1) as usize)];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(buf.len() as u64) as usize;
        src.read_at(src_off + pos, &mut buf[..n]).map_err(|e| S3Error::Destination(e.to_string()))?;
        dst.write_at(dst_off + pos, &buf[..n]).map_err(|e| S3Error::Destination(e.to_string()))?;
        pos += n as u64;
    }
    Ok(())
}
