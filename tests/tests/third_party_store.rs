//! The agent against third-party S3 servers that verify SigV4: s3s-fs
//! (`cargo install s3s-fs@0.14.1 --features binary --locked`) and moto with
//! its IAM checks on (`pip install moto[server]`); scripts/test installs both.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_client::Code;
use sluice_tests::{pattern, sha256, Options, Stack, ACCESS_KEY, SECRET_KEY};

fn s3s_fs_binary() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_S3S_FS") {
        return PathBuf::from(p);
    }
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cargo"));
    let p = home.join("bin/s3s-fs");
    assert!(
        p.exists(),
        "{} missing: run `cargo install s3s-fs@0.14.1 --features binary --locked` (scripts/test does)",
        p.display()
    );
    p
}

struct S3sFs(std::process::Child);
impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts s3s-fs on a free port with buckets "data" and "other".
fn start_s3s_fs() -> (tempfile::TempDir, S3sFs, u16) {
    let root = tempfile::tempdir().unwrap();
    for b in ["data", "other"] {
        std::fs::create_dir_all(root.path().join(b)).unwrap();
    }
    let log = root.path().join("s3s-fs.log");
    // s3s-fs only logs its address, so pick a free port first.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(s3s_fs_binary())
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--access-key",
            ACCESS_KEY,
            "--secret-key",
            SECRET_KEY,
        ])
        .arg(root.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start s3s-fs");
    let guard = S3sFs(child);
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "s3s-fs did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (root, guard, port)
}

/// s3s-fs ignores If-Match on GET: the agent's own check of every part's
/// ETag and size is what keeps a racing writer from tearing a read. (The
/// versions differ in size: s3s-fs reads an object's ETag apart from its
/// file, so a reply can carry one version's bytes under the next one's
/// ETag, which no client can see through; the size in Content-Range comes
/// from the file itself. The gateway binds the two, see torn_reads.rs.)
#[tokio::test]
async fn no_torn_reads_against_a_store_that_ignores_if_match() {
    let (_root, _guard, port) = start_s3s_fs();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        gateway: false,
        ..Default::default()
    });
    let (whole, refused) =
        sluice_tests::race_reads(&stack, "data/race/s3s-fs", [16 << 20, (16 << 20) + 4096], 12).await;
    assert_eq!(whole + refused, 12);
}

/// The agent's operations against a store it did not come with: PUT (single
/// and multipart), GET (whole and ranged), HEAD, LIST, DELETE, missing keys.
/// Keys are `{dir}{n}` in namespace "data"; `on_disk`: the store's own copy
/// of an object, where it keeps one (an oracle independent of the agent).
async fn agent_works_against(stack: Stack, dir: &str, on_disk: impl Fn(&str) -> Option<Vec<u8>>) {
    let c = stack.client().await;
    let sizes = [0usize, 1000, (2 << 20) + 3, (11 << 20) + 7];
    let r = c.register(12 << 20).await.unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(n, 40 + i as u64);
        r.write_at(0, &data).unwrap();
        let path = format!("data/{dir}{n}");
        let t = c.put(&path, &r, 0, n as u64).await.unwrap();
        assert_eq!(t.parts, if n > 6 << 20 { n.div_ceil(5 << 20) as u32 } else { 1 });
        if let Some(stored) = on_disk(&format!("{dir}{n}")) {
            assert_eq!(sha256(&stored), sha256(&data));
        }
        r.write_at(0, &vec![0; n]).unwrap();
        let g = c.get(&path, &r, 0, None).await.unwrap();
        assert_eq!(g.bytes, n as u64);
        assert_eq!(sha256(&r.as_slice()[..n]), sha256(&data), "{path}");
        if n > 10 {
            let g = c.get(&path, &r, 0, Some((3, Some(7)))).await.unwrap();
            assert_eq!(&r.as_slice()[..g.bytes as usize], &data[3..10]);
        }
        assert_eq!(c.head(&path).await.unwrap().size, n as u64);
    }
    let page = c.list_page(&format!("data/{dir}"), "", 2, "").await.unwrap();
    assert_eq!(page.objects.len(), 2);
    assert_eq!(c.list_all(&format!("data/{dir}")).await.unwrap().len(), sizes.len());
    c.delete(&format!("data/{dir}1000")).await.unwrap();
    assert_eq!(c.head(&format!("data/{dir}1000")).await.unwrap_err().code(), Some(Code::NoSuchKey));
    assert_eq!(c.get(&format!("data/{dir}none"), &r, 0, None).await.unwrap_err().code(), Some(Code::NoSuchKey));
}

