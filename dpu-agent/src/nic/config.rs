//! `[nic]` (per agent) and `[tenants.nic]` (per tenant): which Open vSwitch
//! bridge holds the tenants' host functions, and what each may reach.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::Deserialize;

/// The agent's side of the NIC: the bridge, its uplinks and the agent's own
/// port. On a BlueField-3 the bridge is the OVS bridge over the eSwitch
/// (hardware offload on), the uplink is `p0`/`p1`, the tenants' functions
/// are VF/SF representors (`pf0vf3`, `en3f0pf0sf2`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicConfig {
    /// The OVS bridge the rules go into.
    pub bridge: String,
    /// Where `ovs-ofctl` reaches the bridge: default the bridge's name (the
    /// system OVS's management socket); or `unix:/path/to/bridge.mgmt`.
    #[serde(default)]
    pub ofctl_target: Option<String>,
    /// OVS's run directory (`OVS_RUNDIR`) when it is not the system's.
    #[serde(default)]
    pub ovs_rundir: Option<PathBuf>,
    /// Ports towards storage.
    pub uplinks: Vec<String>,
    /// The port the agent's own listeners are reached through.
    pub agent_port: String,
    /// The agent's address on `agent_port` (its tenants' listeners are on it).
    pub agent_address: Ipv4Addr,
    /// Networks (`a.b.c.d/len`) of the storage endpoints the agent reaches
    /// through the uplinks. Tenants' functions never reach them.
    pub storage: Vec<String>,
    /// Program the bridge (default). `false`: only open the tenants' own
    /// listeners and bind their sessions to them, for a NIC something else
    /// programs (`--print-nic-rules` still prints what it should hold).
    #[serde(default = "program_ovs_default")]
    pub program_ovs: bool,
}

fn program_ovs_default() -> bool {
    true
}

/// A tenant's host functions and what they may reach.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantNic {
    /// The tenant's host functions: port names on the bridge (representors).
    pub functions: Vec<String>,
    /// The source addresses the functions use; anything else they send is
    /// dropped (no spoofing another tenant's address).
    pub addresses: Vec<Ipv4Addr>,
    /// The TCP port of this tenant's control listener on `agent_address`:
    /// the one agent port its functions can reach. The agent listens there
    /// for this tenant only, and the tenant's sessions open only there.
    pub listener_port: u16,
    /// DSCP (0-63) set on the tenant's traffic; none: left as sent.
    #[serde(default)]
    pub dscp: Option<u8>,
    /// Bandwidth of the tenant's functions in kbit/s (an OpenFlow meter,
    /// enforced by the NIC when offloaded). Default: from the tenant's
    /// `limits.bytes_per_sec`; neither: no meter.
    #[serde(default)]
    pub meter_kbps: Option<u64>,
}

/// An IPv4 network `a.b.c.d/len` (a plain address is a /32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub len: u8,
}

/// Text that is not an IPv4 network; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NetParseError(String);

impl std::str::FromStr for Ipv4Net {
    type Err = NetParseError;

    fn from_str(s: &str) -> Result<Self, NetParseError> {
        let (addr, len) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr =
            addr.parse().map_err(|_| NetParseError(format!("{s:?} is not an IPv4 network (a.b.c.d/len)")))?;
        let len: u8 =
            len.parse().ok().filter(|l| *l <= 32).ok_or_else(|| NetParseError(format!("{s:?}: prefix length 0-32")))?;
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        if u32::from(addr) & !mask != 0 {
            return Err(NetParseError(format!(
                "{s:?} has host bits set (the network is {}/{len})",
                Ipv4Addr::from(u32::from(addr) & mask)
            )));
        }
        Ok(Self { addr, len })
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.len == 32 {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_strictly() {
        assert_eq!("10.1.0.0/16".parse::<Ipv4Net>().unwrap().to_string(), "10.1.0.0/16");
        assert_eq!("10.1.2.3".parse::<Ipv4Net>().unwrap().to_string(), "10.1.2.3");
        assert!("10.1.2.3/16".parse::<Ipv4Net>().unwrap_err().to_string().contains("host bits"));
        assert!("10.1.2.0/33".parse::<Ipv4Net>().is_err());
        assert!("fd00::/8".parse::<Ipv4Net>().is_err());
    }
}
