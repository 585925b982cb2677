//! How the shim makes a registered region reachable to the agent.
//!
//! * co-located: the region's memfd goes over the agent's memory socket and
//!   the agent maps it (agent and shim on the same host). GPU memory (a
//!   CUDA dma-buf) goes the same way, and the agent registers it with its
//!   RDMA NIC when that can (the capability exchange says so) — the
//!   storage side then WRITEs straight into HBM;
//! * DOCA (`--features doca`, agent on this host's BlueField): the shim maps
//!   the region with `doca_mmap_export_pci` and sends the descriptor, in a
//!   Sluice envelope, on RegisterRegion. GPU memory arrives as a CUDA dma-buf
//!   fd and is exported the same way.

use std::any::Any;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use sluice_proto::agent::register_region_request::Export;
use sluice_proto::common::MemoryKind;

use crate::agent_link::AgentLink;
use crate::config::{MemoryBackendKind, ShimConfig};
use crate::error::{ShimError, StartupError};

/// What the shim keeps of a registered region to export it again (after an
/// agent restart, each registration needs a fresh export).
pub enum RegionSource {
    /// Co-located: the memfd, handed over again for a new ticket.
    Memfd(OwnedFd),
    /// Co-located GPU memory: the client's dma-buf and where the region
    /// lies in it, handed over again for a new ticket.
    Dmabuf { fd: OwnedFd, region: sluice_shm::DmabufHandOver },
    /// DOCA: the export descriptor (its mapping lives in the guard).
    Blob(Vec<u8>),
}

/// What keeps an export valid while the region is registered (the DOCA
/// mmap); dropped after the agent released the region.
pub type ExportGuard = Option<Arc<dyn Any + Send + Sync>>;

/// The configured backend.
pub enum MemoryBackend {
    Colocated,
    #[cfg(feature = "doca")]
    Doca(doca::Exporter),
}

impl MemoryBackend {
    /// Opens the backend named in the config; DOCA problems (library,
    /// device) are startup errors naming what is missing.
    pub fn open(cfg: &ShimConfig) -> Result<Self, StartupError> {
        match cfg.memory_backend {
            MemoryBackendKind::Colocated => Ok(Self::Colocated),
            MemoryBackendKind::Doca => match &cfg.doca {
                None => Err(StartupError::DocaConfig),
                Some(d) => Self::open_doca(d).map_err(|e| StartupError::Memory(Box::new(e))),
            },
        }
    }

    #[cfg(feature = "doca")]
    fn open_doca(d: &crate::config::ShimDocaConfig) -> Result<Self, ShimError> {
        Ok(Self::Doca(doca::Exporter::open(&d.device)?))
    }

    #[cfg(not(feature = "doca"))]
    fn open_doca(_doca: &crate::config::ShimDocaConfig) -> Result<Self, ShimError> {
        Err(ShimError::Unsupported(
            "memory_backend = \"doca\", but this sluice-shim was built without the `doca` feature \
             (cargo build -p sluice-shim --features doca; the Debian package has it)"
                .into(),
        ))
    }

    /// Region memory this backend registers (the capability exchange).
    /// Co-located GPU memory needs an agent that says it reaches it.
    pub fn kinds(&self) -> Vec<MemoryKind> {
        match self {
            Self::Colocated => vec![MemoryKind::Memfd, MemoryKind::GpuDmabuf],
            #[cfg(feature = "doca")]
            Self::Doca(_) => vec![MemoryKind::DocaHost, MemoryKind::GpuDmabuf],
        }
    }

    /// What an agent that sent no capabilities (older than the exchange)
    /// is taken to reach: GPU memory on a co-located agent came later, so
    /// such an agent reaches memfds only.
    pub fn kinds_older_agents_reach(&self) -> Vec<MemoryKind> {
        match self {
            Self::Colocated => vec![MemoryKind::Memfd],
            #[cfg(feature = "doca")]
            Self::Doca(_) => self.kinds(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Colocated => "colocated",
            #[cfg(feature = "doca")]
            Self::Doca(_) => "doca",
        }
    }

    /// [`Self::prepare_shared`], on a blocking thread where it pins the
    /// memory (DOCA faults in and pins up to `max_region_bytes`): on the
    /// runtime's thread that would stall every other client's requests.
    pub async fn prepare_shared_off_runtime(
        &self,
        fd: OwnedFd,
        len: u64,
    ) -> Result<(RegionSource, ExportGuard), ShimError> {
        self.pinning("pinning a region", move |me| me.prepare_shared(fd, len)).await
    }

    /// Runs `f`, which may pin memory, on a blocking thread where this
    /// backend pins (DOCA); co-located, here (nothing is pinned).
    async fn pinning<T: Send + 'static>(
        &self,
        #[cfg_attr(not(feature = "doca"), allow(unused_variables))] what: &'static str,
        f: impl FnOnce(&Self) -> Result<T, ShimError> + Send + 'static,
    ) -> Result<T, ShimError> {
        match self {
            Self::Colocated => f(self),
            #[cfg(feature = "doca")]
            Self::Doca(x) => {
                let me = Self::Doca(x.clone());
                tokio::task::spawn_blocking(move || f(&me))
                    .await
                    .map_err(|e| ShimError::Backend(format!("{what}: {e}")))?
            }
        }
    }

