//! The health of each endpoint, shared by every namespace that names it.
//!
//! Passive: every request's outcome, seen by [`super::guarded::Guarded`]:
//! a refused connection, a deadline missed, a reset or a 5xx other than
//! throttling is a failure. A refused connection (nothing listens) or a
//! missed first-byte deadline (nothing answers) ejects the endpoint at
//! once: so a hung endpoint costs a request at most one deadline, however
//! many requests it makes in a row. Resets and 5xx eject it after
//! `eject_after_failures` in a row; any answer resets the count.
//! Ejecting is cheap to undo: a check brings the endpoint back within
//! `probe_interval_ms` of it answering again. Active: an ejected endpoint gets a signed
//! one-key listing every `probe_interval_ms`; the first that answers
//! within `probe_timeout_ms` (any answer but a 5xx: a 403 or 404 still
//! proves the gateway serves) brings it back. The readiness probe lists
//! through every endpoint of every namespace with the same deadline.
//!
//! Requests go to the endpoints that are up, in turn; an ejected endpoint
//! gets none until its check passes. The last endpoint of a namespace that
//! is up is never ejected ([`EndpointSet::failed`]); should every endpoint
//! of one be ejected all the same (namespaces sharing endpoints can eject
//! them all between them), they are all tried in turn rather than
//! failing without trying, and one that answers such a request is back.
//!
//! Health is per endpoint URL, not per namespace: a gateway that refuses
//! one namespace's connections refuses them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, IntGaugeVec};

use super::client::{ListQuery, S3Client, Target};
use super::error::S3Error;
use crate::config::failover::FailoverConfig;

/// The metrics of endpoint health, labelled by endpoint URL.
#[derive(Clone)]
pub struct EndpointMetrics {
    /// 1 while the endpoint gets requests, 0 while it is ejected.
    pub up: IntGaugeVec,
    /// Times the endpoint was ejected.
    pub ejections: IntCounterVec,
    /// Times an ejected endpoint came back.
    pub failbacks: IntCounterVec,
    /// Requests that failed against it, by `kind` (see [`FailureKind`]).
    pub failures: IntCounterVec,
}

/// How a request failed its endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Nothing listens: the connection was refused. Ejects at once.
    Refused,
    /// The endpoint made no progress within a deadline. Ejects at once.
    Deadline,
    /// The connection broke (reset, closed mid-body, TLS or protocol
    /// failure after connecting).
    Broken,
    /// A 5xx other than throttling.
    Server,
    /// A health or readiness probe got no answer within `probe_timeout_ms`
    /// (shorter than the first-byte deadline: a loaded gateway may be
    /// slower than that and still serve, so this only counts).
    ProbeDeadline,
}

impl FailureKind {
    /// Whether one such failure ejects the endpoint: nothing listens, or
    /// nothing answers (the deadline is long already).
    pub fn ejects_at_once(self) -> bool {
        matches!(self, Self::Refused | Self::Deadline)
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Deadline => "deadline",
            Self::Broken => "broken",
            Self::Server => "5xx",
            Self::ProbeDeadline => "probe-deadline",
        }
    }
}

/// The words of a missed deadline ([`deadline_error`]), which
/// [`classify`] recognises.
const NO_PROGRESS: &str = "made no progress within";

/// The error of a request `endpoint` let sit for `after` without progress
/// (`what`: which wait). Retryable, like any connection failure.
pub(super) fn deadline_error(endpoint: &str, what: &str, after: Duration) -> S3Error {
    S3Error::Connection { message: format!("{endpoint} {NO_PROGRESS} {} ms ({what})", after.as_millis()), attempts: 1 }
}

/// The first-byte deadline (`limit`, `None`: off) of a request's
/// `attempt`-th try: doubled with each retry, up to 8 times `limit`. The
/// deadline is there to move a request off a gateway that hangs, and the
/// first miss does; a retry that misses it again has most likely found the
/// only gateway left up, slow under the load its dead partner's clients
/// brought, and cutting it short again and again only throws away the work
/// done and adds load (a 2-gateway cluster with one killed failed writes
/// that way after 4 tries of 1.5 s each).
pub fn first_byte_deadline(limit: Option<Duration>, attempt: u32) -> Option<Duration> {
    limit.map(|d| d.saturating_mul(1 << attempt.min(3)))
}

