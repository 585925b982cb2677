//! The initiator side of mlx5 DC: one DC initiator (DCI) reaches any DC
//! target given an address handle, the target's DCT number and the DC key,
//! all set per work request (`mlx5dv_wr_set_dc_addr`). This is what a
//! storage server uses to serve the standard `x-amz-rdma-token`.
//!
//! Status: compiled and unit-tested around the hardware; creation fails
//! with [`RdmaError::Unsupported`] on devices without DC (Soft-RoCE, non-mlx5,
//! checked in the Soft-RoCE lane). Not yet validated on mlx5 hardware.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_core_sys as sys;

use crate::cq::{CompletionQueue, PostResult};
use crate::dc::{ah_attr, unsupported, DcAddress};
use crate::error::{RdmaError, Result};
use crate::memory::{MemoryRegion, ProtectionDomain};

/// Work requests a DCI keeps outstanding.
const DCI_DEPTH: u32 = 128;
/// RDMA READs in flight per DCI.
const DCI_RD_ATOMIC: u8 = 4;

/// An address handle: how to reach one remote port.
pub struct AddressHandle {
    ptr: NonNull<sys::ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs are thread safe (rdma-core); the AH is only passed to verbs.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: created by us; work requests naming it hold an Arc to it
        // until they complete.
        unsafe { sys::ibv_destroy_ah(self.ptr.as_ptr()) };
    }
}

impl AddressHandle {
    /// An address handle to `addr` from local `port`, source GID `sgid_index`.
    pub fn create(pd: &Arc<ProtectionDomain>, addr: &DcAddress, port: u8, sgid_index: u8) -> Result<Arc<Self>> {
        let mut attr = ah_attr(addr, port, sgid_index);
        // SAFETY: pd is live; the attributes outlive the call.
        let ptr = NonNull::new(unsafe { sys::ibv_create_ah(pd.ptr.as_ptr(), &mut attr) })
            .ok_or_else(|| RdmaError::last_os("ibv_create_ah"))?;
        Ok(Arc::new(Self { ptr, _pd: pd.clone() }))
    }
}

