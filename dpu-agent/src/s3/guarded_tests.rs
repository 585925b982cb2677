//! Failover through the [`S3Client`] seam: an in-memory store behind a
//! wrapper that makes chosen endpoints dead (refused), hung (never
//! answering), or break or stall a GET body midway, and an `ObjectStore`
//! whose endpoints' health and deadlines are the agent's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_dataplane::SharedRegion;

use super::super::call::{Call, ObjectRead, ObjectWrite, RegionSlice};
use super::super::client::{ListQuery, PartOf, PutBody, RangedGet, Reply, S3Client, S3Future, Target};
use super::super::endpoints::{EndpointMetrics, EndpointRegistry};
use super::super::error::S3Error;
use super::super::failing::{Failing, Failure};
use super::super::mock::{MockStore, Op};
use super::super::model::ListPage;
use super::super::store::{ObjectStore, S3Counters};
use crate::config::failover::FailoverConfig;
use crate::config::{NamespaceConfig, S3Tuning};
use crate::hostmem::HostRegion;

const PART: u64 = 64 << 10;
const A: &str = "http://a:1";
const B: &str = "http://b:2";
const C: &str = "http://c:3";

/// What an endpoint does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Fine,
    /// Every request is refused (nothing listens).
    Dead,
    /// Every request is accepted and never answered.
    Hung,
    /// Requests of this kind are never answered (the others are).
    HungOn(Op),
    /// The next GET's body breaks (a reset) after this many bytes; then fine.
    BreakBodyAfter(u64),
    /// The next GET's body stops (never ends) after this many bytes.
    StallBodyAfter(u64),
    /// Every request is answered, this long after it came.
    Slow(Duration),
}

/// A store whose endpoints misbehave as told.
#[derive(Clone)]
struct Faulty {
    inner: Arc<dyn S3Client>,
    modes: Arc<Mutex<HashMap<String, Mode>>>,
    seen: Arc<Mutex<Vec<(Op, String)>>>,
}

impl Faulty {
    fn new(inner: impl S3Client + 'static) -> Self {
        Self { inner: Arc::new(inner), modes: Arc::default(), seen: Arc::default() }
    }

    fn set(&self, endpoint: &str, mode: Mode) {
        self.modes.lock().unwrap().insert(endpoint.to_owned(), mode);
    }

    /// Requests sent to `endpoint` (of kind `op`, or any).
    fn sent(&self, endpoint: &str, op: Option<Op>) -> usize {
        self.seen.lock().unwrap().iter().filter(|(o, e)| e == endpoint && op.is_none_or(|op| op == *o)).count()
    }

    /// What the request meets; a body fault is used up by its GET.
    fn meet(&self, op: Op, at: &Target<'_>) -> Mode {
        self.seen.lock().unwrap().push((op, at.endpoint.to_owned()));
        let mut modes = self.modes.lock().unwrap();
        let mode = modes.get(at.endpoint).copied().unwrap_or(Mode::Fine);
        if op == Op::Get && matches!(mode, Mode::BreakBodyAfter(_) | Mode::StallBodyAfter(_)) {
            modes.insert(at.endpoint.to_owned(), Mode::Fine);
        }
        mode
    }

    async fn before(&self, op: Op, at: &Target<'_>) -> Result<Mode, S3Error> {
        match self.meet(op, at) {
            Mode::Dead => Err(S3Error::Connection {
                message: format!("tcp connect error: Connection refused (os error 111) ({})", at.endpoint),
                attempts: 1,
            }),
            Mode::Hung => futures::future::pending().await,
            Mode::HungOn(o) if o == op => futures::future::pending().await,
            Mode::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(Mode::Fine)
            }
            m => Ok(m),
        }
    }
}

