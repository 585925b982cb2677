//! Every shim operation end to end through real agent and shim processes,
//! against each S3 store: our gateway, s3s-fs, and moto with signature
//! checks on (`sluice_tests::stores`). Bytes are checked against oracles
//! that do not go through Sluice: boto3 talking to the store with its own
//! keys, and the store's files where it keeps objects as files.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{Client, Code};
use sluice_tests::stores::{StoreKind, StoreUnderTest};
use sluice_tests::{pattern, sha256, Proxy, Stack};

sluice_tests::against_every_store!(
    round_trips_all_sizes_and_checks_with_oracles,
    reads_what_another_client_wrote,
    ranged_gets_land_at_the_requested_offset,
    multipart_put_and_split_get,
    listing_paginates_past_1000_keys,
    concurrent_clients,
    head_delete_stats_and_scoped_prefix,
    ranged_gets_spread_across_endpoints,
);

/// Checks `bucket/key` in the store against `data`, without Sluice.
fn check_stored(s: &StoreUnderTest, bucket: &str, key: &str, data: &[u8]) {
    if let Some(stored) = s.on_disk(bucket, key) {
        assert_eq!(sha256(&stored), sha256(data), "stored bytes of {key}");
    }
    assert_eq!(s.boto3(&["sha256", bucket, key]), format!("{} {}", sha256(data), data.len()), "{key}");
}

async fn put_bytes(c: &Client, path: &str, data: &[u8]) -> sluice_client::Transfer {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    let t = c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
    t
}

async fn get_bytes(c: &Client, path: &str) -> Vec<u8> {
    get_checked(c, path).await.0
}

/// The whole object, and how the read went.
async fn get_checked(c: &Client, path: &str) -> (Vec<u8>, sluice_client::Transfer) {
    let size = c.head(path).await.unwrap().size;
    let r = c.register(size.max(1)).await.unwrap();
    let t = c.get(path, &r, 0, None).await.unwrap();
    assert_eq!(t.bytes, size);
    assert_eq!(t.object_size, size);
    assert_eq!(t.data_path, "http");
    assert!(t.fallback_reason.is_empty());
    let out = r.as_slice()[..size as usize].to_vec();
    c.release(r).await.unwrap();
    (out, t)
}

async fn round_trips_all_sizes_and_checks_with_oracles(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let c = s.stack.client().await;
    assert_eq!(c.tenant(), "alpha");
    // Around the 1 MiB GET part size and the 6 MiB multipart threshold.
    let sizes = [0usize, 1, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (3 << 20) + 5, 6 << 20, (7 << 20) + 3];
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(n, i as u64);
        let key = format!("sizes/obj-{n}");
        let t = put_bytes(&c, &format!("data/{key}"), &data).await;
        assert_eq!(t.bytes, n as u64);
        let expect_parts = if n > 6 << 20 { 2 } else { 1 };
        assert_eq!(t.parts, expect_parts, "size {n}");
        // Every store here confirms what it stored: an echoed checksum or
        // an ETag that is the MD5 of the bytes (of each part's).
        assert!(t.verified, "PUT of {n} bytes: {}", t.unverified_reason);
        check_stored(&s, "data", &key, &data);
        // And back through the shim, checked end to end whether or not the
        // store keeps checksums (RGW 16.2 and moto do not).
        let (back, g) = get_checked(&c, &format!("data/{key}")).await;
        assert_eq!(sha256(&back), sha256(&data), "GET of {key}");
        assert!(g.verified, "GET of {n} bytes: {}", g.unverified_reason);
    }
}

async fn reads_what_another_client_wrote(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let c = s.stack.client().await;
    let data = pattern((2 << 20) + 17, 99);
    let file = s.stack.dir.path().join("src.bin");
    std::fs::write(&file, &data).unwrap();
    s.boto3(&["put", "data", "from-boto3/x.bin", file.to_str().unwrap()]);
    let back = get_bytes(&c, "data/from-boto3/x.bin").await;
    assert_eq!(sha256(&back), sha256(&data));
}

async fn ranged_gets_land_at_the_requested_offset(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let c = s.stack.client().await;
    let n = (3 << 20) + 5;
    let data = pattern(n, 7);
    put_bytes(&c, "data/ranged", &data).await;
    let r = c.register(4 << 20).await.unwrap();
    let cases: [(u64, Option<u64>); 6] = [
        (0, Some(1)),
        (5, Some(100)),
        ((1 << 20) - 1, Some(2)),      // straddles a part boundary
        (12345, Some((2 << 20) + 99)), // several parts
        ((3 << 20) + 1, None),         // tail
        (n as u64 - 1, Some(10)),      // clipped at the end
    ];
    for (start, len) in cases {
        r.write_at(0, &vec![0xAA; 4 << 20]).unwrap();
        let t = c.get("data/ranged", &r, 1000, Some((start, len))).await.unwrap();
        let end = len.map_or(n as u64, |l| (start + l).min(n as u64));
        assert_eq!(t.bytes, end - start, "range {start}+{len:?}");
        assert_eq!(t.object_size, n as u64);
        let got = &r.as_slice()[1000..1000 + t.bytes as usize];
        assert_eq!(got, &data[start as usize..end as usize], "range {start}+{len:?}");
        assert!(r.as_slice()[..1000].iter().all(|&b| b == 0xAA), "bytes before the offset untouched");
        assert_eq!(r.as_slice()[1000 + t.bytes as usize], 0xAA, "byte after the window untouched");
    }
    let e = c.get("data/ranged", &r, 0, Some((n as u64, Some(1)))).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidRange), "{e}");
}

