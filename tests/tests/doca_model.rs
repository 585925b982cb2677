//! A whole stack with both DOCA backends, against the DOCA test model
//! (`doca/model`, a C test double written from the public API reference; not
//! NVIDIA DOCA): the shim exports each region with `doca_mmap_export_pci`,
//! the agent (another process) imports it and places bytes with DMA tasks
//! (the model moves them with process_vm_writev/readv, as the DPU's DMA
//! engine reaches host memory), and encrypted namespaces run on the DOCA
//! AES-GCM engine. Real DOCA is validated only on a BlueField.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{Client, Code};
use sluice_crypt::{FileKeyProvider, KeyId};
use sluice_tests::{pattern, sha256, Options, Stack};

struct Env {
    stack: Stack,
    _keys: tempfile::TempDir,
}

/// `data` over HTTP (or `data_ns`), `plain` alongside; both backends DOCA.
fn doca_stack(data_ns: &str) -> Env {
    // Children inherit it; every test here sets the same value.
    std::env::set_var("DOCA_LIB_DIR", sluice_doca::model::lib_dir());
    let keys = tempfile::tempdir().unwrap();
    FileKeyProvider::create_key(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
    FileKeyProvider::set_current(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
    let stack = Stack::with(Options {
        shim_extra: "memory_backend = \"doca\"\n[doca]\ndevice = \"03:00.0\"".into(),
        agent_dataplane: format!(
            "[host_memory]\nbackend = \"doca\"\n[host_memory.doca]\ndevice = \"mlx5_0\"\nstaging_bytes = 65536\n\
             allowed_functions = [\"0000:03:00.0\"]\n[encryption]\nkey_dir = \"{}\"\nengine = \"doca\"\ndoca_device = \"mlx5_0\"",
            keys.path().display()
        ),
        data_ns: data_ns.into(),
        ..Default::default()
    });
    Env { stack, _keys: keys }
}

async fn round_trip(c: &Client, path: &str, data: &[u8]) -> (String, Vec<u8>) {
    let up = c.register(data.len() as u64).await.unwrap();
    up.write_at(0, data).unwrap();
    c.put(path, &up, 0, data.len() as u64).await.unwrap();
    c.release(up).await.unwrap();
    let down = c.register(data.len() as u64 + 4096).await.unwrap();
    let t = c.get(path, &down, 4096, None).await.unwrap();
    assert_eq!(t.bytes, data.len() as u64);
    let got = down.as_slice()[4096..4096 + data.len()].to_vec();
    c.release(down).await.unwrap();
    (t.data_path.to_owned(), got)
}

#[tokio::test]
async fn http_get_and_put_move_bytes_through_doca_dma() {
    let e = doca_stack("");
    let c = e.stack.client().await;
    // Larger than the 64 KiB staging buffer and multipart (> 6 MiB).
    for (i, n) in [1usize, 65_537, (7 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 70 + i as u64);
        let (path, got) = round_trip(&c, &format!("plain/doca-{n}"), &data).await;
        assert_eq!(path, "http");
        assert_eq!(sha256(&got), sha256(&data), "n={n}");
        assert_eq!(std::fs::read(e.stack.stored_file("data", &format!("doca-{n}"))).unwrap(), data);
    }
    // A ranged GET lands at its offset; bounds are still the region's.
    let r = c.register(100).await.unwrap();
    c.get("plain/doca-65537", &r, 10, Some((1000, Some(90)))).await.unwrap();
    assert_eq!(&r.as_slice()[10..100], &pattern(65_537, 71)[1000..1090]);
    let err = c.get("plain/doca-65537", &r, 50, Some((0, Some(51)))).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::RegionTooSmall));
    // The agent log says which backend served.
    let log = e.stack.log("sluice-agent");
    assert!(log.contains("DOCA host-memory backend ready"), "{log}");
    assert!(log.contains("DOCA AES-GCM engine passed its self-test"), "{log}");
}

