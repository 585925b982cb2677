//! The transfer logic of [`ObjectStore`] through the [`S3Client`] seam: an
//! in-memory store ([`MockStore`]), and a wrapper that fails chosen requests
//! ([`Failing`]). The bodies that take a [`Backend`] run twice
//! (`on_every_store!`): on the mock and on a real sluice-gateway in this
//! process (loopback only); the rest check what only the mock can tell.

use std::sync::Arc;
use std::time::Duration;

use sluice_dataplane::{SharedRegion, TransportKind};

use super::call::{Call, ObjectRead, ObjectWrite, RegionSlice};
use super::client::S3Client;
use super::error::S3Error;
use super::failing::{refused, slow_down, Failing, Failure};
use super::mock::{MockStore, Op, RdmaMode};
use super::store::{ObjectStore, S3Counters};
use super::stores_tests::{on_every_store, Backend};
use super::token_path::TokenPath;
use crate::config::{NamespaceConfig, S3Tuning};
use crate::hostmem::HostRegion;
use crate::model::{DataPathMode, Placement};

pub(super) const PART: u64 = 64 << 10;

pub(super) fn tuning() -> S3Tuning {
    S3Tuning {
        get_part_size: PART,
        multipart_threshold: 4 * PART,
        put_part_size: PART,
        max_concurrency: 4,
        max_attempts: 3,
        retry_base_ms: 1,
        ..S3Tuning::default()
    }
}

pub(super) fn counters() -> S3Counters {
    S3Counters {
        retries: prometheus::IntCounter::new("retries", "r").unwrap(),
        multipart_aborts: prometheus::IntCounterVec::new(prometheus::Opts::new("aborts", "a"), &["reason"]).unwrap(),
    }
}

pub(super) fn namespace() -> NamespaceConfig {
    toml::from_str(
        "name = \"d\"\nendpoints = [\"http://a:1\", \"http://b:2\", \"http://c:3\"]\nbucket = \"data\"\n\
         credentials = \"c\"\nprefix = \"t/\"\n",
    )
    .unwrap()
}

pub(super) fn store(client: Arc<dyn S3Client>, rdma: Option<TokenPath>) -> ObjectStore {
    ObjectStore::new(client, &namespace(), "tenant", tuning(), counters(), rdma)
}

pub(super) fn region(len: u64) -> Arc<dyn HostRegion> {
    Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("t", len).unwrap()))
}

pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub(super) fn contents(r: &Arc<dyn HostRegion>, offset: u64, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    r.read_at(offset, &mut out).unwrap();
    out
}

pub(super) async fn get_all(
    s: &ObjectStore,
    key: &str,
    r: &Arc<dyn HostRegion>,
) -> Result<super::get::GetOutcome, S3Error> {
    s.get_into(&ObjectRead::whole(key), &RegionSlice { region: r, offset: 0, room: r.len() }, &Call::ungated("req"))
        .await
}

pub(super) async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn a_large_get_is_split_into_ranged_parts_that_cover_it_once(b: Backend) {
    let part = b.part();
    let len = 4 * part + 123;
    let data = pattern(len as usize, 1);
    b.insert("t/big", data.clone()).await;
    let s = b.store();
    let r = region(len + 7);

    let out = get_all(&s, "big", &r).await.unwrap();
    assert_eq!((out.bytes, out.object_size, out.parts), (len, len, 5));
    assert_eq!(contents(&r, 0, len), data);
    if let Some(mock) = b.as_mock() {
        let mut gets: Vec<_> = mock.calls().into_iter().filter(|c| c.op == Op::Get).collect();
        gets.sort_by_key(|c| c.range);
        let mut next = 0;
        for g in &gets {
            let (first, last) = g.range.unwrap();
            assert_eq!(first, next, "parts are contiguous and do not overlap");
            assert!(last - first < part, "no part is over the part size");
            assert_eq!(g.key, "t/big", "the namespace prefix is applied");
            // The first part learns the ETag; every later one is bound to it.
            assert_eq!(g.if_match.is_some(), first != 0, "{g:?}");
            next = last + 1;
        }
        assert_eq!(next, len);
        let endpoints: std::collections::BTreeSet<_> = gets.iter().map(|g| g.endpoint.as_str()).collect();
        assert_eq!(endpoints.len(), 3, "parts are spread across the endpoints");
    }

    // A window: [start, start+length) lands at the offset, nothing else moves.
    let r = region(3 * part);
    r.write_at(0, &[0xee; 16]).unwrap();
    let out = s
        .get_into(
            &ObjectRead { key: "big", start: part - 5, length: Some(2 * part), if_match: None },
            &RegionSlice { region: &r, offset: 16, room: 2 * part },
            &Call::ungated("req"),
        )
        .await
        .unwrap();
    assert_eq!(out.bytes, 2 * part);
    assert_eq!(contents(&r, 16, 2 * part), data[(part - 5) as usize..(3 * part - 5) as usize]);
    assert_eq!(contents(&r, 0, 16), [0xee; 16], "bytes before the offset are untouched");
}
on_every_store!(a_large_get_is_split_into_ranged_parts_that_cover_it_once);

