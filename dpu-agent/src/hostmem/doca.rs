//! The DOCA host-memory backend (agent on a BlueField-3).
//!
//! The shim maps each region with `doca_mmap_export_pci` and sends the
//! descriptor inside a Sluice envelope ([`sluice_doca::ExportEnvelope`]);
//! the agent checks the envelope against the registration, imports the
//! descriptor on its DPU device and then reaches the region two ways:
//!
//! * direct placement (verbs transports): [`DocaRegion::nic_window`] imports
//!   the same descriptor on a DOCA device opened over the tenant's verbs PD
//!   (RDMA bridge) and hands the storage node that buffer's memory key, so
//!   RDMA WRITEs land in host (or GPU) memory without touching the DPU.
//!   The key is the import's, and covers the whole region: each window gets
//!   an import of its own, destroyed when the window is, so a key dies with
//!   its window as a verbs MR's does (a shared import's key stayed valid
//!   for the region's whole life, and a late or repeated WRITE of a
//!   finished transfer could land after the next GET into the region
//!   succeeded);
//! * staged placement (HTTP fallback, tcp transport, decrypted bytes):
//!   `write_at`/`read_at` copy through a DPU staging buffer with DOCA DMA.
//!
//! GPU memory (a CUDA dma-buf the shim exported) is reached the same two
//! ways: the DMA engine copies to and from any memory exported over PCIe,
//! so a GPU region works on every path (HTTP parts, `auto`, the tcp
//! transport, decrypted objects, PUTs, checksum read-back) instead of only
//! on direct RDMA.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_dataplane::{MemError, NicWindow};
use sluice_doca::{Access, Device, DmaEngine, ExportEnvelope, Inventory, Lib, Mmap, Staging};
use sluice_rdma::ProtectionDomain;

use super::{DocaBackendConfig, HostMemory, HostRegion, RegionExport};

/// Maps DOCA failures to what the client is told: a descriptor DOCA
/// refuses is the sender's fault; running out is exhaustion; the rest is
/// the backend's own failure.
fn doca_err(e: sluice_doca::Error) -> MemError {
    use sluice_doca::DocaErrorCode as C;
    match e.code() {
        _ if matches!(e, sluice_doca::Error::BadExport(_)) => MemError::BadExport(e.to_string()),
        Some(C::InvalidValue | C::NotPermitted) => MemError::BadExport(e.to_string()),
        Some(C::NoMemory | C::Full | C::Again) => MemError::Exhausted(e.to_string()),
        _ => MemError::Backend(e.to_string()),
    }
}

/// Runs a blocking DOCA copy without stalling the async runtime's other
/// tasks (on a multi-threaded runtime the worker hands its queue away).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// DMA engine plus the DPU-side staging buffer it copies through.
struct Stager {
    dev: Arc<Device>,
    dma: DmaEngine,
    staging: Staging,
}

impl Stager {
    fn new(dev: &Arc<Device>, staging_bytes: usize) -> Result<Self, sluice_doca::Error> {
        Ok(Self {
            dev: dev.clone(),
            dma: DmaEngine::new(dev)?,
            staging: Staging::new(dev, staging_bytes, Access::LOCAL_READ_WRITE)?,
        })
    }

    /// Before touching the staging buffer: a hung task may still read or
    /// write it, so a retired engine is replaced together with its buffer
    /// (the old pair is leaked, never reused).
    fn ready(&mut self) -> Result<(), MemError> {
        if self.dma.is_usable() {
            return Ok(());
        }
        let fresh = Stager::new(&self.dev, self.staging.len()).map_err(doca_err)?;
        tracing::warn!("replacing a DOCA DMA engine that had a hung task");
        std::mem::forget(std::mem::replace(self, fresh));
        Ok(())
    }
}

/// Most DMA engines (each with its staging buffer) the backend starts.
const MAX_STAGERS: usize = 8;
/// DPU memory their staging buffers take in all, at most (one engine
/// whatever its buffer's size).
const STAGING_TOTAL: usize = 64 << 20;

