//! Bad input: each case gets a typed error, and nothing changes (regions keep
//! their bytes, the store gets no object, the shim keeps serving others).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{Client, ClientError, Code};
use sluice_proto::shim as pb;
use sluice_proto::{encode_frame, Message};
use sluice_shm::MappedRegion;
use sluice_tests::{pattern, peak_rss_kib, Options, Proxy, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn code(e: ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed shim error, got {e}"))
}

async fn upload(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

#[tokio::test]
async fn unknown_caller_is_refused() {
    let stack = Stack::with(Options {
        callers: Some("[[callers]]\nuid = 4242424\ntenant = \"alpha\"\n".into()),
        ..Default::default()
    });
    let err = match Client::connect(&stack.socket).await {
        Err(e) => e,
        Ok(_) => panic!("an unmapped uid must be refused"),
    };
    assert_eq!(code(err), Code::UnknownTenant);
}

#[tokio::test]
async fn namespaces_keys_and_regions_are_checked() {
    let stack = Stack::start();
    let c = stack.client().await;
    let r = c.register(1 << 20).await.unwrap();
    r.write_at(0, &vec![0x5A; 1 << 20]).unwrap();
    let untouched = |r: &sluice_client::Region| r.as_slice().iter().all(|&b| b == 0x5A);

    assert_eq!(code(c.get("nope/key", &r, 0, None).await.unwrap_err()), Code::UnknownNamespace);
    // "other" exists, but belongs to tenant beta.
    assert_eq!(code(c.get("other/key", &r, 0, None).await.unwrap_err()), Code::UnknownNamespace);
    assert_eq!(code(c.get("data/missing", &r, 0, None).await.unwrap_err()), Code::NoSuchKey);
    assert_eq!(code(c.get("no-slash", &r, 0, None).await.unwrap_err()), Code::BadRequest);
    assert!(untouched(&r));

    upload(&c, "data/two-mib", &pattern(2 << 20, 1)).await;
    assert_eq!(code(c.get("data/two-mib", &r, 0, None).await.unwrap_err()), Code::RegionTooSmall);
    // Fits by size, not at this offset.
    assert_eq!(code(c.get("data/two-mib", &r, 1, Some((0, Some(1 << 20)))).await.unwrap_err()), Code::RegionTooSmall);
    assert_eq!(code(c.get("data/two-mib", &r, u64::MAX, Some((0, Some(10)))).await.unwrap_err()), Code::RegionTooSmall);
    assert!(untouched(&r), "a refused GET writes nothing");

    // PUT windows outside the region.
    assert_eq!(code(c.put("data/oob", &r, 1, 1 << 20).await.unwrap_err()), Code::OutOfBounds);
    assert_eq!(code(c.put("data/oob", &r, u64::MAX, 2).await.unwrap_err()), Code::OutOfBounds);
    assert!(!stack.stored_file("data", "oob").exists(), "no object was created");

    // A released region, another connection's region, a made-up id.
    let gone = c.register(4096).await.unwrap();
    let gone_id = gone.id().to_owned();
    c.release(gone).await.unwrap();
    assert_eq!(code(c.get_by_id("data/two-mib", &gone_id, 0, None).await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(code(c.release_id(&gone_id).await.unwrap_err()), Code::UnknownRegion);
    let other = stack.client().await;
    assert_eq!(code(other.get_by_id("data/two-mib", r.id(), 0, None).await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(code(other.put_by_id("data/x", r.id(), 0, 1, "").await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(code(other.release_id(r.id()).await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(
        code(c.get_by_id("data/two-mib", "00000000000000000000000000000000", 0, None).await.unwrap_err()),
        Code::UnknownRegion
    );
    assert!(untouched(&r));
    // The owner still can.
    assert_eq!(c.get("data/two-mib", &r, 0, Some((0, Some(10)))).await.unwrap().bytes, 10);

    assert_eq!(code(c.register(0).await.unwrap_err()), Code::BadRequest);
    assert_eq!(code(c.register(5 << 30).await.unwrap_err()), Code::ResourceExhausted);
}

#[tokio::test]
async fn client_supplied_memory() {
    let stack = Stack::start();
    let c = stack.client().await;
    let map = MappedRegion::create("mine", 8192).unwrap();
    map.write_at(0, b"my own memfd").unwrap();
    let r = c.register_mapped(map).await.unwrap();
    c.put("data/own", &r, 0, 12).await.unwrap();
    assert_eq!(std::fs::read(stack.stored_file("data", "own")).unwrap(), b"my own memfd");
}

#[tokio::test]
async fn wrong_s3_credentials_are_access_denied_and_not_retried() {
    let stack =
        Stack::with(Options { agent_credentials: ("test-access".into(), "wrong-secret".into()), ..Default::default() });
    let c = stack.client().await;
    let r = c.register(4096).await.unwrap();
    r.write_at(0, b"data").unwrap();
    assert_eq!(code(c.put("data/denied", &r, 0, 4).await.unwrap_err()), Code::AccessDenied);
    assert!(!stack.stored_file("data", "denied").exists());
    assert_eq!(code(c.get("data/denied", &r, 0, None).await.unwrap_err()), Code::AccessDenied);
    assert_eq!(code(c.list_page("data", "", 0, "").await.unwrap_err()), Code::AccessDenied);
    assert_eq!(stack.metric("sluice_agent_s3_retries_total", &[]), 0.0, "4xx must not be retried");
    assert!(stack.metric("sluice_agent_errors_total", &["kind=\"ACCESS_DENIED\""]) >= 3.0);
}

async fn raw_hello(sock: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).await.unwrap();
    let hello = pb::Request {
        id: 1,
        op: Some(pb::request::Op::Hello(pb::Hello { version: 1, client: "raw".into(), join: String::new() })),
        ..Default::default()
    };
    s.write_all(&encode_frame(&hello)).await.unwrap();
    let resp = read_frame(&mut s).await.expect("hello answer");
    assert!(matches!(resp.result, Some(pb::response::Result::Hello(_))), "{resp:?}");
    s
}

async fn read_frame(s: &mut UnixStream) -> Option<pb::Response> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.ok()?;
    Some(pb::Response::decode(buf.as_slice()).expect("decodable response"))
}

fn error_code(resp: &pb::Response) -> Code {
    match &resp.result {
        Some(pb::response::Result::Error(e)) => Code::try_from(e.code).unwrap(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_frames_do_not_hurt_the_shim() {
    let stack = Stack::start();
    let good = stack.client().await;

    // Requests before Hello, and a wrong version.
    let mut s = UnixStream::connect(&stack.socket).await.unwrap();
    let stats = pb::Request { id: 5, op: Some(pb::request::Op::Stats(pb::Stats {})), ..Default::default() };
    s.write_all(&encode_frame(&stats)).await.unwrap();
    assert_eq!(error_code(&read_frame(&mut s).await.unwrap()), Code::Protocol);
    let bad_version = pb::Request {
        id: 6,
        op: Some(pb::request::Op::Hello(pb::Hello { version: 99, client: "x".into(), join: String::new() })),
        ..Default::default()
    };
    s.write_all(&encode_frame(&bad_version)).await.unwrap();
    assert_eq!(error_code(&read_frame(&mut s).await.unwrap()), Code::UnsupportedVersion);

    // Garbage inside a well-formed frame: error, connection stays usable.
    let mut s = raw_hello(&stack.socket).await;
    s.write_all(&[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    let resp = read_frame(&mut s).await.unwrap();
    assert_eq!((resp.id, error_code(&resp)), (0, Code::Protocol));
    // Empty op, and fd_attached without a descriptor.
    s.write_all(&encode_frame(&pb::Request { id: 7, ..Default::default() })).await.unwrap();
    assert_eq!(error_code(&read_frame(&mut s).await.unwrap()), Code::BadRequest);
    let reg = pb::Request {
        id: 8,
        op: Some(pb::request::Op::Register(pb::Register { length: 10, fd_attached: true, ..Default::default() })),
        ..Default::default()
    };
    s.write_all(&encode_frame(&reg)).await.unwrap();
    assert_eq!(error_code(&read_frame(&mut s).await.unwrap()), Code::Protocol);
    s.write_all(&encode_frame(&stats)).await.unwrap();
    assert!(matches!(read_frame(&mut s).await.unwrap().result, Some(pb::response::Result::Stats(_))));

    // An oversized length: told why, then disconnected.
    let mut s = raw_hello(&stack.socket).await;
    s.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert_eq!(error_code(&read_frame(&mut s).await.unwrap()), Code::Protocol);
    assert!(read_frame(&mut s).await.is_none(), "connection closed after a bad length");

    // A truncated frame, then hang up.
    let mut s = raw_hello(&stack.socket).await;
    s.write_all(&[0, 0, 0, 50, 1, 2, 3]).await.unwrap();
    drop(s);

    // Through all of that the well-behaved client kept working.
    good.send_raw(&[0, 0, 0, 1, 0xff]).await.unwrap();
    let r = good.register(64).await.unwrap();
    r.write_at(0, b"still here").unwrap();
    good.put("data/survivor", &r, 0, 10).await.unwrap();
    assert_eq!(std::fs::read(stack.stored_file("data", "survivor")).unwrap(), b"still here");
}

#[tokio::test]
async fn store_dying_mid_transfer_is_an_error_never_partial_success() {
    let stack = Stack::start();
    let c = stack.client().await;
    let data = pattern(8 << 20, 11);
    upload(&c, "data/doomed", &data).await;

    // A second agent reads through a proxy that dies after 3 MiB.
    let proxy = Proxy::start(stack.gateway_addr.unwrap(), Some(3 << 20));
    let via_proxy = Stack::with(Options {
        endpoints: vec![format!("http://{}", proxy.addr)],
        gateway: false,
        ..Default::default()
    });
    let c2 = via_proxy.client().await;
    let r = c2.register(8 << 20).await.unwrap();
    let err = c2.get("data/doomed", &r, 0, None).await.expect_err("a broken transfer must not succeed");
    let code = code(err);
    assert!(matches!(code, Code::TransferFailed | Code::StoreUnavailable), "{code:?}");
    assert!(via_proxy.metric("sluice_agent_s3_retries_total", &[]) >= 1.0, "connection errors are retried");

    // The real gateway process killed: refused connections, after retries.
    let mut stack = stack;
    stack.kill("sluice-gateway");
    let r1 = c.register(8 << 20).await.unwrap();
    let err = c.get("data/doomed", &r1, 0, None).await.expect_err("gateway is gone");
    assert_eq!(code_of(err), Code::StoreUnavailable);
    let err = c.put("data/after", &r1, 0, 100).await.expect_err("gateway is gone");
    assert_eq!(code_of(err), Code::StoreUnavailable);
}

fn code_of(e: ClientError) -> Code {
    code(e)
}

/// Descriptors sent with frames that no request can claim (undecodable, or
/// without an operation) are closed at once, the connection still open: a
/// client sending them in a loop cannot fill the shim's descriptor table.
#[tokio::test]
async fn descriptors_with_frames_no_request_claims_are_closed() {
    let stack = Stack::start();
    let mut s = raw_hello(&stack.socket).await;
    let region = MappedRegion::create("stray", 4096).unwrap();
    let fds = [region.fd(); 4];
    let before = stack.fd_count("sluice-shim");
    for i in 0..200 {
        // Garbage inside a frame, then a frame without an operation.
        let frame: &[u8] = if i % 2 == 0 { &[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff] } else { &[0, 0, 0, 0] };
        sluice_shm::send_with_fds(&s, frame, &fds).await.unwrap();
        let resp = read_frame(&mut s).await.expect("an answer to each frame");
        let want = if i % 2 == 0 { Code::Protocol } else { Code::BadRequest };
        assert_eq!(error_code(&resp), want, "frame {i}");
    }
    // 800 descriptors were sent; at most a frame's few may be held.
    let after = stack.fd_count("sluice-shim");
    assert!(after <= before + 8, "shim descriptors {before} -> {after}: {:?}", stack.fd_targets("sluice-shim"));
    // The connection still serves.
    let stats = pb::Request { id: 9, op: Some(pb::request::Op::Stats(pb::Stats {})), ..Default::default() };
    s.write_all(&encode_frame(&stats)).await.unwrap();
    assert!(matches!(read_frame(&mut s).await.unwrap().result, Some(pb::response::Result::Stats(_))));
}

/// Registrations sent at once count against the connection's limit from
/// their start: they cannot all pass the check before any is kept.
#[tokio::test]
async fn registrations_sent_at_once_stay_within_the_connection_limit() {
    let stack = Stack::with(Options { shim_limits: "max_regions_per_connection = 4".into(), ..Default::default() });
    let mut s = raw_hello(&stack.socket).await;
    let mut burst = Vec::new();
    for id in 100..132u64 {
        let reg = pb::Request {
            id,
            op: Some(pb::request::Op::Register(pb::Register { length: 4096, ..Default::default() })),
            ..Default::default()
        };
        burst.extend_from_slice(&encode_frame(&reg));
    }
    s.write_all(&burst).await.unwrap();
    let (mut kept, mut refused) = (0, 0);
    for _ in 0..32 {
        let resp = read_frame(&mut s).await.expect("an answer to each Register");
        match &resp.result {
            Some(pb::response::Result::Registered(_)) => kept += 1,
            _ => {
                assert_eq!(error_code(&resp), Code::ResourceExhausted, "{resp:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((kept, refused), (4, 28), "max_regions_per_connection = 4");
}

/// A client's deadline is kept only up to the shim's own
/// (`request_timeout_ms`), and a request whose client set none gets the
/// shim's: a client asking for ten minutes, or for nothing, against a store
/// that went silent gets its answer at the operator's limit. The agent is
/// given that deadline and answers when it passes, once it has stopped the
/// request's transfers, before the shim would stop waiting: the shim giving
/// up first (as it did without a client deadline, the agent then having
/// only the namespace's) told the client its region was free while the
/// agent could still write into it.
#[tokio::test]
async fn no_request_outlasts_the_shims_deadline_and_the_agent_ends_it() {
    let stack = Stack::start();
    let c = stack.client().await;
    upload(&c, "data/silent", b"never read").await;
    let proxy = Proxy::start(stack.gateway_addr.unwrap(), None);
    let via_proxy = Stack::with(Options {
        endpoints: vec![format!("http://{}", proxy.addr)],
        gateway: false,
        shim_limits: "request_timeout_ms = 1500".into(),
        ..Default::default()
    });
    let c2 = via_proxy.client().await;
    let r = c2.register(4096).await.unwrap();
    proxy.stall(true);
    for asked in [Some(std::time::Duration::from_secs(600)), None] {
        let started = std::time::Instant::now();
        let err = sluice_client::with_timeout(asked, c2.get("data/silent", &r, 0, None))
            .await
            .expect_err("nothing came from the store");
        let (waited, msg) = (started.elapsed(), err.to_string());
        // 1.5 s; the shim's 2 s of grace after it, the agent's own
        // first-byte deadline (5 s) and the client's 600 s are never reached.
        assert_eq!(code(err), Code::DeadlineExceeded, "{asked:?}: after {waited:?}: {msg}");
        assert!(waited < std::time::Duration::from_millis(3400), "{asked:?}: {waited:?}");
        // The agent's own answer, with what was left of the 1.5 s when the
        // shim sent the GET.
        let agent_ms: u32 = msg
            .split("did not finish within its deadline of ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the agent's answer: {msg}"));
        assert!((1_000..=1_500).contains(&agent_ms), "{msg}");
    }
    proxy.stall(false);
}

/// A request the shim gave up on (the agent far past its deadline: here
/// stopped outright) may still have its bytes land when the agent goes on.
/// Until the agent answers it, its region is in doubt: a GET into it, or
/// its release, waits (and fails at its own deadline, saying why) instead
/// of starting, so no later GET's bytes can be overwritten by the late one.
#[tokio::test]
async fn a_region_the_shim_gave_up_on_waits_for_the_agents_late_answer() {
    let stack = Stack::start();
    let c = stack.client().await;
    let (late, fresh) = (pattern(64 << 10, 1), pattern(64 << 10, 2));
    upload(&c, "data/late", &late).await;
    upload(&c, "data/fresh", &fresh).await;
    let r = c.register(64 << 10).await.unwrap();
    let short = |ms| Some(std::time::Duration::from_millis(ms));

    stack.stop("sluice-agent");
    let err =
        sluice_client::with_timeout(short(300), c.get("data/late", &r, 0, None)).await.expect_err("agent stopped");
    let msg = err.to_string();
    assert_eq!(code(err), Code::DeadlineExceeded, "{msg}");
    assert!(msg.contains("new requests into its region wait"), "the shim's own answer: {msg}");

    let started = std::time::Instant::now();
    let err = sluice_client::with_timeout(short(500), c.get("data/fresh", &r, 0, None)).await.expect_err("in doubt");
    let (waited, msg) = (started.elapsed(), err.to_string());
    assert_eq!(code(err), Code::DeadlineExceeded, "{msg}");
    assert!(msg.contains("may still be written by an earlier request"), "not sent to the agent: {msg}");
    assert!(waited < std::time::Duration::from_millis(2000), "refused at its own deadline, not the shim's: {waited:?}");
    let err = sluice_client::with_timeout(short(500), c.release_id(r.id())).await.expect_err("release waits too");
    assert!(err.to_string().contains("may still be written by an earlier request"), "{err}");

    // The agent goes on: its late answer (whatever it is) ends the doubt,
    // and a GET into the region then starts, and its bytes are the ones
    // that stay.
    stack.signal("sluice-agent", "CONT");
    let got = sluice_client::with_timeout(short(20_000), c.get("data/fresh", &r, 0, None))
        .await
        .expect("after the late answer");
    assert_eq!(got.bytes, fresh.len() as u64);
    assert!(r.as_slice()[..fresh.len()] == fresh[..], "the region holds the later GET's bytes");
    c.release(r).await.expect("released once the agent answered");
}

/// The agent bounds each tenant over all its sessions, not only per
/// session: no more than `max_sessions_per_tenant` sessions (one per client
/// connection) and `max_regions_per_tenant` regions in all; what is
/// released or closed gives its place back.
#[tokio::test]
async fn a_tenant_holds_at_most_its_sessions_and_regions_over_all_of_them() {
    let stack = Stack::with(Options {
        agent_limits: "max_sessions_per_tenant = 2\nmax_regions_per_tenant = 3\n".into(),
        ..Default::default()
    });
    let c1 = stack.client().await;
    let c2 = stack.client().await;
    let third = Client::connect(&stack.socket).await.err().expect("a third session is refused");
    assert_eq!(code(third), Code::ResourceExhausted);

    let r1 = c1.register(4096).await.expect("region 1");
    let _r2 = c1.register(4096).await.expect("region 2");
    let _r3 = c2.register(4096).await.expect("region 3, in the other session");
    let e = c2.register(4096).await.expect_err("a fourth region of the tenant is refused");
    assert_eq!(code(e), Code::ResourceExhausted);
    c1.release(r1).await.expect("release");
    let r4 = c2.register(4096).await.expect("a released region's place");
    c2.release(r4).await.expect("release");
    upload(&c2, "data/places", b"still serves").await;

    drop(c1);
    // The closed connection's session gives its place back (the shim closes
    // it at the agent when the client goes).
    let t0 = std::time::Instant::now();
    let c3 = loop {
        match Client::connect(&stack.socket).await {
            Ok(c) => break c,
            Err(e) if t0.elapsed() < std::time::Duration::from_secs(10) => {
                assert_eq!(code(e), Code::ResourceExhausted);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the closed session's place never came back: {e}"),
        }
    };
    c3.register(4096).await.expect("the closed session's regions gave their places back");
}

/// A request id longer than the agent takes is refused by the shim at once,
/// typed; the connection goes on.
#[tokio::test]
async fn an_overlong_request_id_is_refused_at_once() {
    let stack = Stack::start();
    let mut s = raw_hello(&stack.socket).await;
    let stats = |id, request_id: String| pb::Request {
        id,
        request_id,
        op: Some(pb::request::Op::Stats(pb::Stats {})),
        ..Default::default()
    };
    s.write_all(&encode_frame(&stats(7, "r".repeat(257)))).await.unwrap();
    let resp = read_frame(&mut s).await.unwrap();
    assert_eq!((resp.id, error_code(&resp)), (7, Code::BadRequest), "{resp:?}");
    s.write_all(&encode_frame(&stats(8, "r".repeat(256)))).await.unwrap();
    assert!(matches!(read_frame(&mut s).await.unwrap().result, Some(pb::response::Result::Stats(_))));
}

/// A frame of empty batch items (2 bytes each on the wire, far more once
/// decoded) is counted before it is decoded and refused as the batch would
/// be, under its own id; the connection goes on.
#[tokio::test]
async fn a_frame_of_empty_batch_items_is_refused_before_it_is_decoded() {
    let stack = Stack::start();
    let mut s = raw_hello(&stack.socket).await;
    let peak_before = peak_rss_kib(stack.pid("sluice-shim").unwrap());
    let items = [0x0a, 0x00].repeat(500_000);
    let mut batch = vec![0x08, 0x07, 0x9a, 0x01]; // id = 7; get_batch (19), length-delimited
    prost_len(&mut batch, items.len());
    batch.extend_from_slice(&items);
    let mut frame = u32::try_from(batch.len()).unwrap().to_be_bytes().to_vec();
    frame.extend_from_slice(&batch);
    s.write_all(&frame).await.unwrap();
    let resp = read_frame(&mut s).await.expect("an answer");
    assert_eq!((resp.id, error_code(&resp)), (7, Code::BadRequest), "{resp:?}");
    let Some(pb::response::Result::Error(e)) = &resp.result else { unreachable!() };
    assert!(e.message.contains("not 500000"), "{}", e.message);
    // Decoded, the 500,000 items would take some 100 MiB.
    let grew = peak_rss_kib(stack.pid("sluice-shim").unwrap()) - peak_before;
    assert!(grew < 24 << 10, "the shim's peak memory grew by {grew} KiB for a 1 MiB frame");
    let stats = pb::Request { id: 8, op: Some(pb::request::Op::Stats(pb::Stats {})), ..Default::default() };
    s.write_all(&encode_frame(&stats)).await.unwrap();
    let resp = read_frame(&mut s).await.expect("still served");
    assert!(matches!(resp.result, Some(pb::response::Result::Stats(_))), "{resp:?}");
}

fn prost_len(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A client that stops reading its answers (its socket full) is
/// disconnected after `client_write_timeout_ms`: its requests stop being
/// read and served, and its session is closed; the shim serves others.
#[tokio::test]
async fn a_client_that_reads_no_answers_is_disconnected() {
    let stack = Stack::with(Options { shim_limits: "client_write_timeout_ms = 500".into(), ..Default::default() });
    let mut s = raw_hello(&stack.socket).await;
    // Refused at once, each answered by the shim alone (no agent call).
    let sent = 4000u64;
    let mut frames = Vec::new();
    for id in 0..sent {
        let empty = pb::Request {
            id: 100 + id,
            op: Some(pb::request::Op::GetBatch(pb::GetBatch::default())),
            ..Default::default()
        };
        frames.extend_from_slice(&encode_frame(&empty));
    }
    s.write_all(&frames).await.unwrap();
    // The shim answers until the socket is full (some 2,000 answers), then
    // its writer waits: 0.5 s later it gives up.
    tokio::time::sleep(std::time::Duration::from_millis(3_000)).await;
    let mut answered = 0u64;
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while read_frame(&mut s).await.is_some() {
            answered += 1;
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was not closed ({answered} answers read)");
    assert!(answered < sent, "every request was answered: the shim waited for the reader");
    let other = stack.client().await;
    upload(&other, "data/after-the-stalled-reader", b"still serving").await;
}