async fn a_get_that_does_not_fit_writes_nothing(b: Backend) {
    let part = b.part();
    b.insert("t/k", pattern(3 * part as usize, 2)).await;
    let s = b.store();
    let r = region(part);
    let e = get_all(&s, "k", &r).await.unwrap_err();
    assert!(matches!(e, S3Error::DoesNotFit { needed, .. } if needed == 3 * part), "{e}");
    assert_eq!(contents(&r, 0, part), vec![0; part as usize]);
    if let Some(mock) = b.as_mock() {
        assert_eq!(mock.count(Op::Get), 1, "only the first part was asked for (it learns the size)");
    }
}
on_every_store!(a_get_that_does_not_fit_writes_nothing);

async fn a_large_put_is_split_into_parts_and_completed_in_order(b: Backend) {
    let part = b.part();
    let s = b.store();
    let len = 5 * part + 999;
    let r = region(len);
    let data = pattern(len as usize, 3);
    r.write_at(0, &data).unwrap();

    let write = ObjectWrite { key: "up", region: &r, offset: 0, length: len, content_type: "text/plain" };
    let out = s.put_from(&write, &Call::ungated("req")).await.unwrap();
    assert_eq!(out.parts, 6);
    assert_eq!(b.object("t/up").unwrap(), data);
    if let Some(mock) = b.as_mock() {
        assert_eq!((mock.count(Op::Create), mock.count(Op::UploadPart), mock.count(Op::Complete)), (1, 6, 1));
        assert_eq!(mock.open_uploads(), 0);
        assert!(mock.object_headers("t/up").contains(&("content-type".into(), "text/plain".into())));
    }

    // At the threshold: one PUT.
    let out = s.put_from(&ObjectWrite::from_start("small", &r, 4 * part), &Call::ungated("req")).await.unwrap();
    assert_eq!(out.parts, 1);
    assert_eq!(b.object("t/small").unwrap(), data[..(4 * part) as usize]);
}
on_every_store!(a_large_put_is_split_into_parts_and_completed_in_order);

#[tokio::test]
async fn retries_move_to_the_next_endpoint_and_stop_at_max_attempts() {
    let mock = MockStore::new();
    mock.insert("t/k", vec![7u8; 10]);
    let failing = Arc::new(Failing::new(Arc::new(mock.clone())).fail(Op::Head, 0, 2, Failure::Error(slow_down)));
    let s = store(failing.clone(), None);
    let counters = s.counters.clone();

    let meta = s.head("k", "req").await.unwrap();
    assert_eq!(meta.size, 10);
    let eps = failing.endpoints(Op::Head);
    assert_eq!(eps.len(), 3, "two throttled attempts, then one that worked");
    let mut distinct = eps.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "each retry went to the next endpoint: {eps:?}");
    assert_eq!(counters.retries.get(), 2);

    // Always refused: gives up after max_attempts, and says so.
    let failing = Arc::new(Failing::new(Arc::new(mock.clone())).fail(Op::Delete, 0, 100, Failure::Error(refused)));
    let s = store(failing.clone(), None);
    let e = s.delete("k", "req").await.unwrap_err();
    assert!(e.to_string().contains("after 3 attempts"), "{e}");
    assert_eq!(e.code(), sluice_proto::common::ErrorCode::StoreUnavailable);
    assert_eq!(failing.endpoints(Op::Delete).len(), 3);
    assert!(mock.object("t/k").is_some(), "nothing was deleted");
}

