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
    /// The flow as the switch prints it (without counters): what the guard
    /// compares to notice a flow that was changed in place.
    pub text: String,
}

/// What reconciling needs from a switch. [`Ofctl`] is the real one; tests
/// use an in-memory switch.
pub trait Switch {
    /// The bridge's port names.
    fn ports(&self) -> Result<BTreeSet<String>, NicError>;
    /// The flows whose cookie is the agent's.
    fn owned_flows(&self) -> Result<Vec<Installed>, NicError>;
    /// Every flow on the bridge, the agent's and others'.
    fn flows(&self) -> Result<Vec<Installed>, NicError>;
    /// Meter id -> rate (kbit/s).
    fn meters(&self) -> Result<BTreeMap<u32, u64>, NicError>;
    /// Adds (`exists` false) or modifies a meter.
    fn set_meter(&self, meter: &Meter, exists: bool) -> Result<(), NicError>;
    fn del_meter(&self, id: u32) -> Result<(), NicError>;
    /// Applies `lines` (`add <flow>` / `delete <match>`) atomically.
    fn bundle(&self, lines: &[String]) -> Result<(), NicError>;
    /// The bridge's fail mode (`secure`, `standalone`, or none set, which
    /// OVS treats as standalone: it forwards with `NORMAL` when no flows do).
    fn fail_mode(&self) -> Result<Option<String>, NicError>;
    /// Sets the fail mode to `secure`.
    fn set_fail_mode_secure(&self) -> Result<(), NicError>;
    /// How the switch handles IP fragments (`normal`, `drop`, ...).
    fn frags(&self) -> Result<String, NicError>;
    fn set_frags(&self, mode: &str) -> Result<(), NicError>;
}

/// How the agent has the switch handle IP fragments: dropped. Nothing the
/// agent's traffic or its tenants' needs is fragmented (TCP with path MTU
/// discovery, RoCE with DF), and a non-first fragment carries no ports, so
/// no rule could tell whose it is. Set explicitly: the switch's default
/// (`normal`) is not a decision, and it is lost when the switch restarts.
pub const FRAGMENTS: &str = "drop";

/// Why a bridge is not one the agent may program.
pub fn check_fail_mode(sw: &dyn Switch, bridge: &str) -> Result<(), NicError> {
    match sw.fail_mode()?.as_deref() {
        Some("secure") => Ok(()),
        other => Err(NicError::FailOpen { bridge: bridge.to_owned(), mode: other.unwrap_or("(unset)").to_owned() }),
    }
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
    apply(sw, rules, false)
}

/// Like [`reconcile`], but every flow the agent owns is deleted and the
/// rule set added again in the same bundle: for a bridge whose flows were
/// changed in place (same cookie, other match or actions), which a
/// comparison of cookies does not see. Still no moment without the rules.
pub fn replace(sw: &dyn Switch, rules: &RuleSet) -> Result<Applied, NicError> {
    apply(sw, rules, true)
}

fn apply(sw: &dyn Switch, rules: &RuleSet, force: bool) -> Result<Applied, NicError> {
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

    let mut lines: Vec<String> = Vec::new();
    if force {
        lines.push(format!("delete cookie={COOKIE_PREFIX:#018x}/{OWNED_MASK:#018x}"));
        applied.flows_removed = installed.len();
    }
    lines.extend(
        rules.flows.iter().filter(|f| force || !have.contains(&f.cookie)).map(|f| format!("add {}", f.ofctl())),
    );
    applied.flows_added = lines.len() - usize::from(force);
    applied.unchanged = want.len().saturating_sub(applied.flows_added);
    if !force {
        for c in have.difference(&want) {
            lines.push(format!("delete cookie={c:#018x}/-1"));
            applied.flows_removed += 1;
        }
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
    bridge: String,
    rundir: Option<PathBuf>,
    timeout_secs: u32,
}

impl Ofctl {
    pub fn new(nic: &NicConfig) -> Self {
        Self {
            target: nic.ofctl_target.clone().unwrap_or_else(|| nic.bridge.clone()),
            bridge: nic.bridge.clone(),
            rundir: nic.ovs_rundir.clone(),
            timeout_secs: 10,
        }
    }

    /// The same switch, whose calls give up after `secs` (the guard's
    /// checks must not hang on a switch that stopped answering).
    pub fn with_timeout(mut self, secs: u32) -> Self {
        self.timeout_secs = secs;
        self
    }

    /// Runs `ovs-ofctl <args> <target> <rest>` (stdin: `input`); its stdout.
    fn run(&self, args: &[&str], rest: &[&str], input: Option<&str>) -> Result<String, NicError> {
        self.exec("ovs-ofctl", args, Some(&self.target), rest, input)
    }

    /// Runs `ovs-vsctl <args> <bridge> <rest>` against the bridge's database.
    fn vsctl(&self, args: &[&str], rest: &[&str]) -> Result<String, NicError> {
        self.exec("ovs-vsctl", args, Some(&self.bridge), rest, None)
    }

    fn exec(
        &self,
        tool: &str,
        args: &[&str],
        target: Option<&str>,
        rest: &[&str],
        input: Option<&str>,
    ) -> Result<String, NicError> {
        let mut cmd = Command::new(tool);
        // A switch that does not answer must not hang the agent.
        cmd.arg(format!("--timeout={}", self.timeout_secs)).args(args).args(target).args(rest);
        if let Some(d) = &self.rundir {
            cmd.env("OVS_RUNDIR", d);
        }
        let shown = format!("{tool} {} {} {}", args.join(" "), target.unwrap_or(""), rest.join(" "));
        let fail = |message: String| NicError::Ovs { command: shown.clone(), message };
        cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child =
            cmd.spawn().map_err(|e| fail(format!("cannot run {tool}: {e} (is Open vSwitch installed?)")))?;
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
        Ok(parse_flows(&self.run(&["-O", "OpenFlow14", "--names", "--no-stats", "dump-flows"], &[&sel], None)?))
    }

    fn flows(&self) -> Result<Vec<Installed>, NicError> {
        Ok(parse_flows(&self.run(&["-O", "OpenFlow14", "--names", "--no-stats", "dump-flows"], &[], None)?))
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

    fn fail_mode(&self) -> Result<Option<String>, NicError> {
        let mode = self.vsctl(&["get-fail-mode"], &[])?;
        Ok(Some(mode.trim().to_owned()).filter(|m| !m.is_empty()))
    }

    fn set_fail_mode_secure(&self) -> Result<(), NicError> {
        self.vsctl(&["set-fail-mode"], &["secure"]).map(|_| ())
    }

    fn frags(&self) -> Result<String, NicError> {
        Ok(self.run(&["get-frags"], &[], None)?.trim().to_owned())
    }

    fn set_frags(&self, mode: &str) -> Result<(), NicError> {
        self.run(&["set-frags"], &[mode], None).map(|_| ())
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
            // Counters change with traffic: not part of what the flow is.
            let text = l
                .trim()
                .split(", ")
                .filter(|f| {
                    !["duration=", "n_packets=", "n_bytes=", "idle_age=", "hard_age="].iter().any(|p| f.starts_with(p))
                })
                .collect::<Vec<_>>()
                .join(", ");
            Some(Installed { cookie, meter, text })
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