#[tokio::test]
async fn rdma_tokens_over_tcp_place_through_doca_dma() {
    let e = doca_stack("data_path = \"rdma\"");
    let c = e.stack.client().await;
    let data = pattern((3 << 20) + 17, 80);
    let (path, got) = round_trip(&c, "data/rdma-doca", &data).await;
    assert!(path.starts_with("rdma"), "{path}");
    assert_eq!(sha256(&got), sha256(&data));
}

#[tokio::test]
async fn encrypted_namespaces_run_on_the_doca_aes_gcm_engine() {
    let e = doca_stack("encryption = \"aes-256-gcm\"\nencryption_chunk_bytes = 65536");
    let c = e.stack.client().await;
    let data = pattern((2 << 20) + 999, 90);
    let (_, got) = round_trip(&c, "data/secret", &data).await;
    assert_eq!(sha256(&got), sha256(&data));
    let stored = std::fs::read(e.stack.stored_file("data", "secret")).unwrap();
    assert_eq!(&stored[..4], b"SLCE", "ciphertext at rest");
    assert!(!stored.windows(64).any(|w| w == &data[..64]), "no plaintext at rest");
    // Opened with the ring implementation: the DOCA engine wrote the standard format.
    let provider = FileKeyProvider::new(e._keys.path()).unwrap();
    let opened = sluice_crypt::open_object(&provider, "alpha", "data", "secret", &stored).unwrap();
    assert_eq!(sha256(&opened), sha256(&data));
}

/// What a shim on a GPU node does for a GPU region, played by this test
/// against the stack's agent: a session opened with the tenant's secret,
/// and a region exported with DOCA as GPU memory. The model has no GPU, so
/// the memory behind the export is this process's host memory, which the
/// envelope calls GPU memory (the agent goes by the envelope: that is what
/// decides how it handles the region).
struct GpuShim {
    grpc: sluice_proto::agent::agent_client::AgentClient<tonic::transport::Channel>,
    session: String,
    region: String,
    memory: std::sync::Arc<sluice_shm::MappedRegion>,
    _export: std::sync::Arc<sluice_doca::Mmap>,
}

