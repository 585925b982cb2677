//! Single GETs that arrive together go to the agent in one call
//! (`[agent] coalesce_gets`, for an agent without `GetStream`), or as
//! messages of one long-lived call per connection (`[agent] get_stream`,
//! on by default; framed without HTTP/2 to a co-located agent), and each still gets exactly its own answer: its bytes,
//! its own error, its own request id — from several clients of one tenant
//! at once, and across an agent restart.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_client::{Client, Code};
use sluice_tests::{pattern, sha256, Options, Stack};

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// The shim's counter of GETs sent in shared calls.
fn coalesced(shim_ops: SocketAddr) -> f64 {
    counter(shim_ops, "sluice_shim_agent_gets_coalesced_total")
}

/// The shim's counter of GETs sent on long-lived calls.
fn streamed(shim_ops: SocketAddr) -> f64 {
    counter(shim_ops, "sluice_shim_agent_gets_streamed_total")
}

fn counter(shim_ops: SocketAddr, name: &str) -> f64 {
    sluice_tests::counter_at(shim_ops, name)
}

/// A stack whose shim coalesces (or not), with GetStream off: coalescing
/// is for agents without it.
fn stack(coalesce: bool) -> (Stack, SocketAddr) {
    let agent = if coalesce { "get_stream = false\n" } else { "get_stream = false\ncoalesce_gets = false\n" };
    stack_with(agent)
}

fn stack_with(shim_agent_extra: &str) -> (Stack, SocketAddr) {
    let ops = free_port();
    let stack = Stack::with(Options {
        shim_extra: format!("metrics_listen = \"{ops}\"\n"),
        shim_agent_extra: shim_agent_extra.into(),
        ..Default::default()
    });
    (stack, ops)
}

/// What one GET of the storm is meant to get.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Want {
    Bytes(usize, u64),
    Missing,
    TooSmall,
}

/// 96 GETs at once from two clients: most read objects of mixed sizes,
/// some name missing keys, some give regions too small. Each is checked
/// against what it alone should get.
async fn storm(stack: &Stack) {
    let clients = [Arc::new(stack.client().await), Arc::new(stack.client().await)];
    let sizes = [1usize, 4096, 70_000, (1 << 20) + 5];
    for (i, &n) in sizes.iter().enumerate() {
        let r = clients[0].register(n as u64).await.unwrap();
        r.write_at(0, &pattern(n, i as u64)).unwrap();
        clients[0].put(&format!("data/co/o{i}"), &r, 0, n as u64).await.unwrap();
        clients[0].release(r).await.unwrap();
    }
    let mut tasks = tokio::task::JoinSet::new();
    for g in 0..96usize {
        let c = clients[g % 2].clone();
        let want = match g % 12 {
            5 => Want::Missing,
            11 => Want::TooSmall,
            k => Want::Bytes(sizes[k % 4], (k % 4) as u64),
        };
        tasks.spawn(async move {
            let (path, room) = match want {
                Want::Bytes(n, seed) => (format!("data/co/o{seed}"), n as u64),
                Want::Missing => ("data/co/none".to_owned(), 64),
                Want::TooSmall => ("data/co/o3".to_owned(), 100),
            };
            let r = c.register(room).await.unwrap();
            let got = c.get(&path, &r, 0, None).await;
            match (want, got) {
                (Want::Bytes(n, seed), Ok(t)) => {
                    assert_eq!(t.bytes, n as u64, "GET {g}");
                    assert_eq!(sha256(&r.as_slice()[..n]), sha256(&pattern(n, seed)), "GET {g}: its own bytes");
                    // Its own request id (the shim's, 16 hex digits), not a
                    // batch's `<id>.<index>`.
                    assert!(
                        t.request_id.len() == 16 && t.request_id.bytes().all(|b| b.is_ascii_hexdigit()),
                        "GET {g}: request id {:?}",
                        t.request_id
                    );
                    (g, t.request_id)
                }
                (Want::Missing, Err(e)) => {
                    assert_eq!(e.code(), Some(Code::NoSuchKey), "GET {g}: {e}");
                    (g, String::new())
                }
                (Want::TooSmall, Err(e)) => {
                    assert_eq!(e.code(), Some(Code::RegionTooSmall), "GET {g}: {e}");
                    assert!(r.as_slice().iter().all(|&b| b == 0), "GET {g}: nothing written");
                    (g, String::new())
                }
                (want, got) => panic!("GET {g}: wanted {want:?}, got {got:?}"),
            }
        });
    }
    let mut ids = std::collections::HashSet::new();
    while let Some(t) = tasks.join_next().await {
        let (g, id) = t.unwrap();
        assert!(id.is_empty() || ids.insert(id.clone()), "GET {g}: request id {id} answered twice");
    }
}

