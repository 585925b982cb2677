//! Per-core runtimes for the shims' connections (`[runtime]`).
//!
//! On one multi-threaded runtime a 4 KiB GET wakes several workers: the
//! HTTP/2 connection's task, the request's task and the store connection's
//! readiness land on different threads, which park and steal from each
//! other. Measured on the agent (docs/performance.md), its CPU per GET grew
//! with the runtime's workers: 38–43 µs with 1, 53–63 µs with 6. Here each
//! accepted control connection is served start to finish by one thread with
//! a current-thread runtime of its own: its requests, their GETs' plain-HTTP
//! store connections (pooled per thread, `s3::http1`) and their replies
//! stay on that thread. HTTPS stores, PUTs and listings go through the
//! agent's shared reqwest pool, whose connections may have been opened on
//! another core. Connections are dealt round robin, and the shim opens
//! several (`[agent] connections`), so the work still spreads over the
//! cores.
//!
//! Background work (session reaping, probes, the sweeper, the memory
//! socket, the one-sided transports' owner side) stays on the main runtime.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

/// Most per-core threads `[runtime] threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// `[runtime]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Serve each control connection on one thread of its own runtime
    /// (`true`), or all of them on the main multi-threaded runtime
    /// (`false`, the default: on cores shared with the loader one runtime's
    /// workers batch more work per wake-up; measured in
    /// docs/performance.md).
    pub per_core: bool,
    /// How many such threads; 0: `TOKIO_WORKER_THREADS` if set, else one
    /// per CPU the agent may run on (its affinity mask, e.g. the DPU cores
    /// `taskset` or systemd's `CPUAffinity` gave it).
    pub threads: usize,
    /// Pin thread *i* to the *i*-th CPU of that mask. Best on cores the
    /// agent has to itself (a BlueField's); on cores shared with other
    /// processes the scheduler is better left free.
    pub pin: bool,
}

/// Why the per-core threads could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoresError {
    #[error("starting runtime thread {index}: {source}")]
    Start { index: usize, source: std::io::Error },
    #[error("[runtime] pin = true: pinning thread {index} to CPU {cpu}: {source}")]
    Pin { index: usize, cpu: usize, source: nix::errno::Errno },
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
/// Run on the core's thread, inside its runtime: what it builds (sockets,
/// timers) registers with that runtime.
type Job = Box<dyn FnOnce() -> BoxFuture + Send>;

thread_local! {
    /// 1 + this thread's core index; 0 on any other thread.
    static CORE: Cell<usize> = const { Cell::new(0) };
}

/// Which per-core runtime this thread is (1-based), or 0 for the main
/// runtime and any other thread. Keys the per-thread connection pools.
pub fn current() -> usize {
    CORE.with(Cell::get)
}

/// The running per-core threads. Dropping this ends them once their
/// spawned work is handed off (their runtimes then stop, cancelling what
/// still runs).
pub struct Cores {
    jobs: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect(),
        Err(_) => Vec::new(),
    }
}

impl Cores {
    /// Starts the threads `cfg` asks for; `None` when `per_core` is off.
    pub fn start(cfg: &RuntimeConfig) -> Result<Option<Self>, CoresError> {
        if !cfg.per_core {
            return Ok(None);
        }
        let cpus = allowed_cpus();
        let from_env = std::env::var("TOKIO_WORKER_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok());
        let n = match (cfg.threads, from_env) {
            (0, Some(n)) if n > 0 => n.min(MAX_THREADS),
            (0, _) => cpus.len().max(1),
            (n, _) => n,
        };
        if cfg.pin && cpus.is_empty() {
            return Err(CoresError::Start {
                index: 0,
                source: std::io::Error::other("[runtime] pin = true, but the agent's CPU affinity could not be read"),
            });
        }
        // Tokio's default for one runtime's blocking pool, shared out.
        let blocking_per_core = (512 / n).max(4);
        let mut jobs = Vec::with_capacity(n);
        for index in 0..n {
            let cpu = if cfg.pin { cpus.get(index % cpus.len().max(1)).copied() } else { None };
            let (tx, rx) = mpsc::unbounded_channel::<Job>();
            let (started_tx, started_rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("sluice-core-{index}"))
                .spawn(move || core_thread(index, cpu, blocking_per_core, rx, started_tx))
                .map_err(|source| CoresError::Start { index, source })?;
            // The thread reports whether its runtime (and pinning) worked.
            match started_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(CoresError::Start { index, source: std::io::Error::other("the thread ended at start") })
                }
            }
            jobs.push(tx);
        }
        tracing::info!(threads = n, pinned = cfg.pin, "per-core runtimes for the control connections");
        Ok(Some(Self { jobs, next: AtomicUsize::new(0) }))
    }

    /// How many threads run.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Always false: at least one thread runs.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The next thread, round robin.
    pub fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.jobs.len()
    }

    /// Builds and runs `make()`'s future on thread `index`'s runtime; the
    /// receiver gets its output (or is closed if that runtime stopped).
    pub fn spawn_on<F, T>(&self, index: usize, make: impl FnOnce() -> F + Send + 'static) -> oneshot::Receiver<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let _ = tx.send(make().await);
            })
        });
        // A closed channel means the thread is gone; the caller sees the
        // receiver closed.
        let _ = self.jobs[index % self.jobs.len()].send(job);
        rx
    }
}

