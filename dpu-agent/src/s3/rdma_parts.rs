//! GET and PUT parts over the RDMA data path (see `token_path.rs` for the
//! descriptor and the fallbacks): the window exposed, the request sent,
//! the reply checked, and staged copies when the placement asks for them.

use std::sync::Arc;

use sluice_dataplane::s3_names::REPLY_HEADER;
use sluice_dataplane::{Access, Grant};

use super::call::{PartGet, PartPut};
use super::client::{header, PartOf, PutBody};
use super::error::S3Error;
use super::store::ObjectStore;
use super::token_path::*;
use crate::hostmem::HostRegion;
use crate::model::Placement;

impl ObjectStore {
    /// GETs `[from, to)` into `region` at `dst` over RDMA. `Ok(None)`: done;
    /// `Ok(Some(f))`: fetch it over HTTP instead; `Err`: a real S3 error
    /// (or an RDMA failure into a region HTTP cannot reach).
    pub(super) async fn get_part_rdma(&self, rdma: &TokenPath, part: PartGet<'_>) -> Result<Option<Fallback>, S3Error> {
        let done = self.try_part_rdma(rdma, part).await;
        unless_nic_only(part.region.as_ref(), done)
    }

    async fn try_part_rdma(&self, rdma: &TokenPath, part: PartGet<'_>) -> Result<Option<Fallback>, S3Error> {
        let PartGet { full, from, to, version, region, dst, base, request_id } = part;
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
    pub(super) async fn put_rdma(
        &self,
        rdma: &TokenPath,
        put: PartPut<'_>,
    ) -> Result<Result<String, Fallback>, S3Error> {
        let PartPut { full, part, region, offset, len, content_type, extra, crc, base, request_id } = put;
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
