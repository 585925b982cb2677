//! A read never returns a mix of two versions: a writer overwrites an
//! object while a reader reads it in many parts, over HTTP and over RDMA
//! (the tcp transport). The gateway refuses parts of another version
//! (If-Match), and the agent checks every part's ETag and size itself — so
//! the same holds against a store that ignores If-Match
//! (`third_party_store.rs` races against s3s-fs).

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