/// Whether `e` is RGW refusing to complete a multipart upload because
/// another completion of it is in progress: one a gateway took on and then
/// hung in (it holds the upload's lock, for `rgw_mp_lock_max_time`, 10
/// minutes by default). No retry of the completion can succeed meanwhile,
/// through any gateway; the upload is done again under a new id instead
/// (the old one is aborted once the lock lets go, see `uploads`).
pub fn held_elsewhere(e: &S3Error) -> bool {
    matches!(e, S3Error::Server { status: 500, message, .. } if message.contains("completion is already in progress"))
}

/// Whether `e` says something about the endpoint that answered (or did
/// not); `None`: the endpoint served (4xx, throttling, a full store, an
/// error of ours, an upload held by another gateway).
pub fn classify(e: &S3Error) -> Option<FailureKind> {
    if held_elsewhere(e) {
        return None;
    }
    match e {
        S3Error::Connection { message, .. } | S3Error::TransferFailed { message, .. } => {
            let m = message.to_ascii_lowercase();
            Some(if m.contains(NO_PROGRESS) || m.contains("timed out") || m.contains("timeout") {
                FailureKind::Deadline
            } else if m.contains("connection refused") {
                FailureKind::Refused
            } else {
                FailureKind::Broken
            })
        }
        // Throttling (503 SlowDown, 429) asks us to slow down, a full store
        // (507) is full through every gateway: neither is the endpoint's
        // fault, and ejecting it would only load the others more.
        S3Error::Server { status, code, .. } if *status >= 500 && *status != 507 && code != "SlowDown" => {
            Some(FailureKind::Server)
        }
        _ => None,
    }
}

/// How a namespace checks an endpoint: a one-key listing of its prefix,
/// signed with its credentials.
#[derive(Clone)]
pub struct Probe {
    pub client: Arc<dyn S3Client>,
    pub prefix: String,
}

impl Probe {
    /// Lists one key through `endpoint` within `timeout`. `Ok(Err(e))`: the
    /// endpoint answered, with an error of the namespace's (a 403, a
    /// missing bucket).
    pub async fn run(&self, endpoint: &str, timeout: Duration) -> Result<Result<(), S3Error>, (FailureKind, String)> {
        let at = Target { endpoint, key: "", request_id: "endpoint-check", attempt: 0 };
        let query = ListQuery { prefix: &self.prefix, max_keys: 1, ..Default::default() };
        match tokio::time::timeout(timeout, self.client.list(at, query)).await {
            Ok(Ok(_)) => Ok(Ok(())),
            Ok(Err(e)) => match classify(&e) {
                None => Ok(Err(e)),
                Some(kind) => Err((kind, e.to_string())),
            },
            Err(_) => Err((
                FailureKind::Deadline,
                deadline_error(endpoint, "a health check; [failover] probe_timeout_ms", timeout).to_string(),
            )),
        }
    }
}

struct State {
    /// Failures since the last answer.
    failures: u32,
    /// Why it last failed (for `/ready` and the logs).
    last_error: String,
    /// When it was ejected, while it is.
    ejected_at: Option<Instant>,
    /// When it last answered (a request or a check).
    last_answer: Option<Instant>,
    /// How to check it: one per namespace that names it.
    probes: Vec<Probe>,
}

/// Why an endpoint did not serve a namespace's readiness probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotServing {
    /// The endpoint failed (its health knows, and says when it is back).
    Endpoint(String),
    /// It answered, with an error of the namespace's (denied, no bucket).
    Namespace(String),
}

impl std::fmt::Display for NotServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Endpoint(e) | Self::Namespace(e) => f.write_str(e),
        }
    }
}

