//! Verbs tests on a real device: run inside the Soft-RoCE VM
//! (`scripts/rxe-vm`, see scripts/test). With the `rxe` feature on and no
//! device they fail; they never skip.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use sluice_rdma::{
    devices, Access, Buffer, CompletionQueue, Context, Listener, MemoryRegion, ProtectionDomain, QueuePair, RdmaError,
};

fn device() -> String {
    std::env::var("SLUICE_RXE_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

fn ip() -> Ipv4Addr {
    std::env::var("SLUICE_RXE_ADDR").ok().and_then(|a| a.parse().ok()).unwrap_or(Ipv4Addr::new(10, 0, 2, 15))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// An owner (listener side) with one registered region, and a connected
/// remote queue pair.
struct Pair {
    _listener: Arc<Listener>,
    owner_buf: Arc<Buffer>,
    owner_mr: Arc<MemoryRegion>,
    _owner_qp: QueuePair,
    qp: QueuePair,
}

async fn pair(len: usize) -> Pair {
    let listener = Arc::new(Listener::bind(SocketAddrV4::new(ip(), 0)).expect("rdma_cm listen (is rxe0 up?)"));
    let port = listener.port();
    let owner_buf = Buffer::zeroed(len);
    let owner_mr =
        MemoryRegion::register(listener.pd(), owner_buf.clone(), Access::REMOTE_ALL).expect("register owner MR");
    let l = listener.clone();
    let accept = tokio::spawn(async move { l.accept().await });
    let qp = QueuePair::connect(SocketAddrV4::new(ip(), port)).await.expect("rdma_cm connect");
    let owner_qp = tokio::time::timeout(Duration::from_secs(20), accept)
        .await
        .expect("accept in time")
        .expect("join")
        .expect("accept");
    Pair { _listener: listener, owner_buf, owner_mr, _owner_qp: owner_qp, qp }
}

fn local(qp: &QueuePair, data: &[u8]) -> Arc<MemoryRegion> {
    let b = Buffer::zeroed(data.len());
    b.write_at(0, data).expect("fill local buffer");
    MemoryRegion::register(qp.pd(), b, Access::LOCAL).expect("register local MR")
}

#[test]
fn device_context_pd_mr_cq() {
    let list = devices().expect("the rxe lane needs a verbs device: run via scripts/rxe-vm");
    assert!(list.iter().any(|d| d.name == device()), "{list:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _g = rt.enter();
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let buf = Buffer::zeroed(1 << 20);
    let mr = MemoryRegion::register(&pd, buf, Access::REMOTE_ALL).unwrap();
    assert_ne!(mr.rkey(), 0);
    assert_eq!(mr.len(), 1 << 20);
    let _cq = CompletionQueue::new(&ctx, 64).unwrap();
    assert!(matches!(Context::open("no-such-device"), Err(RdmaError::NoDevice(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_write_and_read() {
    let p = pair(1 << 20).await;
    let data = pattern(300_000, 7);
    let src = local(&p.qp, &data);
    let src =
        p.qp.write(src, 0, data.len() as u32, p.owner_mr.addr() + 4096, p.owner_mr.rkey())
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    let got = p.owner_buf.to_vec();
    assert_eq!(&got[4096..4096 + data.len()], &data[..]);
    assert!(got[..4096].iter().all(|&b| b == 0), "nothing written before the target");
    assert!(got[4096 + data.len()..].iter().all(|&b| b == 0), "nothing written after it");
    drop(src);

    let back = Buffer::zeroed(data.len());
    let dst = MemoryRegion::register(p.qp.pd(), back.clone(), Access::LOCAL).unwrap();
    p.qp.read(dst, 0, data.len() as u32, p.owner_mr.addr() + 4096, p.owner_mr.rkey())
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(back.to_vec(), data, "READ returns what WRITE placed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_lands_in_local_memory() {
    let p = pair(64 << 10).await;
    let data = pattern(50_000, 3);
    p.owner_buf.write_at(100, &data).unwrap();
    let buf = Buffer::zeroed(data.len());
    let mr = MemoryRegion::register(p.qp.pd(), buf.clone(), Access::LOCAL).unwrap();
    p.qp.read(mr, 0, data.len() as u32, p.owner_mr.addr() + 100, p.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
    assert_eq!(buf.to_vec(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rkey_is_an_error_completion() {
    let p = pair(64 << 10).await;
    let src = local(&p.qp, &[9u8; 1000]);
    let (err, _src) =
        p.qp.write(src, 0, 1000, p.owner_mr.addr(), p.owner_mr.rkey() ^ 0x5a5a).await.expect_err("bad rkey must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(p.owner_buf.to_vec().iter().all(|&b| b == 0), "nothing written");
}

/// One protection domain per tenant: tenant A's valid window and rkey,
/// used over tenant B's connection (another listener, another PD), is
/// refused by the device and nothing of A's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkey_of_another_protection_domain_is_refused() {
    let a = pair(64 << 10).await;
    let b = pair(64 << 10).await;
    let src = local(&b.qp, &[7u8; 4096]);
    let (err, _src) =
        b.qp.write(src, 0, 4096, a.owner_mr.addr(), a.owner_mr.rkey())
            .await
            .expect_err("A's rkey must not work over B's connection");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(a.owner_buf.to_vec().iter().all(|&x| x == 0), "nothing of A's written");
    // The same operation over A's own connection works.
    let src = local(&a.qp, &[7u8; 4096]);
    a.qp.write(src, 0, 4096, a.owner_mr.addr(), a.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
    assert_eq!(&a.owner_buf.to_vec()[..4096], &[7u8; 4096][..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_write_past_the_end_is_an_error() {
    let p = pair(64 << 10).await;
    let src = local(&p.qp, &[1u8; 4096]);
    let end = p.owner_mr.addr() + p.owner_mr.len();
    let op = p.qp.write(src, 0, 4096, end - 100, p.owner_mr.rkey());
    let (err, _) = tokio::time::timeout(Duration::from_secs(30), op)
        .await
        .expect("completes")
        .expect_err("past the end must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(p.owner_buf.to_vec().iter().all(|&b| b == 0), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_read_before_the_start_is_an_error() {
    let p = pair(64 << 10).await;
    let dst = local(&p.qp, &[0u8; 10]);
    let op = p.qp.read(dst, 0, 10, p.owner_mr.addr() - 4096, p.owner_mr.rkey());
    let (err, _) = tokio::time::timeout(Duration::from_secs(30), op)
        .await
        .expect("completes")
        .expect_err("before the start must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_bounds_are_checked_before_posting() {
    let p = pair(4096).await;
    let src = local(&p.qp, &[1u8; 100]);
    let (err, src) = p.qp.write(src, 50, 100, p.owner_mr.addr(), p.owner_mr.rkey()).await.expect_err("local overrun");
    assert!(matches!(err, RdmaError::Invalid(_)));
    // The buffer came back and the QP still works.
    p.qp.write(src, 0, 100, p.owner_mr.addr(), p.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_under_load_completes_every_request() {
    let p = pair(1 << 20).await;
    let qp = Arc::new(p.qp);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let qp = qp.clone();
        let (addr, rkey) = (p.owner_mr.addr(), p.owner_mr.rkey());
        let src = local(&qp, &[i as u8; 8192]);
        tasks.push(tokio::spawn(async move { qp.write(src, 0, 8192, addr + (i % 128) * 8192, rkey).await.is_ok() }));
    }
    // Tear the connection down while writes are in flight: each request
    // completes (done, or flushed with an error) instead of hanging.
    qp.close().unwrap();
    let results = tokio::time::timeout(Duration::from_secs(60), futures_join(tasks))
        .await
        .expect("every request completes (no hang)");
    assert_eq!(results.len(), 64);
    let src = local(&qp, &[0u8; 16]);
    let late =
        tokio::time::timeout(Duration::from_secs(30), qp.write(src, 0, 16, p.owner_mr.addr(), p.owner_mr.rkey()))
            .await
            .expect("no hang");
    assert!(late.is_err(), "a closed queue pair accepts no work");
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<bool>>) -> Vec<bool> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or(false));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_on_a_device_without_dc_is_a_clear_error() {
    // Soft-RoCE has no mlx5 DC: creating a DC target must say so.
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    match sluice_rdma::dc::DcTarget::create(&pd, &cq, sluice_rdma::dc::DEFAULT_DC_KEY, 1, 1) {
        Err(RdmaError::Unsupported(msg)) => assert!(msg.contains("Dynamically Connected"), "{msg}"),
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("rxe unexpectedly created a DC target"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_initiator_on_a_device_without_dc_is_a_clear_error() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    match sluice_rdma::dci::DcInitiator::create(&pd, 1, 1, sluice_rdma::dc::DEFAULT_DC_KEY) {
        Err(RdmaError::Unsupported(msg)) => assert!(msg.contains("Dynamically Connected"), "{msg}"),
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("rxe unexpectedly created a DC initiator"),
    }
}

/// What a DC target would put in its token: the port's LID and the RoCE v2
/// GID carrying the device's IPv4 address.
#[test]
fn port_and_gid_table() {
    let ctx = Context::open(&device()).unwrap();
    let port = ctx.port(1).expect("query port 1");
    assert!(port.active, "rxe0 port 1 is not active");
    assert!(port.max_message >= 1 << 20, "max message {}", port.max_message);
    assert!(port.gid_table_len > 0);
    let gids = ctx.gids(1).expect("GID table");
    let picked = sluice_rdma::pick_ipv4_gid(&gids, Some(ip())).expect("a GID for the device's IPv4 address");
    assert_eq!(picked.ipv4(), Some(ip()));
    assert!(picked.roce_v2, "rxe exposes RoCE v2 GIDs: {gids:?}");
    // An address handle to ourselves over that GID can be created.
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let at = sluice_rdma::dc::DcAddress { dct_number: 1, lid: port.lid, gid: Some(picked.gid) };
    sluice_rdma::dci::AddressHandle::create(&pd, &at, 1, picked.index).expect("address handle from a token's address");
}
