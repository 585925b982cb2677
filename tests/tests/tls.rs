//! The shim↔agent control channel over TCP with mutual TLS (`[tls]` on the
//! agent, `[agent.tls]` on the shim, certificates from `sluice certs`): it
//! works, and every way of getting it wrong is refused with a clear error
//! rather than served — another CA on either side, an expired certificate,
//! another tenant's certificate, a plaintext shim, an https:// address
//! without certificates.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::Path;

use sluice_client::{Client, Code};
use sluice_tests::{bin, pattern, sha256, Options, Stack};

fn tls_stack() -> Stack {
    Stack::with(Options { tls: true, grpc_over_tcp: true, ..Default::default() })
}

/// A TLS stack whose shim serves its metrics at the address returned.
fn tls_stack_with_ops(agent_failover: &str) -> (Stack, std::net::SocketAddr) {
    let ops = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let stack = Stack::with(Options {
        tls: true,
        grpc_over_tcp: true,
        agent_failover: agent_failover.into(),
        shim_extra: format!("metrics_listen = \"{ops}\"\n"),
        ..Default::default()
    });
    (stack, ops)
}

/// The shim's single GETs went framed over TLS (no HTTP/2), all of them.
fn gets_went_framed(stack: &Stack, ops: std::net::SocketAddr, at_least: f64) {
    let framed = sluice_tests::counter_at(ops, "sluice_shim_agent_gets_framed_total");
    let streamed = sluice_tests::counter_at(ops, "sluice_shim_agent_gets_streamed_total");
    assert!(framed >= at_least && framed == streamed, "framed {framed} of {streamed} streamed GETs");
    assert!(stack.metric("sluice_agent_framed_get_connections", &[]) >= 1.0);
}

/// An `[agent]` table for https:// to the stack's agent with these files.
fn https(stack: &Stack, ca: &str, cert: &str, key: &str) -> String {
    format!("grpc = \"https://{}\"\ntls = {{ ca = \"{ca}\", cert = \"{cert}\", key = \"{key}\" }}", stack.grpc_addr)
}

