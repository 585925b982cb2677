//! The agent's transfer scheduler: a fixed number of global slots (chunks in
//! flight across all tenants) handed out by weighted deficit round robin when
//! contended, with cost = chunk bytes.
//!
//! Why DRR by bytes: a tenant streaming 8 MiB chunks and one issuing 4 KiB
//! requests then get equal *bandwidth*, and the small tenant waits for at most
//! the chunks the big one is entitled to in one turn (one, at equal weights),
//! instead of behind the big tenant's whole queue as under FIFO.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::lock;

#[derive(Debug)]
struct SlotWaiter {
    id: u64,
    cost: u64,
    tx: oneshot::Sender<()>,
}

/// A tenant with waiters. Exists exactly while its queue is non-empty and the
/// tenant is in `active`: an idle tenant forfeits its deficit (standard DRR), so
/// it cannot save up credit while idle and then burst past everyone.
#[derive(Debug)]
struct Flow {
    deficit: u64,
    /// Whether the flow at the front of `active` has already received its
    /// quantum for the current turn (grants happen one freed slot at a time, so
    /// a turn can span several dispatch calls).
    in_turn: bool,
    waiters: VecDeque<SlotWaiter>,
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    free: usize,
    quantum: u64,
    weights: HashMap<String, u32>,
    flows: HashMap<String, Flow>,
    active: VecDeque<String>,
    next_id: u64,
}

pub(crate) type Shared = Arc<Mutex<Scheduler>>;

pub(crate) enum Acquire {
    Now,
    Queued(SlotWaitGuard),
}

impl Scheduler {
    pub(crate) fn new(slots: usize, quantum: u64, weights: HashMap<String, u32>) -> Self {
        Scheduler {
            free: slots.max(1),
            quantum: quantum.max(1),
            weights,
            flows: HashMap::new(),
            active: VecDeque::new(),
            next_id: 0,
        }
    }

    pub(crate) fn set_weights(&mut self, weights: HashMap<String, u32>) {
        self.weights = weights;
    }

    pub(crate) fn queued(&self, tenant: &str) -> usize {
        self.flows.get(tenant).map_or(0, |f| f.waiters.len())
    }

    fn quantum_of(&self, tenant: &str) -> u64 {
        // Unknown tenants get weight 1: the scheduler only shares bandwidth, it
        // is not where admission is enforced.
        let weight = self.weights.get(tenant).copied().unwrap_or(1).max(1);
        self.quantum.saturating_mul(u64::from(weight))
    }

    pub(crate) fn acquire(sched: &Shared, tenant: &str, cost: u64) -> Acquire {
        let mut s = lock(sched);
        // Invariant kept by `dispatch`: free slots imply nobody is waiting, so
        // taking one directly cannot jump a queue.
        if s.free > 0 && s.active.is_empty() {
            s.free -= 1;
            return Acquire::Now;
        }
        let (tx, rx) = oneshot::channel();
        let id = s.next_id;
        s.next_id += 1;
        match s.flows.get_mut(tenant) {
            Some(flow) => flow.waiters.push_back(SlotWaiter { id, cost, tx }),
            None => {
                let waiters = VecDeque::from([SlotWaiter { id, cost, tx }]);
                s.flows.insert(tenant.to_owned(), Flow { deficit: 0, in_turn: false, waiters });
                s.active.push_back(tenant.to_owned());
            }
        }
        s.dispatch();
        Acquire::Queued(SlotWaitGuard { sched: Arc::clone(sched), tenant: tenant.to_owned(), id, rx, done: false })
    }

    fn release(&mut self) {
        self.free += 1;
        self.dispatch();
    }

