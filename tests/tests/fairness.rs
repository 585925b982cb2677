//! Per-tenant quotas and fair scheduling through the real agent: bytes/s is
//! held, requests/s and registered memory are refused with typed errors that
//! show in metrics, SIGHUP reloads limits, and a tenant flooding the agent with
//! large GETs does not starve another tenant's small ones.
//!
//! The tests take turns (one lock): each runs a whole stack, and their
//! timings would disturb each other on a small machine.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientError, Code};
use sluice_tests::{pattern, Options, Stack};
use tokio::sync::Mutex;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

static TURN: Mutex<()> = Mutex::const_new(());

fn code(e: &ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed error, got {e}"))
}

async fn upload(c: &Client, path: &str, len: u64, seed: u64) {
    let r = c.register(len).await.unwrap();
    r.write_at(0, &pattern(len as usize, seed)).unwrap();
    c.put(path, &r, 0, len).await.unwrap();
    c.release(r).await.unwrap();
}

fn mib_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / MIB as f64 / elapsed.as_secs_f64()
}

/// GETs `path` (of `len` bytes) from `loops` concurrent tasks for `window`;
/// returns the rate in MiB/s. One GET first, so the tenant's bucket starts
/// the window in its steady state rather than with its burst.
async fn get_rate(c: &Arc<Client>, path: &'static str, len: u64, loops: usize, window: Duration) -> f64 {
    let warm = c.register(len).await.unwrap();
    c.get(path, &warm, 0, None).await.unwrap();
    c.release(warm).await.unwrap();
    let t0 = Instant::now();
    let moved = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..loops {
        let (c, moved) = (Arc::clone(c), Arc::clone(&moved));
        tasks.push(tokio::spawn(async move {
            let r = c.register(len).await.unwrap();
            while t0.elapsed() < window {
                let got = c.get(path, &r, 0, None).await.unwrap();
                assert_eq!(got.bytes, len);
                moved.fetch_add(got.bytes, Ordering::Relaxed);
            }
            c.release(r).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    mib_per_sec(moved.load(Ordering::Relaxed), t0.elapsed())
}

#[tokio::test]
async fn bytes_per_sec_is_held_within_10_percent() {
    let _turn = TURN.lock().await;
    let limit = 20 * MIB;
    let stack =
        Stack::with(Options { alpha: format!("[tenants.limits]\nbytes_per_sec = {limit}\n"), ..Default::default() });
    let c = Arc::new(stack.client().await);
    upload(&c, "data/rate", 2 * MIB, 1).await;
    // Two concurrent loops: the limit is the tenant's, not per request.
    let rate = get_rate(&c, "data/rate", 2 * MIB, 2, Duration::from_secs(5)).await;
    let want = limit as f64 / MIB as f64;
    println!(
        "quota: alpha bytes_per_sec limit {want:.1} MiB/s, measured {rate:.2} MiB/s over 5 s ({:+.1}%)",
        (rate / want - 1.0) * 100.0
    );
    assert!((rate - want).abs() <= want * 0.10, "measured {rate:.2} MiB/s, limit {want:.1} MiB/s");
}

#[tokio::test]
async fn requests_per_sec_refusals_are_typed_counted_and_recover() {
    let _turn = TURN.lock().await;
    let stack = Stack::with(Options { alpha: "limits = { requests_per_sec = 5 }\n".into(), ..Default::default() });
    let c = stack.client().await;
    let t0 = Instant::now();
    let (mut admitted, mut refused, mut retry_hint) = (0u32, 0u32, String::new());
    for _ in 0..20 {
        // A missing key: admitted requests fail with NoSuchKey, refused ones
        // with QuotaExceeded before reaching the store.
        match c.head("data/missing").await {
            Err(e) if code(&e) == Code::NoSuchKey => admitted += 1,
            Err(e) if code(&e) == Code::QuotaExceeded => {
                refused += 1;
                retry_hint = e.to_string();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Burst of one second's worth (5), plus what refilled meanwhile.
    let refill = (t0.elapsed().as_secs_f64() * 5.0).ceil() as u32;
    assert!(admitted >= 5 && admitted <= 5 + refill, "admitted {admitted} (refill {refill})");
    assert!(refused > 0);
    assert!(retry_hint.contains("requests_per_sec") && retry_hint.contains("retry after"), "{retry_hint}");
    let counted = stack.metric("sluice_agent_quota_refusals_total", &["tenant=\"alpha\"", "kind=\"requests_per_sec\""]);
    assert_eq!(counted, f64::from(refused));
    let errors = stack.metric("sluice_agent_errors_total", &["tenant=\"alpha\"", "kind=\"QUOTA_EXCEEDED\""]);
    assert_eq!(errors, f64::from(refused));
    println!("quota: requests_per_sec = 5: {admitted} admitted, {refused} refused; e.g. {retry_hint}");
    // After the hinted wait, requests are admitted again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(code(&c.head("data/missing").await.unwrap_err()), Code::NoSuchKey);
}

#[tokio::test]
async fn registered_memory_quota_is_per_tenant_and_freed_on_release_and_close() {
    let _turn = TURN.lock().await;
    let stack = Stack::with(Options {
        alpha: format!("[tenants.limits]\nmax_registered_bytes = {}\n", 8 * MIB),
        beta_shim: true,
        ..Default::default()
    });
    let a1 = stack.client().await;
    let a2 = stack.client().await;
    let held = a1.register(6 * MIB).await.unwrap();
    // Across the tenant's sessions (two connections), not per session.
    let e = a2.register(4 * MIB).await.unwrap_err();
    assert_eq!(code(&e), Code::QuotaExceeded, "{e}");
    assert!(e.to_string().contains("registered-memory"), "{e}");
    let small = a2.register(2 * MIB).await.unwrap();
    assert_eq!(code(&a2.register(1).await.unwrap_err()), Code::QuotaExceeded);
    // Another tenant is not affected.
    let b = Client::connect(&stack.beta_socket).await.unwrap();
    let b_region = b.register(16 * MIB).await.unwrap();
    assert_eq!(
        stack.metric("sluice_agent_quota_refusals_total", &["tenant=\"alpha\"", "kind=\"max_registered_bytes\""]),
        2.0
    );
    // Release frees the quota.
    a2.release(small).await.unwrap();
    let again = a2.register(2 * MIB).await.unwrap();
    // So does closing a session (the client disconnecting).
    drop(held);
    drop(a1);
    let t0 = Instant::now();
    let big = loop {
        match a2.register(6 * MIB).await {
            Ok(r) => break r,
            Err(e) if code(&e) == Code::QuotaExceeded && t0.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("quota not freed on disconnect: {e}"),
        }
    };
    a2.release(big).await.unwrap();
    a2.release(again).await.unwrap();
    b.release(b_region).await.unwrap();
}

/// One measurement round.
struct Round {
    /// Beta's end-to-end p99 alone, then under alpha's flood.
    alone_p99: Duration,
    flood_p99: Duration,
    /// Alpha's rate during the flooded measurement, MiB/s.
    flood_rate: f64,
    /// Beta's waits for a scheduler slot during the flooded measurement, from
    /// the agent's `slot_wait_seconds{tenant="beta"}` histogram.
    beta_waits: Vec<(f64, f64)>,
}

/// Beta's slot-wait histogram: (upper bound in seconds, cumulative count).
fn beta_slot_waits(stack: &Stack) -> Vec<(f64, f64)> {
    stack
        .metrics()
        .lines()
        .filter_map(|l| l.strip_prefix("sluice_agent_slot_wait_seconds_bucket{"))
        .filter_map(|l| {
            let (labels, count) = l.split_once("} ")?;
            let label = |name: &str| {
                labels.split(',').find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
            };
            Some((label("le")?, label("tenant")?, count))
        })
        .filter(|&(_, tenant, _)| tenant == "beta")
        .map(|(le, _, count)| {
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().expect("a bucket's le is a number") };
            (le, count.trim().parse().expect("a bucket's count is a number"))
        })
        .collect()
}

/// One measurement: beta's p99 alone, then under alpha's flood of 32 MiB
/// GETs (4 loops), with alpha's rate and beta's slot waits meanwhile.
async fn fairness_round(stack: &Stack, a: &Arc<Client>, b: &Client, br: &sluice_client::Region) -> Round {
    let mut alone = small_gets(b, br, 400).await;
    let alone_p99 = p99(&mut alone);
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for _ in 0..4 {
        let (a, stop, moved) = (Arc::clone(a), Arc::clone(&stop), Arc::clone(&moved));
        flood.push(tokio::spawn(async move {
            let r = a.register(32 * MIB).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                moved.fetch_add(a.get("data/big", &r, 0, None).await.unwrap().bytes, Ordering::Relaxed);
            }
            a.release(r).await.unwrap();
        }));
    }
    // Let the flood saturate the slots before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = beta_slot_waits(stack);
    let (t0, moved0) = (Instant::now(), moved.load(Ordering::Relaxed));
    let mut flooded = small_gets(b, br, 400).await;
    let flood_rate = mib_per_sec(moved.load(Ordering::Relaxed) - moved0, t0.elapsed());
    let after = beta_slot_waits(stack);
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.await.unwrap();
    }
    assert_eq!(before.len(), after.len(), "histogram buckets changed");
    let beta_waits = before.iter().zip(&after).map(|(&(le, n0), &(_, n1))| (le, n1 - n0)).collect();
    Round { alone_p99, flood_p99: p99(&mut flooded), flood_rate, beta_waits }
}

/// Sequential 4 KiB GETs by tenant beta; each request's latency.
async fn small_gets(b: &Client, region: &sluice_client::Region, n: usize) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let got = b.get("other/small", region, 0, None).await.unwrap();
        lat.push(t.elapsed());
        assert_eq!(got.bytes, 4 * KIB);
        // Think time, so beta arrives at arbitrary points of alpha's transfers.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    lat
}

fn p99(lat: &mut [Duration]) -> Duration {
    lat.sort();
    lat[(lat.len() * 99).div_ceil(100) - 1]
}

/// Each part of a transfer takes a fair-scheduler slot (deficit round robin
/// by bytes), so beta waits behind a part or two of alpha's per slot, never
/// behind a 32 MiB GET.
///
/// Two checks per round. The scheduler's own promise is checked on the
/// agent's `slot_wait_seconds` histogram: how long each of beta's chunks
/// waited for a slot (including the wake-up of its task, but not the other
/// hops' scheduling delays). End to end, beta's p99 must stay clearly below what waiting behind
/// whole GETs would give; end-to-end latency also carries every process's
/// scheduling delay on two shared cores (the flooded p99 was 3.7-5.8x the
/// quiet one in a CI run whose slot waits were fine), so it is not held to
/// the scheduler's tighter bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_does_not_starve_small_requests_of_another() {
    let _turn = TURN.lock().await;
    // Few global slots, so alpha's flood contends for them and the DRR
    // scheduler (not spare capacity) is what serves beta.
    // Alpha's whole-object checksum verification is off: on these two
    // shared cores its CPU (about a seventh of a core at alpha's rate) would
    // be measured as queueing, while this test is about the scheduler
    // (checksum costs are the benchmarks' business).
    let stack = Stack::with(Options {
        agent_qos: "global_slots = 2\n".into(),
        beta_shim: true,
        data_ns: "verify_checksums = false\n".into(),
        ..Default::default()
    });
    let a = Arc::new(stack.client().await);
    let b = Client::connect(&stack.beta_socket).await.unwrap();
    upload(&a, "data/big", 32 * MIB, 2).await;
    upload(&b, "other/small", 4 * KIB, 3).await;
    let br = b.register(4 * KIB).await.unwrap();
    small_gets(&b, &br, 20).await; // warm-up
                                   // Latency on a shared 2-core machine is noisy (every process of the
                                   // stack, and this test, compete for the same cores): a measurement round
                                   // may be repeated up to 3 times and every round is printed. A starving
                                   // scheduler fails all of them by far.
    let mut failures = Vec::new();
    for round in 1..=3 {
        let r = fairness_round(&stack, &a, &b, &br).await;
        // Alpha's 1 MiB parts hold the two slots, each moving at half of
        // alpha's rate. DRR gives beta one of the next slots to free: a wait
        // of about one part, a few at most while alpha's turn's deficit runs
        // out. Bound: three parts plus 5 ms for the waiting task to be woken
        // on busy cores, rounded up to the histogram's next bucket.
        // Starvation is a slot held for a whole 32 MiB GET at half of
        // alpha's rate; the bound is checked to lie at most half-way there.
        let part = 2.0 / r.flood_rate;
        let whole_get = 64.0 / r.flood_rate;
        let (bound, within) = *r.beta_waits.iter().find(|(le, _)| *le >= 3.0 * part + 0.005).unwrap();
        assert!(bound * 2.0 <= whole_get, "the slot-wait bound {bound}s must tell starvation ({whole_get:.3}s) apart");
        let total = r.beta_waits.last().unwrap().1;
        let late = total - within;
        // Each of beta's 400 GETs takes one slot (a client retry would add one).
        assert!(total >= 400.0, "beta's slot waits not observed: {:?}", r.beta_waits);
        // End to end: beta's p99 must stay below half a whole GET's slot
        // time above its quiet p99 (measured: a fair scheduler 10-16 ms,
        // parts as large as the GET 89-118 ms, against bounds of 31-67 ms).
        let e2e_bound = r.alone_p99 + Duration::from_secs_f64(whole_get / 2.0);
        println!(
            "fairness round {round}: beta p99 alone {:.2} ms, under flood {:.2} ms (bound {:.2} ms); \
             slot waits over {:.0} ms: {late} of {total} (alpha moved {:.0} MiB/s meanwhile)",
            r.alone_p99.as_secs_f64() * 1e3,
            r.flood_p99.as_secs_f64() * 1e3,
            e2e_bound.as_secs_f64() * 1e3,
            bound * 1e3,
            r.flood_rate
        );
        if late <= total / 100.0 && r.flood_p99 <= e2e_bound {
            b.release(br).await.unwrap();
            return;
        }
        failures.push(format!(
            "round {round}: {late} of {total} slot waits over {bound}s, p99 {:?} > {e2e_bound:?}?",
            r.flood_p99
        ));
    }
    panic!("beta was starved in every round: {failures:?}");
}

/// Lines the agent logs once per SIGHUP, when it has finished with it.
fn reloads_finished(log: &str) -> usize {
    log.matches("SIGHUP: reload done").count() + log.matches("SIGHUP: config not re-read").count()
}

/// Writes `text` as the agent's config and sends SIGHUP; waits until the
/// agent has finished its `n`-th reload (each ends with exactly one line, so
/// a reload logging several lines cannot be mistaken for several reloads).
async fn reload(stack: &Stack, text: &str, n: usize) {
    std::fs::write(stack.dir.path().join("agent.toml"), text).unwrap();
    stack.signal("sluice-agent", "HUP");
    let t0 = Instant::now();
    while reloads_finished(&stack.log("sluice-agent")) < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "no reload logged:\n{}", stack.log("sluice-agent"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sighup_reloads_limits_and_a_bad_file_keeps_them() {
    let _turn = TURN.lock().await;
    let stack =
        Stack::with(Options { alpha: format!("limits = {{ bytes_per_sec = {} }}\n", 4 * MIB), ..Default::default() });
    let config = std::fs::read_to_string(stack.dir.path().join("agent.toml")).unwrap();
    let c = Arc::new(stack.client().await);
    upload(&c, "data/reload", MIB, 4).await;
    let window = Duration::from_millis(1500);
    let within = |rate: f64, want: f64| (rate - want).abs() <= want * 0.15;

    let before = get_rate(&c, "data/reload", MIB, 1, window).await;
    assert!(within(before, 4.0), "before: {before:.2} MiB/s");

    // Raise.
    reload(
        &stack,
        &config.replace(&format!("bytes_per_sec = {}", 4 * MIB), &format!("bytes_per_sec = {}", 16 * MIB)),
        1,
    )
    .await;
    assert!(stack.log("sluice-agent").contains("alpha: bytes_per_sec 4194304 -> 16777216"));
    let raised = get_rate(&c, "data/reload", MIB, 1, window).await;
    assert!(within(raised, 16.0), "raised: {raised:.2} MiB/s");

    // A broken file: logged, and the running limits stay.
    reload(&stack, "bytes_per_sec = ", 2).await;
    let log = stack.log("sluice-agent");
    assert!(log.contains("SIGHUP: config not re-read; keeping the running keys, NIC rules and QoS limits"), "{log}");
    assert_eq!(log.matches("SIGHUP: reload done").count(), 1, "the bad file was not applied: {log}");
    let kept = get_rate(&c, "data/reload", MIB, 1, window).await;
    assert!(within(kept, 16.0), "kept: {kept:.2} MiB/s");

    // Lower.
    reload(
        &stack,
        &config.replace(&format!("bytes_per_sec = {}", 4 * MIB), &format!("bytes_per_sec = {}", 2 * MIB)),
        3,
    )
    .await;
    assert!(stack.log("sluice-agent").contains("alpha: bytes_per_sec 16777216 -> 2097152"));
    let lowered = get_rate(&c, "data/reload", MIB, 1, window).await;
    assert!(within(lowered, 2.0), "lowered: {lowered:.2} MiB/s");
    println!(
        "reload: alpha bytes_per_sec 4 -> 16 -> (bad file) -> 2 MiB/s; measured {before:.2}, {raised:.2}, {kept:.2}, {lowered:.2} MiB/s"
    );
}