/// A DC initiator with its own completion queue.
pub struct DcInitiator {
    qp: NonNull<sys::ibv_qp>,
    qpx: NonNull<sys::ibv_qp_ex>,
    mqpx: NonNull<sys::mlx5dv_qp_ex>,
    /// The ibv_wr_* builder is not reentrant: one post at a time.
    posting: std::sync::Mutex<()>,
    key: u64,
    port: u8,
    sgid_index: u8,
    cq: Arc<CompletionQueue>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs are thread safe (rdma-core); posting is serialised by
// `posting`, the rest only passes the pointers to verbs.
unsafe impl Send for DcInitiator {}
// SAFETY: as above.
unsafe impl Sync for DcInitiator {}

impl Drop for DcInitiator {
    fn drop(&mut self) {
        // SAFETY: created by us; destroyed before its CQ and PD (fields).
        unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// DCI transitions: INIT (port), RTR (path MTU, port in the AV), RTS
/// (retries, READ depth). Each entry is the attribute and its mask.
pub(crate) fn dci_transitions(port: u8, sgid_index: u8) -> [(sys::ibv_qp_attr, u32); 3] {
    let init = sys::ibv_qp_attr { qp_state: sys::IBV_QPS_INIT, pkey_index: 0, port_num: port, ..Default::default() };
    let mut rtr = sys::ibv_qp_attr { qp_state: sys::IBV_QPS_RTR, path_mtu: sys::IBV_MTU_1024, ..Default::default() };
    rtr.ah_attr.port_num = port;
    rtr.ah_attr.is_global = 1;
    rtr.ah_attr.grh.sgid_index = sgid_index;
    rtr.ah_attr.grh.hop_limit = 64;
    let rts = sys::ibv_qp_attr {
        qp_state: sys::IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: DCI_RD_ATOMIC,
        ..Default::default()
    };
    [
        (init, sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT),
        (rtr, sys::IBV_QP_STATE | sys::IBV_QP_PATH_MTU | sys::IBV_QP_AV),
        (
            rts,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
        ),
    ]
}

impl DcInitiator {
    /// Creates a DCI on `port` using DC key `key` for every target.
    pub fn create(pd: &Arc<ProtectionDomain>, port: u8, sgid_index: u8, key: u64) -> Result<Arc<Self>> {
        let ctx = pd.context();
        let cq = CompletionQueue::new(ctx, DCI_DEPTH as i32 * 2)?;
        let mut attr = sys::ibv_qp_init_attr_ex {
            qp_type: sys::IBV_QPT_DRIVER,
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            cap: sys::ibv_qp_cap { max_send_wr: DCI_DEPTH, max_send_sge: 1, ..Default::default() },
            comp_mask: sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            send_ops_flags: u64::from(sys::IBV_QP_EX_WITH_RDMA_WRITE | sys::IBV_QP_EX_WITH_RDMA_READ),
            pd: pd.ptr.as_ptr(),
            ..Default::default()
        };
        let mut mlx =
            sys::mlx5dv_qp_init_attr { comp_mask: u64::from(sys::MLX5DV_QP_INIT_ATTR_MASK_DC), ..Default::default() };
        mlx.dc_init_attr.dc_type = sys::MLX5DV_DCTYPE_DCI;
        // SAFETY: ctx, pd and cq are live; the attributes outlive the call.
        let qp = NonNull::new(unsafe { sys::mlx5dv_create_qp(ctx.ptr.as_ptr(), &mut attr, &mut mlx) })
            .ok_or_else(|| unsupported("mlx5dv_create_qp(DCI)"))?;
        // SAFETY: the QP was created with send_ops_flags, so it has an
        // extended view; the mlx5 view exists for mlx5dv-created QPs.
        let qpx = NonNull::new(unsafe { sys::ibv_qp_to_qp_ex(qp.as_ptr()) });
        // SAFETY: as above.
        let mqpx = qpx.and_then(|x| NonNull::new(unsafe { sys::mlx5dv_qp_ex_from_ibv_qp_ex(x.as_ptr()) }));
        let (Some(qpx), Some(mqpx)) = (qpx, mqpx) else {
            // SAFETY: created above, never posted to.
            unsafe { sys::ibv_destroy_qp(qp.as_ptr()) };
            return Err(RdmaError::Unsupported("the DCI has no extended work-request interface".into()));
        };
        let dci = Self { qp, qpx, mqpx, posting: Default::default(), key, port, sgid_index, cq, pd: pd.clone() };
        dci.bring_up()?;
        Ok(Arc::new(dci))
    }

    fn bring_up(&self) -> Result<()> {
        for (mut a, mask) in dci_transitions(self.port, self.sgid_index) {
            // SAFETY: the QP is live; the attribute outlives the call.
            let r = unsafe { sys::ibv_modify_qp(self.qp.as_ptr(), &mut a, mask as i32) };
            if r != 0 {
                return Err(RdmaError::from_ret("ibv_modify_qp(DCI)", r));
            }
        }
        Ok(())
    }

    /// An error completion (a bad rkey, an access outside a window) moves a
    /// DCI to the error state, which would fail every later request from
    /// every client: reset it and bring it back up. Requests in flight at
    /// that moment fail with a flush error and are retried by their owners.
    pub fn recover(&self) -> Result<()> {
        let _one = self.posting.lock().unwrap_or_else(|p| p.into_inner());
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both out-params outlive the call.
        let r = unsafe { sys::ibv_query_qp(self.qp.as_ptr(), &mut attr, sys::IBV_QP_STATE as i32, &mut init) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_query_qp(DCI)", r));
        }
        if attr.qp_state == sys::IBV_QPS_RTS {
            return Ok(());
        }
        let mut reset = sys::ibv_qp_attr { qp_state: sys::IBV_QPS_RESET, ..Default::default() };
        // SAFETY: as above.
        let r = unsafe { sys::ibv_modify_qp(self.qp.as_ptr(), &mut reset, sys::IBV_QP_STATE as i32) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_modify_qp(DCI RESET)", r));
        }
        self.bring_up()
    }

    /// The PD local buffers must be registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// RDMA WRITE to a DC target.
    pub async fn write(
        &self,
        to: &DcPeer,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> PostResult {
        self.cq
            .run(local, local_off, len, |id, mr| self.post_now(true, id, to, mr, local_off, len, remote_addr, rkey))
            .await
    }

    /// RDMA READ from a DC target.
    pub async fn read(
        &self,
        from: &DcPeer,
        local: Arc<MemoryRegion>,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> PostResult {
        self.cq
            .run(local, local_off, len, |id, mr| self.post_now(false, id, from, mr, local_off, len, remote_addr, rkey))
            .await
    }

    #[allow(clippy::too_many_arguments)]
    fn post_now(
        &self,
        write: bool,
        wr_id: u64,
        to: &DcPeer,
        local: &MemoryRegion,
        local_off: u64,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let _one = self.posting.lock().unwrap_or_else(|p| p.into_inner());
        let (qpx, mqpx) = (self.qpx.as_ptr(), self.mqpx.as_ptr());
        // SAFETY: the QP is live and in RTS; the builder calls run between
        // start and complete under `posting`; the AH and local region are
        // kept alive by the caller until the completion arrives.
        let r = unsafe {
            sys::ibv_wr_start(qpx);
            (*qpx).wr_id = wr_id;
            (*qpx).wr_flags = sys::IBV_SEND_SIGNALED;
            if write {
                sys::ibv_wr_rdma_write(qpx, rkey, remote_addr);
            } else {
                sys::ibv_wr_rdma_read(qpx, rkey, remote_addr);
            }
            sys::mlx5dv_wr_set_dc_addr(mqpx, to.ah.ptr.as_ptr(), to.dct_number, self.key);
            sys::ibv_wr_set_sge(qpx, local.lkey(), local.addr() + local_off, len);
            sys::ibv_wr_complete(qpx)
        };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_wr_complete(DCI)", r));
        }
        Ok(())
    }
}

/// A DC target as a DCI addresses it.
#[derive(Clone)]
pub struct DcPeer {
    pub ah: Arc<AddressHandle>,
    pub dct_number: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dci_state_machine_attributes() {
        let [(init, m0), (rtr, m1), (rts, m2)] = dci_transitions(1, 3);
        assert_eq!((init.qp_state, init.port_num), (sys::IBV_QPS_INIT, 1));
        // A DCI carries no access flags and no destination QP: the target
        // is named per work request.
        assert_eq!(m0 & (sys::IBV_QP_ACCESS_FLAGS | sys::IBV_QP_DEST_QPN), 0);
        assert_eq!((rtr.qp_state, rtr.ah_attr.port_num, rtr.ah_attr.grh.sgid_index), (sys::IBV_QPS_RTR, 1, 3));
        assert_eq!(m1 & sys::IBV_QP_DEST_QPN, 0);
        assert_ne!(m1 & sys::IBV_QP_AV, 0);
        assert_eq!((rts.qp_state, rts.retry_cnt, rts.max_rd_atomic), (sys::IBV_QPS_RTS, 7, DCI_RD_ATOMIC));
        assert_ne!(m2 & sys::IBV_QP_MAX_QP_RD_ATOMIC, 0);
    }
}
