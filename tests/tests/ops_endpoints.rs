//! Every daemon's operations endpoint: `/metrics` and `/ready` (200 when it
//! can serve, 503 with the reason when it cannot). The agent is ready when
//! each namespace's store answers a signed listing; the shim when the
//! agent answers it.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_tests::{Options, Stack};

/// `GET path` on `addr`: (status, body). A daemon binds its operations
/// listener as it starts, so an exchange that fails (refused, or cut while
/// the daemon comes up) is tried again for a while: the stack is up when
/// its sockets are, not necessarily this listener.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let t0 = Instant::now();
    let out = loop {
        let exchange = || -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(addr)?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        };
        match exchange() {
            Ok(out) if !out.is_empty() => break out,
            other if t0.elapsed() < Duration::from_secs(20) => {
                eprintln!("{addr}{path}: {other:?}; trying again");
                std::thread::sleep(Duration::from_millis(50));
            }
            other => panic!("{addr}{path}: {other:?}"),
        }
    };
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Polls `addr`'s `/ready` until it answers `status` (at most 20 s).
fn ready_becomes(addr: SocketAddr, status: u16) -> String {
    let t0 = Instant::now();
    loop {
        let (s, body) = get(addr, "/ready");
        if s == status {
            return body;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "/ready stayed {s}: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test]
async fn ready_when_the_stores_and_the_agent_answer_with_metrics_for_each_daemon() {
    let (shim_ops, gateway_ops) = (free_port(), free_port());
    let mut stack = Stack::with(Options {
        shim_extra: format!("metrics_listen = \"{shim_ops}\"\n"),
        gateway_extra: format!("metrics_listen = \"{gateway_ops}\"\n"),
        ..Default::default()
    });
    let body = ready_becomes(stack.metrics_addr, 200);
    assert!(body.contains("alpha/data: store ok") && body.contains("beta/other: store ok"), "{body}");
    // What the agent opened: its host memory and each namespace's transport.
    assert!(body.contains("host memory: co-located memfds") && body.contains("alpha/data: transport none"), "{body}");
    let body = ready_becomes(gateway_ops, 200);
    assert!(body.contains("store: 2 bucket directories present"), "{body}");
    let body = ready_becomes(shim_ops, 200);
    assert!(body.contains("agent: answers"), "{body}");

    let c = stack.client().await;
    let r = c.register(100).await.unwrap();
    c.put("data/ops", &r, 0, 100).await.unwrap();
    c.get("data/ops", &r, 0, None).await.unwrap();
    assert_eq!(c.head("data/none").await.unwrap_err().code(), Some(sluice_client::Code::NoSuchKey));
    let (status, m) = get(shim_ops, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "sluice_shim_requests_total{op=\"put\",outcome=\"ok\"} 1",
        "sluice_shim_requests_total{op=\"get\",outcome=\"ok\"} 1",
        "sluice_shim_requests_total{op=\"head\",outcome=\"NO_SUCH_KEY\"} 1",
        "sluice_shim_connections 1",
    ] {
        assert!(m.contains(line), "{line} missing:\n{m}");
    }
    assert!(m.contains("sluice_shim_open_fds ") && m.contains("sluice_shim_request_duration_seconds_bucket"), "{m}");
    // The gateway counted the agent's S3 requests and the object bytes.
    let (status, m) = get(gateway_ops, "/metrics");
    assert_eq!(status, 200);
    for line in [
        "sluice_gateway_requests_total{op=\"put\",status=\"200\"} 1",
        // The agent's GET asks for a range: 206.
        "sluice_gateway_requests_total{op=\"get\",status=\"206\"} 1",
        "sluice_gateway_requests_total{op=\"head\",status=\"404\"} 1",
        "sluice_gateway_bytes_total{data_path=\"http\",direction=\"in\"} 100",
        "sluice_gateway_bytes_total{data_path=\"http\",direction=\"out\"} 100",
    ] {
        assert!(m.contains(line), "{line} missing:\n{m}");
    }
    assert!(m.contains("sluice_gateway_connections ") && m.contains("sluice_gateway_open_fds "), "{m}");
    // A bucket directory gone: the gateway is not ready, and says which.
    std::fs::remove_dir_all(stack.data_dir.join("other")).unwrap();
    let body = ready_becomes(gateway_ops, 503);
    assert!(body.contains("bucket directories missing") && body.contains("other"), "{body}");

    // The agent goes away: the shim is not ready, and says why.
    stack.kill("sluice-agent");
    let body = ready_becomes(shim_ops, 503);
    assert!(body.contains("agent:"), "{body}");
}

#[tokio::test]
async fn an_agent_whose_store_does_not_answer_is_not_ready() {
    let dead = free_port();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://{dead}")],
        gateway: false,
        s3: "max_attempts = 1\nconnect_timeout_ms = 500\n".into(),
        ..Default::default()
    });
    let body = ready_becomes(stack.metrics_addr, 503);
    assert!(body.contains("alpha/data: cannot reach the store"), "{body}");
    let (status, _) = get(stack.metrics_addr, "/metrics");
    assert_eq!(status, 200, "metrics are served all the same");
}
