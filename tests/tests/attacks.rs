//! The attack suite: tenant A ("alpha") tries to reach tenant B ("beta")'s
//! namespaces, keys, regions and descriptors, and to pass as a shim it is
//! not. Every attempt gets a typed error, is counted where the agent keeps
//! a counter, and leaves B's objects and memory exactly as they were.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::Arc;

use sluice_client::{Client, ClientError, Code};
use sluice_dataplane::tcp::{TcpOwner, TcpRemote};
use sluice_dataplane::{Access, Grant, RegionMemory, SharedRegion, Token, Transport};
use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_proto::auth;
use sluice_proto::framed_gets::{push_gets, Frame, FrameReader, PREFACE};
use sluice_tests::{pattern, sha256, Options, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "common/agent_direct.rs"]
mod agent_direct;
use agent_direct::{agent_epoch, agent_region, open_session, session_request, sluice_agent_code};

fn code(e: ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed error, got {e}"))
}

async fn upload(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

/// Tenant B's state an attack must not change: its object's bytes and its
/// region's bytes.
struct Victim {
    client: Client,
    object: Vec<u8>,
    region: sluice_client::Region,
    region_bytes: Vec<u8>,
}

async fn victim(stack: &Stack) -> Victim {
    let client = Client::connect(&stack.beta_socket).await.expect("tenant beta's shim");
    assert_eq!(client.tenant(), "beta");
    let object = pattern(300_000, 77);
    upload(&client, "other/secret", &object).await;
    let region_bytes = pattern(1 << 16, 78);
    let region = client.register(1 << 16).await.unwrap();
    region.write_at(0, &region_bytes).unwrap();
    Victim { client, object, region, region_bytes }
}

impl Victim {
    async fn unharmed(&self, stack: &Stack) {
        assert_eq!(sha256(&std::fs::read(stack.stored_file("other", "secret")).unwrap()), sha256(&self.object));
        let r = self.client.register(self.object.len() as u64).await.unwrap();
        self.client.get("other/secret", &r, 0, None).await.unwrap();
        assert_eq!(sha256(&r.as_slice()[..self.object.len()]), sha256(&self.object), "B still reads its object");
        assert_eq!(self.region.as_slice(), &self.region_bytes[..], "B's region is untouched");
    }
}

fn two_tenants() -> Options {
    Options { beta_shim: true, ..Default::default() }
}

#[tokio::test]
async fn tenant_a_cannot_name_b_namespace_prefix_or_region() {
    let stack = Stack::with(two_tenants());
    let b = victim(&stack).await;
    let a = stack.client().await;
    assert_eq!(a.tenant(), "alpha");
    let r = a.register(1 << 20).await.unwrap();

    // B's namespace: unknown to A (never "denied": A learns nothing of it).
    assert_eq!(code(a.get("other/secret", &r, 0, None).await.unwrap_err()), Code::UnknownNamespace);
    assert_eq!(code(a.put("other/secret", &r, 0, 10).await.unwrap_err()), Code::UnknownNamespace);
    assert_eq!(code(a.delete("other/secret").await.unwrap_err()), Code::UnknownNamespace);
    assert_eq!(code(a.list_all("other/").await.unwrap_err()), Code::UnknownNamespace);

    // B's key prefix: A's "scoped" namespace lives under tenants/alpha/ of the
    // same bucket; dot segments cannot climb out of it.
    upload(&b.client, "other/x", b"b").await; // unrelated bucket; keep B busy
    for key in ["scoped/../beta/secret", "scoped/a/../../x", "scoped//x", "scoped/./x"] {
        assert_eq!(code(a.put(key, &r, 0, 10).await.unwrap_err()), Code::BadRequest, "{key}");
        assert_eq!(code(a.get(key, &r, 0, None).await.unwrap_err()), Code::BadRequest, "{key}");
    }
    assert_eq!(code(a.list_all("scoped/../").await.unwrap_err()), Code::BadRequest);
    assert!(!stack.data_dir.join("data/tenants/beta").exists());
    assert!(!stack.data_dir.join("data/x").exists());

    // B's region id, through A's shim connection...
    assert_eq!(code(a.get_by_id("data/any", b.region.id(), 0, None).await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(code(a.put_by_id("data/stolen", b.region.id(), 0, 16, "").await.unwrap_err()), Code::UnknownRegion);
    assert_eq!(code(a.release_id(b.region.id()).await.unwrap_err()), Code::UnknownRegion);
    assert!(!stack.stored_file("data", "stolen").exists());

    // ...and straight at the agent with A's own valid session: region ids are
    // checked against the session that registered them, not just looked up.
    // (The shim names regions by ids of its own, so B's agent-side id comes
    // from a session B opens at the agent directly.)
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let b_session = open_session(&mut grpc, &stack, "beta", "beta-shim").await.expect("B's own session");
    let (b_region, b_memory) = agent_region(&stack, &mut grpc, &b_session, &pattern(4096, 79)).await;
    let session = open_session(&mut grpc, &stack, "alpha", "alpha-shim").await.expect("A's own session");
    let put = apb::PutRequest {
        session_id: session.clone(),
        request_id: "attack".into(),
        namespace: "data".into(),
        key: "stolen".into(),
        region_id: b_region.clone(),
        offset: 0,
        length: 16,
        content_type: String::new(),
        timeout_ms: 0,
    };
    let st = grpc.put(put).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::UnknownRegion, "{st:?}");
    let get = apb::GetRequest {
        session_id: session.clone(),
        request_id: "attack".into(),
        namespace: "data".into(),
        key: "x".into(),
        range: None,
        region_id: b_region.clone(),
        offset: 0,
        timeout_ms: 0,
        ..Default::default()
    };
    assert_eq!(sluice_agent_code(&grpc.get(get).await.unwrap_err()), Code::UnknownRegion);
    // In a batch too: the foreign region fails its item, typed.
    let batch = apb::GetManyRequest {
        session_id: session.clone(),
        request_id: "attack-batch".into(),
        timeout_ms: 0,
        items: vec![apb::GetItem {
            namespace: "data".into(),
            key: "x".into(),
            region_id: b_region.clone(),
            ..Default::default()
        }],
    };
    let mut items = grpc.get_many(batch).await.expect("the batch is taken").into_inner();
    let item = items.message().await.expect("stream").expect("one item");
    match item.result {
        Some(apb::get_many_item::Result::Error(d)) => assert_eq!(d.code, Code::UnknownRegion as i32, "{d:?}"),
        other => panic!("another tenant's region in a batch: {other:?}"),
    }
    assert!(items.message().await.expect("stream").is_none(), "one answer per item");
    // B's session id is not A's to use either: a made-up one is refused.
    let fake = apb::ReleaseRegionRequest { session_id: "0".repeat(32), region_id: b_region.clone() };
    assert_eq!(sluice_agent_code(&grpc.release_region(fake).await.unwrap_err()), Code::Unauthenticated);
    assert_eq!(b_memory.as_slice(), &pattern(4096, 79)[..], "B's agent-side region is untouched");
    let mine = apb::ReleaseRegionRequest { session_id: b_session, region_id: b_region };
    grpc.release_region(mine).await.expect("B releases its own region");

    b.unharmed(&stack).await;
}

/// `GetStream` (single GETs as messages of one long-lived call) checks
/// every GET as a `Get` call is checked: the session against where the
/// stream was opened from, the region against the session, the namespace
/// against the tenant, each a typed error of its own while the stream goes
/// on. A message no shim sends (a GET without its item, an index already
/// running, more GETs than one message may start) ends the stream with
/// INVALID_ARGUMENT.
#[tokio::test]
async fn every_get_on_a_stream_is_checked_like_a_call() {
    use std::collections::HashMap;
    type Got = HashMap<u32, Result<apb::GetReply, sluice_proto::common::ErrorDetail>>;
    let stack = Stack::with(two_tenants());
    let b = victim(&stack).await;
    let a = stack.client().await;
    let data = pattern(5000, 41);
    upload(&a, "data/st/x", &data).await;
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let b_session = open_session(&mut grpc, &stack, "beta", "beta-shim").await.expect("B's own session");
    let (b_region, b_memory) = agent_region(&stack, &mut grpc, &b_session, &pattern(4096, 79)).await;
    let session = open_session(&mut grpc, &stack, "alpha", "alpha-shim").await.expect("A's own session");
    let (region, memory) = agent_region(&stack, &mut grpc, &session, &[0; 8192]).await;
    let item = |ns: &str, key: &str, region: &str| apb::GetItem {
        namespace: ns.into(),
        key: key.into(),
        region_id: region.into(),
        request_id: format!("q-{key}"),
        ..Default::default()
    };
    let get = |index, session: &str, item| apb::StreamedGet { index, session_id: session.into(), item };
    let code_of = |r: &Result<apb::GetReply, sluice_proto::common::ErrorDetail>| match r {
        Ok(_) => None,
        Err(d) => Some(Code::try_from(d.code).expect("known code")),
    };
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut answers = grpc.get_stream(rx).await.expect("the stream is taken").into_inner();
    let first = apb::GetStreamRequest {
        gets: vec![
            get(0, &session, Some(item("data", "st/x", &region))),
            get(1, &"0".repeat(32), Some(item("data", "st/x", &region))),
            get(2, &session, Some(item("data", "st/x", &b_region))),
            get(3, &session, Some(item("other", "secret", &region))),
            get(5, &session, Some(item("data", "st/none", &region))),
        ],
        // Stopping what is not running changes nothing.
        cancel: vec![999],
    };
    tx.unbounded_send(first).unwrap();
    let mut got = Got::new();
    for _ in 0..5 {
        let m = answers.message().await.expect("stream").expect("an answer");
        let answer = match m.result.expect("a result") {
            apb::get_many_item::Result::Ok(r) => Ok(r),
            apb::get_many_item::Result::Error(d) => Err(d),
        };
        assert!(got.insert(m.index, answer).is_none(), "one answer per GET");
    }
    let ok = got[&0].as_ref().expect("A's own GET");
    assert_eq!((ok.object_size, ok.report.as_ref().unwrap().request_id.as_str()), (5000, "q-st/x"));
    assert_eq!(sha256(&memory.as_slice()[..5000]), sha256(&data));
    assert_eq!(code_of(&got[&1]), Some(Code::Unauthenticated), "a made-up session");
    assert_eq!(code_of(&got[&2]), Some(Code::UnknownRegion), "B's region in A's session");
    assert_eq!(code_of(&got[&3]), Some(Code::UnknownNamespace), "B's namespace");
    assert_eq!(code_of(&got[&5]), Some(Code::NoSuchKey));
    // The stream goes on; closing our side ends it once all is answered.
    tx.unbounded_send(apb::GetStreamRequest {
        gets: vec![get(0, &session, Some(item("data", "st/x", &region)))],
        cancel: vec![],
    })
    .unwrap();
    assert!(answers.message().await.unwrap().is_some_and(|m| m.index == 0));
    drop(tx);
    assert!(answers.message().await.expect("a clean end").is_none());

    // What no shim sends ends the stream, typed.
    let too_many = (0..257).map(|i| get(2000 + i, &session, Some(item("data", "st/x", &region)))).collect();
    let twice = vec![
        get(1000, &session, Some(item("data", "st/x", &region))),
        get(1000, &session, Some(item("data", "st/x", &region))),
    ];
    for (what, gets) in [("no item", vec![get(4, &session, None)]), ("twice", twice), ("too many", too_many)] {
        let msg = apb::GetStreamRequest { gets, cancel: vec![] };
        let mut answers = grpc.get_stream(futures::stream::iter([msg])).await.unwrap().into_inner();
        let mut end = None;
        while end.is_none() {
            match answers.message().await {
                Ok(Some(_)) => {} // the first of the pair may answer
                Ok(None) => panic!("{what}: ended without an error"),
                Err(st) => end = Some(st),
            }
        }
        assert_eq!(end.unwrap().code(), tonic::Code::InvalidArgument, "{what}");
    }
    // The connection and the session still serve.
    grpc.stats(apb::StatsRequest { session_id: session }).await.expect("still usable");
    assert_eq!(b_memory.as_slice(), &pattern(4096, 79)[..], "B's agent-side region is untouched");
    b.unharmed(&stack).await;
}

#[tokio::test]
async fn out_of_window_offsets_and_released_regions() {
    let stack = Stack::with(two_tenants());
    let b = victim(&stack).await;
    let a = stack.client().await;
    upload(&a, "data/mine", &pattern(5000, 1)).await;
    let r = a.register(4096).await.unwrap();
    r.write_at(0, &[0x5a; 4096]).unwrap();
    // Past the end of A's own region, or not fitting: refused, region unchanged.
    assert_eq!(code(a.get("data/mine", &r, 4096, None).await.unwrap_err()), Code::RegionTooSmall);
    assert_eq!(code(a.get("data/mine", &r, 0, None).await.unwrap_err()), Code::RegionTooSmall);
    assert_eq!(code(a.put("data/big", &r, 1, 4096).await.unwrap_err()), Code::OutOfBounds);
    assert_eq!(code(a.get("data/mine", &r, u64::MAX - 10, None).await.unwrap_err()), Code::RegionTooSmall);
    assert!(r.as_slice().iter().all(|&x| x == 0x5a));
    // A region A released.
    let id = r.id().to_owned();
    a.release(r).await.unwrap();
    assert_eq!(code(a.get_by_id("data/mine", &id, 0, None).await.unwrap_err()), Code::UnknownRegion);
    b.unharmed(&stack).await;
}

#[tokio::test]
async fn forged_shim_identities_are_refused_and_counted() {
    // Beta accepts shims only on the agent's Unix socket; alpha only from
    // the shim id "alpha-shim" (or any, over TCP in this test).
    let stack = Stack::with(Options {
        beta: "shim_origins = [\"unix\"]\n".into(),
        alpha: "shims = [\"alpha-shim\", \"localhost\"]\n".into(),
        ..two_tenants()
    });
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let epoch = agent_epoch(&mut grpc).await;
    // Alpha's secret used to claim beta: wrong proof.
    let alpha_secret = auth::read_secret_file(&stack.dir.path().join("alpha.shim-secret")).unwrap();
    let ts = auth::now_ms();
    let forged = session_request(b"not-the-secret-at-all", "alpha", "alpha-shim", &epoch, ts);
    assert_eq!(sluice_agent_code(&grpc.open_session(forged).await.unwrap_err()), Code::Unauthenticated);
    let as_beta = session_request(&alpha_secret, "beta", "alpha-shim", &epoch, ts);
    // Over TCP beta is refused on origin before the proof is even checked.
    assert_eq!(sluice_agent_code(&grpc.open_session(as_beta).await.unwrap_err()), Code::AccessDenied);
    // A valid proof, replayed.
    let good = session_request(&alpha_secret, "alpha", "alpha-shim", &epoch, ts);
    assert!(grpc.open_session(good.clone()).await.is_ok());
    assert_eq!(sluice_agent_code(&grpc.open_session(good).await.unwrap_err()), Code::Unauthenticated);
    // A stale proof, and a shim id the tenant does not allow.
    let stale = session_request(&alpha_secret, "alpha", "alpha-shim", &epoch, auth::now_ms() - 600_000);
    assert_eq!(sluice_agent_code(&grpc.open_session(stale).await.unwrap_err()), Code::Unauthenticated);
    assert_eq!(
        sluice_agent_code(&open_session(&mut grpc, &stack, "alpha", "rogue-shim").await.unwrap_err()),
        Code::AccessDenied
    );
    for reason in ["bad_proof", "origin", "replay", "stale", "shim_id"] {
        let n = stack.metric("sluice_agent_auth_failures_total", &[&format!("reason=\"{reason}\"")]);
        assert!(n >= 1.0, "{reason} counted");
    }
    // The legitimate shims still work.
    let b = Client::connect(&stack.beta_socket).await.unwrap();
    upload(&b, "other/ok", b"fine").await;
}

/// The agent forgets the nonces it has seen when it restarts; its epoch
/// changes, so a valid OpenSession captured before the restart and replayed
/// after it (well within the timestamp window) is refused, typed and
/// counted as `reason="epoch"`, while the real shim, which asks for the
/// epoch at every open, rides through the restart. A request without an
/// epoch (an older shim) is told to upgrade.
#[tokio::test]
async fn a_proof_captured_before_an_agent_restart_is_refused_after_it() {
    let mut stack = Stack::start();
    let c = stack.client().await;
    let data = pattern(50_000, 21);
    upload(&c, "data/epoch/x", &data).await;
    let r = c.register(data.len() as u64).await.unwrap();

    let secret = auth::read_secret_file(&stack.dir.path().join("alpha.shim-secret")).unwrap();
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let before = agent_epoch(&mut grpc).await;
    assert_eq!(before.len(), auth::EPOCH_BYTES);
    let captured = session_request(&secret, "alpha", "alpha-shim", &before, auth::now_ms());
    grpc.open_session(captured.clone()).await.expect("the original request is valid");

    stack.restart("sluice-agent");
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    assert_ne!(agent_epoch(&mut grpc).await, before, "a new epoch at every start");
    let st = grpc.open_session(captured.clone()).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert!(st.message().contains("another agent epoch"), "{}", st.message());
    // The same captured request with the new epoch pasted in: the proof
    // covers the epoch, so it no longer verifies.
    let relabelled = apb::OpenSessionRequest { epoch: agent_epoch(&mut grpc).await, ..captured.clone() };
    let st = grpc.open_session(relabelled).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    // A shim that signs no epoch (older than the agent).
    let old = session_request(&secret, "alpha", "alpha-shim", &[], auth::now_ms());
    let st = grpc.open_session(old).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert!(st.message().contains("upgrade"), "{}", st.message());
    for (reason, n) in [("epoch", 1.0), ("bad_proof", 1.0), ("no_epoch", 1.0)] {
        let got = stack.metric("sluice_agent_auth_failures_total", &[&format!("reason=\"{reason}\"")]);
        assert_eq!(got, n, "{reason} counted");
    }

    // The real shim re-opens its session with the new epoch: same
    // connection, same region.
    c.get("data/epoch/x", &r, 0, None).await.expect("the shim rides through the restart");
    assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(&data));
    let fresh = stack.client().await;
    upload(&fresh, "data/epoch/y", b"after the restart").await;
}

#[tokio::test]
async fn namespace_acl_limits_operations() {
    let stack = Stack::with(Options { data_ns: "access = [\"read\", \"list\"]".into(), ..Default::default() });
    let a = stack.client().await;
    // Seed an object through the unrestricted "plain" namespace (same bucket).
    upload(&a, "plain/seed", &pattern(1000, 3)).await;
    let r = a.register(4096).await.unwrap();
    assert_eq!(a.get("data/seed", &r, 0, None).await.unwrap().bytes, 1000);
    assert_eq!(a.list_all("data/").await.unwrap().len(), 1);
    assert_eq!(code(a.put("data/new", &r, 0, 10).await.unwrap_err()), Code::AccessDenied);
    assert_eq!(code(a.delete("data/seed").await.unwrap_err()), Code::AccessDenied);
    assert!(stack.stored_file("data", "seed").exists());
    assert!(!stack.stored_file("data", "new").exists());
    assert_eq!(stack.metric("sluice_agent_access_denied_total", &["namespace=\"data\""]), 2.0);
}

/// Descriptors at the transport: one grant per request and direction,
/// revoked when the request ends. A replayed, forged, wrong-direction or
/// out-of-window access is refused, counted, and touches nothing.
#[tokio::test]
async fn descriptors_are_single_use_and_bounded() {
    let (owner, listener) = TcpOwner::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    tokio::spawn(owner.clone().serve(listener));
    let remote = TcpRemote::new(1 << 20);
    let b_mem = Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("b", 1 << 16).unwrap()));
    b_mem.write_at(0, &[0xbb; 1 << 16]).unwrap();
    let grant = |access| Grant {
        memory: b_mem.clone() as Arc<dyn RegionMemory>,
        offset: 4096,
        len: 4096,
        access,
        tenant: "beta".into(),
        request_id: "b-1".into(),
    };
    let body = |n: usize| futures::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0xaa; n]))]);
    // A descriptor issued for B's request, used as intended while it lives.
    let exp = owner.expose(grant(Access::RemoteRead)).unwrap();
    let token: Token = exp.token;
    use futures::TryStreamExt;
    let read: Vec<bytes::Bytes> = remote.read_stream(&token, 4096).try_collect().await.unwrap();
    assert_eq!(read.concat(), vec![0xbb; 4096]);
    // Wrong direction: a read grant cannot be written through. The
    // connection posts small WRITEs (this owner's requesters wait on their
    // windows), so the refusal may come back only on its next use; it is
    // counted below either way.
    let _posted = remote.write_stream(&token, 10, body(10)).await;
    // Out of its window.
    let past = token.with_transfer(token.addr + 4000, 200);
    assert!(remote.read_stream(&past, 200).try_collect::<Vec<_>>().await.is_err());
    // Forged from a real one.
    let mut forged = token;
    forged.rkey ^= 1;
    assert!(remote.read_stream(&forged, 10).try_collect::<Vec<_>>().await.is_err());
    // The request ends: the descriptor is revoked; replaying it fails.
    drop(exp);
    assert!(remote.read_stream(&token, 10).try_collect::<Vec<_>>().await.is_err());
    let rej = &owner.table().rejections;
    assert_eq!(rej.total(), 4, "every refused access is counted");
    assert_eq!(rej.wrong_direction.load(std::sync::atomic::Ordering::Relaxed), 1, "the WRITE through a read grant");
    let mut after = vec![0u8; 1 << 16];
    b_mem.read_at(0, &mut after).unwrap();
    assert!(after.iter().all(|&x| x == 0xbb), "B's memory untouched");
}

