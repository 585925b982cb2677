//! Per-tenant limits: bytes/s pacing, requests/s refusals, in-flight waiting,
//! registered memory, hot reload. Virtual time keeps them exact and instant.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a failed unwrap is a failed test

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice_qos::{Limits, Qos, QosConfig, QosError, RefusalObserver, UNKNOWN_TENANT_LABEL};
use tokio::time::{sleep, Instant};

const MIB: u64 = 1 << 20;

fn tenants(list: &[(&str, Limits)]) -> HashMap<String, Limits> {
    list.iter().map(|(n, l)| (n.to_string(), l.clone())).collect()
}

fn qos(list: &[(&str, Limits)]) -> Qos {
    Qos::new(QosConfig::default(), tenants(list)).unwrap()
}

/// Poll a future exactly once (to get it queued) without driving it further.
fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

/// Moves 1 MiB chunks as fast as pacing allows for `window`; returns bytes moved.
async fn pump(qos: Qos, tenant: &'static str, window: Duration) -> u64 {
    let permit = qos.admit(tenant, 1 << 40).await.unwrap();
    let start = Instant::now();
    let mut moved = 0;
    loop {
        permit.pace(MIB).await;
        if start.elapsed() >= window {
            return moved;
        }
        moved += MIB;
    }
}

fn assert_within(actual: u64, expected: u64, tolerance: f64) {
    let ratio = actual as f64 / expected as f64;
    assert!((1.0 - tolerance..=1.0 + tolerance).contains(&ratio), "moved {actual}, expected {expected} ±{tolerance}");
}

#[tokio::test(start_paused = true)]
async fn bytes_per_sec_holds_within_10_percent_over_5s() {
    let limited = Limits { bytes_per_sec: Some(100 * MIB), ..Limits::default() };
    let qos = qos(&[("a", limited.clone()), ("b", limited)]);
    let window = Duration::from_secs(5);
    let moved = pump(qos.clone(), "a", window).await;
    assert_within(moved, 500 * MIB, 0.10);
    // The only slack is the 1/20 s burst: much tighter than the requirement.
    assert_within(moved, 500 * MIB, 0.02);
}

#[tokio::test(start_paused = true)]
async fn bytes_per_sec_is_shared_by_a_tenants_requests_and_isolated_from_others() {
    let limited = Limits { bytes_per_sec: Some(100 * MIB), ..Limits::default() };
    let qos = qos(&[("a", limited.clone()), ("b", limited)]);
    let window = Duration::from_secs(5);
    let a1 = tokio::spawn(pump(qos.clone(), "a", window));
    let a2 = tokio::spawn(pump(qos.clone(), "a", window));
    let b = tokio::spawn(pump(qos.clone(), "b", window));
    let (a1, a2, b) = (a1.await.unwrap(), a2.await.unwrap(), b.await.unwrap());
    assert_within(a1 + a2, 500 * MIB, 0.10);
    // Pacing reserves in call order, so a tenant's requests split its rate evenly.
    assert_within(a1, 250 * MIB, 0.10);
    assert_within(a2, 250 * MIB, 0.10);
    assert_within(b, 500 * MIB, 0.10);
}