    /// What the shim keeps for a shared-memory region backed by `fd` (a
    /// sealed memfd of at least `len` bytes), to export it now and again
    /// after an agent restart.
    #[cfg_attr(not(feature = "doca"), allow(unused_variables))]
    pub fn prepare_shared(&self, fd: OwnedFd, len: u64) -> Result<(RegionSource, ExportGuard), ShimError> {
        match self {
            Self::Colocated => Ok((RegionSource::Memfd(fd), None)),
            #[cfg(feature = "doca")]
            Self::Doca(x) => x.export_shared(&fd, len),
        }
    }

    /// The export to send on RegisterRegion: co-located, the memfd is
    /// handed over for a fresh one-time ticket; DOCA, the same descriptor.
    pub async fn export_again(&self, link: &AgentLink, source: &RegionSource) -> Result<Export, ShimError> {
        match source {
            RegionSource::Memfd(fd) => Ok(Export::ColocatedTicket(link.hand_over(fd.as_fd()).await?)),
            RegionSource::Dmabuf { fd, region } => {
                Ok(Export::ColocatedTicket(link.hand_over_dmabuf(fd.as_fd(), *region).await?))
            }
            RegionSource::Blob(b) => Ok(Export::DocaExport(b.clone())),
        }
    }

    /// What the shim keeps for GPU memory: `at.len` bytes at `at.offset` of
    /// a dma-buf, CUDA address `at.gpu_address`. DOCA's export, which pins
    /// the GPU memory, runs on a blocking thread, as
    /// [`Self::prepare_shared_off_runtime`].
    pub async fn prepare_dmabuf(
        &self,
        fd: OwnedFd,
        at: sluice_shm::DmabufHandOver,
    ) -> Result<(RegionSource, ExportGuard), ShimError> {
        self.pinning("pinning GPU memory", move |me| me.dmabuf_source(fd, at)).await
    }

    fn dmabuf_source(
        &self,
        fd: OwnedFd,
        at: sluice_shm::DmabufHandOver,
    ) -> Result<(RegionSource, ExportGuard), ShimError> {
        let sluice_shm::DmabufHandOver { offset, len, gpu_address } = at;
        if gpu_address == 0 {
            return Err(ShimError::BadRequest("a GPU region needs its CUDA address (gpu_address)".into()));
        }
        check_dmabuf(&fd, offset, len)?;
        let region = at;
        region.check_address().map_err(|e| ShimError::BadRequest(e.to_string()))?;
        match self {
            // The agent checks the dma-buf again and registers it with its
            // NIC; whether it can was settled by the capability exchange.
            Self::Colocated => Ok((RegionSource::Dmabuf { fd, region }, None)),
            #[cfg(feature = "doca")]
            Self::Doca(x) => x.export_dmabuf(fd, offset, len, gpu_address),
        }
    }
}

/// Refuses descriptors that are not dma-bufs, and ranges outside the buffer
/// ([`sluice_shm::check_dmabuf`]: the `exp_name:` line of its fdinfo, its
/// `lseek(SEEK_END)` size).
pub fn check_dmabuf(fd: &OwnedFd, offset: u64, len: u64) -> Result<(), ShimError> {
    sluice_shm::check_dmabuf(fd.as_fd(), offset, len).map(|_| ()).map_err(|e| ShimError::BadRequest(e.to_string()))
}

#[cfg(feature = "doca")]
mod doca {
    use std::os::fd::OwnedFd;
    use std::sync::Arc;

    use sluice_doca::{Access, Device, ExportEnvelope, MemoryKind, Mmap};

    use super::{ExportGuard, RegionSource};
    use crate::error::ShimError;

    /// The DPU reads and writes regions over PCIe (staged copies), and
    /// storage nodes RDMA-WRITE into them through the DPU's re-export
    /// (direct placement; whether DOCA needs the RDMA bit on the exporter's
    /// side for that is unverified on hardware, so it is set).
    const EXPORT_ACCESS: Access = Access(Access::PCI_READ_WRITE.0 | Access::RDMA_WRITE.0);

