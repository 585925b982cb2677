//! Sluice's data plane, shared by the agent (memory owner) and the gateway
//! (remote): the `x-amz-rdma-token` codec, the one-sided [`Transport`]
//! abstraction, descriptors as capabilities, and the `tcp` software provider.

#![forbid(unsafe_code)]

pub mod capability;
pub mod crc64;
pub mod dc;
pub mod file;
pub mod landing;
pub mod memory;
mod peer_cache;
pub mod s3_names;
pub mod tcp;
pub mod token;
pub mod transport;
pub mod verbs;

pub use capability::{Access, Capability, CapabilityTable, Grant, Rejection};
pub use memory::{CopiedRegion, MemError, NicWindow, RegionMemory, SharedRegion};
pub use token::{Token, TokenError};
pub use transport::{Capabilities, Exposure, Transport, TransportError, TransportKind, MAX_OP_BYTES};
