//! The rule set a configuration means, as a pure function: the agent applies
//! it, `sluice-agent --print-nic-rules` prints it, tests compare it with
//! golden text.
//!
//! Per tenant, each of its functions may send ARP for the agent's address
//! from its own addresses and TCP to its own listener on the agent
//! (metered, DSCP-marked if configured); the listener's answers go back only
//! to those addresses; anything else from the function is dropped. The
//! agent's port reaches the storage networks through the uplinks. Anything
//! else on the bridge, including unknown functions, is dropped.
//!
//! Every flow carries a cookie: `0x51ce` (this agent's rules), a 16-bit
//! tenant tag (0 for the agent's own rules) and 32 bits of a hash of the
//! flow's text. So "which of the installed flows are ours, and which are
//! stale" is a comparison of cookie sets (no parsing of how OVS prints a
//! match), and a tenant's flows are selected exactly by its cookie mask.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::config::{Ipv4Net, NicConfig, TenantNic};
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
pub fn rules(nic: &NicConfig, tenants: &[TenantRules<'_>]) -> Result<RuleSet, NicError> {
    let bad = |m: String| Err(NicError::Config(m));
    if nic.bridge.is_empty() || nic.agent_port.is_empty() || nic.uplinks.is_empty() {
        return bad("[nic] needs bridge, agent_port and at least one uplink".into());
    }
    if nic.uplinks.contains(&nic.agent_port) {
        return bad(format!("[nic] agent_port {:?} is also an uplink", nic.agent_port));
    }
    let storage: Vec<Ipv4Net> = nic
        .storage
        .iter()
        .map(|s| s.parse().map_err(|e| NicError::Config(format!("[nic] storage: {e}"))))
        .collect::<Result<_, _>>()?;
    let ag = nic.agent_address;
    let mut ports: BTreeSet<String> = nic.uplinks.iter().cloned().collect();
    ports.insert(nic.agent_port.clone());
    let infra: BTreeSet<String> = ports.clone();

    // Who claims what: a function, an address, a listener, a tag each
    // belong to one tenant.
    let mut owner: BTreeMap<String, &str> = BTreeMap::new();
    let mut tags: BTreeMap<u16, &str> = BTreeMap::new();
    let mut flows = Vec::new();
    let mut meters = Vec::new();
    let mut out_tenants = Vec::new();
    for t in tenants {
        let n = t.nic;
        if n.functions.is_empty() || n.addresses.is_empty() {
            return bad(format!("tenant {:?}: [tenants.nic] needs at least one function and one address", t.name));
        }
        if n.listener_port == 0 || n.dscp.is_some_and(|d| d > 63) || n.meter_kbps == Some(0) {
            return bad(format!("tenant {:?}: listener_port 1-65535, dscp 0-63, meter_kbps > 0", t.name));
        }
        for (kind, what) in n
            .functions
            .iter()
            .map(|f| ("function", f.clone()))
            .chain(n.addresses.iter().map(|a| ("address", a.to_string())))
            .chain(std::iter::once(("listener port", n.listener_port.to_string())))
        {
            if kind == "function" && infra.contains(&what) {
                return bad(format!("tenant {:?}: function {what:?} is the agent's port or an uplink", t.name));
            }
            if kind == "address" && what == ag.to_string() {
                return bad(format!("tenant {:?}: address {what} is the agent's", t.name));
            }
            let key = format!("{kind} {what}");
            if let Some(first) = owner.get(&key) {
                return bad(format!("{key} is claimed by tenants {first:?} and {:?}", t.name));
            }
            owner.insert(key, t.name);
        }
        let tag = tenant_tag(t.name);
        if let Some(other) = tags.insert(tag, t.name) {
            return bad(format!(
                "tenants {other:?} and {:?} hash to the same NIC tag {tag:#06x}; rename one of them",
                t.name
            ));
        }
        let meter = n.meter_kbps.or(t.bytes_per_sec.map(|b| (b * 8).div_ceil(1000)));
        let mut actions = String::new();
        if let Some(kbps) = meter {
            meters.push(Meter { id: u32::from(tag), kbps, tenant: t.name.to_owned() });
            let _ = write!(actions, "meter:{tag},");
        }
        if let Some(d) = n.dscp {
            let _ = write!(actions, "set_field:{d}->ip_dscp,");
        }
        actions.push_str("NORMAL");
        let lp = n.listener_port;
        for f in &n.functions {
            ports.insert(f.clone());
            for a in &n.addresses {
                flows.push(Flow::new(tag, 300, format!("arp,in_port={f},arp_spa={a},arp_tpa={ag}"), "NORMAL".into()));
                flows.push(Flow::new(
                    tag,
                    300,
                    format!("tcp,in_port={f},nw_src={a},nw_dst={ag},tp_dst={lp}"),
                    actions.clone(),
                ));
            }
            flows.push(Flow::new(tag, 100, format!("in_port={f}"), "drop".into()));
        }
        for a in &n.addresses {
            let m = format!("tcp,in_port={},nw_src={ag},tp_src={lp},nw_dst={a}", nic.agent_port);
            flows.push(Flow::new(tag, 300, m, "NORMAL".into()));
        }
        out_tenants.push(TenantTag { name: t.name.to_owned(), tag, functions: n.functions.clone() });
    }

    // The agent's own: ARP on its port and the uplinks, agent <-> storage,
    // and drop the rest.
    flows.push(Flow::new(0, 300, format!("arp,in_port={}", nic.agent_port), "NORMAL".into()));
    for u in &nic.uplinks {
        flows.push(Flow::new(0, 300, format!("arp,in_port={u}"), "NORMAL".into()));
    }
    for s in &storage {
        flows.push(Flow::new(0, 200, format!("ip,in_port={},nw_dst={s}", nic.agent_port), "NORMAL".into()));
        for u in &nic.uplinks {
            flows.push(Flow::new(0, 200, format!("ip,in_port={u},nw_src={s},nw_dst={ag}"), "NORMAL".into()));
        }
    }
    flows.push(Flow::new(0, 0, String::new(), "drop".into()));
    Ok(RuleSet { bridge: nic.bridge.clone(), flows, meters, tenants: out_tenants, ports })
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
