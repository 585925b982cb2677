//! Sluice wire protocols.
//!
//! * [`agent`]: the gRPC control plane between the host shim and the agent.
//! * [`shim`]: the local Unix-socket API between data loaders and the shim.
//! * [`common`]: messages both share (error codes, object info, reports).
//!
//! Generated code lives here only; domain crates convert at their edges.

#![forbid(unsafe_code)]

// Generated code mirrors the proto package tree so cross-package references
// (`super::super::common::v1`) resolve.
mod generated {
    pub mod sluice {
        pub mod common {
            pub mod v1 {
                tonic::include_proto!("sluice.common.v1");
            }
        }
        pub mod agent {
            pub mod v1 {
                tonic::include_proto!("sluice.agent.v1");
            }
        }
        pub mod shim {
            pub mod v1 {
                tonic::include_proto!("sluice.shim.v1");
            }
        }
    }
}

/// Agent control plane (`sluice.agent.v1`).
pub use generated::sluice::agent::v1 as agent;
/// Shared messages (`sluice.common.v1`).
pub use generated::sluice::common::v1 as common;
/// Shim local socket API (`sluice.shim.v1`).
pub use generated::sluice::shim::v1 as shim;

pub mod counted_codec;
pub mod entries;
pub mod framed_gets;
pub mod status;

/// The compiled `.proto` files (a `google.protobuf.FileDescriptorSet`),
/// for checking other implementations of these messages against them.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_descriptor_set.bin"));

pub use prost::Message;

pub mod auth;

/// Largest frame the shim protocol accepts (requests and responses are small:
/// object bytes never travel in frames).
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// The local socket protocol version this crate speaks.
pub const SHIM_PROTOCOL_VERSION: u32 = shim::Version::Version1 as u32;

/// Encodes a message as one frame: 4-byte big-endian length + protobuf.
pub fn encode_frame<M: prost::Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    // A frame larger than u32 cannot be built from our messages; saturate
    // rather than panic and let the peer reject it as oversized.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    msg.encode(&mut out).expect("Vec<u8> grows as needed");
    out
}

impl common::ErrorDetail {
    /// Builds a detail from a code and message.
    pub fn new(code: common::ErrorCode, message: impl Into<String>) -> Self {
        Self { code: code as i32, message: message.into(), needed_bytes: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_has_length_prefix() {
        let req = shim::Request { id: 7, ..Default::default() };
        let frame = encode_frame(&req);
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - 4);
        let back = shim::Request::decode(&frame[4..]).unwrap();
        assert_eq!(back.id, 7);
    }
}
