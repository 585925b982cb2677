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
use sluice_dataplane::s3_names::{self, BYTES_HEADER, OLD_BYTES_HEADER};
use sluice_dataplane::{SharedRegion, Transport, TransportKind};

use super::client::{header, RdmaToken};
use super::error::S3Error;
use crate::hostmem::HostRegion;
use crate::model::{DataPathMode, Placement};

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

pub(super) fn header_u64(headers: &http::HeaderMap, name: &str) -> Option<u64> {
    header(headers, name).trim().parse().ok()
}

/// How many bytes the store says it moved.
pub(super) fn moved(headers: &http::HeaderMap) -> Option<u64> {
    header_u64(headers, BYTES_HEADER).or_else(|| header_u64(headers, OLD_BYTES_HEADER))
}

/// Windows up to this size are checksummed on the calling task: 256 KiB
/// is a few microseconds of SIMD CRC, less than the hand-off to a blocking
/// thread and back costs (two wake-ups per small one-sided GET).
const INLINE_CRC_BYTES: u64 = 256 << 10;

/// CRC-64/NVME of a region window; a large one is computed off the async
/// threads (a pass over up to gigabytes must not hold up other tenants'
/// small requests).
pub(super) async fn crc64nvme_of(region: &Arc<dyn HostRegion>, offset: u64, len: u64) -> Result<u64, S3Error> {
    if len <= INLINE_CRC_BYTES {
        return region.crc64nvme(offset, len).map_err(|e| S3Error::Destination(e.to_string()));
    }
    let region = region.clone();
    tokio::task::spawn_blocking(move || region.crc64nvme(offset, len).map_err(|e| S3Error::Destination(e.to_string())))
        .await
        .map_err(|e| S3Error::Destination(format!("checksum task failed: {e}")))?
}

/// [`crc64nvme_of`] as `x-amz-checksum-crc64nvme` wants it.
pub(super) async fn crc64nvme_header(region: &Arc<dyn HostRegion>, offset: u64, len: u64) -> Result<String, S3Error> {
    let sum = crc64nvme_of(region, offset, len).await?;
    Ok(base64::engine::general_purpose::STANDARD.encode(sum.to_be_bytes()))
}

impl TokenPath {
    /// Where the store should place the bytes: the host region itself, or a
    /// fresh staging buffer.
    pub(super) fn target(
        &self,
        region: &Arc<dyn HostRegion>,
        dst: u64,
        len: u64,
    ) -> Result<(Arc<dyn HostRegion>, u64), Fallback> {
        match self.placement {
            Placement::Direct => Ok((region.clone(), dst)),
            Placement::Staged => sluice_shm::MappedRegion::create("sluice-stage", len.max(1))
                .map(|m| (Arc::new(SharedRegion::new(m)) as Arc<dyn HostRegion>, 0))
                .map_err(|e| Fallback::new("transport", format!("no staging buffer: {e}"))),
        }
    }

    pub(super) fn token(&self, token: String) -> RdmaToken {
        RdmaToken { token, transport: self.kind.marker() }
    }
}

/// Classifies a failed RDMA request: real S3 errors pass through, anything
/// about the data path becomes a fallback.
pub(super) fn classify(e: S3Error) -> Result<Fallback, S3Error> {
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
