//! Ceph RGW 16.2 as the store (feature `ceph`; the Ceph lane of
//! scripts/test; `sluice_tests::ceph`): the torn-read, integrity,
//! encryption and get_many test bodies of `torn_reads.rs`, `encryption.rs`
//! and `batch.rs`, with the store's files replaced by boto3 as the oracle
//! (RGW keeps objects in RADOS, not files); RGW behind our gateway over
//! RDMA; a gateway dying or hanging under the agent. The operation and
//! multipart bodies run against RGW from `operations.rs` (`rgw::*`, same
//! feature).
//!
//! Every test but the gateway-failure ones shares the binary's cluster, in
//! a tenant of its own; namespace "data" has both gateways as endpoints.
//! Where RGW differs from S3 (no stored x-amz-checksum-*, an empty ETag from
//! CompleteMultipartUpload, ...; tests/README.md lists them), the
//! assertions are the same as against every other store.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{BatchGet, Client, ClientError, Code};
use sluice_crypt::{FileKeyProvider, KeyId};
use sluice_tests::ceph::{raw_get, raw_put, CephCluster};
use sluice_tests::stores::{StoreKind, StoreUnderTest};
use sluice_tests::{pattern, race_reads, sha256, Options, Proxy};

async fn put_bytes(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

async fn get_bytes(c: &Client, path: &str, len: usize) -> Result<Vec<u8>, ClientError> {
    let r = c.register(len.max(1) as u64).await.unwrap();
    let t = c.get(path, &r, 0, None).await?;
    assert_eq!(t.bytes, len as u64);
    Ok(r.as_slice()[..len].to_vec())
}

fn code(e: ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed error, got {e}"))
}

// ---- torn reads and integrity (torn_reads.rs) ----------------------------

/// `torn_reads.rs::racing_a_writer_over_http`: versions of the same size, so
/// only the ETag tells them apart; parts go to both gateways.
#[tokio::test]
async fn racing_a_writer_over_http() {
    let s = StoreUnderTest::start(StoreKind::Rgw);
    let (whole, refused) = race_reads(&s.stack, "data/race/http", [16 << 20; 2], 12).await;
    assert_eq!(whole + refused, 12);
}

/// `torn_reads.rs::a_byte_flipped_on_the_wire_is_an_integrity_error`,
/// through a proxy in front of gateway 1. RGW 16.2 neither keeps nor
/// returns the CRC64NVME the agent sends, so the agent notices the damage
/// with the CRC it keeps in the object's metadata.
#[tokio::test]
async fn a_byte_flipped_on_the_wire_is_an_integrity_error() {
    let proxy = Proxy::start(CephCluster::shared().endpoints[0], None);
    let s =
        StoreUnderTest::with(StoreKind::Rgw, |o| Options { endpoints: vec![format!("http://{}", proxy.addr)], ..o });
    let c = s.stack.client().await;
    for size in [200_000usize, 4 << 20] {
        let data = pattern(size, size as u64);
        let r = c.register(size as u64).await.unwrap();
        r.write_at(0, &data).unwrap();
        let path = format!("data/crc/{size}");
        c.put(&path, &r, 0, size as u64).await.unwrap();
        r.write_at(0, &vec![0u8; size]).unwrap();
        let t = c.get(&path, &r, 0, None).await.unwrap();
        assert_eq!(sha256(&r.as_slice()[..size]), sha256(&data), "clean read");
        assert!(t.verified, "{size} bytes: {}", t.unverified_reason);
        proxy.flip_byte(size as u64 / 2);
        let e = c.get(&path, &r, 0, None).await.expect_err("a damaged read must not succeed");
        assert_eq!(e.code(), Some(Code::Integrity), "{size} bytes: {e}");
        // Nothing is damaged at rest: the next read is whole.
        c.get(&path, &r, 0, None).await.unwrap();
        assert_eq!(sha256(&r.as_slice()[..size]), sha256(&data));
        c.release(r).await.unwrap();
    }
}

/// A byte flipped in a PUT's body on its way to gateway 1 (a proxy): RGW
/// refuses the body by its Content-MD5 (it ignores x-amz-checksum-*), the
/// agent sends it again, and what RGW stores is the bytes sent — single and
/// multipart alike.
#[tokio::test]
async fn a_byte_flipped_on_the_way_to_rgw_is_refused_and_sent_again() {
    let proxy = Proxy::start(CephCluster::shared().endpoints[0], None);
    let s =
        StoreUnderTest::with(StoreKind::Rgw, |o| Options { endpoints: vec![format!("http://{}", proxy.addr)], ..o });
    let c = s.stack.client().await;
    let keys = s.keys();
    for size in [200_000usize, (7 << 20) + 3] {
        let data = pattern(size, 60 + size as u64);
        let r = c.register(size as u64).await.unwrap();
        r.write_at(0, &data).unwrap();
        let path = format!("data/up-flip/{size}");
        // Past the request's head, into a body.
        proxy.flip_byte_up(4096 + size as u64 / 3);
        let t = c.put(&path, &r, 0, size as u64).await.unwrap();
        assert!(t.verified, "{size} bytes: {}", t.unverified_reason);
        let (stored, _) = raw_get(CephCluster::shared().endpoints[1], (&keys.0, &keys.1), "data", &path[5..]);
        assert_eq!(sha256(&stored), sha256(&data), "{size} bytes: RGW holds the bytes sent");
        assert_eq!(get_bytes(&c, &path, size).await.unwrap(), data, "{size} bytes");
        c.release(r).await.unwrap();
    }
    let log = s.stack.log("sluice-agent");
    assert!(log.matches("BadDigest").count() >= 2, "each damaged body was refused and sent again:\n{log}");
}

/// `torn_reads.rs::the_cli_never_leaves_a_file_of_two_versions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_never_leaves_a_file_of_two_versions() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let s = StoreUnderTest::start(StoreKind::Rgw);
    let stack = &s.stack;
    let size = 6 << 20;
    let versions = [pattern(size, 7), pattern(size, 8)];
    let shas = [sha256(&versions[0]), sha256(&versions[1])];
    let writer = stack.client().await;
    let wr = writer.register(size as u64).await.unwrap();
    wr.write_at(0, &versions[0]).unwrap();
    writer.put("data/cli-race", &wr, 0, size as u64).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (stop, versions) = (stop.clone(), versions.clone());
        tokio::spawn(async move {
            let mut i = 1;
            while !stop.load(Ordering::Relaxed) {
                wr.write_at(0, &versions[i % 2]).unwrap();
                writer.put("data/cli-race", &wr, 0, size as u64).await.unwrap();
                i += 1;
            }
        })
    };
    let (mut whole, mut refused) = (0, 0);
    for n in 0..8 {
        let dest = stack.dir.path().join(format!("download-{n}"));
        let out = std::process::Command::new(sluice_tests::bin("sluice"))
            .args(["--socket", stack.socket.to_str().unwrap(), "get", "data/cli-race"])
            .arg(&dest)
            .args(["--window", "1048576"])
            .output()
            .unwrap();
        if out.status.success() {
            let got = sha256(&std::fs::read(&dest).unwrap());
            assert!(shas.contains(&got), "download {n} holds bytes of neither version");
            whole += 1;
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("changed"), "download {n}: {err}");
            assert!(!dest.exists(), "a failed download left {}", dest.display());
            refused += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    w.await.unwrap();
    sluice_tests::report(&format!("torn-reads: rgw cli: downloads=8 whole={whole} refused={refused}"));
}

