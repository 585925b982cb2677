//! Keeping the rules on the bridge: fail closed, always.
//!
//! The rules are only as good as the moment they are missing. A bridge
//! whose fail mode is not `secure` forwards with MAC learning whenever it
//! holds no flows (before the agent first starts, after `ovs-vswitchd`
//! restarts), so the guard refuses such a bridge at start. While the agent
//! runs, the guard checks the bridge every [`CHECK_EVERY`]: its fail mode,
//! its fragment handling, the agent's flows as the switch prints them (so a
//! flow deleted, added or changed in place is seen) and the meters. Any
//! difference marks the agent not ready, is counted
//! (`sluice_agent_nic_drift_total{reason}`), and is repaired: the rule set
//! is replaced in one bundle and read back. A switch that does not answer
//! keeps the agent not ready until it does; with a secure fail mode it
//! forwards nothing meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};
use tracing::{error, info, warn};

use super::ovs::{check_fail_mode, replace, Applied, Installed, Switch, FRAGMENTS};
use super::policy::{RuleSet, COOKIE_PREFIX, OWNED_MASK};
use super::NicError;

/// How often the bridge is checked: a restarted switch or a deleted flow
/// is repaired within about this long.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Each switch call in a check gives up after this (a hung switch must not
/// stop the guard from reporting it).
pub const CHECK_TIMEOUT_SECS: u32 = 5;

/// What the guard counts and shows.
#[derive(Clone)]
pub struct GuardMetrics {
    /// Events by reason: `flows`, `meters`, `fail_mode`, `fragments`,
    /// `unreachable`.
    pub drift: IntCounterVec,
    /// 1 while the bridge holds the rules as applied, else 0.
    pub in_place: IntGauge,
    /// Flows on the bridge that are not the agent's.
    pub foreign_flows: IntGauge,
}

/// The guard's view for readiness.
#[derive(Debug, Default)]
pub struct NicStatus {
    in_place: AtomicBool,
    detail: Mutex<String>,
}

impl NicStatus {
    /// Whether the bridge holds the rules, and a line saying so.
    pub fn get(&self) -> (bool, String) {
        (self.in_place.load(Ordering::Acquire), self.detail.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn set(&self, in_place: bool, detail: String) {
        *self.detail.lock().unwrap_or_else(|p| p.into_inner()) = detail;
        self.in_place.store(in_place, Ordering::Release);
    }
}

/// One difference found by a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    FailMode(String),
    Fragments(String),
    /// Flows of the agent's missing, added or changed (counts).
    Flows {
        missing: usize,
        unexpected: usize,
    },
    /// Meter id: what the switch has (None: missing) vs the rule.
    Meter {
        id: u32,
        found: Option<u64>,
        want: u64,
    },
}

impl Drift {
    fn reason(&self) -> &'static str {
        match self {
            Drift::FailMode(_) => "fail_mode",
            Drift::Fragments(_) => "fragments",
            Drift::Flows { .. } => "flows",
            Drift::Meter { .. } => "meters",
        }
    }
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drift::FailMode(m) => write!(f, "fail mode was {m}, set back to secure"),
            Drift::Fragments(m) => write!(f, "fragment handling was {m}, set back to {FRAGMENTS}"),
            Drift::Flows { missing, unexpected } => {
                write!(f, "{missing} of the agent's flows missing or changed, {unexpected} unexpected")
            }
            Drift::Meter { id, found: Some(k), want } => write!(f, "meter {id} at {k} kbit/s instead of {want}"),
            Drift::Meter { id, found: None, .. } => write!(f, "meter {id} missing"),
        }
    }
}

struct Inner {
    sw: Box<dyn Switch + Send>,
    rules: RuleSet,
    /// The agent's flows as the switch printed them after the last apply.
    baseline: Vec<String>,
    /// Foreign flows seen at the last check (to warn once per change).
    foreign: Vec<String>,
    /// The switch did not answer at the last check.
    unreachable: bool,
}