fn core_thread(
    index: usize,
    cpu: Option<usize>,
    blocking_per_core: usize,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    started: std::sync::mpsc::Sender<Result<(), CoresError>>,
) {
    if let Some(cpu) = cpu {
        let mut set = nix::sched::CpuSet::new();
        let pinned = set
            .set(cpu)
            .and_then(|()| nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set))
            .map_err(|source| CoresError::Pin { index, cpu, source });
        if let Err(e) = pinned {
            let _ = started.send(Err(e));
            return;
        }
    }
    // Each runtime has a blocking pool of its own (decryption, checksums,
    // the journal): together they get what one runtime would.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(blocking_per_core)
        .build()
    {
        Ok(rt) => rt,
        Err(source) => {
            let _ = started.send(Err(CoresError::Start { index, source }));
            return;
        }
    };
    CORE.with(|c| c.set(index + 1));
    let _ = started.send(Ok(()));
    rt.block_on(async move {
        while let Some(job) = jobs.recv().await {
            tokio::spawn(job());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_their_own_thread_and_runtime() {
        let cores = Cores::start(&RuntimeConfig { per_core: true, threads: 3, pin: false }).unwrap().unwrap();
        assert_eq!(cores.len(), 3);
        assert_eq!(current(), 0, "the test's own thread is no core");
        for i in 0..3 {
            let got = cores
                .spawn_on(i, move || async move {
                    let flavor = tokio::runtime::Handle::current().runtime_flavor();
                    // Spawned work stays on the same thread.
                    let inner = tokio::spawn(async { (current(), std::thread::current().id()) }).await.unwrap();
                    (current(), std::thread::current().id(), inner, flavor)
                })
                .await
                .unwrap();
            assert_eq!(got.0, i + 1);
            assert_eq!((got.0, got.1), got.2);
            assert_eq!(got.3, tokio::runtime::RuntimeFlavor::CurrentThread);
        }
        assert_eq!((0..6).map(|_| cores.pick()).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn off_by_default_and_zero_means_the_affinity_mask() {
        assert!(Cores::start(&RuntimeConfig::default()).unwrap().is_none());
        let on = RuntimeConfig { per_core: true, ..Default::default() };
        let all = Cores::start(&on).unwrap().unwrap();
        let expected = match std::env::var("TOKIO_WORKER_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
            Some(n) if n > 0 => n,
            _ => allowed_cpus().len(),
        };
        assert_eq!(all.len(), expected);
        assert!(!allowed_cpus().is_empty());
    }

    #[test]
    fn pinned_threads_run_on_their_cpu() {
        let cpus = allowed_cpus();
        let cores = Cores::start(&RuntimeConfig { per_core: true, threads: 1, pin: true }).unwrap().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mask = rt
            .block_on(cores.spawn_on(0, || async {
                let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
                (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap()).collect::<Vec<_>>()
            }))
            .unwrap();
        assert_eq!(mask, vec![cpus[0]]);
    }

    #[test]
    fn dropping_the_cores_stops_their_threads_work() {
        let cores = Cores::start(&RuntimeConfig { per_core: true, threads: 1, pin: false }).unwrap().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (held_tx, held_rx) = oneshot::channel::<()>();
        // A task that would run forever, holding `held_tx`.
        let started = cores.spawn_on(0, move || async move {
            let _held = held_tx;
            std::future::pending::<()>().await;
        });
        drop(cores);
        // The runtime stopped and dropped the task: its sender is gone.
        rt.block_on(async {
            assert!(tokio::time::timeout(std::time::Duration::from_secs(5), held_rx).await.unwrap().is_err());
            assert!(started.await.is_err());
        });
    }
}
