//! The agent's per-core runtimes (`[runtime] per_core = true`): the shim's
//! connections are dealt to threads that each run a runtime of their own,
//! and everything still works — single GETs, batches and PUTs from
//! several clients at once return the right bytes, every core gets its
//! share of the connections, an agent restart is ridden through, and the
//! agent stops cleanly.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{BatchGet, Client};
use sluice_tests::{pattern, sha256, Options, Stack};

const CORES: usize = 3;

/// The stack, and its shim's operations endpoint.
fn per_core_stack() -> (Stack, std::net::SocketAddr) {
    let ops = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let stack = Stack::with(Options {
        // The tables after [failover] are the caller's (see `Options`).
        agent_failover: format!("[runtime]\nper_core = true\nthreads = {CORES}\n"),
        shim_extra: format!("metrics_listen = \"{ops}\"\n"),
        ..Default::default()
    });
    (stack, ops)
}

/// The agent's per-core threads: (name, nanoseconds they ran).
fn core_threads(stack: &Stack) -> Vec<(String, u64)> {
    let pid = stack.pid("sluice-agent").unwrap();
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_owned();
        if name.starts_with("sluice-core-") {
            let ran = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
            out.push((name, ran.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)));
        }
    }
    out.sort();
    out
}

async fn put_object(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

/// GETs every object in `objs` `rounds` times, 8 at a time, and checks
/// the bytes.
async fn read_all(c: Arc<Client>, objs: Arc<Vec<(String, Vec<u8>)>>, rounds: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8 {
        let (c, objs) = (c.clone(), objs.clone());
        tasks.spawn(async move {
            let r = c.register(2 << 20).await.unwrap();
            for i in (lane..objs.len() * rounds).step_by(8) {
                let (path, data) = &objs[i % objs.len()];
                let got = c.get(path, &r, 0, None).await.unwrap();
                assert_eq!(got.bytes, data.len() as u64, "{path}");
                assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(data), "{path}");
            }
            c.release(r).await.unwrap();
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
}

#[tokio::test]
async fn gets_batches_and_puts_are_served_on_every_core() {
    let (mut stack, ops) = per_core_stack();
    assert!(stack.log("sluice-agent").contains("per-core runtimes"), "the agent says it runs them");
    assert_eq!(core_threads(&stack).len(), CORES, "{:?}", core_threads(&stack));

    let c = Arc::new(stack.client().await);
    let objs: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("data/pc/o{i}"), pattern([100, 4096, 70_000, (1 << 20) + 3][i % 4], i as u64)))
        .collect();
    for (path, data) in &objs {
        put_object(&c, path, data).await;
    }
    let objs = Arc::new(objs);
    let before = core_threads(&stack);
    // Two clients (two shim connections' worth of calls) at once.
    let other = Arc::new(stack.client().await);
    tokio::join!(read_all(c.clone(), objs.clone(), 2), read_all(other.clone(), objs.clone(), 2));

    // The shim's single GETs went framed to the cores.
    let framed = sluice_tests::counter_at(ops, "sluice_shim_agent_gets_framed_total");
    let streamed = sluice_tests::counter_at(ops, "sluice_shim_agent_gets_streamed_total");
    assert!(framed >= 24.0 * 4.0 && framed == streamed, "framed {framed} of {streamed} streamed GETs");
    assert!(stack.metric("sluice_agent_framed_get_connections", &[]) >= 1.0);

    // A batch, answered item by item from one core's runtime.
    let slot = 2 << 20;
    let r = c.register(objs.len() as u64 * slot).await.unwrap();
    let items: Vec<BatchGet> = (0..objs.len())
        .map(|i| BatchGet {
            path: objs[i].0.clone(),
            region_id: r.id().to_owned(),
            offset: i as u64 * slot,
            range: None,
            max_bytes: slot,
            if_match: String::new(),
        })
        .collect();
    let res = c.get_many(&items).await.unwrap();
    for (i, (path, data)) in objs.iter().enumerate() {
        assert_eq!(res[i].as_ref().unwrap().bytes, data.len() as u64, "{path}");
        let at = i * slot as usize;
        assert_eq!(sha256(&r.as_slice()[at..at + data.len()]), sha256(data), "{path}");
    }
    c.release(r).await.unwrap();

    // The shim's connections were dealt to every core, and each served
    // calls (an idle runtime sleeps: its thread does not run).
    let after = core_threads(&stack);
    let ran: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).collect();
    assert!(ran.iter().all(|ns| *ns > 0), "every core thread served: {before:?} -> {after:?}");

    // An agent restart: the shim reconnects, and the new agent's cores serve.
    stack.restart("sluice-agent");
    let after = stack.client().await;
    let (path, data) = &objs[3];
    let r = after.register(data.len() as u64).await.unwrap();
    after.get(path, &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(data));

    // SIGTERM stops the agent, its cores' servers included, promptly.
    stack.signal("sluice-agent", "TERM");
    let t0 = Instant::now();
    while stack.alive("sluice-agent") {
        assert!(t0.elapsed() < Duration::from_secs(10), "the agent did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stack.log("sluice-agent").contains("agent shutting down"));
}
