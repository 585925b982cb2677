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

/// Checks that a reply's `Content-Range` (`a`, `b`, `total`) says it holds
/// exactly what was asked, bytes `first..=last` clipped to the object's
/// end: its bytes are then the object's from `first` on. A store that
/// ignored part of the range, or sent a range that does not fit its own
/// total, is not trusted with the bytes.
fn check_span((a, b, total): (u64, u64, u64), first: u64, last: u64) -> Result<(), S3Error> {
    if a != first {
        return Err(S3Error::Protocol(format!("asked for bytes from {first}, got from {a}")));
    }
    if a > b || b >= total {
        return Err(S3Error::Protocol(format!("Content-Range bytes {a}-{b}/{total} does not fit its own total")));
    }
    if b != last.min(total - 1) {
        return Err(S3Error::Protocol(format!("asked for bytes {first}-{last}, got {a}-{b} of {total}")));
    }
    Ok(())
}

/// Where the first reply's bytes start, the object's size and its ETag,
/// from a reply to a ranged GET from `start` (206 with Content-Range, or a
/// 200 with the whole object from a store that ignored Range).
pub(super) fn reply_span(resp: &Reply, start: u64, last: u64) -> Result<(u64, u64, String), S3Error> {
    let headers = &resp.headers;
    let etag = headers.get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if resp.status == http::StatusCode::PARTIAL_CONTENT {
        let cr = headers.get("content-range").and_then(|v| v.to_str().ok()).unwrap_or_default();
        let span = parse_content_range(cr).ok_or_else(|| S3Error::Protocol(format!("bad Content-Range {cr:?}")))?;
        check_span(span, start, last)?;
        return Ok((span.0, span.2, etag));
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
    /// `Content-Range`, which must hold exactly the bytes asked for.
    /// Without `Content-Range` only the ETag speaks: an HTTP part requires
    /// it ([`Self::check_http`]).
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
            let (a, b, total) =
                parse_content_range(cr).ok_or_else(|| S3Error::Protocol(format!("bad Content-Range {cr:?}")))?;
            if total != self.size {
                return Err(changed(format!("{} bytes at the start, {total} now", self.size)));
            }
            check_span((a, b, total), from, to - 1)?;
        }
        Ok(())
    }

    /// [`Self::check`] for a part's HTTP reply, whose body holds the bytes:
    /// without `Content-Range` nothing says which of the object's bytes
    /// they are (a store or proxy that ignored Range and answered 206), so
    /// it is refused.
    pub fn check_http(&self, headers: &http::HeaderMap, from: u64, to: u64) -> Result<(), S3Error> {
        if !headers.contains_key("content-range") {
            return Err(S3Error::Protocol(format!("a 206 for bytes {from}-{} without Content-Range", to - 1)));
        }
        self.check(headers, from, to)
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
    fn a_reply_must_hold_exactly_the_bytes_asked_for() {
        let v = Version { etag: "\"a\"", size: 100 };
        let h = |cr: &str| {
            let mut m = http::HeaderMap::new();
            m.insert("content-range", cr.parse().unwrap());
            m
        };
        let protocol = |r: Result<(), S3Error>| matches!(r, Err(S3Error::Protocol(_)));
        assert!(v.check_http(&h("bytes 10-19/100"), 10, 20).is_ok());
        // Fewer or more bytes than asked, a range past its own total, or
        // none said at all (a 206 from something that ignored Range).
        assert!(protocol(v.check(&h("bytes 10-14/100"), 10, 20)));
        assert!(protocol(v.check(&h("bytes 10-29/100"), 10, 20)));
        assert!(protocol(v.check(&h("bytes 10-9/100"), 10, 20)));
        assert!(protocol(v.check_http(&http::HeaderMap::new(), 10, 20)));
        // The first reply: the object's end clips what was asked.
        assert!(check_span((0, 49, 50), 0, 999).is_ok());
        assert!(check_span((0, 999, 5000), 0, 999).is_ok());
        assert!(protocol(check_span((0, 99, 1000), 0, 999)), "a shorter range than asked");
        assert!(protocol(check_span((100, 199, 50), 100, 199)), "a range past its own total");
        assert!(protocol(check_span((5, 9, 50), 0, 9)), "not from where asked");
        assert!(check_span((u64::MAX - 5, u64::MAX - 1, u64::MAX), u64::MAX - 5, u64::MAX).is_ok());
    }

    #[test]
    fn content_range() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(parse_content_range("items 0-9/100"), None);
    }
}
