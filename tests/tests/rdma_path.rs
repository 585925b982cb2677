//! S3 over RDMA end to end with the `tcp` transport: shim -> agent ->
//! gateway, the store WRITEs into / READs from the host region itself.
//! Bytes are checked against the store's files and boto3.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::Client;
use sluice_tests::{boto3, pattern, sha256, Options, Stack};

fn rdma(extra: &str) -> Options {
    Options { data_ns: format!("data_path = \"rdma\"\n{extra}"), ..Default::default() }
}

async fn put(c: &Client, path: &str, data: &[u8]) -> sluice_client::Transfer {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    let t = c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
    t
}

async fn get(c: &Client, path: &str, size: usize) -> (Vec<u8>, sluice_client::Transfer) {
    let r = c.register(size.max(1) as u64).await.unwrap();
    let t = c.get(path, &r, 0, None).await.unwrap();
    assert_eq!(t.bytes, size as u64);
    let out = r.as_slice()[..size].to_vec();
    c.release(r).await.unwrap();
    (out, t)
}

#[tokio::test]
async fn direct_placement_get_put_ranges_and_empty_objects() {
    let stack = Stack::with(rdma(""));
    let c = stack.client().await;
    let gw = stack.gateway_addr.unwrap();
    for (i, n) in [1usize, 4096, (3 << 20) + 5, (7 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 500 + i as u64);
        let key = format!("rdma/obj-{n}");
        let t = put(&c, &format!("data/{key}"), &data).await;
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "PUT {n}");
        assert_eq!(sha256(&std::fs::read(stack.stored_file("data", &key)).unwrap()), sha256(&data));
        assert_eq!(boto3(gw, &["sha256", "data", &key]), format!("{} {n}", sha256(&data)));
        let (back, t) = get(&c, &format!("data/{key}"), n).await;
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "GET {n}");
        assert_eq!(sha256(&back), sha256(&data), "GET {n}");
    }
    // Ranges land at the right offset, nothing outside them changes.
    let data = pattern((3 << 20) + 5, 9);
    put(&c, "data/rdma/ranged", &data).await;
    let r = c.register(4 << 20).await.unwrap();
    for (start, len) in
        [(0u64, Some(1u64)), (5, Some(100)), ((1 << 20) - 1, Some((2 << 20) + 7)), ((3 << 20) + 1, None)]
    {
        r.write_at(0, &vec![0xEE; 4 << 20]).unwrap();
        let t = c.get("data/rdma/ranged", &r, 777, Some((start, len))).await.unwrap();
        let end = len.map_or(data.len() as u64, |l| (start + l).min(data.len() as u64));
        assert_eq!(t.bytes, end - start);
        assert_eq!(t.data_path, "rdma");
        assert_eq!(&r.as_slice()[777..777 + t.bytes as usize], &data[start as usize..end as usize]);
        assert!(r.as_slice()[..777].iter().all(|&b| b == 0xEE));
        assert_eq!(r.as_slice()[777 + t.bytes as usize], 0xEE);
    }
    // The agent learned that the gateway checks the size first, so its GETs
    // went without a HEAD; a region too small for the object then still
    // gets REGION_TOO_SMALL with nothing written, and so does another
    // version.
    let log = stack.log("sluice-agent");
    assert!(log.contains("checks x-sluice-rdma-object-max before moving bytes"), "{log}");
    assert!(!log.contains("first part fell back"), "{log}");
    let small = c.register(4096).await.unwrap();
    small.write_at(0, &[0xEE; 4096]).unwrap();
    for _ in 0..2 {
        let e = c.get("data/rdma/ranged", &small, 0, None).await.unwrap_err();
        assert_eq!(e.code(), Some(sluice_client::Code::RegionTooSmall), "{e}");
        let e = c.get_pinned("data/rdma/obj-4096", small.id(), 0, None, "\"another\"").await.unwrap_err();
        assert_eq!(e.code(), Some(sluice_client::Code::PreconditionFailed), "{e}");
    }
    assert!(small.as_slice().iter().all(|&b| b == 0xEE), "nothing was written");
    // 0-byte objects: nothing to move, no fallback.
    let t = put(&c, "data/rdma/empty", b"").await;
    assert_eq!(t.bytes, 0);
    assert!(t.fallback_reason.is_empty());
    assert_eq!(std::fs::metadata(stack.stored_file("data", "rdma/empty")).unwrap().len(), 0);
    let (_, t) = get(&c, "data/rdma/empty", 0).await;
    assert!(t.fallback_reason.is_empty());
    assert_eq!(stack.metric("sluice_agent_fallbacks_total", &[]), 0.0);
    assert!(stack.metric("sluice_agent_bytes_total", &["data_path=\"rdma\"", "op=\"get\""]) > 10e6);
}

