//! The S3-over-RDMA names both sides use: the request and reply headers
//! (docs/s3-over-rdma.md) and the error codes a store answers with. The
//! agent (client) and the gateway (server) take them from here only.

/// The request header carrying the `x-amz-rdma-token` descriptor. Must be
/// SigV4-signed.
pub const TOKEN_HEADER: &str = "x-amz-rdma-token";
/// The reply header with the status of the RDMA transfer; its absence means
/// the store ignored the token (and sent the bytes over HTTP, or none).
pub const REPLY_HEADER: &str = "x-amz-rdma-reply";
/// The reply header with the bytes moved over RDMA.
pub const BYTES_HEADER: &str = "x-amz-rdma-bytes-transferred";
/// The older spelling of [`BYTES_HEADER`] some stores still send.
pub const OLD_BYTES_HEADER: &str = "x-amz-rdma-bytes";
/// The request header naming a non-standard transport (signed with SigV4).
pub const TRANSPORT_HEADER: &str = "x-sluice-rdma-transport";
/// Request header (Sluice's gateway only): a GET's bytes move only if the
/// whole object is at most this many bytes; otherwise nothing moves and
/// the reply says so in [`FITS_HEADER`]. It lets a reader that must write
/// nothing unless the object fits its slot skip the HEAD it would need to
/// learn the size first.
pub const OBJECT_MAX_HEADER: &str = "x-sluice-rdma-object-max";
/// Reply header to [`OBJECT_MAX_HEADER`]: `yes` (the object fits, the bytes
/// moved) or `no` (nothing moved; Content-Range has the object's size). A
/// store that does not send it did not check.
pub const FITS_HEADER: &str = "x-sluice-rdma-fits";

/// Error code: the token could not be parsed or is not allowed.
pub const INVALID_TOKEN: &str = "InvalidRDMAToken";
/// Error code: the RDMA transfer itself failed.
pub const TRANSFER_FAILED: &str = "RDMATransferFailed";
/// [`INVALID_TOKEN`] as other S3-over-RDMA stores spell it.
pub const PEER_INVALID_TOKEN: &str = "S3InvalidRdmaToken";
/// [`TRANSFER_FAILED`] as other S3-over-RDMA stores spell it.
pub const PEER_TRANSFER_FAILED: &str = "S3RdmaIoError";

/// Whether a store's error code says the token was refused.
pub fn is_invalid_token(code: &str) -> bool {
    code == INVALID_TOKEN || code == PEER_INVALID_TOKEN
}

/// Whether a store's error code says the RDMA transfer failed.
pub fn is_transfer_failed(code: &str) -> bool {
    code == TRANSFER_FAILED || code == PEER_TRANSFER_FAILED
}
