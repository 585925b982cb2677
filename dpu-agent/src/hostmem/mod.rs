//! How the agent reaches host memory. One trait, several backends:
//!
//! * [`colocated`]: the agent runs on the host itself; the shim hands each
//!   region's memfd over a Unix socket and the agent maps it. GPU memory
//!   (a CUDA dma-buf) is handed over the same way and registered with the
//!   verbs device ([`gpu`]), when it can register dma-bufs.
//! * [`doca`] (on a BlueField; `--features doca`): the shim exports the
//!   region with `doca_mmap_export_pci`, the agent imports the descriptor.
//!
//! Every access is bounds-checked by the region.

pub mod colocated;
#[cfg(feature = "doca")]
pub mod doca;
pub mod gpu;

use std::sync::Arc;

use serde::Deserialize;

use sluice_proto::common::ErrorCode;

pub use sluice_dataplane::{MemError, RegionMemory as HostRegion};

/// Longest a release waits for transfers still using a region.
const QUIESCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until no transfer holds these released regions any more, so the
/// shim may tear down what backs them (a DOCA export: the DPU and storage
/// nodes must be done with the host memory first). Co-located regions are
/// backed by the agent's own mapping, so waiting is harmless there too.
pub async fn quiesce(regions: Vec<Arc<dyn HostRegion>>) {
    let start = std::time::Instant::now();
    for r in regions {
        while Arc::strong_count(&r) > 1 {
            if start.elapsed() > QUIESCE_LIMIT {
                tracing::warn!(
                    users = Arc::strong_count(&r) - 1,
                    "a released region is still in use; not waiting longer"
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
}

/// The typed code for a memory error.
pub fn mem_code(e: &MemError) -> ErrorCode {
    match e {
        MemError::OutOfBounds { .. } => ErrorCode::OutOfBounds,
        MemError::Unsupported(_) => ErrorCode::Unsupported,
        MemError::Exhausted(_) => ErrorCode::ResourceExhausted,
        MemError::Backend(_) => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    }
}

/// `[host_memory]`: how the agent reaches the shim's regions.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostMemoryConfig {
    #[serde(default)]
    pub backend: BackendKind,
    /// `[host_memory.doca]`, required with `backend = "doca"`.
    #[serde(default)]
    pub doca: Option<DocaBackendConfig>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// The agent runs on the host: memfds over `memory_socket`.
    #[default]
    Colocated,
    /// The agent runs on a BlueField: DOCA PCI exports.
    Doca,
}

/// `[host_memory.doca]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocaBackendConfig {
    /// The DPU device that imports host exports and runs DMA: a PCI
    /// address (`03:00.0`) or a verbs name (`mlx5_0`).
    pub device: String,
    /// DPU memory staged copies go through (HTTP fallback, decrypted bytes).
    #[serde(default = "default_staging")]
    pub staging_bytes: usize,
    /// Host PCI functions allowed to register regions; empty: any.
    #[serde(default)]
    pub allowed_functions: Vec<String>,
}

fn default_staging() -> usize {
    4 << 20
}

/// A `[host_memory]` section that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostMemoryConfigError {
    #[error(
        "[host_memory] backend = \"doca\" needs a [host_memory.doca] section with device = \"<pci address or mlx5_N>\""
    )]
    NoDocaSection,
    #[error("[host_memory.doca] staging_bytes = {0} (must be 4096..=1073741824)")]
    StagingBytes(usize),
    #[error("[host_memory.doca] allowed_functions: {0:?} is not a PCI address")]
    NotPci(String),
}