/// `body` after `n` bytes: broken (`stall` false) or stopped for good.
fn cut(body: super::super::client::Body, n: u64, stall: bool) -> super::super::client::Body {
    let left = Arc::new(AtomicU64::new(n));
    let head = body.into_stream().scan(left, |left, c| {
        let item = c.map(|c| {
            let l = left.load(Ordering::Relaxed) as usize;
            let take = c.len().min(l);
            left.store((l - take) as u64, Ordering::Relaxed);
            c.slice(..take)
        });
        futures::future::ready(Some(item))
    });
    let head = head.take_while(|c| futures::future::ready(c.as_ref().map_or(true, |c| !c.is_empty())));
    let tail: futures::stream::BoxStream<'static, Result<bytes::Bytes, S3Error>> = if stall {
        futures::stream::pending().boxed()
    } else {
        futures::stream::iter([Err(S3Error::TransferFailed {
            message: "connection reset by peer".into(),
            attempts: 1,
        })])
        .boxed()
    };
    super::super::client::Body::from_stream(head.chain(tail))
}

impl S3Client for Faulty {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move {
            self.before(Op::Head, &at).await?;
            self.inner.head(at).await
        })
    }

    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        Box::pin(async move {
            let mode = self.before(Op::Get, &at).await?;
            let mut reply = self.inner.get(at, req).await?;
            match mode {
                Mode::BreakBodyAfter(n) => reply.body = cut(reply.body, n, false),
                Mode::StallBodyAfter(n) => reply.body = cut(reply.body, n, true),
                _ => {}
            }
            Ok(reply)
        })
    }

    fn list<'a>(&'a self, at: Target<'a>, query: ListQuery<'a>) -> S3Future<'a, ListPage> {
        Box::pin(async move {
            self.before(Op::List, &at).await?;
            self.inner.list(at, query).await
        })
    }

    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        Box::pin(async move {
            self.before(Op::Delete, &at).await?;
            self.inner.delete(at).await
        })
    }

    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        Box::pin(async move {
            self.before(if part.is_some() { Op::UploadPart } else { Op::Put }, &at).await?;
            self.inner.put(at, part, headers, body).await
        })
    }

    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        Box::pin(async move {
            self.before(Op::Create, &at).await?;
            self.inner.create_upload(at, headers).await
        })
    }

    fn complete_upload<'a>(&'a self, at: Target<'a>, upload_id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        Box::pin(async move {
            self.before(Op::Complete, &at).await?;
            self.inner.complete_upload(at, upload_id, etags).await
        })
    }

    fn abort_upload(&self, at: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        let (this, endpoint, key) = (self.clone(), at.endpoint.to_owned(), at.key.to_owned());
        let inner = self.inner.abort_upload(at, upload_id);
        Box::pin(async move {
            this.before(Op::Abort, &Target { endpoint: &endpoint, key: &key, request_id: "", attempt: 0 }).await?;
            inner.await
        })
    }
}

fn metrics() -> EndpointMetrics {
    let o = |n: &str| prometheus::Opts::new(n, n);
    EndpointMetrics {
        up: prometheus::IntGaugeVec::new(o("up"), &["endpoint"]).unwrap(),
        ejections: prometheus::IntCounterVec::new(o("ejections"), &["endpoint"]).unwrap(),
        failbacks: prometheus::IntCounterVec::new(o("failbacks"), &["endpoint"]).unwrap(),
        failures: prometheus::IntCounterVec::new(o("failures"), &["endpoint", "kind"]).unwrap(),
    }
}

/// A namespace over endpoints a, b and c; a slow backoff (1 s), so a
/// retry that waits shows.
fn store(client: Arc<dyn S3Client>, first_byte_ms: u64, eject_after: u32) -> (ObjectStore, EndpointMetrics) {
    let ns: NamespaceConfig = toml::from_str(&format!(
        "name = \"d\"\nendpoints = [\"{A}\", \"{B}\", \"{C}\"]\nbucket = \"data\"\ncredentials = \"c\"\nprefix = \"t/\"\n"
    ))
    .unwrap();
    let tuning = S3Tuning {
        get_part_size: PART,
        multipart_threshold: 4 * PART,
        put_part_size: PART,
        max_concurrency: 4,
        max_attempts: 3,
        retry_base_ms: 1000,
        ..S3Tuning::default()
    };
    let counters = S3Counters {
        retries: prometheus::IntCounter::new("retries", "r").unwrap(),
        multipart_aborts: prometheus::IntCounterVec::new(prometheus::Opts::new("aborts", "a"), &["reason"]).unwrap(),
    };
    let m = metrics();
    let policy = FailoverConfig {
        first_byte_timeout_ms: first_byte_ms,
        eject_after_failures: eject_after,
        probe_timeout_ms: 100,
        ..FailoverConfig::default()
    };
    let registry = EndpointRegistry::new(policy, Some(m.clone()));
    let s = ObjectStore::new(client, &ns, "tenant", tuning, counters, None).with_failover(&registry, None);
    (s, m)
}

