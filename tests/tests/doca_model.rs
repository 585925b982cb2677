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

const AGENT: &str = "grpc_socket = \"{d}/a.sock\"\nmemory_socket = \"{d}/m.sock\"\n[host_memory]\nbackend = \"doca\"\n\
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
