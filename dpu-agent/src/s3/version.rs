//! The version of an object a read is on: every part of a GET, over HTTP
//! or RDMA, must come from the object the first part came from.

use super::client::Reply;
use super::error::S3Error;

/// Parses `Content-Range: bytes a-b/total`.
pub fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, total.parse().ok()?))
}

/// Where the first reply's bytes start, the object's size and its ETag,
/// from a reply to a ranged GET from `start` (206 with Content-Range, or a
/// 200 with the whole object from a store that ignored Range).
pub(super) fn reply_span(resp: &Reply, start: u64) -> Result<(u64, u64, String), S3Error> {
    let headers = &resp.headers;
    let etag = headers.get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if resp.status == http::StatusCode::PARTIAL_CONTENT {
        let cr = headers.get("content-range").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let (a, _b, total) =
            parse_content_range(cr).ok_or_else(|| S3Error::Protocol(format!("bad Content-Range {cr:?}")))?;
        if a != start {
            return Err(S3Error::Protocol(format!("asked for bytes from {start}, got from {a}")));
        }
        return Ok((a, total, etag));
    }
    // The store ignored Range and sent the whole object.
    if start != 0 {
        return Err(S3Error::Protocol("the store ignored the Range header".into()));
    }
    let len = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| S3Error::Protocol("200 without Content-Length".into()))?;
    Ok((0, len, etag))
}

/// The version of an object a read started on (from its first reply):
/// every later part must come from the same one, or the read fails rather
/// than return bytes of two versions as one.
#[derive(Clone, Copy, Debug)]
pub struct Version<'a> {
    pub etag: &'a str,
    pub size: u64,
}

impl Version<'_> {
    /// Checks a part's reply (HTTP or RDMA) for `[from, to)`: the same ETag
    /// (when the store names one) and the same object size in
    /// `Content-Range`, starting where asked.
    pub fn check(&self, headers: &http::HeaderMap, from: u64, to: u64) -> Result<(), S3Error> {
        let changed = |what: String| {
            S3Error::PreconditionFailed(format!(
                "the object changed while it was read ({what} for bytes {from}-{}); nothing was returned",
                to - 1
            ))
        };
        let got = headers.get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !self.etag.is_empty() && !got.is_empty() && got != self.etag {
            return Err(changed(format!("ETag {} at the start, {got} now", self.etag)));
        }
        if let Some(cr) = headers.get("content-range").and_then(|v| v.to_str().ok()) {
            let (a, _, total) =
                parse_content_range(cr).ok_or_else(|| S3Error::Protocol(format!("bad Content-Range {cr:?}")))?;
            if total != self.size {
                return Err(changed(format!("{} bytes at the start, {total} now", self.size)));
            }
            if a != from {
                return Err(S3Error::Protocol(format!("asked for bytes from {from}, got from {a}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_another_version_are_refused() {
        let v = Version { etag: "\"a\"", size: 100 };
        let h = |etag: &str, cr: &str| {
            let mut m = http::HeaderMap::new();
            if !etag.is_empty() {
                m.insert("etag", etag.parse().unwrap());
            }
            if !cr.is_empty() {
                m.insert("content-range", cr.parse().unwrap());
            }
            m
        };
        assert!(v.check(&h("\"a\"", "bytes 10-19/100"), 10, 20).is_ok());
        assert!(v.check(&h("", "bytes 10-19/100"), 10, 20).is_ok(), "no ETag: the size still speaks");
        let e = v.check(&h("\"b\"", "bytes 10-19/100"), 10, 20).unwrap_err();
        assert!(matches!(&e, S3Error::PreconditionFailed(m) if m.contains("changed")), "{e}");
        let e = v.check(&h("", "bytes 10-19/101"), 10, 20).unwrap_err();
        assert!(matches!(e, S3Error::PreconditionFailed(_)), "{e}");
        assert!(matches!(v.check(&h("\"a\"", "bytes 0-9/100"), 10, 20), Err(S3Error::Protocol(_))));
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(parse_content_range("items 0-9/100"), None);
    }
}
