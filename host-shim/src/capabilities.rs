//! The shim's side of the capability exchange: it tells the agent which
//! region memory it can register, passes the agent's answer on to its
//! clients (at Hello) with its own limits filled in, and refuses a region
//! neither side can handle before exporting anything.

use sluice_proto::common::{Capabilities, MemoryKind};

use crate::config::ShimConfig;
use crate::error::ShimError;
use crate::memory::MemoryBackend;

/// What the agent answered for a session of `tenant`. An agent that sends
/// nothing is older than the exchange: it is taken to reach what this shim
/// registers (it still refuses an export it cannot import, before any byte
/// moves), so a host upgraded before its DPU keeps working.
pub fn from_agent(answer: Option<Capabilities>, backend: &MemoryBackend, tenant: &str) -> Capabilities {
    answer.unwrap_or_else(|| {
        tracing::warn!(
            tenant,
            "the agent sent no capabilities (an older agent); assuming it reaches this shim's memory"
        );
        let agent_memory = backend.kinds_older_agents_reach().into_iter().map(|k| k as i32).collect();
        Capabilities { agent_memory, ..Default::default() }
    })
}

/// The agent's answer with the shim's own part: what it registers and its
/// limits (the smaller batch limit of the two).
pub fn for_clients(mut agent: Capabilities, backend: &MemoryBackend, cfg: &ShimConfig) -> Capabilities {
    agent.shim_memory = backend.kinds().into_iter().map(|k| k as i32).collect();
    agent.max_region_bytes = cfg.limits.max_region_bytes;
    let shim_batch = u32::try_from(cfg.limits.max_batch_items).unwrap_or(u32::MAX);
    agent.max_batch_items = match agent.max_batch_items {
        0 => shim_batch,
        n => n.min(shim_batch),
    };
    agent
}

fn describe(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Memfd => "shared memory handed over as a memfd (a co-located agent)",
        MemoryKind::DocaHost => "host memory exported with DOCA (an agent on this host's BlueField)",
        MemoryKind::GpuDmabuf => {
            "GPU memory (a CUDA dma-buf: exported with DOCA, or registered with the RDMA NIC of a co-located agent)"
        }
        MemoryKind::Unspecified => "unspecified memory",
    }
}

/// Refuses (UNSUPPORTED, before any export) a region of `kind` that the
/// agent cannot reach. `caps` is what the agent answered for the session.
pub fn check_region(caps: &Capabilities, kind: MemoryKind) -> Result<(), ShimError> {
    if caps.agent_memory.contains(&(kind as i32)) {
        return Ok(());
    }
    let reaches: Vec<&str> = caps.agent_memory().map(describe).collect();
    Err(ShimError::Unsupported(format!(
        "the agent cannot reach {}: it reaches {} (see the session's capabilities: sluice stat --caps)",
        describe(kind),
        if reaches.is_empty() { "no region memory".to_owned() } else { reaches.join(", ") },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(kinds: &[MemoryKind]) -> Capabilities {
        Capabilities { agent_memory: kinds.iter().map(|k| *k as i32).collect(), ..Default::default() }
    }

    #[test]
    fn regions_the_agent_cannot_reach_are_refused_with_the_reason() {
        let colocated = agent(&[MemoryKind::Memfd]);
        assert!(check_region(&colocated, MemoryKind::Memfd).is_ok());
        match check_region(&colocated, MemoryKind::GpuDmabuf) {
            Err(ShimError::Unsupported(why)) => {
                assert!(why.contains("GPU memory") && why.contains("co-located agent"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let doca = agent(&[MemoryKind::DocaHost, MemoryKind::GpuDmabuf]);
        assert!(check_region(&doca, MemoryKind::GpuDmabuf).is_ok());
        assert!(matches!(check_region(&doca, MemoryKind::Memfd), Err(ShimError::Unsupported(_))));
        assert!(matches!(check_region(&agent(&[]), MemoryKind::Memfd), Err(ShimError::Unsupported(_))));
    }

    #[test]
    fn an_older_agent_without_capabilities_is_taken_to_reach_the_shims_memory() {
        let caps = from_agent(None, &MemoryBackend::Colocated, "t");
        assert!(check_region(&caps, MemoryKind::Memfd).is_ok());
        // GPU memory on a co-located agent came later: not assumed.
        assert!(matches!(check_region(&caps, MemoryKind::GpuDmabuf), Err(ShimError::Unsupported(_))));
        let sent = agent(&[MemoryKind::DocaHost]);
        assert_eq!(from_agent(Some(sent.clone()), &MemoryBackend::Colocated, "t"), sent);
    }

    #[test]
    fn clients_see_the_shim_limits_too() {
        let cfg: ShimConfig = toml::from_str(
            "socket = \"/tmp/s\"\ncallers = []\n[agent]\ngrpc = \"unix:/tmp/a\"\n[limits]\nmax_batch_items = 100\nmax_region_bytes = 4096\n",
        )
        .expect("config");
        let agent = Capabilities { max_batch_items: 4096, ..agent(&[MemoryKind::Memfd]) };
        let caps = for_clients(agent, &MemoryBackend::Colocated, &cfg);
        assert_eq!((caps.max_batch_items, caps.max_region_bytes), (100, 4096));
        assert_eq!(caps.shim_memory, vec![MemoryKind::Memfd as i32, MemoryKind::GpuDmabuf as i32]);
    }
}
