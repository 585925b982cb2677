//! Integrity end to end through the [`S3Client`] seam, against a store that
//! keeps checksums (the mock's default, as S3) and one that does not
//! ([`MockStore::rgw_like`], as Ceph RGW 16.2): what the agent sends with
//! every upload, what it checks a read against, what it reports when it
//! cannot check, and what it learns about the store.

use std::sync::Arc;

use base64::Engine;

use super::call::{Call, ObjectRead, ObjectWrite, RegionSlice};
use super::error::S3Error;
use super::failing::{Failing, Failure};
use super::integrity::{unverified, META_CRC64NVME};
use super::mock::{MockStore, Op, RdmaMode};
use super::model::StoreChecksums;
use super::put::PutOutcome;
use super::store::ObjectStore;
use super::transfer_tests::{
    contents, counters, get_all, namespace, pattern, region, remote, store, tcp_path, tuning, until, PART,
};
use crate::model::DataPathMode;

fn rgw() -> MockStore {
    let m = MockStore::new();
    m.rgw_like();
    m
}

fn crc_b64(data: &[u8]) -> String {
    let mut d = sluice_dataplane::crc64::digest();
    d.update(data);
    base64::engine::general_purpose::STANDARD.encode(d.finalize().to_be_bytes())
}

fn md5_b64(data: &[u8]) -> String {
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(data))
}

/// PUTs `data` as `key` from a region of its own.
async fn put(s: &ObjectStore, key: &str, data: &[u8]) -> Result<PutOutcome, S3Error> {
    let r = region(data.len() as u64);
    r.write_at(0, data).unwrap();
    s.put_from(
        &ObjectWrite { key, region: &r, offset: 0, length: data.len() as u64, content_type: "" },
        &Call::ungated("req"),
    )
    .await
}

fn caps(s: &ObjectStore) -> StoreChecksums {
    s.capabilities("d").store_checksums
}

#[tokio::test]
async fn uploads_to_a_store_that_ignores_checksums_carry_content_md5_and_the_crc_in_metadata() {
    let mock = rgw();
    let s = store(Arc::new(mock.clone()), None);
    let small = pattern(2 * PART as usize, 1);
    let big = pattern((5 * PART + 99) as usize, 2);
    let out = put(&s, "small", &small).await.unwrap();
    assert_eq!(out.unverified, None, "RGW's ETag is the body's MD5: the bytes stored are the bytes sent");
    let out = put(&s, "big", &big).await.unwrap();
    assert_eq!(out.unverified, None, "each part's ETag is its MD5");

    let calls = mock.calls();
    let put_call = calls.iter().find(|c| c.op == Op::Put).unwrap();
    assert_eq!(put_call.header("content-md5"), Some(md5_b64(&small).as_str()));
    assert_eq!(put_call.header(META_CRC64NVME), Some(crc_b64(&small).as_str()));
    let create = calls.iter().find(|c| c.op == Op::Create).unwrap();
    assert_eq!(create.header(META_CRC64NVME), Some(crc_b64(&big).as_str()), "the whole object's CRC");
    let parts: Vec<_> = calls.iter().filter(|c| c.op == Op::UploadPart).collect();
    assert_eq!(parts.len(), 6);
    for p in &parts {
        assert!(p.header("content-md5").is_some() && p.header("x-amz-checksum-crc64nvme").is_some(), "{p:?}");
    }
    // Trailing checksums are what RGW 16.2 refuses: never used.
    for c in calls.iter().filter(|c| matches!(c.op, Op::Put | Op::UploadPart)) {
        assert!(c.headers.iter().all(|(n, _)| n != "x-amz-trailer" && n != "content-encoding"), "{c:?}");
    }
    assert!(mock.object_headers("t/small").contains(&(META_CRC64NVME.into(), crc_b64(&small))));
    assert!(mock.object_headers("t/big").contains(&(META_CRC64NVME.into(), crc_b64(&big))));

    // The store completed without an ETag; S3's comes from the parts' MD5s.
    let stored = mock.etag("t/big").unwrap();
    assert!(stored.ends_with("-6\""), "{stored}");
    assert_eq!(out.etag, stored);
    assert_eq!(mock.count(Op::Head), 0, "no HEAD was needed for it");
    assert_eq!(caps(&s), StoreChecksums::Ignored);
}

