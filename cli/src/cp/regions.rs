//! The registered memory of a `sluice cp` run: regions reused from object
//! to object (a registration and a release cost about what a small PUT
//! does), all of them together, in use or idle, within `--memory`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use sluice_client::{Client, Region};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget's unit.
const UNIT: u64 = 4096;
/// Regions up to this size are registered in powers of two (at least
/// [`SMALLEST`]) so objects of similar sizes share them; larger ones at
/// their size rounded to 1 MiB.
const POWER_OF_TWO_UP_TO: u64 = 64 << 20;
const SMALLEST: u64 = 64 << 10;

/// A region held by one job, and its share of the budget.
pub struct Lease {
    pub region: Arc<Region>,
    permit: OwnedSemaphorePermit,
}

pub struct Regions<'c> {
    client: &'c Client,
    budget: Arc<Semaphore>,
    units: u32,
    /// The shim's largest region (0: no limit).
    max_region: u64,
    idle: Mutex<Idle>,
    registered: AtomicUsize,
}

#[derive(Default)]
struct Idle {
    leases: Vec<Lease>,
    /// Jobs waiting for room: regions given back then are released, not
    /// kept (else the waiter could wait for ever behind idle regions).
    waiting: usize,
}

impl<'c> Regions<'c> {
    pub fn new(client: &'c Client, budget_bytes: u64, max_region: u64) -> Self {
        let units = (budget_bytes / UNIT).clamp(1, u64::from(u32::MAX)) as u32;
        let budget = Arc::new(Semaphore::new(units as usize));
        Self { client, budget, units, max_region, idle: Mutex::default(), registered: AtomicUsize::new(0) }
    }

    /// How many regions this run registered.
    pub fn registered(&self) -> usize {
        self.registered.load(Ordering::Relaxed)
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The size a region for `len` bytes is registered with (never more
    /// than the shim's largest region, unless `len` is).
    fn class(len: u64, max_region: u64) -> u64 {
        let class = if len <= POWER_OF_TWO_UP_TO {
            len.max(1).next_power_of_two().max(SMALLEST)
        } else {
            len.div_ceil(1 << 20) * (1 << 20)
        };
        match max_region {
            0 => class,
            max => class.min(max).max(len.max(1)),
        }
    }

    /// A region of at least `len` bytes: an idle one that fits, else a new
    /// one once the budget has room (idle regions are released to make
    /// it). More than the whole budget waits for all of it.
    pub async fn lease(&self, len: u64) -> anyhow::Result<Lease> {
        let class = Self::class(len, self.max_region);
        {
            let mut idle = self.idle();
            let fits = |l: &Lease| l.region.len() >= len && l.region.len() <= 2 * class;
            if let Some(i) =
                (0..idle.leases.len()).filter(|&i| fits(&idle.leases[i])).min_by_key(|&i| idle.leases[i].region.len())
            {
                return Ok(idle.leases.swap_remove(i));
            }
        }
        let units = class.div_ceil(UNIT).clamp(1, u64::from(self.units)) as u32;
        let permit = loop {
            if let Ok(p) = self.budget.clone().try_acquire_many_owned(units) {
                break p;
            }
            let evict = {
                let mut idle = self.idle();
                let evict = idle.leases.pop();
                if evict.is_none() {
                    idle.waiting += 1;
                }
                evict
            };
            match evict {
                Some(old) => self.release(old).await,
                None => {
                    let p = self.budget.clone().acquire_many_owned(units).await;
                    self.idle().waiting -= 1;
                    break p.context("the memory budget closed")?;
                }
            }
        };
        let region = self.client.register(class).await.context("registering a region")?;
        self.registered.fetch_add(1, Ordering::Relaxed);
        Ok(Lease { region: Arc::new(region), permit })
    }

    /// Keeps a region for the next object (released instead when a job
    /// waits for room).
    pub async fn give_back(&self, lease: Lease) {
        let release = {
            let mut idle = self.idle();
            if idle.waiting == 0 {
                idle.leases.push(lease);
                None
            } else {
                Some(lease)
            }
        };
        if let Some(lease) = release {
            self.release(lease).await;
        }
    }

    /// Releases a region that may still be written (its request failed or
    /// was abandoned), so it is never handed to another object.
    pub async fn discard(&self, lease: Lease) {
        self.release(lease).await;
    }

    /// Releases a region with the shim, then frees its share of the budget
    /// (a failure only logs: the shim drops a session's regions when the
    /// connection ends).
    async fn release(&self, lease: Lease) {
        if let Err(e) = self.client.release_id(lease.region.id()).await {
            tracing::warn!(region = lease.region.id(), error = %e, "releasing a region");
        }
        drop(lease.permit);
    }

    /// Releases the idle regions (at the end of a run).
    pub async fn close(&self) {
        let idle = std::mem::take(&mut self.idle().leases);
        for lease in idle {
            self.release(lease).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(Regions::class(0, 0), SMALLEST);
        assert_eq!(Regions::class(1, 0), SMALLEST);
        assert_eq!(Regions::class(100_000, 0), 128 << 10);
        assert_eq!(Regions::class(64 << 20, 0), 64 << 20);
        assert_eq!(Regions::class((64 << 20) + 1, 0), 65 << 20);
        assert_eq!(Regions::class(20 << 20, 0), 32 << 20);
        assert_eq!(Regions::class(20 << 20, 24 << 20), 24 << 20);
        assert_eq!(Regions::class(30 << 20, 24 << 20), 30 << 20, "the shim refuses it, saying so");
    }
}
