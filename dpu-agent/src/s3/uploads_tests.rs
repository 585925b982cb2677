//! The upload journal: write-ahead, replay after a crash, abort at start,
//! and the lifecycle rule.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::super::call::{Call, ObjectWrite};
use super::super::client::S3Client;
use super::super::client::{ListQuery, PartOf, PutBody, RangedGet, Reply, S3Future, Target};
use super::super::endpoints::EndpointRegistry;
use super::super::error::S3Error;
use super::super::failing::{refused, Failing, Failure};
use super::super::mock::{MockStore, Op};
use super::super::store::{ObjectStore, S3Counters};
use super::super::sweeper::*;
use super::*;
use crate::config::{NamespaceConfig, S3Tuning};

const PART: u64 = 64 << 10;

fn entry(n: u32) -> Entry {
    Entry {
        namespace: "alpha/data".into(),
        bucket: "data".into(),
        key: format!("t/dir with space/%{n}\n"),
        upload_id: format!("2~id {n}"),
    }
}

fn counters() -> S3Counters {
    S3Counters {
        retries: prometheus::IntCounter::new("retries", "r").unwrap(),
        multipart_aborts: prometheus::IntCounterVec::new(prometheus::Opts::new("aborts", "a"), &["reason"]).unwrap(),
    }
}

fn store(client: Arc<dyn S3Client>, journal: Option<&Arc<Journal>>) -> ObjectStore {
    let ns: NamespaceConfig = toml::from_str(
        "name = \"data\"\nendpoints = [\"http://a:1\", \"http://b:2\"]\nbucket = \"data\"\ncredentials = \"c\"\nprefix = \"t/\"\n",
    )
    .unwrap();
    let tuning = S3Tuning {
        get_part_size: PART,
        multipart_threshold: 4 * PART,
        put_part_size: PART,
        max_attempts: 3,
        retry_base_ms: 1,
        ..S3Tuning::default()
    };
    let log = journal.map(|j| UploadLog::new(j.clone(), "alpha/data", "data"));
    let registry = EndpointRegistry::new(Default::default(), None);
    ObjectStore::new(client, &ns, "alpha", tuning, counters(), None).with_failover(&registry, log)
}

fn region(data: &[u8]) -> Arc<dyn crate::hostmem::HostRegion> {
    let r: Arc<dyn crate::hostmem::HostRegion> = Arc::new(sluice_dataplane::SharedRegion::new(
        sluice_shm::MappedRegion::create("t", data.len() as u64).unwrap(),
    ));
    r.write_at(0, data).unwrap();
    r
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a run leaves open is what the next one finds, odd characters and
/// all; a torn last line is skipped; the file is rewritten to the open
/// uploads only.
#[test]
fn the_journal_replays_what_a_crashed_run_left_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (j, left) = Journal::open(dir.path()).unwrap();
        assert!(left.is_empty());
        for n in 0..3 {
            j.started(entry(n)).unwrap();
        }
        j.ended(&entry(1).upload_id).unwrap();
        j.ended("never started").unwrap();
        // Killed mid-write of a fourth line.
        j.lock().file.write_all(b"S alpha%2Fdata data 2~torn").unwrap();
    }
    let (j, left) = Journal::open(dir.path()).unwrap();
    assert_eq!(left, vec![entry(0), entry(2)]);
    assert_eq!(j.open_uploads(), left);
    let text = std::fs::read_to_string(dir.path().join(JOURNAL)).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(!text.contains("torn") && !text.contains("E "), "{text}");
}

/// A write that failed part-way while the agent ran (a full disk) leaves a
/// torn line in the middle of the journal; the lines after it are whole,
/// and replayed (they ran into the torn one, and both were lost).
#[test]
fn a_line_torn_while_running_costs_no_other_line() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (j, _) = Journal::open(dir.path()).unwrap();
        j.started(entry(0)).unwrap();
        j.lock().file.write_all(b"S alpha%2Fdata data 2~to").unwrap();
        j.started(entry(1)).unwrap();
        j.started(entry(2)).unwrap();
        j.ended(&entry(2).upload_id).unwrap();
    }
    let (_j, left) = Journal::open(dir.path()).unwrap();
    assert_eq!(left, vec![entry(0), entry(1)]);
}

/// A second agent on the same state directory would abort the first one's
/// live uploads: refused.
#[test]
fn one_agent_per_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (_j, _) = Journal::open(dir.path()).unwrap();
    let e = Journal::open(dir.path()).err().expect("locked");
    assert!(matches!(e, UploadsError::Locked(_)), "{e}");
    assert!(e.to_string().contains("another sluice-agent"), "{e}");
}

