//! The one conversion between a typed [`ErrorDetail`] and a gRPC status:
//! the agent sends its errors this way and the shim reads them back.

use prost::Message;

use crate::common::{ErrorCode, ErrorDetail};

/// The gRPC code a typed error travels under (for clients that only look
/// at the code; the detail carries the typed one).
pub fn grpc_code(code: ErrorCode) -> tonic::Code {
    match code {
        ErrorCode::UnknownTenant | ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorCode::AccessDenied => tonic::Code::PermissionDenied,
        ErrorCode::UnknownNamespace | ErrorCode::NoSuchKey | ErrorCode::NoSuchBucket | ErrorCode::UnknownRegion => {
            tonic::Code::NotFound
        }
        ErrorCode::BadRequest
        | ErrorCode::RegionTooSmall
        | ErrorCode::OutOfBounds
        | ErrorCode::InvalidRange
        | ErrorCode::Protocol => tonic::Code::InvalidArgument,
        ErrorCode::StoreUnavailable | ErrorCode::AgentUnavailable => tonic::Code::Unavailable,
        ErrorCode::PreconditionFailed => tonic::Code::FailedPrecondition,
        ErrorCode::ResourceExhausted | ErrorCode::QuotaExceeded => tonic::Code::ResourceExhausted,
        ErrorCode::Integrity => tonic::Code::DataLoss,
        ErrorCode::TransferFailed => tonic::Code::Aborted,
        ErrorCode::Unsupported => tonic::Code::Unimplemented,
        ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        _ => tonic::Code::Internal,
    }
}

/// A status carrying `detail` (its message is the detail's message).
pub fn to_status(detail: &ErrorDetail) -> tonic::Status {
    let code = ErrorCode::try_from(detail.code).unwrap_or(ErrorCode::Internal);
    tonic::Status::with_details(grpc_code(code), detail.message.clone(), detail.encode_to_vec().into())
}

/// The typed detail of a status made by [`to_status`]; `None` for statuses
/// from elsewhere (a broken connection, a proxy), which callers map by
/// their gRPC code.
pub fn detail_of(status: &tonic::Status) -> Option<ErrorDetail> {
    ErrorDetail::decode(status.details()).ok().filter(|d| d.code != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_survives_the_round_trip() {
        let d = ErrorDetail { needed_bytes: 4096, ..ErrorDetail::new(ErrorCode::RegionTooSmall, "too small") };
        let s = to_status(&d);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(s.message(), "too small");
        assert_eq!(detail_of(&s), Some(d));
        assert_eq!(detail_of(&tonic::Status::unavailable("gone")), None);
    }
}
