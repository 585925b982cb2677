//! Integrity end to end, whatever the store does with checksums.
//!
//! Every PUT and part carries the CRC64NVME of its bytes
//! (`x-amz-checksum-crc64nvme`), and every object the agent writes keeps its
//! own CRC64NVME in its metadata (`x-amz-meta-sluice-crc64nvme`), so a
//! whole-object GET is checked end to end even where the store neither
//! checks, keeps nor returns checksums (Ceph RGW before 19.x accepts the
//! header and drops it). Such a store does check Content-MD5, so that goes
//! with every PUT and part until the endpoint has shown that it checks the
//! CRC itself (by echoing it in its reply, as S3 does).
//!
//! What an endpoint does is learned from its replies — never from a brand
//! name in the config — remembered per endpoint of the namespace, and told
//! to shims in the capability exchange ([`StoreChecksums`]).
//!
//! Uploads never use aws-chunked bodies with trailing checksums (RGW 16.2
//! refuses them): region bodies stream as `UNSIGNED-PAYLOAD` with the
//! checksums in signed headers, in-memory bodies are signed with their
//! SHA-256.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use base64::Engine;
use md5::Digest;

use super::client::header;
use super::error::S3Error;
use super::model::StoreChecksums;
use crate::hostmem::HostRegion;

/// The user metadata holding the object's CRC64NVME, as the agent computed
/// it from the bytes it was given (base64 of the big-endian value, as
/// `x-amz-checksum-crc64nvme`).
pub const META_CRC64NVME: &str = "x-amz-meta-sluice-crc64nvme";
const CHECKSUM: &str = "x-amz-checksum-crc64nvme";

/// The full-object CRC64NVME in a reply's headers, if the store sent one
/// (a composite checksum of a multipart upload is not one).
pub(super) fn full_object_crc(h: &http::HeaderMap) -> Option<u64> {
    use base64::Engine;
    let kind = h.get("x-amz-checksum-type").and_then(|v| v.to_str().ok());
    if kind.is_some_and(|k| !k.eq_ignore_ascii_case("FULL_OBJECT")) {
        return None;
    }
    let v = h.get("x-amz-checksum-crc64nvme")?.to_str().ok()?;
    let b = base64::engine::general_purpose::STANDARD.decode(v.trim()).ok()?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// A fact about an endpoint: seen to hold, seen not to (0: not seen yet).
const YES: u8 = 1;
const NO: u8 = 2;

/// What one endpoint showed. Each reply of the kind overwrites its fact
/// (a store upgraded in place is noticed).
#[derive(Debug, Default)]
struct Facts {
    /// A PutObject reply echoed the checksum sent with the bytes.
    put: AtomicU8,
    /// An UploadPart reply did (a store may check whole PUTs and not parts:
    /// s3s-fs does).
    part: AtomicU8,
    /// A whole-object GET of an object stored with a checksum returned it.
    get: AtomicU8,
    /// A one-sided GET with `x-sluice-rdma-object-max` was answered with
    /// `x-sluice-rdma-fits` (Sluice's gateway checks the size first).
    size_check: AtomicU8,
}

/// Which upload request a reply answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Upload {
    Put,
    Part,
}

/// What each endpoint of a namespace does with checksums.
#[derive(Debug)]
pub(super) struct Learned {
    endpoints: HashMap<String, Facts>,
}