/// One endpoint's health.
pub struct Endpoint {
    url: String,
    /// Read on every request: kept apart from the rest of the state.
    up: AtomicBool,
    state: Mutex<State>,
    eject_after: u32,
    metrics: Option<EndpointMetrics>,
}

/// What `/ready` says of one endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    pub url: String,
    pub up: bool,
    /// Why it was ejected (or last failed).
    pub last_error: String,
    /// How long it has been ejected.
    pub down_for: Option<Duration>,
    /// When it last answered a request or a check.
    pub last_answer: Option<Instant>,
}

impl Endpoint {
    fn new(url: &str, eject_after: u32, metrics: Option<EndpointMetrics>) -> Self {
        if let Some(m) = &metrics {
            m.up.with_label_values(&[url]).set(1);
        }
        let state =
            State { failures: 0, last_error: String::new(), ejected_at: None, last_answer: None, probes: Vec::new() };
        Self { url: url.to_owned(), up: AtomicBool::new(true), state: Mutex::new(state), eject_after, metrics }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether it gets requests.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// A request answered. `sent_while_up`: whether the endpoint was up
    /// when the request was sent; an answer to a request sent while it was
    /// ejected (every endpoint was) brings it back, an answer to one sent
    /// before it was ejected does not (a check must pass).
    pub fn answered(&self, sent_while_up: bool) {
        let mut st = self.lock();
        st.last_answer = Some(Instant::now());
        if self.is_up() {
            st.failures = 0;
        } else if !sent_while_up {
            drop(st);
            self.fail_back("it answered while every endpoint was ejected");
        }
    }

    /// A request failed. Returns whether this ejected the endpoint.
    pub fn failed(&self, kind: FailureKind, error: &str) -> bool {
        self.failure(kind, error, true)
    }

    /// A request failed; it may eject the endpoint only if `may_eject`
    /// (see [`EndpointSet::failed`]).
    fn failure(&self, kind: FailureKind, error: &str, may_eject: bool) -> bool {
        if let Some(m) = &self.metrics {
            m.failures.with_label_values(&[&self.url, kind.label()]).inc();
        }
        let mut st = self.lock();
        st.last_error = error.to_owned();
        if !self.is_up() {
            return false;
        }
        st.failures += 1;
        if !may_eject || !kind.ejects_at_once() && st.failures < self.eject_after {
            return false;
        }
        st.ejected_at = Some(Instant::now());
        self.up.store(false, Ordering::Release);
        let failures = st.failures;
        drop(st);
        if let Some(m) = &self.metrics {
            m.up.with_label_values(&[&self.url]).set(0);
            m.ejections.with_label_values(&[&self.url]).inc();
        }
        tracing::warn!(endpoint = %self.url, kind = kind.label(), failures, %error,
            "store endpoint ejected: no requests go to it until its health check passes");
        true
    }

    /// A check passed: an ejected endpoint is back.
    pub fn check_passed(&self) {
        let mut st = self.lock();
        st.last_answer = Some(Instant::now());
        if self.is_up() {
            st.failures = 0;
        } else {
            drop(st);
            self.fail_back("its health check passed");
        }
    }

    fn fail_back(&self, why: &str) {
        let mut st = self.lock();
        if self.is_up() {
            return;
        }
        let down_for = st.ejected_at.take().map(|t| t.elapsed()).unwrap_or_default();
        st.failures = 0;
        self.up.store(true, Ordering::Release);
        drop(st);
        if let Some(m) = &self.metrics {
            m.up.with_label_values(&[&self.url]).set(1);
            m.failbacks.with_label_values(&[&self.url]).inc();
        }
        tracing::info!(endpoint = %self.url, down_ms = down_for.as_millis() as u64, why, "store endpoint is back");
    }

    pub fn status(&self) -> EndpointStatus {
        let st = self.lock();
        EndpointStatus {
            url: self.url.clone(),
            up: self.is_up(),
            last_error: st.last_error.clone(),
            down_for: st.ejected_at.map(|t| t.elapsed()),
            last_answer: st.last_answer,
        }
    }

    /// Checks an ejected endpoint once, with the first namespace's probe
    /// (any answer will do).
    async fn check(&self, timeout: Duration) {
        let Some(probe) = self.lock().probes.first().cloned() else { return };
        match probe.run(&self.url, timeout).await {
            Ok(_) => self.check_passed(),
            Err((_, e)) => self.lock().last_error = e,
        }
    }
}

/// Every endpoint the agent's namespaces name, and the policy they share.
pub struct EndpointRegistry {
    policy: FailoverConfig,
    metrics: Option<EndpointMetrics>,
    endpoints: Mutex<BTreeMap<String, Arc<Endpoint>>>,
}

impl EndpointRegistry {
    pub fn new(policy: FailoverConfig, metrics: Option<EndpointMetrics>) -> Arc<Self> {
        Arc::new(Self { policy, metrics, endpoints: Mutex::default() })
    }

