//! The verbs RC transport: real one-sided RDMA WRITE/READ over reliable
//! connections set up with rdma_cm (Soft-RoCE or any RoCE/IB NIC).
//!
//! Owner: listens with rdma_cm on the device's IP and, per exposure,
//! registers a memory region over exactly the window: its rkey is the
//! capability (the NIC refuses anything outside the window or with another
//! key) and deregistering it when the request ends revokes it.
//!
//! Descriptor: the standard format with addr/size = the window, rkey = the
//! window's MR, LID = the owner's rdma_cm port, GID = the owner's IP
//! (IPv4-mapped). It is sent only to endpoints configured for `verbs-rc`,
//! marked `x-sluice-rdma-transport: verbs-rc`.

mod remote;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use sluice_rdma::{Access as MrAccess, Listener, MemoryRegion, ProtectionDomain, QueuePair, RdmaError};

use crate::capability::{Access, Grant};
use crate::token::Token;
use crate::transport::{
    Capabilities, Exposure, Transport, TransportError, TransportKind, MAX_OP_BYTES, MAX_WINDOW_BYTES,
};

pub use remote::VerbsRemote;

pub(crate) fn rdma_err(e: RdmaError) -> TransportError {
    match e {
        RdmaError::Completion { .. } => TransportError::Rejected(e.to_string()),
        other => TransportError::Unsupported(other.to_string()),
    }
}

/// The key and address a remote peer uses for a granted window.
pub(crate) struct Registered {
    pub addr: u64,
    pub rkey: u32,
    pub guard: Box<dyn std::any::Any + Send + Sync>,
}

/// Registers exactly the granted window in `pd`, for the granted direction
/// only: the MR's rkey is the capability, deregistration revokes it. Memory
/// that is not pinned here but reachable through another key (`nic_window`:
/// DOCA host memory on a DPU, a GPU dma-buf registered in `pd`) uses it
/// instead.
pub(crate) fn register_window(pd: &Arc<ProtectionDomain>, grant: &Grant) -> Result<Registered, TransportError> {
    if grant.len == 0 || grant.len > MAX_WINDOW_BYTES {
        return Err(TransportError::WindowTooLarge(grant.len));
    }
    grant.memory.check(grant.offset, grant.len).map_err(|e| TransportError::Rejected(e.to_string()))?;
    let Some(pinned) = grant.memory.pinned() else {
        let write = grant.access == Access::RemoteWrite;
        return match grant.memory.nic_window(pd, grant.offset, grant.len, write) {
            Some(Ok(w)) => Ok(Registered { addr: w.addr, rkey: w.rkey, guard: w.guard }),
            Some(Err(e)) => Err(TransportError::Unsupported(e.to_string())),
            None => Err(TransportError::Unsupported("this memory cannot be registered with the NIC".into())),
        };
    };
    let access = match grant.access {
        Access::RemoteWrite => MrAccess::REMOTE_WRITE,
        Access::RemoteRead => MrAccess::REMOTE_READ,
    };
    let mr = MemoryRegion::register_range(pd, pinned, grant.offset as usize, grant.len as usize, access)
        .map_err(rdma_err)?;
    Ok(Registered { addr: mr.addr(), rkey: mr.rkey(), guard: Box::new(mr) })
}

/// The owner side. Each owner has its own listener and so its own
/// protection domain: the agent runs one per tenant, so a tenant's rkeys
/// are meaningless on another tenant's connections.
pub struct VerbsOwner {
    listener: Arc<Listener>,
    ip: Ipv4Addr,
    /// Accepted connections, kept while remotes may use them.
    conns: Arc<Mutex<Vec<QueuePair>>>,
}

impl VerbsOwner {
    /// Listens on `ip` (the address of an RDMA device) and accepts remotes
    /// in the background (needs a tokio runtime).
    pub fn bind(ip: Ipv4Addr) -> Result<Arc<Self>, TransportError> {
        let listener = Arc::new(Listener::bind(SocketAddrV4::new(ip, 0)).map_err(rdma_err)?);
        let conns: Arc<Mutex<Vec<QueuePair>>> = Arc::default();
        let (l, c) = (listener.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok(qp) => c.lock().unwrap_or_else(|p| p.into_inner()).push(qp),
                    Err(e) => {
                        tracing::warn!(error = %e, "verbs accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok(Arc::new(Self { listener, ip, conns }))
    }

    pub fn port(&self) -> u16 {
        self.listener.port()
    }

    /// The protection domain this owner's windows are registered in (its
    /// device: what a dma-buf probe asks).
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        self.listener.pd()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Transport for VerbsOwner {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::VerbsRc,
            standard_token: false,
            max_op_bytes: MAX_OP_BYTES,
            max_window_bytes: MAX_WINDOW_BYTES,
        }
    }

    fn expose(&self, grant: Grant) -> Result<Exposure, TransportError> {
        let w = register_window(self.listener.pd(), &grant)?;
        let gid = self.ip.to_ipv6_mapped().octets();
        let token = Token::new(w.addr, grant.len as u32, w.rkey, self.port(), 0, Some(gid))
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        Ok(Exposure { token, guard: w.guard, landing: None })
    }
}
