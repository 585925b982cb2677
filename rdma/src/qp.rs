//! Reliable-connection queue pairs set up with rdma_cm (synchronous mode,
//! run on blocking threads), and one-sided RDMA WRITE / READ on them.

use std::net::SocketAddrV4;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_core_sys as sys;

use crate::cq::{CompletionQueue, PostResult};
use crate::error::{RdmaError, Result};
use crate::memory::{Context, MemoryRegion, ProtectionDomain};

/// Outstanding work requests per queue pair.
const SEND_DEPTH: u32 = 128;
/// RDMA READs in flight each way.
const RD_ATOMIC: u8 = 4;

/// An rdma_cm id; destroyed when the last holder goes.
struct CmId(NonNull<sys::rdma_cm_id>);
// SAFETY: rdma_cm ids may be used from any thread (rdma-core's librdmacm is
// thread safe); all access goes through librdmacm calls.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}
impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_id / rdma_get_request; its QP (if
        // any) was destroyed by the QueuePair first.
        unsafe { sys::rdma_destroy_id(self.0.as_ptr()) };
    }
}

/// Moves raw pointers into blocking tasks.
struct SendPtr<T>(*mut T);
// SAFETY: only used to hand rdma_cm ids to a blocking thread that calls
// thread-safe librdmacm functions on them.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: shared references to it are never dereferenced concurrently; the
// pointer is only read to pass to librdmacm on the blocking thread.
unsafe impl<T> Sync for SendPtr<T> {}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*addr.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| RdmaError::Invalid(format!("blocking task: {e}")))?
}

fn new_id() -> Result<CmId> {
    let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
    // SAFETY: a NULL channel puts the id in synchronous mode; `id` is written.
    let r = unsafe { sys::rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), sys::RDMA_PS_TCP) };
    if r != 0 {
        return Err(RdmaError::last_os("rdma_create_id"));
    }
    NonNull::new(id).map(CmId).ok_or_else(|| RdmaError::Invalid("rdma_create_id gave NULL".into()))
}

fn conn_param() -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        responder_resources: RD_ATOMIC,
        initiator_depth: RD_ATOMIC,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

/// Runs rdma_connect or rdma_accept (same signature) on a blocking thread:
/// on a synchronous id they block until the connection is established.
async fn establish(
    id: &CmId,
    op: &'static str,
    call: unsafe extern "C" fn(*mut sys::rdma_cm_id, *mut sys::rdma_conn_param) -> std::os::raw::c_int,
) -> Result<()> {
    let raw = SendPtr(id.0.as_ptr());
    blocking(move || {
        let raw = raw;
        let mut p = conn_param();
        // SAFETY: the id is live (the caller holds it across the await) and
        // has a QP; `p` outlives the call.
        if unsafe { call(raw.0, &mut p) } != 0 {
            return Err(RdmaError::last_os(op));
        }
        Ok(())
    })
    .await
}

/// A connected RC queue pair.
pub struct QueuePair {
    id: Arc<CmId>,
    cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the id is live (we hold it); its QP is destroyed before the
        // CQ and PD (fields) are released. No rdma_disconnect here: on a
        // synchronous id it waits for the peer's DISCONNECTED event, which
        // never comes if the peer went first; destroying the id tears the
        // connection down anyway.
        unsafe { sys::rdma_destroy_qp(self.id.0.as_ptr()) };
    }
}

