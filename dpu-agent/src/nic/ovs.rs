//! Applying a [`RuleSet`] to an Open vSwitch bridge, and keeping it there.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::config::NicConfig;
use super::policy::{Meter, RuleSet, COOKIE_PREFIX, OWNED_MASK};
use super::NicError;

/// A flow the agent installed earlier (read back from the bridge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub cookie: u64,
    /// The meter its actions use, if any.
    pub meter: Option<u32>,
}

/// What reconciling needs from a switch. [`Ofctl`] is the real one; tests
/// use an in-memory switch.
pub trait Switch {
    /// The bridge's port names.
    fn ports(&self) -> Result<BTreeSet<String>, NicError>;
    /// The flows whose cookie is the agent's.
    fn owned_flows(&self) -> Result<Vec<Installed>, NicError>;
    /// Meter id -> rate (kbit/s).
    fn meters(&self) -> Result<BTreeMap<u32, u64>, NicError>;
    /// Adds (`exists` false) or modifies a meter.
    fn set_meter(&self, meter: &Meter, exists: bool) -> Result<(), NicError>;
    fn del_meter(&self, id: u32) -> Result<(), NicError>;
    /// Applies `lines` (`add <flow>` / `delete <match>`) atomically.
    fn bundle(&self, lines: &[String]) -> Result<(), NicError>;
}

/// What a reconcile changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub flows_added: usize,
    pub flows_removed: usize,
    pub meters_set: usize,
    pub meters_removed: usize,
    /// Flows already in place.
    pub unchanged: usize,
}

/// Makes the bridge hold exactly `rules` among the agent's flows and meters:
/// checks every port exists, sets the meters the new flows use, then adds
/// the missing flows and deletes the stale ones in one bundle (so no moment
/// has neither the old nor the new rule), then deletes meters nothing uses
/// any more. Flows and meters the agent did not install are never touched.
pub fn reconcile(sw: &dyn Switch, rules: &RuleSet) -> Result<Applied, NicError> {
    let ports = sw.ports()?;
    if let Some(p) = rules.ports.iter().find(|p| !ports.contains(*p)) {
        let known = ports.iter().cloned().collect::<Vec<_>>().join(", ");
        return Err(NicError::UnknownPort { port: p.clone(), bridge: rules.bridge.clone(), known });
    }
    let installed = sw.owned_flows()?;
    let have: BTreeSet<u64> = installed.iter().map(|f| f.cookie).collect();
    let want: BTreeSet<u64> = rules.flows.iter().map(|f| f.cookie).collect();
    let mut applied = Applied::default();

    let meters = sw.meters()?;
    for m in &rules.meters {
        match meters.get(&m.id) {
            Some(&kbps) if kbps == m.kbps => {}
            found => {
                sw.set_meter(m, found.is_some())?;
                applied.meters_set += 1;
            }
        }
    }

    let mut lines: Vec<String> =
        rules.flows.iter().filter(|f| !have.contains(&f.cookie)).map(|f| format!("add {}", f.ofctl())).collect();
    applied.flows_added = lines.len();
    applied.unchanged = want.len() - lines.len();
    for c in have.difference(&want) {
        lines.push(format!("delete cookie={c:#018x}/-1"));
        applied.flows_removed += 1;
    }
    if !lines.is_empty() {
        sw.bundle(&lines)?;
    }

    let keep: BTreeSet<u32> = rules.meters.iter().map(|m| m.id).collect();
    let stale: BTreeSet<u32> = installed.iter().filter_map(|f| f.meter).filter(|id| !keep.contains(id)).collect();
    for id in stale {
        if meters.contains_key(&id) {
            sw.del_meter(id)?;
            applied.meters_removed += 1;
        }
    }
    Ok(applied)
}

/// The real switch: `ovs-ofctl` against the configured bridge.
pub struct Ofctl {
    target: String,
    rundir: Option<PathBuf>,
}

impl Ofctl {
    pub fn new(nic: &NicConfig) -> Self {
        Self { target: nic.ofctl_target.clone().unwrap_or_else(|| nic.bridge.clone()), rundir: nic.ovs_rundir.clone() }
    }

