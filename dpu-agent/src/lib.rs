//! The Sluice agent: runs on the BlueField-3 (or co-located on the host),
//! terminates the shim's gRPC control channel, resolves tenant namespaces to
//! S3 endpoints, signs S3 requests (credentials never leave the agent), and
//! moves object bytes straight into or out of host memory regions.

#![forbid(unsafe_code)]

pub mod accept;
pub mod agent;
#[cfg(test)]
mod agent_tests;
pub mod batch;
pub mod capabilities;
pub mod config;
pub mod cores;
pub mod error;
pub mod framed_gets;
pub mod get_stream;
pub mod grpc;
pub mod health;
pub mod hostmem;
pub mod identity;
pub mod ids;
pub mod listeners;
pub mod metrics;
pub mod model;
pub mod nic;
pub mod quiet;
pub mod quota;
pub mod requests;
pub mod s3;
pub mod server;
pub mod session;
pub mod startup;
mod tenant_places;
pub mod tls;
pub mod transports;

pub use error::AgentError;
