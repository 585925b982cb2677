//! The DRR transfer scheduler: small requests are not stuck behind a flood of
//! large chunks, weights split bandwidth, large chunks are not starved, and
//! cancelled waiters neither leak slots nor wedge the queue.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a failed unwrap is a failed test

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice_qos::{Limits, Qos, QosConfig, QosError};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn qos(slots: usize, weights: &[(&str, u32)]) -> Qos {
    let tenants = weights.iter().map(|&(n, weight)| (n.to_string(), Limits { weight, ..Limits::default() })).collect();
    Qos::new(QosConfig { global_slots: slots, ..QosConfig::default() }, tenants).unwrap()
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

/// Simulated transfer time: 1 ms per MiB (at least one timer tick).
fn hold_time(cost: u64) -> Duration {
    Duration::from_micros(cost * 1000 / MIB).max(Duration::from_millis(1))
}

/// `tasks` workers of `tenant` that keep asking for slots of `cost` and hold
/// each for its transfer time; `served` counts bytes granted.
fn flood(qos: &Qos, tenant: &'static str, tasks: usize, cost: u64, served: Arc<AtomicU64>) -> Vec<JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (qos, served) = (qos.clone(), Arc::clone(&served));
            tokio::spawn(async move {
                loop {
                    let slot = qos.slot(tenant, cost).await.unwrap();
                    served.fetch_add(cost, Ordering::Relaxed);
                    sleep(hold_time(cost)).await;
                    drop(slot);
                }
            })
        })
        .collect()
}

/// B's sequential 4 KiB requests: returns each request's wait for a slot.
async fn small_requests(qos: &Qos, n: usize) -> Vec<Duration> {
    let mut waits = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let slot = qos.slot("b", 4 * KIB).await.unwrap();
        waits.push(start.elapsed());
        sleep(hold_time(4 * KIB)).await;
        drop(slot);
        // Think time, so B arrives at arbitrary points of A's chunks.
        sleep(Duration::from_millis(1)).await;
    }
    waits
}

fn p99(waits: &mut [Duration]) -> Duration {
    waits.sort();
    waits[(waits.len() * 99).div_ceil(100) - 1]
}

async fn small_tenant_against_flood(slots: usize) {
    let qos = qos(slots, &[("a", 1), ("b", 1)]);
    let mut alone = small_requests(&qos, 200).await;
    let alone_p99 = p99(&mut alone);

    let a_served = Arc::new(AtomicU64::new(0));
    let a = flood(&qos, "a", 64, 8 * MIB, Arc::clone(&a_served));
    sleep(Duration::from_millis(100)).await;
    assert!(qos.snapshot("a").unwrap().queued >= 64 - slots, "A must keep a deep queue");
    let start = Instant::now();
    let mut loaded = small_requests(&qos, 200).await;
    let elapsed = start.elapsed();
    let a_chunks = a_served.load(Ordering::Relaxed) / (8 * MIB);
    a.iter().for_each(JoinHandle::abort);

    let loaded_p99 = p99(&mut loaded);
    let max = *loaded.iter().max().unwrap();
    // Alone B never waits; with A flooding, B waits at most for the one A
    // chunk already holding a slot (8 ms), never behind A's 64-deep queue
    // (which FIFO would make ~512 ms / slots).
    assert_eq!(alone_p99, Duration::ZERO);
    assert!(max <= hold_time(8 * MIB) + Duration::from_millis(1), "B max wait {max:?}, p99 {loaded_p99:?}");
    // A keeps making progress: it gets the slots B is not using.
    let a_min = elapsed.as_millis() as u64 * slots as u64 / 8 / 2;
    assert!(a_chunks >= a_min, "A served {a_chunks} chunks in {elapsed:?}, want >= {a_min}");
}

#[tokio::test(start_paused = true)]
async fn small_requests_are_not_stuck_behind_large_chunks_one_slot() {
    small_tenant_against_flood(1).await;
}

#[tokio::test(start_paused = true)]
async fn small_requests_are_not_stuck_behind_large_chunks_two_slots() {
    small_tenant_against_flood(2).await;
}

async fn served_ratio(qos: &Qos, a_cost: u64, b_cost: u64) -> f64 {
    let (a_served, b_served) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = flood(qos, "a", 8, a_cost, Arc::clone(&a_served));
    tasks.extend(flood(qos, "b", 8, b_cost, Arc::clone(&b_served)));
    sleep(Duration::from_secs(3)).await;
    tasks.iter().for_each(JoinHandle::abort);
    for t in tasks {
        let _ = t.await;
    }
    a_served.load(Ordering::Relaxed) as f64 / b_served.load(Ordering::Relaxed) as f64
}

#[tokio::test(start_paused = true)]
async fn weights_split_served_bytes_even_with_different_chunk_sizes() {
    let qos = qos(1, &[("a", 3), ("b", 1)]);
    // A's chunks are 16x smaller than B's: DRR charges bytes, not chunks.
    let ratio = served_ratio(&qos, 64 * KIB, MIB).await;
    assert!((2.7..=3.3).contains(&ratio), "served bytes A:B = {ratio}, want 3 ±10%");

    // Hot reload of weights applies to the running scheduler.
    qos.update([("a", 1), ("b", 1)].map(|(n, weight)| (n.to_string(), Limits { weight, ..Limits::default() })).into())
        .unwrap();
    let ratio = served_ratio(&qos, 64 * KIB, MIB).await;
    assert!((0.9..=1.1).contains(&ratio), "served bytes A:B = {ratio}, want 1 ±10%");
}

