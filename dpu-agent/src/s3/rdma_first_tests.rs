//! GETs with `data_path = "rdma"` over Sluice's own `tcp` transport: once
//! an endpoint has shown it checks `x-sluice-rdma-object-max`, the first
//! part goes without a HEAD, asking the store to move nothing unless the
//! object fits the caller's slot and is the version asked for. What a HEAD
//! used to guarantee must still hold: a refusal writes nothing, the whole
//! object is checked end to end, and anything odd takes the HEAD way.

use std::sync::Arc;

use super::call::{Call, ObjectRead, RegionSlice};
use super::error::S3Error;
use super::mock::{MockStore, Op, RdmaMode};
use super::store::ObjectStore;
use super::transfer_tests::{contents, pattern, region, remote, store, tcp_path, tcp_path_and_owner, PART};
use crate::hostmem::HostRegion;
use crate::model::DataPathMode;

async fn rdma_store(mock: &MockStore) -> ObjectStore {
    rdma_store_on(mock, tcp_path(DataPathMode::Rdma).await).await
}

async fn rdma_store_on(mock: &MockStore, path: super::token_path::TokenPath) -> ObjectStore {
    let s = store(Arc::new(mock.clone()), Some(path));
    // Each endpoint learns from a GET the HEAD way that it checks the size.
    mock.insert("t/warm-up", pattern(10, 0));
    for _ in 0..6 {
        get(&s, ObjectRead::whole("warm-up"), &region(4096), 0, 4096).await.unwrap();
    }
    let heads = mock.count(Op::Head);
    get(&s, ObjectRead::whole("warm-up"), &region(4096), 0, 4096).await.unwrap();
    assert_eq!(mock.count(Op::Head), heads, "every endpoint has learned");
    s
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

fn heads(mock: &MockStore) -> usize {
    mock.count(Op::Head)
}

#[tokio::test]
async fn a_small_object_is_one_request_and_checked() {
    let mock = serving();
    let data = pattern(4096, 1);
    mock.insert("t/k", data.clone());
    let s = rdma_store(&mock).await;
    let (h0, g0) = (heads(&mock), mock.count(Op::Get));
    let r = marked(64 << 10);
    let out = get(&s, ObjectRead::whole("k"), &r, 100, 8192).await.unwrap();
    assert_eq!(contents(&r, 100, 4096), data);
    assert_eq!(contents(&r, 4196, 4), vec![0xEE; 4], "nothing past the object");
    assert_eq!((out.bytes, out.object_size, out.parts, out.rdma_parts), (4096, 4096, 1, 1));
    assert_eq!(out.unverified, None, "checked against the store's CRC64NVME");
    assert_eq!((heads(&mock) - h0, mock.count(Op::Get) - g0), (0, 1));
}

/// A fresh store asks the size first until the endpoint has shown it
/// checks it; one that never shows it (not Sluice's gateway, or an older
/// one) keeps the HEAD, so a slot too small is never written into.
#[tokio::test]
async fn only_an_endpoint_seen_to_check_the_size_gets_no_head() {
    let mock = serving();
    mock.insert("t/k", pattern(4096, 7));
    let s = store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Rdma).await));
    get(&s, ObjectRead::whole("k"), &marked(8192), 0, 8192).await.unwrap();
    assert_eq!(heads(&mock), 1, "the first GET to an endpoint asks the size");

    let old = serving();
    old.ignore_object_max();
    old.insert("t/k", pattern(10_000, 7));
    old.insert("t/small", pattern(100, 7));
    let s = store(Arc::new(old.clone()), Some(tcp_path(DataPathMode::Rdma).await));
    for _ in 0..6 {
        get(&s, ObjectRead::whole("small"), &marked(4096), 0, 4096).await.unwrap();
    }
    assert_eq!(heads(&old), 6, "never learned: every GET asks the size");
    let r = marked(64 << 10);
    let e = get(&s, ObjectRead::whole("k"), &r, 1000, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 10_000, .. }), "{e}");
    assert!(contents(&r, 0, 64 << 10).iter().all(|&b| b == 0xEE), "no byte was written");
}

#[tokio::test]
async fn a_large_object_needs_one_head_for_its_checksum_and_no_more() {
    let mock = serving();
    let len = 3 * PART + 7;
    let data = pattern(len as usize, 2);
    mock.insert("t/k", data.clone());
    let (path, owner) = tcp_path_and_owner(DataPathMode::Rdma).await;
    let s = rdma_store_on(&mock, path).await;
    // The first part's window is gone before the HEAD is asked: nothing
    // can land in the slot while the agent waits on another request.
    let windows_at_head = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = windows_at_head.clone();
    mock.on_head(move || seen.lock().unwrap().push(owner.table().live()));
    let h0 = heads(&mock);
    let r = marked(len);
    let out = get(&s, ObjectRead::whole("k"), &r, 0, len).await.unwrap();
    assert_eq!(contents(&r, 0, len), data);
    assert_eq!((out.parts, out.rdma_parts, out.fallbacks.len()), (4, 4, 0));
    assert_eq!(out.unverified, None);
    // Only a whole object whose first reply carried no checksum costs the
    // HEAD; a range of it does not.
    assert_eq!(heads(&mock) - h0, 1);
    assert_eq!(*windows_at_head.lock().unwrap(), vec![0], "no window open during the HEAD");
    let r2 = marked(2 * PART);
    let read = ObjectRead { key: "k", start: 5, length: Some(2 * PART), if_match: None };
    get(&s, read, &r2, 0, 2 * PART).await.unwrap();
    assert_eq!(contents(&r2, 0, 2 * PART), data[5..5 + 2 * PART as usize]);
    assert_eq!(heads(&mock) - h0, 1);
}

