//! The agent's S3 access for one namespace: ranged, concurrent GETs into
//! host memory, single and multipart PUTs from host memory, HEAD,
//! ListObjectsV2 and DELETE, with retries across the namespace's endpoints,
//! the RDMA data path and inline encryption. Each S3 request goes through
//! an [`S3Client`] (SigV4 over HTTP in the agent; in memory in tests).

pub mod body;
pub mod call;
mod chunk_keys;
pub mod client;
pub mod crypto;
pub mod encryption;
pub mod endpoints;
pub mod error;
#[cfg(any(test, feature = "mock"))]
pub mod failing;
mod first_byte;
pub mod get;
pub mod gpu;
mod guarded;
pub mod http1;
pub mod http_client;
pub mod integrity;
#[cfg(test)]
mod integrity_tests;
#[cfg(any(test, feature = "mock"))]
pub mod mock;
pub mod model;
pub mod put;
#[cfg(test)]
mod rdma_first_tests;
mod rdma_parts;
pub mod setup;
mod sigv4;
pub mod store;
pub mod store_tls;
#[cfg(test)]
pub(crate) mod stores_tests;
pub mod sweeper;
pub mod token_path;
#[cfg(test)]
mod transfer_tests;
pub mod uploads;
mod version;
mod write_fence;
mod xml;

// The names callers outside `s3` use most; files inside `s3` import from
// the file that defines each thing, never through here.
pub use client::S3Client;
pub use sigv4::Keys;
