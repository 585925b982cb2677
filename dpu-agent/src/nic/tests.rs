//! The policy against golden text, its validation, and reconcile against an
//! in-memory switch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::config::{FunctionNic, MacAddr, NicConfig, StorageNet, TenantNic};
use super::guard::{Drift, GuardMetrics, NicGuard};
use super::ovs::FRAGMENTS;
use super::ovs::{parse_flows, parse_meters, parse_ports, reconcile, Applied, Installed, Switch};
use super::policy::{rules, tenant_tag, Meter, RuleSet, TenantRules, COOKIE_PREFIX, TENANT_MASK};
use super::NicError;

const AGENT_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);

fn nic() -> NicConfig {
    toml::from_str(
        r#"
bridge = "br-sluice"
uplinks = ["p0"]
agent_port = "pf0sf0"
agent_address = "192.168.100.1"
storage = ["10.20.0.0/16"]
"#,
    )
    .unwrap()
}

/// A function on `port` whose MAC ends in the address's last byte.
fn function(port: &str, address: &str) -> FunctionNic {
    let a: std::net::Ipv4Addr = address.parse().unwrap();
    FunctionNic {
        port: port.into(),
        mac: MacAddr([0x02, 0, 0, 0, 0x01, a.octets()[3]]),
        addresses: vec![a],
        vlan: None,
    }
}

fn tenant(functions: &[(&str, &str)], port: u16) -> TenantNic {
    TenantNic {
        functions: functions.iter().map(|(p, a)| function(p, a)).collect(),
        listener_port: port,
        dscp: None,
        meter_kbps: None,
    }
}

/// Alpha: two functions (one on VLAN 100), DSCP; beta: one function, a meter.
fn two() -> (TenantNic, TenantNic) {
    let mut a = tenant(&[("pf0vf1", "192.168.100.11"), ("pf0vf2", "192.168.100.21")], 7101);
    a.functions[1].vlan = Some(100);
    a.dscp = Some(26);
    let mut b = tenant(&[("en3f0pf0sf2", "192.168.100.12")], 7102);
    b.meter_kbps = Some(8000);
    (a, b)
}

fn set(a: &TenantNic, b: &TenantNic) -> RuleSet {
    let ts = [
        TenantRules { name: "alpha", nic: a, bytes_per_sec: Some(12_500_000) },
        TenantRules { name: "beta", nic: b, bytes_per_sec: None },
    ];
    rules(&nic(), AGENT_MAC, &ts).unwrap()
}