/// An upload is journaled once the store named it and before its first
/// part is sent, and ended when it completes or is aborted.
#[tokio::test]
async fn uploads_are_journaled_before_their_parts_and_ended_after() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path()).unwrap();
    let mock = MockStore::new();
    let (j2, m2) = (j.clone(), mock.clone());
    // Checked when the first part is sent.
    let check = Arc::new(move || {
        assert_eq!(j2.open_uploads().len(), 1, "journaled before any part");
        assert_eq!(m2.open_uploads(), 1);
    });
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::UploadPart, 0, 1, Failure::Before(check));
    let s = store(Arc::new(failing), Some(&j));
    let data = vec![9u8; (6 * PART) as usize];
    s.put_from(&ObjectWrite::from_start("k", &region(&data), data.len() as u64), &Call::ungated("req")).await.unwrap();
    assert_eq!(mock.object("t/k").unwrap(), data);
    until("the end in the journal", || j.open_uploads().is_empty()).await;

    // A failed upload is aborted, and its end journaled.
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::UploadPart, 1, 100, Failure::Error(refused));
    let s = store(Arc::new(failing), Some(&j));
    s.put_from(&ObjectWrite::from_start("k2", &region(&data), data.len() as u64), &Call::ungated("req"))
        .await
        .unwrap_err();
    until("the abort", || mock.open_uploads() == 0).await;
    until("the end in the journal", || j.open_uploads().is_empty()).await;
}

/// An agent killed mid-PUT: the next start aborts what the journal says is
/// open (the store's NoSuchUpload counts as done), and ends it.
#[tokio::test]
async fn the_next_start_aborts_what_a_killed_run_left() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockStore::new();
    // A journal as a killed agent leaves it: one upload open in the store.
    let id = mock_upload(&mock).await;
    {
        let (j, _) = Journal::open(dir.path()).unwrap();
        j.started(Entry { namespace: "alpha/data".into(), bucket: "data".into(), key: "t/k".into(), upload_id: id })
            .unwrap();
        // An upload the store completed since (the end was not journaled),
        // and one of a namespace that is gone.
        j.started(Entry { upload_id: "completed".into(), ..entry(0) }).unwrap();
        j.started(Entry { namespace: "alpha/gone".into(), ..entry(1) }).unwrap();
    }
    assert_eq!(mock.open_uploads(), 1);
    let (j, left) = Journal::open(dir.path()).unwrap();
    assert_eq!(left.len(), 3);
    assert_eq!(j.abandoned().len(), 3, "what the last run left, no request owns");
    let s = Arc::new(store(Arc::new(mock.clone()), Some(&j)));
    let aborted = prometheus::IntCounter::new("left", "l").unwrap();
    let stores = [("alpha/data".to_owned(), s)].into_iter().collect();
    assert_eq!(Sweeper::default().sweep(&j, &stores, &aborted).await, 0);
    assert_eq!(mock.open_uploads(), 0, "the left upload is aborted");
    assert_eq!(aborted.get(), 2, "it and the completed one (gone: done)");
    until("the journal empty", || j.open_uploads().is_empty()).await;
}

/// An upload whose abort fails (the store down, an upload a hung gateway
/// holds) is aborted by a later sweep, not left until the next start.
#[tokio::test]
async fn an_upload_whose_abort_failed_is_swept_later() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path()).unwrap();
    let mock = MockStore::new();
    // Every part fails, and so does every abort the failed PUT sends.
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::UploadPart, 0, 100, Failure::Error(refused));
    let s = store(Arc::new(AbortsFail(failing)), Some(&j));
    let data = vec![1u8; (6 * PART) as usize];
    s.put_from(&ObjectWrite::from_start("k", &region(&data), data.len() as u64), &Call::ungated("req"))
        .await
        .unwrap_err();
    until("the abort given up", || j.abandoned().len() == 1).await;
    assert_eq!(mock.open_uploads(), 1);
    // The store answers again: the sweep aborts it.
    let s = Arc::new(store(Arc::new(mock.clone()), Some(&j)));
    let aborted = prometheus::IntCounter::new("left", "l").unwrap();
    let stores = [("alpha/data".to_owned(), s)].into_iter().collect();
    assert_eq!(Sweeper::default().sweep(&j, &stores, &aborted).await, 0);
    assert_eq!((mock.open_uploads(), aborted.get()), (0, 1));
    until("the journal empty", || j.open_uploads().is_empty()).await;
}

/// A client whose aborts all fail.
struct AbortsFail(Failing);