impl Learned {
    pub fn new<'a>(endpoints: impl IntoIterator<Item = &'a str>) -> Self {
        Self { endpoints: endpoints.into_iter().map(|e| (e.to_owned(), Facts::default())).collect() }
    }

    fn set(&self, endpoint: &str, what: &'static str, yes: bool, cell: impl Fn(&Facts) -> &AtomicU8) {
        // An endpoint the namespace does not list (none today) teaches nothing.
        let Some(f) = self.endpoints.get(endpoint) else { return };
        let new = if yes { YES } else { NO };
        if cell(f).swap(new, Ordering::Relaxed) != new {
            tracing::info!(endpoint, what, yes, "learned what the store does");
        }
    }

    /// A PUT or UploadPart reply that echoed the checksum sent, or not.
    pub fn upload_reply(&self, endpoint: &str, kind: Upload, echoed: bool) {
        match kind {
            Upload::Put => self.set(endpoint, "checks x-amz-checksum-crc64nvme on PUT", echoed, |f| &f.put),
            Upload::Part => self.set(endpoint, "checks x-amz-checksum-crc64nvme on UploadPart", echoed, |f| &f.part),
        }
    }

    /// A whole-object GET of an object stored with a checksum: whether
    /// the store returned it.
    pub fn get_reply(&self, endpoint: &str, returned: bool) {
        self.set(endpoint, "returns x-amz-checksum-crc64nvme on GET", returned, |f| &f.get);
    }

    /// A one-sided GET that asked for the size check: whether the reply
    /// showed it was made.
    pub fn size_check_reply(&self, endpoint: &str, checked: bool) {
        self.set(endpoint, "checks x-sluice-rdma-object-max before moving bytes", checked, |f| &f.size_check);
    }

    /// `endpoint` was last seen to check the size before moving bytes.
    pub fn checks_size(&self, endpoint: &str) -> bool {
        self.endpoints.get(endpoint).is_some_and(|f| f.size_check.load(Ordering::Relaxed) == YES)
    }

    /// Every endpoint has shown that it checks the CRC64NVME of a `kind`
    /// request, so Content-MD5 would add nothing there.
    pub fn crc_checked(&self, kind: Upload) -> bool {
        let cell = |f: &Facts| match kind {
            Upload::Put => f.put.load(Ordering::Relaxed),
            Upload::Part => f.part.load(Ordering::Relaxed),
        };
        !self.endpoints.is_empty() && self.endpoints.values().all(|f| cell(f) == YES)
    }

    /// The namespace's answer: `Ignored` as soon as one endpoint was seen
    /// to drop checksums (reads from it are checked against the metadata
    /// only), `Kept` once every endpoint has shown it keeps them.
    pub fn summary(&self) -> StoreChecksums {
        let load = |c: &AtomicU8| c.load(Ordering::Relaxed);
        if self.endpoints.values().any(|f| load(&f.put) == NO || load(&f.get) == NO) {
            StoreChecksums::Ignored
        } else if !self.endpoints.is_empty()
            && self.endpoints.values().all(|f| load(&f.put) == YES || load(&f.get) == YES)
        {
            StoreChecksums::Kept
        } else {
            StoreChecksums::Unknown
        }
    }
}

/// `x-amz-checksum-crc64nvme`'s spelling of a CRC64NVME.
pub(super) fn b64(crc: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

fn from_b64(v: &str) -> Option<u64> {
    let b = base64::engine::general_purpose::STANDARD.decode(v.trim()).ok()?;
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// The CRC64NVME the agent kept in the object's metadata, if it has one.
pub(super) fn agent_crc(h: &http::HeaderMap) -> Option<u64> {
    from_b64(header(h, META_CRC64NVME))
}

/// The CRC64NVME of `a` followed by `len` bytes whose CRC is `b`.
pub(super) fn combine(a: Option<u64>, b: u64, len: u64) -> u64 {
    match a {
        None => b,
        Some(a) => sluice_dataplane::crc64::combine(a, b, len),
    }
}

/// An ETag without quotes or a weak prefix.
pub(super) fn bare_etag(etag: &str) -> &str {
    etag.trim().trim_start_matches("W/").trim_matches('"')
}

/// Whether `etag` is that of an object stored by one PUT (a multipart
/// object's is `<hash>-<parts>`).
pub(super) fn single_part(etag: &str) -> bool {
    !etag.is_empty() && !bare_etag(etag).contains('-')
}

/// The S3 ETag of a multipart object from its parts' MD5s: the MD5 of
/// their concatenation, a dash and the part count.
pub(super) fn multipart_etag(md5s: &[[u8; 16]]) -> String {
    let mut h = md5::Md5::new();
    for m in md5s {
        h.update(m);
    }
    format!("\"{}-{}\"", hex::encode(h.finalize()), md5s.len())
}

/// The digests sent with one PUT or part body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Digests {
    pub crc: u64,
    /// `None` where the store is known to check the CRC.
    pub md5: Option<[u8; 16]>,
}

/// What a store's reply to an upload proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Proof {
    /// It echoed the CRC64NVME sent (so it checks and keeps it).
    pub echoed: bool,
    /// It stored exactly the bytes sent: the echo, or an ETag equal to
    /// their MD5.
    pub confirmed: bool,
}

fn md5_array(h: md5::Md5) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize());
    out
}