#[tokio::test(start_paused = true)]
async fn unlimited_bytes_per_sec_never_sleeps() {
    let qos = qos(&[("a", Limits::default())]);
    let permit = qos.admit("a", 0).await.unwrap();
    let start = Instant::now();
    for _ in 0..1000 {
        permit.pace(MIB).await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
}

type Seen = Arc<Mutex<Vec<(String, &'static str)>>>;

fn counting_observer() -> (RefusalObserver, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let observer: RefusalObserver = Arc::new(move |e: &QosError| {
        sink.lock().unwrap().push((e.tenant().to_owned(), e.kind()));
    });
    (observer, seen)
}

#[tokio::test(start_paused = true)]
async fn requests_per_sec_refuses_after_burst_and_recovers() {
    let (observer, seen) = counting_observer();
    let limits = Limits { requests_per_sec: Some(10), ..Limits::default() };
    let qos = Qos::with_observer(QosConfig::default(), tenants(&[("a", limits)]), observer).unwrap();
    for _ in 0..10 {
        qos.admit("a", 1).await.unwrap();
    }
    let err = qos.admit("a", 1).await.unwrap_err();
    match &err {
        QosError::RateLimited { tenant, kind, limit, retry_after } => {
            assert_eq!((tenant.as_str(), *kind, *limit), ("a", "requests_per_sec", 10));
            assert_eq!(*retry_after, Duration::from_millis(100));
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    assert_eq!(err.kind(), "requests_per_sec");
    assert!(err.to_string().contains("\"a\"") && err.to_string().contains("requests_per_sec"), "{err}");
    assert_eq!(seen.lock().unwrap().as_slice(), &[("a".to_owned(), "requests_per_sec")]);
    assert_eq!(qos.refusals().get(&("a".to_owned(), "requests_per_sec")), Some(&1));

    // One token back after retry_after, then refused again.
    sleep(Duration::from_millis(100)).await;
    qos.admit("a", 1).await.unwrap();
    assert!(qos.admit("a", 1).await.is_err());
    // After a long pause the burst is one second's worth, not more.
    sleep(Duration::from_secs(60)).await;
    for _ in 0..10 {
        qos.admit("a", 1).await.unwrap();
    }
    assert!(matches!(qos.admit("a", 1).await, Err(QosError::RateLimited { .. })));
    assert_eq!(qos.refusals().get(&("a".to_owned(), "requests_per_sec")), Some(&3));
}

#[tokio::test(start_paused = true)]
async fn unknown_tenant_is_refused_with_a_bounded_label() {
    let (observer, seen) = counting_observer();
    let qos = Qos::with_observer(QosConfig::default(), tenants(&[("a", Limits::default())]), observer).unwrap();
    let err = qos.admit("mallory", 1).await.unwrap_err();
    assert_eq!(err, QosError::UnknownTenant { tenant: "mallory".into() });
    assert!(matches!(qos.reserve_memory("eve", 1), Err(QosError::UnknownTenant { .. })));
    assert_eq!(qos.refusals().get(&(UNKNOWN_TENANT_LABEL.to_owned(), "unknown_tenant")), Some(&2));
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert!(qos.snapshot("mallory").is_none());
}

fn inflight(limit: u64) -> Limits {
    Limits { max_inflight_bytes: Some(limit), ..Limits::default() }
}

#[tokio::test(start_paused = true)]
async fn inflight_waits_until_a_permit_drops() {
    let qos = qos(&[("a", inflight(10 * MIB))]);
    let p1 = qos.admit("a", 6 * MIB).await.unwrap();
    let waiter = tokio::spawn({
        let qos = qos.clone();
        async move { qos.admit("a", 6 * MIB).await.map(|p| p.bytes()) }
    });
    sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished());
    let usage = qos.snapshot("a").unwrap();
    assert_eq!((usage.inflight_bytes, usage.queued), (6 * MIB, 1));
    drop(p1);
    assert_eq!(waiter.await.unwrap(), Ok(6 * MIB));
    // The waiter's permit was dropped when its task ended.
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 0);
}

#[tokio::test(start_paused = true)]
async fn inflight_queue_is_fifo_so_large_requests_are_not_starved() {
    let qos = qos(&[("a", inflight(10 * MIB))]);
    let p1 = qos.admit("a", 8 * MIB).await.unwrap();
    let mut big = Box::pin(qos.admit("a", 6 * MIB));
    assert!(poll_once(&mut big).is_pending());
    // 1 MiB would fit next to p1, but must not overtake the queued 6 MiB.
    let mut small = Box::pin(qos.admit("a", MIB));
    assert!(poll_once(&mut small).is_pending());
    drop(p1);
    let (big, small) = (big.await.unwrap(), small.await.unwrap());
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 7 * MIB);
    drop((big, small));
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 0);
}