#[test]
fn the_rule_set_matches_its_golden_text() {
    let (a, b) = two();
    let text = set(&a, &b).render();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/nic-rules.txt");
    if std::env::var_os("SLUICE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &text).unwrap();
    }
    let want = std::fs::read_to_string(&golden).expect("golden file (SLUICE_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(text, want, "the NIC rules changed; if on purpose, rerun with SLUICE_UPDATE_GOLDEN=1 and review");
}

#[test]
fn rules_are_deterministic_and_tenants_do_not_disturb_each_other() {
    let (a, b) = two();
    assert_eq!(set(&a, &b), set(&a, &b));
    let only_a =
        rules(&nic(), AGENT_MAC, &[TenantRules { name: "alpha", nic: &a, bytes_per_sec: Some(12_500_000) }]).unwrap();
    let full = set(&a, &b);
    let of = |r: &RuleSet, t: &str| -> BTreeSet<u64> {
        let c = COOKIE_PREFIX | (u64::from(tenant_tag(t)) << 32);
        r.flows.iter().map(|f| f.cookie).filter(|k| k & TENANT_MASK == c).collect()
    };
    assert_eq!(of(&only_a, "alpha"), of(&full, "alpha"), "adding beta leaves alpha's flows as they are");
    assert_eq!(
        full.meters.iter().map(|m| (m.tenant.as_str(), m.kbps)).collect::<Vec<_>>(),
        [("alpha", 100_000), ("beta", 8000)]
    );
    // Every function ends in a drop; the table ends in a drop.
    for f in ["pf0vf1", "pf0vf2", "en3f0pf0sf2"] {
        assert!(full.flows.iter().any(|x| x.matches == format!("in_port={f}") && x.actions == "drop"));
    }
    assert!(full.flows.iter().any(|x| x.priority == 0 && x.matches.is_empty() && x.actions == "drop"));
    assert!(full.ports.contains("pf0vf2") && full.ports.contains("p0") && full.ports.contains("pf0sf0"));
}

#[test]
fn every_accepted_frame_has_one_named_output_and_a_source_it_owns() {
    let (a, b) = two();
    let full = set(&a, &b);
    for f in &full.flows {
        // No MAC learning, no flooding, no controller: a named port or drop.
        assert!(!f.actions.contains("NORMAL") && !f.actions.contains("FLOOD") && !f.actions.contains("ALL"), "{f:?}");
        let outputs = f.actions.matches("output:").count();
        assert!(f.actions == "drop" || outputs == 1, "one output: {f:?}");
        let in_port = f.matches.split(',').find_map(|m| m.strip_prefix("in_port="));
        // What a tenant's function sends: from its own MAC, its own tag or
        // none, to the agent's port only, through its meter (ARP too).
        for func in a.functions.iter().chain(&b.functions) {
            if in_port != Some(func.port.as_str()) || f.actions == "drop" {
                continue;
            }
            assert!(f.matches.contains(&format!("dl_src={}", func.mac)), "{f:?}");
            match func.vlan {
                Some(v) => assert!(f.matches.contains(&format!("dl_vlan={v}")) && f.actions.contains("strip_vlan")),
                None => assert!(f.matches.contains("vlan_tci=0x0000/0x1fff"), "untagged only: {f:?}"),
            }
            assert!(f.actions.ends_with("output:pf0sf0"), "{f:?}");
            assert!(f.actions.starts_with("meter:"), "metered: {f:?}");
            if f.matches.starts_with("arp") {
                assert!(
                    f.matches.contains(&format!("arp_sha={}", func.mac)) && f.matches.contains("arp_tpa=192.168.100.1")
                );
                assert!(f.matches.contains("arp_op=1") || f.matches.contains("arp_op=2,dl_dst=02:00:00:00:00:01"));
            } else {
                assert!(f.matches.contains("dl_dst=02:00:00:00:00:01"), "addressed to the agent: {f:?}");
            }
        }
        // What the agent's port sends to a function goes out that function's
        // port only, and only to its MAC or address.
        if in_port == Some("pf0sf0") {
            assert!(f.matches.contains("dl_src=02:00:00:00:00:01"), "{f:?}");
            for func in a.functions.iter().chain(&b.functions) {
                let to = func
                    .addresses
                    .iter()
                    .any(|x| f.matches.ends_with(&format!("_dst={x}")) || f.matches.ends_with(&format!("arp_tpa={x}")));
                if to {
                    assert!(f.actions.ends_with(&format!("output:{}", func.port)), "{f:?}");
                    if func.vlan.is_some() {
                        assert!(f.actions.contains("mod_vlan_vid:100"), "{f:?}");
                    }
                }
            }
        }
    }
    // Storage: reached from the agent's port only, out the uplink; its
    // frames go to the agent's port only.
    let storage: Vec<_> = full.flows.iter().filter(|f| f.matches.contains("10.20.0.0/16")).collect();
    assert_eq!(storage.len(), 4);
    for f in storage {
        assert!(
            f.matches.contains("in_port=pf0sf0") && f.actions == "output:p0"
                || f.matches.contains("in_port=p0") && f.actions == "output:pf0sf0",
            "{f:?}"
        );
    }
}

#[test]
fn storage_networks_name_their_uplink_when_there_are_several() {
    let mut two_uplinks = nic();
    two_uplinks.uplinks = vec!["p0".into(), "p1".into()];
    let err = rules(&two_uplinks, AGENT_MAC, &[]).unwrap_err().to_string();
    assert!(err.contains("name the one it is reached through"), "{err}");
    two_uplinks.storage = vec![
        StorageNet::Routed { network: "10.20.0.0/16".into(), uplink: "p1".into() },
        StorageNet::Routed { network: "10.30.0.0/16".into(), uplink: "p0".into() },
    ];
    let r = rules(&two_uplinks, AGENT_MAC, &[]).unwrap();
    assert!(r.flows.iter().any(|f| f.matches.contains("nw_dst=10.20.0.0/16") && f.actions == "output:p1"));
    assert!(r.flows.iter().any(|f| f.matches.contains("nw_dst=10.30.0.0/16") && f.actions == "output:p0"));
    two_uplinks.storage = vec![
        StorageNet::Routed { network: "10.20.0.0/16".into(), uplink: "p1".into() },
        StorageNet::Routed { network: "10.20.0.0/16".into(), uplink: "p0".into() },
    ];
    let twice = rules(&two_uplinks, AGENT_MAC, &[]).unwrap_err().to_string();
    assert!(twice.contains("10.20.0.0/16 is listed more than once"), "{twice}");
    two_uplinks.storage = vec![StorageNet::Routed { network: "10.20.0.0/16".into(), uplink: "p9".into() }];
    assert!(rules(&two_uplinks, AGENT_MAC, &[]).unwrap_err().to_string().contains("\"p9\" is not in uplinks"));
    let parsed: NicConfig = toml::from_str(
        "bridge = \"b\"\nuplinks = [\"p0\", \"p1\"]\nagent_port = \"a\"\nagent_address = \"192.168.1.1\"\n\
         agent_mac = \"02:00:00:00:00:01\"\nstorage = [{ network = \"10.0.0.0/8\", uplink = \"p1\" }]\n",
    )
    .unwrap();
    assert_eq!(parsed.agent_mac, Some(AGENT_MAC));
    assert_eq!(parsed.storage, vec![StorageNet::Routed { network: "10.0.0.0/8".into(), uplink: "p1".into() }]);
}

#[test]
fn bad_configurations_are_refused_with_what_to_fix() {
    let (a, b) = two();
    let err = |nic: &NicConfig, ts: &[TenantRules<'_>]| match rules(nic, AGENT_MAC, ts) {
        Err(NicError::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    };
    fn t<'a>(name: &'a str, nic: &'a TenantNic) -> TenantRules<'a> {
        TenantRules { name, nic, bytes_per_sec: None }
    }
    let shared = tenant(&[("pf0vf1", "192.168.100.13")], 7103);
    assert!(err(&nic(), &[t("alpha", &a), t("gamma", &shared)])
        .contains("function pf0vf1 is claimed by tenants \"alpha\" and \"gamma\""));
    let mut same_addr = tenant(&[("pf0vf9", "192.168.100.11")], 7103);
    same_addr.functions[0].mac = MacAddr([0x02, 0, 0, 0, 0x09, 0x09]);
    assert!(err(&nic(), &[t("alpha", &a), t("gamma", &same_addr)]).contains("address 192.168.100.11 is claimed"));
    let mut same_mac = tenant(&[("pf0vf9", "192.168.100.13")], 7103);
    same_mac.functions[0].mac = a.functions[0].mac;
    assert!(err(&nic(), &[t("alpha", &a), t("gamma", &same_mac)]).contains("MAC 02:00:00:00:01:0b is claimed"));
    let same_port = tenant(&[("pf0vf9", "192.168.100.13")], 7102);
    assert!(err(&nic(), &[t("beta", &b), t("gamma", &same_port)]).contains("listener port 7102 is claimed"));
    let uplink = tenant(&[("p0", "192.168.100.13")], 7103);
    assert!(err(&nic(), &[t("gamma", &uplink)]).contains("the agent's port or an uplink"));
    let agents = tenant(&[("pf0vf9", "192.168.100.1")], 7103);
    assert!(err(&nic(), &[t("gamma", &agents)]).contains("is the agent's"));
    for mac in [AGENT_MAC, MacAddr([0xff; 6]), MacAddr([0x01, 0, 0x5e, 0, 0, 1]), MacAddr([0; 6])] {
        let mut m = tenant(&[("pf0vf9", "192.168.100.13")], 7103);
        m.functions[0].mac = mac;
        assert!(err(&nic(), &[t("gamma", &m)]).contains("not a station address of its own"), "{mac}");
    }
    let mut vlan = tenant(&[("pf0vf9", "192.168.100.13")], 7103);
    vlan.functions[0].vlan = Some(4095);
    assert!(err(&nic(), &[t("gamma", &vlan)]).contains("vlan 1-4094"));
    let twice = tenant(&[("pf0vf9", "192.168.100.13"), ("pf0vf9", "192.168.100.14")], 7103);
    assert!(err(&nic(), &[t("gamma", &twice)]).contains("names function pf0vf9 twice"));
    let mut dscp = tenant(&[("pf0vf9", "192.168.100.13")], 7103);
    dscp.dscp = Some(64);
    assert!(err(&nic(), &[t("gamma", &dscp)]).contains("dscp 0-63"));
    let empty = tenant(&[], 7103);
    assert!(err(&nic(), &[t("gamma", &empty)]).contains("at least one function"));
    let mut no_addr = tenant(&[("pf0vf9", "192.168.100.13")], 7103);
    no_addr.functions[0].addresses.clear();
    assert!(err(&nic(), &[t("gamma", &no_addr)]).contains("at least one address"));
    let mut bad_net = nic();
    bad_net.storage = vec![StorageNet::Network("10.20.0.1/16".into())];
    assert!(err(&bad_net, &[]).contains("host bits"));
    let mut no_uplink = nic();
    no_uplink.uplinks.clear();
    assert!(err(&no_uplink, &[]).contains("at least one uplink"));
    assert!(matches!(rules(&nic(), MacAddr([0xff; 6]), &[]), Err(NicError::Config(m)) if m.contains("set agent_mac")));
    // Two tenant names whose tags collide are refused, naming both.
    let mut seen = BTreeMap::new();
    let (x, y) = (0..100_000)
        .map(|i| format!("t{i}"))
        .find_map(|n| seen.insert(tenant_tag(&n), n.clone()).map(|first| (first, n)))
        .expect("a collision among 100000 names");
    let (tx, ty) = (tenant(&[("vx", "192.168.100.21")], 7201), tenant(&[("vy", "192.168.100.22")], 7202));
    assert!(err(&nic(), &[t(&x, &tx), t(&y, &ty)]).contains("same NIC tag"));
}

/// An OpenFlow switch in memory: ports, flows by cookie (with the meter
/// they use and their text), meters, fail mode, fragment handling, and
/// whether it answers. Cloned handles share it (the guard owns one).
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

#[derive(Default)]
struct FakeState {
    ports: BTreeSet<String>,
    flows: BTreeMap<u64, (Option<u32>, String)>,
    meters: BTreeMap<u32, u64>,
    bundles: usize,
    fail_mode: Option<String>,
    frags: String,
    down: bool,
    /// Another controller racing a repair: once the next bundle is in,
    /// this flow's text is replaced (before anyone reads the flows back).
    after_next_bundle: Option<(u64, String)>,
}

impl Fake {
    fn state(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }
    fn up(&self) -> Result<MutexGuard<'_, FakeState>, NicError> {
        let s = self.state();
        if s.down {
            return Err(NicError::Ovs { command: "ovs-ofctl".into(), message: "connection refused".into() });
        }
        Ok(s)
    }
    fn cookies(&self) -> BTreeSet<u64> {
        self.state().flows.keys().copied().collect()
    }
}

impl Switch for Fake {
    fn ports(&self) -> Result<BTreeSet<String>, NicError> {
        Ok(self.up()?.ports.clone())
    }
    fn owned_flows(&self) -> Result<Vec<Installed>, NicError> {
        Ok(self.flows()?.into_iter().filter(|f| f.cookie & super::policy::OWNED_MASK == COOKIE_PREFIX).collect())
    }
    fn flows(&self) -> Result<Vec<Installed>, NicError> {
        Ok(self
            .up()?
            .flows
            .iter()
            .map(|(&cookie, (meter, text))| Installed { cookie, meter: *meter, text: text.clone() })
            .collect())
    }
    fn meters(&self) -> Result<BTreeMap<u32, u64>, NicError> {
        Ok(self.up()?.meters.clone())
    }
    fn set_meter(&self, m: &Meter, exists: bool) -> Result<(), NicError> {
        let mut s = self.up()?;
        assert_eq!(exists, s.meters.contains_key(&m.id));
        s.meters.insert(m.id, m.kbps);
        Ok(())
    }
    fn del_meter(&self, id: u32) -> Result<(), NicError> {
        let mut s = self.up()?;
        assert!(!s.flows.values().any(|(m, _)| *m == Some(id)), "meter {id} deleted while a flow uses it");
        s.meters.remove(&id);
        Ok(())
    }
    fn bundle(&self, lines: &[String]) -> Result<(), NicError> {
        let mut s = self.up()?;
        s.bundles += 1;
        for l in lines {
            if let Some(f) = l.strip_prefix("add ") {
                let got = parse_flows(&format!(" {f}"));
                if let Some(m) = got[0].meter {
                    assert!(s.meters.contains_key(&m), "flow added before its meter {m}");
                }
                s.flows.insert(got[0].cookie, (got[0].meter, f.to_owned()));
            } else if let Some(c) = l.strip_prefix("delete cookie=0x").and_then(|c| c.strip_suffix("/-1")) {
                s.flows.remove(&u64::from_str_radix(c, 16).unwrap());
            } else if l == &format!("delete cookie={COOKIE_PREFIX:#018x}/{:#018x}", super::policy::OWNED_MASK) {
                s.flows.retain(|c, _| c & super::policy::OWNED_MASK != COOKIE_PREFIX);
            } else {
                panic!("unexpected bundle line {l:?}");
            }
        }
        if let Some((cookie, text)) = s.after_next_bundle.take() {
            let meter = s.flows.get(&cookie).and_then(|f| f.0);
            s.flows.insert(cookie, (meter, text));
        }
        Ok(())
    }
    fn fail_mode(&self) -> Result<Option<String>, NicError> {
        Ok(self.up()?.fail_mode.clone())
    }
    fn set_fail_mode_secure(&self) -> Result<(), NicError> {
        self.up()?.fail_mode = Some("secure".into());
        Ok(())
    }
    fn frags(&self) -> Result<String, NicError> {
        Ok(self.up()?.frags.clone())
    }
    fn set_frags(&self, mode: &str) -> Result<(), NicError> {
        self.up()?.frags = mode.into();
        Ok(())
    }
}

fn fake(rules: &RuleSet) -> Fake {
    let f = Fake::default();
    {
        let mut s = f.state();
        s.ports = rules.ports.clone();
        s.fail_mode = Some("secure".into());
        s.frags = "normal".into();
        // Somebody else's flow and meter: never touched.
        s.flows.insert(0x1234, (Some(7), "cookie=0x1234, priority=5,ip actions=meter:7,drop".into()));
        s.meters.insert(7, 1000);
    }
    f
}

#[test]
fn reconcile_installs_once_removes_exactly_and_leaves_others_alone() {
    let (a, b) = two();
    let full = set(&a, &b);
    let sw = fake(&full);
    let first = reconcile(&sw, &full).unwrap();
    assert_eq!(first, Applied { flows_added: full.flows.len(), meters_set: 2, ..Default::default() });
    // A restart with the same config changes nothing (no duplicates, no gap).
    let again = reconcile(&sw, &full).unwrap();
    assert_eq!(again, Applied { unchanged: full.flows.len(), ..Default::default() });
    assert_eq!(sw.state().bundles, 1, "nothing to do means no bundle");

    // Removing beta removes exactly its flows and its meter.
    let only_a =
        rules(&nic(), AGENT_MAC, &[TenantRules { name: "alpha", nic: &a, bytes_per_sec: Some(12_500_000) }]).unwrap();
    let before = sw.cookies();
    let r = reconcile(&sw, &only_a).unwrap();
    let after = sw.cookies();
    let beta = COOKIE_PREFIX | (u64::from(tenant_tag("beta")) << 32);
    let gone: BTreeSet<u64> = before.difference(&after).copied().collect();
    assert!(!gone.is_empty() && gone.iter().all(|c| c & TENANT_MASK == beta), "only beta's flows went: {gone:x?}");
    assert!(after.is_subset(&before), "nothing was added");
    assert_eq!(r.meters_removed, 1);
    assert!(!sw.state().meters.contains_key(&u32::from(tenant_tag("beta"))));
    assert!(sw.state().flows.contains_key(&0x1234) && sw.state().meters.get(&7) == Some(&1000), "foreign rules stay");

    // A new rate modifies the meter in place.
    let mut faster = a.clone();
    faster.meter_kbps = Some(50_000);
    let r = reconcile(
        &sw,
        &rules(&nic(), AGENT_MAC, &[TenantRules { name: "alpha", nic: &faster, bytes_per_sec: None }]).unwrap(),
    )
    .unwrap();
    assert_eq!((r.meters_set, r.flows_added, r.flows_removed), (1, 0, 0));
    assert_eq!(sw.state().meters[&u32::from(tenant_tag("alpha"))], 50_000);
}

#[test]
fn an_unknown_port_changes_nothing() {
    let (a, b) = two();
    let full = set(&a, &b);
    let sw = fake(&full);
    sw.state().ports.remove("pf0vf2");
    match reconcile(&sw, &full) {
        Err(NicError::UnknownPort { port, bridge, known }) => {
            assert_eq!((port.as_str(), bridge.as_str()), ("pf0vf2", "br-sluice"));
            assert!(known.contains("pf0vf1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sw.state().flows.len(), 1, "only the foreign flow");
    assert_eq!(sw.state().meters.len(), 1);
}

fn guard_metrics() -> GuardMetrics {
    GuardMetrics {
        drift: prometheus::IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"]).unwrap(),
        in_place: prometheus::IntGauge::new("i", "i").unwrap(),
        foreign_flows: prometheus::IntGauge::new("f", "f").unwrap(),
    }
}

fn drifts(m: &GuardMetrics, reason: &str) -> u64 {
    m.drift.with_label_values(&[reason]).get()
}

#[test]
fn a_bridge_that_would_forward_without_the_rules_is_refused() {
    let (a, b) = two();
    let full = set(&a, &b);
    for mode in [None, Some("standalone")] {
        let sw = fake(&full);
        sw.state().fail_mode = mode.map(String::from);
        match NicGuard::start(Box::new(sw.clone()), full.clone(), guard_metrics()) {
            Err(e @ NicError::FailOpen { .. }) => {
                assert!(e.to_string().contains("ovs-vsctl set-fail-mode br-sluice secure"), "{e}")
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a {mode:?} bridge was accepted"),
        }
        assert_eq!(sw.cookies().len(), 1, "nothing installed on it");
    }
}

/// Two tenants' rules on a fake switch, and a guard started on it.
fn guarded() -> (RuleSet, Fake, GuardMetrics, Arc<NicGuard>, Applied) {
    let (a, b) = two();
    let full = set(&a, &b);
    let sw = fake(&full);
    let m = guard_metrics();
    let (guard, applied) = NicGuard::start(Box::new(sw.clone()), full.clone(), m.clone()).unwrap();
    (full, sw, m, guard, applied)
}

/// A flow of ours changed in place while the agent was down (same
/// cookie, other actions: `ovs-ofctl mod-flows`) is put right at start and
/// at a reload, not taken as the rules (a comparison of cookies passed it,
/// and it became the baseline the guard checks against).
#[test]
fn a_flow_changed_in_place_before_start_or_reload_is_put_right() {
    let (a, b) = two();
    let full = set(&a, &b);
    let sw = fake(&full);
    let (guard, _) = NicGuard::start(Box::new(sw.clone()), full.clone(), guard_metrics()).unwrap();
    let victim = *sw.cookies().iter().find(|c| **c & super::policy::OWNED_MASK == COOKIE_PREFIX).unwrap();
    let original = sw.state().flows[&victim].clone();
    let opened = |sw: &Fake| {
        let changed = format!("{} actions=NORMAL", original.1.split(" actions=").next().unwrap());
        sw.state().flows.insert(victim, (original.0, changed));
    };
    opened(&sw);
    guard.apply(full.clone()).unwrap();
    assert_eq!(sw.state().flows[&victim], original, "a reload puts it right");
    drop(guard);
    opened(&sw);
    let (guard, _) = NicGuard::start(Box::new(sw.clone()), full.clone(), guard_metrics()).unwrap();
    assert_eq!(sw.state().flows[&victim], original, "a start puts it right");
    assert_eq!(guard.check().unwrap(), vec![], "and guards the rules, not the change");
}

#[test]
fn a_flow_changed_while_the_guard_repairs_is_repaired_at_the_next_check() {
    let (full, sw, m, guard, _) = guarded();
    let victim = *sw.cookies().iter().find(|c| **c & super::policy::OWNED_MASK == COOKIE_PREFIX).unwrap();
    let original = sw.state().flows[&victim].clone();
    let changed = format!("{} actions=NORMAL", original.1.split(" actions=").next().unwrap());
    // A `del-flows`, and another controller's `mod-flows` landing right
    // after the guard's repair and before it reads the flows back.
    sw.state().flows.clear();
    sw.state().after_next_bundle = Some((victim, changed.clone()));
    assert_eq!(guard.check().unwrap(), vec![Drift::Flows { missing: full.flows.len(), unexpected: 0 }]);
    assert_eq!(sw.state().flows[&victim].1, changed, "the race happened");
    // The next check compares against the rules' own read-back, not the
    // raced one: the change is seen and undone.
    assert_eq!(guard.check().unwrap(), vec![Drift::Flows { missing: 1, unexpected: 1 }]);
    assert_eq!(sw.state().flows[&victim], original);
    assert_eq!(guard.check().unwrap(), vec![], "nothing left to repair");
    assert_eq!(drifts(&m, "flows"), 2);
}

#[test]
fn the_guard_restores_what_was_deleted_changed_or_reset_and_says_when_it_cannot() {
    let (full, sw, m, guard, applied) = guarded();
    assert_eq!(applied.flows_added, full.flows.len());
    assert_eq!(sw.state().frags, FRAGMENTS, "fragment handling set explicitly at start");
    let status = guard.status();
    assert!(status.get().0 && m.in_place.get() == 1);
    assert_eq!(guard.check().unwrap(), vec![], "nothing to repair");
    let ours = sw.cookies();

    // A manual `del-flows`: everything restored, the foreign flow too is
    // only the operator's business.
    sw.state().flows.clear();
    let found = guard.check().unwrap();
    assert_eq!(found, vec![Drift::Flows { missing: full.flows.len(), unexpected: 0 }]);
    assert_eq!(sw.cookies(), ours.iter().copied().filter(|c| *c != 0x1234).collect());
    assert!(status.get().0 && status.get().1.contains("restored"), "{:?}", status.get());

    // A flow changed in place (same cookie, other actions: another
    // controller's mod-flows) is seen by its text and replaced.
    let victim = *sw
        .cookies()
        .iter()
        .find(|c| **c & TENANT_MASK == COOKIE_PREFIX | (u64::from(tenant_tag("beta")) << 32))
        .unwrap();
    let original = sw.state().flows[&victim].clone();
    sw.state()
        .flows
        .insert(victim, (None, format!("{} actions=NORMAL", original.1.split(" actions=").next().unwrap())));
    assert_eq!(guard.check().unwrap(), vec![Drift::Flows { missing: 1, unexpected: 1 }]);
    assert_eq!(sw.state().flows[&victim], original);

    // An extra flow with the agent's cookie prefix (someone copying it).
    sw.state()
        .flows
        .insert(COOKIE_PREFIX | 0xdead, (None, "cookie=0x51ce00000000dead, priority=900 actions=NORMAL".into()));
    assert_eq!(guard.check().unwrap(), vec![Drift::Flows { missing: 0, unexpected: 1 }]);
    assert!(!sw.cookies().contains(&(COOKIE_PREFIX | 0xdead)));

    // A meter changed, fail mode and fragments reset.
    let beta = u32::from(tenant_tag("beta"));
    sw.state().meters.insert(beta, 1_000_000);
    sw.state().fail_mode = Some("standalone".into());
    sw.state().frags = "normal".into();
    let found = guard.check().unwrap();
    assert_eq!(
        found,
        vec![
            Drift::FailMode("standalone".into()),
            Drift::Fragments("normal".into()),
            Drift::Meter { id: beta, found: Some(1_000_000), want: 8000 }
        ]
    );
    assert_eq!(sw.state().meters[&beta], 8000);
    assert_eq!(sw.state().fail_mode.as_deref(), Some("secure"));

    // The switch restarts: unreachable (not ready, counted once), then
    // back empty (secure: it forwards nothing) and restored.
    sw.state().down = true;
    assert!(guard.check().is_err());
    assert!(guard.check().is_err());
    assert!(!status.get().0 && status.get().1.contains("not verified"), "{:?}", status.get());
    assert_eq!((drifts(&m, "unreachable"), m.in_place.get()), (1, 0));
    {
        let mut s = sw.state();
        s.down = false;
        s.flows.clear();
        s.meters.clear();
        s.frags = "normal".into();
    }
    let found = guard.check().unwrap();
    assert!(found.contains(&Drift::Flows { missing: full.flows.len(), unexpected: 0 }), "{found:?}");
    assert!(status.get().0 && m.in_place.get() == 1);
    assert_eq!(sw.state().meters.len(), 2);
    assert_eq!(
        (drifts(&m, "flows"), drifts(&m, "meters"), drifts(&m, "fail_mode"), drifts(&m, "fragments")),
        (4, 3, 1, 2)
    );

    // A foreign flow is reported, not removed, and not a drift.
    sw.state().flows.insert(0x77, (None, "cookie=0x77, priority=1,arp actions=drop".into()));
    assert_eq!(guard.check().unwrap(), vec![]);
    assert_eq!(m.foreign_flows.get(), 1);
    assert!(sw.state().flows.contains_key(&0x77));

    // A reload's rule set becomes the one guarded.
    let (a, _) = two();
    let only_a = rules(&nic(), AGENT_MAC, &[TenantRules { name: "alpha", nic: &a, bytes_per_sec: None }]).unwrap();
    guard.apply(only_a.clone()).unwrap();
    assert_eq!(guard.check().unwrap(), vec![]);
    assert!(only_a.flows.iter().all(|f| sw.cookies().contains(&f.cookie)));
}

#[test]
fn ovs_ofctl_output_is_parsed() {
    // Captured from ovs-ofctl 3.1 (userspace datapath).
    let show = "OFPT_FEATURES_REPLY (xid=0x2): dpid:000082790990404c\nn_tables:254, n_buffers:0\n \
                1(pA): addr:5a:18:d3:51:80:0f\n     config:     0\n 2(pf0vf1): addr:5a:18:d3:51:80:10\n \
                LOCAL(br0): addr:82:79:09:90:40:4c\n";
    assert_eq!(parse_ports(show), ["br0", "pA", "pf0vf1"].map(String::from).into_iter().collect());
    let dump =
        " cookie=0x51ce123400000001, duration=0.022s, table=0, n_packets=0, n_bytes=0, priority=300,tcp,in_port=pA,\
                nw_src=10.9.0.2,nw_dst=10.9.0.1,tp_dst=7001 actions=meter:4660,set_field:26->ip_dscp,NORMAL\n \
                cookie=0x51ce000000000002, duration=0.022s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop\n";
    assert_eq!(
        parse_flows(dump),
        vec![
            Installed {
                cookie: 0x51ce_1234_0000_0001,
                meter: Some(4660),
                text:
                    "cookie=0x51ce123400000001, table=0, priority=300,tcp,in_port=pA,nw_src=10.9.0.2,nw_dst=10.9.0.1,\
                       tp_dst=7001 actions=meter:4660,set_field:26->ip_dscp,NORMAL"
                        .into()
            },
            Installed {
                cookie: 0x51ce_0000_0000_0002,
                meter: None,
                text: "cookie=0x51ce000000000002, table=0, priority=0 actions=drop".into()
            }
        ]
    );
    let meters = "OFPST_METER_CONFIG reply (OF1.3) (xid=0x2):\nmeter=4660 kbps burst bands=\ntype=drop rate=8000 burst_size=800\n\
                  meter=9 kbps bands=\ntype=drop rate=100\n";
    assert_eq!(parse_meters(meters), BTreeMap::from([(4660, 8000), (9, 100)]));
}