impl Digests {
    /// Of bytes in memory (call off the async threads for large ones).
    pub fn of(data: &[u8], md5: bool) -> Self {
        let mut crc = sluice_dataplane::crc64::digest();
        crc.update(data);
        Self { crc: crc.finalize(), md5: md5.then(|| md5_array(md5::Md5::new_with_prefix(data))) }
    }

    /// Of a region window, in one pass off the async threads (a pass over
    /// up to gigabytes must not hold up other tenants' small requests).
    pub async fn of_region(region: &Arc<dyn HostRegion>, offset: u64, len: u64, md5: bool) -> Result<Self, S3Error> {
        let region = region.clone();
        tokio::task::spawn_blocking(move || {
            let mut crc = sluice_dataplane::crc64::digest();
            let mut sum = md5.then(md5::Md5::new);
            let mut buf = vec![0u8; (1 << 20).min(len.max(1) as usize)];
            let mut pos = 0;
            while pos < len {
                let n = (len - pos).min(buf.len() as u64) as usize;
                region.read_at(offset + pos, &mut buf[..n]).map_err(|e| S3Error::Destination(e.to_string()))?;
                crc.update(&buf[..n]);
                if let Some(s) = &mut sum {
                    s.update(&buf[..n]);
                }
                pos += n as u64;
            }
            Ok(Self { crc: crc.finalize(), md5: sum.map(md5_array) })
        })
        .await
        .map_err(|e| S3Error::Destination(format!("checksum task failed: {e}")))?
    }

    /// The request headers: the CRC always (a store that checks it refuses
    /// damaged bytes, and a store that ignored an RDMA token then refuses
    /// the empty body), Content-MD5 when computed.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![(CHECKSUM, b64(self.crc))];
        if let Some(m) = self.md5 {
            h.push(("content-md5", base64::engine::general_purpose::STANDARD.encode(m)));
        }
        h
    }

    /// What the store's reply to these bytes proves. An echoed checksum
    /// other than the one sent means the store kept other bytes.
    pub fn check_reply(&self, reply: &http::HeaderMap) -> Result<Proof, S3Error> {
        let echo = header(reply, CHECKSUM);
        if !echo.is_empty() {
            if from_b64(echo) != Some(self.crc) {
                return Err(S3Error::Integrity(format!(
                    "the store kept CRC64NVME {echo} for bytes sent with {}",
                    b64(self.crc)
                )));
            }
            return Ok(Proof { echoed: true, confirmed: true });
        }
        // Stores whose ETag is not an MD5 (encrypted at rest, say) prove
        // nothing this way; nor is it an error.
        let etag = bare_etag(header(reply, "etag"));
        let confirmed = self.md5.is_some_and(|m| etag.eq_ignore_ascii_case(&hex::encode(m)));
        Ok(Proof { echoed: false, confirmed })
    }
}

/// Why an upload is not reported verified, when it is not.
pub(super) const UNCONFIRMED_UPLOAD: &str = "the store confirmed neither the CRC64NVME nor the MD5 of the bytes it \
                                             stored (no checksum echoed, an ETag that is not their MD5)";

/// The checksums a GET's bytes are checked against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Expected {
    /// The store's full-object CRC64NVME.
    pub store: Option<u64>,
    /// The one the agent kept in the object's metadata.
    pub agent: Option<u64>,
}

impl Expected {
    /// From a reply's headers; the store's checksum counts only when the
    /// reply holds the `whole` object.
    pub fn from_headers(h: &http::HeaderMap, whole: bool) -> Self {
        Self { store: if whole { full_object_crc(h) } else { None }, agent: agent_crc(h) }
    }

    pub fn any(&self) -> bool {
        self.store.is_some() || self.agent.is_some()
    }

    /// Checks the CRC64NVME of the bytes read against every checksum known.
    pub fn check(&self, got: u64) -> Result<(), S3Error> {
        for (whose, want) in [("the store's", self.store), ("the object's metadata", self.agent)] {
            if let Some(want) = want.filter(|w| *w != got) {
                return Err(S3Error::Integrity(format!(
                    "the bytes read have CRC64NVME {got:016x}, {whose} checksum of the object is {want:016x}"
                )));
            }
        }
        Ok(())
    }
}

