//! The rule set a configuration means, as a pure function: the agent applies
//! it, `sluice-agent --print-nic-rules` prints it, tests compare it with
//! golden text.
//!
//! Per tenant, each of its functions may send, from its own MAC and
//! addresses, untagged (or with its configured VLAN): ARP requests for the
//! agent's address, ARP replies to the agent, and TCP to its own listener
//! on the agent, all metered (and DSCP-marked if configured) and output to
//! the agent's port. The agent's ARP and its listener's answers go out only
//! to the port of the function that owns the address. The agent's port
//! reaches the storage networks through their uplinks. Anything else on the
//! bridge, including unknown functions, is dropped. No rule uses `NORMAL`
//! (MAC learning, flooding): every accepted frame has one named output.
//!
//! Every flow carries a cookie: `0x51ce` (this agent's rules), a 16-bit
//! tenant tag (0 for the agent's own rules) and 32 bits of a hash of the
//! flow's text. So "which of the installed flows are ours, and which are
//! stale" is a comparison of cookie sets (no parsing of how OVS prints a
//! match), and a tenant's flows are selected exactly by its cookie mask.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::config::{Ipv4Net, MacAddr, NicConfig, StorageNet, TenantNic};
use super::NicError;

/// The high 16 bits of every cookie the agent installs.
pub const COOKIE_PREFIX: u64 = 0x51ce << 48;
/// Selects every flow the agent owns.
pub const OWNED_MASK: u64 = 0xffff << 48;
/// Selects one tenant's flows (prefix and tag).
pub const TENANT_MASK: u64 = 0xffff_ffff << 32;

/// One OpenFlow flow in `ovs-ofctl` syntax.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Flow {
    pub cookie: u64,
    pub priority: u16,
    /// Match fields, comma-separated (empty: everything).
    pub matches: String,
    pub actions: String,
}

impl Flow {
    fn new(tag: u16, priority: u16, matches: String, actions: String) -> Self {
        let text = format!("{priority}|{matches}|{actions}");
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let h = u32::from_be_bytes([digest.as_ref()[0], digest.as_ref()[1], digest.as_ref()[2], digest.as_ref()[3]]);
        Self { cookie: COOKIE_PREFIX | (u64::from(tag) << 32) | u64::from(h), priority, matches, actions }
    }

    /// As `ovs-ofctl add-flow(s)` takes it.
    pub fn ofctl(&self) -> String {
        let sep = if self.matches.is_empty() { "" } else { "," };
        format!("cookie={:#018x},priority={}{sep}{} actions={}", self.cookie, self.priority, self.matches, self.actions)
    }
}

/// One OpenFlow meter: drop above `kbps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    pub id: u32,
    pub kbps: u64,
    pub tenant: String,
}

impl Meter {
    /// As `ovs-ofctl add-meter`/`mod-meter` take it (burst: 1/10 s of the rate).
    pub fn ofctl(&self) -> String {
        format!("meter={},kbps,burst,band=type=drop,rate={},burst_size={}", self.id, self.kbps, burst_kb(self.kbps))
    }
}

fn burst_kb(kbps: u64) -> u64 {
    (kbps / 2).max(64)
}

/// What the rules are for one tenant.
#[derive(Debug, Clone)]
pub struct TenantRules<'a> {
    pub name: &'a str,
    pub nic: &'a TenantNic,
    /// The tenant's `limits.bytes_per_sec`, the meter's default.
    pub bytes_per_sec: Option<u64>,
}

/// A tenant's cookie tag and meter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantTag {
    pub name: String,
    pub tag: u16,
    pub functions: Vec<String>,
}

impl TenantTag {
    /// The cookie value that, with [`TENANT_MASK`], selects its flows.
    pub fn cookie(&self) -> u64 {
        COOKIE_PREFIX | (u64::from(self.tag) << 32)
    }
}

/// Every flow and meter for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    pub bridge: String,
    pub flows: Vec<Flow>,
    pub meters: Vec<Meter>,
    pub tenants: Vec<TenantTag>,
    /// Every port the rules name (checked against the bridge before applying).
    pub ports: BTreeSet<String>,
}