impl GpuShim {
    async fn open(stack: &sluice_tests::Stack, len: u64) -> Self {
        use sluice_proto::agent as apb;
        use sluice_proto::auth;
        let mut grpc = apb::agent_client::AgentClient::connect(format!("http://{}", stack.grpc_addr)).await.unwrap();
        let secret = auth::read_secret_file(&stack.dir.path().join("alpha.shim-secret")).unwrap();
        let (ts, nonce) = (auth::now_ms(), auth::new_nonce());
        let epoch = grpc.get_epoch(apb::GetEpochRequest {}).await.unwrap().into_inner().epoch;
        let claim =
            auth::SessionClaim { tenant: "alpha", shim_id: "gpu-shim", epoch: &epoch, timestamp_ms: ts, nonce: &nonce };
        let gpu = sluice_proto::common::MemoryKind::GpuDmabuf as i32;
        let opened = grpc
            .open_session(apb::OpenSessionRequest {
                tenant: "alpha".into(),
                shim_id: "gpu-shim".into(),
                timestamp_ms: ts,
                nonce: nonce.to_vec(),
                proof: auth::session_proof(&secret, &claim),
                shim_memory: vec![sluice_proto::common::MemoryKind::DocaHost as i32, gpu],
                epoch: epoch.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let caps = opened.capabilities.unwrap();
        assert!(caps.agent_memory.contains(&gpu), "the DOCA agent reaches GPU memory: {caps:?}");
        assert!(caps.gpu_staging.contains("DOCA DMA"), "{caps:?}");

        let dev = sluice_doca::Device::open(&sluice_doca::model::load(), "mlx5_0").unwrap();
        let memory = std::sync::Arc::new(sluice_shm::MappedRegion::create("gpu", len).unwrap());
        let pinned: std::sync::Arc<dyn sluice_rdma::PinnedMemory> = memory.clone();
        let access = sluice_doca::Access(sluice_doca::Access::PCI_READ_WRITE.0 | sluice_doca::Access::RDMA_WRITE.0);
        let export = sluice_doca::Mmap::pinned(&dev, pinned, access).unwrap();
        let envelope = sluice_doca::ExportEnvelope {
            kind: sluice_doca::MemoryKind::GpuDmabuf,
            len,
            host_addr: export.addr() as u64,
            pci: dev.info().pci.clone(),
            descriptor: export.export_pci().unwrap(),
        };
        let region = grpc
            .register_region(apb::RegisterRegionRequest {
                session_id: opened.session_id.clone(),
                length: len,
                export: Some(apb::register_region_request::Export::DocaExport(envelope.encode().unwrap())),
            })
            .await
            .unwrap()
            .into_inner()
            .region_id;
        Self { grpc, session: opened.session_id, region, memory, _export: export }
    }

    /// GETs `path` ("namespace/key") into the region at 0; the data path.
    async fn get(&mut self, path: &str) -> String {
        self.get_range(path, None).await
    }

    /// GETs `range` of `path` into the region at 0; the data path.
    async fn get_range(&mut self, path: &str, range: Option<(u64, u64)>) -> String {
        let (namespace, key) = path.split_once('/').unwrap();
        let reply = self
            .grpc
            .get(sluice_proto::agent::GetRequest {
                session_id: self.session.clone(),
                request_id: format!("gpu-get-{key}"),
                namespace: namespace.into(),
                key: key.into(),
                region_id: self.region.clone(),
                range: range.map(|(start, len)| sluice_proto::common::ByteRange { start, length: Some(len) }),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("GET {path} into GPU memory: {e}"))
            .into_inner();
        let report = reply.report.unwrap();
        report.data_path().as_str_name().to_owned() + if report.fallback_reason.is_empty() { "" } else { "+fallback" }
    }

    /// PUTs the region's first `len` bytes as `path`.
    async fn put(&mut self, path: &str, len: u64) -> String {
        let (namespace, key) = path.split_once('/').unwrap();
        let reply = self
            .grpc
            .put(sluice_proto::agent::PutRequest {
                session_id: self.session.clone(),
                request_id: format!("gpu-put-{key}"),
                namespace: namespace.into(),
                key: key.into(),
                region_id: self.region.clone(),
                length: len,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("PUT {path} from GPU memory: {e}"))
            .into_inner();
        reply.report.unwrap().data_path().as_str_name().to_owned()
    }
}

/// GPU regions never half-work: every path that cannot place bytes
/// directly (HTTP, the HTTP parts of `auto`, the tcp transport, decrypted
/// objects, every PUT, the checksum read-back) reaches the GPU memory with
/// DOCA DMA through DPU memory, and the bytes are right.
#[tokio::test]
async fn gpu_regions_are_served_on_every_path() {
    // "data": auto over the tcp transport, 1 MiB parts; parts of 1 MiB go
    // one-sided, the last, shorter one over HTTP. "plain": HTTP.
    let e = doca_stack("data_path = \"auto\"\nrdma_min_bytes = 1048576");
    let n = (2 << 20) + (300 << 10);
    let data = pattern(n, 33);
    let mut gpu = GpuShim::open(&e.stack, n as u64).await;
    for (path, want) in [("plain/gpu-http", "HTTP"), ("data/gpu-auto", "RDMA")] {
        gpu.memory.write_at(0, &data).unwrap();
        let how = gpu.put(path, n as u64).await;
        assert_eq!(how, want, "{path}: PUT");
        let key = path.split_once('/').unwrap().1;
        assert_eq!(std::fs::read(e.stack.stored_file("data", key)).unwrap(), data, "{path} stored via {how}");
        gpu.memory.write_at(0, &vec![0; n]).unwrap();
        let how = gpu.get(path).await;
        assert_eq!(how, want, "{path}: GET (auto: two parts one-sided, the last over HTTP)");
        assert_eq!(sha256(&gpu.memory.as_slice()[..n]), sha256(&data), "{path} read via {how}");
    }
    // In auto, a read shorter than rdma_min_bytes goes over HTTP alone.
    gpu.memory.write_at(0, &vec![0; n]).unwrap();
    assert_eq!(gpu.get_range("data/gpu-auto", Some((1000, 5000))).await, "HTTP");
    assert_eq!(&gpu.memory.as_slice()[..5000], &data[1000..6000]);

    // Decrypted objects are staged by the agent, then copied in with DMA.
    let e = doca_stack("encryption = \"aes-256-gcm\"\nencryption_chunk_bytes = 65536");
    let mut gpu = GpuShim::open(&e.stack, n as u64).await;
    gpu.memory.write_at(0, &data).unwrap();
    assert_eq!(gpu.put("data/gpu-secret", n as u64).await, "HTTP");
    gpu.memory.write_at(0, &vec![0; n]).unwrap();
    assert_eq!(gpu.get("data/gpu-secret").await, "HTTP", "decrypted by the agent, copied in with DMA");
    assert_eq!(sha256(&gpu.memory.as_slice()[..n]), sha256(&data));
    let stored = std::fs::read(e.stack.stored_file("data", "gpu-secret")).unwrap();
    assert_eq!(&stored[..4], b"SLCE", "ciphertext at rest");
}

/// Runs `bin` with `config` until it exits (it must fail at start-up) and
/// returns its stderr.
fn start_fails(bin: &str, config: &str, doca_lib_dir: &std::path::Path) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.shim-secret"), "a-shim-secret-of-enough-bytes\n").unwrap();
    std::fs::set_permissions(dir.path().join("t.shim-secret"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, config.replace("{d}", &dir.path().display().to_string())).unwrap();
    let mut child = std::process::Command::new(sluice_tests::bin(bin))
        .args(["--config", cfg.to_str().unwrap()])
        .env("DOCA_LIB_DIR", doca_lib_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("{bin} did not refuse to start");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const AGENT: &str = "grpc_socket = \"{d}/a.sock\"\nmemory_socket = \"{d}/m.sock\"\nstate_dir = \"{d}/state\"\n[host_memory]\nbackend = \"doca\"\n\
    [host_memory.doca]\ndevice = \"DEVICE\"\n[credentials.c]\naccess_key = \"a\"\nsecret_key = \"b\"\n[[tenants]]\n\
    name = \"t\"\nshim_secret_file = \"{d}/t.shim-secret\"\n[[tenants.namespaces]]\nname = \"n\"\n\
    endpoints = [\"http://127.0.0.1:1\"]\nbucket = \"b\"\ncredentials = \"c\"\n";

#[test]
fn a_configured_doca_backend_that_cannot_start_stops_the_daemon_naming_why() {
    let empty = tempfile::tempdir().unwrap();
    // No DOCA at all: the agent names the library and where it looked.
    let err = start_fails("sluice-agent", &AGENT.replace("DEVICE", "03:00.0"), empty.path());
    assert!(err.contains("doca_common") && err.contains(&empty.path().display().to_string()), "{err}");
    // DOCA present, no such device: the agent lists what it found.
    let err = start_fails("sluice-agent", &AGENT.replace("DEVICE", "mlx5_7"), sluice_doca::model::lib_dir());
    assert!(err.contains("mlx5_7") && err.contains("0000:03:00.0 (mlx5_0)"), "{err}");
    // The shim too.
    let shim = "socket = \"{d}/s.sock\"\nmemory_backend = \"doca\"\n[doca]\ndevice = \"3b:00.0\"\n[agent]\n\
        grpc = \"unix:{d}/a.sock\"\n[[callers]]\nuid = 0\ntenant = \"t\"\n[tenant_secrets]\nt = \"{d}/t.shim-secret\"\n";
    let err = start_fails("sluice-shim", shim, empty.path());
    assert!(err.contains("doca_common"), "{err}");
    let err = start_fails("sluice-shim", shim, sluice_doca::model::lib_dir());
    assert!(err.contains("3b:00.0") && err.contains("mlx5_0"), "{err}");
}