#[tokio::test]
async fn single_gets_that_arrive_together_share_a_call_and_keep_their_own_answers() {
    let (mut stack, ops) = stack(true);
    storm(&stack).await;
    let first = coalesced(ops);
    assert!(first > 0.0, "96 GETs at once: some went to the agent together");
    // An agent restart: the shared calls find the session gone, every GET
    // in them is retried in a new session, as alone.
    stack.restart("sluice-agent");
    storm(&stack).await;
    assert!(coalesced(ops) > first);
}

/// The shim's counters of GET streams opened framed (without HTTP/2), and
/// of GETs sent on them.
fn framed(shim_ops: SocketAddr) -> (f64, f64) {
    (
        counter(shim_ops, "sluice_shim_agent_framed_links_total"),
        counter(shim_ops, "sluice_shim_agent_gets_framed_total"),
    )
}

#[tokio::test]
async fn single_gets_go_framed_to_a_co_located_agent_and_keep_their_own_answers() {
    let (streamed, framed) = streams_keep_their_own_answers("").await;
    assert_eq!(framed, streamed, "every streamed GET went framed");
}

#[tokio::test]
async fn single_gets_go_on_long_lived_calls_and_keep_their_own_answers() {
    let (_, framed) = streams_keep_their_own_answers("framed_gets = false\n").await;
    assert_eq!(framed, 0.0, "GetStream calls only");
}

/// Single GETs on streams (framed or calls, by `shim_agent_extra`) keep
/// their own answers, across an agent restart and one at a time; returns
/// how many GETs of the first storm (before the restart, when a GET may
/// meet a stream that just ended) went on streams, and how many framed.
async fn streams_keep_their_own_answers(shim_agent_extra: &str) -> (f64, f64) {
    let (mut stack, ops) = stack_with(shim_agent_extra);
    storm(&stack).await;
    let first = streamed(ops);
    assert!(first >= 96.0, "every single GET went on a stream: {first}");
    let (links_before, first_framed) = framed(ops);
    assert_eq!(coalesced(ops), 0.0, "nothing left to coalesce");
    // An agent restart ends the streams; GETs that find their session gone
    // are retried in a new one, on new streams.
    stack.restart("sluice-agent");
    storm(&stack).await;
    assert!(streamed(ops) >= first + 96.0);
    let (links_after, _) = framed(ops);
    if links_before > 0.0 {
        assert!(links_after > links_before, "framed again after the restart: {links_before} -> {links_after}");
    }
    // One at a time too.
    let c: Client = stack.client().await;
    let r = c.register(4096).await.unwrap();
    let before = streamed(ops);
    for _ in 0..5 {
        c.get("data/co/o1", &r, 0, None).await.unwrap();
        assert_eq!(sha256(r.as_slice()), sha256(&pattern(4096, 1)));
    }
    assert_eq!(streamed(ops), before + 5.0);
    (first, first_framed)
}

#[tokio::test]
async fn with_coalescing_off_every_get_is_a_call_of_its_own() {
    let (stack, ops) = stack(false);
    storm(&stack).await;
    assert_eq!(coalesced(ops), 0.0);
    assert_eq!(streamed(ops), 0.0);
}

#[tokio::test]
async fn one_get_at_a_time_goes_alone() {
    let (stack, ops) = stack(true);
    let c: Client = stack.client().await;
    let r = c.register(4096).await.unwrap();
    r.write_at(0, &pattern(4096, 1)).unwrap();
    c.put("data/alone", &r, 0, 4096).await.unwrap();
    for _ in 0..20 {
        c.get("data/alone", &r, 0, None).await.unwrap();
    }
    assert_eq!(coalesced(ops), 0.0, "nothing to share a call with");
}
