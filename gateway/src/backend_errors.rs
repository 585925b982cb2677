//! Naming the backend's failures on the way out.

use http::StatusCode;
use s3s::{S3Error, S3ErrorCode};
use tracing::warn;

/// An S3 error with a code of our own and its HTTP status.
pub(crate) fn error(code: &str, status: StatusCode, msg: impl Into<String>) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom(code.to_owned().into()), msg.into());
    e.set_status_code(status);
    e
}

/// The backend's internal errors carry their cause only as a source, which
/// s3s leaves out of the response: the client would see a bare
/// `InternalError`. Name the cause (it is the store's own condition, such as
/// an I/O error, never a credential), and answer a full disk with 507
/// `InsufficientStorage`, which retrying will not cure.
pub(crate) fn explain_internal(mut e: S3Error) -> S3Error {
    if *e.code() != S3ErrorCode::InternalError || e.message().is_some() {
        return e;
    }
    let Some(source) = e.source() else { return e };
    let mut cause = source.to_string();
    let mut full = false;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            full |= io.kind() == std::io::ErrorKind::StorageFull;
        }
        next = err.source();
        if let Some(n) = next {
            cause.push_str(": ");
            cause.push_str(&n.to_string());
        }
    }
    warn!(cause = %cause, storage_full = full, "the store failed a request");
    if full {
        return error(
            "InsufficientStorage",
            StatusCode::INSUFFICIENT_STORAGE,
            format!("the store is out of space: {cause}"),
        );
    }
    e.set_message(format!("backend error: {cause}"));
    e
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_507_and_named() {
        let e = explain_internal(S3Error::internal_error(std::io::Error::from(std::io::ErrorKind::StorageFull)));
        assert_eq!(e.status_code(), Some(StatusCode::INSUFFICIENT_STORAGE));
        assert_eq!(e.code().as_str(), "InsufficientStorage");
        assert!(e.message().unwrap().contains("out of space"), "{:?}", e.message());
    }

    #[test]
    fn other_backend_failures_carry_their_cause() {
        // As backends build them: InternalError with the I/O error as source only.
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "open .tmp.3.internal.part");
        let e = explain_internal(S3Error::with_source(S3ErrorCode::InternalError, Box::new(io)));
        assert_eq!(*e.code(), S3ErrorCode::InternalError);
        assert_eq!(e.message(), Some("backend error: open .tmp.3.internal.part"));
    }

    #[test]
    fn client_errors_and_explained_errors_are_untouched() {
        let e = explain_internal(S3Error::with_message(S3ErrorCode::NoSuchKey, "gone"));
        assert_eq!((e.code().as_str(), e.message()), ("NoSuchKey", Some("gone")));
        let e = explain_internal(S3Error::with_message(S3ErrorCode::InternalError, "already said"));
        assert_eq!(e.message(), Some("already said"));
        let e = explain_internal(S3Error::new(S3ErrorCode::InternalError));
        assert_eq!(e.message(), None, "nothing to add without a source");
    }
}
