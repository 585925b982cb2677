//! GPU memory for a co-located agent on a host with an RDMA NIC.
//!
//! The shim hands the client's CUDA dma-buf over the memory socket (a `D`
//! frame, [`sluice_shm::DmabufHandOver`]); the agent checks it again (a
//! dma-buf, the range inside it, the CUDA address and the offset agreeing
//! within a page) and, at RegisterRegion, registers the whole range once in
//! a protection domain of its own, so a NIC that cannot map this buffer
//! refuses the region then rather than its first transfer. Each RDMA part
//! then registers exactly its window in the tenant's PD
//! (`ibv_reg_dmabuf_mr`, [`DmabufRegion::nic_window`]): the storage side's
//! one-sided WRITE lands in HBM, and deregistering the window when the
//! request ends revokes it, as for host memory.
//!
//! The agent has no CPU mapping of the buffer, so only direct one-sided
//! transfers reach it ([`HostRegion::nic_only`]); the S3 layer refuses a
//! request that would need anything else before it starts
//! (`ObjectStore::check_reach`).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use sluice_dataplane::{MemError, NicWindow};
use sluice_rdma::{Access, MemoryRegion, ProtectionDomain, RdmaError};
use sluice_shm::DmabufHandOver;

use super::HostRegion;

/// Why the CPU cannot touch such a region: part of every refusal.
pub const NO_CPU_VIEW: &str = "GPU memory on a co-located agent is reached only by its RDMA NIC (a dma-buf \
                               memory region; the agent has no CPU mapping of it)";

/// A verbs device that registers dma-bufs, and a protection domain of its
/// own for the trial registration of each region (no connection uses this
/// PD, so a key made in it reaches nothing).
pub struct DmabufDevice {
    pd: Arc<ProtectionDomain>,
    name: String,
}

impl DmabufDevice {
    /// Asks the device behind `pd` (a running verbs transport's) whether it
    /// registers dma-bufs ([`ProtectionDomain::probe_dmabuf`]: it cannot tell
    /// whether a given GPU's buffers map; each region's trial registration
    /// does). `Err`: why not, for the log and the capability exchange.
    pub fn probe(pd: &Arc<ProtectionDomain>) -> Result<Arc<Self>, String> {
        let ctx = pd.context();
        let name = ctx.device_name();
        pd.probe_dmabuf().map_err(|e| e.to_string())?;
        let own =
            ProtectionDomain::new(ctx).map_err(|e| format!("{name}: a protection domain for GPU regions: {e}"))?;
        Ok(Arc::new(Self { pd: own, name }))
    }

    /// The verbs device's name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Whether a co-located agent takes GPU regions.
#[derive(Clone)]
pub enum GpuPath {
    /// As dma-bufs registered with this device.
    Available(Arc<DmabufDevice>),
    /// Why not: no verbs transport runs, or its device cannot register
    /// dma-bufs.
    Unavailable(String),
}

impl std::fmt::Debug for GpuPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Available(d) => write!(f, "Available({})", d.name),
            Self::Unavailable(why) => write!(f, "Unavailable({why})"),
        }
    }
}

/// A dma-buf handed over on the memory socket, waiting for RegisterRegion.
pub struct Deposit {
    fd: OwnedFd,
    hand: DmabufHandOver,
    exporter: String,
}

impl Deposit {
    /// Checks what the shim sent (the shim checked too, but is not trusted
    /// to have): a dma-buf holding the range, at a CUDA address that agrees
    /// with the range's offset within a page (drivers map it by pages).
    /// The descriptor is closed when this fails.
    pub fn check(fd: OwnedFd, hand: DmabufHandOver) -> Result<Self, MemError> {
        let info = sluice_shm::check_dmabuf(fd.as_fd(), hand.offset, hand.len)
            .map_err(|e| MemError::BadExport(e.to_string()))?;
        hand.check_address().map_err(|e| MemError::BadExport(e.to_string()))?;
        Ok(Self { fd, hand, exporter: info.exporter })
    }

    /// The region of `len` bytes (what RegisterRegion says; it must be what
    /// was handed over), once `device` has registered the whole range.
    pub fn import(self, len: u64, device: &DmabufDevice) -> Result<Arc<dyn HostRegion>, MemError> {
        if len != self.hand.len {
            return Err(MemError::BadExport(format!(
                "the dma-buf was handed over for {} bytes, the registration says {len}",
                self.hand.len
            )));
        }
        let bytes = usize::try_from(len).map_err(|_| MemError::BadExport(format!("{len} bytes")))?;
        let fd = Arc::new(self.fd);
        let trial = MemoryRegion::register_dmabuf(
            &device.pd,
            &fd,
            self.hand.offset,
            bytes,
            self.hand.gpu_address,
            Access::REMOTE_ALL,
        )
        .map_err(|e| rdma_mem_err(e, &device.name, &self.exporter))?;
        drop(trial);
        tracing::debug!(device = %device.name, exporter = %self.exporter, len, "GPU region registered as a dma-buf");
        Ok(Arc::new(DmabufRegion {
            fd,
            offset: self.hand.offset,
            len,
            gpu_address: self.hand.gpu_address,
            exporter: self.exporter,
        }))
    }
}