/// DMA engines with their staging buffers, one per core the agent copies on
/// (at most [`MAX_STAGERS`]): a staged copy takes a free one, and waits only
/// when all are busy. With one engine, a copy on any core (a per-core
/// runtime's, blocking it) waited behind every other tenant's copies.
struct Stagers {
    each: Vec<Mutex<Stager>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Stagers {
    fn new(dev: &Arc<Device>, staging_bytes: usize, n: usize) -> Result<Self, sluice_doca::Error> {
        let each = (0..n.max(1)).map(|_| Stager::new(dev, staging_bytes).map(Mutex::new)).collect::<Result<_, _>>()?;
        Ok(Self { each, next: Default::default() })
    }

    /// A free engine if there is one (starting from the next in turn), else
    /// the next in turn once it is free.
    fn take(&self) -> std::sync::MutexGuard<'_, Stager> {
        let n = self.each.len();
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
        for i in 0..n {
            match self.each[(start + i) % n].try_lock() {
                Ok(g) => return g,
                Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        self.each[start].lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The backend: one DPU device, DMA engines shared by all regions.
pub struct DocaMemory {
    lib: Lib,
    dev: Arc<Device>,
    stagers: Arc<Stagers>,
    /// A staging buffer's size (fixed; read without taking a stager,
    /// which a staged copy holds for its whole length).
    staging_bytes: usize,
    allowed: Vec<String>,
}

impl DocaMemory {
    /// Loads DOCA, opens `cfg.device` and starts a DMA engine. Every
    /// failure names what is missing (library, symbol, device, capability).
    pub fn open(cfg: &DocaBackendConfig) -> Result<Arc<Self>, sluice_doca::Error> {
        Self::open_with(sluice_doca::load()?, cfg)
    }

    /// As [`open`](Self::open), with libraries already loaded.
    pub fn open_with(lib: Lib, cfg: &DocaBackendConfig) -> Result<Arc<Self>, sluice_doca::Error> {
        let dev = Device::open(&lib, &cfg.device)?;
        if !dev.can_import_pci()? {
            return Err(sluice_doca::Error::Invalid(format!(
                "DOCA device {:?} cannot import host memory exported over PCIe (doca_mmap_cap_is_create_from_export_pci_supported)",
                dev.info()
            )));
        }
        // As many as cores, at most MAX_STAGERS and (unless one alone is
        // more) STAGING_TOTAL of DPU memory in all.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let n = cores.min(MAX_STAGERS).min((STAGING_TOTAL / cfg.staging_bytes.max(1)).max(1));
        let stagers = Stagers::new(&dev, cfg.staging_bytes, n)?;
        tracing::info!(device = ?dev.info(), staging = cfg.staging_bytes, engines = n, "DOCA host-memory backend ready");
        Ok(Arc::new(Self {
            lib,
            dev,
            stagers: Arc::new(stagers),
            staging_bytes: cfg.staging_bytes,
            allowed: cfg.allowed_functions.iter().map(|s| s.to_ascii_lowercase()).collect(),
        }))
    }
}

/// Checks an envelope against the registration before DOCA sees it.
pub(crate) fn check_envelope(blob: &[u8], len: u64, allowed: &[String]) -> Result<ExportEnvelope, MemError> {
    let env = ExportEnvelope::decode(blob).map_err(doca_err)?;
    if env.len != len {
        return Err(MemError::BadExport(format!("the export covers {} bytes, the registration says {len}", env.len)));
    }
    let pci = env.pci.to_ascii_lowercase();
    let full = if pci.matches(':').count() == 1 { format!("0000:{pci}") } else { pci };
    if !allowed.is_empty() && !allowed.iter().any(|a| *a == full || format!("0000:{a}") == full) {
        return Err(MemError::BadExport(format!(
            "host function {} is not in [host_memory.doca] allowed_functions",
            env.pci
        )));
    }
    Ok(env)
}

impl HostMemory for DocaMemory {
    fn capabilities(&self) -> super::MemoryCaps {
        super::MemoryCaps {
            kinds: vec![super::MemoryKind::DocaHost, super::MemoryKind::GpuDmabuf],
            gpu_staging: Some(format!(
                "DOCA DMA through {} bytes of DPU memory on {}",
                self.staging_bytes,
                self.dev.info().pci
            )),
        }
    }

    fn import(&self, export: RegionExport, len: u64) -> Result<Arc<dyn HostRegion>, MemError> {
        let blob = match export {
            RegionExport::Doca { blob } => blob,
            RegionExport::Colocated { .. } => {
                return Err(MemError::Unsupported(
                    "this agent runs the doca host-memory backend; the shim must export regions with DOCA \
                     (memory_backend = \"doca\" in shim.toml), not hand over memfds"
                        .into(),
                ))
            }
        };
        let env = check_envelope(&blob, len, &self.allowed)?;
        let mmap = Mmap::import(&self.dev, &env.descriptor).map_err(doca_err)?;
        if (mmap.len() as u64) < len {
            return Err(MemError::BadExport(format!(
                "the imported mapping has {} bytes, fewer than {len}",
                mmap.len()
            )));
        }
        if mmap.addr() as u64 != env.host_addr {
            return Err(MemError::BadExport(format!(
                "the envelope says the region starts at {:#x}, the descriptor at {:#x}",
                env.host_addr,
                mmap.addr()
            )));
        }
        Ok(Arc::new(DocaRegion {
            lib: self.lib.clone(),
            env,
            mmap,
            len,
            stagers: self.stagers.clone(),
            bridge_devices: Mutex::new(HashMap::new()),
        }))
    }
}

/// The region re-imported on a tenant PD's DOCA device (RDMA bridge), for
/// one window: dropped (the import destroyed, its key with it) when the
/// window is.
struct Bridged {
    /// The window's buffer, dropped before the import it lies in.
    _buf: sluice_doca::Buf,
    _inv: Arc<Inventory>,
    mmap: Arc<Mmap>,
}

/// A host region imported on the DPU.
pub struct DocaRegion {
    lib: Lib,
    env: ExportEnvelope,
    mmap: Arc<Mmap>,
    len: u64,
    stagers: Arc<Stagers>,
    /// Per verbs PD (keyed by address): the DOCA device opened over it,
    /// made once (each window imports the region on it anew).
    bridge_devices: Mutex<HashMap<usize, Arc<Device>>>,
}

impl std::fmt::Debug for DocaRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocaRegion")
            .field("len", &self.len)
            .field("kind", &self.env.kind)
            .field("pci", &self.env.pci)
            .finish()
    }
}

impl DocaRegion {
    /// Imports the region for one window of `len` bytes at `offset` on the
    /// DOCA device over `pd`; returns the import and the window's memory
    /// key (which dies with it).
    fn bridge(
        &self,
        pd: &Arc<ProtectionDomain>,
        offset: usize,
        len: usize,
    ) -> Result<(Bridged, u32), sluice_doca::Error> {
        let dev = {
            let mut devices = self.bridge_devices.lock().unwrap_or_else(|p| p.into_inner());
            match devices.get(&(pd.as_raw() as usize)) {
                Some(d) => d.clone(),
                None => {
                    let d = Device::from_verbs_pd(&self.lib, pd)?;
                    devices.insert(pd.as_raw() as usize, d.clone());
                    d
                }
            }
        };
        let mmap = Mmap::import(&dev, &self.env.descriptor)?;
        let inv = Inventory::new(&dev, 1)?;
        let buf = inv.buf(&mmap, offset, len, len)?;
        let rkey = buf.mkey(&dev)?;
        Ok((Bridged { _buf: buf, _inv: inv, mmap }, rkey))
    }
}

impl HostRegion for DocaRegion {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError> {
        self.check(offset, data.len() as u64)?;
        blocking(|| {
            let mut st = self.stagers.take();
            let step = st.staging.len();
            for (i, piece) in data.chunks(step).enumerate() {
                st.ready()?;
                let Stager { dma, staging, .. } = &mut *st;
                staging.write(0, piece).map_err(doca_err)?;
                dma.copy(staging.mmap(), 0, &self.mmap, offset as usize + i * step, piece.len()).map_err(doca_err)?;
            }
            Ok(())
        })
    }

    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, out.len() as u64)?;
        blocking(|| {
            let mut st = self.stagers.take();
            let step = st.staging.len();
            for (i, piece) in out.chunks_mut(step).enumerate() {
                st.ready()?;
                let Stager { dma, staging, .. } = &mut *st;
                dma.copy(&self.mmap, offset as usize + i * step, staging.mmap(), 0, piece.len()).map_err(doca_err)?;
                staging.read(0, piece).map_err(doca_err)?;
            }
            Ok(())
        })
    }

