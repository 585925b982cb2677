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
pub mod guard;
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
    #[error(
        "bridge {bridge:?} has fail mode {mode}: it would forward frames with MAC learning whenever the \
         agent's flows are missing (before the agent starts, after ovs-vswitchd restarts). Set it: \
         ovs-vsctl set-fail-mode {bridge} secure"
    )]
    FailOpen { bridge: String, mode: String },
    #[error("the agent's MAC: {0}")]
    AgentMac(String),
}

#[cfg(test)]
mod tests;

/// The agent's MAC on its port: `[nic] agent_mac`, or that of the local
/// interface holding `agent_address` (on a BlueField, the agent's SF).
pub fn agent_mac(nic: &config::NicConfig) -> Result<config::MacAddr, NicError> {
    if let Some(m) = nic.agent_mac {
        return Ok(m);
    }
    let ip = nic.agent_address;
    let addrs: Vec<_> =
        nix::ifaddrs::getifaddrs().map_err(|e| NicError::AgentMac(format!("listing interfaces: {e}")))?.collect();
    let iface = addrs
        .iter()
        .find(|a| a.address.as_ref().and_then(|s| s.as_sockaddr_in()).is_some_and(|s| s.ip() == ip))
        .map(|a| a.interface_name.clone())
        .ok_or_else(|| NicError::AgentMac(format!("no interface here holds {ip}; set [nic] agent_mac")))?;
    addrs
        .iter()
        .filter(|a| a.interface_name == iface)
        .find_map(|a| a.address.as_ref()?.as_link_addr()?.addr())
        .map(config::MacAddr)
        .ok_or_else(|| NicError::AgentMac(format!("interface {iface} (holding {ip}) has no MAC; set [nic] agent_mac")))
}