async fn client_errors_are_never_retried(b: Backend) {
    fn denied() -> S3Error {
        S3Error::from_response(403, "<Error><Code>SignatureDoesNotMatch</Code></Error>", None)
    }
    let part = b.part();
    b.insert("t/k", pattern(3 * part as usize, 4)).await;
    let s = b.store_with(|c| Arc::new(Failing::new(c).fail(Op::Get, 1, 1, Failure::Error(denied))));
    let e = get_all(&s, "k", &region(3 * part)).await.unwrap_err();
    assert!(matches!(e, S3Error::AccessDenied { .. }), "{e}");
    assert_eq!(s.counters.retries.get(), 0);
}
on_every_store!(client_errors_are_never_retried);

async fn a_broken_body_is_fetched_again_and_the_bytes_are_whole(b: Backend) {
    let part = b.part();
    let len = 4 * part + 10;
    let data = pattern(len as usize, 5);
    b.insert("t/k", data.clone()).await;
    // The first part's body and a later part's body both break midway.
    let s = b.store_with(|c| {
        let failing = Failing::new(c).fail(Op::Get, 0, 1, Failure::BreakBody(1000));
        Arc::new(failing.fail(Op::Get, 2, 1, Failure::BreakBody(part / 2)))
    });
    let r = region(len);
    let out = get_all(&s, "k", &r).await.unwrap();
    assert_eq!(out.bytes, len);
    assert_eq!(contents(&r, 0, len), data);
    if let Some(mock) = b.as_mock() {
        assert_eq!(mock.count(Op::Get), 5 + 2, "each broken part was fetched once more");
    }
}
on_every_store!(a_broken_body_is_fetched_again_and_the_bytes_are_whole);

#[tokio::test]
async fn an_object_replaced_mid_read_fails_the_read() {
    let len = 3 * PART;
    // A whole read (also checked against the store's checksum at the end)
    // and a window (only the parts' own checks stand guard).
    for (start, length) in [(0, None), (1, Some(len - 2))] {
        for store_ignores_if_match in [false, true] {
            let mock = MockStore::new();
            if store_ignores_if_match {
                mock.ignore_if_match();
            }
            mock.insert("t/k", pattern(len as usize, 6));
            let m = mock.clone();
            let replace = Arc::new(move || m.insert("t/k", pattern(len as usize, 7)));
            // After the first part, the object is overwritten (same size).
            let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, 1, 1, Failure::Before(replace));
            let s = store(Arc::new(failing), None);
            let r = region(len);
            let e = s
                .get_into(
                    &ObjectRead { key: "k", start, length, if_match: None },
                    &RegionSlice { region: &r, offset: 0, room: len },
                    &Call::ungated("req"),
                )
                .await
                .unwrap_err();
            assert!(
                matches!(e, S3Error::PreconditionFailed(_)),
                "from {start}, the store ignores If-Match: {store_ignores_if_match}: {e}"
            );
        }
    }
}

async fn listing_strips_the_namespace_prefix_and_pages(b: Backend) {
    for k in ["t/a/1", "t/a/2", "t/b", "t/c", "other/x"] {
        b.insert(k, vec![1u8; 3]).await;
    }
    let s = b.store();
    let page = s.list_page("", "", 2, "", "req").await.unwrap();
    let keys: Vec<_> = page.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["a/1", "a/2"]);
    let next = s.list_page("", &page.next_continuation_token, 10, "/", "req").await.unwrap();
    let keys: Vec<_> = next.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, ["b", "c"], "another namespace's keys never show");
    let grouped = s.list_page("", "", 10, "/", "req").await.unwrap();
    assert_eq!(grouped.common_prefixes, ["a/"]);
}
on_every_store!(listing_strips_the_namespace_prefix_and_pages);

/// A TCP one-sided transport (the agent's side), serving on loopback.
pub(super) async fn tcp_path(mode: DataPathMode) -> TokenPath {
    tcp_path_and_owner(mode).await.0
}

/// A `tcp` data path, and its owner (whose table shows the live windows).
pub(super) async fn tcp_path_and_owner(mode: DataPathMode) -> (TokenPath, Arc<sluice_dataplane::tcp::TcpOwner>) {
    let (owner, listener) = sluice_dataplane::tcp::TcpOwner::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    tokio::spawn(owner.clone().serve(listener));
    let path = TokenPath {
        transport: owner.clone(),
        kind: TransportKind::Tcp,
        mode,
        placement: Placement::Direct,
        min_bytes: 1,
    };
    (path, owner)
}

pub(super) fn remote() -> sluice_dataplane::tcp::TcpRemote {
    sluice_dataplane::tcp::TcpRemote::new(1 << 20)
}