// ---- inline encryption (encryption.rs) -------------------------------------

const CHUNK: u64 = 64 << 10;
const TAG: u64 = 16;
const HEADER: u64 = 120;

struct Enc {
    s: StoreUnderTest,
    keys: tempfile::TempDir,
}

impl Enc {
    /// `encryption.rs::env`: namespace "data" is aes-256-gcm.
    fn start() -> Self {
        let keys = tempfile::tempdir().unwrap();
        FileKeyProvider::create_key(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
        FileKeyProvider::set_current(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
        let dataplane = format!("[encryption]\nkey_dir = \"{}\"", keys.path().display());
        let s = StoreUnderTest::with(StoreKind::Rgw, |o| Options {
            data_ns: format!("encryption = \"aes-256-gcm\"\nencryption_chunk_bytes = {CHUNK}"),
            agent_dataplane: dataplane,
            ..o
        });
        Self { s, keys }
    }

    /// What RGW holds for `data/key` (bytes and user metadata), read with boto3.
    fn stored(&self, key: &str) -> (Vec<u8>, serde_json::Value) {
        let (ak, sk) = self.s.keys();
        raw_get(self.s.addr, (&ak, &sk), "data", key)
    }

    fn store(&self, key: &str, data: &[u8], meta: &serde_json::Value) {
        let (ak, sk) = self.s.keys();
        raw_put(self.s.addr, (&ak, &sk), "data", key, data, meta);
    }
}

fn ciphertext_len(n: u64) -> u64 {
    HEADER + n + TAG * n.div_ceil(CHUNK).max(1)
}

/// `encryption.rs::round_trip_ciphertext_at_rest_and_plaintext_sizes`.
#[tokio::test]
async fn encrypted_round_trip_ciphertext_at_rest_and_plaintext_sizes() {
    let e = Enc::start();
    let c = e.s.stack.client().await;
    // Up to 7 MiB: above the 6 MiB multipart threshold the upload is multipart.
    for (i, n) in [0usize, 1, 65_535, 65_536, 65_537, (3 << 20) + 5, (7 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 40 + i as u64);
        let key = format!("enc/o{n}");
        put_bytes(&c, &format!("data/{key}"), &data).await;
        assert_eq!(sha256(&get_bytes(&c, &format!("data/{key}"), n).await.unwrap()), sha256(&data), "{n}");
        let (stored, _) = e.stored(&key);
        assert_eq!(stored.len() as u64, ciphertext_len(n as u64), "{n}: stored size");
        assert_eq!(&stored[..4], b"SLCE");
        if n >= 64 {
            let window = &data[..64];
            assert!(!stored.windows(64).any(|w| w == window), "{n}: plaintext visible at rest");
        }
        assert_eq!(c.head(&format!("data/{key}")).await.unwrap().size, n as u64, "{n}: HEAD size");
    }
    let listed = c.list_all("data/enc/").await.unwrap();
    assert_eq!(listed.len(), 7);
    for o in listed {
        assert_eq!(o.size.to_string(), o.key.trim_start_matches("enc/o"), "LIST reports plaintext sizes");
    }
}

/// `encryption.rs::ranged_reads_across_chunk_boundaries`.
#[tokio::test]
async fn encrypted_ranged_reads_across_chunk_boundaries() {
    let e = Enc::start();
    let c = e.s.stack.client().await;
    let n = 5 * CHUNK as usize + 777;
    let data = pattern(n, 9);
    put_bytes(&c, "data/ranged", &data).await;
    let r = c.register(n as u64).await.unwrap();
    let c64 = CHUNK;
    let mut cases =
        vec![(0, 1), (c64 - 1, 2), (c64, c64), (c64 - 5, 2 * c64 + 10), (n as u64 - 1, 1), (3, n as u64 - 3)];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..30 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let start = x % n as u64;
        let len = 1 + (x >> 20) % (n as u64 - start);
        cases.push((start, len));
    }
    for (start, len) in cases {
        let t = c.get("data/ranged", &r, 0, Some((start, Some(len)))).await.unwrap();
        assert_eq!(t.bytes, len, "{start}+{len}");
        assert_eq!(&r.as_slice()[..len as usize], &data[start as usize..(start + len) as usize], "{start}+{len}");
    }
}

/// `encryption.rs::key_rotation_keeps_old_objects_readable`.
#[tokio::test]
async fn encrypted_key_rotation_keeps_old_objects_readable() {
    let e = Enc::start();
    let c = e.s.stack.client().await;
    let old = pattern(100_000, 1);
    put_bytes(&c, "data/old", &old).await;
    FileKeyProvider::create_key(e.keys.path(), "alpha", &KeyId::new("k2").unwrap()).unwrap();
    FileKeyProvider::set_current(e.keys.path(), "alpha", &KeyId::new("k2").unwrap()).unwrap();
    // The agent re-reads `current` within about a second.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let new = pattern(100_000, 2);
    put_bytes(&c, "data/new", &new).await;
    let key_id = |k: &str| {
        let (s, _) = e.stored(k);
        String::from_utf8_lossy(&s[40..72]).trim_end_matches('\0').to_owned()
    };
    assert_eq!((key_id("old").as_str(), key_id("new").as_str()), ("k1", "k2"));
    assert_eq!(get_bytes(&c, "data/old", old.len()).await.unwrap(), old);
    assert_eq!(get_bytes(&c, "data/new", new.len()).await.unwrap(), new);
}

/// `encryption.rs::tampered_objects_fail_cleanly`: each object is changed in
/// the store with boto3 (its user metadata kept), not on disk.
#[tokio::test]
async fn encrypted_tampered_objects_fail_cleanly() {
    let e = Enc::start();
    let c = e.s.stack.client().await;
    let n = 3 * CHUNK as usize + 100;
    let data = pattern(n, 5);
    let chunk_at = |i: u64| HEADER + i * (CHUNK + TAG);
    type Tamper = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Tamper)> = vec![
        ("ciphertext byte", Box::new(move |s| s[chunk_at(1) as usize + 10] ^= 1)),
        ("header byte (nonce prefix)", Box::new(|s| s[21] ^= 0x80)),
        ("header byte (wrapped key)", Box::new(|s| s[100] ^= 1)),
        ("tag byte", Box::new(move |s| s[(chunk_at(1) + CHUNK) as usize + 3] ^= 1)),
        ("truncated mid-chunk", Box::new(|s| s.truncate(s.len() - 50))),
        ("last chunk dropped", Box::new(move |s| s.truncate(chunk_at(3) as usize))),
        (
            "two chunks swapped",
            Box::new(move |s| {
                let (a, b) = (chunk_at(0) as usize, chunk_at(1) as usize);
                let len = (CHUNK + TAG) as usize;
                let first: Vec<u8> = s[a..a + len].to_vec();
                s.copy_within(b..b + len, a);
                s[b..b + len].copy_from_slice(&first);
            }),
        ),
    ];
    let r = c.register(n as u64).await.unwrap();
    for (i, (what, tamper)) in cases.iter().enumerate() {
        let key = format!("t{i}");
        put_bytes(&c, &format!("data/{key}"), &data).await;
        let (mut stored, meta) = e.stored(&key);
        tamper(&mut stored);
        e.store(&key, &stored, &meta);
        r.write_at(0, &vec![0xee; n]).unwrap();
        let err = c.get(&format!("data/{key}"), &r, 0, None).await.expect_err(what);
        assert_eq!(code(err), Code::Integrity, "{what}");
        if what.starts_with("header") || what.starts_with("truncated") || what.starts_with("last") {
            let err = c.get(&format!("data/{key}"), &r, 0, Some((0, Some(10)))).await.expect_err(what);
            assert_eq!(code(err), Code::Integrity, "{what} (ranged)");
        }
    }
    // Copied to another key (metadata and all) by the store: bound to its
    // key, it does not open there; the original still does.
    put_bytes(&c, "data/orig", &data).await;
    e.s.boto3(&["copy", "data", "orig", "copied"]);
    assert_eq!(e.s.boto3(&["exists", "data", "copied"]), "yes");
    assert_eq!(code(c.get("data/copied", &r, 0, None).await.unwrap_err()), Code::Integrity);
    assert_eq!(get_bytes(&c, "data/orig", n).await.unwrap(), data);
    // A plaintext object where ciphertext must be: refused.
    put_bytes(&c, "plain/sneaky", &data).await;
    assert_eq!(code(c.get("data/sneaky", &r, 0, None).await.unwrap_err()), Code::Integrity);
}