#[tokio::test]
async fn a_byte_flipped_on_a_get_without_a_store_checksum_is_an_integrity_error() {
    let mock = rgw();
    // One reply, and several parts (the flip in the first and in a later one).
    for (len, flips) in [(PART / 2, vec![0u32]), (3 * PART + 5, vec![0, 2])] {
        let data = pattern(len as usize, 3);
        put(&store(Arc::new(mock.clone()), None), "k", &data).await.unwrap();
        let r = region(len);
        let clean = get_all(&store(Arc::new(mock.clone()), None), "k", &r).await.unwrap();
        assert_eq!(clean.unverified, None, "{len}: checked against the metadata CRC");
        assert_eq!(contents(&r, 0, len), data);
        for skip in flips {
            let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, skip, 1, Failure::Flip(len / 7));
            let e = get_all(&store(Arc::new(failing), None), "k", &r).await.unwrap_err();
            assert!(matches!(&e, S3Error::Integrity(m) if m.contains("metadata")), "{len}, GET {skip}: {e}");
            assert_eq!(e.code(), sluice_proto::common::ErrorCode::Integrity);
        }
        // A ranged read cannot be checked: it says so (and here is damaged).
        let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, 0, 1, Failure::Flip(0));
        let out = store(Arc::new(failing), None)
            .get_into(
                &ObjectRead { key: "k", start: 1, length: Some(10), if_match: None },
                &RegionSlice { region: &r, offset: 0, room: len },
                &Call::ungated("req"),
            )
            .await;
        assert_eq!(out.unwrap().unverified.as_deref(), Some(unverified::RANGED));
    }
}

#[tokio::test]
async fn a_byte_flipped_on_a_put_is_refused_by_content_md5_and_sent_again() {
    let small = pattern(2 * PART as usize, 4);
    let big = pattern(6 * PART as usize, 5);
    for (key, data, op, skip) in [("small", &small, Op::Put, 0), ("big", &big, Op::UploadPart, 1)] {
        // Once: refused by the store, sent again, stored whole.
        let mock = rgw();
        let failing = Failing::new(Arc::new(mock.clone())).fail(op, skip, 1, Failure::Flip(PART / 3));
        let s = store(Arc::new(failing), None);
        let out = put(&s, key, data).await.unwrap();
        assert_eq!(out.unverified, None);
        assert_eq!(mock.object(&format!("t/{key}")).unwrap(), data[..], "{key}");
        assert_eq!(s.counters.retries.get(), 1, "{key}");

        // Every time: the PUT fails with INTEGRITY and nothing is stored.
        let mock = rgw();
        let failing = Failing::new(Arc::new(mock.clone())).fail(op, 0, 100, Failure::Flip(7));
        let s = store(Arc::new(failing), None);
        let e = put(&s, key, data).await.unwrap_err();
        assert!(matches!(&e, S3Error::Damaged { code, .. } if code == "BadDigest"), "{key}: {e}");
        assert_eq!(e.code(), sluice_proto::common::ErrorCode::Integrity);
        assert!(e.to_string().contains("after 3 attempts"), "{e}");
        until("the abort", || mock.open_uploads() == 0).await;
        assert!(mock.object(&format!("t/{key}")).is_none(), "{key}: never stored");
    }
}

#[tokio::test]
async fn whole_object_reads_need_no_head_to_be_checked() {
    for rgw_like in [false, true] {
        let mock = MockStore::new();
        if rgw_like {
            mock.rgw_like();
        }
        let s = store(Arc::new(mock.clone()), None);
        let len = 10 * PART + 3;
        let data = pattern(len as usize, 6);
        put(&s, "k", &data).await.unwrap();
        let r = region(len);
        let out = get_all(&s, "k", &r).await.unwrap();
        assert_eq!((out.parts, out.unverified.as_deref()), (11, None), "RGW-like: {rgw_like}");
        assert_eq!(contents(&r, 0, len), data);
        assert_eq!(mock.count(Op::Head), 0, "RGW-like: {rgw_like}: the first part's reply had the CRC");
    }
    // Written by another client to a store that keeps checksums: a reply
    // holding the whole object carries the store's; a larger one is not
    // checked, and no HEAD goes looking.
    let mock = MockStore::new();
    let s = store(Arc::new(mock.clone()), None);
    mock.insert("t/one", pattern(PART as usize, 7));
    mock.insert("t/many", pattern(3 * PART as usize, 8));
    let r = region(3 * PART);
    assert_eq!(get_all(&s, "one", &r).await.unwrap().unverified, None);
    let many = get_all(&s, "many", &r).await.unwrap();
    assert_eq!(many.unverified.as_deref(), Some(unverified::NO_CHECKSUM));
    assert_eq!(mock.count(Op::Head), 0);
}

