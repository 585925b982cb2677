//! GETs with `data_path = "rdma"` over Sluice's own `tcp` transport: the
//! first part goes without a HEAD, asking the store to move nothing unless
//! the object fits the caller's slot and is the version asked for. What a
//! HEAD used to guarantee must still hold: a refusal writes nothing, the
//! whole object is checked end to end, and anything odd takes the HEAD way.

use std::sync::Arc;

use super::call::{Call, ObjectRead, RegionSlice};
use super::error::S3Error;
use super::mock::{MockStore, Op, RdmaMode};
use super::store::ObjectStore;
use super::transfer_tests::{contents, pattern, region, remote, store, tcp_path, PART};
use crate::hostmem::HostRegion;
use crate::model::DataPathMode;

async fn rdma_store(mock: &MockStore) -> ObjectStore {
    store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Rdma).await))
}

fn serving() -> MockStore {
    let mock = MockStore::new();
    mock.set_rdma(RdmaMode::Serve(remote()));
    mock
}

/// A region whose every byte is 0xEE, so a write shows.
fn marked(len: u64) -> Arc<dyn HostRegion> {
    let r = region(len);
    r.write_at(0, &vec![0xEE; len as usize]).unwrap();
    r
}

async fn get(
    s: &ObjectStore,
    read: ObjectRead<'_>,
    r: &Arc<dyn HostRegion>,
    offset: u64,
    room: u64,
) -> Result<super::get::GetOutcome, S3Error> {
    s.get_into(&read, &RegionSlice { region: r, offset, room }, &Call::ungated("req")).await
}

#[tokio::test]
async fn a_small_object_is_one_request_and_checked() {
    let mock = serving();
    let data = pattern(4096, 1);
    mock.insert("t/k", data.clone());
    let s = rdma_store(&mock).await;
    let r = marked(64 << 10);
    let out = get(&s, ObjectRead::whole("k"), &r, 100, 8192).await.unwrap();
    assert_eq!(contents(&r, 100, 4096), data);
    assert_eq!(contents(&r, 4196, 4), vec![0xEE; 4], "nothing past the object");
    assert_eq!((out.bytes, out.object_size, out.parts, out.rdma_parts), (4096, 4096, 1, 1));
    assert_eq!(out.unverified, None, "checked against the store's CRC64NVME");
    assert_eq!((mock.count(Op::Head), mock.count(Op::Get)), (0, 1));
}

#[tokio::test]
async fn a_large_object_needs_one_head_for_its_checksum_and_no_more() {
    let mock = serving();
    let len = 3 * PART + 7;
    let data = pattern(len as usize, 2);
    mock.insert("t/k", data.clone());
    let s = rdma_store(&mock).await;
    let r = marked(len);
    let out = get(&s, ObjectRead::whole("k"), &r, 0, len).await.unwrap();
    assert_eq!(contents(&r, 0, len), data);
    assert_eq!((out.parts, out.rdma_parts, out.fallbacks.len()), (4, 4, 0));
    assert_eq!(out.unverified, None);
    // Only a whole object bigger than a part, with no checksum in the first
    // reply, costs the HEAD; a range of it does not.
    assert_eq!(mock.count(Op::Head), 1);
    let r2 = marked(2 * PART);
    let read = ObjectRead { key: "k", start: 5, length: Some(2 * PART), if_match: None };
    get(&s, read, &r2, 0, 2 * PART).await.unwrap();
    assert_eq!(contents(&r2, 0, 2 * PART), data[5..5 + 2 * PART as usize]);
    assert_eq!(mock.count(Op::Head), 1);
}

#[tokio::test]
async fn an_object_too_big_for_the_slot_writes_nothing() {
    let mock = serving();
    mock.insert("t/k", pattern(10_000, 3));
    let s = rdma_store(&mock).await;
    let r = marked(64 << 10);
    let e = get(&s, ObjectRead::whole("k"), &r, 0, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 10_000, .. }), "{e}");
    // A span from the middle that would fit asks for no more than it needs.
    let read = ObjectRead { key: "k", start: 9000, length: None, if_match: None };
    let e = get(&s, read, &r, 0, 999).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 1000, .. }), "{e}");
    assert!(contents(&r, 0, 64 << 10).iter().all(|&b| b == 0xEE), "no byte was written");
    assert_eq!(mock.count(Op::Head), 0);
    let read = ObjectRead { key: "k", start: 9000, length: None, if_match: None };
    get(&s, read, &r, 0, 1000).await.unwrap();
    assert_eq!(contents(&r, 0, 1000), pattern(10_000, 3)[9000..]);
}

#[tokio::test]
async fn another_version_writes_nothing() {
    let mock = serving();
    mock.insert("t/k", pattern(4096, 4));
    let s = rdma_store(&mock).await;
    let r = marked(8192);
    let read = ObjectRead { key: "k", start: 0, length: None, if_match: Some("\"not-it\"") };
    let e = get(&s, read, &r, 0, 8192).await.unwrap_err();
    assert!(matches!(e, S3Error::PreconditionFailed(_)), "{e}");
    assert!(contents(&r, 0, 8192).iter().all(|&b| b == 0xEE), "no byte was written");
}

/// A store that does not check the size (not Sluice's gateway) still gets
/// the slot's size as the window: the read fails as too big and nothing
/// lands outside the slot.
#[tokio::test]
async fn a_store_that_ignores_the_size_check_cannot_write_past_the_slot() {
    let mock = serving();
    mock.ignore_object_max();
    mock.insert("t/k", pattern(10_000, 5));
    let s = rdma_store(&mock).await;
    let r = marked(64 << 10);
    let e = get(&s, ObjectRead::whole("k"), &r, 1000, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 10_000, .. }), "{e}");
    assert!(contents(&r, 0, 1000).iter().all(|&b| b == 0xEE));
    assert!(contents(&r, 5096, (64 << 10) - 5096).iter().all(|&b| b == 0xEE));
}

#[tokio::test]
async fn empty_objects_and_fallbacks_take_the_head_way() {
    let mock = serving();
    mock.insert("t/empty", Vec::new());
    let s = rdma_store(&mock).await;
    let r = marked(4096);
    let out = get(&s, ObjectRead::whole("empty"), &r, 0, 4096).await.unwrap();
    assert_eq!((out.bytes, out.object_size), (0, 0));
    assert_eq!(mock.count(Op::Head), 1);

    // A store that declines or ignores the token: the HEAD way, then each
    // part over HTTP with its fallback said.
    for (mode, kind) in [(RdmaMode::Decline, "declined"), (RdmaMode::Ignore, "ignored")] {
        let mock = MockStore::new();
        mock.set_rdma(mode);
        let data = pattern(5000, 6);
        mock.insert("t/k", data.clone());
        let s = rdma_store(&mock).await;
        let r = marked(8192);
        let out = get(&s, ObjectRead::whole("k"), &r, 0, 8192).await.unwrap();
        assert_eq!(contents(&r, 0, 5000), data, "{kind}");
        assert_eq!(mock.count(Op::Head), 1, "{kind}");
        assert_eq!((out.rdma_parts, out.fallbacks.len()), (0, 1), "{kind}");
        assert_eq!(out.fallbacks[0].kind, kind);
    }

    // A missing key is the store's answer, not a fallback.
    let e = get(&s, ObjectRead::whole("nope"), &marked(4096), 0, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::NoSuchKey(_)), "{e}");
}
