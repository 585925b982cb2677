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
use sluice_dataplane::s3_names::{self, BYTES_HEADER, OLD_BYTES_HEADER, REPLY_HEADER, TOKEN_HEADER, TRANSPORT_HEADER};
use sluice_dataplane::{Access, Grant, SharedRegion, Transport, TransportKind};

use super::request::Spec;
use super::{error, ObjectStore, S3Error};
use crate::config::{DataPathMode, Placement};
use crate::hostmem::HostRegion;

/// A namespace's RDMA settings.
pub struct RdmaPath {
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

fn header_u64(resp: &reqwest::Response, name: &str) -> Option<u64> {
    resp.headers().get(name)?.to_str().ok()?.trim().parse().ok()
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

impl RdmaPath {
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

    fn spec<'a>(&self, spec: Spec<'a>, token: String) -> Spec<'a> {
        let spec = spec.header(TOKEN_HEADER, token);
        match self.kind.marker() {
            Some(m) => spec.header(TRANSPORT_HEADER, m.to_owned()),
            None => spec,
        }
    }
}

/// Classifies a failed RDMA request: real S3 errors pass through, anything
/// about the data path becomes a fallback.
async fn classify(resp: reqwest::Response, full: &str) -> Result<Fallback, S3Error> {
    let status = resp.status();
    let reply = resp.headers().get(REPLY_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if reply.as_deref() == Some("501") || status == http::StatusCode::NOT_IMPLEMENTED {
        return Ok(Fallback::new(
            "declined",
            format!("the store declined RDMA (HTTP {status}, x-amz-rdma-reply: 501)"),
        ));
    }
    match error::check(resp, Some(full)).await {
        Err(S3Error::Server { code, message, .. }) if s3_names::is_transfer_failed(&code) => {
            Ok(Fallback::new("transfer_failed", format!("{code}: {message}")))
        }
        Err(S3Error::Rejected { code, message, .. }) if s3_names::is_invalid_token(&code) => {
            Ok(Fallback::new("declined", format!("{code}: {message}")))
        }
        Err(S3Error::Server { status, code, message, .. }) => {
            Ok(Fallback::new("transfer_failed", format!("HTTP {status} {code}: {message}")))
        }
        Err(e) => Err(e),
        Ok(_) => Ok(Fallback::new("ignored", "unexpected status")),
    }
}

impl ObjectStore {
    /// GETs `[from, to)` into `region` at `dst` over RDMA. `Ok(None)`: done;
    /// `Ok(Some(f))`: fetch it over HTTP instead; `Err`: a real S3 error.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn get_part_rdma(
        &self,
        rdma: &RdmaPath,
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
        let spec =
            rdma.spec(self.part_spec(self.endpoint(base, 0), full, from, to, version.etag), exposure.token.to_string());
        let resp = match self.send(spec, request_id).await {
            Ok(r) => r,
            Err(e) => return Ok(Some(Fallback::new("transport", e.to_string()))),
        };
        // The descriptor dies with the request, whatever happened.
        let done = async {
            if !resp.status().is_success() {
                return classify(resp, full).await.map(Some);
            }
            if resp.headers().get(REPLY_HEADER).is_none() {
                return Ok(Some(Fallback::new("ignored", "the store ignored the token (no x-amz-rdma-reply)")));
            }
            // Bytes of another version may already be in the window: fail
            // the read (never fall back and mix).
            version.check(resp.headers(), from, to)?;
            let moved = header_u64(&resp, BYTES_HEADER).or_else(|| header_u64(&resp, OLD_BYTES_HEADER));
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
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn put_rdma(
        &self,
        rdma: &RdmaPath,
        full: &str,
        part: Option<(u64, &str)>,
        region: &Arc<dyn HostRegion>,
        offset: u64,
        len: u64,
        content_type: &str,
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
        let crc = crc64nvme_header(&mem, off, len).await?;
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
        let mut spec =
            Spec::new(http::Method::PUT, self.endpoint(base, 0)).key(full).header("x-amz-checksum-crc64nvme", crc);
        if let Some((number, upload)) = part {
            spec = spec.query("partNumber", &number.to_string()).query("uploadId", upload);
        } else if !content_type.is_empty() {
            spec = spec.header("content-type", content_type.to_owned());
        }
        let spec = rdma.spec(spec, exposure.token.to_string());
        let resp = match self.send(spec, request_id).await {
            Ok(r) => r,
            Err(e) => return Ok(Err(Fallback::new("transport", e.to_string()))),
        };
        let result = async {
            if !resp.status().is_success() {
                return classify(resp, full).await.map(Err);
            }
            let etag = resp.headers().get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            if resp.headers().get(REPLY_HEADER).is_none() {
                // Never trusted: the store may have stored an empty object.
                return Ok(Err(Fallback::new("ignored", "the store ignored the token on PUT (no x-amz-rdma-reply)")));
            }
            let moved = header_u64(&resp, BYTES_HEADER).or_else(|| header_u64(&resp, OLD_BYTES_HEADER));
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