impl HostMemoryConfig {
    pub fn validate(&self) -> Result<(), HostMemoryConfigError> {
        match (self.backend, &self.doca) {
            (BackendKind::Doca, None) => Err(HostMemoryConfigError::NoDocaSection),
            (_, Some(d)) if d.staging_bytes < 4096 || d.staging_bytes > 1 << 30 => {
                Err(HostMemoryConfigError::StagingBytes(d.staging_bytes))
            }
            (_, Some(d)) => match d.allowed_functions.iter().find(|f| !sluice_dataplane_pci(f)) {
                Some(bad) => Err(HostMemoryConfigError::NotPci(bad.clone())),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// `DDDD:BB:DD.F` or `BB:DD.F`.
fn sluice_dataplane_pci(s: &str) -> bool {
    let (domain, rest) = match s.matches(':').count() {
        2 => s.split_once(':').unwrap_or(("", "")),
        1 => ("0000", s),
        _ => return false,
    };
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    match rest.split_once(':').and_then(|(b, df)| df.split_once('.').map(|(d, f)| (b, d, f))) {
        Some((b, d, f)) => {
            hex(domain, 4) && hex(b, 2) && hex(d, 2) && matches!(f, "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7")
        }
        None => false,
    }
}

/// What the shim sends to make a region reachable.
#[derive(Debug, Clone)]
pub enum RegionExport {
    /// Co-located: a one-time ticket for an fd handed over the memory socket.
    Colocated { ticket: String },
    /// DPU: a `doca_mmap_export_pci` blob.
    Doca { blob: Vec<u8> },
}

/// Memory a region can live in, by how it reaches the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host RAM in a memfd, handed to a co-located agent.
    Memfd,
    /// Host RAM exported with DOCA over PCIe.
    DocaHost,
    /// GPU memory (a CUDA dma-buf): exported with DOCA on a BlueField, or
    /// handed to a co-located agent whose verbs device registers dma-bufs
    /// (then reached by direct RDMA placement only).
    GpuDmabuf,
}

/// What a backend can reach, for the capability exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCaps {
    pub kinds: Vec<MemoryKind>,
    /// How bytes reach GPU memory when a transfer cannot place them
    /// directly; `None` when nothing stages them: GPU memory is then
    /// unreachable, or (a co-located agent with `GpuDmabuf` in `kinds`)
    /// reachable by direct RDMA placement only.
    pub gpu_staging: Option<String>,
}

/// A way of importing host regions.
pub trait HostMemory: Send + Sync {
    fn import(&self, export: RegionExport, len: u64) -> Result<Arc<dyn HostRegion>, MemError>;

    /// The region memory this backend reaches.
    fn capabilities(&self) -> MemoryCaps;

    /// Lets go of an export that will not be imported (its registration
    /// was refused), so whatever it holds is released now.
    fn discard(&self, _export: &RegionExport) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AgentConfig, CipherEngine};

    /// The example config with its `[host_memory]` and DOCA `[encryption]`
    /// lines uncommented.
    fn example_with_doca() -> String {
        let keys = [
            "[host_memory",
            "backend =",
            "device =",
            "staging_bytes =",
            "allowed_functions =",
            "[encryption]",
            "key_dir =",
            "engine =",
            "doca_device =",
        ];
        // Only from `# [encryption]` on: earlier commented sections reuse key names.
        let mut on = false;
        include_str!("../../../deploy/agent.example.toml")
            .lines()
            .map(|l| {
                on |= l.starts_with("# [encryption]");
                match l.strip_prefix("# ") {
                    Some(rest) if on && keys.iter().any(|k| rest.starts_with(k)) => format!("{rest}\n"),
                    _ => format!("{l}\n"),
                }
            })
            .collect()
    }

    #[test]
    fn example_doca_sections_parse_uncommented() {
        let text = example_with_doca();
        let cfg: AgentConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        cfg.validate().expect("valid");
        assert_eq!(cfg.host_memory.backend, BackendKind::Doca);
        let d = cfg.host_memory.doca.as_ref().expect("[host_memory.doca]");
        assert_eq!((d.device.as_str(), d.staging_bytes, d.allowed_functions.len()), ("03:00.0", 4 << 20, 1));
        assert_eq!(cfg.encryption.engine, CipherEngine::Doca);
        assert_eq!(cfg.encryption.doca_device.as_deref(), Some("03:00.0"));
    }

    #[test]
    fn host_memory_settings_are_checked() {
        let doca = |staging_bytes, allowed: &[&str]| HostMemoryConfig {
            backend: BackendKind::Doca,
            doca: Some(DocaBackendConfig {
                device: "mlx5_0".into(),
                staging_bytes,
                allowed_functions: allowed.iter().map(|s| s.to_string()).collect(),
            }),
        };
        assert!(HostMemoryConfig::default().validate().is_ok());
        assert!(doca(4 << 20, &["3b:00.0", "0000:5e:00.1"]).validate().is_ok());
        let missing = HostMemoryConfig { backend: BackendKind::Doca, doca: None }.validate().unwrap_err().to_string();
        assert!(missing.contains("[host_memory.doca]"), "{missing}");
        assert!(doca(100, &[]).validate().unwrap_err().to_string().contains("staging_bytes"));
        assert!(doca(2 << 30, &[]).validate().unwrap_err().to_string().contains("staging_bytes"));
        assert!(doca(4 << 20, &["mlx5_0"])
            .validate()
            .unwrap_err()
            .to_string()
            .contains("\"mlx5_0\" is not a PCI address"));
        let bad: Result<HostMemoryConfig, _> = toml::from_str("backend = \"gpu\"");
        assert!(bad.is_err());
    }

    #[tokio::test]
    async fn release_waits_for_transfers_still_using_the_region() {
        let region: Arc<dyn HostRegion> =
            Arc::new(sluice_dataplane::SharedRegion::new(sluice_shm::MappedRegion::create("q", 4096).expect("memfd")));
        let in_flight = region.clone();
        let start = std::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            drop(in_flight);
        });
        quiesce(vec![region]).await;
        assert!(start.elapsed() >= std::time::Duration::from_millis(140), "{:?}", start.elapsed());
    }

    #[test]
    fn the_doca_cipher_needs_a_device() {
        let text = example_with_doca().replace("doca_device = \"03:00.0\"", "# no device");
        let cfg: AgentConfig = toml::from_str(&text).expect("parses");
        let e = cfg.validate().unwrap_err().to_string();
        assert!(e.contains("doca_device"), "{e}");
    }
}
