//! Capability exchange: the agent tells the shim what each namespace
//! offers and what region memory it reaches, the shim says what it can
//! register, clients see both (`sluice stat --caps`, `Client::capabilities`),
//! and a request the capabilities cannot serve is refused with UNSUPPORTED
//! before any byte moves.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::process::Command;

use sluice_client::{Code, MemoryKind};
use sluice_tests::{bin, boto3, Options, Stack};

/// `sluice --json stat --caps [namespace]` against the stack's shim.
fn stat_caps(stack: &Stack, namespace: Option<&str>) -> serde_json::Value {
    let out = Command::new(bin("sluice"))
        .args(["--socket", stack.socket.to_str().unwrap(), "--json", "stat", "--caps"])
        .args(namespace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn clients_see_what_each_namespace_offers() {
    let stack = Stack::with(Options {
        data_ns: "data_path = \"rdma\"\naccess = [\"read\", \"list\"]".into(),
        ..Default::default()
    });
    let caps = stat_caps(&stack, None);
    assert_eq!(caps["agent_memory"], serde_json::json!(["memfd"]), "{caps}");
    // The shim hands GPU dma-bufs to a co-located agent too; this one (no
    // verbs transport) does not take them, so no region of that kind.
    assert_eq!(caps["shim_memory"], serde_json::json!(["memfd", "gpu-dmabuf"]), "{caps}");
    assert_eq!(caps["gpu_staging"], "", "a co-located agent stages nothing into GPU memory");
    let ns = |name: &str| caps["namespaces"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap().clone();
    let data = ns("data");
    assert_eq!((data["data_path"].as_str(), data["transport"].as_str()), (Some("rdma"), Some("tcp")), "{data}");
    assert_eq!(data["access"], serde_json::json!(["read", "list"]));
    assert_eq!(data["max_window_bytes"], (4u64 << 30) - (64 << 10), "the tcp transport's own limit");
    // The harness's 5 MiB parts: at most 10,000 of them.
    assert_eq!(data["max_object_bytes"], 10_000u64 * (5 << 20));
    let plain = ns("plain");
    assert_eq!((plain["data_path"].as_str(), plain["transport"].as_str()), (Some("http"), Some("http-only")));
    assert_eq!((plain["max_window_bytes"].as_u64(), plain["encryption"].as_str()), (Some(0), Some("none")));
    // One namespace, as text.
    let out = Command::new(bin("sluice"))
        .args(["--socket", stack.socket.to_str().unwrap(), "stat", "--caps", "plain"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("namespace plain:") && !text.contains("namespace data:"), "{text}");
    assert!(text.contains("region memory:   memfd"), "{text}");

    // The Rust client has the same view.
    let c = stack.client().await;
    let caps = c.capabilities();
    assert_eq!(caps.agent_memory().collect::<Vec<_>>(), vec![MemoryKind::Memfd]);
    assert_eq!(caps.namespaces.len(), c.namespaces().len());
}

#[tokio::test]
async fn a_put_larger_than_a_namespace_can_store_is_refused_before_any_byte_moves() {
    // 10,000 parts of 5 MiB: one byte more cannot be uploaded. The region
    // is sparse: nothing of it is ever touched.
    let limit = 10_000u64 * (5 << 20);
    let stack = Stack::with(Options { shim_limits: "max_region_bytes = 64000000000".into(), ..Default::default() });
    let c = stack.client().await;
    let r = c.register(limit + 1).await.unwrap();
    let e = c.put("data/too-big", &r, 0, limit + 1).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unsupported), "{e}");
    assert!(e.to_string().contains(&format!("exceeds the {limit} bytes")), "{e}");
    // Nothing reached the store: no object, no multipart upload begun.
    let gw = stack.gateway_addr.unwrap();
    assert_eq!(boto3(gw, &["exists", "data", "too-big"]), "no");
    assert_eq!(boto3(gw, &["uploads", "data", ""]), "0");
}

#[tokio::test]
async fn regions_the_agent_cannot_reach_are_refused_before_they_are_exported() {
    // A shim that exports regions with DOCA, in front of a co-located
    // agent (which only maps memfds).
    std::env::set_var("DOCA_LIB_DIR", sluice_doca::model::lib_dir());
    let stack = Stack::with(Options {
        shim_extra: "memory_backend = \"doca\"\n[doca]\ndevice = \"03:00.0\"".into(),
        ..Default::default()
    });
    let c = stack.client().await;
    assert!(c.capabilities().agent_memory().all(|k| k == MemoryKind::Memfd));
    let e = c.register(4096).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unsupported), "{e}");
    assert!(e.to_string().contains("cannot reach host memory exported with DOCA"), "{e}");
    // The agent said so once, when the session opened.
    assert!(stack.log("sluice-agent").contains("registers no memory this agent can reach"));
    // Object calls without regions still work.
    assert_eq!(c.head("data/none").await.unwrap_err().code(), Some(Code::NoSuchKey));
}
