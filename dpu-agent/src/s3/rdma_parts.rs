//! GET and PUT parts over the RDMA data path (see `token_path.rs` for the
//! descriptor and the fallbacks): the window exposed, the request sent,
//! the reply checked, and staged copies when the placement asks for them.

use std::sync::Arc;

use sluice_dataplane::s3_names::{self, FITS_HEADER, REPLY_HEADER};
use sluice_dataplane::{Access, Grant, TransportKind};

use super::call::{PartGet, PartPut};
use super::client::{header, PartOf, PutBody, RangedGet};
use super::error::S3Error;
use super::integrity::Expected;
use super::store::ObjectStore;
use super::token_path::*;
use crate::hostmem::HostRegion;
use crate::model::Placement;

/// The largest first window without a HEAD on a NIC transport (verbs, DC):
/// most objects read one at a time are smaller, and a window is registered
/// (its pages pinned) per request there.
const FIRST_WINDOW_NIC: u64 = 256 << 10;

/// How long a part waits, once the store said its bytes moved, for the
/// window to show them landed (`tcp`: the owner copies them in itself, and
/// the store may answer before it has; see `sluice_dataplane::landing`).
/// They are usually in already; a store that says it moved bytes it never
/// sent makes the part fall back after this.
const LANDING_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A GET's first part over RDMA, asked without a HEAD first.
pub(super) struct FirstAsk<'a> {
    pub key: &'a str,
    pub full: &'a str,
    pub start: u64,
    pub length: Option<u64>,
    pub if_match: Option<&'a str>,
    pub region: &'a Arc<dyn HostRegion>,
    pub offset: u64,
    /// Room at `offset`: the caller's slot, within the region.
    pub fits: u64,
    pub base: usize,
    pub request_id: &'a str,
}

/// How the first part without a HEAD went.
pub(super) enum FirstTry {
    Landed(FirstLanded),
    /// Ask the size with a HEAD; the fallback, if this try fell back.
    HeadWay(Option<Fallback>),
}

/// What that first part learned, and moved.
pub(super) struct FirstLanded {
    pub object_size: u64,
    pub etag: String,
    pub expected: Expected,
    /// Bytes written at `offset` (0 when the object did not fit: then
    /// nothing was written).
    pub landed: u64,
}