fn region(len: u64) -> Arc<dyn HostRegion> {
    Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("t", len).unwrap()))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed).wrapping_add((i >> 11) as u8)).collect()
}

fn contents(r: &Arc<dyn HostRegion>, len: u64) -> Vec<u8> {
    let mut out = vec![0u8; len as usize];
    r.read_at(0, &mut out).unwrap();
    out
}

async fn get_all(s: &ObjectStore, key: &str, len: u64) -> Result<Vec<u8>, S3Error> {
    let r = region(len);
    s.get_into(&ObjectRead::whole(key), &RegionSlice { region: &r, offset: 0, room: len }, &Call::ungated("req"))
        .await?;
    Ok(contents(&r, len))
}

/// A dead endpoint gets the one request that finds it dead, which goes on
/// at once to another; after that, none until it is back.
#[tokio::test]
async fn a_dead_endpoint_costs_one_request_no_wait_and_then_gets_none() {
    let mock = MockStore::new();
    let data = pattern((5 * PART + 17) as usize, 1);
    mock.insert("t/k", data.clone());
    let faulty = Faulty::new(mock.clone());
    faulty.set(B, Mode::Dead);
    let (s, m) = store(Arc::new(faulty.clone()), 5000, 3);
    let t0 = Instant::now();
    for _ in 0..10 {
        assert_eq!(get_all(&s, "k", data.len() as u64).await.unwrap(), data);
        assert_eq!(s.head("k", "req").await.unwrap().size, data.len() as u64);
    }
    assert!(t0.elapsed() < Duration::from_millis(900), "a retry waited out a backoff: {:?}", t0.elapsed());
    assert_eq!(faulty.sent(B, None), 1, "only the request that found it dead");
    assert_eq!(m.ejections.with_label_values(&[B]).get(), 1);
    assert_eq!(m.up.with_label_values(&[B]).get(), 0);
    assert!(faulty.sent(A, None) > 10 && faulty.sent(C, None) > 10, "the others share the load");

    // Back: its check passes, and it gets requests again.
    faulty.set(B, Mode::Fine);
    s.probe_endpoints(Duration::from_millis(100)).await;
    assert_eq!(m.failbacks.with_label_values(&[B]).get(), 1);
    for _ in 0..3 {
        get_all(&s, "k", data.len() as u64).await.unwrap();
    }
    assert!(faulty.sent(B, Some(Op::Get)) > 0);
}

/// With every endpoint dead, each is tried once and the last one standing
/// is kept (never ejected: there is nowhere else to go): requests still go
/// out, and fail typed, rather than fail without trying. One that answers
/// its check again serves at once.
#[tokio::test]
async fn with_every_endpoint_dead_requests_are_still_tried() {
    let mock = MockStore::new();
    mock.insert("t/k", vec![1u8; 10]);
    let faulty = Faulty::new(mock);
    for e in [A, B, C] {
        faulty.set(e, Mode::Dead);
    }
    let (s, m) = store(Arc::new(faulty.clone()), 5000, 3);
    let e = s.head("k", "req").await.unwrap_err();
    assert!(e.to_string().contains("after 3 attempts"), "{e}");
    assert_eq!([A, B, C].map(|e| faulty.sent(e, None)), [1, 1, 1], "each tried once");
    let up = [A, B, C].map(|e| m.up.with_label_values(&[e]).get());
    assert_eq!(up.iter().sum::<i64>(), 1, "the last one standing is kept: {up:?}");
    let e = s.head("k", "req").await.unwrap_err();
    assert_eq!(e.code(), sluice_proto::common::ErrorCode::StoreUnavailable);
    assert_eq!([A, B, C].map(|e| faulty.sent(e, None)).iter().sum::<usize>(), 6, "still tried");

    // One comes back: its check passes, it serves; the dead get nothing.
    faulty.set(B, Mode::Fine);
    s.probe_endpoints(Duration::from_millis(100)).await;
    assert_eq!(m.up.with_label_values(&[B]).get(), 1);
    s.head("k", "req").await.unwrap();
    let before = faulty.sent(A, None) + faulty.sent(C, None);
    for _ in 0..3 {
        s.head("k", "req").await.unwrap();
    }
    assert_eq!(faulty.sent(A, None) + faulty.sent(C, None), before, "the dead ones get nothing");
}