#[tokio::test]
async fn parts_move_one_sidedly_when_the_store_serves_the_token() {
    let mock = MockStore::new();
    mock.set_rdma(RdmaMode::Serve(remote()));
    let len = 4 * PART + 1;
    let data = pattern(len as usize, 8);
    mock.insert("t/k", data.clone());
    let s = store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Auto).await));
    let r = region(len);
    let out = get_all(&s, "k", &r).await.unwrap();
    assert_eq!(contents(&r, 0, len), data);
    // Auto: the first part learns the size over HTTP, the rest is RDMA.
    assert_eq!((out.parts, out.rdma_parts, out.fallbacks.len()), (5, 4, 0));

    // PUT from the region: the store READs it.
    let out = s.put_from(&ObjectWrite::from_start("copy", &r, 2 * PART), &Call::ungated("req")).await.unwrap();
    assert_eq!((out.rdma_parts, out.fallbacks.len()), (1, 0));
    assert_eq!(mock.object("t/copy").unwrap(), data[..(2 * PART) as usize]);
    assert_eq!(mock.calls().iter().filter(|c| c.rdma).count(), 5, "4 GET parts and the PUT carried tokens");
}

#[tokio::test]
async fn rdma_falls_back_to_http_per_part_and_says_why() {
    let cases =
        [(RdmaMode::Decline, "declined"), (RdmaMode::Ignore, "ignored"), (RdmaMode::Short(remote(), 1), "short")];
    for (mode, kind) in cases {
        let mock = MockStore::new();
        mock.set_rdma(mode);
        let len = 3 * PART;
        let data = pattern(len as usize, 9);
        mock.insert("t/k", data.clone());
        let s = store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Auto).await));
        let r = region(len);
        let out = get_all(&s, "k", &r).await.unwrap();
        assert_eq!(contents(&r, 0, len), data, "{kind}");
        assert_eq!(out.rdma_parts, 0, "{kind}");
        assert_eq!(out.fallbacks.len(), 2, "{kind}");
        assert!(out.fallbacks.iter().all(|f| f.kind == kind), "{kind}: {:?}", out.fallbacks);

        // A PUT the store did not take by RDMA is sent again over HTTP, and
        // what is stored is the region's bytes (never an empty object).
        let out = s.put_from(&ObjectWrite::from_start("up", &r, PART), &Call::ungated("req")).await.unwrap();
        assert_eq!(out.fallbacks.len(), 1, "{kind}");
        assert_eq!(mock.object("t/up").unwrap(), data[..PART as usize], "{kind}");
    }
}

/// A store that says it moved a part's bytes but never sent them: the
/// window shows nothing landed, and the part is read over HTTP instead of
/// returning the slot's old bytes as the object.
#[tokio::test]
async fn a_part_the_store_says_it_moved_but_never_landed_is_read_again() {
    let mock = MockStore::new();
    mock.set_rdma(RdmaMode::Phantom);
    // The first part goes over HTTP in `auto`; the other two over RDMA.
    let len = 3 * PART;
    let data = pattern(len as usize, 12);
    mock.insert("t/k", data.clone());
    let s = store(Arc::new(mock.clone()), Some(tcp_path(DataPathMode::Auto).await));
    let r = region(len);
    let out = get_all(&s, "k", &r).await.unwrap();
    assert_eq!(contents(&r, 0, len), data);
    assert_eq!(out.rdma_parts, 0);
    assert_eq!(out.fallbacks.len(), 2, "{:?}", out.fallbacks);
    assert!(out.fallbacks.iter().all(|f| f.kind == "short" && f.message.contains("landed")), "{:?}", out.fallbacks);
}

#[tokio::test]
async fn a_transport_failure_falls_back_and_a_real_s3_error_does_not() {
    let mock = MockStore::new();
    mock.set_rdma(RdmaMode::Serve(remote()));
    let len = 2 * PART;
    mock.insert("t/k", pattern(len as usize, 10));
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, 1, 1, Failure::Error(refused));
    let s = store(Arc::new(failing), Some(tcp_path(DataPathMode::Auto).await));
    let out = get_all(&s, "k", &region(len)).await.unwrap();
    assert_eq!(out.fallbacks.len(), 1);
    assert_eq!(out.fallbacks[0].kind, "transport");

    fn gone() -> S3Error {
        S3Error::from_response(404, "<Error><Code>NoSuchKey</Code></Error>", Some("t/k"))
    }
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, 1, 1, Failure::Error(gone));
    let s = store(Arc::new(failing), Some(tcp_path(DataPathMode::Auto).await));
    let e = get_all(&s, "k", &region(len)).await.unwrap_err();
    assert!(matches!(e, S3Error::NoSuchKey(_)), "{e}");
}

