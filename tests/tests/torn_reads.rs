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
    let (whole, refused) = race_reads(&stack, "data/race/http", 16 << 20, 12).await;
    assert_eq!(whole + refused, 12);
}

#[tokio::test]
async fn racing_a_writer_over_rdma() {
    let stack = Stack::with(Options { data_ns: "data_path = \"rdma\"\n".into(), ..Default::default() });
    let (whole, refused) = race_reads(&stack, "data/race/rdma", 16 << 20, 12).await;
    assert_eq!(whole + refused, 12);
}