/// A hung endpoint (accepts, never answers) costs the request that finds
/// it the first-byte deadline, once: the retry goes elsewhere and the
/// endpoint, ejected, gets no more requests — a multipart PUT whose first
/// request finds it pays one deadline, not one per request.
#[tokio::test]
async fn a_hung_endpoint_costs_a_request_the_first_byte_deadline_once() {
    let mock = MockStore::new();
    let data = pattern((6 * PART) as usize, 2);
    mock.insert("t/k", data.clone());
    let faulty = Faulty::new(mock.clone());
    faulty.set(A, Mode::Hung);
    let (s, m) = store(Arc::new(faulty.clone()), 150, 3);
    let mut took = Vec::new();
    for _ in 0..4 {
        let t0 = Instant::now();
        assert_eq!(s.head("k", "req").await.unwrap().size, data.len() as u64);
        took.push(t0.elapsed());
    }
    assert!(took[0] >= Duration::from_millis(150) && took[0] < Duration::from_millis(450), "{took:?}");
    assert!(took[1..].iter().all(|t| *t < Duration::from_millis(100)), "{took:?}");
    assert_eq!(faulty.sent(A, None), 1, "ejected by its first missed deadline");
    assert_eq!(m.failures.with_label_values(&[A, "deadline"]).get(), 1);
    let t0 = Instant::now();
    assert_eq!(get_all(&s, "k", data.len() as u64).await.unwrap(), data);
    assert!(t0.elapsed() < Duration::from_millis(100), "no part waits on the hung endpoint any more");

    // Back, then hanging the creation of uploads: the PUT whose creation
    // finds it pays the deadline once; nothing more is sent there. (A
    // part's own deadline is the HTTP client's: `first_byte`.)
    faulty.set(A, Mode::Fine);
    s.probe_endpoints(Duration::from_millis(100)).await;
    faulty.set(A, Mode::HungOn(Op::Create));
    let (r, len) = (region(6 * PART), 6 * PART);
    r.write_at(0, &data).unwrap();
    let mut slowest = Duration::ZERO;
    for key in ["p1", "p2", "p3", "p4"] {
        let t0 = Instant::now();
        s.put_from(&ObjectWrite { key, region: &r, offset: 0, length: len, content_type: "" }, &Call::ungated("req"))
            .await
            .unwrap();
        slowest = slowest.max(t0.elapsed());
        assert_eq!(mock.object(&format!("t/{key}")).unwrap(), data);
    }
    assert!(slowest < Duration::from_millis(450), "one deadline at most: {slowest:?}");
    assert!(faulty.sent(A, Some(Op::Create)) <= 1, "at most one creation found it hung");
}

/// Every endpoint answers later than the first-byte deadline, as the one
/// gateway left up does under the load of its dead partner's clients: the
/// first try misses it, the retry waits twice as long and is served,
/// rather than every try being cut short until the request fails.
#[tokio::test]
async fn a_retry_waits_longer_than_the_try_that_missed_the_deadline() {
    let mock = MockStore::new();
    mock.insert("t/k", vec![7u8; 10]);
    let faulty = Faulty::new(mock);
    for e in [A, B, C] {
        faulty.set(e, Mode::Slow(Duration::from_millis(300)));
    }
    let (s, m) = store(Arc::new(faulty.clone()), 200, 3);
    let t0 = Instant::now();
    assert_eq!(s.head("k", "req").await.unwrap().size, 10);
    let took = t0.elapsed();
    let tries = [A, B, C].map(|e| faulty.sent(e, None));
    assert_eq!(tries.iter().sum::<usize>(), 2, "served by the second try: {tries:?}");
    assert!(took >= Duration::from_millis(500) && took < Duration::from_millis(900), "{took:?}");
    let missed: u64 = [A, B, C].map(|e| m.failures.with_label_values(&[e, "deadline"]).get()).iter().sum();
    assert_eq!(missed, 1, "only the first try missed its deadline");
}

