//! Which requests a region that only the NIC reaches can take (GPU memory
//! on a co-located agent: a dma-buf memory region, no CPU mapping; see
//! `hostmem::gpu`). Bytes can reach it only by direct one-sided RDMA, so a
//! request whose namespace would move any of them another way — an HTTP
//! part, a staged copy, the CPU-driven tcp transport, encryption, a
//! checksum pass — is refused with UNSUPPORTED before anything moves,
//! never half-written.

use sluice_dataplane::TransportKind;

use super::error::S3Error;
use super::store::ObjectStore;
use crate::hostmem::HostRegion;
use crate::model::{DataPathMode, Placement};

/// Which way a request moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Into the region (GET).
    Get,
    /// Out of the region (PUT).
    Put,
}

/// What decides whether a namespace can serve a NIC-only region.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PathFacts {
    data_path: DataPathMode,
    /// The transport in use, its mode and placement; `None`: HTTP.
    rdma: Option<(TransportKind, DataPathMode, Placement)>,
    degraded: Option<String>,
    encrypted: bool,
    verify_checksums: bool,
}

/// Why a namespace with `f` cannot serve a NIC-only region in `dir`;
/// `None`: it can (every byte by direct one-sided RDMA).
fn refusal(f: &PathFacts, dir: Direction) -> Option<String> {
    if dir == Direction::Put {
        return Some(
            "PUTs from it are not supported yet: every PUT carries the CRC64NVME of its bytes \
             (x-amz-checksum-crc64nvme, which also keeps a store that ignored the RDMA token from storing an \
             empty object), and the agent cannot read them to compute it"
                .into(),
        );
    }
    if f.encrypted {
        return Some("the agent decrypts this namespace's objects, which needs them in memory it can write".into());
    }
    let Some((kind, mode, placement)) = f.rdma else {
        return Some(match (&f.data_path, &f.degraded) {
            (DataPathMode::Http, _) => "data_path = \"http\" moves every byte over HTTP".into(),
            (_, Some(why)) => format!("its RDMA transport is unavailable ({why}), so bytes go over HTTP"),
            (_, None) => "its RDMA transport is unavailable, so bytes go over HTTP".into(),
        });
    };
    if kind == TransportKind::Tcp {
        return Some("the tcp transport moves bytes with the agent's CPU (use verbs-rc or dc)".into());
    }
    if mode == DataPathMode::Auto {
        return Some(
            "data_path = \"auto\" moves a GET's first part, and parts under rdma_min_bytes, over HTTP \
             (use data_path = \"rdma\")"
                .into(),
        );
    }
    if placement == Placement::Staged {
        return Some("placement = \"staged\" copies bytes through an agent buffer (use \"direct\")".into());
    }
    if f.verify_checksums {
        return Some(
            "verify_checksums = true reads whole-object GETs back to check them (set it to false in namespaces \
             that serve GPU memory; the store's byte count is still checked)"
                .into(),
        );
    }
    None
}

impl ObjectStore {
    fn path_facts(&self) -> PathFacts {
        PathFacts {
            data_path: self.data_path,
            rdma: self.rdma.as_ref().map(|r| (r.kind, r.mode, r.placement)),
            degraded: self.degraded.as_ref().map(|d| format!("{}: {}", d.kind, d.message)),
            encrypted: self.encryption.is_some(),
            verify_checksums: self.verify_checksums,
        }
    }

