//! `notify_ready` and `notify_status` against a socket standing in for
//! systemd's (what a `Type=notify` unit gets). In its own test binary: it
//! sets `NOTIFY_SOCKET` for the whole process.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_telemetry::{notify_ready, notify_status, Readiness};

#[test]
fn notify_reaches_the_service_manager_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    std::env::set_var("NOTIFY_SOCKET", &path);
    notify_ready();
    notify_status(&Readiness::not_ready("agent: no answer"));
    std::env::remove_var("NOTIFY_SOCKET");
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "READY=1");
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STATUS=not ready: agent: no answer");
    // Outside systemd nothing is sent and nothing fails.
    notify_ready();
}
