//! Per-tenant caps on things every tenant draws from the same agent:
//! sessions, and regions over all of a tenant's sessions. Each session and
//! region holds a [`Place`], given back when it is dropped (closed,
//! released, expired), so the count cannot drift from what is held.
//!
//! The per-session limits alone do not bound a tenant: it could open
//! sessions without end, each with its full share of regions, and every
//! region is a mapping in the agent (the kernel allows ~65,000 per
//! process), so one tenant could leave none for the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::AgentError;

type Counts = Arc<Mutex<HashMap<Arc<str>, usize>>>;

/// How many of one kind of thing each tenant holds, and the most it may.
pub(crate) struct TenantPlaces {
    counts: Counts,
    max: usize,
    /// What is counted, for the refusal ("sessions", "regions").
    what: &'static str,
}

/// One held thing of a tenant; dropping it gives the place back.
pub(crate) struct Place {
    counts: Counts,
    tenant: Arc<str>,
}

impl TenantPlaces {
    pub fn new(max: usize, what: &'static str) -> Self {
        Self { counts: Arc::default(), max, what }
    }

    /// A place for one more of `tenant`'s, or `ResourceExhausted` when it
    /// holds the most it may.
    pub fn take(&self, tenant: &str) -> Result<Place, AgentError> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let key: Arc<str> = match counts.get_key_value(tenant) {
            Some((_, &n)) if n >= self.max => {
                return Err(AgentError::ResourceExhausted(format!("{} {} per tenant (held: {n})", self.max, self.what)))
            }
            Some((k, _)) => k.clone(),
            None => tenant.into(),
        };
        *counts.entry(key.clone()).or_insert(0) += 1;
        Ok(Place { counts: self.counts.clone(), tenant: key })
    }

    /// How many `tenant` holds now.
    #[cfg(test)]
    pub fn held(&self, tenant: &str) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_per_tenant_and_come_back_on_drop() {
        let p = TenantPlaces::new(2, "sessions");
        let a1 = p.take("alpha").expect("first");
        let _a2 = p.take("alpha").expect("second");
        let e = p.take("alpha").err().expect("a third is refused");
        assert!(e.to_string().contains("2 sessions per tenant"), "{e}");
        let _b = p.take("beta").expect("another tenant is not held back");
        drop(a1);
        assert_eq!(p.held("alpha"), 1);
        let _a3 = p.take("alpha").expect("a place given back is taken again");
        drop(_a2);
        drop(_a3);
        assert_eq!(p.held("alpha"), 0);
        assert!(p.counts.lock().unwrap_or_else(|p| p.into_inner()).get("alpha").is_none(), "no entry kept for none");
    }
}