// ---- get_many (batch.rs) -----------------------------------------------------

fn item(path: &str, region_id: &str, offset: u64, max_bytes: u64) -> BatchGet {
    BatchGet {
        path: path.to_owned(),
        region_id: region_id.to_owned(),
        offset,
        range: None,
        max_bytes,
        if_match: String::new(),
    }
}

/// `batch.rs::a_batch_answers_every_item_with_its_own_result`.
#[tokio::test]
async fn a_batch_answers_every_item_with_its_own_result() {
    let s = StoreUnderTest::start(StoreKind::Rgw);
    let c = s.stack.client().await;
    let objs: Vec<Vec<u8>> = (0..8).map(|i| pattern(1000 + 4093 * i, i as u64)).collect();
    for (i, d) in objs.iter().enumerate() {
        put_bytes(&c, &format!("data/batch/o{i}"), d).await;
    }
    let slot = 32 << 10;
    let r = c.register(16 * slot).await.unwrap();
    let other = c.register(4096).await.unwrap();
    let gone = c.register(4096).await.unwrap();
    let gone_id = gone.id().to_owned();
    c.release(gone).await.unwrap();
    r.write_at(0, &vec![0xAA; (16 * slot) as usize]).unwrap();

    let mut items: Vec<BatchGet> = (0..8).map(|i| item(&format!("data/batch/o{i}"), r.id(), i * slot, slot)).collect();
    items.push(item("data/batch/missing", r.id(), 8 * slot, slot)); // 8: NoSuchKey
    items.push(item("nope/batch/o1", r.id(), 9 * slot, slot)); // 9: unknown namespace
    items.push(item("data", r.id(), 10 * slot, slot)); // 10: malformed path
    items.push(item("data/batch/o7", r.id(), 11 * slot, 100)); // 11: slot too small
    items.push(item("data/batch/o7", &gone_id, 0, 0)); // 12: released region
    items.push(item("data/batch/o0", "no-such-region", 0, 0)); // 13: unknown region
    items.push(item("data/batch/o0", other.id(), 4000, 0)); // 14: past the region's end
    let mut ranged = item("data/batch/o5", r.id(), 12 * slot, slot); // 15: a range
    ranged.range = Some((100, Some(50)));
    items.push(ranged);

    let res = c.get_many(&items).await.expect("the batch is served");
    assert_eq!(res.len(), items.len(), "one result per item");
    for (i, d) in objs.iter().enumerate() {
        let t = res[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        assert_eq!(t.bytes, d.len() as u64, "item {i}");
        assert_eq!(t.object_size, d.len() as u64);
        let at = i * slot as usize;
        assert_eq!(&r.as_slice()[at..at + d.len()], &d[..], "item {i}'s bytes");
    }
    let code = |i: usize| res[i].as_ref().err().and_then(|e| e.code());
    assert_eq!(code(8), Some(Code::NoSuchKey));
    assert_eq!(code(9), Some(Code::UnknownNamespace));
    assert_eq!(code(10), Some(Code::BadRequest));
    assert_eq!(code(11), Some(Code::RegionTooSmall));
    assert_eq!(code(12), Some(Code::UnknownRegion));
    assert_eq!(code(13), Some(Code::UnknownRegion));
    assert_eq!(code(14), Some(Code::RegionTooSmall));
    let t = res[15].as_ref().expect("ranged item");
    assert_eq!(t.bytes, 50);
    assert_eq!(&r.as_slice()[(12 * slot) as usize..(12 * slot + 50) as usize], &objs[5][100..150]);
    let s11 = &r.as_slice()[(11 * slot) as usize..(12 * slot) as usize];
    assert!(s11.iter().all(|&b| b == 0xAA), "a refused item wrote into its slot");
    c.release(r).await.unwrap();
    c.release(other).await.unwrap();
}

/// `batch.rs::batches_the_shim_cannot_take_are_refused_whole`.
#[tokio::test]
async fn batches_the_shim_cannot_take_are_refused_whole() {
    let s = StoreUnderTest::start(StoreKind::Rgw);
    let c = s.stack.client().await;
    assert!(c.get_many(&[]).await.expect("empty").is_empty());
    let r = c.register(4096).await.unwrap();
    let items: Vec<BatchGet> = (0..1025).map(|_| item("data/x", r.id(), 0, 0)).collect();
    let err = c.get_many(&items).await.expect_err("an oversized batch is refused");
    assert_eq!(err.code(), Some(Code::BadRequest), "{err}");
    assert!(err.to_string().contains("max_batch_items"), "{err}");
    put_bytes(&c, "data/after", b"still here").await;
    let res = c.get_many(&[item("data/after", r.id(), 0, 0)]).await.expect("batch");
    assert_eq!(res[0].as_ref().expect("item").bytes, 10);
    assert_eq!(&r.as_slice()[..10], b"still here");
}

/// `batch.rs::a_batch_rides_through_an_agent_restart`.
#[tokio::test]
async fn a_batch_rides_through_an_agent_restart() {
    let mut s = StoreUnderTest::start(StoreKind::Rgw);
    let c = s.stack.client().await;
    let data = pattern(70_000, 3);
    put_bytes(&c, "data/restart/x", &data).await;
    let r = c.register(4 * 70_000).await.unwrap();
    let items: Vec<BatchGet> = (0..4).map(|i| item("data/restart/x", r.id(), i * 70_000, 70_000)).collect();
    assert!(c.get_many(&items).await.expect("batch").iter().all(Result::is_ok));
    s.stack.restart("sluice-agent");
    let res = c.get_many(&items).await.expect("batch after the restart");
    for (i, t) in res.iter().enumerate() {
        assert_eq!(t.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}")).bytes, 70_000);
        let at = i * 70_000;
        assert_eq!(&r.as_slice()[at..at + 70_000], &data[..]);
    }
}

// ---- a gateway dying or hanging (a cluster of the test's own) ----------------

/// One of the namespace's two gateways is SIGKILLed, then started again:
/// reads and writes go on through the other (the agent retries a refused
/// connection elsewhere), and the restarted one serves again.
#[tokio::test]
async fn a_killed_gateway_leaves_the_other_serving() {
    let cluster = CephCluster::start();
    let tenant = cluster.tenant();
    let stack = sluice_tests::Stack::with(Options {
        endpoints: cluster.urls(),
        agent_credentials: (tenant.access_key.clone(), tenant.secret_key.clone()),
        gateway: false,
        ..Default::default()
    });
    let c = stack.client().await;
    let data = pattern((7 << 20) + 3, 11);
    put_bytes(&c, "data/before", &data).await;
    cluster.kill_rgw(1);
    for round in 0..4 {
        let path = format!("data/during/{round}");
        put_bytes(&c, &path, &data).await;
        assert_eq!(sha256(&get_bytes(&c, &path, data.len()).await.unwrap()), sha256(&data), "round {round}");
    }
    assert_eq!(sha256(&get_bytes(&c, "data/before", data.len()).await.unwrap()), sha256(&data));
    cluster.start_rgw(1);
    // Both again: a 6 MiB read in 1 MiB parts uses both endpoints.
    let (p1, p2) = (Proxy::start(cluster.endpoints[0], None), Proxy::start(cluster.endpoints[1], None));
    let both = sluice_tests::Stack::with(Options {
        endpoints: vec![format!("http://{}", p1.addr), format!("http://{}", p2.addr)],
        agent_credentials: (tenant.access_key.clone(), tenant.secret_key.clone()),
        gateway: false,
        ..Default::default()
    });
    let c2 = both.client().await;
    assert_eq!(sha256(&get_bytes(&c2, "data/before", data.len()).await.unwrap()), sha256(&data));
    assert!(p1.bytes_down() > 1 << 20 && p2.bytes_down() > 1 << 20, "both gateways served after the restart");
}

/// A gateway that hangs (SIGSTOP: the kernel still accepts connections,
/// nothing is answered) under a read: a part sent to it times out
/// (`read_timeout_ms = 2000`) and its retry goes to the next endpoint, so
/// the read ends whole within a few read timeouts; after SIGCONT both serve.
#[tokio::test]
async fn a_hung_gateway_does_not_hang_the_client() {
    let cluster = CephCluster::start();
    let tenant = cluster.tenant();
    let stack = sluice_tests::Stack::with(Options {
        endpoints: cluster.urls(),
        agent_credentials: (tenant.access_key.clone(), tenant.secret_key.clone()),
        gateway: false,
        s3: "get_part_size = 1048576\nmultipart_threshold = 6291456\nput_part_size = 5242880\nmax_concurrency = 4\nmax_attempts = 3\nretry_base_ms = 10\nread_timeout_ms = 2000\n".into(),
        ..Default::default()
    });
    let c = stack.client().await;
    let data = pattern(8 << 20, 12);
    put_bytes(&c, "data/hang", &data).await;
    cluster.hang_rgw(1);
    let t0 = std::time::Instant::now();
    let r = c.register(data.len() as u64).await.unwrap();
    let t = c.get("data/hang", &r, 0, None).await.expect("the parts sent to the hung gateway are retried on the other");
    let took = t0.elapsed();
    assert_eq!(t.bytes, data.len() as u64);
    assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(&data), "whole bytes");
    assert!(took < std::time::Duration::from_secs(20), "the read took {took:?} with 2 s read timeouts");
    sluice_tests::report(&format!("ceph: a read with gateway 1 hung ended whole after {took:?}"));
    cluster.resume_rgw(1);
    assert_eq!(sha256(&get_bytes(&c, "data/hang", data.len()).await.unwrap()), sha256(&data));
}