    pub fn policy(&self) -> &FailoverConfig {
        &self.policy
    }

    /// The endpoints `urls` of a namespace that checks them with `probe`.
    pub fn set(&self, urls: &[String], probe: Probe) -> EndpointSet {
        let mut all = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        let members = urls
            .iter()
            .map(|url| {
                let e = all
                    .entry(url.clone())
                    .or_insert_with(|| {
                        Arc::new(Endpoint::new(url, self.policy.eject_after_failures, self.metrics.clone()))
                    })
                    .clone();
                e.lock().probes.push(probe.clone());
                e
            })
            .collect();
        EndpointSet { members }
    }

    /// Checks every ejected endpoint once, all at the same time.
    pub async fn check_ejected(&self) {
        let ejected: Vec<Arc<Endpoint>> =
            self.endpoints.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|e| !e.is_up()).cloned().collect();
        let timeout = Duration::from_millis(self.policy.probe_timeout_ms);
        futures::future::join_all(ejected.iter().map(|e| e.check(timeout))).await;
    }

    /// Checks the ejected endpoints every `probe_interval_ms`, for as long
    /// as the agent runs.
    pub async fn check_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.policy.probe_interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.check_ejected().await;
        }
    }
}

/// A namespace's endpoints, in its configured order.
pub struct EndpointSet {
    pub(super) members: Vec<Arc<Endpoint>>,
}

impl EndpointSet {
    /// The `n`-th choice in turn among the endpoints that are up; among all
    /// of them when none is.
    pub fn pick(&self, n: usize) -> &Arc<Endpoint> {
        let up: Vec<&Arc<Endpoint>> = self.members.iter().filter(|e| e.is_up()).collect();
        if up.is_empty() {
            &self.members[n % self.members.len()]
        } else {
            up[n % up.len()]
        }
    }

    /// Like [`Self::pick`], avoiding `not` while any other endpoint is up
    /// (or, with none up, while there is another at all).
    pub fn pick_other(&self, not: &str, n: usize) -> &Arc<Endpoint> {
        let others = |up_only: bool| -> Vec<&Arc<Endpoint>> {
            self.members.iter().filter(|e| e.url != not && (!up_only || e.is_up())).collect()
        };
        let up = others(true);
        if !up.is_empty() {
            return up[n % up.len()];
        }
        match self.members.iter().find(|e| e.url == not) {
            Some(same) if same.is_up() || self.members.len() == 1 => same,
            _ => {
                let any = others(false);
                any.get(n % any.len().max(1)).copied().unwrap_or(&self.members[0])
            }
        }
    }

    /// A request to `ep` failed. The last of the namespace's endpoints that
    /// is up is never ejected: with nowhere else to send requests, that
    /// would gain nothing, and the namespace would look down while it may
    /// still serve (a gateway slowed by the load the others shed on it).
    /// Returns whether this ejected it.
    pub fn failed(&self, ep: &Endpoint, kind: FailureKind, error: &str) -> bool {
        let others_up = self.members.iter().any(|e| e.url != ep.url && e.is_up());
        ep.failure(kind, error, others_up)
    }

