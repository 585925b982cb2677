//! The policy against golden text, its validation, and reconcile against an
//! in-memory switch.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use super::config::{NicConfig, TenantNic};
use super::ovs::{parse_flows, parse_meters, parse_ports, reconcile, Applied, Installed, Switch};
use super::policy::{rules, tenant_tag, Meter, RuleSet, TenantRules, COOKIE_PREFIX, TENANT_MASK};
use super::NicError;

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

fn tenant(functions: &[&str], addresses: &[&str], port: u16) -> TenantNic {
    TenantNic {
        functions: functions.iter().map(|s| s.to_string()).collect(),
        addresses: addresses.iter().map(|s| s.parse().unwrap()).collect(),
        listener_port: port,
        dscp: None,
        meter_kbps: None,
    }
}

fn two() -> (TenantNic, TenantNic) {
    let mut a = tenant(&["pf0vf1", "pf0vf2"], &["192.168.100.11"], 7101);
    a.dscp = Some(26);
    let mut b = tenant(&["en3f0pf0sf2"], &["192.168.100.12"], 7102);
    b.meter_kbps = Some(8000);
    (a, b)
}

fn set(a: &TenantNic, b: &TenantNic) -> RuleSet {
    let ts = [
        TenantRules { name: "alpha", nic: a, bytes_per_sec: Some(12_500_000) },
        TenantRules { name: "beta", nic: b, bytes_per_sec: None },
    ];
    rules(&nic(), &ts).unwrap()
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
    let only_a = rules(&nic(), &[TenantRules { name: "alpha", nic: &a, bytes_per_sec: Some(12_500_000) }]).unwrap();
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
fn bad_configurations_are_refused_with_what_to_fix() {
    let (a, b) = two();
    let err = |nic: &NicConfig, ts: &[TenantRules<'_>]| match rules(nic, ts) {
        Err(NicError::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    };
    let t = |name, n| TenantRules { name, nic: n, bytes_per_sec: None };
    let shared = tenant(&["pf0vf1"], &["192.168.100.13"], 7103);
    assert!(err(&nic(), &[t("alpha", &a), t("gamma", &shared)])
        .contains("function pf0vf1 is claimed by tenants \"alpha\" and \"gamma\""));
    let same_addr = tenant(&["pf0vf9"], &["192.168.100.11"], 7103);
    assert!(err(&nic(), &[t("alpha", &a), t("gamma", &same_addr)]).contains("address 192.168.100.11 is claimed"));
    let same_port = tenant(&["pf0vf9"], &["192.168.100.13"], 7102);
    assert!(err(&nic(), &[t("beta", &b), t("gamma", &same_port)]).contains("listener port 7102 is claimed"));
    let uplink = tenant(&["p0"], &["192.168.100.13"], 7103);
    assert!(err(&nic(), &[t("gamma", &uplink)]).contains("the agent's port or an uplink"));
    let agents = tenant(&["pf0vf9"], &["192.168.100.1"], 7103);
    assert!(err(&nic(), &[t("gamma", &agents)]).contains("is the agent's"));
    let mut dscp = tenant(&["pf0vf9"], &["192.168.100.13"], 7103);
    dscp.dscp = Some(64);
    assert!(err(&nic(), &[t("gamma", &dscp)]).contains("dscp 0-63"));
    let empty = tenant(&[], &["192.168.100.13"], 7103);
    assert!(err(&nic(), &[t("gamma", &empty)]).contains("at least one function"));
    let mut bad_net = nic();
    bad_net.storage = vec!["10.20.0.1/16".into()];
    assert!(err(&bad_net, &[]).contains("host bits"));
    let mut no_uplink = nic();
    no_uplink.uplinks.clear();
    assert!(err(&no_uplink, &[]).contains("at least one uplink"));
    // Two tenant names whose tags collide are refused, naming both.
    let mut seen = BTreeMap::new();
    let (x, y) = (0..100_000)
        .map(|i| format!("t{i}"))
        .find_map(|n| seen.insert(tenant_tag(&n), n.clone()).map(|first| (first, n)))
        .expect("a collision among 100000 names");
    let (tx, ty) = (tenant(&["vx"], &["192.168.100.21"], 7201), tenant(&["vy"], &["192.168.100.22"], 7202));
    assert!(err(&nic(), &[t(&x, &tx), t(&y, &ty)]).contains("same NIC tag"));
}

/// An OpenFlow switch in memory: ports, flows by cookie (with the meter
/// they use), meters, and a log of calls.
#[derive(Default)]
struct Fake {
    ports: BTreeSet<String>,
    flows: RefCell<BTreeMap<u64, Option<u32>>>,
    meters: RefCell<BTreeMap<u32, u64>>,
    bundles: RefCell<usize>,
}

impl Switch for Fake {
    fn ports(&self) -> Result<BTreeSet<String>, NicError> {
        Ok(self.ports.clone())
    }
    fn owned_flows(&self) -> Result<Vec<Installed>, NicError> {
        Ok(self
            .flows
            .borrow()
            .iter()
            .filter(|(c, _)| *c & super::policy::OWNED_MASK == COOKIE_PREFIX)
            .map(|(&cookie, &meter)| Installed { cookie, meter })
            .collect())
    }
    fn meters(&self) -> Result<BTreeMap<u32, u64>, NicError> {
        Ok(self.meters.borrow().clone())
    }
    fn set_meter(&self, m: &Meter, exists: bool) -> Result<(), NicError> {
        assert_eq!(exists, self.meters.borrow().contains_key(&m.id));
        self.meters.borrow_mut().insert(m.id, m.kbps);
        Ok(())
    }
    fn del_meter(&self, id: u32) -> Result<(), NicError> {
        assert!(!self.flows.borrow().values().any(|m| *m == Some(id)), "meter {id} deleted while a flow uses it");
        self.meters.borrow_mut().remove(&id);
        Ok(())
    }
    fn bundle(&self, lines: &[String]) -> Result<(), NicError> {
        *self.bundles.borrow_mut() += 1;
        let mut flows = self.flows.borrow_mut();
        for l in lines {
            if let Some(f) = l.strip_prefix("add ") {
                let got = parse_flows(&format!(" {f}"));
                flows.insert(got[0].cookie, got[0].meter);
            } else if let Some(c) = l.strip_prefix("delete cookie=0x").and_then(|c| c.strip_suffix("/-1")) {
                flows.remove(&u64::from_str_radix(c, 16).unwrap());
            } else {
                panic!("unexpected bundle line {l:?}");
            }
        }
        Ok(())
    }
}

fn fake(rules: &RuleSet) -> Fake {
    let f = Fake { ports: rules.ports.clone(), ..Default::default() };
    // Somebody else's flow and meter: never touched.
    f.flows.borrow_mut().insert(0x1234, Some(7));
    f.meters.borrow_mut().insert(7, 1000);
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
    assert_eq!(*sw.bundles.borrow(), 1, "nothing to do means no bundle");

    // Removing beta removes exactly its flows and its meter.
    let only_a = rules(&nic(), &[TenantRules { name: "alpha", nic: &a, bytes_per_sec: Some(12_500_000) }]).unwrap();
    let before: BTreeSet<u64> = sw.flows.borrow().keys().copied().collect();
    let r = reconcile(&sw, &only_a).unwrap();
    let after: BTreeSet<u64> = sw.flows.borrow().keys().copied().collect();
    let beta = COOKIE_PREFIX | (u64::from(tenant_tag("beta")) << 32);
    let gone: BTreeSet<u64> = before.difference(&after).copied().collect();
    assert!(!gone.is_empty() && gone.iter().all(|c| c & TENANT_MASK == beta), "only beta's flows went: {gone:x?}");
    assert!(after.is_subset(&before), "nothing was added");
    assert_eq!(r.meters_removed, 1);
    assert!(!sw.meters.borrow().contains_key(&u32::from(tenant_tag("beta"))));
    assert!(sw.flows.borrow().contains_key(&0x1234) && sw.meters.borrow().get(&7) == Some(&1000), "foreign rules stay");

    // A new rate modifies the meter in place.
    let mut faster = a.clone();
    faster.meter_kbps = Some(50_000);
    let r =
        reconcile(&sw, &rules(&nic(), &[TenantRules { name: "alpha", nic: &faster, bytes_per_sec: None }]).unwrap())
            .unwrap();
    assert_eq!((r.meters_set, r.flows_added, r.flows_removed), (1, 0, 0));
    assert_eq!(sw.meters.borrow()[&u32::from(tenant_tag("alpha"))], 50_000);
}

#[test]
fn an_unknown_port_changes_nothing() {
    let (a, b) = two();
    let full = set(&a, &b);
    let mut sw = fake(&full);
    sw.ports.remove("pf0vf2");
    match reconcile(&sw, &full) {
        Err(NicError::UnknownPort { port, bridge, known }) => {
            assert_eq!((port.as_str(), bridge.as_str()), ("pf0vf2", "br-sluice"));
            assert!(known.contains("pf0vf1"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sw.flows.borrow().len(), 1, "only the foreign flow");
    assert_eq!(sw.meters.borrow().len(), 1);
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
            Installed { cookie: 0x51ce_1234_0000_0001, meter: Some(4660) },
            Installed { cookie: 0x51ce_0000_0000_0002, meter: None }
        ]
    );
    let meters = "OFPST_METER_CONFIG reply (OF1.3) (xid=0x2):\nmeter=4660 kbps burst bands=\ntype=drop rate=8000 burst_size=800\n\
                  meter=9 kbps bands=\ntype=drop rate=100\n";
    assert_eq!(parse_meters(meters), BTreeMap::from([(4660, 8000), (9, 100)]));
}