    /// Hand free slots to waiters in DRR order.
    fn dispatch(&mut self) {
        // Consecutive turns that ended without a grant; a full lap of those means
        // every head costs more than its flow's deficit.
        let mut misses = 0;
        while self.free > 0 {
            let Some(name) = self.active.front() else { break };
            let quantum = self.quantum_of(name);
            let Some(flow) = self.flows.get_mut(name) else {
                self.active.pop_front();
                continue;
            };
            if !flow.in_turn {
                flow.deficit = flow.deficit.saturating_add(quantum);
                flow.in_turn = true;
            }
            let Some(head_cost) = flow.waiters.front().map(|w| w.cost) else {
                self.drop_front_flow();
                continue;
            };
            if head_cost <= flow.deficit {
                if let Some(w) = flow.waiters.pop_front() {
                    // Send fails only if the receiver is gone, which the guard
                    // prevents (see SlotWaitGuard::drop); then the slot stays free.
                    if w.tx.send(()).is_ok() {
                        flow.deficit -= head_cost;
                        self.free -= 1;
                        misses = 0;
                    }
                }
                if flow.waiters.is_empty() {
                    self.drop_front_flow();
                }
            } else {
                flow.in_turn = false;
                self.active.rotate_left(1);
                misses += 1;
                if misses >= self.active.len() {
                    self.skip_rounds();
                    misses = 0;
                }
            }
        }
    }

    fn drop_front_flow(&mut self) {
        if let Some(name) = self.active.pop_front() {
            self.flows.remove(&name);
        }
    }

    /// Every flow just had a turn without being able to afford its head. Instead
    /// of spinning lap after lap (a 1 GiB chunk against a 256 KiB quantum would
    /// take 4096 laps), credit all flows the laps that would pass before the
    /// first one can afford its head; the next lap then grants. Equivalent to
    /// spinning, since every flow gains its quantum on every lap.
    fn skip_rounds(&mut self) {
        let mut laps = u64::MAX;
        for name in &self.active {
            let quantum = self.quantum_of(name);
            if let Some(flow) = self.flows.get(name) {
                let cost = flow.waiters.front().map_or(0, |w| w.cost);
                laps = laps.min(cost.saturating_sub(flow.deficit).div_ceil(quantum));
            }
        }
        // The coming lap adds one quantum itself.
        let extra = laps.saturating_sub(1);
        if extra == 0 {
            return;
        }
        let quanta: Vec<(String, u64)> = self.active.iter().map(|n| (n.clone(), self.quantum_of(n))).collect();
        for (name, quantum) in quanta {
            if let Some(flow) = self.flows.get_mut(&name) {
                flow.deficit = flow.deficit.saturating_add(quantum.saturating_mul(extra));
            }
        }
    }
}

/// A queued `slot()` call. Dropping it before it resolved removes the waiter,
/// or, if a slot was granted in the meantime, returns that slot; so cancelled
/// waiters neither leak capacity nor wedge the queue.
pub(crate) struct SlotWaitGuard {
    sched: Shared,
    tenant: String,
    id: u64,
    rx: oneshot::Receiver<()>,
    done: bool,
}

impl SlotWaitGuard {
    /// `None` only if the grant channel closed without a grant, which cannot
    /// happen while this guard owns the receiver; the caller reports it as busy
    /// rather than hanging.
    pub(crate) async fn wait(mut self) -> Option<Slot> {
        (&mut self.rx).await.ok()?;
        self.done = true;
        Some(Slot { sched: Arc::clone(&self.sched) })
    }
}

impl Drop for SlotWaitGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = lock(&self.sched);
        let mut found = false;
        if let Some(flow) = s.flows.get_mut(&self.tenant) {
            if let Some(pos) = flow.waiters.iter().position(|w| w.id == self.id) {
                flow.waiters.remove(pos);
                found = true;
                if flow.waiters.is_empty() {
                    s.flows.remove(&self.tenant);
                    s.active.retain(|n| *n != self.tenant);
                }
            }
        }
        if !found && self.rx.try_recv().is_ok() {
            s.release();
        }
    }
}

/// One of the agent's global transfer slots; released (and handed to the next
/// tenant by DRR) on drop.
#[derive(Debug)]
pub struct Slot {
    pub(crate) sched: Shared,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.sched).release();
    }
}