#[tokio::test(start_paused = true)]
async fn huge_chunk_is_not_starved_by_a_flood_of_small_ones() {
    let qos = qos(1, &[("big", 1), ("b", 1)]);
    let small_served = Arc::new(AtomicU64::new(0));
    let small = flood(&qos, "b", 64, 4 * KIB, Arc::clone(&small_served));
    sleep(Duration::from_millis(10)).await;
    let before = small_served.load(Ordering::Relaxed);
    let slot = qos.slot("big", 64 * MIB).await.unwrap();
    let small_meanwhile = small_served.load(Ordering::Relaxed) - before;
    small.iter().for_each(JoinHandle::abort);
    drop(slot);
    // Equal weights: while the big chunk waited, the small tenant got about
    // the same number of bytes (give or take a quantum), not unbounded service.
    let quantum = QosConfig::default().quantum_bytes;
    assert!(small_meanwhile.abs_diff(64 * MIB) <= quantum, "small tenant got {small_meanwhile} bytes first");
}

#[tokio::test(start_paused = true)]
async fn dropped_waiter_does_not_leak_or_wedge() {
    let qos = qos(1, &[("a", 1), ("b", 1), ("c", 1)]);
    let held = qos.slot("a", MIB).await.unwrap();

    // A waiter cancelled while queued leaves the queue.
    let mut cancelled = Box::pin(qos.slot("b", MIB));
    assert!(poll_once(&mut cancelled).is_pending());
    assert_eq!(qos.snapshot("b").unwrap().queued, 1);
    drop(cancelled);
    assert_eq!(qos.snapshot("b").unwrap().queued, 0);

    let next = tokio::spawn({
        let qos = qos.clone();
        async move { qos.slot("c", MIB).await.map(drop) }
    });
    sleep(Duration::from_millis(1)).await;
    assert!(!next.is_finished());
    drop(held);
    assert_eq!(next.await.unwrap(), Ok(()));

    // A waiter cancelled after being granted (but before running) returns the slot.
    let held = qos.slot("a", MIB).await.unwrap();
    let mut granted = Box::pin(qos.slot("b", MIB));
    assert!(poll_once(&mut granted).is_pending());
    let mut third = Box::pin(qos.slot("c", MIB));
    assert!(poll_once(&mut third).is_pending());
    drop(held); // grants `granted`
    assert!(poll_once(&mut third).is_pending());
    drop(granted); // must pass the slot on to `third`
    let third = third.await.unwrap();
    drop(third);

    // Capacity is intact: exactly one slot, free again.
    let one = qos.slot("a", 0).await.unwrap();
    let mut two = Box::pin(qos.slot("a", 0));
    assert!(poll_once(&mut two).is_pending());
    drop(one);
    two.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn slot_wait_times_out_as_busy() {
    let config = QosConfig { global_slots: 1, queue_timeout: Duration::from_secs(2), ..QosConfig::default() };
    let qos =
        Qos::new(config, [("a".to_string(), Limits::default()), ("b".to_string(), Limits::default())].into()).unwrap();
    let held = qos.slot("a", MIB).await.unwrap();
    let err = qos.slot("b", MIB).await.unwrap_err();
    assert_eq!(err, QosError::Busy { tenant: "b".into(), resource: "transfer_slots", waited: Duration::from_secs(2) });
    assert_eq!(err.kind(), "busy_slots");
    assert_eq!(qos.refusals().get(&("b".to_owned(), "busy_slots")), Some(&1));
    // Unconfigured names share one label so they cannot grow the counter map.
    assert!(qos.slot("nobody", MIB).await.is_err());
    assert_eq!(qos.refusals().get(&(sluice_qos::UNKNOWN_TENANT_LABEL.to_owned(), "busy_slots")), Some(&1));
    drop(held);
    qos.slot("b", MIB).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn permit_chunk_paces_then_takes_a_slot() {
    let limits = Limits { bytes_per_sec: Some(10 * MIB), ..Limits::default() };
    let config = QosConfig { global_slots: 1, ..QosConfig::default() };
    let qos = Qos::new(config, [("a".to_string(), limits)].into()).unwrap();
    let permit = qos.admit("a", 20 * MIB).await.unwrap();
    let start = Instant::now();
    for _ in 0..20 {
        let _slot = permit.chunk(MIB).await.unwrap();
    }
    // 20 MiB at 10 MiB/s with a 0.5 MiB burst.
    let elapsed = start.elapsed().as_secs_f64();
    assert!((1.9..=2.0).contains(&elapsed), "took {elapsed}s");
}

#[tokio::test(start_paused = true)]
async fn every_granted_slot_is_reported_with_its_wait() {
    let seen: Arc<std::sync::Mutex<Vec<(String, Duration)>>> = Arc::default();
    let record = Arc::clone(&seen);
    let observers = sluice_qos::Observers {
        refusals: None,
        slot_waits: Some(Arc::new(move |tenant: &str, waited| {
            record.lock().unwrap().push((tenant.to_owned(), waited))
        })),
    };
    let config = QosConfig { global_slots: 1, queue_timeout: Duration::from_secs(2), ..QosConfig::default() };
    let tenants = [("a".to_string(), Limits::default()), ("b".to_string(), Limits::default())].into();
    let qos = Qos::with_observers(config, tenants, observers).unwrap();
    let held = qos.slot("a", MIB).await.unwrap();
    let waiter = tokio::spawn({
        let qos = qos.clone();
        async move { qos.slot("b", KIB).await.map(drop) }
    });
    sleep(Duration::from_millis(30)).await;
    drop(held);
    waiter.await.unwrap().unwrap();
    // A refused wait is a refusal, not a grant: not reported as a wait.
    let _held = qos.slot("a", MIB).await.unwrap();
    assert!(qos.slot("b", KIB).await.is_err());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![("a".into(), Duration::ZERO), ("b".into(), Duration::from_millis(30)), ("a".into(), Duration::ZERO)]
    );
}