/// The tenant's cookie tag: 16 bits of a hash of its name (never 0, the
/// agent's own). Stable across restarts and across other tenants coming
/// and going; the meter id is the same number.
pub fn tenant_tag(name: &str) -> u16 {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("sluice-tenant:{name}").as_bytes());
    match u16::from_be_bytes([d.as_ref()[0], d.as_ref()[1]]) {
        0 => 1,
        t => t,
    }
}

/// The rule set for `nic` and `tenants` (those without `[tenants.nic]`
/// get no function: their shims cannot reach the agent through the NIC).
/// `agent_mac` is the agent's MAC on its port ([`NicConfig::agent_mac`] or
/// read from the interface holding its address).
///
/// Every frame a rule accepts goes to one named port; nothing is switched by
/// MAC learning or flooded, so a tenant's function can neither claim another
/// station's MAC (it may send only from its own) nor be handed frames meant
/// for another (replies go out the port of the function they belong to).
pub fn rules(nic: &NicConfig, agent_mac: MacAddr, tenants: &[TenantRules<'_>]) -> Result<RuleSet, NicError> {
    let bad = |m: String| Err(NicError::Config(m));
    if nic.bridge.is_empty() || nic.agent_port.is_empty() || nic.uplinks.is_empty() {
        return bad("[nic] needs bridge, agent_port and at least one uplink".into());
    }
    if nic.uplinks.contains(&nic.agent_port) {
        return bad(format!("[nic] agent_port {:?} is also an uplink", nic.agent_port));
    }
    if let Some(dup) = nic.uplinks.iter().enumerate().find_map(|(i, u)| nic.uplinks[..i].contains(u).then_some(u)) {
        return bad(format!("[nic] uplink {dup:?} is listed twice"));
    }
    if agent_mac.is_multicast() || agent_mac == MacAddr([0; 6]) {
        return bad(format!("[nic] the agent's MAC {agent_mac} is not a station address (set agent_mac)"));
    }
    let storage = storage_routes(nic)?;
    let (ag, agp, agm) = (nic.agent_address, nic.agent_port.as_str(), agent_mac);
    let mut ports: BTreeSet<String> = nic.uplinks.iter().cloned().collect();
    ports.insert(nic.agent_port.clone());
    let infra: BTreeSet<String> = ports.clone();

    // Who claims what: a function, a MAC, an address, a listener, a tag
    // each belong to one tenant.
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    let mut tags: BTreeMap<u16, &str> = BTreeMap::new();
    let mut flows = Vec::new();
    let mut meters = Vec::new();
    let mut out_tenants = Vec::new();
    for t in tenants {
        let n = t.nic;
        if n.functions.is_empty() {
            return bad(format!("tenant {:?}: [tenants.nic] needs at least one function", t.name));
        }
        if n.listener_port == 0 || n.dscp.is_some_and(|d| d > 63) || n.meter_kbps == Some(0) {
            return bad(format!("tenant {:?}: listener_port 1-65535, dscp 0-63, meter_kbps > 0", t.name));
        }
        let mut claims = vec![("listener port", n.listener_port.to_string())];
        for f in &n.functions {
            let what = format!("tenant {:?}: function {:?}", t.name, f.port);
            if f.port.is_empty() || f.addresses.is_empty() {
                return bad(format!("{what} needs a port and at least one address"));
            }
            if infra.contains(&f.port) {
                return bad(format!("{what} is the agent's port or an uplink"));
            }
            if f.mac.is_multicast() || f.mac == MacAddr([0; 6]) || f.mac == agm {
                return bad(format!("{what}: MAC {} is not a station address of its own", f.mac));
            }
            if f.vlan.is_some_and(|v| !(1..=4094).contains(&v)) {
                return bad(format!("{what}: vlan 1-4094"));
            }
            if let Some(a) = f.addresses.iter().find(|a| **a == ag) {
                return bad(format!("{what}: address {a} is the agent's"));
            }
            claims.push(("function", f.port.clone()));
            claims.push(("MAC", f.mac.to_string()));
            claims.extend(f.addresses.iter().map(|a| ("address", a.to_string())));
        }
        for (kind, what) in claims {
            let key = format!("{kind} {what}");
            match owner.get(&key) {
                Some(first) if *first == t.name => return bad(format!("tenant {:?} names {key} twice", t.name)),
                Some(first) => return bad(format!("{key} is claimed by tenants {first:?} and {:?}", t.name)),
                None => owner.insert(key, t.name),
            };
        }
        let tag = tenant_tag(t.name);
        if let Some(other) = tags.insert(tag, t.name) {
            return bad(format!(
                "tenants {other:?} and {:?} hash to the same NIC tag {tag:#06x}; rename one of them",
                t.name
            ));
        }
        // The meter covers everything the function may send, ARP included
        // (an unmetered ARP flood would reach the agent at line rate).
        let meter = n.meter_kbps.or(t.bytes_per_sec.map(|b| (b * 8).div_ceil(1000)));
        let metered = match meter {
            Some(kbps) => {
                meters.push(Meter { id: u32::from(tag), kbps, tenant: t.name.to_owned() });
                format!("meter:{tag},")
            }
            None => String::new(),
        };
        let lp = n.listener_port;
        for f in &n.functions {
            ports.insert(f.port.clone());
            let (p, m) = (f.port.as_str(), f.mac);
            // Frames from the function: its tag (or none), its MAC.
            let from = match f.vlan {
                Some(v) => format!("in_port={p},dl_vlan={v},dl_src={m}"),
                None => format!("in_port={p},vlan_tci=0x0000/0x1fff,dl_src={m}"),
            };
            let untag = if f.vlan.is_some() { "strip_vlan," } else { "" };
            let to_agent = format!("{metered}{untag}output:{agp}");
            let dscp = n.dscp.map(|d| format!("set_field:{d}->ip_dscp,")).unwrap_or_default();
            let back = match f.vlan {
                Some(v) => format!("mod_vlan_vid:{v},output:{p}"),
                None => format!("output:{p}"),
            };
            for a in &f.addresses {
                // ARP: its requests for the agent's address, its replies to the agent.
                let arp = format!("arp,{from},arp_spa={a},arp_sha={m},arp_tpa={ag}");
                flows.push(Flow::new(tag, 300, format!("{arp},arp_op=1"), to_agent.clone()));
                flows.push(Flow::new(tag, 300, format!("{arp},arp_op=2,dl_dst={agm},arp_tha={agm}"), to_agent.clone()));
                flows.push(Flow::new(
                    tag,
                    300,
                    format!("tcp,{from},dl_dst={agm},nw_src={a},nw_dst={ag},tp_dst={lp}"),
                    format!("{metered}{untag}{dscp}output:{agp}"),
                ));
                // The agent's ARP for the function's address, and its
                // listener's answers: out the function's port only.
                let from_agent = format!("in_port={agp},vlan_tci=0x0000/0x1fff,dl_src={agm}");
                flows.push(Flow::new(tag, 300, format!("arp,{from_agent},arp_spa={ag},arp_tpa={a}"), back.clone()));
                flows.push(Flow::new(
                    tag,
                    300,
                    format!("tcp,{from_agent},dl_dst={m},nw_src={ag},tp_src={lp},nw_dst={a}"),
                    back.clone(),
                ));
            }
            flows.push(Flow::new(tag, 100, format!("in_port={p}"), "drop".into()));
        }
        out_tenants.push(TenantTag {
            name: t.name.to_owned(),
            tag,
            functions: n.functions.iter().map(|f| f.port.clone()).collect(),
        });
    }

    // The agent's own: its port to and from the storage networks, each
    // through its uplink; everything else is dropped.
    let from_agent = format!("in_port={agp},vlan_tci=0x0000/0x1fff,dl_src={agm}");
    for (s, u) in &storage {
        flows.push(Flow::new(0, 300, format!("arp,{from_agent},arp_spa={ag},arp_tpa={s}"), format!("output:{u}")));
        flows.push(Flow::new(0, 200, format!("ip,{from_agent},nw_src={ag},nw_dst={s}"), format!("output:{u}")));
        flows.push(Flow::new(0, 300, format!("arp,in_port={u},arp_spa={s},arp_tpa={ag}"), format!("output:{agp}")));
        flows.push(Flow::new(
            0,
            200,
            format!("ip,in_port={u},dl_dst={agm},nw_src={s},nw_dst={ag}"),
            format!("output:{agp}"),
        ));
    }
    flows.push(Flow::new(0, 0, String::new(), "drop".into()));
    Ok(RuleSet { bridge: nic.bridge.clone(), flows, meters, tenants: out_tenants, ports })
}

/// Each storage network with the uplink it is reached through.
fn storage_routes(nic: &NicConfig) -> Result<Vec<(Ipv4Net, String)>, NicError> {
    let bad = |m: String| NicError::Config(m);
    nic.storage
        .iter()
        .map(|s| {
            let (net, uplink) = match s {
                StorageNet::Network(n) if nic.uplinks.len() == 1 => (n, &nic.uplinks[0]),
                StorageNet::Network(n) => {
                    return Err(bad(format!(
                        "[nic] storage {n:?}: with several uplinks, name the one it is reached through: \
                         {{ network = {n:?}, uplink = \"...\" }}"
                    )))
                }
                StorageNet::Routed { network, uplink } if nic.uplinks.contains(uplink) => (network, uplink),
                StorageNet::Routed { network, uplink } => {
                    return Err(bad(format!("[nic] storage {network:?}: uplink {uplink:?} is not in uplinks")))
                }
            };
            let net: Ipv4Net = net.parse().map_err(|e| bad(format!("[nic] storage: {e}")))?;
            Ok((net, uplink.clone()))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|routes| {
            // A network twice makes identical flows with identical cookies
            // (the bridge holds one of them, and the counts disagree).
            let mut seen = std::collections::HashSet::new();
            match routes.iter().find(|(net, _)| !seen.insert(*net)) {
                Some((net, _)) => Err(bad(format!("[nic] storage: {net} is listed more than once"))),
                None => Ok(routes),
            }
        })
}

impl RuleSet {
    /// The rules as an operator reads them (`--print-nic-rules`): meters
    /// and flows in `ovs-ofctl` syntax, grouped by tenant.
    pub fn render(&self) -> String {
        let mut out = format!("# Open vSwitch rules for bridge {} (sluice-agent --print-nic-rules)\n", self.bridge);
        let _ = writeln!(out, "# every flow's cookie is {COOKIE_PREFIX:#018x}/{OWNED_MASK:#018x} (the agent's)");
        let _ = writeln!(out, "\n# meters: ovs-ofctl -O OpenFlow13 add-meter {} '<line>'", self.bridge);
        for m in &self.meters {
            let _ = writeln!(out, "{}    # tenant {}", m.ofctl(), m.tenant);
        }
        let _ = writeln!(out, "\n# flows: ovs-ofctl -O OpenFlow14 --bundle add-flows {} <file>", self.bridge);
        for t in &self.tenants {
            let _ = writeln!(
                out,
                "\n# tenant {}: functions {}; its flows: cookie={:#018x}/{TENANT_MASK:#018x}",
                t.name,
                t.functions.join(", "),
                t.cookie()
            );
            for f in self.flows.iter().filter(|f| f.cookie & TENANT_MASK == t.cookie()) {
                let _ = writeln!(out, "{}", f.ofctl());
            }
        }
        let _ = writeln!(out, "\n# the agent's own (uplinks, agent port, default drop)");
        for f in self.flows.iter().filter(|f| f.cookie & TENANT_MASK == COOKIE_PREFIX) {
            let _ = writeln!(out, "{}", f.ofctl());
        }
        out
    }
}
