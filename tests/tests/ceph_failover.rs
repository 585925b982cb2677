//! Ceph RGW gateways dying and hanging under load, and an agent dying
//! mid-PUT (feature `ceph`; the Ceph lane of scripts/test): a namespace over
//! two radosgw rides through one of them dying (SIGKILL) or hanging
//! (SIGSTOP) with no client-visible error, no wrong byte and no multipart
//! upload left behind; `/ready` stays 200 and names the endpoint that is
//! down; an agent SIGKILLed mid-PUT aborts the upload it left when it starts
//! again. Each test prints what it measured (slowest request, time to fail
//! back) on one `ceph-failover:` line.
//!
//! Sizes are scaled for the lane's 600 s budget on 2 CPUs (the full sizes
//! of the issue, 64 MiB reads and 256 MiB writes, with
//! `SLUICE_FAILOVER_FULL=1`).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_tests::ceph::{CephCluster, Tenant};
use sluice_tests::{boto3_as, pattern, sha256, Options, Stack};

/// The first-byte deadline the agents run with here.
const FIRST_BYTE_MS: u64 = 1500;
const CLIENTS: usize = 16;

/// (bytes of an object read, bytes of an object written, rounds per client).
fn sizes() -> (usize, usize, usize) {
    if std::env::var_os("SLUICE_FAILOVER_FULL").is_some() {
        (64 << 20, 256 << 20, 2)
    } else {
        (16 << 20, 48 << 20, 2)
    }
}

/// The gateway-failure tests run one at a time: each loads the machine,
/// and one's load would count as the other's hang.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A stack whose only namespace, "data", has both gateways as endpoints.
fn stack(cluster: &CephCluster, tenant: &Tenant) -> Stack {
    stack_with(cluster, tenant, "")
}

/// [`stack`], with more tables in the agent's config (after `[failover]`).
fn stack_with(cluster: &CephCluster, tenant: &Tenant, tables: &str) -> Stack {
    Stack::with(Options {
        endpoints: cluster.urls(),
        agent_credentials: (tenant.access_key.clone(), tenant.secret_key.clone()),
        gateway: false,
        only_data: true,
        s3: "get_part_size = 8388608\nmultipart_threshold = 16777216\nput_part_size = 8388608\nmax_concurrency = 4\n\
             max_attempts = 4\nretry_base_ms = 50\n"
            .into(),
        agent_failover: format!(
            "first_byte_timeout_ms = {FIRST_BYTE_MS}\neject_after_failures = 3\nprobe_interval_ms = 250\n\
             probe_timeout_ms = 1000\n{tables}"
        ),
        ..Default::default()
    })
}

/// Multipart uploads in progress in the tenant's bucket, by boto3.
fn uploads(cluster: &CephCluster, tenant: &Tenant) -> usize {
    let keys = (tenant.access_key.as_str(), tenant.secret_key.as_str());
    boto3_as(cluster.endpoints[1], keys, &["uploads", "data", ""]).parse().unwrap()
}