    fn backend(e: sluice_doca::Error) -> ShimError {
        ShimError::Backend(e.to_string())
    }

    /// Exports regions through the host's BlueField PCI function.
    #[derive(Clone)]
    pub struct Exporter {
        dev: Arc<Device>,
        pci: String,
    }

    impl Exporter {
        pub fn open(selector: &str) -> Result<Self, ShimError> {
            let lib = sluice_doca::load().map_err(|e| ShimError::Unsupported(e.to_string()))?;
            let dev = Device::open(&lib, selector).map_err(|e| ShimError::Unsupported(e.to_string()))?;
            if !dev.can_export_pci().map_err(backend)? {
                return Err(ShimError::Unsupported(format!(
                    "DOCA device {:?} cannot export host memory over PCIe (doca_mmap_cap_is_export_pci_supported)",
                    dev.info()
                )));
            }
            let pci = dev.info().pci.clone();
            tracing::info!(device = ?dev.info(), "DOCA memory export ready");
            Ok(Self { dev, pci })
        }

        fn envelope(
            &self,
            kind: MemoryKind,
            mmap: &Arc<Mmap>,
            len: u64,
        ) -> Result<(RegionSource, ExportGuard), ShimError> {
            let descriptor = mmap.export_pci().map_err(backend)?;
            let env = ExportEnvelope { kind, len, host_addr: mmap.addr() as u64, pci: self.pci.clone(), descriptor };
            let guard: Arc<dyn std::any::Any + Send + Sync> = mmap.clone();
            Ok((RegionSource::Blob(env.encode().map_err(backend)?), Some(guard)))
        }

        pub fn export_shared(&self, fd: &OwnedFd, len: u64) -> Result<(RegionSource, ExportGuard), ShimError> {
            let dup = fd.try_clone().map_err(|e| ShimError::BadRequest(format!("dup: {e}")))?;
            let region = Arc::new(sluice_shm::MappedRegion::map(dup, len)?);
            let mmap = Mmap::pinned(&self.dev, region, EXPORT_ACCESS).map_err(backend)?;
            self.envelope(MemoryKind::Host, &mmap, len)
        }

        pub fn export_dmabuf(
            &self,
            fd: OwnedFd,
            offset: u64,
            len: u64,
            gpu: u64,
        ) -> Result<(RegionSource, ExportGuard), ShimError> {
            let mmap = Mmap::dmabuf(&self.dev, fd, offset as usize, len as usize, gpu, EXPORT_ACCESS).map_err(|e| {
                if e.code() == Some(sluice_doca::DocaErrorCode::NotSupported) {
                    ShimError::Unsupported(format!("registering GPU memory with DOCA: {e}"))
                } else {
                    backend(e)
                }
            })?;
            self.envelope(MemoryKind::GpuDmabuf, &mmap, len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memfd_is_not_a_dmabuf() {
        let fd = sluice_shm::create_memfd("t", 4096).expect("memfd");
        match check_dmabuf(&fd, 0, 4096) {
            Err(ShimError::BadRequest(why)) => assert!(why.contains("not a dma-buf"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    /// The co-located backend refuses what is not a dma-buf before keeping
    /// anything, and a GPU region needs its CUDA address.
    #[test]
    fn colocated_gpu_regions_are_checked_before_they_are_kept() {
        let memfd = || sluice_shm::create_memfd("t", 4096).expect("memfd");
        let hand_over = |gpu_address| sluice_shm::DmabufHandOver { offset: 0, len: 4096, gpu_address };
        let (r, _w) = std::io::pipe().expect("pipe");
        let b = MemoryBackend::Colocated;
        for (what, fd) in [("memfd", memfd()), ("pipe", OwnedFd::from(r))] {
            match b.dmabuf_source(fd, hand_over(0x7f00_0000_0000)) {
                Err(ShimError::BadRequest(why)) => assert!(why.contains("not a dma-buf"), "{what}: {why}"),
                Err(e) => panic!("{what}: {e}"),
                Ok(_) => panic!("{what} kept as a dma-buf"),
            }
        }
        assert!(
            matches!(b.dmabuf_source(memfd(), hand_over(0)), Err(ShimError::BadRequest(m)) if m.contains("CUDA address"))
        );
        assert_eq!(b.kinds(), vec![MemoryKind::Memfd, MemoryKind::GpuDmabuf]);
        assert_eq!(b.kinds_older_agents_reach(), vec![MemoryKind::Memfd]);
    }
}