    /// Runs `ovs-ofctl <args> <target> <rest>` (stdin: `input`); its stdout.
    fn run(&self, args: &[&str], rest: &[&str], input: Option<&str>) -> Result<String, NicError> {
        let mut cmd = Command::new("ovs-ofctl");
        // A switch that does not answer must not hang the agent's start.
        cmd.arg("--timeout=10").args(args).arg(&self.target).args(rest);
        if let Some(d) = &self.rundir {
            cmd.env("OVS_RUNDIR", d);
        }
        let shown = format!("ovs-ofctl {} {} {}", args.join(" "), self.target, rest.join(" "));
        let fail = |message: String| NicError::Ovs { command: shown.clone(), message };
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child =
            cmd.spawn().map_err(|e| fail(format!("cannot run ovs-ofctl: {e} (is Open vSwitch installed?)")))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).map_err(|e| fail(format!("writing its input: {e}")))?;
        }
        let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(fail(format!("{}: {}", out.status, err.trim())));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Switch for Ofctl {
    fn ports(&self) -> Result<BTreeSet<String>, NicError> {
        Ok(parse_ports(&self.run(&["show"], &[], None)?))
    }

    fn owned_flows(&self) -> Result<Vec<Installed>, NicError> {
        let sel = format!("cookie={COOKIE_PREFIX:#018x}/{OWNED_MASK:#018x}");
        Ok(parse_flows(&self.run(&["-O", "OpenFlow14", "--names", "dump-flows"], &[&sel], None)?))
    }

    fn meters(&self) -> Result<BTreeMap<u32, u64>, NicError> {
        Ok(parse_meters(&self.run(&["-O", "OpenFlow13", "dump-meters"], &[], None)?))
    }

    fn set_meter(&self, meter: &Meter, exists: bool) -> Result<(), NicError> {
        let verb = if exists { "mod-meter" } else { "add-meter" };
        self.run(&["-O", "OpenFlow13", verb], &[&meter.ofctl()], None).map(|_| ())
    }

    fn del_meter(&self, id: u32) -> Result<(), NicError> {
        self.run(&["-O", "OpenFlow13", "del-meter"], &[&format!("meter={id}")], None).map(|_| ())
    }

    fn bundle(&self, lines: &[String]) -> Result<(), NicError> {
        let mut text = lines.join("\n");
        text.push('\n');
        self.run(&["-O", "OpenFlow14", "--bundle", "add-flows"], &["-"], Some(&text)).map(|_| ())
    }
}

/// Port names from `ovs-ofctl show`: ` 1(pA): addr:...`, ` LOCAL(br0): ...`.
pub fn parse_ports(show: &str) -> BTreeSet<String> {
    show.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let open = l.find('(')?;
            let close = l[open..].find("):")? + open;
            let num = &l[..open];
            (num == "LOCAL" || num.chars().all(|c| c.is_ascii_digit()) && !num.is_empty())
                .then(|| l[open + 1..close].to_owned())
        })
        .collect()
}

/// Cookies (and meters used) from `ovs-ofctl dump-flows`.
pub fn parse_flows(dump: &str) -> Vec<Installed> {
    dump.lines()
        .filter_map(|l| {
            let hex = l.trim_start().strip_prefix("cookie=0x")?;
            let end = hex.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(hex.len());
            let cookie = u64::from_str_radix(&hex[..end], 16).ok()?;
            let meter = l
                .split_once(" actions=")
                .and_then(|(_, a)| a.split(',').find_map(|x| x.strip_prefix("meter:")?.trim().parse().ok()));
            Some(Installed { cookie, meter })
        })
        .collect()
}

/// Meter id -> first band's rate from `ovs-ofctl dump-meters`.
pub fn parse_meters(dump: &str) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let mut current = None;
    for word in dump.split_whitespace() {
        if let Some(id) = word.strip_prefix("meter=") {
            current = id.parse().ok();
        } else if let (Some(id), Some(rate)) = (current, word.strip_prefix("rate=")) {
            if let Ok(rate) = rate.parse() {
                out.entry(id).or_insert(rate);
            }
        }
    }
    out
}