fn qos(queue_timeout: Duration) -> sluice_qos::Qos {
    let cfg = sluice_qos::QosConfig { global_slots: 1, queue_timeout, ..Default::default() };
    let tenants = [("tenant".to_owned(), sluice_qos::Limits::default())].into_iter().collect();
    sluice_qos::Qos::new(cfg, tenants).unwrap()
}

#[tokio::test]
async fn parts_wait_for_the_tenants_scheduler_slot() {
    let mock = MockStore::new();
    let len = 3 * PART;
    let data = pattern(len as usize, 11);
    mock.insert("t/k", data.clone());
    let q = qos(Duration::from_secs(30));
    let held = q.slot("tenant", 1).await.unwrap();
    let permit = q.admit("tenant", len).await.unwrap();
    let s = Arc::new(store(Arc::new(mock.clone()), None));
    let r = region(len);
    let (s2, r2) = (s.clone(), r.clone());
    let transfer = tokio::spawn(async move {
        s2.get_into(
            &ObjectRead::whole("k"),
            &RegionSlice { region: &r2, offset: 0, room: len },
            &Call { request_id: "req", gate: Some(&permit) },
        )
        .await
        .map(|o| o.bytes)
    });
    // The agent's only slot is taken: no request goes out.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(mock.count(Op::Get), 0);
    drop(held);
    assert_eq!(transfer.await.unwrap().unwrap(), len);
    assert_eq!(contents(&r, 0, len), data);
}

#[tokio::test]
async fn a_refused_slot_fails_the_transfer_and_moves_nothing() {
    let mock = MockStore::new();
    mock.insert("t/k", pattern(PART as usize, 12));
    let q = qos(Duration::from_millis(50));
    let _held = q.slot("tenant", 1).await.unwrap();
    let permit = q.admit("tenant", PART).await.unwrap();
    let s = store(Arc::new(mock.clone()), None);
    let r = region(PART);
    let e = s
        .get_into(
            &ObjectRead::whole("k"),
            &RegionSlice { region: &r, offset: 0, room: PART },
            &Call { request_id: "req", gate: Some(&permit) },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, S3Error::Quota(_)), "{e}");
    assert_eq!(e.code(), sluice_proto::common::ErrorCode::QuotaExceeded);
    assert!(mock.calls().is_empty(), "nothing reached the store");
    let e = s
        .put_from(&ObjectWrite::from_start("new", &r, PART), &Call { request_id: "req", gate: Some(&permit) })
        .await
        .unwrap_err();
    assert!(matches!(e, S3Error::Quota(_)), "{e}");
    assert!(mock.object("t/new").is_none());
}

fn aborts(s: &ObjectStore, reason: &str) -> u64 {
    s.counters.multipart_aborts.with_label_values(&[reason]).get()
}

#[tokio::test]
async fn a_failed_part_or_completion_aborts_the_upload() {
    // Not retried (a damaged body, BadDigest, would be: see integrity_tests.rs).
    fn invalid_part() -> S3Error {
        S3Error::from_response(400, "<Error><Code>InvalidPart</Code></Error>", None)
    }
    for op in [Op::UploadPart, Op::Complete] {
        let mock = MockStore::new();
        let failing = Failing::new(Arc::new(mock.clone())).fail(op, 0, 1, Failure::Error(invalid_part));
        let s = store(Arc::new(failing), None);
        let len = 6 * PART;
        let r = region(len);
        let e = s.put_from(&ObjectWrite::from_start("k", &r, len), &Call::ungated("req")).await.unwrap_err();
        assert!(matches!(&e, S3Error::Rejected { code, .. } if code == "InvalidPart"), "{op:?}: {e}");
        until("the abort", || mock.open_uploads() == 0).await;
        assert_eq!(mock.count(Op::Abort), 1, "{op:?}");
        assert_eq!(aborts(&s, "failed"), 1, "{op:?}");
        assert!(mock.object("t/k").is_none(), "{op:?}: nothing was stored");
    }
}