#[tokio::test]
async fn memory_exports_the_agent_cannot_use_change_nothing() {
    let stack = Stack::with(two_tenants());
    let b = victim(&stack).await;
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let session = open_session(&mut grpc, &stack, "alpha", "alpha-shim").await.expect("A's own session");
    let stats = |g: &mut AgentClient<tonic::transport::Channel>, s: String| {
        let mut g = g.clone();
        async move { g.stats(apb::StatsRequest { session_id: s }).await.unwrap().into_inner() }
    };
    let before = stats(&mut grpc, session.clone()).await;
    let register = |export| apb::RegisterRegionRequest { session_id: session.clone(), length: 4096, export };
    // A well-formed DOCA export at this co-located agent: UNSUPPORTED, naming the backend.
    let envelope = sluice_doca::ExportEnvelope {
        kind: sluice_doca::MemoryKind::Host,
        len: 4096,
        host_addr: 0x7f00_0000_0000,
        pci: "0000:3b:00.0".into(),
        descriptor: vec![0xAB; 200],
    }
    .encode()
    .unwrap();
    use apb::register_region_request::Export;
    let st = grpc.register_region(register(Some(Export::DocaExport(envelope)))).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unsupported, "{st:?}");
    assert!(st.message().contains("co-located"), "{}", st.message());
    // Garbage in the DOCA field, a made-up ticket, and no export at all.
    let st = grpc.register_region(register(Some(Export::DocaExport(vec![1, 2, 3])))).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unsupported, "{st:?}");
    let st = grpc.register_region(register(Some(Export::ColocatedTicket("f".repeat(32))))).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::BadRequest, "{st:?}");
    let st = grpc.register_region(register(None)).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::BadRequest, "{st:?}");
    let after = stats(&mut grpc, session.clone()).await;
    assert_eq!((after.regions, after.registered_bytes), (before.regions, before.registered_bytes));

    // Through the shim: a descriptor that is not a dma-buf is refused as a GPU region.
    let a = stack.client().await;
    let memfd = sluice_shm::MappedRegion::create("not-gpu", 4096).unwrap();
    use std::os::fd::AsFd;
    let e = a.register_dmabuf(memfd.fd().as_fd(), 0, 4096, 0x1000).await.unwrap_err();
    assert_eq!(code(e), Code::BadRequest);
    b.unharmed(&stack).await;
}

