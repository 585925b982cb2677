//! The Sluice host shim: a local Unix-socket API for data loaders on the GPU
//! node. It identifies callers (SO_PEERCRED), creates or accepts shared-memory
//! regions and hands them to the agent, and forwards requests. It never holds
//! S3 credentials and never touches object bytes.

#![forbid(unsafe_code)]

pub mod agent_link;
mod agent_session;
pub mod batch;
pub mod capabilities;
pub mod coalesce;
pub mod config;
pub mod connection;
pub mod error;
pub mod framed_link;
pub mod get_stream;
pub mod handlers;
pub mod in_doubt;
pub mod link_kind;
pub mod memory;
pub mod metrics;
pub mod path;
pub mod requests;
pub mod server;
pub mod session;
#[cfg(test)]
mod test_agent;

pub use error::ShimError;