#[tokio::test(start_paused = true)]
async fn inflight_request_larger_than_limit_is_too_large() {
    let qos = qos(&[("a", inflight(10 * MIB))]);
    let err = qos.admit("a", 10 * MIB + 1).await.unwrap_err();
    assert_eq!(err, QosError::TooLarge { tenant: "a".into(), requested: 10 * MIB + 1, limit: 10 * MIB });
    assert_eq!(err.kind(), "max_inflight_bytes");
    qos.admit("a", 10 * MIB).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn inflight_wait_times_out_as_busy_without_wedging_the_queue() {
    let config = QosConfig { queue_timeout: Duration::from_secs(1), ..QosConfig::default() };
    let qos = Qos::new(config, tenants(&[("a", inflight(10 * MIB))])).unwrap();
    let p1 = qos.admit("a", 10 * MIB).await.unwrap();
    let start = Instant::now();
    let err = qos.admit("a", MIB).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(
        err,
        QosError::Busy { tenant: "a".into(), resource: "max_inflight_bytes", waited: Duration::from_secs(1) }
    );
    assert_eq!(err.kind(), "busy_inflight");
    assert_eq!(qos.snapshot("a").unwrap().queued, 0);
    drop(p1);
    qos.admit("a", 10 * MIB).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn inflight_waiter_dropped_after_grant_gives_bytes_back() {
    let qos = qos(&[("a", inflight(10 * MIB))]);
    let p1 = qos.admit("a", 10 * MIB).await.unwrap();
    let mut waiter = Box::pin(qos.admit("a", 6 * MIB));
    assert!(poll_once(&mut waiter).is_pending());
    // Dropping p1 grants the waiter, which is then cancelled before it runs.
    drop(p1);
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 6 * MIB);
    drop(waiter);
    assert_eq!(qos.snapshot("a").unwrap(), sluice_qos::Usage { inflight_bytes: 0, registered_bytes: 0, queued: 0 });
    qos.admit("a", 10 * MIB).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn registered_memory_quota_refuses_frees_and_follows_reload() {
    let memory = |limit| Limits { max_registered_bytes: Some(limit), ..Limits::default() };
    let qos = qos(&[("a", memory(1024 * MIB))]);
    let r1 = qos.reserve_memory("a", 600 * MIB).unwrap();
    let err = qos.reserve_memory("a", 600 * MIB).unwrap_err();
    assert_eq!(
        err,
        QosError::MemoryQuota { tenant: "a".into(), limit: 1024 * MIB, requested: 600 * MIB, in_use: 600 * MIB }
    );
    assert_eq!(err.kind(), "max_registered_bytes");
    drop(r1);
    let r2 = qos.reserve_memory("a", 600 * MIB).unwrap();

    // Raising the limit lets the next reservation through.
    qos.update(tenants(&[("a", memory(2048 * MIB))])).unwrap();
    let r3 = qos.reserve_memory("a", 600 * MIB).unwrap();
    // Lowering it revokes nothing, but refuses new reservations.
    qos.update(tenants(&[("a", memory(100 * MIB))])).unwrap();
    assert_eq!(qos.snapshot("a").unwrap().registered_bytes, 1200 * MIB);
    assert!(matches!(qos.reserve_memory("a", 1), Err(QosError::MemoryQuota { in_use, .. }) if in_use == 1200 * MIB));
    drop((r2, r3));
    assert_eq!(qos.snapshot("a").unwrap().registered_bytes, 0);
    qos.reserve_memory("a", 100 * MIB).unwrap();
}

#[tokio::test(start_paused = true)]
async fn reload_raising_inflight_limit_wakes_waiters_and_lowering_refuses_oversized_ones() {
    let qos = qos(&[("a", inflight(10 * MIB))]);
    let p1 = qos.admit("a", 10 * MIB).await.unwrap();
    let mut waiter = Box::pin(qos.admit("a", 8 * MIB));
    assert!(poll_once(&mut waiter).is_pending());
    qos.update(tenants(&[("a", inflight(20 * MIB))])).unwrap();
    let p2 = waiter.await.unwrap();
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 18 * MIB);

    let mut oversized = Box::pin(qos.admit("a", 5 * MIB));
    assert!(poll_once(&mut oversized).is_pending());
    qos.update(tenants(&[("a", inflight(4 * MIB))])).unwrap();
    assert!(matches!(oversized.await, Err(QosError::TooLarge { limit, .. }) if limit == 4 * MIB));
    // Existing permits survive the lowered limit and release normally.
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 18 * MIB);
    drop((p1, p2));
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 0);
}

#[tokio::test(start_paused = true)]
async fn reload_changes_rates_keeps_state_and_is_all_or_nothing() {
    let rps = |r| Limits { requests_per_sec: Some(r), ..Limits::default() };
    let qos = qos(&[("a", rps(100))]);
    let permit = qos.admit("a", MIB).await.unwrap();
    // Lowering the rate clamps the bucket to the new, smaller burst.
    qos.update(tenants(&[("a", rps(2))])).unwrap();
    assert_eq!(qos.limits("a"), Some(rps(2)));
    qos.admit("a", 1).await.unwrap();
    qos.admit("a", 1).await.unwrap();
    assert!(matches!(
        qos.admit("a", 1).await,
        Err(QosError::RateLimited { retry_after, .. }) if retry_after == Duration::from_millis(500)
    ));

    // Invalid reloads change nothing.
    let bad = tenants(&[("a", rps(50)), ("b", Limits { weight: 0, ..Limits::default() })]);
    assert!(matches!(qos.update(bad), Err(QosError::InvalidLimits { ref tenant, .. }) if tenant == "b"));
    assert_eq!(qos.limits("a"), Some(rps(2)));
    assert!(qos.limits("b").is_none());

    // Removing a tenant refuses new work; outstanding permits still release.
    qos.update(tenants(&[("b", Limits::default())])).unwrap();
    assert!(matches!(qos.admit("a", 1).await, Err(QosError::UnknownTenant { .. })));
    assert!(qos.snapshot("a").is_none());
    drop(permit);
    qos.admit("b", 1).await.unwrap();
    // Re-adding it picks up where its accounting left off.
    qos.update(tenants(&[("a", Limits::default())])).unwrap();
    assert_eq!(qos.snapshot("a").unwrap().inflight_bytes, 0);
}

#[test]
fn zero_rates_are_rejected_at_construction() {
    let bad = Limits { bytes_per_sec: Some(0), ..Limits::default() };
    let err = Qos::new(QosConfig::default(), tenants(&[("a", bad)])).unwrap_err();
    assert_eq!(err.kind(), "invalid_limits");
    assert_eq!(Limits::default().weight, 1);
}
