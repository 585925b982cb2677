//! A read never returns a mix of two versions: a writer overwrites an
//! object while a reader reads it in many parts, over HTTP and over RDMA
//! (the tcp transport). The gateway refuses parts of another version
//! (If-Match), and the agent checks every part's ETag and size itself — so
//! the same holds against a store that ignores If-Match
//! (`third_party_store.rs` races against s3s-fs).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_tests::{race_reads, Options, Stack};

#[tokio::test]
async fn racing_a_writer_over_http() {
    let stack = Stack::start();
    // 1 MiB parts (the harness's agent config): 16 parts per read.
    let (whole, refused) = race_reads(&stack, "data/race/http", [16 << 20; 2], 12).await;
    assert_eq!(whole + refused, 12);
}

#[tokio::test]
async fn racing_a_writer_over_rdma() {
    let stack = Stack::with(Options { data_ns: "data_path = \"rdma\"\n".into(), ..Default::default() });
    let (whole, refused) = race_reads(&stack, "data/race/rdma", [16 << 20; 2], 12).await;
    assert_eq!(whole + refused, 12);
}

/// A byte damaged on the wire: a whole-object read is checked against the
/// store's CRC64NVME (sent by the agent on PUT, kept by the gateway) and
/// fails with INTEGRITY instead of returning damaged bytes as success — for
/// an object read in one part (the checksum comes with it) and in many
/// (the checksum comes from a HEAD run alongside).
#[tokio::test]
async fn a_byte_flipped_on_the_wire_is_an_integrity_error() {
    let store = Stack::start();
    let proxy = sluice_tests::Proxy::start(store.gateway_addr.expect("gateway"), None);
    let stack = Stack::with(Options {
        gateway: false,
        endpoints: vec![format!("http://{}", proxy.addr)],
        ..Default::default()
    });
    let c = stack.client().await;
    for size in [200_000usize, 4 << 20] {
        let data = sluice_tests::pattern(size, size as u64);
        let r = c.register(size as u64).await.unwrap();
        r.write_at(0, &data).unwrap();
        let path = format!("data/crc/{size}");
        c.put(&path, &r, 0, size as u64).await.unwrap();
        r.write_at(0, &vec![0u8; size]).unwrap();
        c.get(&path, &r, 0, None).await.unwrap();
        assert_eq!(sluice_tests::sha256(&r.as_slice()[..size]), sluice_tests::sha256(&data), "clean read");
        proxy.flip_byte(size as u64 / 2);
        let e = c.get(&path, &r, 0, None).await.expect_err("a damaged read must not succeed");
        assert_eq!(e.code(), Some(sluice_client::Code::Integrity), "{size} bytes: {e}");
        // Nothing is damaged at rest: the next read is whole.
        c.get(&path, &r, 0, None).await.unwrap();
        assert_eq!(sluice_tests::sha256(&r.as_slice()[..size]), sluice_tests::sha256(&data));
        c.release(r).await.unwrap();
    }
}

/// `sluice get` of an object larger than its window reads it in several
/// requests: a writer racing it must not leave a file of two versions.
/// Every download ends with one version byte for byte, or fails and leaves
/// no file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_never_leaves_a_file_of_two_versions() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stack = Stack::start();
    let size = 6 << 20;
    let versions = [sluice_tests::pattern(size, 7), sluice_tests::pattern(size, 8)];
    let shas = [sluice_tests::sha256(&versions[0]), sluice_tests::sha256(&versions[1])];
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
            let got = sluice_tests::sha256(&std::fs::read(&dest).unwrap());
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
    sluice_tests::report(&format!("torn-reads: cli: downloads=8 whole={whole} refused={refused}"));
}