#[tokio::test]
async fn a_session_id_is_honoured_only_from_where_it_was_opened() {
    let stack = Stack::with(two_tenants());
    // Open over TCP (origin 127.0.0.1)...
    let mut tcp = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let session = open_session(&mut tcp, &stack, "alpha", "alpha-shim").await.expect("A's own session");
    tcp.stats(apb::StatsRequest { session_id: session.clone() }).await.expect("usable where it was opened");
    // ...then present the id over the agent's Unix socket: refused and counted.
    let sock = stack.dir.path().join("agent.sock");
    let channel = tonic::transport::Endpoint::from_static("http://agent.local")
        .connect_with_connector(tower::service_fn(move |_| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(sock).await?))
            }
        }))
        .await
        .unwrap();
    let mut unix = AgentClient::new(channel);
    let st = unix.stats(apb::StatsRequest { session_id: session.clone() }).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert!(st.message().contains("another origin"), "{}", st.message());
    let get = apb::GetRequest {
        session_id: session.clone(),
        request_id: "replay".into(),
        namespace: "data".into(),
        key: "x".into(),
        range: None,
        region_id: "r".into(),
        offset: 0,
        timeout_ms: 0,
        ..Default::default()
    };
    assert_eq!(sluice_agent_code(&unix.get(get).await.unwrap_err()), Code::Unauthenticated);
    let close = apb::CloseSessionRequest { session_id: session.clone() };
    assert_eq!(sluice_agent_code(&unix.close_session(close).await.unwrap_err()), Code::Unauthenticated);
    // On a GetStream too: every GET is checked against where it came from.
    let item = apb::GetItem { namespace: "data".into(), key: "x".into(), region_id: "r".into(), ..Default::default() };
    let streamed = apb::StreamedGet { index: 7, session_id: session.clone(), item: Some(item) };
    let msg = apb::GetStreamRequest { gets: vec![streamed], cancel: vec![] };
    let mut answers = unix.get_stream(futures::stream::iter([msg])).await.unwrap().into_inner();
    match answers.message().await.unwrap().and_then(|m| m.result) {
        Some(apb::get_many_item::Result::Error(d)) => assert_eq!(d.code, Code::Unauthenticated as i32, "{d:?}"),
        other => panic!("a session used from another origin on a stream: {other:?}"),
    }
    // Framed GETs on the Unix socket (no HTTP/2) are checked the same way.
    let framed = tokio::net::UnixStream::connect(stack.dir.path().join("agent.sock")).await.unwrap();
    assert_eq!(framed_get(framed, &session).await, Code::Unauthenticated as i32);
    assert_eq!(stack.metric("sluice_agent_auth_failures_total", &["reason=\"origin_mismatch\""]), 5.0);
    // On TCP, framed GETs carry the connection's origin: the session opened
    // from 127.0.0.1 passes the check there (its GET fails on its region)...
    let framed = tokio::net::TcpStream::connect(stack.grpc_addr).await.unwrap();
    assert_eq!(framed_get(framed, &session).await, Code::UnknownRegion as i32, "the session's own origin");
    // ...and one opened over the Unix socket is refused there.
    let unix_session = open_session(&mut unix, &stack, "alpha", "alpha-shim").await.expect("a session over Unix");
    let framed = tokio::net::TcpStream::connect(stack.grpc_addr).await.unwrap();
    assert_eq!(framed_get(framed, &unix_session).await, Code::Unauthenticated as i32);
    assert_eq!(stack.metric("sluice_agent_auth_failures_total", &["reason=\"origin_mismatch\""]), 6.0);
    // Still alive and usable from its origin.
    tcp.stats(apb::StatsRequest { session_id: session }).await.expect("still usable where it was opened");
}

