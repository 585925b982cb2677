//! S3 errors: parsed from the store's XML error bodies and HTTP statuses.

use serde::Deserialize;
use sluice_proto::common::ErrorCode;

/// A failed S3 operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3Error {
    #[error("no such key {0:?}")]
    NoSuchKey(String),
    /// The bucket, as the store named it (or as the request did).
    #[error("no such bucket {0:?} on the store")]
    NoSuchBucket(String),
    #[error("the store denied access ({code}): {message}")]
    AccessDenied { code: String, message: String },
    #[error("range not satisfiable: {0}")]
    InvalidRange(String),
    #[error("the object changed while it was being read ({0})")]
    PreconditionFailed(String),
    #[error("the store rejected the request: HTTP {status} {code}: {message}")]
    Rejected { status: u16, code: String, message: String },
    /// The store found the bytes it received damaged: they did not match
    /// the digest sent with them (Content-MD5, x-amz-checksum-*, the signed
    /// SHA-256). A bit flipped on the way; retried, since the next try
    /// sends the bytes again.
    #[error("the store refused the bytes as damaged on the way ({code}: {message}){}", attempts_note(*.attempts))]
    Damaged { code: String, message: String, attempts: u32 },
    #[error("the store failed: HTTP {status} {code}: {message}{}", attempts_note(*.attempts))]
    Server { status: u16, code: String, message: String, attempts: u32 },
    #[error("cannot reach the store: {message}{}", attempts_note(*.attempts))]
    Connection { message: String, attempts: u32 },
    /// The TLS handshake with an https:// endpoint failed (most often its
    /// certificate is not trusted). Not retried: the next try fails alike.
    #[error("TLS with the store failed: {0}")]
    Tls(String),
    #[error("transfer broke: {message}{}", attempts_note(*.attempts))]
    TransferFailed { message: String, attempts: u32 },
    #[error("the data needs {needed} bytes at offset {offset}, but the region holds {region_len}")]
    DoesNotFit { needed: u64, offset: u64, region_len: u64 },
    #[error("writing into host memory: {0}")]
    Destination(String),
    #[error("unexpected response from the store: {0}")]
    Protocol(String),
    /// An encrypted object failed authentication (tampered, truncated,
    /// swapped, or not encrypted where it must be).
    #[error("integrity check failed: {0}")]
    Integrity(String),
    /// The tenant's quota or the fair scheduler refused a part.
    #[error("{0}")]
    Quota(String),
    /// Keys or the encryption machinery failed (not the object's fault).
    #[error("encryption: {0}")]
    Encryption(String),
    /// The store declined a data path token (the part then goes over
    /// HTTP; this error never leaves the S3 client's caller).
    #[error("{0}")]
    RdmaDeclined(String),
    /// The request cannot be served into or from this region here (GPU
    /// memory on a namespace that would need the CPU); refused before
    /// anything moved.
    #[error("{0}")]
    Unsupported(String),
}

fn attempts_note(n: u32) -> String {
    if n > 1 {
        format!(" (after {n} attempts)")
    } else {
        String::new()
    }
}

impl S3Error {
    /// 5xx, throttling and connection/transfer breaks are retried; 4xx never,
    /// nor 507 Insufficient Storage (a full store stays full for a while).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Server { status, .. } => *status != 507,
            Self::Connection { .. } | Self::TransferFailed { .. } | Self::Damaged { .. } => true,
            _ => false,
        }
    }

    /// Records how many attempts were made before giving up.
    pub fn after_attempts(self, n: u32) -> Self {
        match self {
            Self::Server { status, code, message, .. } => Self::Server { status, code, message, attempts: n },
            Self::Connection { message, .. } => Self::Connection { message, attempts: n },
            Self::TransferFailed { message, .. } => Self::TransferFailed { message, attempts: n },
            Self::Damaged { code, message, .. } => Self::Damaged { code, message, attempts: n },
            other => other,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NoSuchKey(_) => ErrorCode::NoSuchKey,
            Self::NoSuchBucket(_) => ErrorCode::NoSuchBucket,
            Self::AccessDenied { .. } => ErrorCode::AccessDenied,
            Self::InvalidRange(_) => ErrorCode::InvalidRange,
            Self::PreconditionFailed(_) => ErrorCode::PreconditionFailed,
            Self::Rejected { .. } => ErrorCode::BadRequest,
            Self::Server { .. } | Self::Connection { .. } | Self::Tls(_) => ErrorCode::StoreUnavailable,
            Self::TransferFailed { .. } => ErrorCode::TransferFailed,
            Self::DoesNotFit { .. } => ErrorCode::RegionTooSmall,
            Self::Destination(_) | Self::Protocol(_) | Self::Encryption(_) => ErrorCode::Internal,
            Self::RdmaDeclined(_) => ErrorCode::TransferFailed,
            Self::Integrity(_) | Self::Damaged { .. } => ErrorCode::Integrity,
            Self::Quota(_) => ErrorCode::QuotaExceeded,
            Self::Unsupported(_) => ErrorCode::Unsupported,
        }
    }

    /// Maps a transport-level reqwest error.
    pub fn from_reqwest(e: reqwest::Error) -> Self {
        // Walk the source chain: hyper hides the useful part (e.g. "connection refused").
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        if let Some(tls) = tls_cause(&e) {
            use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
            let hint = match tls {
                rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. }) => {
                    "; the store's certificate does not name the endpoint's host: use a name it carries in the \
                     endpoint, or issue it for this one"
                }
                rustls::Error::InvalidCertificate(_) => {
                    "; the store's certificate is not trusted: set the namespace's ca_file to the PEM of the CA \
                     that issued it (or add that CA to the system's trust store)"
                }
                _ => "",
            };
            return Self::Tls(format!("{msg}{hint}"));
        }
        if e.is_body() || e.is_decode() {
            Self::TransferFailed { message: msg, attempts: 1 }
        } else {
            Self::Connection { message: msg, attempts: 1 }
        }
    }

    /// Builds the error for a non-success response.
    pub fn from_response(status: u16, body: &str, key: Option<&str>) -> Self {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct XmlError {
            code: String,
            message: String,
            bucket_name: String,
        }
        let parsed: XmlError = quick_xml::de::from_str(body).unwrap_or_default();
        let (code, message) = (parsed.code, parsed.message);
        let key = key.unwrap_or_default().to_owned();
        match (status, code.as_str()) {
            // RGW names the bucket only in <BucketName>, with no <Message>.
            (404, "NoSuchBucket") => Self::NoSuchBucket(parsed.bucket_name),
            // The digest sent with the bytes did not match them on arrival.
            (400, "BadDigest" | "XAmzContentChecksumMismatch" | "XAmzContentSHA256Mismatch") => {
                Self::Damaged { code, message, attempts: 1 }
            }
            (404, _) => Self::NoSuchKey(key),
            (403, _) => Self::AccessDenied {
                code: if code.is_empty() { "AccessDenied".into() } else { code },
                message: if message.is_empty() { "HTTP 403".into() } else { message },
            },
            (416, _) => Self::InvalidRange(if message.is_empty() { "HTTP 416".into() } else { message }),
            (412, _) => Self::PreconditionFailed(key),
            (429, _) | (500..=599, _) => Self::Server { status, code, message, attempts: 1 },
            // S3 throttles with 503 SlowDown, but some stores use 400 + SlowDown.
            (_, "SlowDown" | "RequestTimeout" | "InternalError") => Self::Server { status, code, message, attempts: 1 },
            _ => Self::Rejected { status, code, message },
        }
    }
}