/// Why a read is not reported verified.
pub(super) mod unverified {
    pub const RANGED: &str = "a ranged read (only whole-object reads are checked against the object's CRC64NVME)";
    pub const NO_CHECKSUM: &str = "the object carries no CRC64NVME: the store returned none and the object was \
                                   not written through Sluice";
    pub const DISABLED: &str = "verify_checksums = false in this namespace";
}

/// A PUT whose region was written while it was being uploaded: its bytes
/// no longer match the checksum summed first (which the object's metadata
/// holds), so nothing is committed.
pub(super) fn region_changed(part: u64) -> S3Error {
    S3Error::PreconditionFailed(format!(
        "the region's bytes changed while part {part} was being uploaded; nothing was stored"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        for (n, v) in pairs {
            m.insert(*n, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn the_multipart_etag_is_s3s() {
        // Two parts "a" and "b": md5(md5("a") || md5("b")).
        let (a, b) = (Digests::of(b"a", true).md5.unwrap(), Digests::of(b"b", true).md5.unwrap());
        let mut both = a.to_vec();
        both.extend_from_slice(&b);
        let want = format!("\"{}-2\"", hex::encode(Digests::of(&both, true).md5.unwrap()));
        assert_eq!(multipart_etag(&[a, b]), want);
        assert!(single_part("\"0cc175b9c0f1b6a831c399e269772661\"") && !single_part(&want) && !single_part(""));
    }

    #[test]
    fn a_reply_proves_the_bytes_by_echo_or_md5_etag() {
        let d = Digests::of(b"hello", true);
        assert_eq!(hex::encode(d.md5.unwrap()), "5d41402abc4b2a76b9719d911017c592");
        let echo = b64(d.crc);
        let p = d.check_reply(&h(&[(CHECKSUM, echo.as_str()), ("etag", "\"x\"")])).unwrap();
        assert_eq!(p, Proof { echoed: true, confirmed: true });
        let p = d.check_reply(&h(&[("etag", "\"5D41402ABC4B2A76B9719D911017C592\"")])).unwrap();
        assert_eq!(p, Proof { echoed: false, confirmed: true });
        let p = d.check_reply(&h(&[("etag", "\"0123456789abcdef0123456789abcdef\"")])).unwrap();
        assert_eq!(p, Proof { echoed: false, confirmed: false }, "an ETag that is not the MD5 proves nothing");
        let other = b64(d.crc ^ 1);
        assert!(matches!(d.check_reply(&h(&[(CHECKSUM, other.as_str())])), Err(S3Error::Integrity(_))));
        assert_eq!(Digests::of(b"hello", false).headers().len(), 1, "no Content-MD5 unless asked for");
    }

    #[test]
    fn reads_are_checked_against_every_checksum_known() {
        let crc = Digests::of(b"data", false).crc;
        let both = Expected { store: Some(crc), agent: Some(crc) };
        assert!(both.check(crc).is_ok());
        assert!(Expected { agent: Some(crc), ..Default::default() }.check(crc ^ 1).is_err());
        let e = Expected { store: Some(crc), agent: Some(crc ^ 1) }.check(crc).unwrap_err();
        assert!(e.to_string().contains("metadata"), "{e}");
        let meta = b64(crc);
        let got = Expected::from_headers(&h(&[(META_CRC64NVME, meta.as_str()), (CHECKSUM, meta.as_str())]), false);
        assert_eq!(got, Expected { store: None, agent: Some(crc) }, "a part's reply has no store checksum");
        assert!(!Expected::default().any());
    }

    #[test]
    fn what_a_namespace_store_does_is_its_weakest_endpoints() {
        let l = Learned::new(["http://a", "http://b"]);
        assert_eq!(l.summary(), StoreChecksums::Unknown);
        l.upload_reply("http://a", Upload::Put, true);
        assert_eq!(l.summary(), StoreChecksums::Unknown, "b has not told");
        assert!(!l.crc_checked(Upload::Put));
        l.get_reply("http://b", true);
        assert_eq!(l.summary(), StoreChecksums::Kept);
        assert!(!l.crc_checked(Upload::Put), "b has not shown it checks PUTs");
        l.upload_reply("http://b", Upload::Put, true);
        assert!(l.crc_checked(Upload::Put) && !l.crc_checked(Upload::Part));
        l.upload_reply("http://a", Upload::Put, false);
        assert_eq!(l.summary(), StoreChecksums::Ignored);
        assert!(!l.crc_checked(Upload::Put));
        l.upload_reply("http://elsewhere", Upload::Put, true);
    }
}
