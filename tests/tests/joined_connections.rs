//! A second connection of the same process joining the first one's session
//! (`Hello.join`), as the Python client's native reader does to read into
//! the regions the Python connection registered: it names those regions,
//! its own regions go when it closes, it ends when the first connection
//! ends, and a token that names no open session of this process is refused
//! with a typed error. (A token used from another process: the Python
//! suite forks a child for that, `test_a_join_token_is_good_only_in_the_
//! process_that_got_it`.)
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::time::{Duration, Instant};

use sluice_client::{Client, ClientError, Code, GpuOptions};
use sluice_proto::shim as pb;
use sluice_proto::{encode_frame, Message};
use sluice_tests::{pattern, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn code(e: ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed error, got {e}"))
}

async fn join(stack: &Stack, token: &str) -> Result<Client, ClientError> {
    Client::connect_joining(&stack.socket, GpuOptions::default(), token).await
}

/// Waits until `f` holds (the shim acts on a closed connection on its own
/// time), or fails the test after 10 s.
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut f: F) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < until, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_wrong_token_costs_the_connection() {
    let stack = Stack::start();
    let mut s = UnixStream::connect(&stack.socket).await.unwrap();
    let hello = |id, join: &str| pb::Request {
        id,
        op: Some(pb::request::Op::Hello(pb::Hello { version: 1, client: "raw".into(), join: join.into() })),
        ..Default::default()
    };
    s.write_all(&encode_frame(&hello(1, &"f".repeat(32)))).await.unwrap();
    // One answer, then the end of the stream: no second guess on this connection.
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all)).await.expect("closed, not silent").unwrap();
    let len = u32::from_be_bytes(all[..4].try_into().unwrap()) as usize;
    assert_eq!(all.len(), 4 + len, "one frame, then the end");
    match pb::Response::decode(&all[4..]).unwrap().result {
        Some(pb::response::Result::Error(e)) => assert_eq!(Code::try_from(e.code).unwrap(), Code::BadRequest),
        other => panic!("expected BAD_REQUEST, got {other:?}"),
    }
    // An ordinary client is served as before.
    assert!(!stack.client().await.join_token().is_empty());
}

#[tokio::test]
async fn a_joined_connection_shares_regions_only_while_the_first_is_open() {
    let stack = Stack::start();
    let first = stack.client().await;
    let token = first.join_token().to_owned();
    assert_eq!(token.len(), 32, "a shim that offers joining gives a token");
    let data = pattern(10_000, 5);
    let up = first.register(data.len() as u64).await.unwrap();
    up.write_at(0, &data).unwrap();
    first.put("data/joined", &up, 0, data.len() as u64).await.unwrap();
    first.release(up).await.unwrap();
    let region = first.register(1 << 16).await.unwrap();

    // Made-up tokens, one character off, and the empty-but-for-spaces one: refused, typed.
    let mut off_by_one = token.clone().into_bytes();
    off_by_one[31] = if off_by_one[31] == b'0' { b'1' } else { b'0' };
    for bad in ["0".repeat(32), String::from_utf8(off_by_one).unwrap(), " ".into(), "x".repeat(10_000)] {
        assert_eq!(code(join(&stack, &bad).await.err().unwrap()), Code::BadRequest, "token {bad:.40}");
    }

    // Joined: the first connection's region is named here, and is written.
    let second = join(&stack, &token).await.unwrap();
    assert_eq!(second.tenant(), first.tenant());
    assert_eq!(second.namespaces(), first.namespaces());
    assert_eq!(second.join_token(), token);
    let t = second.get_by_id("data/joined", region.id(), 100, None).await.unwrap();
    assert_eq!(t.bytes, data.len() as u64);
    assert_eq!(&region.as_slice()[100..100 + data.len()], &data[..]);
    // The shim still checks the span: past the end, nothing is written.
    assert_eq!(
        code(second.get_by_id("data/joined", region.id(), 60_000, None).await.unwrap_err()),
        Code::RegionTooSmall
    );

    // One session: the counters are the same from both connections.
    let (a, b) = (first.stats().await.unwrap(), second.stats().await.unwrap());
    assert_eq!((a.bytes_read, a.registered_bytes, a.regions), (b.bytes_read, b.registered_bytes, b.regions));
    assert_eq!(a.regions, 1);

    // The joined connection's own region goes when it closes; the first's stays.
    let own = second.register(4096).await.unwrap();
    assert_eq!(first.stats().await.unwrap().regions, 2);
    drop(own);
    drop(second);
    eventually("the joined connection's region released", async || first.stats().await.unwrap().regions == 1).await;
    assert_eq!(first.get_by_id("data/joined", region.id(), 0, None).await.unwrap().bytes, data.len() as u64);

    // The first connection ends: a joined one ends with it, and the token is dead.
    let third = join(&stack, &token).await.unwrap();
    assert_eq!(third.get_by_id("data/joined", region.id(), 0, None).await.unwrap().bytes, data.len() as u64);
    drop(region);
    drop(first);
    eventually("the joined connection closed with the first", async || {
        matches!(third.head("data/joined").await, Err(ClientError::Disconnected | ClientError::Io(_)))
    })
    .await;
    assert_eq!(code(join(&stack, &token).await.err().unwrap()), Code::BadRequest);
}