/// Applies the rules and keeps them on the bridge.
pub struct NicGuard {
    inner: Mutex<Inner>,
    status: Arc<NicStatus>,
    metrics: GuardMetrics,
}

impl NicGuard {
    /// Checks the bridge is fail-secure (refusing it otherwise), sets the
    /// fragment handling, and makes it hold `rules`.
    pub fn start(
        sw: Box<dyn Switch + Send>,
        rules: RuleSet,
        metrics: GuardMetrics,
    ) -> Result<(Arc<Self>, Applied), NicError> {
        check_fail_mode(sw.as_ref(), &rules.bridge)?;
        if sw.frags()? != FRAGMENTS {
            sw.set_frags(FRAGMENTS)?;
        }
        // Replaced, not reconciled: a flow of ours changed in place while
        // the agent was down (same cookie, other actions) would pass a
        // comparison of cookies and become the baseline read back below.
        let applied = replace(sw.as_ref(), &rules)?;
        let mut inner = Inner { sw, rules, baseline: Vec::new(), foreign: Vec::new(), unreachable: false };
        inner.baseline = read_back(&inner)?;
        let guard = Arc::new(Self { inner: Mutex::new(inner), status: Arc::default(), metrics });
        guard.mark_in_place("NIC rules in place");
        Ok((guard, applied))
    }

    /// What readiness reads.
    pub fn status(&self) -> Arc<NicStatus> {
        self.status.clone()
    }

    /// Replaces the rule set (a reload): replaced whole in one bundle (as
    /// at start: a flow changed in place since the last check is not
    /// kept), read back, guarded.
    pub fn apply(&self, rules: RuleSet) -> Result<Applied, NicError> {
        let mut inner = self.lock();
        let applied = replace(inner.sw.as_ref(), &rules)?;
        inner.rules = rules;
        inner.baseline = read_back(&inner)?;
        drop(inner);
        self.mark_in_place("NIC rules in place");
        Ok(applied)
    }

    /// One check (and repair). `Ok` with what was found and repaired;
    /// `Err` when the switch could not be read or repaired (the agent is
    /// then not ready until a later check succeeds).
    pub fn check(&self) -> Result<Vec<Drift>, NicError> {
        let mut inner = self.lock();
        match check_and_repair(&mut inner, &self.metrics) {
            Ok(found) => {
                if inner.unreachable {
                    info!(bridge = %inner.rules.bridge, "NIC guard: the switch answers again");
                    inner.unreachable = false;
                }
                drop(inner);
                if found.is_empty() {
                    if !self.status.get().0 {
                        self.mark_in_place("NIC rules in place");
                    }
                } else {
                    let what = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                    self.mark_in_place(&format!("NIC rules in place (restored: {what})"));
                }
                Ok(found)
            }
            Err(e) => {
                if !inner.unreachable {
                    inner.unreachable = true;
                    self.metrics.drift.with_label_values(&["unreachable"]).inc();
                    error!(bridge = %inner.rules.bridge, error = %e, "NIC guard: cannot check or restore the rules; not ready");
                }
                drop(inner);
                self.metrics.in_place.set(0);
                self.status.set(false, format!("NIC rules not verified: {e}"));
                Err(e)
            }
        }
    }

    /// Checks every [`CHECK_EVERY`] on a thread of its own (the checks run
    /// `ovs-ofctl`), until the guard is dropped.
    pub fn watch(self: &Arc<Self>) -> std::io::Result<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        std::thread::Builder::new().name("nic-guard".into()).spawn(move || loop {
            std::thread::sleep(CHECK_EVERY);
            let Some(guard) = weak.upgrade() else { return };
            let _ = guard.check();
        })?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_in_place(&self, detail: &str) {
        self.metrics.in_place.set(1);
        self.status.set(true, detail.to_owned());
    }
}