impl S3Error {
    /// Names `bucket` in a [`Self::NoSuchBucket`] whose reply did not.
    pub fn naming_bucket(self, bucket: &str) -> Self {
        match self {
            Self::NoSuchBucket(b) if b.is_empty() => Self::NoSuchBucket(bucket.to_owned()),
            other => other,
        }
    }
}

/// The rustls error somewhere under `e`. Connectors wrap it in
/// `io::Error`s, whose `source()` skips the wrapped error, so each one is
/// opened as well.
fn tls_cause<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if let Some(tls) = tls_cause(inner) {
                return Some(tls);
            }
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_s3_error_bodies() {
        let body = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>";
        assert!(matches!(S3Error::from_response(404, body, Some("k")), S3Error::NoSuchKey(k) if k == "k"));
        let body = "<Error><Code>SignatureDoesNotMatch</Code><Message>bad sig</Message></Error>";
        let e = S3Error::from_response(403, body, None);
        assert_eq!(e.code(), ErrorCode::AccessDenied);
        assert!(!e.is_retryable());
        let e = S3Error::from_response(503, "<Error><Code>SlowDown</Code></Error>", None);
        assert!(e.is_retryable());
        assert!(!S3Error::from_response(400, "<Error><Code>InvalidArgument</Code></Error>", None).is_retryable());
        assert!(S3Error::from_response(400, "<Error><Code>SlowDown</Code></Error>", None).is_retryable());
        let full = "<Error><Code>InsufficientStorage</Code><Message>the store is out of space</Message></Error>";
        let e = S3Error::from_response(507, full, None);
        assert!(!e.is_retryable(), "a full store is not retried");
        assert_eq!(e.code(), ErrorCode::StoreUnavailable);
        assert!(e.to_string().contains("out of space"), "{e}");
        assert_eq!(
            S3Error::from_response(404, "<Error><Code>NoSuchBucket</Code></Error>", None).code(),
            ErrorCode::NoSuchBucket
        );
    }

    /// RGW's NoSuchBucket has no <Message>: the bucket's name comes from
    /// <BucketName>, or from the request when the reply has none.
    #[test]
    fn a_missing_bucket_is_named() {
        let rgw = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchBucket</Code>\
                   <BucketName>data</BucketName><RequestId>tx1</RequestId><HostId>h</HostId></Error>";
        let e = S3Error::from_response(404, rgw, Some("k"));
        assert_eq!(e.to_string(), "no such bucket \"data\" on the store");
        let bare = S3Error::from_response(404, "<Error><Code>NoSuchBucket</Code></Error>", None);
        assert_eq!(bare.naming_bucket("b2").to_string(), "no such bucket \"b2\" on the store");
        let named = S3Error::from_response(404, rgw, None).naming_bucket("other");
        assert!(named.to_string().contains("\"data\""), "the store's name is kept: {named}");
    }

    /// A body the store found damaged is retried, and if it stays damaged
    /// the caller gets INTEGRITY, not a generic bad request.
    #[test]
    fn damaged_bodies_are_retried_then_integrity() {
        for code in ["BadDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch"] {
            let e = S3Error::from_response(400, &format!("<Error><Code>{code}</Code></Error>"), None);
            assert!(e.is_retryable(), "{code}");
            let e = e.after_attempts(3);
            assert_eq!(e.code(), ErrorCode::Integrity, "{code}");
            assert!(e.to_string().contains("after 3 attempts") && e.to_string().contains(code), "{e}");
        }
        assert!(!S3Error::from_response(400, "<Error><Code>InvalidDigest</Code></Error>", None).is_retryable());
    }

    #[test]
    fn attempts_are_reported() {
        let e = S3Error::Connection { message: "refused".into(), attempts: 1 }.after_attempts(4);
        assert!(e.to_string().contains("after 4 attempts"), "{e}");
    }
}