    /// Refuses (UNSUPPORTED, before anything moves) a request on a region
    /// only the NIC reaches that this namespace would serve otherwise than
    /// by direct one-sided RDMA. Other regions always pass.
    pub fn check_reach(&self, region: &dyn HostRegion, dir: Direction) -> Result<(), S3Error> {
        let Some(why) = region.nic_only() else { return Ok(()) };
        match refusal(&self.path_facts(), dir) {
            None => Ok(()),
            Some(reason) => {
                Err(S3Error::Unsupported(format!("this namespace cannot serve this region: {reason}. {why}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::MemError;

    use super::*;
    use crate::s3::call::{Call, ObjectWrite};
    use crate::s3::mock::{MockStore, Op};

    fn rdma_direct() -> PathFacts {
        PathFacts {
            data_path: DataPathMode::Rdma,
            rdma: Some((TransportKind::VerbsRc, DataPathMode::Rdma, Placement::Direct)),
            degraded: None,
            encrypted: false,
            verify_checksums: false,
        }
    }

    fn refused(f: PathFacts, dir: Direction, says: &str) {
        match refusal(&f, dir) {
            Some(why) => assert!(why.contains(says), "{f:?}: {why}"),
            None => panic!("{f:?} {dir:?} was not refused"),
        }
    }

    #[test]
    fn only_direct_rdma_gets_are_served() {
        assert_eq!(refusal(&rdma_direct(), Direction::Get), None);
        let dc = PathFacts { rdma: Some((TransportKind::Dc, DataPathMode::Rdma, Placement::Direct)), ..rdma_direct() };
        assert_eq!(refusal(&dc, Direction::Get), None);
        // A dc namespace running on verbs-rc because DC is unavailable
        // still places directly.
        let dc_down = PathFacts { degraded: Some("dc_unavailable: no DC".into()), ..rdma_direct() };
        assert_eq!(refusal(&dc_down, Direction::Get), None);
    }

    #[test]
    fn namespaces_that_would_need_http_or_the_cpu_are_refused() {
        let http = PathFacts { data_path: DataPathMode::Http, rdma: None, ..rdma_direct() };
        refused(http, Direction::Get, "data_path = \"http\"");
        let down = PathFacts { rdma: None, degraded: Some("dc_unavailable: no device".into()), ..rdma_direct() };
        refused(down, Direction::Get, "transport is unavailable (dc_unavailable: no device)");
        let auto = PathFacts {
            data_path: DataPathMode::Auto,
            rdma: Some((TransportKind::VerbsRc, DataPathMode::Auto, Placement::Direct)),
            ..rdma_direct()
        };
        refused(auto, Direction::Get, "data_path = \"auto\"");
        let staged =
            PathFacts { rdma: Some((TransportKind::VerbsRc, DataPathMode::Rdma, Placement::Staged)), ..rdma_direct() };
        refused(staged, Direction::Get, "staged");
        let tcp =
            PathFacts { rdma: Some((TransportKind::Tcp, DataPathMode::Rdma, Placement::Direct)), ..rdma_direct() };
        refused(tcp, Direction::Get, "tcp transport");
        refused(PathFacts { encrypted: true, ..rdma_direct() }, Direction::Get, "decrypts");
        refused(PathFacts { verify_checksums: true, ..rdma_direct() }, Direction::Get, "verify_checksums");
        refused(rdma_direct(), Direction::Put, "PUTs from it are not supported");
    }

    /// A region only the NIC reaches (stands in for a dma-buf region:
    /// no verbs device here).
    #[derive(Debug)]
    struct NicOnly;

    impl HostRegion for NicOnly {
        fn len(&self) -> u64 {
            1 << 20
        }
        fn write_at(&self, _: u64, _: &[u8]) -> Result<(), MemError> {
            panic!("a byte was written with the CPU")
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> Result<(), MemError> {
            panic!("a byte was read with the CPU")
        }
        fn nic_only(&self) -> Option<&str> {
            Some("no CPU view")
        }
    }

    #[test]
    fn an_rdma_part_into_gpu_memory_fails_instead_of_falling_back() {
        use crate::s3::token_path::{unless_nic_only, Fallback};
        let short = || Fallback::new("short", "the store reported Some(10) bytes for a 4096-byte part");
        match unless_nic_only(&NicOnly, Ok(Some(short()))) {
            Err(S3Error::TransferFailed { message, .. }) => {
                assert!(message.contains("short") && message.contains("no CPU view"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(unless_nic_only(&NicOnly, Ok(None)), Ok(None)), "a part that landed passes");
        let host = sluice_dataplane::SharedRegion::new(sluice_shm::MappedRegion::create("t", 4096).expect("memfd"));
        assert!(matches!(unless_nic_only(&host, Ok(Some(short()))), Ok(Some(_))), "host memory falls back");
    }

    fn store(client: Arc<MockStore>) -> ObjectStore {
        let ns: crate::config::NamespaceConfig =
            toml::from_str("name = \"d\"\nendpoints = [\"http://a:1\"]\nbucket = \"data\"\ncredentials = \"c\"\n")
                .expect("namespace");
        let counters = super::super::store::S3Counters {
            retries: prometheus::IntCounter::new("retries", "r").expect("counter"),
            multipart_aborts: prometheus::IntCounterVec::new(prometheus::Opts::new("aborts", "a"), &["reason"])
                .expect("counter"),
        };
        ObjectStore::new(client, &ns, "tenant", crate::config::S3Tuning::default(), counters, None)
    }

    /// The refusal happens before the store sees anything: no object is
    /// created, overwritten or read.
    #[tokio::test]
    async fn a_put_from_a_nic_only_region_reaches_no_store() {
        let mock = Arc::new(MockStore::new());
        let s = store(mock.clone());
        let region: Arc<dyn HostRegion> = Arc::new(NicOnly);
        let e = s.put_from(&ObjectWrite::from_start("k", &region, 4096), &Call::ungated("req")).await.unwrap_err();
        assert!(matches!(&e, S3Error::Unsupported(m) if m.contains("no CPU view")), "{e}");
        assert_eq!(e.code(), sluice_proto::common::ErrorCode::Unsupported);
        assert!(mock.calls().is_empty(), "{:?}", mock.calls());
        assert_eq!(mock.count(Op::Put), 0);
        // A GET on this HTTP namespace is refused the same way.
        let e = s.check_reach(region.as_ref(), Direction::Get).unwrap_err();
        assert!(e.to_string().contains("data_path = \"http\""), "{e}");
        // Host memory passes whatever the namespace.
        let host: Arc<dyn HostRegion> =
            Arc::new(sluice_dataplane::SharedRegion::new(sluice_shm::MappedRegion::create("t", 4096).expect("memfd")));
        assert!(s.check_reach(host.as_ref(), Direction::Put).is_ok());
    }
}