impl S3Client for AbortsFail {
    fn head<'a>(&'a self, at: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        self.0.head(at)
    }
    fn get<'a>(&'a self, at: Target<'a>, req: RangedGet<'a>) -> S3Future<'a, Reply> {
        self.0.get(at, req)
    }
    fn list<'a>(&'a self, at: Target<'a>, q: ListQuery<'a>) -> S3Future<'a, crate::s3::model::ListPage> {
        self.0.list(at, q)
    }
    fn delete<'a>(&'a self, at: Target<'a>) -> S3Future<'a, ()> {
        self.0.delete(at)
    }
    fn put<'a>(
        &'a self,
        at: Target<'a>,
        part: Option<PartOf<'a>>,
        headers: &'a [(&'static str, String)],
        body: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        self.0.put(at, part, headers, body)
    }
    fn create_upload<'a>(&'a self, at: Target<'a>, headers: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        self.0.create_upload(at, headers)
    }
    fn complete_upload<'a>(&'a self, at: Target<'a>, id: &'a str, etags: &'a [String]) -> S3Future<'a, String> {
        self.0.complete_upload(at, id, etags)
    }
    fn abort_upload(&self, _: Target<'_>, _: &str) -> S3Future<'static, ()> {
        Box::pin(async { Err(refused()) })
    }
}

/// An upload open in `mock`, as a killed agent leaves one.
async fn mock_upload(mock: &MockStore) -> String {
    let at = Target { endpoint: "http://a:1", key: "t/k", request_id: "r", attempt: 0 };
    mock.create_upload(at, &[]).await.unwrap()
}

/// The rule goes next to the bucket's rules, in their form, once.
#[test]
fn the_abort_rule_keeps_the_buckets_rules() {
    let xml = with_abort_rule(None, "sluice-x", "a&b/", 7).unwrap();
    assert!(xml.starts_with("<LifecycleConfiguration"), "{xml}");
    assert!(xml.contains("<Rule><ID>sluice-x</ID><Filter><Prefix>a&amp;b/</Prefix></Filter><Status>Enabled</Status>"));
    assert!(xml.contains("<DaysAfterInitiation>7</DaysAfterInitiation>"), "{xml}");
    let theirs = "<LifecycleConfiguration><Rule><ID>logs</ID><Prefix>logs/</Prefix><Status>Enabled</Status>\
                  <Expiration><Days>30</Days></Expiration></Rule></LifecycleConfiguration>";
    let xml = with_abort_rule(Some(theirs), "sluice-x", "", 2).unwrap();
    assert!(xml.contains("<ID>logs</ID>") && xml.contains("<Rule><ID>sluice-x</ID><Prefix></Prefix>"), "{xml}");
    assert!(xml.ends_with("</Rule></LifecycleConfiguration>"), "{xml}");
    assert!(with_abort_rule(Some("<Error/>"), "x", "", 1).is_err());
}

/// Uploads by id: key, when initiated, parts.
type Uploads = BTreeMap<String, (String, SystemTime, usize)>;

/// A store that lists uploads (and only that).
#[derive(Clone, Default)]
struct Listing(Arc<std::sync::Mutex<Uploads>>);

fn nothing<T: Send + 'static>() -> S3Future<'static, T> {
    Box::pin(async { Err(S3Error::Unsupported("not in this test".into())) })
}

impl S3Client for Listing {
    fn head<'a>(&'a self, _: Target<'a>) -> S3Future<'a, http::HeaderMap> {
        nothing()
    }
    fn get<'a>(&'a self, _: Target<'a>, _: RangedGet<'a>) -> S3Future<'a, Reply> {
        nothing()
    }
    fn list<'a>(&'a self, _: Target<'a>, _: ListQuery<'a>) -> S3Future<'a, crate::s3::model::ListPage> {
        nothing()
    }
    fn delete<'a>(&'a self, _: Target<'a>) -> S3Future<'a, ()> {
        nothing()
    }
    fn put<'a>(
        &'a self,
        _: Target<'a>,
        _: Option<PartOf<'a>>,
        _: &'a [(&'static str, String)],
        _: PutBody,
    ) -> S3Future<'a, http::HeaderMap> {
        nothing()
    }
    fn create_upload<'a>(&'a self, _: Target<'a>, _: &'a [(&'static str, String)]) -> S3Future<'a, String> {
        nothing()
    }
    fn complete_upload<'a>(&'a self, _: Target<'a>, _: &'a str, _: &'a [String]) -> S3Future<'a, String> {
        nothing()
    }
    fn abort_upload(&self, _: Target<'_>, upload_id: &str) -> S3Future<'static, ()> {
        self.0.lock().unwrap().remove(upload_id);
        Box::pin(async { Ok(()) })
    }
    fn list_uploads<'a>(&'a self, _: Target<'a>, prefix: &'a str) -> S3Future<'a, Vec<Listed>> {
        let all = self.0.lock().unwrap().clone();
        Box::pin(async move {
            Ok(all
                .into_iter()
                .filter(|(_, (k, _, _))| k.starts_with(prefix))
                .map(|(id, (key, t, _))| Listed { key, upload_id: id, initiated: Some(t) })
                .collect())
        })
    }
    fn count_parts<'a>(&'a self, _: Target<'a>, upload_id: &'a str) -> S3Future<'a, usize> {
        let n = self.0.lock().unwrap().get(upload_id).map(|u| u.2);
        Box::pin(async move { n.ok_or_else(|| S3Error::NoSuchKey("gone".into())) })
    }
}