#[tokio::test]
async fn an_object_too_big_for_the_slot_writes_nothing() {
    let mock = serving();
    mock.insert("t/k", pattern(10_000, 3));
    let s = rdma_store(&mock).await;
    let h0 = heads(&mock);
    let r = marked(64 << 10);
    let e = get(&s, ObjectRead::whole("k"), &r, 0, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 10_000, .. }), "{e}");
    // A span from the middle that would fit asks for no more than it needs.
    let read = ObjectRead { key: "k", start: 9000, length: None, if_match: None };
    let e = get(&s, read, &r, 0, 999).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed: 1000, .. }), "{e}");
    assert!(contents(&r, 0, 64 << 10).iter().all(|&b| b == 0xEE), "no byte was written");
    assert_eq!(heads(&mock), h0);
    let read = ObjectRead { key: "k", start: 9000, length: None, if_match: None };
    get(&s, read, &r, 0, 1000).await.unwrap();
    assert_eq!(contents(&r, 0, 1000), pattern(10_000, 3)[9000..]);
    // A start no Range can name is refused as before, not sent.
    let read = ObjectRead { key: "k", start: u64::MAX - 10, length: None, if_match: None };
    let e = get(&s, read, &r, 0, 1000).await.unwrap_err();
    assert!(matches!(e, S3Error::InvalidRange(_)), "{e}");
}

#[tokio::test]
async fn another_version_writes_nothing() {
    let mock = serving();
    mock.insert("t/k", pattern(4096, 4));
    let s = rdma_store(&mock).await;
    let r = marked(8192);
    for want in ["\"not-it\"", "*", "W/\"not-it\"", "bad\r\nx-evil: 1"] {
        let read = ObjectRead { key: "k", start: 0, length: None, if_match: Some(want) };
        let e = get(&s, read, &r, 0, 8192).await.unwrap_err();
        assert!(matches!(e, S3Error::PreconditionFailed(_)), "{want:?}: {e}");
        assert!(contents(&r, 0, 8192).iter().all(|&b| b == 0xEE), "{want:?}: no byte was written");
    }
    // The right ETag, however quoted, reads.
    let etag = s.head("k", "req").await.unwrap().etag;
    let bare = etag.trim_matches('"').to_owned();
    for want in [etag.clone(), bare.clone(), format!("W/\"{bare}\"")] {
        let read = ObjectRead { key: "k", start: 0, length: None, if_match: Some(&want) };
        get(&s, read, &r, 0, 8192).await.unwrap();
        assert_eq!(contents(&r, 0, 4096), pattern(4096, 4), "{want:?}");
    }
}

#[tokio::test]
async fn empty_objects_and_fallbacks_take_the_head_way() {
    let mock = serving();
    mock.insert("t/empty", Vec::new());
    let s = rdma_store(&mock).await;
    let h0 = heads(&mock);
    let r = marked(4096);
    let out = get(&s, ObjectRead::whole("empty"), &r, 0, 4096).await.unwrap();
    assert_eq!((out.bytes, out.object_size), (0, 0));
    assert_eq!(heads(&mock) - h0, 1);

    // A store that learned, then declines or ignores the token: the HEAD
    // way, then each part over HTTP; the first try's fallback is reported
    // apart from the parts' (the bytes went over HTTP because of theirs).
    // The endpoint is learned again: the next GET tries no first part.
    for (mode, kind) in [(RdmaMode::Decline, "declined"), (RdmaMode::Ignore, "ignored")] {
        let mock = serving();
        let data = pattern(5000, 6);
        mock.insert("t/k", data.clone());
        let s = rdma_store(&mock).await;
        mock.set_rdma(mode);
        let (h0, g0) = (heads(&mock), mock.count(Op::Get));
        let r = marked(8192);
        let out = get(&s, ObjectRead::whole("k"), &r, 0, 8192).await.unwrap();
        assert_eq!(contents(&r, 0, 5000), data, "{kind}");
        assert_eq!((heads(&mock) - h0, mock.count(Op::Get) - g0), (1, 3), "{kind}: try, RDMA part, HTTP part");
        assert_eq!((out.rdma_parts, out.fallbacks.len()), (0, 1), "{kind}");
        assert_eq!(out.fallbacks[0].kind, kind);
        assert_eq!(out.first_try.as_ref().map(|f| f.kind), Some(kind));
        // Each endpoint learns it on its own (three here, taken in turn).
        for _ in 0..2 {
            get(&s, ObjectRead::whole("k"), &r, 0, 8192).await.unwrap();
        }
        for _ in 0..3 {
            let out = get(&s, ObjectRead::whole("k"), &r, 0, 8192).await.unwrap();
            assert!(out.first_try.is_none(), "{kind}: learned again, no first try");
        }
    }

    // A missing key is the store's answer, not a fallback.
    let e = get(&s, ObjectRead::whole("nope"), &marked(4096), 0, 4096).await.unwrap_err();
    assert!(matches!(e, S3Error::NoSuchKey(_)), "{e}");
}