async fn multipart_put_and_split_get(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let c = s.stack.client().await;
    let data = pattern((13 << 20) + 1, 3);
    let t = put_bytes(&c, "data/big/multi.bin", &data).await;
    assert_eq!(t.parts, 3);
    assert!(t.etag.ends_with("-3\""), "multipart etag: {}", t.etag);
    let r = c.register(data.len() as u64).await.unwrap();
    let g = c.get("data/big/multi.bin", &r, 0, None).await.unwrap();
    assert_eq!(g.parts, 14, "1 MiB ranged parts");
    assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(&data));
    check_stored(&s, "data", "big/multi.bin", &data);
}

/// Not against moto: its signature checker re-encodes an already encoded
/// path, so it refuses boto3's own requests for these keys too.
#[tokio::test]
async fn keys_with_spaces_and_unicode_gateway() {
    keys_with_spaces_and_unicode(StoreKind::Gateway).await
}

#[tokio::test]
async fn keys_with_spaces_and_unicode_s3s_fs() {
    keys_with_spaces_and_unicode(StoreKind::S3sFs).await
}

async fn keys_with_spaces_and_unicode(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    assert!(s.takes_any_key());
    let c = s.stack.client().await;
    for (i, key) in [
        "dir with space/file name.bin",
        "ünïcødé/☃ snow.txt",
        "a+b=c&d;e,f@g.txt",
        "percent%20literal",
        "tilde~and'quote",
    ]
    .iter()
    .enumerate()
    {
        let data = pattern(1000 + i, i as u64);
        put_bytes(&c, &format!("data/{key}"), &data).await;
        check_stored(&s, "data", key, &data);
        assert_eq!(get_bytes(&c, &format!("data/{key}")).await, data, "{key}");
        let info = c.head(&format!("data/{key}")).await.unwrap();
        assert_eq!(info.size, data.len() as u64);
        let listed = c.list_all(&format!("data/{key}")).await.unwrap();
        assert_eq!(listed.len(), 1, "{key}");
        assert_eq!(listed[0].key, *key);
    }
}

