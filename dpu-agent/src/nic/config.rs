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
    /// The agent's MAC on `agent_port`. Default: read from the interface that
    /// holds `agent_address` on this machine. Tenants' frames must be
    /// addressed to it, and it is the only source the agent's port may use.
    #[serde(default)]
    pub agent_mac: Option<MacAddr>,
    /// Networks of the storage endpoints the agent reaches through the
    /// uplinks: `"a.b.c.d/len"` (through the only uplink), or
    /// `{ network = "a.b.c.d/len", uplink = "p1" }` when there are several.
    /// Tenants' functions never reach them. A routed store: list its next
    /// hop's address too (the agent must resolve it with ARP).
    pub storage: Vec<StorageNet>,
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
    /// The tenant's host functions: each a port on the bridge (a VF/SF
    /// representor) with the one MAC and the addresses it may send from.
    pub functions: Vec<FunctionNic>,
    /// The TCP port of this tenant's control listener on `agent_address`:
    /// the one agent port its functions can reach. The agent listens there
    /// for this tenant only, and the tenant's sessions open only there.
    pub listener_port: u16,
    /// DSCP (0-63) set on the tenant's traffic; none: left as sent.
    #[serde(default)]
    pub dscp: Option<u8>,
    /// Bandwidth of the tenant's functions in kbit/s (an OpenFlow meter,
    /// enforced by the NIC when offloaded; ARP is metered with the rest).
    /// Default: from the tenant's `limits.bytes_per_sec`; neither: no meter.
    #[serde(default)]
    pub meter_kbps: Option<u64>,
}

/// One host function of a tenant: its representor port, the MAC the host
/// side of the function has (set by the operator, e.g. `devlink port
/// function set ... hw_addr`), the IPv4 addresses it may use, and
/// optionally the VLAN its frames carry. Anything it sends with another
/// source MAC or address, another tag, or no tag when one is named, is
/// dropped.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "FunctionEntry")]
pub struct FunctionNic {
    pub port: String,
    pub mac: MacAddr,
    pub addresses: Vec<Ipv4Addr>,
    /// 802.1Q VLAN id (1-4094) the function's frames carry; the tag is
    /// removed towards the agent and added on the way back. None: untagged
    /// frames only.
    pub vlan: Option<u16>,
}

/// How a function is written in TOML; a bare port name (the format before
/// MACs were required) gets a message saying what to write instead. (Not
/// `#[serde(untagged)]`: that would replace a bad MAC's message with "did
/// not match any variant".)
enum FunctionEntry {
    Table(FunctionTable),
    Name(String),
}

impl<'de> Deserialize<'de> for FunctionEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = FunctionEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table { port, mac, addresses, vlan }")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FunctionEntry, E> {
                Ok(FunctionEntry::Name(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<FunctionEntry, A::Error> {
                FunctionTable::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(FunctionEntry::Table)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionTable {
    port: String,
    mac: MacAddr,
    addresses: Vec<Ipv4Addr>,
    #[serde(default)]
    vlan: Option<u16>,
}

impl TryFrom<FunctionEntry> for FunctionNic {
    type Error = String;

    fn try_from(e: FunctionEntry) -> Result<Self, String> {
        match e {
            FunctionEntry::Table(t) => Ok(Self { port: t.port, mac: t.mac, addresses: t.addresses, vlan: t.vlan }),
            FunctionEntry::Name(n) => Err(format!(
                "function {n:?}: each function is a table naming its MAC and addresses, e.g. \
                 functions = [{{ port = {n:?}, mac = \"02:00:00:00:00:11\", addresses = [\"192.168.100.11\"] }}]"
            )),
        }
    }
}

/// A storage network and the uplink it is reached through.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum StorageNet {
    /// `"a.b.c.d/len"`: through the only uplink.
    Network(String),
    /// `{ network = "a.b.c.d/len", uplink = "p1" }`.
    Routed { network: String, uplink: String },
}

/// An Ethernet MAC address, `aa:bb:cc:dd:ee:ff` in TOML and in rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Multicast (and broadcast) addresses: never a function's own.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl std::str::FromStr for MacAddr {
    type Err = NetParseError;

    fn from_str(s: &str) -> Result<Self, NetParseError> {
        let bad = || NetParseError(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut out {
            let p = parts.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self(out))
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An IPv4 network `a.b.c.d/len` (a plain address is a /32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

    #[test]
    fn macs_parse_strictly() {
        let m: MacAddr = "02:00:0A:bc:00:11".parse().unwrap();
        assert_eq!(m.to_string(), "02:00:0a:bc:00:11");
        assert!(!m.is_multicast());
        assert!("ff:ff:ff:ff:ff:ff".parse::<MacAddr>().unwrap().is_multicast());
        for bad in
            ["02:00:00:00:00", "02:00:00:00:00:11:22", "02-00-00-00-00-11", "2:0:0:0:0:11", "zz:00:00:00:00:11", ""]
        {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn functions_are_tables_and_the_old_form_says_what_to_write() {
        #[derive(Deserialize)]
        struct T {
            #[allow(dead_code)]
            nic: TenantNic,
        }
        let ok: T = toml::from_str(
            "[nic]\nlistener_port = 7101\nfunctions = [{ port = \"pf0vf1\", mac = \"02:00:00:00:00:11\", \
             addresses = [\"192.168.100.11\"], vlan = 100 }]\n",
        )
        .unwrap();
        assert_eq!(ok.nic.functions[0].vlan, Some(100));
        let err =
            toml::from_str::<T>("[nic]\nlistener_port = 7101\nfunctions = [\"pf0vf1\"]\n").err().unwrap().to_string();
        assert!(err.contains("each function is a table naming its MAC"), "{err}");
        let err = toml::from_str::<T>(
            "[nic]\nlistener_port = 7101\nfunctions = [{ port = \"pf0vf1\", mac = \"02:00:00:00:00\", \
             addresses = [] }]\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("not a MAC address"), "{err}");
    }
}