/// A second CA in `<stack dir>/other`, with a client certificate for alpha.
fn other_ca(stack: &Stack) {
    let out = std::process::Command::new(bin("sluice"))
        .args(["certs", "--dir", stack.dir.path().join("other").to_str().unwrap(), "--shim", "alpha"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// What a client of the shim at `socket` gets for its first request that
/// needs the agent (with a working channel: NO_SUCH_KEY).
async fn first_request(socket: &Path) -> sluice_client::ClientError {
    let e = match Client::connect(socket).await {
        Err(e) => e,
        Ok(c) => c.head("data/none").await.unwrap_err(),
    };
    eprintln!("{}: {e}", socket.display());
    e
}

#[tokio::test]
async fn shims_and_agent_speak_mutual_tls() {
    let (stack, ops) = tls_stack_with_ops("");
    let c = stack.client().await;
    assert_eq!(c.tenant(), "alpha");
    let data = pattern((3 << 20) + 1, 5);
    let r = c.register(data.len() as u64).await.unwrap();
    r.write_at(0, &data).unwrap();
    c.put("data/tls.bin", &r, 0, data.len() as u64).await.unwrap();
    r.write_at(0, &vec![0; data.len()]).unwrap();
    c.get("data/tls.bin", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));
    assert!(stack.log("sluice-shim").contains("https://127.0.0.1:"), "the shim dialled https");
    gets_went_framed(&stack, ops, 1.0);
    for f in ["ca.key", "agent.key", "shim-alpha.key"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(stack.dir.path().join("tls").join(f)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
}

#[tokio::test]
async fn a_shim_that_does_not_trust_the_agents_ca_is_refused() {
    let mut stack = tls_stack();
    other_ca(&stack);
    let agent = https(&stack, "other/ca.crt", "tls/shim-alpha.crt", "tls/shim-alpha.key");
    let socket = stack.start_extra_shim("shim-wrong-ca", &agent).unwrap();
    let e = first_request(&socket).await;
    assert_eq!(e.code(), Some(Code::AgentUnavailable), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}

#[tokio::test]
async fn a_client_certificate_of_another_ca_is_refused() {
    let mut stack = tls_stack();
    other_ca(&stack);
    let agent = https(&stack, "tls/ca.crt", "other/shim-alpha.crt", "other/shim-alpha.key");
    let socket = stack.start_extra_shim("shim-foreign-cert", &agent).unwrap();
    let e = first_request(&socket).await;
    assert_eq!(e.code(), Some(Code::AgentUnavailable), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    assert!(stack.log("sluice-agent").contains("TLS handshake refused"), "the agent logs the refused handshake");
    // The original shim, with the stack's certificate, still works.
    assert_eq!(stack.client().await.tenant(), "alpha");
}

#[tokio::test]
async fn an_expired_client_certificate_is_refused() {
    let mut stack = tls_stack();
    let tls = stack.dir.path().join("tls");
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(tls.join("ca.key")).unwrap()).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(tls.join("ca.crt")).unwrap(), ca_key).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["alpha".to_owned()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "alpha");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let day = std::time::Duration::from_secs(86_400);
    params.not_before = (std::time::SystemTime::now() - 30 * day).into();
    params.not_after = (std::time::SystemTime::now() - day).into();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(tls.join("expired.crt"), cert.pem()).unwrap();
    std::fs::write(tls.join("expired.key"), key.serialize_pem()).unwrap();
    let agent = https(&stack, "tls/ca.crt", "tls/expired.crt", "tls/expired.key");
    let socket = stack.start_extra_shim("shim-expired", &agent).unwrap();
    let e = first_request(&socket).await;
    assert_eq!(e.code(), Some(Code::AgentUnavailable), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[tokio::test]
async fn another_tenants_certificate_cannot_open_its_sessions() {
    let mut stack = tls_stack();
    // A valid certificate of the right CA, but it names beta.
    let agent = https(&stack, "tls/ca.crt", "tls/shim-beta.crt", "tls/shim-beta.key");
    let socket = stack.start_extra_shim("shim-beta-cert", &agent).unwrap();
    let e = first_request(&socket).await;
    assert!(e.to_string().contains("certificate names [\"beta\"]"), "{e}");
    assert!(stack.metric("sluice_agent_auth_failures_total", &["reason=\"certificate\""]) >= 1.0);
}

#[tokio::test]
async fn a_plaintext_shim_is_refused_by_a_tls_agent() {
    let mut stack = tls_stack();
    let agent = sluice_tests::agent_link(&format!("http://{}", stack.grpc_addr), "alpha");
    let socket = stack.start_extra_shim("shim-plaintext", &agent).unwrap();
    let e = first_request(&socket).await;
    assert_eq!(e.code(), Some(Code::AgentUnavailable), "{e}");
    assert!(e.to_string().contains("https://"), "{e}");
}

#[tokio::test]
async fn tcp_without_tls_or_insecure_does_not_start() {
    let mut stack = tls_stack();
    let plain = format!("grpc = \"http://{}\"", stack.grpc_addr);
    let log = stack.start_extra_shim("shim-no-insecure", &plain).unwrap_err();
    assert!(log.contains("insecure = true"), "{log}");
    let no_certs = format!("grpc = \"https://{}\"", stack.grpc_addr);
    let log = stack.start_extra_shim("shim-no-certs", &no_certs).unwrap_err();
    assert!(log.contains("[agent.tls] is not set"), "{log}");
}

#[tokio::test]
async fn per_core_runtimes_serve_mutual_tls_and_refuse_a_foreign_ca() {
    // Handshakes run on the core a connection was dealt to, and framed
    // GETs are served there.
    let (mut stack, ops) = tls_stack_with_ops("[runtime]\nper_core = true\nthreads = 2\n");
    assert!(stack.log("sluice-agent").contains("per-core runtimes"));
    let c = stack.client().await;
    let data = pattern((1 << 20) + 7, 9);
    let r = c.register(data.len() as u64).await.unwrap();
    r.write_at(0, &data).unwrap();
    c.put("data/tls-cores.bin", &r, 0, data.len() as u64).await.unwrap();
    for _ in 0..4 {
        r.write_at(0, &vec![0; data.len()]).unwrap();
        c.get("data/tls-cores.bin", &r, 0, None).await.unwrap();
        assert_eq!(sha256(r.as_slice()), sha256(&data));
    }
    gets_went_framed(&stack, ops, 4.0);
    other_ca(&stack);
    let agent = https(&stack, "tls/ca.crt", "other/shim-alpha.crt", "other/shim-alpha.key");
    let socket = stack.start_extra_shim("shim-foreign-cert", &agent).unwrap();
    let e = first_request(&socket).await;
    assert_eq!(e.code(), Some(Code::AgentUnavailable), "{e}");
    assert!(stack.log("sluice-agent").contains("TLS handshake refused"), "the agent logs the refused handshake");
    assert!(stack.metric("sluice_agent_auth_failures_total", &["reason=\"tls\""]) >= 1.0);
    // The good shim still works.
    c.get("data/tls-cores.bin", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));
}
