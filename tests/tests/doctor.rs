//! `sluice doctor` against a working node and against broken ones: it
//! names the step that fails and what to fix, and exits non-zero.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::Path;
use std::process::Command;

use sluice_tests::{bin, Options, Stack};

/// `sluice --socket S doctor ARGS --json`: (succeeded, the JSON answer).
fn doctor(socket: &Path, args: &[&str]) -> (bool, serde_json::Value) {
    let out = Command::new(bin("sluice"))
        .args(["--json", "--socket", socket.to_str().unwrap(), "doctor"])
        .args(args)
        .output()
        .unwrap();
    let json =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (out.status.success(), json)
}

/// The checks that failed: (check, fix).
fn failures(v: &serde_json::Value) -> Vec<(String, String)> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| (c["check"].as_str().unwrap().to_owned(), c["fix"].as_str().unwrap().to_owned()))
        .collect()
}

#[tokio::test]
async fn a_working_node_passes_every_check() {
    let stack = Stack::start();
    let (ok, v) = doctor(&stack.socket, &["--write"]);
    assert!(ok, "{v:#}");
    assert_eq!(v["failed"], 0);
    let checks = v["checks"].as_array().unwrap();
    let data_path = checks.iter().find(|c| c["check"] == "namespace data: data path").unwrap();
    assert!(data_path["detail"].as_str().unwrap().contains("GET 1048576 bytes via http"), "{data_path}");
    // The probe is gone.
    let c = stack.client().await;
    assert!(c.list_all("data/.sluice-doctor/").await.unwrap().is_empty());
}

#[tokio::test]
async fn no_shim_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, v) = doctor(&dir.path().join("nothing.sock"), &[]);
    assert!(!ok);
    let f = failures(&v);
    assert_eq!(f.len(), 1, "{v:#}");
    assert_eq!(f[0].0, "shim socket");
    assert!(f[0].1.contains("start sluice-shim"), "{}", f[0].1);
}

#[tokio::test]
async fn a_wrong_store_secret_is_named_with_its_fix() {
    let stack = Stack::with(Options {
        agent_credentials: (sluice_tests::ACCESS_KEY.into(), "not-the-secret".into()),
        ..Default::default()
    });
    let (ok, v) = doctor(&stack.socket, &[]);
    assert!(!ok);
    let f = failures(&v);
    let data = f.iter().find(|(c, _)| c == "namespace data: store reachable, signature accepted").unwrap();
    assert!(data.1.contains("[credentials]"), "{}", data.1);
}

#[tokio::test]
async fn an_unreachable_agent_is_named_with_its_fix() {
    let mut stack = Stack::start();
    stack.kill("sluice-agent");
    let (ok, v) = doctor(&stack.socket, &[]);
    assert!(!ok);
    let f = failures(&v);
    assert!(!f.is_empty(), "{v:#}");
    assert!(f.iter().all(|(_, fix)| fix.contains("cannot reach the agent")), "{f:?}");
}
