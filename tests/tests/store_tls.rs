//! HTTPS between the agent and its store: sluice-gateway serving `[tls]`
//! with a certificate from `sluice certs --gateway-name`, the agent's
//! namespace on an https:// endpoint with `ca_file` naming the CA. Objects
//! round-trip byte for byte over HTTP bodies and over the RDMA token path;
//! a namespace of the same agent without the CA fails at once with an error
//! naming the certificate; a bad `ca_file` stops the agent at start; a
//! shared agent warns about plaintext stores on other machines.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_client::{Client, Code};
use sluice_tests::{bin, pattern, sha256, Options, Stack};

/// A stack whose gateway serves HTTPS only; namespace "data" trusts its CA,
/// namespace "plain" (same endpoint) does not.
fn https_stack(data_ns: &str, alpha: &str) -> Stack {
    Stack::with(Options {
        gateway_tls: true,
        endpoints: vec!["https://{gw}".into()],
        data_ns: format!("ca_file = \"tls/ca.crt\"\n{data_ns}"),
        alpha: alpha.into(),
        ..Default::default()
    })
}

async fn put(c: &Client, path: &str, data: &[u8]) -> sluice_client::Transfer {
    let r = c.register(data.len() as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    let t = c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
    t
}

async fn get(c: &Client, path: &str, size: usize) -> (Vec<u8>, sluice_client::Transfer) {
    let r = c.register(size as u64).await.unwrap();
    let t = c.get(path, &r, 0, None).await.unwrap();
    assert_eq!(t.bytes, size as u64);
    let out = r.as_slice()[..size].to_vec();
    c.release(r).await.unwrap();
    (out, t)
}

#[tokio::test]
async fn objects_round_trip_over_https_with_a_private_ca() {
    // A namespace on another machine in clear, in an agent with two tenants.
    let far = "[[tenants.namespaces]]\nname = \"far\"\nendpoints = [\"http://192.0.2.1:9000\"]\nbucket = \"data\"\n\
               credentials = \"main\"\n";
    let stack = https_stack("", far);
    let gw_log = stack.log("sluice-gateway");
    let listening = gw_log.lines().find(|l| l.contains("gateway listening")).unwrap_or_default();
    assert!(listening.contains("https://127.0.0.1:"), "the gateway says it serves HTTPS: {listening}");

    let c = stack.client().await;
    // One single PUT and GET; one multipart PUT (6 MiB threshold) read back
    // in 1 MiB ranged GETs.
    for (key, len) in [("small", 100_003), ("large", (7 << 20) + 3)] {
        let data = pattern(len, len as u64);
        let t = put(&c, &format!("data/tls/{key}"), &data).await;
        assert_eq!(t.data_path, "http", "{key}");
        let (back, t) = get(&c, &format!("data/tls/{key}"), len).await;
        assert_eq!(t.data_path, "http", "{key}");
        assert_eq!(sha256(&back), sha256(&data), "{key}: GET over HTTPS");
        let stored = std::fs::read(stack.stored_file("data", &format!("tls/{key}"))).unwrap();
        assert_eq!(sha256(&stored), sha256(&data), "{key}: stored bytes");
    }

    // Only the plaintext endpoint off this host is warned about: not the
    // https:// ones, not http:// on loopback ("scoped" and "other" are
    // https:// here, so loopback is checked by the unit test).
    let log = stack.log("sluice-agent");
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("cross the network in clear")).collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("far") && warned[0].contains("http://192.0.2.1:9000"), "{}", warned[0]);
}

#[tokio::test]
async fn the_rdma_token_path_runs_under_https() {
    let stack = https_stack("data_path = \"rdma\"\n", "");
    let c = stack.client().await;
    let data = pattern((2 << 20) + 12_345, 21);
    let t = put(&c, "data/tls/rdma", &data).await;
    assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""));
    let (back, t) = get(&c, "data/tls/rdma", data.len()).await;
    assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""));
    assert_eq!(sha256(&back), sha256(&data));
}

#[tokio::test]
async fn without_the_ca_requests_fail_at_once_naming_the_certificate() {
    let stack = https_stack("", "");
    let c = stack.client().await;
    // The namespace that trusts the CA reaches the store...
    let e = c.head("data/none").await.unwrap_err();
    assert_eq!(e.code(), Some(Code::NoSuchKey), "{e}");
    // ...the one on the same endpoint without it does not, for reads and
    // writes alike, and is not retried until a deadline.
    let r = c.register(1 << 20).await.unwrap();
    r.write_at(0, &pattern(1 << 20, 3)).unwrap();
    let t0 = Instant::now();
    let errors =
        [c.get("plain/none", &r, 0, None).await.unwrap_err(), c.put("plain/x", &r, 0, 1 << 20).await.unwrap_err()];
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    for e in errors {
        eprintln!("{e}");
        assert_eq!(e.code(), Some(Code::StoreUnavailable), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("certificate") && msg.contains("ca_file"), "{msg}");
        assert!(!msg.contains("attempts"), "a refused certificate is not retried: {msg}");
    }
    assert!(!stack.stored_file("data", "x").exists());
}

/// Starts an agent whose only namespace has `ca_file` = `ca` in `dir`, and
/// returns its output once it exits (it must, within 30 s).
fn agent_with_ca_file(dir: &Path, ca: &str) -> (bool, String) {
    let d = dir.display();
    let cfg = dir.join("agent.toml");
    std::fs::write(dir.join("alpha.shim-secret"), "alpha-shim-secret-0123456789\n").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "grpc_socket = \"{d}/agent.sock\"\nmemory_socket = \"{d}/mem.sock\"\nstate_dir = \"{d}/state\"\n[credentials.main]\n\
             access_key = \"a\"\nsecret_key = \"b\"\n[[tenants]]\nname = \"alpha\"\n\
             shim_secret_file = \"alpha.shim-secret\"\n[[tenants.namespaces]]\nname = \"data\"\n\
             endpoints = [\"https://127.0.0.1:9\"]\nbucket = \"data\"\ncredentials = \"main\"\nca_file = \"{ca}\"\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(bin("sluice-agent"))
        .args(["--config", cfg.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the agent kept running with ca_file {ca:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_bad_ca_file_stops_the_agent_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, log) = agent_with_ca_file(dir.path(), "missing-ca.pem");
    assert!(!ok, "{log}");
    assert!(log.contains("namespace \"data\"") && log.contains("missing-ca.pem"), "{log}");

    std::fs::write(dir.path().join("garbage.pem"), "not a certificate\n").unwrap();
    let (ok, log) = agent_with_ca_file(dir.path(), "garbage.pem");
    assert!(!ok, "{log}");
    assert!(log.contains("garbage.pem") && log.contains("no certificate in it"), "{log}");
}