/// A CreateMultipartUpload a hung gateway took and answered no one: the
/// upload it creates when it wakes is aborted once it has shown no part in
/// two sweeps; a writer's live upload of the same key (it has parts), the
/// agent's own, an older one and another key's are left alone.
#[tokio::test]
async fn an_upload_a_hung_gateway_created_unasked_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path()).unwrap();
    let store_side = Listing::default();
    let now = SystemTime::now();
    {
        let mut u = store_side.0.lock().unwrap();
        u.insert("zombie".into(), ("t/k".into(), now + Duration::from_secs(30), 0));
        u.insert("a-writer's".into(), ("t/k".into(), now, 2));
        u.insert("ours".into(), ("t/k".into(), now, 0));
        u.insert("older".into(), ("t/k".into(), now - Duration::from_secs(3600), 0));
        u.insert("other key".into(), ("t/k2".into(), now, 0));
    }
    j.started(Entry {
        namespace: "alpha/data".into(),
        bucket: "data".into(),
        key: "t/k".into(),
        upload_id: "ours".into(),
    })
    .unwrap();
    let s = Arc::new(store(Arc::new(store_side.clone()), Some(&j)));
    UploadLog::new(j.clone(), "alpha/data", "data").suspect("t/k");
    let stores = [("alpha/data".to_owned(), s)].into_iter().collect();
    let aborted = prometheus::IntCounter::new("left", "l").unwrap();
    let mut sweeper = Sweeper::default();
    sweeper.sweep(&j, &stores, &aborted).await;
    assert_eq!(store_side.0.lock().unwrap().len(), 5, "seen without parts once: not yet");
    sweeper.sweep(&j, &stores, &aborted).await;
    let left: Vec<String> = store_side.0.lock().unwrap().keys().cloned().collect();
    assert_eq!(left, ["a-writer's", "older", "other key", "ours"]);
    assert_eq!(aborted.get(), 1);
}

/// RGW's ListMultipartUploads and ListParts replies.
#[test]
fn listings_parse() {
    let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListMultipartUploadsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
        <Bucket>data</Bucket><NextKeyMarker></NextKeyMarker><MaxUploads>1000</MaxUploads><IsTruncated>false</IsTruncated>\
        <Upload><Key>t/k</Key><UploadId>2~abc</UploadId><Initiator><ID>u</ID></Initiator>\
        <StorageClass>STANDARD</StorageClass><Initiated>2026-11-25T23:40:01.123Z</Initiated></Upload>\
        </ListMultipartUploadsResult>";
    let l = parse_listed(xml).unwrap();
    assert_eq!((l[0].key.as_str(), l[0].upload_id.as_str()), ("t/k", "2~abc"));
    let t = l[0].initiated.unwrap().duration_since(std::time::UNIX_EPOCH).unwrap();
    assert_eq!(t.as_millis(), 1_795_650_001_123);
    assert!(parse_listed("<ListMultipartUploadsResult></ListMultipartUploadsResult>").unwrap().is_empty());
    let parts = "<ListPartsResult><Part><PartNumber>1</PartNumber></Part><Part><PartNumber>2</PartNumber></Part></ListPartsResult>";
    assert_eq!((count_listed_parts(parts), count_listed_parts("<ListPartsResult/>")), (2, 0));
}

/// A PUT dropped while its CreateMultipartUpload is out (its caller
/// cancelled, or its deadline passed) may have created an upload nobody
/// knows the id of: its key becomes a suspect, which the sweeper looks for,
/// as after a create that went unanswered.
#[tokio::test]
async fn a_put_dropped_while_its_upload_is_created_leaves_a_suspect() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(dir.path()).unwrap();
    let mock = MockStore::new();
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Create, 0, 1, Failure::Hang);
    let s = store(Arc::new(failing), Some(&j));
    let data = vec![5u8; (6 * PART) as usize];
    let r = region(&data);
    let write = ObjectWrite::from_start("dropped", &r, data.len() as u64);
    let call = Call::ungated("req");
    let put = s.put_from(&write, &call);
    assert!(tokio::time::timeout(Duration::from_millis(300), put).await.is_err(), "the create hangs");
    let suspects: Vec<String> = j.take_suspects().into_iter().map(|s| s.key).collect();
    assert_eq!(suspects, ["t/dropped"]);
    assert!(j.open_uploads().is_empty());
}