#[tokio::test]
async fn reads_that_cannot_be_checked_say_why() {
    let mock = rgw();
    mock.insert("t/foreign", pattern(PART as usize, 9));
    let s = store(Arc::new(mock.clone()), None);
    let r = region(PART);
    let out = get_all(&s, "foreign", &r).await.unwrap();
    assert_eq!(out.unverified.as_deref(), Some(unverified::NO_CHECKSUM), "no store checksum, no metadata");
    put(&s, "mine", &pattern(PART as usize, 10)).await.unwrap();
    let out = s
        .get_into(
            &ObjectRead { key: "mine", start: 0, length: Some(PART - 1), if_match: None },
            &RegionSlice { region: &r, offset: 0, room: PART },
            &Call::ungated("req"),
        )
        .await
        .unwrap();
    assert_eq!(out.unverified.as_deref(), Some(unverified::RANGED));
    let mut ns = namespace();
    ns.verify_checksums = false;
    let off = ObjectStore::new(Arc::new(mock.clone()), &ns, "tenant", tuning(), counters(), None);
    assert_eq!(get_all(&off, "mine", &r).await.unwrap().unverified.as_deref(), Some(unverified::DISABLED));
}

#[tokio::test]
async fn what_the_store_does_with_checksums_is_learned_from_its_replies() {
    let md5s = |mock: &MockStore, op: Op| -> Vec<bool> {
        mock.calls().iter().filter(|c| c.op == op).map(|c| c.header("content-md5").is_some()).collect()
    };
    // A store that checks and echoes the CRC: Content-MD5 until it has shown so.
    let mock = MockStore::new();
    let s = store(Arc::new(mock.clone()), None);
    assert_eq!(caps(&s), StoreChecksums::Unknown);
    let data = pattern(PART as usize, 11);
    for _ in 0..4 {
        put(&s, "k", &data).await.unwrap();
    }
    // Three endpoints, tried in turn: each shows it once.
    assert_eq!(md5s(&mock, Op::Put), [true, true, true, false]);
    assert_eq!(caps(&s), StoreChecksums::Kept);

    // A store that ignores it: Content-MD5 every time.
    let mock = rgw();
    let s = store(Arc::new(mock.clone()), None);
    for _ in 0..4 {
        put(&s, "k", &data).await.unwrap();
    }
    assert_eq!(md5s(&mock, Op::Put), [true; 4]);
    assert_eq!(caps(&s), StoreChecksums::Ignored);

    // A reader that never PUT learns it from a whole-object GET of an
    // object the agent stored.
    let reader = store(Arc::new(mock.clone()), None);
    get_all(&reader, "k", &region(PART)).await.unwrap();
    assert_eq!(caps(&reader), StoreChecksums::Ignored);
}

/// Parts sent over RDMA have no MD5 computed: an empty ETag from the
/// completion is then asked of HEAD.
#[tokio::test]
async fn a_completion_without_an_etag_is_answered_by_head_when_parts_have_no_md5() {
    let mock = rgw();
    mock.set_rdma(RdmaMode::Serve(remote()));
    let s = store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Auto).await));
    let data = pattern((5 * PART + 1) as usize, 12);
    let out = put(&s, "big", &data).await.unwrap();
    assert_eq!(out.rdma_parts, 6);
    assert_eq!(out.etag, mock.etag("t/big").unwrap());
    assert_eq!(mock.count(Op::Head), 1);
    assert_eq!(mock.object("t/big").unwrap(), data);
    let create = mock.calls().into_iter().find(|c| c.op == Op::Create).unwrap();
    assert_eq!(create.header(META_CRC64NVME), Some(crc_b64(&data).as_str()));
}

/// A region written after its CRC was summed and before its parts went
/// out: the object would be stored with a metadata CRC of other bytes
/// (every whole read then fails its check); the PUT fails instead, its
/// upload aborted, nothing stored.
#[tokio::test]
async fn a_region_written_during_a_multipart_put_fails_it_and_stores_nothing() {
    let mock = rgw();
    let data = pattern((5 * PART + 99) as usize, 3);
    let r = region(data.len() as u64);
    r.write_at(0, &data).unwrap();
    let written = r.clone();
    let change = Failure::Before(Arc::new(move || written.write_at(7, &[0xab]).unwrap()));
    let s = store(Arc::new(Failing::new(Arc::new(mock.clone())).fail(super::mock::Op::Create, 0, 1, change)), None);
    let write = ObjectWrite { key: "changed", region: &r, offset: 0, length: data.len() as u64, content_type: "" };
    let e = s.put_from(&write, &Call::ungated("req")).await.expect_err("the region changed");
    assert!(matches!(e, S3Error::PreconditionFailed(_)), "{e}");
    until("the upload aborted", || mock.open_uploads() == 0).await;
    assert!(mock.object("t/changed").is_none());
}
