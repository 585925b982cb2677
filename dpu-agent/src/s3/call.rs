//! What an operation on an [`ObjectStore`](super::store::ObjectStore) is
//! asked, as typed values: which bytes of which object ([`ObjectRead`],
//! [`ObjectWrite`]), where they go ([`RegionSlice`]), and who asks
//! ([`Call`]: the request id and the tenant's admission, [`Gate`]). Parts
//! of a transfer are [`PartGet`] and [`PartPut`]. They replace argument
//! lists that every layer repeated.

use std::sync::Arc;

use super::error::S3Error;
use super::version::Version;
use crate::hostmem::HostRegion;

/// Per-part admission of a transfer: its tenant's permit paces each part
/// (bytes/s) and takes a fair-scheduler slot for it, held while the part
/// moves, so one tenant's large transfer never holds the agent for longer
/// than a part. `None`: no quotas (tests of the S3 client alone).
pub type Gate<'a> = Option<&'a sluice_qos::Permit>;

/// Waits for `gate` to admit a part of `n` bytes.
pub(super) async fn enter(gate: Gate<'_>, n: u64) -> Result<Option<sluice_qos::Slot>, S3Error> {
    match gate {
        Some(p) => p.chunk(n).await.map(Some).map_err(|e| S3Error::Quota(e.to_string())),
        None => Ok(None),
    }
}

/// Who asks, for every S3 request of one operation.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    /// Sent with each S3 request (the store's logs name it).
    pub request_id: &'a str,
    pub gate: Gate<'a>,
}

impl<'a> Call<'a> {
    /// A call with no quotas (tests, the agent's own housekeeping).
    pub fn ungated(request_id: &'a str) -> Self {
        Self { request_id, gate: None }
    }
}

/// Which bytes of which object a GET reads.
#[derive(Clone, Copy, Debug)]
pub struct ObjectRead<'a> {
    /// The tenant's key (without the namespace prefix).
    pub key: &'a str,
    pub start: u64,
    /// `None`: to the end of the object.
    pub length: Option<u64>,
    /// The ETag the object must have: a caller reading one object in several
    /// requests pins them to the version its first one saw.
    pub if_match: Option<&'a str>,
}

impl<'a> ObjectRead<'a> {
    /// The whole object `key`, whatever its version.
    pub fn whole(key: &'a str) -> Self {
        Self { key, start: 0, length: None, if_match: None }
    }
}

/// Where a GET's bytes go: `region` from `offset`, at most `room` bytes.
#[derive(Clone, Copy)]
pub struct RegionSlice<'a> {
    pub region: &'a Arc<dyn HostRegion>,
    pub offset: u64,
    pub room: u64,
}

/// What a PUT stores: `length` bytes of `region` from `offset` as `key`.
#[derive(Clone, Copy)]
pub struct ObjectWrite<'a> {
    pub key: &'a str,
    pub region: &'a Arc<dyn HostRegion>,
    pub offset: u64,
    pub length: u64,
    pub content_type: &'a str,
}

impl<'a> ObjectWrite<'a> {
    /// The first `length` bytes of `region` as `key`, with no content type.
    pub fn from_start(key: &'a str, region: &'a Arc<dyn HostRegion>, length: u64) -> Self {
        Self { key, region, offset: 0, length, content_type: "" }
    }
}

/// One part of a GET: `[from, to)` of stored key `full`, which must still
/// be `version`, into `region` at `dst`; `base` picks the endpoint.
#[derive(Clone, Copy)]
pub(super) struct PartGet<'a> {
    pub full: &'a str,
    pub from: u64,
    pub to: u64,
    pub version: Version<'a>,
    pub region: &'a Arc<dyn HostRegion>,
    pub dst: u64,
    pub base: usize,
    pub request_id: &'a str,
}

/// One PUT, or with `part` (number, upload id) one UploadPart, of
/// `[offset, offset + len)` of `region` as stored key `full`. `extra`: more
/// object headers (metadata); `crc`: the window's CRC64NVME when the caller
/// has it.
#[derive(Clone, Copy)]
pub(super) struct PartPut<'a> {
    pub full: &'a str,
    pub part: Option<(u64, &'a str)>,
    pub region: &'a Arc<dyn HostRegion>,
    pub offset: u64,
    pub len: u64,
    pub content_type: &'a str,
    pub extra: &'a [(&'static str, String)],
    pub crc: Option<u64>,
    pub base: usize,
    pub request_id: &'a str,
}