fn create_qp(id: &CmId, pd: &ProtectionDomain, cq: &CompletionQueue) -> Result<()> {
    let mut attr = sys::ibv_qp_init_attr {
        send_cq: cq.as_ptr(),
        recv_cq: cq.as_ptr(),
        cap: sys::ibv_qp_cap {
            max_send_wr: SEND_DEPTH,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: sys::IBV_QPT_RC,
        sq_sig_all: 0,
        ..Default::default()
    };
    // SAFETY: id, pd and cq are live and belong to the same device context.
    let r = unsafe { sys::rdma_create_qp(id.0.as_ptr(), pd.ptr.as_ptr(), &mut attr) };
    if r != 0 {
        return Err(RdmaError::last_os("rdma_create_qp"));
    }
    Ok(())
}

impl QueuePair {
    /// Connects to a listener at `addr` (active side). The queue pair gets
    /// its own PD on the device rdma_cm picked; register local memory there.
    pub async fn connect(addr: SocketAddrV4) -> Result<Self> {
        let id = Arc::new(new_id()?);
        let raw = SendPtr(id.0.as_ptr());
        blocking(move || {
            let raw = raw;
            let mut dst = sockaddr(addr);
            // SAFETY: synchronous id; `dst` outlives the call.
            if unsafe {
                sys::rdma_resolve_addr(raw.0, std::ptr::null_mut(), (&mut dst as *mut libc::sockaddr_in).cast(), 2000)
            } != 0
            {
                return Err(RdmaError::last_os("rdma_resolve_addr"));
            }
            // SAFETY: as above.
            if unsafe { sys::rdma_resolve_route(raw.0, 2000) } != 0 {
                return Err(RdmaError::last_os("rdma_resolve_route"));
            }
            Ok(())
        })
        .await?;
        // SAFETY: after route resolution the id's verbs context is set.
        let verbs = unsafe { (*id.0.as_ptr()).verbs };
        let ctx = Context::borrowed(verbs, id.clone())?;
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = CompletionQueue::new(&ctx, SEND_DEPTH as i32 * 2)?;
        create_qp(&id, &pd, &cq)?;
        let qp = Self { id, cq, pd };
        establish(&qp.id, "rdma_connect", sys::rdma_connect).await?;
        Ok(qp)
    }

    /// Moves the queue pair to the error state: every outstanding request
    /// completes promptly with a flush error, and later posts fail. Used to
    /// tear a connection down under load without waiting on the peer.
    pub fn close(&self) -> Result<()> {
        let mut attr = sys::ibv_qp_attr { qp_state: sys::IBV_QPS_ERR, ..Default::default() };
        // SAFETY: the id's QP is live; only the state attribute is applied.
        let r = unsafe { sys::ibv_modify_qp((*self.id.0.as_ptr()).qp, &mut attr, sys::IBV_QP_STATE as i32) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_modify_qp(ERR)", r));
        }
        Ok(())
    }

    /// The PD local memory must be registered in to be posted here.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// RDMA WRITE of `len` bytes at `local_off` of `local` to `remote_addr`
    /// (rkey `rkey`). Gives the region back, with the error if it failed.
    pub async fn write(
        &self,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> PostResult {
        self.post(sys::IBV_WR_RDMA_WRITE, local, local_off, len, remote_addr, rkey).await
    }

    /// RDMA READ of `len` bytes from `remote_addr` into `local` at `local_off`.
    pub async fn read(
        &self,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> PostResult {
        self.post(sys::IBV_WR_RDMA_READ, local, local_off, len, remote_addr, rkey).await
    }

    async fn post(
        &self,
        opcode: sys::ibv_wr_opcode,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> PostResult {
        self.cq
            .run(local, local_off, len, |wr_id, mr| self.post_now(wr_id, opcode, mr, local_off, len, remote_addr, rkey))
            .await
    }
}

impl QueuePair {
    #[allow(clippy::too_many_arguments)]
    fn post_now(
        &self,
        wr_id: u64,
        opcode: sys::ibv_wr_opcode,
        local: &MemoryRegion,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let mut sge = sys::ibv_sge { addr: local.addr() + local_off, length: len, lkey: local.lkey() };
        let mut wr = sys::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode,
            send_flags: sys::IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the id's QP is live; `wr` and `sge` outlive the call (the
        // provider copies them); the caller keeps the local region alive
        // until the completion arrives.
        let r = unsafe { sys::ibv_post_send((*self.id.0.as_ptr()).qp, &mut wr, &mut bad) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_post_send", r));
        }
        Ok(())
    }
}

/// A passive rdma_cm endpoint: the memory owner listens, remotes connect.
pub struct Listener {
    id: Arc<CmId>,
    pd: Arc<ProtectionDomain>,
    ctx: Arc<Context>,
}

impl Listener {
    /// Listens on `addr` (a specific local IP of an RDMA device; port 0
    /// picks one). Memory to expose is registered in [`Listener::pd`].
    pub fn bind(addr: SocketAddrV4) -> Result<Self> {
        let id = Arc::new(new_id()?);
        let mut a = sockaddr(addr);
        // SAFETY: id is live; `a` outlives the call.
        if unsafe { sys::rdma_bind_addr(id.0.as_ptr(), (&mut a as *mut libc::sockaddr_in).cast()) } != 0 {
            return Err(RdmaError::last_os("rdma_bind_addr"));
        }
        // SAFETY: id is bound.
        if unsafe { sys::rdma_listen(id.0.as_ptr(), 64) } != 0 {
            return Err(RdmaError::last_os("rdma_listen"));
        }
        // SAFETY: binding to a device address set the id's context.
        let verbs = unsafe { (*id.0.as_ptr()).verbs };
        let ctx = Context::borrowed(verbs, id.clone())?;
        let pd = ProtectionDomain::new(&ctx)?;
        Ok(Self { id, pd, ctx })
    }

    pub fn port(&self) -> u16 {
        // SAFETY: id is live and bound.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.id.0.as_ptr()) })
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Accepts one connection. The returned queue pair must be kept alive
    /// for as long as the remote may access this side's memory.
    pub async fn accept(&self) -> Result<QueuePair> {
        let raw = SendPtr(self.id.0.as_ptr());
        let conn = blocking(move || {
            let raw = raw;
            let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
            // SAFETY: synchronous listening id; blocks for a request.
            if unsafe { sys::rdma_get_request(raw.0, &mut id) } != 0 {
                return Err(RdmaError::last_os("rdma_get_request"));
            }
            Ok(SendPtr(id))
        })
        .await?;
        let id = Arc::new(NonNull::new(conn.0).map(CmId).ok_or_else(|| RdmaError::Invalid("NULL request id".into()))?);
        let cq = CompletionQueue::new(&self.ctx, 16)?;
        create_qp(&id, &self.pd, &cq)?;
        let qp = QueuePair { id, cq, pd: self.pd.clone() };
        establish(&qp.id, "rdma_accept", sys::rdma_accept).await?;
        Ok(qp)
    }
}
