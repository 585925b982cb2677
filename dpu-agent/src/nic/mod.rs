//! Per-tenant isolation at the NIC: the agent programs the Open vSwitch
//! bridge that owns the tenants' host functions (on a BlueField-3 the OVS
//! over the eSwitch, whose flows and meters the NIC enforces when hardware
//! offload is on).
//!
//! [`policy::rules`] turns the configuration into the exact rule set (pure,
//! golden-tested); [`ovs::reconcile`] makes the bridge hold exactly that:
//! it reads what the agent installed before (its cookies), installs the
//! difference in one OpenFlow bundle and removes only what the agent owns.
//! The rules stay when the agent stops (fail closed).
//!
//! Why `ovs-ofctl` and not an OpenFlow or OVSDB library: the rules are
//! OpenFlow flows and meters, which OVSDB does not hold; `ovs-ofctl` is the
//! tool every OVS (including NVIDIA's OVS-DOCA) ships and supports, speaks
//! bundles (`--bundle`, atomic), and prints what it does in the same syntax
//! an operator uses to check it. No maintained Rust OpenFlow 1.4 crate
//! covers bundles and meters.

pub mod config;
pub mod ovs;
pub mod policy;

/// Failures of NIC isolation: a clear message naming what to fix.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error("NIC isolation config: {0}")]
    Config(String),
    #[error("port {port:?} is not on bridge {bridge:?} (its ports: {known})")]
    UnknownPort { port: String, bridge: String, known: String },
    #[error("`{command}` failed: {message}")]
    Ovs { command: String, message: String },
}

#[cfg(test)]
mod tests;