/// A GET part whose body breaks midway resumes from the byte it reached,
/// on another endpoint, pinned to the ETag of its first reply: one request
/// more, the bytes exact.
#[tokio::test]
async fn a_broken_get_part_resumes_from_its_offset_on_another_endpoint() {
    let mock = MockStore::new();
    let len = 4 * PART + 10;
    let data = pattern(len as usize, 3);
    mock.insert("t/k", data.clone());
    let faulty = Faulty::new(mock.clone());
    faulty.set(A, Mode::BreakBodyAfter(1000));
    let (s, _) = store(Arc::new(faulty.clone()), 5000, 3);
    assert_eq!(get_all(&s, "k", len).await.unwrap(), data);
    let gets: Vec<_> = mock.calls().into_iter().filter(|c| c.op == Op::Get).collect();
    assert_eq!(gets.len(), 5 + 1, "one continuation, no part fetched again from its start");
    let first = &gets[0];
    assert_eq!((first.endpoint.as_str(), first.range), (A, Some((0, PART - 1))));
    let cont = gets.iter().find(|c| c.range.is_some_and(|(a, _)| a == 1000)).expect("a continuation from byte 1000");
    assert_eq!(cont.range, Some((1000, PART - 1)));
    assert_ne!(cont.endpoint, A, "resumed on another endpoint");
    let etag = mock.calls().iter().find_map(|c| c.if_match.clone()).unwrap();
    assert_eq!(cont.if_match.as_deref(), Some(etag.as_str()), "pinned to the version it started on");
}

/// A body that stops (a gateway hung mid-body) resumes elsewhere after the
/// first-byte deadline, not the read timeout.
#[tokio::test]
async fn a_stalled_get_body_resumes_elsewhere_after_the_deadline() {
    let mock = MockStore::new();
    let len = 3 * PART;
    let data = pattern(len as usize, 4);
    mock.insert("t/k", data.clone());
    let faulty = Faulty::new(mock);
    faulty.set(A, Mode::StallBodyAfter(PART / 2 + 3));
    let (s, m) = store(Arc::new(faulty), 150, 3);
    let t0 = Instant::now();
    assert_eq!(get_all(&s, "k", len).await.unwrap(), data);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(150) && took < Duration::from_millis(700), "{took:?}");
    assert_eq!(m.failures.with_label_values(&[A, "deadline"]).get(), 1);
}

/// The object replaced between a part's break and its continuation: the
/// read fails (412 from a store that honours If-Match; the ETag check for
/// one that ignores it), never bytes of two versions.
#[tokio::test]
async fn a_resume_never_mixes_two_versions() {
    for ignores_if_match in [false, true] {
        let mock = MockStore::new();
        if ignores_if_match {
            mock.ignore_if_match();
        }
        let len = 2 * PART;
        mock.insert("t/k", pattern(len as usize, 5));
        // The continuation (the second GET) finds a new version.
        let m2 = mock.clone();
        let replace = Arc::new(move || m2.insert("t/k", pattern(len as usize, 6)));
        let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Get, 1, 1, Failure::Before(replace));
        let faulty = Faulty::new(failing);
        faulty.set(A, Mode::BreakBodyAfter(500));
        let (s, _) = store(Arc::new(faulty), 5000, 3);
        let r = region(len);
        let e = s
            .get_into(
                &ObjectRead { key: "k", start: 0, length: Some(PART), if_match: None },
                &RegionSlice { region: &r, offset: 0, room: len },
                &Call::ungated("req"),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, S3Error::PreconditionFailed(_)), "ignores If-Match {ignores_if_match}: {e}");
        let cont = mock.calls().into_iter().filter(|c| c.op == Op::Get).nth(1).unwrap();
        assert_eq!(cont.range, Some((500, PART - 1)), "it was a continuation");
    }
}