/// The code of the answer to one framed GET under `session` (of a region
/// that does not exist) on `conn`, a new connection to the agent.
async fn framed_get(mut conn: impl AsyncReadExt + AsyncWriteExt + Unpin, session: &str) -> i32 {
    conn.write_all(PREFACE).await.unwrap();
    conn.flush().await.unwrap(); // over TLS a write may wait in the session until flushed
    let mut ack = [0u8; PREFACE.len()];
    conn.read_exact(&mut ack).await.unwrap();
    assert_eq!(&ack, PREFACE);
    let item = apb::GetItem { namespace: "data".into(), key: "x".into(), region_id: "r".into(), ..Default::default() };
    let streamed = apb::StreamedGet { index: 8, session_id: session.into(), item: Some(item) };
    let mut frame = Vec::new();
    push_gets(&mut frame, &apb::GetStreamRequest { gets: vec![streamed], cancel: vec![] });
    conn.write_all(&frame).await.unwrap();
    conn.flush().await.unwrap();
    match FrameReader::new(&mut conn).next().await.unwrap() {
        Some(Frame::Answer(apb::GetManyItem { index: 8, result: Some(apb::get_many_item::Result::Error(d)) })) => {
            d.code
        }
        other => panic!("a framed GET of a region that is not there: {other:?}"),
    }
}