#[tokio::test]
async fn a_dropped_put_aborts_its_upload() {
    let mock = MockStore::new();
    // The second part never answers; the caller gives up (its deadline).
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::UploadPart, 1, 1, Failure::Hang);
    let s = store(Arc::new(failing), None);
    let len = 6 * PART;
    let r = region(len);
    let (write, call) = (ObjectWrite::from_start("k", &r, len), Call::ungated("req"));
    let put = s.put_from(&write, &call);
    assert!(tokio::time::timeout(Duration::from_millis(200), put).await.is_err());
    until("the abort", || mock.open_uploads() == 0).await;
    assert_eq!(aborts(&s, "cancelled"), 1);
    assert!(mock.object("t/k").is_none());
}

async fn a_throttled_part_is_retried_and_the_upload_completes(b: Backend) {
    let part = b.part();
    let failing = Arc::new(Failing::new(b.client()).fail(Op::UploadPart, 3, 2, Failure::Error(slow_down)));
    let s = b.store_with(|_| failing.clone());
    let len = 6 * part;
    let r = region(len);
    let data = pattern(len as usize, 13);
    r.write_at(0, &data).unwrap();
    s.put_from(&ObjectWrite::from_start("k", &r, len), &Call::ungated("req")).await.unwrap();
    assert_eq!(b.object("t/k").unwrap(), data);
    assert_eq!(failing.endpoints(Op::UploadPart).len(), 8);
    assert_eq!(aborts(&s, "failed"), 0);
    if let Some(mock) = b.as_mock() {
        assert_eq!(mock.count(Op::Abort), 0);
    }
}
on_every_store!(a_throttled_part_is_retried_and_the_upload_completes);

/// A read pinned to an ETag (`if_match`, a client reading one object in
/// several requests) is served from that version only: another version is
/// refused before a byte lands, plain and encrypted alike.
async fn a_read_pinned_to_an_etag_refuses_another_version_writing_nothing(b: Backend) {
    const PART: u64 = 64 << 10;
    let s = b.store();
    b.insert("t/k", pattern((3 * PART) as usize, 1)).await;
    let r = region(3 * PART);
    let first = s
        .get_into(
            &ObjectRead { key: "k", start: 0, length: Some(PART), if_match: None },
            &RegionSlice { region: &r, offset: 0, room: r.len() },
            &Call::ungated("req"),
        )
        .await
        .unwrap();
    assert!(!first.etag.is_empty());
    // The same version, by its ETag with or without quotes: served.
    let bare = first.etag.trim_matches('"').to_owned();
    for tag in [first.etag.as_str(), bare.as_str()] {
        let out = s
            .get_into(
                &ObjectRead { key: "k", start: PART, length: None, if_match: Some(tag) },
                &RegionSlice { region: &r, offset: PART, room: r.len() },
                &Call::ungated("req"),
            )
            .await
            .unwrap();
        assert_eq!(out.bytes, 2 * PART);
    }
    // Replaced: a pinned read fails and the region keeps what it held.
    b.insert("t/k", pattern((3 * PART) as usize, 9)).await;
    r.write_at(0, &vec![0xab; (3 * PART) as usize]).unwrap();
    for (start, len) in [(0, None), (PART, Some(PART)), (2 * PART, None)] {
        let e = s
            .get_into(
                &ObjectRead { key: "k", start, length: len, if_match: Some(&first.etag) },
                &RegionSlice { region: &r, offset: 0, room: r.len() },
                &Call::ungated("req"),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, S3Error::PreconditionFailed(_)), "{e:?}");
        assert!(e.to_string().contains("not"), "{e}");
    }
    assert_eq!(contents(&r, 0, 3 * PART), vec![0xab; (3 * PART) as usize], "nothing was written");
    // Unpinned, the new version reads as usual.
    assert!(s
        .get_into(&ObjectRead::whole("k"), &RegionSlice { region: &r, offset: 0, room: r.len() }, &Call::ungated("req"))
        .await
        .is_ok());
}
on_every_store!(a_read_pinned_to_an_etag_refuses_another_version_writing_nothing);

#[test]
fn a_first_part_costs_what_it_can_move() {
    use super::get::first_part_cost;
    // Whole object of unknown size: a part, unless the destination holds less.
    assert_eq!(first_part_cost(None, PART, 10 * PART), PART);
    assert_eq!(first_part_cost(None, PART, 4096), 4096);
    // A range: the range, capped by the part and the room.
    assert_eq!(first_part_cost(Some(100), PART, 10 * PART), 100);
    assert_eq!(first_part_cost(Some(3 * PART), PART, 10 * PART), PART);
    assert_eq!(first_part_cost(Some(3 * PART), PART, 512), 512);
    // No room at all still costs something (the request is refused later).
    assert_eq!(first_part_cost(None, PART, 0), 1);
}