impl ObjectStore {
    /// One request's window of `memory`, for this tenant.
    fn grant(&self, memory: &Arc<dyn HostRegion>, offset: u64, len: u64, access: Access, request_id: &str) -> Grant {
        Grant {
            memory: memory.clone(),
            offset,
            len,
            access,
            tenant: self.tenant.clone(),
            request_id: request_id.to_owned(),
        }
    }

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
        let exposure = match rdma.transport.expose(self.grant(&mem, off, len, Access::RemoteWrite, request_id)) {
            Ok(e) => e,
            Err(e) => return Ok(Some(Fallback::new("transport", e.to_string()))),
        };
        let mut req = Self::part_get(from, to, version.etag);
        req.rdma = Some(rdma.token(exposure.token.to_string()));
        // The object is known to be this big: asking the size check costs
        // nothing (a store other than Sluice's gateway ignores the header),
        // and the reply shows whether this store makes it (so a later GET
        // may skip the HEAD; see `first_part_rdma`).
        req.object_max = Some(version.size);
        let at = self.at(base, 0, full, request_id);
        let reply = self.client.get(at, req).await;
        if let Ok(r) = &reply {
            if r.headers.get(REPLY_HEADER).is_some() {
                self.learned.size_check_reply(at.endpoint, r.headers.get(FITS_HEADER).is_some());
            }
        }
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
            if let Err(e) = exposure.settle(len, LANDING_WAIT).await {
                return Ok(Some(Fallback::new("short", format!("the store reported {len} bytes moved, but {e}"))));
            }
            Ok(None)
        }
        .await;
        // Revoked before anything else: nothing lands after this. Bytes a
        // WRITE that began after they settled may have changed are fetched
        // again (the slot was touched: "short").
        let done = match (done, exposure.close()) {
            (Ok(None), Err(e)) => Ok(Some(Fallback::new("short", e.to_string()))),
            (done, _) => done,
        };
        if matches!(done, Ok(None)) && rdma.placement == Placement::Staged {
            copy(&mem, 0, region, dst, len)?;
        }
        done
    }

    /// The first part of a one-sided GET (any transport), with no HEAD
    /// before it: the store (Sluice's gateway) is asked to move the
    /// bytes only if the object fits the caller's slot
    /// (`x-sluice-rdma-object-max`) and is the version asked for
    /// (`If-Match`), so a refusal still writes nothing, and the reply's
    /// Content-Range and ETag say what a HEAD would have. Only to an
    /// endpoint already seen to make that check (an older gateway would
    /// write into the slot first). [`FirstTry::HeadWay`]: take the HEAD way
    /// instead (staged placement, an endpoint not known to check, a 0-byte
    /// or unservable object), with the fallback if this
    /// try fell back (a failed or short transfer may have left bytes in the
    /// slot; the HEAD way writes the span again).
    pub(super) async fn first_part_rdma(&self, rdma: &TokenPath, ask: FirstAsk<'_>) -> Result<FirstTry, S3Error> {
        let FirstAsk { key, full, start, length, if_match, region, offset, fits, base, request_id } = ask;
        let at = self.at(base, 0, full, request_id);
        // Only Sluice's gateway checks the size, and only a store seen to
        // check it is trusted to (whatever the transport).
        if rdma.placement != Placement::Direct || fits == 0 || !self.learned.checks_size(at.endpoint) {
            return Ok(FirstTry::HeadWay(None));
        }
        // A start no Range can name (S3 ranges are signed 64-bit) and an
        // ETag that is not one (`*`, control characters): the HEAD way
        // answers them as before.
        // The window is what the object may need, up to a part; the size is
        // not known yet. A NIC registers every window (pinning its pages),
        // so there it stays small: a bigger object takes more parts, as
        // many requests as a HEAD and one part would have been.
        let cap = if rdma.kind == TransportKind::Tcp { u64::MAX } else { FIRST_WINDOW_NIC };
        let len = length.unwrap_or(u64::MAX).min(self.tuning.get_part_size).min(fits).min(cap);
        let Some(asked_end) = start.checked_add(len).filter(|e| *e <= i64::MAX as u64) else {
            return Ok(FirstTry::HeadWay(None));
        };
        let if_match = match if_match.map(bare_etag) {
            None => None,
            Some(Some(b)) => Some(format!("\"{b}\"")),
            Some(None) => return Ok(FirstTry::HeadWay(None)),
        };
        // A span that may be longer than the slot: the object must be small
        // enough that the whole span fits.
        let object_max = match length {
            Some(l) if l <= fits => None,
            _ => Some(start.saturating_add(fits)),
        };
        let exposure = match rdma.transport.expose(self.grant(region, offset, len, Access::RemoteWrite, request_id)) {
            Ok(e) => e,
            Err(e) => {
                // The HEAD way's parts try again, and report it if they fail.
                tracing::debug!(error = %e, "no window for a first part; asking the size first");
                return Ok(FirstTry::HeadWay(None));
            }
        };
        let req = RangedGet {
            first: start,
            last: asked_end - 1,
            if_match: if_match.as_deref(),
            checksum_mode: start == 0,
            rdma: Some(rdma.token(exposure.token.to_string())),
            object_max,
        };
        let reply = self.client.get(at, req).await;
        let fell_back = |f: Fallback| {
            tracing::warn!(kind = f.kind, reason = %f.message, "RDMA first part fell back; asking the size first");
            if matches!(f.kind, "declined" | "ignored") {
                // It no longer serves the token as it did: learn it again.
                self.learned.size_check_reply(at.endpoint, false);
            }
            Ok(FirstTry::HeadWay(Some(f)))
        };
        // The descriptor dies with the request, whatever happened.
        let done: Result<FirstTry, S3Error> = async {
            let resp = match reply {
                Ok(r) => r,
                // Maybe a 0-byte object: the HEAD way tells.
                Err(S3Error::InvalidRange(_)) if start == 0 => return Ok(FirstTry::HeadWay(None)),
                Err(S3Error::PreconditionFailed(_)) if if_match.is_some() => {
                    return Err(S3Error::PreconditionFailed(format!(
                        "{key:?} is no longer at ETag {} as asked (it was replaced since); nothing was returned",
                        if_match.unwrap_or_default()
                    )))
                }
                Err(e) => return fell_back(classify(e)?),
            };
            if resp.headers.get(REPLY_HEADER).is_none() {
                return fell_back(Fallback::new("ignored", "the store ignored the token (no x-amz-rdma-reply)"));
            }
            let fits_said = header(&resp.headers, FITS_HEADER);
            if object_max.is_some() {
                self.learned.size_check_reply(at.endpoint, !fits_said.is_empty());
            }
            let (body_start, object_size, etag) = super::version::reply_span(&resp, start, asked_end - 1)?;
            let whole = body_start == 0 && asked_end >= object_size;
            let expected = Expected::from_headers(&resp.headers, whole);
            if object_max.is_some_and(|max| object_size > max) {
                if fits_said != "no" {
                    // It stopped checking (downgraded): the slot may hold bytes.
                    tracing::warn!(store = at.endpoint, "the store ignored {}", s3_names::OBJECT_MAX_HEADER);
                }
                // The caller says it does not fit; nothing more moves.
                return Ok(FirstTry::Landed(FirstLanded { object_size, etag, expected, landed: 0 }));
            }
            let landed = asked_end.min(object_size).saturating_sub(start);
            let moved = moved(&resp.headers);
            if moved != Some(landed) {
                return fell_back(Fallback::new("short", format!("the store reported {moved:?} bytes for {landed}")));
            }
            if let Err(e) = exposure.settle(landed, LANDING_WAIT).await {
                return fell_back(Fallback::new("short", format!("the store reported {landed} bytes moved, but {e}")));
            }
            self.note_checksums(at.endpoint, whole, &expected, &etag);
            Ok(FirstTry::Landed(FirstLanded { object_size, etag, expected, landed }))
        }
        .await;
        // Revoked before anything else is asked: nothing lands after this.
        // Bytes a WRITE that began after they settled may have changed are
        // fetched again.
        let closed = exposure.close();
        let mut done = match (done?, closed) {
            (FirstTry::Landed(l), Err(e)) if l.landed > 0 => fell_back(Fallback::new("short", e.to_string()))?,
            (done, _) => done,
        };
        if let FirstTry::Landed(l) = &mut done {
            // Bytes moved (not an object too big for the slot) for the
            // whole object, and no checksum came with the reply: the
            // store's full-object one comes with a HEAD (as it always did
            // before this way).
            let reads_whole = start == 0 && length.is_none_or(|len| len >= l.object_size);
            if l.landed > 0 && reads_whole && self.verify_checksums && !l.expected.any() {
                let meta = self.head(key, request_id).await?;
                if meta.etag != l.etag || meta.size != l.object_size {
                    return Err(S3Error::PreconditionFailed(format!("{key:?} changed while it was read")));
                }
                l.expected = Expected { store: meta.crc64nvme, agent: meta.agent_crc64nvme };
            }
        }
        Ok(done)
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
        // Staged: summed from the copy the store will READ, which must be
        // the bytes the caller summed (the object's metadata holds theirs).
        let crc = match crc.filter(|_| rdma.placement == Placement::Direct) {
            Some(c) => super::integrity::b64(c),
            None => {
                let copied = crc64nvme_header(&mem, off, len).await?;
                if crc.is_some_and(|c| super::integrity::b64(c) != copied) {
                    return Err(super::integrity::region_changed(part.map_or(1, |(n, _)| n)));
                }
                copied
            }
        };
        let exposure = match rdma.transport.expose(self.grant(&mem, off, len, Access::RemoteRead, request_id)) {
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

/// An ETag as it is compared (quotes and a weak prefix aside); `None` for
/// one that cannot be sent as one (`*`, empty, not visible ASCII).
fn bare_etag(e: &str) -> Option<&str> {
    let b = e.trim().trim_start_matches("W/").trim_matches('"');
    let ok = !b.is_empty() && b != "*" && b.bytes().all(|c| c.is_ascii_graphic() && c != b'"');
    ok.then_some(b)
}