/// Over mutual TLS a session is bound to the certificate it was opened
/// with as well as the address: another tenant's valid certificate (same
/// CA, same address) presenting it is refused, on a call and on a framed
/// GET; the opener's certificate passes on both.
#[tokio::test]
async fn over_tls_a_session_presented_under_another_certificate_is_refused_framed_or_called() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stack = Stack::with(Options { tls: true, grpc_over_tcp: true, ..Default::default() });
    let pem = |f: &str| std::fs::read(stack.dir.path().join("tls").join(f)).unwrap();
    let client = |who: &str| {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem("ca.crt")))
            .identity(tonic::transport::Identity::from_pem(
                pem(&format!("shim-{who}.crt")),
                pem(&format!("shim-{who}.key")),
            ));
        let at = tonic::transport::Endpoint::from_shared(format!("https://{}", stack.grpc_addr)).unwrap();
        AgentClient::new(at.tls_config(tls).unwrap().connect_lazy())
    };
    let (mut alpha, mut beta) = (client("alpha"), client("beta"));
    let session = open_session(&mut alpha, &stack, "alpha", "alpha-shim").await.expect("alpha, its own certificate");
    let st = beta.stats(apb::StatsRequest { session_id: session.clone() }).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert_eq!(framed_get(framed_tls(&stack, "beta").await, &session).await, Code::Unauthenticated as i32);
    // Its own certificate passes the check (the GET fails on its region).
    assert_eq!(framed_get(framed_tls(&stack, "alpha").await, &session).await, Code::UnknownRegion as i32);
    let refused = ["tenant=\"alpha\"", "reason=\"origin_mismatch\""];
    assert_eq!(stack.metric("sluice_agent_auth_failures_total", &refused), 2.0);
    alpha.stats(apb::StatsRequest { session_id: session }).await.expect("still usable under its own certificate");
}

