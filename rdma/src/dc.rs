//! mlx5 Dynamically Connected transport (DC), the transport of the standard
//! `x-amz-rdma-token`: the memory owner exposes a DC target (DCT) and its
//! regions; remotes reach it through DC initiators (DCIs) with an address
//! handle built from the token (LID, GID) and the DCT number, plus a DC
//! access key both sides configure (peers default to 0xffeeddcc).
//!
//! Status: compiled and unit-tested here; creation fails with a clear
//! `Unsupported` error on devices without DC (Soft-RoCE, non-mlx5). Not yet
//! validated on mlx5 hardware (see the README).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_core_sys as sys;

use crate::cq::CompletionQueue;
use crate::error::{RdmaError, Result};
use crate::memory::ProtectionDomain;

/// The DC access key peers use unless configured otherwise.
pub const DEFAULT_DC_KEY: u64 = 0xffee_ddcc;

/// Where a DC target is: what the standard token carries besides the
/// memory window and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcAddress {
    /// The DCT number (24 bits).
    pub dct_number: u32,
    pub lid: u16,
    /// GID in network order (RoCE needs it; InfiniBand may use LID only).
    pub gid: Option<[u8; 16]>,
}

/// Address-handle attributes that reach `addr` from local `port` using
/// source GID index `sgid_index` (RoCE v2 over IPv4: usually 1).
pub fn ah_attr(addr: &DcAddress, port: u8, sgid_index: u8) -> sys::ibv_ah_attr {
    let mut ah = sys::ibv_ah_attr { dlid: addr.lid, port_num: port, sl: 0, ..Default::default() };
    if let Some(gid) = addr.gid {
        ah.is_global = 1;
        ah.grh.dgid.raw = gid;
        ah.grh.sgid_index = sgid_index;
        ah.grh.hop_limit = 64;
    }
    ah
}

/// A DC target: receives one-sided WRITE/READ from any DCI that knows its
/// number and the DC key.
pub struct DcTarget {
    qp: NonNull<sys::ibv_qp>,
    srq: NonNull<sys::ibv_srq>,
    _cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs are thread safe (rdma-core); the QP is only passed to verbs.
unsafe impl Send for DcTarget {}
// SAFETY: as above.
unsafe impl Sync for DcTarget {}

impl Drop for DcTarget {
    fn drop(&mut self) {
        // SAFETY: created by us; the QP goes before its SRQ, CQ and PD.
        unsafe {
            sys::ibv_destroy_qp(self.qp.as_ptr());
            sys::ibv_destroy_srq(self.srq.as_ptr());
        }
    }
}

pub(crate) fn unsupported(op: &'static str) -> RdmaError {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) | Some(libc::EINVAL) => RdmaError::Unsupported(format!(
            "this device has no mlx5 Dynamically Connected transport ({op}: {e}); use the verbs-rc or tcp transport"
        )),
        _ => RdmaError::Os { op, source: e },
    }
}

impl DcTarget {
    /// Creates a DCT on `port` (GID index `sgid_index`) accepting `dc_key`.
    pub fn create(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        dc_key: u64,
        port: u8,
        sgid_index: u8,
    ) -> Result<Self> {
        let ctx = pd.context().ptr.as_ptr();
        let mut srq_attr = sys::ibv_srq_init_attr {
            attr: sys::ibv_srq_attr { max_wr: 64, max_sge: 1, srq_limit: 0 },
            ..Default::default()
        };
        // SAFETY: pd is live; the attributes outlive the call.
        let srq = NonNull::new(unsafe { sys::ibv_create_srq(pd.ptr.as_ptr(), &mut srq_attr) })
            .ok_or_else(|| RdmaError::last_os("ibv_create_srq"))?;
        let mut attr = sys::ibv_qp_init_attr_ex {
            qp_type: sys::IBV_QPT_DRIVER,
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: srq.as_ptr(),
            comp_mask: sys::IBV_QP_INIT_ATTR_PD,
            pd: pd.ptr.as_ptr(),
            ..Default::default()
        };
        let mut mlx =
            sys::mlx5dv_qp_init_attr { comp_mask: u64::from(sys::MLX5DV_QP_INIT_ATTR_MASK_DC), ..Default::default() };
        mlx.dc_init_attr.dc_type = sys::MLX5DV_DCTYPE_DCT;
        mlx.dc_init_attr.__bindgen_anon_1.dct_access_key = dc_key;
        // SAFETY: ctx, pd, cq and srq are live; the attributes outlive the call.
        let qp = unsafe { sys::mlx5dv_create_qp(ctx, &mut attr, &mut mlx) };
        let Some(qp) = NonNull::new(qp) else {
            let e = unsupported("mlx5dv_create_qp(DCT)");
            // SAFETY: created above and unused.
            unsafe { sys::ibv_destroy_srq(srq.as_ptr()) };
            return Err(e);
        };
        let target = Self { qp, srq, _cq: cq.clone(), _pd: pd.clone() };
        let mut init = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ,
            ..Default::default()
        };
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS;
        // SAFETY: the QP is live; the attribute outlives the call.
        let r = unsafe { sys::ibv_modify_qp(target.qp.as_ptr(), &mut init, mask as i32) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_modify_qp(DCT INIT)", r));
        }
        let mut rtr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: sys::IBV_MTU_1024,
            min_rnr_timer: 12,
            ..Default::default()
        };
        rtr.ah_attr.port_num = port;
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.grh.sgid_index = sgid_index;
        rtr.ah_attr.grh.hop_limit = 64;
        let mask = sys::IBV_QP_STATE | sys::IBV_QP_AV | sys::IBV_QP_PATH_MTU | sys::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: as above.
        let r = unsafe { sys::ibv_modify_qp(target.qp.as_ptr(), &mut rtr, mask as i32) };
        if r != 0 {
            return Err(RdmaError::from_ret("ibv_modify_qp(DCT RTR)", r));
        }
        Ok(target)
    }

    /// The DCT number that goes in the token.
    pub fn number(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_handle_for_roce_and_ib() {
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
        let roce = ah_attr(&DcAddress { dct_number: 0x010203, lid: 0, gid: Some(gid) }, 1, 1);
        assert_eq!(roce.is_global, 1);
        // SAFETY: reading the raw view of a GID union we just wrote.
        assert_eq!(unsafe { roce.grh.dgid.raw }, gid);
        assert_eq!((roce.grh.sgid_index, roce.grh.hop_limit, roce.port_num), (1, 64, 1));
        let ib = ah_attr(&DcAddress { dct_number: 7, lid: 0x0102, gid: None }, 2, 0);
        assert_eq!((ib.is_global, ib.dlid, ib.port_num), (0, 0x0102, 2));
    }

    #[test]
    fn default_key_matches_peers() {
        assert_eq!(DEFAULT_DC_KEY, 0xffeeddcc);
    }
}
