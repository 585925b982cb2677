//! GetBatch end to end (Rust client -> shim -> one GetMany call -> agent ->
//! gateway): per-item results, slots bounded by `max_bytes`, whole-batch
//! refusals in one answer, and batches riding through an agent restart.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{BatchGet, Client, Code};
use sluice_tests::{pattern, Stack};

async fn put_bytes(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.expect("register");
    r.write_at(0, data).expect("write");
    c.put(path, &r, 0, data.len() as u64).await.expect("put");
    c.release(r).await.expect("release");
}

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

#[tokio::test]
async fn a_batch_answers_every_item_with_its_own_result() {
    let stack = Stack::start();
    let c = stack.client().await;
    let objs: Vec<Vec<u8>> = (0..8).map(|i| pattern(1000 + 4093 * i, i as u64)).collect();
    for (i, d) in objs.iter().enumerate() {
        put_bytes(&c, &format!("data/batch/o{i}"), d).await;
    }
    let slot = 32 << 10;
    let r = c.register(16 * slot).await.expect("register");
    let other = c.register(4096).await.expect("register");
    let gone = c.register(4096).await.expect("register");
    let gone_id = gone.id().to_owned();
    c.release(gone).await.expect("release");
    // Fill the slots with a marker, so "nothing written" can be checked.
    r.write_at(0, &vec![0xAA; (16 * slot) as usize]).expect("write");

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
    // The refused slot was left alone (max_bytes bounds the write).
    let s11 = &r.as_slice()[(11 * slot) as usize..(12 * slot) as usize];
    assert!(s11.iter().all(|&b| b == 0xAA), "a refused item wrote into its slot");
    c.release(r).await.expect("release");
    c.release(other).await.expect("release");
}

#[tokio::test]
async fn batches_the_shim_cannot_take_are_refused_whole() {
    let stack = Stack::start();
    let c = stack.client().await;
    assert!(c.get_many(&[]).await.expect("empty").is_empty());
    let r = c.register(4096).await.expect("register");
    // Over the shim's max_batch_items (1024): one refusal for the batch.
    let items: Vec<BatchGet> = (0..1025).map(|_| item("data/x", r.id(), 0, 0)).collect();
    let err = c.get_many(&items).await.expect_err("an oversized batch is refused");
    assert_eq!(err.code(), Some(Code::BadRequest), "{err}");
    assert!(err.to_string().contains("max_batch_items"), "{err}");
    // The connection is still good.
    put_bytes(&c, "data/after", b"still here").await;
    let res = c.get_many(&[item("data/after", r.id(), 0, 0)]).await.expect("batch");
    assert_eq!(res[0].as_ref().expect("item").bytes, 10);
    assert_eq!(&r.as_slice()[..10], b"still here");
}

#[tokio::test]
async fn a_batch_rides_through_an_agent_restart() {
    let mut stack = Stack::start();
    let c = stack.client().await;
    let data = pattern(70_000, 3);
    put_bytes(&c, "data/restart/x", &data).await;
    let r = c.register(4 * 70_000).await.expect("register");
    let items: Vec<BatchGet> = (0..4).map(|i| item("data/restart/x", r.id(), i * 70_000, 70_000)).collect();
    assert!(c.get_many(&items).await.expect("batch").iter().all(Result::is_ok));
    stack.restart("sluice-agent");
    // The shim re-opens its session and registers the region again.
    let res = c.get_many(&items).await.expect("batch after the restart");
    for (i, t) in res.iter().enumerate() {
        assert_eq!(t.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}")).bytes, 70_000);
        let at = i * 70_000;
        assert_eq!(&r.as_slice()[at..at + 70_000], &data[..]);
    }
}