#[tokio::test]
async fn agent_works_against_s3s_fs() {
    let (root, _guard, port) = start_s3s_fs();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        gateway: false,
        ..Default::default()
    });
    agent_works_against(stack, "tp/ü ", |key| std::fs::read(root.path().join("data").join(key)).ok()).await;
}

/// moto checks every signature against the IAM keys it issued (a request
/// signed with the wrong secret is refused; `sluice_tests::moto` checks).
/// Its checker re-encodes an already percent-encoded path or query value,
/// so it refuses boto3's own requests for keys or prefixes with characters
/// that need encoding (`ü`, space, `/` in a prefix): the keys here need none.
#[tokio::test]
async fn agent_works_against_moto_with_signature_checks() {
    let moto = sluice_tests::moto::start();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://127.0.0.1:{}", moto.port)],
        agent_credentials: (moto.access_key.clone(), moto.secret_key.clone()),
        gateway: false,
        ..Default::default()
    });
    agent_works_against(stack, "tp-plain-", |_| None).await;
}

/// The agent signing with a secret the store does not know is refused, and
/// says so (ACCESS_DENIED), not a hang or a retry storm.
#[tokio::test]
async fn a_wrong_secret_is_refused_by_moto() {
    let moto = sluice_tests::moto::start();
    let stack = Stack::with(Options {
        endpoints: vec![format!("http://127.0.0.1:{}", moto.port)],
        agent_credentials: (moto.access_key.clone(), "not-the-secret".into()),
        gateway: false,
        ..Default::default()
    });
    let c = stack.client().await;
    let e = c.head("data/anything").await.unwrap_err();
    assert_eq!(e.code(), Some(Code::AccessDenied), "{e}");
}

#[tokio::test]
async fn a_community_store_gains_an_rdma_data_path_through_the_gateway() {
    // s3s-fs knows nothing of RDMA; our gateway in front of it serves the
    // tokens and moves the upstream's bytes one-sidedly.
    let (root, _guard, port) = start_s3s_fs();
    let backend = format!(
        "[backend]\nkind = \"upstream\"\nendpoint = \"http://127.0.0.1:{port}\"\naccess_key = \"{ACCESS_KEY}\"\nsecret_key = \"{SECRET_KEY}\"\n"
    );
    let stack =
        Stack::with(Options { gateway_backend: backend, data_ns: "data_path = \"rdma\"".into(), ..Default::default() });
    let c = stack.client().await;
    let r = c.register(12 << 20).await.unwrap();
    for (i, n) in [5000usize, (3 << 20) + 1, (11 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 90 + i as u64);
        r.write_at(0, &data).unwrap();
        let t = c.put(&format!("data/up/{n}"), &r, 0, n as u64).await.unwrap();
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "{}", stack.log("sluice-gateway"));
        let on_disk = std::fs::read(root.path().join("data").join(format!("up/{n}"))).unwrap();
        assert_eq!(sha256(&on_disk), sha256(&data), "stored in the upstream");
        r.write_at(0, &vec![0; n]).unwrap();
        let g = c.get(&format!("data/up/{n}"), &r, 0, None).await.unwrap();
        assert_eq!((g.bytes, g.data_path), (n as u64, "rdma"));
        assert_eq!(sha256(&r.as_slice()[..n]), sha256(&data));
    }
    assert_eq!(c.list_all("data/up/").await.unwrap().len(), 3);
    assert!(!stack.stored_file("data", "up/5000").exists(), "nothing landed in the gateway's own directory");
}