async fn listing_paginates_past_1000_keys(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let sep = s.separator();
    let c = std::sync::Arc::new(s.stack.client().await);
    let r = std::sync::Arc::new(c.register(64).await.unwrap());
    r.write_at(0, b"x").unwrap();
    use futures::StreamExt;
    let n = 1050;
    futures::stream::iter(0..n)
        .map(|i| {
            let (c, r) = (c.clone(), r.clone());
            async move { c.put(&format!("data/many{sep}k{i:05}"), &r, 0, 1).await.unwrap() }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let all = c.list_all(&format!("data/many{sep}")).await.unwrap();
    assert_eq!(all.len(), n);
    let mut keys: Vec<_> = all.iter().map(|o| o.key.clone()).collect();
    keys.dedup();
    assert_eq!(keys.len(), n, "no duplicates across pages");
    assert_eq!(s.boto3(&["count", "data", &format!("many{sep}")]), n.to_string());
    // Small pages.
    let p1 = c.list_page(&format!("data/many{sep}"), "", 7, "").await.unwrap();
    assert_eq!(p1.objects.len(), 7);
    assert!(!p1.next_continuation_token.is_empty());
    let p2 = c.list_page(&format!("data/many{sep}"), &p1.next_continuation_token, 7, "").await.unwrap();
    assert_eq!(p2.objects[0].key, format!("many{sep}k00007"));
    // Delimiter groups.
    let top = c.list_page("data", "", 0, &sep.to_string()).await.unwrap();
    assert_eq!(top.common_prefixes, vec![format!("many{sep}")]);
}

async fn concurrent_clients(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let sep = s.separator();
    let socket = s.stack.socket.clone();
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let socket = socket.clone();
        tasks.push(tokio::spawn(async move {
            let c = Client::connect(&socket).await.unwrap();
            let r = c.register(1 << 20).await.unwrap();
            for j in 0..4u64 {
                let data = pattern(300_000 + j as usize, w * 100 + j);
                r.write_at(0, &data).unwrap();
                let path = format!("data/conc{sep}{w}/{j}");
                c.put(&path, &r, 0, data.len() as u64).await.unwrap();
                r.write_at(0, &vec![0; data.len()]).unwrap();
                let t = c.get(&path, &r, 0, None).await.unwrap();
                assert_eq!(t.bytes, data.len() as u64);
                assert_eq!(&r.as_slice()[..data.len()], &data[..]);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let c = s.stack.client().await;
    assert_eq!(c.list_all(&format!("data/conc{sep}")).await.unwrap().len(), 32);
}

async fn head_delete_stats_and_scoped_prefix(kind: StoreKind) {
    let s = StoreUnderTest::start(kind);
    let stack = &s.stack;
    let c = stack.client().await;
    put_bytes(&c, "data/h/one", b"hello").await;
    let info = c.head("data/h/one").await.unwrap();
    assert_eq!(info.size, 5);
    assert!(!info.etag.is_empty());
    assert!(info.last_modified_unix_ms > 0);
    c.delete("data/h/one").await.unwrap();
    assert_eq!(c.head("data/h/one").await.unwrap_err().code(), Some(Code::NoSuchKey));
    assert_eq!(s.boto3(&["exists", "data", "h/one"]), "no");
    assert!(s.on_disk("data", "h/one").is_none());

    // A namespace with a key prefix: the tenant never sees the prefix.
    put_bytes(&c, "scoped/x.bin", b"scoped").await;
    check_stored(&s, "data", &format!("{}x.bin", s.scoped_prefix()), b"scoped");
    let listed = c.list_all("scoped").await.unwrap();
    assert_eq!(listed.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), vec!["x.bin"]);

    let s = c.stats().await.unwrap();
    assert!(s.requests >= 5, "{s:?}");
    assert_eq!(s.bytes_written, 11);
    assert_eq!(s.regions, 0, "every region was released");
    assert!(stack.metric("sluice_agent_requests_total", &["op=\"put\"", "tenant=\"alpha\"", "outcome=\"ok\""]) >= 2.0);
    assert!(stack.metric("sluice_agent_bytes_total", &["op=\"put\"", "namespace=\"scoped\""]) == 6.0);
}

async fn ranged_gets_spread_across_endpoints(kind: StoreKind) {
    // Two endpoints (two proxies in front of one store): one large GET must
    // use both.
    let s = StoreUnderTest::start(kind);
    let (p1, p2) = (Proxy::start(s.addr, None), Proxy::start(s.addr, None));
    let stack = Stack::with(sluice_tests::Options {
        endpoints: vec![format!("http://{}", p1.addr), format!("http://{}", p2.addr)],
        agent_credentials: s.keys(),
        gateway: false,
        ..Default::default()
    });
    let c = stack.client().await;
    let data = pattern(6 << 20, 5);
    put_bytes(&c, "data/spread.bin", &data).await;
    let before = (p1.bytes_down(), p2.bytes_down());
    let back = get_bytes(&c, "data/spread.bin").await;
    assert_eq!(sha256(&back), sha256(&data));
    let moved = (p1.bytes_down() - before.0, p2.bytes_down() - before.1);
    assert!(moved.0 > 1 << 20 && moved.1 > 1 << 20, "both endpoints carried data: {moved:?}");
}

#[tokio::test]
async fn shim_reaches_the_agent_over_tcp() {
    // The DPU layout: the agent's control plane on TCP, memory still handed
    // over locally (co-located backend).
    let stack = Stack::with(sluice_tests::Options { grpc_over_tcp: true, ..Default::default() });
    let c = stack.client().await;
    let data = pattern(3 << 20, 77);
    put_bytes(&c, "data/tcp.bin", &data).await;
    assert_eq!(sha256(&get_bytes(&c, "data/tcp.bin").await), sha256(&data));
    assert!(stack.log("sluice-shim").contains("http://127.0.0.1:"), "shim used the TCP address");
}

#[tokio::test]
async fn disconnecting_releases_every_region() {
    let stack = Stack::start();
    let c = stack.client().await;
    let _a = c.register(1 << 20).await.unwrap();
    let _b = c.register(2 << 20).await.unwrap();
    assert_eq!(stack.metric("sluice_agent_regions", &["tenant=\"alpha\""]), 2.0);
    assert_eq!(stack.metric("sluice_agent_registered_bytes", &["tenant=\"alpha\""]), (3 << 20) as f64);
    drop(c);
    let t0 = std::time::Instant::now();
    while stack.metric("sluice_agent_regions", &["tenant=\"alpha\""]) != 0.0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "regions were not released");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(stack.metric("sluice_agent_registered_bytes", &["tenant=\"alpha\""]), 0.0);
    assert_eq!(stack.metric("sluice_agent_sessions", &[]), 0.0);
}
