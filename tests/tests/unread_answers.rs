//! A shim that stops reading the agent's answers holds up only itself: its
//! GETs run to their end (they do not stop mid-transfer holding the fair
//! scheduler's slots, which every tenant shares) and its answers wait for
//! it. Also: a batch's request ids are bounded before anything is made per
//! item.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::time::Duration;

use sluice_client::{Client, Code};
use sluice_proto::agent as apb;
use sluice_proto::agent::agent_client::AgentClient;
use sluice_tests::{pattern, sha256, Options, Stack};

#[path = "common/agent_direct.rs"]
mod agent_direct;
use agent_direct::{agent_region, open_session, sluice_agent_code};

const OBJECT: usize = 1 << 20;
const ITEMS: usize = 16;

#[tokio::test]
async fn a_batch_nobody_reads_holds_no_slot_another_tenant_needs() {
    let stack = Stack::with(Options {
        beta_shim: true,
        // Two transfers at once across all tenants; a third waits at most 3 s.
        agent_qos: "global_slots = 2\nqueue_timeout_ms = 3000\n".into(),
        ..Default::default()
    });
    let a = stack.client().await;
    let data = pattern(OBJECT, 5);
    let r = a.register(OBJECT as u64).await.unwrap();
    r.write_at(0, &data).unwrap();
    a.put("data/unread/obj", &r, 0, OBJECT as u64).await.unwrap();
    let b = Client::connect(&stack.beta_socket).await.unwrap();
    let secret = pattern(300_000, 6);
    let rb = b.register(secret.len() as u64).await.unwrap();
    rb.write_at(0, &secret).unwrap();
    b.put("other/mine", &rb, 0, secret.len() as u64).await.unwrap();

    // A peer whose stream window is one byte and which never reads: after
    // the first answer's first byte, nothing more can be sent to it.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", stack.grpc_addr))
        .unwrap()
        .initial_stream_window_size(Some(1))
        .connect()
        .await
        .unwrap();
    let mut grpc = AgentClient::new(channel);
    let session = open_session(&mut grpc, &stack, "alpha", "alpha-shim").await.expect("a session");
    let (region, memory) = agent_region(&stack, &mut grpc, &session, &vec![0u8; OBJECT * ITEMS]).await;
    let items = (0..ITEMS)
        .map(|i| apb::GetItem {
            namespace: "data".into(),
            key: "unread/obj".into(),
            region_id: region.clone(),
            offset: (i * OBJECT) as u64,
            ..Default::default()
        })
        .collect();
    let batch = apb::GetManyRequest { session_id: session.clone(), request_id: "unread".into(), timeout_ms: 0, items };
    let mut answers = grpc.get_many(batch).await.expect("the batch is taken").into_inner();

    // Every item lands although no answer is read.
    let t0 = std::time::Instant::now();
    while (0..ITEMS).any(|i| sha256(&memory.as_slice()[i * OBJECT..(i + 1) * OBJECT]) != sha256(&data)) {
        assert!(t0.elapsed() < Duration::from_secs(30), "the batch's items stopped while its answers went unread");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another tenant gets its transfer slots.
    for _ in 0..4 {
        let got = b.register(secret.len() as u64).await.unwrap();
        b.get("other/mine", &got, 0, None).await.expect("beta is served beside an unread batch");
        assert_eq!(sha256(&got.as_slice()[..secret.len()]), sha256(&secret));
        b.release(got).await.unwrap();
    }
    // The answers were kept for the peer: all of them, each once.
    let mut seen = std::collections::HashSet::new();
    while let Some(m) = answers.message().await.expect("stream") {
        assert!(matches!(m.result, Some(apb::get_many_item::Result::Ok(_))), "{m:?}");
        assert!(seen.insert(m.index), "answered twice: {}", m.index);
    }
    assert_eq!(seen.len(), ITEMS);

    // A batch whose request id is longer than any a shim sends is refused
    // before it starts.
    let long = apb::GetManyRequest {
        session_id: session,
        request_id: "x".repeat(300),
        timeout_ms: 0,
        items: vec![apb::GetItem {
            namespace: "data".into(),
            key: "unread/obj".into(),
            region_id: region,
            ..Default::default()
        }],
    };
    let mut plain = AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
    let st = plain.get_many(long).await.expect_err("refused");
    assert_eq!(sluice_agent_code(&st), Code::BadRequest, "{st:?}");
    sluice_tests::report(&format!(
        "unread answers: {ITEMS} x 1 MiB landed in {} ms with no answer read; beta served 4 GETs beside it",
        t0.elapsed().as_millis()
    ));
}