    /// The member at `url`.
    pub fn member(&self, url: &str) -> Option<&Arc<Endpoint>> {
        self.members.iter().find(|e| e.url == url)
    }

    pub fn status(&self) -> Vec<EndpointStatus> {
        self.members.iter().map(|e| e.status()).collect()
    }

    /// Whether a request that failed its endpoint this way can be retried
    /// at once: the endpoint is gone (not a 5xx, which asks for a pause)
    /// and the retry goes to another endpoint that is up — one of two up,
    /// or the only one up after a refusal or a missed deadline ejected the
    /// failed one.
    pub fn elsewhere_now(&self, kind: FailureKind) -> bool {
        let up = self.members.iter().filter(|e| e.is_up()).count();
        kind != FailureKind::Server && (up >= 2 || up == 1 && kind.ejects_at_once())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::failing::{refused, slow_down, Failing, Failure};
    use crate::s3::mock::{MockStore, Op};

    fn metrics() -> EndpointMetrics {
        let o = |n: &str| prometheus::Opts::new(n, n);
        EndpointMetrics {
            up: IntGaugeVec::new(o("up"), &["endpoint"]).unwrap(),
            ejections: IntCounterVec::new(o("ejections"), &["endpoint"]).unwrap(),
            failbacks: IntCounterVec::new(o("failbacks"), &["endpoint"]).unwrap(),
            failures: IntCounterVec::new(o("failures"), &["endpoint", "kind"]).unwrap(),
        }
    }

    fn registry(eject_after: u32) -> (Arc<EndpointRegistry>, EndpointMetrics) {
        let m = metrics();
        let policy = FailoverConfig { eject_after_failures: eject_after, probe_timeout_ms: 100, ..Default::default() };
        (EndpointRegistry::new(policy, Some(m.clone())), m)
    }

    fn urls() -> Vec<String> {
        vec!["http://a:1".into(), "http://b:2".into(), "http://c:3".into()]
    }

    fn probe(client: Arc<dyn S3Client>) -> Probe {
        Probe { client, prefix: String::new() }
    }

    fn timeout_error() -> S3Error {
        deadline_error("http://a:1", "the first byte", Duration::from_millis(5))
    }

    #[test]
    fn failures_are_told_apart_from_answers() {
        assert_eq!(classify(&refused()), Some(FailureKind::Refused));
        let reqwest_refused = S3Error::Connection {
            message:
                "error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)"
                    .into(),
            attempts: 1,
        };
        assert_eq!(classify(&reqwest_refused), Some(FailureKind::Refused));
        assert_eq!(classify(&timeout_error()), Some(FailureKind::Deadline));
        let reset = S3Error::TransferFailed { message: "connection reset by peer".into(), attempts: 1 };
        assert_eq!(classify(&reset), Some(FailureKind::Broken));
        assert_eq!(
            classify(&S3Error::from_response(500, "<Error><Code>InternalError</Code></Error>", None)),
            Some(FailureKind::Server)
        );
        assert_eq!(classify(&S3Error::from_response(502, "", None)), Some(FailureKind::Server));
        // The endpoint served: throttling, a full store, 4xx.
        assert_eq!(classify(&slow_down()), None);
        assert_eq!(classify(&S3Error::from_response(429, "", None)), None);
        assert_eq!(classify(&S3Error::from_response(507, "", None)), None);
        assert_eq!(classify(&S3Error::from_response(400, "<Error><Code>RequestTimeout</Code></Error>", None)), None);
        assert_eq!(classify(&S3Error::from_response(403, "", None)), None);
        assert_eq!(classify(&S3Error::NoSuchKey("k".into())), None);
    }

    /// `eject_after_failures` resets or 5xx in a row eject; an answer in
    /// between starts the count again; a refused connection or a missed
    /// deadline ejects at once.
    #[test]
    fn ejection_thresholds() {
        let (reg, m) = registry(3);
        let set = reg.set(&urls(), probe(Arc::new(MockStore::new())));
        let a = set.member("http://a:1").unwrap();
        assert!(!a.failed(FailureKind::Broken, "reset"));
        assert!(!a.failed(FailureKind::Server, "500"));
        a.answered(true);
        assert!(!a.failed(FailureKind::Broken, "reset"));
        assert!(!a.failed(FailureKind::Server, "502"));
        assert!(a.is_up(), "two in a row after an answer: still up");
        assert!(a.failed(FailureKind::Broken, "reset"), "the third in a row ejects");
        assert!(!a.is_up());
        assert!(!a.failed(FailureKind::Broken, "reset"), "an ejected endpoint is not ejected again");
        assert_eq!(m.ejections.with_label_values(&["http://a:1"]).get(), 1);
        assert_eq!(m.up.with_label_values(&["http://a:1"]).get(), 0);
        assert_eq!(m.failures.with_label_values(&["http://a:1", "broken"]).get(), 4);
        let b = set.member("http://b:2").unwrap();
        assert!(b.failed(FailureKind::Refused, "connection refused"), "nothing listens: ejected at once");
        let st = b.status();
        assert!(!st.up && st.last_error == "connection refused" && st.down_for.is_some(), "{st:?}");
        let c = set.member("http://c:3").unwrap();
        assert!(c.failed(FailureKind::Deadline, "no answer"), "nothing answers: ejected at once");
        assert_eq!(m.ejections.with_label_values(&["http://c:3"]).get(), 1);
    }

    /// Requests go round the endpoints that are up; an ejected one gets
    /// none; with every one ejected, all are tried in turn.
    #[test]
    fn picks_skip_ejected_endpoints_until_all_are() {
        let (reg, _) = registry(1);
        let set = reg.set(&urls(), probe(Arc::new(MockStore::new())));
        let picks = |set: &EndpointSet| (0..6).map(|n| set.pick(n).url().to_owned()).collect::<Vec<_>>();
        assert_eq!(picks(&set), ["http://a:1", "http://b:2", "http://c:3", "http://a:1", "http://b:2", "http://c:3"]);
        set.member("http://b:2").unwrap().failed(FailureKind::Refused, "refused");
        assert!(picks(&set).iter().all(|u| u != "http://b:2"), "{:?}", picks(&set));
        assert_eq!(set.pick_other("http://a:1", 0).url(), "http://c:3");
        set.member("http://a:1").unwrap().failed(FailureKind::Deadline, "hung");
        assert_eq!(picks(&set), vec!["http://c:3"; 6], "one left: everything goes there");
        assert_eq!(set.pick_other("http://c:3", 0).url(), "http://c:3", "no other is up: stay");
        assert!(!set.elsewhere_now(FailureKind::Broken), "the one up may be the one that failed");
        assert!(set.elsewhere_now(FailureKind::Refused), "a refusal ejected the failed one");
        assert!(set.elsewhere_now(FailureKind::Deadline), "so did a missed deadline");
        assert!(!set.elsewhere_now(FailureKind::Server), "a 5xx waits");
        set.member("http://c:3").unwrap().failed(FailureKind::Server, "503");
        // All down: tried in turn rather than not at all.
        assert_eq!(picks(&set), ["http://a:1", "http://b:2", "http://c:3", "http://a:1", "http://b:2", "http://c:3"]);
        assert_ne!(set.pick_other("http://a:1", 0).url(), "http://a:1");
        // One of them answers a request sent while all were down: it is back.
        set.member("http://b:2").unwrap().answered(false);
        assert_eq!(picks(&set), vec!["http://b:2"; 6]);
    }

    /// An answer to a request sent before the ejection is no proof the
    /// endpoint is back: only a passing check (or an all-down try) is.
    #[test]
    fn a_late_answer_does_not_fail_back() {
        let (reg, m) = registry(1);
        let set = reg.set(&urls(), probe(Arc::new(MockStore::new())));
        let a = set.member("http://a:1").unwrap();
        a.failed(FailureKind::Broken, "reset");
        a.answered(true);
        assert!(!a.is_up());
        a.check_passed();
        assert!(a.is_up());
        assert_eq!(m.failbacks.with_label_values(&["http://a:1"]).get(), 1);
        assert_eq!(m.up.with_label_values(&["http://a:1"]).get(), 1);
    }

    /// Ejected endpoints are checked with a one-key listing: one that still
    /// fails (or hangs past the probe deadline) stays out, one that answers
    /// (even with an error of the namespace's, like a 403) comes back.
    #[tokio::test]
    async fn checks_fail_back_endpoints_that_answer_again() {
        let mock = MockStore::new();
        let failing =
            Arc::new(Failing::new(Arc::new(mock.clone())).fail(Op::List, 0, 1, Failure::Error(refused)).fail(
                Op::List,
                0,
                1,
                Failure::Hang,
            ));
        let (reg, m) = registry(1);
        let set = reg.set(&urls(), probe(failing.clone()));
        for u in ["http://a:1", "http://b:2"] {
            set.member(u).unwrap().failed(FailureKind::Refused, "refused");
        }
        let t0 = Instant::now();
        reg.check_ejected().await;
        assert!(t0.elapsed() < Duration::from_secs(2), "a hung check ends at its deadline");
        let up: Vec<bool> = set.status().iter().map(|s| s.up).collect();
        assert_eq!(up, [false, false, true], "one check refused, one hung: both stay out");
        assert!(set.status().iter().take(2).any(|s| s.last_error.contains(NO_PROGRESS)), "{:?}", set.status());
        assert_eq!(failing.endpoints(Op::List).len(), 2, "only the ejected endpoints are checked");
        reg.check_ejected().await;
        assert!(set.status().iter().all(|s| s.up), "{:?}", set.status());
        assert_eq!(m.failbacks.with_label_values(&["http://a:1"]).get(), 1);
        assert_eq!(m.failbacks.with_label_values(&["http://b:2"]).get(), 1);

        // An answer with an error of the namespace's still proves it serves.
        fn denied() -> S3Error {
            S3Error::from_response(403, "<Error><Code>AccessDenied</Code></Error>", None)
        }
        let failing = Arc::new(Failing::new(Arc::new(mock)).fail(Op::List, 0, 1, Failure::Error(denied)));
        let (reg, _) = registry(1);
        let set = reg.set(&urls(), probe(failing));
        set.member("http://c:3").unwrap().failed(FailureKind::Server, "500");
        reg.check_ejected().await;
        assert!(set.member("http://c:3").unwrap().is_up());
    }

    /// The last endpoint of a namespace that is up is never ejected (a
    /// gateway slowed by the load the others shed stays in use, and the
    /// namespace does not look down while it may serve); the others are.
    #[test]
    fn the_last_endpoint_up_is_kept() {
        let (reg, m) = registry(1);
        let set = reg.set(&urls()[..2], probe(Arc::new(MockStore::new())));
        let (a, b) = (set.member("http://a:1").unwrap(), set.member("http://b:2").unwrap());
        assert!(set.failed(a, FailureKind::Deadline, "hung"));
        assert!(!set.failed(b, FailureKind::Deadline, "slow"), "the last one up");
        assert!(!set.failed(b, FailureKind::Refused, "refused"));
        assert!(b.is_up() && !a.is_up());
        assert_eq!(m.failures.with_label_values(&["http://b:2", "refused"]).get(), 1, "still counted");
        a.check_passed();
        assert!(set.failed(b, FailureKind::Refused, "refused"), "with another up again, it goes");
    }

    /// Namespaces naming the same endpoint share its health.
    #[test]
    fn health_is_per_endpoint_across_namespaces() {
        let (reg, _) = registry(1);
        let one = reg.set(&urls()[..2], probe(Arc::new(MockStore::new())));
        let two = reg.set(&urls()[1..], probe(Arc::new(MockStore::new())));
        one.member("http://b:2").unwrap().failed(FailureKind::Refused, "refused");
        assert!(!two.member("http://b:2").unwrap().is_up());
        assert_eq!(two.pick(0).url(), "http://c:3");
    }
}