/// What a registration failure tells the client.
fn rdma_mem_err(e: RdmaError, device: &str, exporter: &str) -> MemError {
    match e {
        RdmaError::Unsupported(m) => MemError::Unsupported(format!("{m} (a dma-buf from {exporter})")),
        RdmaError::Invalid(m) => MemError::BadExport(m),
        RdmaError::Os { source, .. } if source.kind() == std::io::ErrorKind::OutOfMemory => {
            MemError::Exhausted(format!("registering a dma-buf from {exporter} with {device}: {source}"))
        }
        // EFAULT, EPERM, ...: the NIC cannot map this exporter's memory
        // (no peer-to-peer path between the GPU and the NIC, a driver that
        // does not allow it); the client can do nothing about it here.
        other => MemError::Unsupported(format!("{device} cannot map this dma-buf from {exporter}: {other}")),
    }
}

/// GPU memory registered as a dma-buf: reached only through the NIC.
pub struct DmabufRegion {
    fd: Arc<OwnedFd>,
    /// Where the region starts in the dma-buf.
    offset: u64,
    len: u64,
    /// The CUDA address of the region's first byte: the IOVA its windows
    /// are registered at, so a storage node addresses HBM as the client does.
    gpu_address: u64,
    exporter: String,
}

impl std::fmt::Debug for DmabufRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmabufRegion").field("len", &self.len).field("exporter", &self.exporter).finish()
    }
}

impl HostRegion for DmabufRegion {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError> {
        self.check(offset, data.len() as u64)?;
        Err(MemError::Unsupported(NO_CPU_VIEW.into()))
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, out.len() as u64)?;
        Err(MemError::Unsupported(NO_CPU_VIEW.into()))
    }

    fn nic_only(&self) -> Option<&str> {
        Some(NO_CPU_VIEW)
    }

    /// Registers exactly `[offset, offset+len)` in `pd` (the tenant's), for
    /// the one direction asked: the key is the capability, and dropping
    /// the guard deregisters it.
    fn nic_window(
        &self,
        pd: &Arc<ProtectionDomain>,
        offset: u64,
        len: u64,
        remote_write: bool,
    ) -> Option<Result<NicWindow, MemError>> {
        let make = || -> Result<NicWindow, MemError> {
            self.check(offset, len)?;
            let bytes =
                usize::try_from(len).map_err(|_| MemError::OutOfBounds { offset, len, region_len: self.len })?;
            let access = if remote_write { Access::REMOTE_WRITE } else { Access::REMOTE_READ };
            let iova = self.gpu_address + offset;
            let mr = MemoryRegion::register_dmabuf(pd, &self.fd, self.offset + offset, bytes, iova, access)
                .map_err(|e| rdma_mem_err(e, &pd.context().device_name(), &self.exporter))?;
            Ok(NicWindow { addr: mr.addr(), rkey: mr.rkey(), guard: Box::new(mr) })
        };
        Some(make())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hand(offset: u64, len: u64, gpu_address: u64) -> DmabufHandOver {
        DmabufHandOver { offset, len, gpu_address }
    }

    /// A memfd or a pipe sent as a dma-buf is refused (and closed).
    #[test]
    fn what_is_not_a_dmabuf_is_refused() {
        let memfd = sluice_shm::create_memfd("t", 1 << 20).expect("memfd");
        let (r, _w) = std::io::pipe().expect("pipe");
        for (what, fd) in [("memfd", memfd), ("pipe", OwnedFd::from(r))] {
            match Deposit::check(fd, hand(0, 4096, 0x7f00_0000_0000)) {
                Err(MemError::BadExport(m)) => assert!(m.contains("not a dma-buf"), "{what}: {m}"),
                Err(e) => panic!("{what}: {e}"),
                Ok(_) => panic!("{what} taken as a dma-buf"),
            }
        }
    }

    /// A region of this kind takes no CPU access and says why; its
    /// windows are bounds-checked before the NIC is asked.
    #[test]
    fn the_cpu_cannot_touch_a_gpu_region() {
        let fd = Arc::new(sluice_shm::create_memfd("t", 4096).expect("memfd"));
        let r = DmabufRegion { fd, offset: 0, len: 4096, gpu_address: 0x7f00_0000_0000, exporter: "test".into() };
        assert_eq!(r.nic_only(), Some(NO_CPU_VIEW));
        match r.write_at(0, b"x") {
            Err(MemError::Unsupported(m)) => assert!(m.contains("only by its RDMA NIC"), "{m}"),
            other => panic!("{other:?}"),
        }
        let mut out = [0u8; 8];
        assert!(matches!(r.read_at(0, &mut out), Err(MemError::Unsupported(_))));
        assert!(matches!(r.write_at(4095, b"xy"), Err(MemError::OutOfBounds { .. })), "bounds first");
    }

    #[test]
    fn registration_failures_say_what_to_expect() {
        let unsupported = RdmaError::Unsupported(format!("{}: rxe0: EOPNOTSUPP", sluice_rdma::DMABUF_UNSUPPORTED));
        match rdma_mem_err(unsupported, "rxe0", "nv_dmabuf") {
            MemError::Unsupported(m) => {
                assert!(m.contains("cannot register dma-buf (GPU) memory") && m.contains("nv_dmabuf"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let enomem = RdmaError::Os { op: "ibv_reg_dmabuf_mr", source: std::io::Error::from_raw_os_error(12) };
        assert!(matches!(rdma_mem_err(enomem, "mlx5_0", "nv_dmabuf"), MemError::Exhausted(_)));
        let efault = RdmaError::Os { op: "ibv_reg_dmabuf_mr", source: std::io::Error::from_raw_os_error(14) };
        match rdma_mem_err(efault, "mlx5_0", "nv_dmabuf") {
            MemError::Unsupported(m) => assert!(m.contains("mlx5_0 cannot map this dma-buf from nv_dmabuf"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