    fn nic_window(
        &self,
        pd: &Arc<ProtectionDomain>,
        offset: u64,
        len: u64,
        remote_write: bool,
    ) -> Option<Result<NicWindow, MemError>> {
        let make = || -> Result<NicWindow, MemError> {
            self.check(offset, len)?;
            if !remote_write {
                // The bridge key would allow WRITEs too, for the region's
                // whole life: a storage node reading a PUT's bytes must not
                // get one. PUTs from DOCA regions go staged instead.
                return Err(MemError::Unsupported(
                    "read-only windows into DOCA-imported memory are not offered; PUT parts go staged".into(),
                ));
            }
            let (b, rkey) = self.bridge(pd, offset as usize, len as usize).map_err(doca_err)?;
            // The remote address is the host's: the exporter's virtual
            // address of the window (DOCA keys address host memory by it).
            let addr = b.mmap.addr() as u64 + offset;
            Ok(NicWindow { addr, rkey, guard: Box::new(b) })
        };
        Some(blocking(make))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_doca::MemoryKind;
    use sluice_rdma::{Buffer, PinnedMemory};

    fn backend(staging_bytes: usize) -> Arc<DocaMemory> {
        let cfg = DocaBackendConfig { device: "03:00.0".into(), staging_bytes, allowed_functions: vec![] };
        DocaMemory::open_with(sluice_doca::model::load(), &cfg).expect("backend on the DOCA model")
    }

    /// A staged copy takes an engine nobody holds: copies on other cores
    /// wait for none of each other's (one engine served them all in turn).
    #[test]
    fn a_copy_takes_a_free_engine_and_waits_only_when_all_are_busy() {
        let b = backend(1 << 16);
        let stagers = Stagers::new(&b.dev, 4096, 3).expect("three engines on the model");
        let (x, y, z) = (stagers.take(), stagers.take(), stagers.take());
        let at = |g: &std::sync::MutexGuard<'_, Stager>| &**g as *const Stager;
        assert!(at(&x) != at(&y) && at(&y) != at(&z) && at(&x) != at(&z), "three copies, three engines");
        let first = at(&x);
        drop(x);
        let again = stagers.take();
        assert_eq!(at(&again), first, "the one free engine");
    }

    /// What the shim's DOCA exporter does for a region.
    fn export(host: &Arc<Buffer>) -> (Arc<Mmap>, Vec<u8>) {
        export_as(host, MemoryKind::Host)
    }

    /// The same, labelled as memory of `kind` (the model has no GPU: GPU
    /// memory is stood in for by host memory the envelope calls GPU memory).
    fn export_as(host: &Arc<Buffer>, kind: MemoryKind) -> (Arc<Mmap>, Vec<u8>) {
        let lib = sluice_doca::model::load();
        let dev = Device::open(&lib, "mlx5_0").expect("device");
        let pinned: Arc<dyn PinnedMemory> = host.clone();
        let mmap = Mmap::pinned(&dev, pinned, Access::PCI_READ_WRITE).expect("mmap");
        let env = ExportEnvelope {
            kind,
            len: host.len() as u64,
            host_addr: mmap.addr() as u64,
            pci: dev.info().pci.clone(),
            descriptor: mmap.export_pci().expect("export"),
        };
        (mmap, env.encode().expect("encode"))
    }

    #[test]
    fn staged_writes_and_reads_reach_host_memory_through_dma() {
        // A staging buffer smaller than the transfer: copies go in pieces.
        let mem = backend(4096);
        let host = Buffer::zeroed(1 << 20);
        let (_keep, blob) = export(&host);
        let region = mem.import(RegionExport::Doca { blob }, 1 << 20).expect("import");
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        region.write_at(777, &data).expect("write_at");
        let mut got = vec![0u8; data.len()];
        host.read_at(777, &mut got).expect("host");
        assert_eq!(got, data);
        let mut back = vec![0u8; data.len()];
        region.read_at(777, &mut back).expect("read_at");
        assert_eq!(back, data);
        // Bounds are the region's, whatever DOCA would allow.
        assert!(matches!(region.write_at((1 << 20) - 1, b"ab"), Err(MemError::OutOfBounds { .. })));
    }

    #[test]
    fn gpu_regions_take_staged_copies_through_dma() {
        let mem = backend(4096);
        let caps = mem.capabilities();
        assert!(caps.kinds.contains(&super::super::MemoryKind::GpuDmabuf), "{caps:?}");
        assert!(caps.gpu_staging.as_deref().is_some_and(|s| s.contains("4096 bytes")), "{caps:?}");
        let gpu = Buffer::zeroed(1 << 16);
        let (_keep, blob) = export_as(&gpu, MemoryKind::GpuDmabuf);
        let region = mem.import(RegionExport::Doca { blob }, 1 << 16).expect("import");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        region.write_at(100, &data).expect("staged write into GPU memory");
        let mut got = vec![0u8; data.len()];
        gpu.read_at(100, &mut got).expect("gpu");
        assert_eq!(got, data);
        let mut back = vec![0u8; data.len()];
        region.read_at(100, &mut back).expect("staged read from GPU memory");
        assert_eq!(back, data);
    }

    #[test]
    fn imports_that_do_not_match_are_refused() {
        let mem = backend(1 << 20);
        let host = Buffer::zeroed(8192);
        let (_keep, blob) = export(&host);
        match mem.import(RegionExport::Doca { blob: blob.clone() }, 4096) {
            Err(MemError::BadExport(why)) => assert!(why.contains("8192"), "{why}"),
            other => panic!("{other:?}"),
        }
        match mem.import(RegionExport::Colocated { ticket: "x".into() }, 8192) {
            Err(MemError::Unsupported(why)) => assert!(why.contains("doca"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A valid envelope around a corrupted DOCA descriptor: DOCA refuses it.
        let mut env = ExportEnvelope::decode(&blob).expect("decode");
        env.descriptor[0] ^= 0xff;
        let e = mem.import(RegionExport::Doca { blob: env.encode().expect("encode") }, 8192).expect_err("corrupt");
        assert!(e.to_string().contains("doca_mmap_create_from_export"), "{e}");
    }

    fn env(len: u64, pci: &str) -> Vec<u8> {
        ExportEnvelope { kind: MemoryKind::Host, len, host_addr: 0x1000, pci: pci.into(), descriptor: vec![7; 64] }
            .encode()
            .expect("encode")
    }

    #[test]
    fn envelope_must_match_the_registration() {
        assert!(check_envelope(&env(4096, "0000:3b:00.0"), 4096, &[]).is_ok());
        match check_envelope(&env(4096, "0000:3b:00.0"), 8192, &[]) {
            Err(MemError::BadExport(why)) => assert!(why.contains("4096") && why.contains("8192"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(check_envelope(b"garbage", 4096, &[]), Err(MemError::BadExport(_))));
    }

    #[test]
    fn only_allowed_host_functions_may_export() {
        let allowed = vec!["3b:00.0".to_owned(), "0000:5e:00.1".to_owned()];
        assert!(check_envelope(&env(4096, "0000:3b:00.0"), 4096, &allowed).is_ok());
        assert!(check_envelope(&env(4096, "5e:00.1"), 4096, &allowed).is_ok());
        match check_envelope(&env(4096, "0000:3b:00.1"), 4096, &allowed) {
            Err(MemError::BadExport(why)) => assert!(why.contains("[host_memory.doca] allowed_functions"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