#[tokio::test]
async fn auto_mode_mixes_http_and_rdma_parts_in_one_multipart_upload() {
    let stack =
        Stack::with(Options { data_ns: "data_path = \"auto\"\nrdma_min_bytes = 1048576".into(), ..Default::default() });
    let c = stack.client().await;
    // Parts of 5 MiB, 5 MiB and 0.5 MiB: the last is below rdma_min_bytes.
    let data = pattern((10 << 20) + 500_000, 31);
    let t = put(&c, "data/auto/mixed", &data).await;
    assert_eq!(t.parts, 3);
    assert_eq!(t.data_path, "rdma");
    assert!(t.fallback_reason.is_empty());
    assert_eq!(sha256(&std::fs::read(stack.stored_file("data", "auto/mixed")).unwrap()), sha256(&data));
    // GET: the first 1 MiB part over HTTP learns the size, the 1 MiB parts
    // after it go over RDMA, the short tail over HTTP.
    let (back, t) = get(&c, "data/auto/mixed", data.len()).await;
    assert_eq!(sha256(&back), sha256(&data));
    assert_eq!(t.data_path, "rdma");
    // Small objects stay on HTTP.
    put(&c, "data/auto/small", b"tiny").await;
    let (back, t) = get(&c, "data/auto/small", 4).await;
    assert_eq!((back.as_slice(), t.data_path), (&b"tiny"[..], "http"));
}

#[tokio::test]
async fn staged_placement() {
    let stack = Stack::with(rdma("placement = \"staged\""));
    let c = stack.client().await;
    let data = pattern((2 << 20) + 11, 4);
    let t = put(&c, "data/staged", &data).await;
    assert_eq!(t.data_path, "rdma-staged");
    let (back, t) = get(&c, "data/staged", data.len()).await;
    assert_eq!(t.data_path, "rdma-staged");
    assert_eq!(sha256(&back), sha256(&data));
}

#[tokio::test]
async fn fallback_to_http_is_loud_and_correct() {
    // A gateway that does not serve the tcp transport answers 501.
    let stack = Stack::with(Options { gateway_rdma: "tcp = false".into(), ..rdma("") });
    let c = stack.client().await;
    let data = pattern((3 << 20) + 1, 8);
    let t = put(&c, "data/fb", &data).await;
    assert_eq!(t.data_path, "http");
    assert!(t.fallback_reason.contains("declined"), "{}", t.fallback_reason);
    assert_eq!(sha256(&std::fs::read(stack.stored_file("data", "fb")).unwrap()), sha256(&data));
    let (back, t) = get(&c, "data/fb", data.len()).await;
    assert_eq!(t.data_path, "http");
    assert!(t.fallback_reason.contains("501"), "{}", t.fallback_reason);
    assert_eq!(sha256(&back), sha256(&data));
    assert!(stack.metric("sluice_agent_fallbacks_total", &["reason=\"declined\"", "op=\"get\""]) >= 1.0);
    assert!(stack.metric("sluice_agent_fallbacks_total", &["reason=\"declined\"", "op=\"put\""]) >= 1.0);
    assert!(c.stats().await.unwrap().fallbacks >= 2);
    assert!(stack.log("sluice-agent").contains("fell back to HTTP"), "a warning is logged");
}