/// No multipart upload is left in the tenant's bucket (boto3 lists them):
/// at once, or within a sweep of the agent's (an upload whose abort
/// failed — one a hung gateway held — is aborted again every 10 s).
fn no_uploads_left(stack: &Stack, cluster: &CephCluster, tenant: &Tenant) {
    let t0 = Instant::now();
    loop {
        let left = uploads(cluster, tenant);
        if left == 0 {
            return;
        }
        if t0.elapsed() > Duration::from_secs(25) {
            let log = stack.log("sluice-agent");
            let lines: Vec<&str> = log.lines().filter(|l| l.contains("upload")).collect();
            panic!("{left} multipart uploads left in the store; the agent said:\n{}", lines.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Polls `/ready` until `want` holds of it (at most `within`); returns the
/// body that did.
fn ready_until(stack: &Stack, within: Duration, want: impl Fn(u16, &str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let (status, body) = stack.ready();
        if want(status, &body) {
            return body;
        }
        assert!(t0.elapsed() < within, "/ready stayed {status}: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long after `t0` the agent's health says `endpoint` is up again.
fn failback_after(stack: &Stack, endpoint: &str, t0: Instant) -> Duration {
    let label = format!("endpoint=\"{endpoint}\"");
    loop {
        if stack.metric("sluice_agent_store_endpoint_up", &[&label]) == 1.0 {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{endpoint} did not fail back:\n{}", stack.metrics());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    writes: AtomicU64,
    errors: Mutex<Vec<String>>,
    wrong: AtomicU64,
    slowest_read: Mutex<Duration>,
    slowest_write: Mutex<Duration>,
}

impl Tally {
    fn slowest(&self) -> (Duration, Duration) {
        (*self.slowest_read.lock().unwrap(), *self.slowest_write.lock().unwrap())
    }

    fn line(&self) -> String {
        let (r, w) = self.slowest();
        format!(
            "reads={} writes={} errors={} wrong={} slowest_read={:.2}s slowest_write={:.2}s",
            self.reads.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
            self.errors.lock().unwrap().len(),
            self.wrong.load(Ordering::Relaxed),
            r.as_secs_f64(),
            w.as_secs_f64()
        )
    }
}

/// Keeps the longest of the durations seen.
fn raise(slowest: &Mutex<Duration>, took: Duration) {
    let mut s = slowest.lock().unwrap();
    *s = (*s).max(took);
}

/// Writes the objects the clients read (`data/read/N`); returns their
/// SHA-256s.
async fn seed(stack: &Stack, n: usize, size: usize) -> Vec<String> {
    let c = stack.client().await;
    let r = c.register(size as u64).await.unwrap();
    let mut shas = Vec::new();
    for i in 0..n {
        let data = pattern(size, 1000 + i as u64);
        r.write_at(0, &data).unwrap();
        c.put(&format!("data/read/{i}"), &r, 0, size as u64).await.unwrap();
        shas.push(sha256(&data));
    }
    c.release(r).await.unwrap();
    shas
}

/// `CLIENTS` clients, each `rounds` times reading one of the seeded
/// objects (checked) and writing an object of its own; `started` is set
/// once every client has sent its first request. Returns the keys written
/// and their SHA-256s.
async fn load(
    stack: &Stack,
    read_shas: Arc<Vec<String>>,
    (read, write, rounds): (usize, usize, usize),
    tally: Arc<Tally>,
    started: Arc<AtomicU64>,
    tag: &str,
) -> Vec<(String, String)> {
    let mut tasks = Vec::new();
    for n in 0..CLIENTS {
        let c = stack.client().await;
        let (tally, shas, started, tag) = (tally.clone(), read_shas.clone(), started.clone(), tag.to_owned());
        tasks.push(tokio::spawn(async move {
            let rr = c.register(read as u64).await.unwrap();
            let wr = c.register(write as u64).await.unwrap();
            let mut written = Vec::new();
            for round in 0..rounds {
                let i = (n + round) % shas.len();
                started.fetch_add(1, Ordering::Relaxed);
                let t0 = Instant::now();
                match c.get(&format!("data/read/{i}"), &rr, 0, None).await {
                    Ok(t) if t.bytes == read as u64 && sha256(&rr.as_slice()[..read]) == shas[i] => {
                        tally.reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        tally.wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tally.errors.lock().unwrap().push(format!("client {n} read {i}: {e}")),
                }
                raise(&tally.slowest_read, t0.elapsed());

                let key = format!("data/{tag}/c{n}-r{round}");
                let data = pattern(write, (n * 100 + round) as u64);
                wr.write_at(0, &data).unwrap();
                let t0 = Instant::now();
                match c.put(&key, &wr, 0, write as u64).await {
                    Ok(_) => {
                        tally.writes.fetch_add(1, Ordering::Relaxed);
                        written.push((key, sha256(&data)));
                    }
                    Err(e) => tally.errors.lock().unwrap().push(format!("client {n} write {key}: {e}")),
                }
                raise(&tally.slowest_write, t0.elapsed());
            }
            c.release(rr).await.unwrap();
            c.release(wr).await.unwrap();
            written
        }));
    }
    let mut written = Vec::new();
    for t in tasks {
        written.extend(t.await.unwrap());
    }
    written
}

/// Reads back what the clients wrote, through the agent, and a sample of
/// it with boto3 (the independent oracle) through the other gateway.
async fn check_written(
    stack: &Stack,
    cluster: &CephCluster,
    tenant: &Tenant,
    written: &[(String, String)],
    size: usize,
) {
    let c = stack.client().await;
    let r = c.register(size as u64).await.unwrap();
    for (key, sha) in written {
        let t = c.get(key, &r, 0, None).await.unwrap();
        assert_eq!((t.bytes, sha256(&r.as_slice()[..size])), (size as u64, sha.clone()), "{key}");
    }
    let keys = (tenant.access_key.as_str(), tenant.secret_key.as_str());
    for (key, sha) in written.iter().step_by(written.len().div_ceil(3).max(1)) {
        let got = boto3_as(cluster.endpoints[1], keys, &["sha256", "data", key.trim_start_matches("data/")]);
        assert_eq!(got, format!("{sha} {size}"), "{key} as boto3 reads it");
    }
    c.release(r).await.unwrap();
}

/// 16 clients read and write while one of the two gateways is SIGKILLed
/// and later started again: no client sees an error or a wrong byte, no
/// upload is left, `/ready` stays 200 and names the dead endpoint, and the
/// restarted gateway gets requests again within a health check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_under_load_costs_no_client_an_error() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = CephCluster::start();
    let tenant = cluster.tenant();
    let stack = stack(&cluster, &tenant);
    let (read, write, rounds) = sizes();
    let shas = Arc::new(seed(&stack, 4, read).await);
    ready_until(&stack, Duration::from_secs(20), |s, b| s == 200 && b.contains("alpha/data: store ok"));
    let dead = cluster.urls()[0].clone();

    let (tally, started) = (Arc::new(Tally::default()), Arc::new(AtomicU64::new(0)));
    let killer = {
        let (started, dir) = (started.clone(), cluster.dir().to_owned());
        std::thread::spawn(move || {
            // Once every client is mid-request.
            while started.load(Ordering::Relaxed) < CLIENTS as u64 {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(300));
            let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ceph"))
                .args(["kill-rgw", "--dir", dir.to_str().unwrap(), "1"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            Instant::now()
        })
    };
    // `/ready` while the clients run: 200, degraded, the dead one named.
    let (watching, watcher) = watch_ready(stack.metrics_addr, dead.clone());
    let t0 = Instant::now();
    let written = load(&stack, shas, (read, write, rounds), tally.clone(), started, "kill").await;
    let took = t0.elapsed();
    let killed_at = killer.join().unwrap();
    // Degraded until the gateway is back.
    let body = ready_until(&stack, Duration::from_secs(10), |s, b| s == 200 && b.contains("degraded"));
    watching.store(false, Ordering::Relaxed);
    let (worst, named) = watcher.join().unwrap();
    assert!(tally.errors.lock().unwrap().is_empty(), "client-visible errors: {:#?}", tally.errors.lock().unwrap());
    assert_eq!(tally.wrong.load(Ordering::Relaxed), 0, "reads with wrong bytes");
    assert_eq!(worst, 200, "/ready left 200 with one gateway dead");
    let named = if named.is_empty() { body } else { named };
    assert!(named.contains(&format!("endpoint {dead} is down")), "{named}");
    assert!(stack.metric("sluice_agent_store_endpoint_ejections_total", &[&dead]) >= 1.0);

    cluster.start_rgw(1);
    let failback = failback_after(&stack, &dead, Instant::now());
    ready_until(&stack, Duration::from_secs(5), |s, b| s == 200 && b.contains("alpha/data: store ok"));
    check_written(&stack, &cluster, &tenant, &written, write).await;
    no_uploads_left(&stack, &cluster, &tenant);
    sluice_tests::report(&format!(
        "ceph-failover: kill: clients={CLIENTS} read={}MiB write={}MiB {} load={:.1}s killed_after={:.1}s \
         failback={:.2}s orphans=0",
        read >> 20,
        write >> 20,
        tally.line(),
        took.as_secs_f64(),
        (killed_at - t0).as_secs_f64(),
        failback.as_secs_f64()
    ));
}

/// One client's requests, one after another: `gets` whole reads of the
/// seeded objects and a write; the longest each took, and how many took
/// at least the first-byte deadline.
async fn one_by_one(stack: &Stack, shas: &[String], (read, write): (usize, usize), gets: usize) -> (Duration, usize) {
    let c = stack.client().await;
    let (rr, wr) = (c.register(read as u64).await.unwrap(), c.register(write as u64).await.unwrap());
    wr.write_at(0, &pattern(write, 77)).unwrap();
    let mut took = Vec::new();
    for i in 0..gets {
        let t0 = Instant::now();
        c.get(&format!("data/read/{}", i % shas.len()), &rr, 0, None).await.unwrap();
        took.push(t0.elapsed());
        assert_eq!(sha256(&rr.as_slice()[..read]), shas[i % shas.len()]);
        if i % 4 == 3 {
            let t0 = Instant::now();
            c.put(&format!("data/one/{i}"), &wr, 0, write as u64).await.unwrap();
            took.push(t0.elapsed());
        }
    }
    c.release(rr).await.unwrap();
    c.release(wr).await.unwrap();
    let paid = took.iter().filter(|t| **t >= Duration::from_millis(FIRST_BYTE_MS)).count();
    (took.into_iter().max().unwrap_or_default(), paid)
}

/// Watches `/ready` until told to stop: the worst status seen, and the
/// first body that said the namespace is degraded with `endpoint` down.
fn watch_ready(
    metrics: std::net::SocketAddr,
    endpoint: String,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<(u16, String)>) {
    let watching = Arc::new(AtomicBool::new(true));
    let w = watching.clone();
    let thread = std::thread::spawn(move || {
        let (mut named, mut worst) = (String::new(), 200);
        while w.load(Ordering::Relaxed) {
            let (status, body) = sluice_tests::ready_at(metrics);
            worst = worst.max(status);
            if named.is_empty() && body.contains(&format!("endpoint {endpoint} is down")) {
                named = body;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (worst, named)
    });
    (watching, thread)
}

/// A gateway hangs (SIGSTOP: connections accepted, nothing answered).
/// One client's requests one after another: the request that finds it
/// pays the first-byte deadline once, the rest go to the other gateway.
/// Then it hangs under 16 clients' load, with requests in flight: no
/// error, no wrong byte, no upload left. `/ready` stays 200 throughout and
/// names the hung endpoint; resumed, the gateway fails back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_gateway_costs_a_request_at_most_the_first_byte_deadline() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = CephCluster::start();
    let tenant = cluster.tenant();
    let stack = stack(&cluster, &tenant);
    let (read, write, rounds) = sizes();
    let one_write = 24 << 20;
    let shas = Arc::new(seed(&stack, 4, read).await);
    ready_until(&stack, Duration::from_secs(20), |s, b| s == 200 && b.contains("alpha/data: store ok"));
    let urls = cluster.urls();

    // One by one.
    let (base, _) = one_by_one(&stack, &shas, (read, one_write), 8).await;
    cluster.hang_rgw(2);
    let (watching, watcher) = watch_ready(stack.metrics_addr, urls[1].clone());
    let (hung, paid) = one_by_one(&stack, &shas, (read, one_write), 8).await;
    ready_until(&stack, Duration::from_secs(10), |s, b| {
        s == 200 && b.contains(&format!("endpoint {} is down", urls[1]))
    });
    watching.store(false, Ordering::Relaxed);
    let (worst, named) = watcher.join().unwrap();
    assert_eq!(worst, 200, "/ready left 200 with one gateway hung");
    assert!(named.contains("degraded"), "{named}");
    // What the hang may add to a request: one first-byte deadline (and the
    // noise of a 2-CPU machine).
    let allowed = base + Duration::from_millis(FIRST_BYTE_MS) + Duration::from_millis(1000);
    assert!(hung <= allowed, "slowest request {hung:?} with a gateway hung, {base:?} without");
    assert!(paid <= 1, "{paid} requests paid the deadline: once ejected, the hung gateway gets none");
    cluster.resume_rgw(2);
    let failback_one = failback_after(&stack, &urls[1], Instant::now());

    // Under load, hung with requests in flight.
    let (tally, started) = (Arc::new(Tally::default()), Arc::new(AtomicU64::new(0)));
    let hanger = {
        let (started, dir) = (started.clone(), cluster.dir().to_owned());
        std::thread::spawn(move || {
            while started.load(Ordering::Relaxed) < CLIENTS as u64 {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(300));
            let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ceph"))
                .args(["hang-rgw", "--dir", dir.to_str().unwrap(), "1"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        })
    };
    let (watching, watcher) = watch_ready(stack.metrics_addr, urls[0].clone());
    let t0 = Instant::now();
    let written = load(&stack, shas, (read, write, rounds), tally.clone(), started, "hung").await;
    let took = t0.elapsed();
    hanger.join().unwrap();
    ready_until(&stack, Duration::from_secs(10), |s, b| {
        s == 200 && b.contains(&format!("endpoint {} is down", urls[0]))
    });
    watching.store(false, Ordering::Relaxed);
    let (worst, _) = watcher.join().unwrap();
    assert!(tally.errors.lock().unwrap().is_empty(), "client-visible errors: {:#?}", tally.errors.lock().unwrap());
    assert_eq!(tally.wrong.load(Ordering::Relaxed), 0, "reads with wrong bytes");
    assert_eq!(worst, 200, "/ready left 200 with one gateway hung under load");
    cluster.resume_rgw(1);
    let failback = failback_after(&stack, &urls[0], Instant::now());
    check_written(&stack, &cluster, &tenant, &written, write).await;
    no_uploads_left(&stack, &cluster, &tenant);
    sluice_tests::report(&format!(
        "ceph-failover: hang: first_byte={FIRST_BYTE_MS}ms one-by-one: slowest={:.2}s (without the hang {:.2}s) \
         paid_deadline={paid} failback={:.2}s; under load: clients={CLIENTS} read={}MiB write={}MiB {} load={:.1}s \
         failback={:.2}s orphans=0",
        hung.as_secs_f64(),
        base.as_secs_f64(),
        failback_one.as_secs_f64(),
        read >> 20,
        write >> 20,
        tally.line(),
        took.as_secs_f64(),
        failback.as_secs_f64()
    ));
}

/// The bucket's lifecycle rules, by boto3: `put` sets one of its own
/// (expiring `logs/`), `get` prints them as JSON.
const LIFECYCLE: &str = r#"
import boto3, json, sys
from botocore.config import Config
ep, ak, sk, cmd = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=ak, aws_secret_access_key=sk,
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
if cmd == "put":
    s3.put_bucket_lifecycle_configuration(Bucket="data", LifecycleConfiguration={"Rules": [
        {"ID": "logs", "Filter": {"Prefix": "logs/"}, "Status": "Enabled", "Expiration": {"Days": 30}}]})
else:
    try:
        print(json.dumps(s3.get_bucket_lifecycle_configuration(Bucket="data")["Rules"], default=str))
    except s3.exceptions.ClientError:
        print("[]")
"#;

fn lifecycle(cluster: &CephCluster, tenant: &Tenant, cmd: &str) -> serde_json::Value {
    let python = std::env::var("SLUICE_TEST_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python").to_owned());
    let out = std::process::Command::new(python)
        .args(["-c", LIFECYCLE, &cluster.urls()[1], &tenant.access_key, &tenant.secret_key, cmd])
        .output()
        .unwrap();
    assert!(out.status.success(), "boto3: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// The agent SIGKILLed mid-PUT (parts on their way) leaves a multipart
/// upload in RGW; started again, it aborts it from its journal. With
/// `[uploads] abort_incomplete_after_days`, the bucket also gets the
/// lifecycle rule for what no journal names, next to its own rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_put_leaves_no_upload_once_it_restarts() {
    let cluster = CephCluster::shared();
    let tenant = cluster.tenant();
    lifecycle(cluster, &tenant, "put");
    let mut stack = stack_with(cluster, &tenant, "[uploads]\nabort_incomplete_after_days = 3\n");
    // The rule is added in the background at start, the bucket's kept.
    let t0 = Instant::now();
    let rules = loop {
        let rules = lifecycle(cluster, &tenant, "get");
        if rules.as_array().is_some_and(|r| r.len() == 2) {
            break rules;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "rules: {rules}\n{}", stack.log("sluice-agent"));
        std::thread::sleep(Duration::from_millis(200));
    };
    let ours = rules.as_array().unwrap().iter().find(|r| r["ID"] != "logs").unwrap();
    assert!(ours["ID"].as_str().unwrap().starts_with("sluice-abort-incomplete-uploads-"), "{rules}");
    assert_eq!(ours["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"], 3, "{rules}");
    let (_, write, _) = sizes();
    let c = stack.client().await;
    let r = c.register(write as u64).await.unwrap();
    r.write_at(0, &pattern(write, 5)).unwrap();
    let put = tokio::spawn(async move { c.put("data/killed", &r, 0, write as u64).await.map(|_| ()) });
    // Journaled (before any part is sent): kill it now, mid-PUT.
    let journal = stack.dir.path().join("state/uploads.journal");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&journal).unwrap_or_default().lines().any(|l| l.starts_with("S ")) {
        assert!(t0.elapsed() < Duration::from_secs(20), "no upload was journaled");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    stack.kill("sluice-agent");
    assert!(put.await.unwrap().is_err(), "the PUT cannot have completed");
    assert_eq!(uploads(cluster, &tenant), 1, "the killed agent left its upload");

    let t0 = Instant::now();
    stack.restart("sluice-agent");
    let mut left = 1;
    while left > 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "the upload was not aborted:\n{}", stack.log("sluice-agent"));
        std::thread::sleep(Duration::from_millis(200));
        left = uploads(cluster, &tenant);
    }
    let keys = (tenant.access_key.as_str(), tenant.secret_key.as_str());
    assert_eq!(boto3_as(cluster.endpoints[0], keys, &["exists", "data", "killed"]), "no");
    assert!(stack.metric("sluice_agent_multipart_aborts_total", &["reason=\"left\""]) >= 1.0);
    sluice_tests::report(&format!(
        "ceph-failover: agent killed mid-PUT of {}MiB: its upload aborted {:.1}s after the restart began",
        write >> 20,
        t0.elapsed().as_secs_f64()
    ));
}