// ---- RGW behind our gateway (third_party_store.rs) ----------------------------

/// `third_party_store.rs::a_community_store_gains_an_rdma_data_path_through_the_gateway`
/// with RGW as the gateway's upstream, then `torn_reads.rs::racing_a_writer_over_rdma`
/// on that stack: the gateway serves the tokens and moves RGW's bytes
/// one-sidedly.
#[tokio::test]
async fn rgw_gains_an_rdma_data_path_through_the_gateway() {
    let cluster = CephCluster::shared();
    let tenant = cluster.tenant();
    let backend = format!(
        "[backend]\nkind = \"upstream\"\nendpoint = \"http://{}\"\naccess_key = \"{}\"\nsecret_key = \"{}\"\n",
        cluster.endpoints[0], tenant.access_key, tenant.secret_key
    );
    let stack = sluice_tests::Stack::with(Options {
        gateway_backend: backend,
        data_ns: "data_path = \"rdma\"".into(),
        ..Default::default()
    });
    let c = stack.client().await;
    let r = c.register(12 << 20).await.unwrap();
    let keys = (tenant.access_key.as_str(), tenant.secret_key.as_str());
    for (i, n) in [5000usize, (3 << 20) + 1, (11 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 90 + i as u64);
        r.write_at(0, &data).unwrap();
        let t = c.put(&format!("data/up/{n}"), &r, 0, n as u64).await.unwrap();
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "{}", stack.log("sluice-gateway"));
        let (stored, _) = raw_get(cluster.endpoints[1], keys, "data", &format!("up/{n}"));
        assert_eq!(sha256(&stored), sha256(&data), "stored in RGW");
        r.write_at(0, &vec![0; n]).unwrap();
        let g = c.get(&format!("data/up/{n}"), &r, 0, None).await.unwrap();
        assert_eq!((g.bytes, g.data_path), (n as u64, "rdma"));
        assert_eq!(sha256(&r.as_slice()[..n]), sha256(&data));
    }
    assert_eq!(c.list_all("data/up/").await.unwrap().len(), 3);
    assert!(!stack.stored_file("data", "up/5000").exists(), "nothing landed in the gateway's own directory");
    let (whole, refused) = race_reads(&stack, "data/race/rdma", [16 << 20; 2], 12).await;
    assert_eq!(whole + refused, 12);
}