/// A framed-GETs connection over TLS to the stack's agent with shim
/// `who`'s certificate (`sluice certs`' files in `<dir>/tls`).
async fn framed_tls(stack: &Stack, who: &str) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let dir = stack.dir.path().join("tls");
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(dir.join("ca.crt")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(dir.join(format!("shim-{who}.crt"))).unwrap().map(Result::unwrap);
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("shim-{who}.key"))).unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain.collect(), key)
        .unwrap();
    cfg.alpn_protocols = vec![sluice_proto::framed_gets::ALPN.to_vec()];
    let tcp = tokio::net::TcpStream::connect(stack.grpc_addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap();
    assert_eq!(conn.get_ref().1.alpn_protocol(), Some(sluice_proto::framed_gets::ALPN), "framed GETs chosen");
    conn
}

/// Two free TCP ports on the loopback.
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// Identity from the wire: with `[tenants.nic]`, each tenant has a listener
/// of its own (on a BlueField only its host functions reach it: the NIC
/// rules), a listener opens sessions for its tenant only, a session is
/// honoured only where it was opened, and the tenant is served nowhere
/// else. Tenant A's secret on B's listener is refused and counted.
#[tokio::test]
async fn a_tenants_own_listener_names_the_tenant() {
    let (pa, pb) = free_ports();
    let nic = "\n[nic]\nbridge = \"br-test\"\nprogram_ovs = false\nuplinks = [\"up0\"]\nagent_port = \"ag0\"\n\
               agent_address = \"127.0.0.1\"\nstorage = [\"10.20.0.0/16\"]\n";
    let tenant_nic = |f: &str, addr: &str, port: u16| {
        let mac = if f.ends_with('a') { "02:00:00:00:00:0a" } else { "02:00:00:00:00:0b" };
        format!(
            "[tenants.nic]\nfunctions = [{{ port = \"{f}\", mac = \"{mac}\", addresses = [\"{addr}\"] }}]\n\
             listener_port = {port}\n"
        )
    };
    let stack = Stack::with(Options {
        agent_qos: nic.into(),
        alpha: tenant_nic("vfa", "127.0.0.2", pa),
        beta: tenant_nic("vfb", "127.0.0.3", pb),
        shim_agent: Some(format!("http://127.0.0.1:{pa}")),
        ..Default::default()
    });
    assert!(stack.log("sluice-agent").contains("NIC rules not programmed"), "program_ovs = false is honoured");
    // A's shim, through A's listener, end to end.
    let c = stack.client().await;
    assert_eq!(c.tenant(), "alpha");
    let data = pattern(100_000, 5);
    upload(&c, "data/wire/x", &data).await;
    let r = c.register(data.len() as u64).await.unwrap();
    c.get("data/wire/x", &r, 0, None).await.unwrap();
    assert_eq!(sha256(r.as_slice()), sha256(&data));

    let mut a_listener = AgentClient::connect(format!("http://127.0.0.1:{pa}")).await.unwrap();
    let mut b_listener = AgentClient::connect(format!("http://127.0.0.1:{pb}")).await.unwrap();
    let session = open_session(&mut a_listener, &stack, "alpha", "alpha-shim").await.expect("A on its own listener");
    // A's secret on B's listener (a shim with A's secret on B's function).
    let st = open_session(&mut b_listener, &stack, "alpha", "alpha-shim").await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert!(st.message().contains("serves tenant \"beta\" only"), "{}", st.message());
    // A's session presented on B's listener, as a call and as a framed GET;
    // on A's own listener a framed GET passes the check (its region is
    // not there).
    let st = b_listener.stats(apb::StatsRequest { session_id: session.clone() }).await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    let on_b = tokio::net::TcpStream::connect(("127.0.0.1", pb)).await.unwrap();
    assert_eq!(framed_get(on_b, &session).await, Code::Unauthenticated as i32);
    let on_a = tokio::net::TcpStream::connect(("127.0.0.1", pa)).await.unwrap();
    assert_eq!(framed_get(on_a, &session).await, Code::UnknownRegion as i32);
    // A anywhere but its own listener: the agent's general TCP listener.
    let mut general = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let st = open_session(&mut general, &stack, "alpha", "alpha-shim").await.unwrap_err();
    assert_eq!(sluice_agent_code(&st), Code::Unauthenticated, "{st:?}");
    assert_eq!(stack.metric("sluice_agent_auth_failures_total", &["tenant=\"alpha\"", "reason=\"listener\""]), 2.0);
    assert_eq!(stack.metric("sluice_agent_auth_failures_total", &["reason=\"origin_mismatch\""]), 2.0);
    // B on its own listener; A's session still fine on A's.
    open_session(&mut b_listener, &stack, "beta", "beta-shim").await.expect("B on its own listener");
    a_listener.stats(apb::StatsRequest { session_id: session }).await.expect("A's session where it was opened");
}