/// The agent's flows as the switch prints them, sorted; checks that they
/// are the rule set's (by cookie).
fn read_back(inner: &Inner) -> Result<Vec<String>, NicError> {
    let flows = inner.sw.owned_flows()?;
    let have: std::collections::BTreeSet<u64> = flows.iter().map(|f| f.cookie).collect();
    let want: std::collections::BTreeSet<u64> = inner.rules.flows.iter().map(|f| f.cookie).collect();
    if have != want {
        return Err(NicError::Ovs {
            command: "reading back the rules".into(),
            message: format!("the bridge holds {} of the agent's flows, the rule set has {}", have.len(), want.len()),
        });
    }
    Ok(texts(&flows))
}

fn texts(flows: &[Installed]) -> Vec<String> {
    let mut t: Vec<String> = flows.iter().map(|f| f.text.clone()).collect();
    t.sort();
    t
}

fn check_and_repair(inner: &mut Inner, metrics: &GuardMetrics) -> Result<Vec<Drift>, NicError> {
    let sw = inner.sw.as_ref();
    let mut found = Vec::new();
    let mode = sw.fail_mode()?;
    if mode.as_deref() != Some("secure") {
        // The same reason the agent refuses such a bridge at start; here
        // it is repaired, as the flows are, rather than stopping the agent
        // (which would leave it fail-open).
        sw.set_fail_mode_secure()?;
        found.push(Drift::FailMode(mode.unwrap_or_else(|| "(unset)".into())));
    }
    let frags = sw.frags()?;
    if frags != FRAGMENTS {
        sw.set_frags(FRAGMENTS)?;
        found.push(Drift::Fragments(frags));
    }
    let all = sw.flows()?;
    let (owned, foreign): (Vec<Installed>, Vec<Installed>) =
        all.into_iter().partition(|f| f.cookie & OWNED_MASK == COOKIE_PREFIX);
    let now = texts(&owned);
    let mut flows_drifted = false;
    if now != inner.baseline {
        let missing = inner.baseline.iter().filter(|t| !now.contains(t)).count();
        let unexpected = now.iter().filter(|t| !inner.baseline.contains(t)).count();
        found.push(Drift::Flows { missing, unexpected });
        flows_drifted = true;
    }
    let meters: BTreeMap<u32, u64> = sw.meters()?;
    for m in &inner.rules.meters {
        let have = meters.get(&m.id).copied();
        if have != Some(m.kbps) {
            found.push(Drift::Meter { id: m.id, found: have, want: m.kbps });
        }
    }
    let foreign = texts(&foreign);
    if foreign != inner.foreign {
        metrics.foreign_flows.set(i64::try_from(foreign.len()).unwrap_or(i64::MAX));
        if !foreign.is_empty() {
            warn!(
                bridge = %inner.rules.bridge,
                flows = ?foreign,
                "NIC guard: the bridge holds flows the agent did not install; a Sluice bridge should hold only the agent's"
            );
        }
        inner.foreign = foreign;
    }
    if found.is_empty() {
        return Ok(found);
    }
    for d in &found {
        metrics.drift.with_label_values(&[d.reason()]).inc();
    }
    metrics.in_place.set(0);
    let what = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    error!(bridge = %inner.rules.bridge, drift = %what, "NIC guard: the bridge does not hold the agent's rules; restoring");
    if flows_drifted || found.iter().any(|d| matches!(d, Drift::Meter { .. })) {
        let applied = replace(sw, &inner.rules)?;
        // The baseline stays what the last apply read back: the rules have
        // not changed, so a repair prints the same. Learning it again here
        // would let another controller's change that lands between the
        // repair and this read become what later checks compare against
        // (never repaired); a read that differs is repaired at the next check.
        let after = read_back(inner)?;
        if after != inner.baseline {
            warn!(
                bridge = %inner.rules.bridge,
                "NIC guard: the bridge changed again while the rules were restored; repairing at the next check"
            );
        }
        info!(
            bridge = %inner.rules.bridge,
            added = applied.flows_added,
            meters_set = applied.meters_set,
            "NIC guard: rules restored"
        );
    }
    Ok(found)
}