/// A multipart upload with one endpoint dead: its parts are sent again
/// through the others; the object is whole, nothing is left open.
#[tokio::test]
async fn put_parts_sent_to_a_dead_endpoint_are_sent_again_elsewhere() {
    let mock = MockStore::new();
    let faulty = Faulty::new(mock.clone());
    faulty.set(C, Mode::Dead);
    let (s, _) = store(Arc::new(faulty.clone()), 5000, 3);
    let len = 6 * PART + 5;
    let r = region(len);
    let data = pattern(len as usize, 7);
    r.write_at(0, &data).unwrap();
    let out = s.put_from(&ObjectWrite::from_start("big", &r, len), &Call::ungated("req")).await.unwrap();
    assert_eq!(out.parts, 7);
    assert_eq!(mock.object("t/big").unwrap(), data);
    assert_eq!(mock.open_uploads(), 0);
    // Parts in flight at once may each find it dead before it is ejected.
    let to_c = faulty.sent(C, None);
    assert!((1..=5).contains(&to_c), "{to_c}");

    // A part that hangs counts against its endpoint but the PUT deadline is
    // the HTTP client's; a part refused midway is sent again elsewhere.
    faulty.set(C, Mode::Fine);
    s.probe_endpoints(Duration::from_millis(100)).await;
    faulty.set(B, Mode::Dead);
    s.put_from(&ObjectWrite::from_start("big2", &r, len), &Call::ungated("req")).await.unwrap();
    assert_eq!(mock.object("t/big2").unwrap(), data);
    let to_b = faulty.sent(B, None);
    s.put_from(&ObjectWrite::from_start("big3", &r, len), &Call::ungated("req")).await.unwrap();
    assert_eq!(faulty.sent(B, None), to_b, "once ejected, it gets no part");
    assert!(mock.object("t/big3").unwrap() == data && mock.open_uploads() == 0);
}

/// The readiness probe lists through each endpoint with its own deadline:
/// a hung endpoint fails its own probe in time, the others pass.
#[tokio::test]
async fn the_readiness_probe_of_a_hung_endpoint_ends_at_its_deadline() {
    let faulty = Faulty::new(MockStore::new());
    faulty.set(B, Mode::Hung);
    let (s, m) = store(Arc::new(faulty), 5000, 1);
    let t0 = Instant::now();
    let r = s.probe_endpoints(Duration::from_millis(100)).await;
    assert!(t0.elapsed() < Duration::from_millis(500));
    let ok: Vec<bool> = r.iter().map(|(_, r)| r.is_ok()).collect();
    assert_eq!(ok, [true, false, true], "{r:?}");
    assert_eq!(m.up.with_label_values(&[B]).get(), 0, "the failed probe counts against it");
}

/// RGW's answer when a gateway that took on the completion of an upload
/// hung holding its lock.
fn completion_in_progress() -> S3Error {
    S3Error::from_response(
        500,
        "<Error><Code>InternalError</Code><Message>This multipart completion is already in progress</Message></Error>",
        None,
    )
}

/// A completion a hung gateway holds cannot be retried through another
/// (RGW refuses while that one holds the upload's lock): it is not retried,
/// not counted against the gateway that said so, and the object is uploaded
/// again under a new upload; the first one is aborted.
#[tokio::test]
async fn a_completion_held_by_a_hung_gateway_uploads_again() {
    let mock = MockStore::new();
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Complete, 0, 1, Failure::Error(completion_in_progress));
    let (s, m) = store(Arc::new(failing), 5000, 1);
    let len = 6 * PART;
    let r = region(len);
    let data = pattern(len as usize, 8);
    r.write_at(0, &data).unwrap();
    s.put_from(&ObjectWrite::from_start("held", &r, len), &Call::ungated("req")).await.unwrap();
    assert_eq!(mock.object("t/held").unwrap(), data);
    assert_eq!((mock.count(Op::Create), mock.count(Op::Complete)), (2, 1), "one new upload, no retried completion");
    let t0 = Instant::now();
    while mock.open_uploads() > 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the first upload was not aborted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for e in [A, B, C] {
        assert_eq!(m.up.with_label_values(&[e]).get(), 1, "{e} is not to blame");
    }
}