/// A namespace configured for mlx5 DC on a machine without it (here: no
/// RDMA at all, no verbs_listen) moves its bytes over HTTP, and says why on
/// every request: fallback_reason, the counter, and a startup warning.
#[tokio::test]
async fn dc_without_a_device_falls_back_loudly() {
    let stack = Stack::with(Options {
        data_ns: "data_path = \"rdma\"\ntransport = \"dc\"".into(),
        agent_dataplane: "[dataplane.dc]\ndevice = \"mlx5_0\"".into(),
        ..Default::default()
    });
    let c = stack.client().await;
    let data = pattern((1 << 20) + 3, 12);
    let t = put(&c, "data/dc-fb", &data).await;
    assert_eq!(t.data_path, "http");
    assert!(t.fallback_reason.starts_with("dc_unavailable"), "{}", t.fallback_reason);
    assert!(t.fallback_reason.contains("HTTP"), "{}", t.fallback_reason);
    let (back, t) = get(&c, "data/dc-fb", data.len()).await;
    assert_eq!((t.data_path, sha256(&back)), ("http", sha256(&data)));
    assert!(t.fallback_reason.starts_with("dc_unavailable"), "{}", t.fallback_reason);
    for op in ["get", "put"] {
        let n = stack.metric("sluice_agent_fallbacks_total", &["reason=\"dc_unavailable\"", &format!("op=\"{op}\"")]);
        assert_eq!(n, 1.0, "{op}");
    }
    assert!(stack.log("sluice-agent").contains("mlx5 DC is unavailable"), "startup warning");
}

#[tokio::test]
async fn transfers_split_into_bounded_operations() {
    // Operations capped at 64 KiB: every part is many WRITEs/READs.
    let stack = Stack::with(Options { gateway_rdma: "max_op_bytes = 65536".into(), ..rdma("") });
    let c = stack.client().await;
    let data = pattern((2 << 20) + 12345, 12);
    assert_eq!(put(&c, "data/split", &data).await.data_path, "rdma");
    let (back, t) = get(&c, "data/split", data.len()).await;
    assert_eq!(t.data_path, "rdma");
    assert_eq!(sha256(&back), sha256(&data));
}

#[tokio::test]
async fn more_than_one_gib_in_one_part() {
    // One 1.25 GiB RDMA part each way: the gateway splits it at 1 GiB.
    let s3 = "get_part_size = 1610612736\nmultipart_threshold = 2147483648\nput_part_size = 268435456\nmax_concurrency = 4\nmax_attempts = 2\nretry_base_ms = 10\n";
    let stack = Stack::with(Options { s3: s3.into(), ..rdma("") });
    let c = stack.client().await;
    let n = (1usize << 30) + (256 << 20) + 1;
    let data = pattern(n, 77);
    let t = put(&c, "data/huge", &data).await;
    assert_eq!(t.data_path, "rdma");
    assert_eq!(t.parts, 1, "one PUT of 1.25 GiB");
    let r = c.register(n as u64).await.unwrap();
    let t = c.get("data/huge", &r, 0, None).await.unwrap();
    assert_eq!((t.bytes, t.data_path, t.parts), (n as u64, "rdma", 1));
    assert!(r.as_slice() == &data[..], "1.25 GiB byte-exact");
}

#[tokio::test]
async fn concurrent_clients_over_rdma() {
    let stack = Stack::with(rdma(""));
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let socket = stack.socket.clone();
        tasks.push(tokio::spawn(async move {
            let c = Client::connect(&socket).await.unwrap();
            for j in 0..3u64 {
                let data = pattern(1_500_000 + j as usize, w * 10 + j);
                let path = format!("data/cc/{w}-{j}");
                assert_eq!(put(&c, &path, &data).await.data_path, "rdma");
                let (back, t) = get(&c, &path, data.len()).await;
                assert_eq!(t.data_path, "rdma");
                assert_eq!(back, data);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