#[tokio::test]
async fn batch_items_with_their_own_context_are_still_the_sessions() {
    // What the shim's coalesced GETs rely on: the agent says it honours an
    // item's own request id and deadline, does so, and still checks every
    // item against the session (another tenant's region stays refused).
    let stack = Stack::with(two_tenants());
    let a = stack.client().await;
    upload(&a, "data/ctx", &pattern(5000, 3)).await;
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let secret = auth::read_secret_file(&stack.dir.path().join("alpha.shim-secret")).unwrap();
    let epoch = agent_epoch(&mut grpc).await;
    let opened = grpc
        .open_session(session_request(&secret, "alpha", "alpha-shim", &epoch, auth::now_ms()))
        .await
        .unwrap()
        .into_inner();
    assert!(opened.item_contexts, "the agent says items may carry their own context");
    let session = opened.session_id;
    let (mine, memory) = agent_region(&stack, &mut grpc, &session, &[0u8; 16384]).await;
    let b_session = open_session(&mut grpc, &stack, "beta", "beta-shim").await.unwrap();
    let (theirs, their_memory) = agent_region(&stack, &mut grpc, &b_session, &pattern(4096, 5)).await;
    let item = |offset: u64, region: &str, request_id: &str, timeout_ms: u32| apb::GetItem {
        namespace: "data".into(),
        key: "ctx".into(),
        region_id: region.into(),
        offset,
        request_id: request_id.into(),
        timeout_ms,
        ..Default::default()
    };
    let batch = apb::GetManyRequest {
        session_id: session.clone(),
        request_id: "batch".into(),
        timeout_ms: 0,
        items: vec![item(0, &mine, "own-0", 5000), item(8192, &mine, "", 0), item(0, &theirs, "own-2", 5000)],
    };
    let mut stream = grpc.get_many(batch).await.unwrap().into_inner();
    let mut ids = std::collections::BTreeMap::new();
    while let Some(m) = stream.message().await.unwrap() {
        let id = match m.result {
            Some(apb::get_many_item::Result::Ok(r)) => r.report.unwrap().request_id,
            Some(apb::get_many_item::Result::Error(d)) => {
                assert_eq!(d.code, Code::UnknownRegion as i32, "{d:?}");
                "refused".to_owned()
            }
            None => panic!("an item without a result"),
        };
        ids.insert(m.index, id);
    }
    assert_eq!(ids.get(&0).map(String::as_str), Some("own-0"), "{ids:?}");
    assert_eq!(ids.get(&1).map(String::as_str), Some("batch.1"), "{ids:?}");
    assert_eq!(ids.get(&2).map(String::as_str), Some("refused"), "{ids:?}");
    assert_eq!(&memory.as_slice()[..5000], &pattern(5000, 3)[..]);
    assert_eq!(&memory.as_slice()[8192..13192], &pattern(5000, 3)[..]);
    assert_eq!(their_memory.as_slice(), &pattern(4096, 5)[..], "the other tenant's region is untouched");
}

/// A gRPC message full of empty repeated entries (2 bytes each on the wire,
/// hundreds decoded) is refused before it is decoded, whoever sends it: no
/// session is needed to reach the decoder.
#[tokio::test]
async fn a_grpc_message_of_empty_entries_is_refused_undecoded() {
    let stack = Stack::start();
    let agent = stack.pid("sluice-agent").unwrap();
    let before = sluice_tests::peak_rss_kib(agent);
    let mut grpc = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let flood = apb::GetManyRequest { items: vec![apb::GetItem::default(); 400_000], ..Default::default() };
    let st = grpc.get_many(flood).await.map(|_| ()).unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("refused undecoded"), "{st:?}");
    let grew = sluice_tests::peak_rss_kib(agent) - before;
    assert!(grew < 24 << 10, "the agent's peak memory grew by {grew} KiB for an 800 KB message");
}
