//! What is particular to third-party S3 servers that verify SigV4 (s3s-fs
//! and moto; `sluice_tests::stores`): torn reads against a store that
//! ignores If-Match, a wrong secret, and our gateway lending a community
//! store an RDMA data path. Every operation runs against each store in
//! `operations.rs`.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::Code;
use sluice_tests::stores::{start_s3s_fs, StoreKind, StoreUnderTest};
use sluice_tests::{pattern, sha256, Options, Stack, ACCESS_KEY, SECRET_KEY};

/// s3s-fs ignores If-Match on GET: the agent's own check of every part's
/// ETag and size is what keeps a racing writer from tearing a read. (The
/// versions differ in size: s3s-fs reads an object's ETag apart from its
/// file, so a reply can carry one version's bytes under the next one's
/// ETag, which no client can see through; the size in Content-Range comes
/// from the file itself. The gateway binds the two, see torn_reads.rs.)
#[tokio::test]
async fn no_torn_reads_against_a_store_that_ignores_if_match() {
    let s = StoreUnderTest::start(StoreKind::S3sFs);
    let (whole, refused) =
        sluice_tests::race_reads(&s.stack, "data/race/s3s-fs", [16 << 20, (16 << 20) + 4096], 12).await;
    assert_eq!(whole + refused, 12);
}

/// The agent signing with a secret the store does not know is refused, and
/// says so (ACCESS_DENIED), not a hang or a retry storm.
#[tokio::test]
async fn a_wrong_secret_is_refused_by_moto() {
    let moto = sluice_tests::moto::start();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://127.0.0.1:{}", moto.port)],
        agent_credentials: (moto.access_key.clone(), "not-the-secret".into()),
        gateway: false,
        ..Default::default()
    });
    let c = stack.client().await;
    let e = c.head("data/anything").await.unwrap_err();
    assert_eq!(e.code(), Some(Code::AccessDenied), "{e}");
}

#[tokio::test]
async fn a_community_store_gains_an_rdma_data_path_through_the_gateway() {
    // s3s-fs knows nothing of RDMA; our gateway in front of it serves the
    // tokens and moves the upstream's bytes one-sidedly.
    let upstream = start_s3s_fs();
    let (root, port) = (&upstream.root, upstream.port);
    let backend = format!(
        "[backend]\nkind = \"upstream\"\nendpoint = \"http://127.0.0.1:{port}\"\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n"
    );
    let stack =
        Stack::with(Options { gateway_backend: backend, data_ns: "data_path = \"rdma\"".into(), ..Default::default() });
    let c = stack.client().await;
    let r = c.register(12 << 20).await.unwrap();
    for (i, n) in [5000usize, (3 << 20) + 1, (11 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 90 + i as u64);
        r.write_at(0, &data).unwrap();
        let t = c.put(&format!("data/up/{n}"), &r, 0, n as u64).await.unwrap();
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "{}", stack.log("sluice-gateway"));
        let on_disk = std::fs::read(root.path().join("data").join(format!("up/{n}"))).unwrap();
        assert_eq!(sha256(&on_disk), sha256(&data), "stored in the upstream");
        r.write_at(0, &vec![0; n]).unwrap();
        let g = c.get(&format!("data/up/{n}"), &r, 0, None).await.unwrap();
        assert_eq!((g.bytes, g.data_path), (n as u64, "rdma"));
        assert_eq!(sha256(&r.as_slice()[..n]), sha256(&data));
    }
    assert_eq!(c.list_all("data/up/").await.unwrap().len(), 3);
    assert!(!stack.stored_file("data", "up/5000").exists(), "nothing landed in the gateway's own directory");
}
