//! The S3 stores the agent's operations run against — our gateway, s3s-fs
//! (`cargo install s3s-fs@0.14.1 --features binary --locked`) and moto with
//! its IAM signature checks on (`pip install moto[server]`); scripts/test
//! installs both; with the feature `ceph`, also Ceph RGW (`crate::ceph`,
//! the Ceph lane of scripts/test) — each with a stack in front of it and
//! oracles that do not go through Sluice: boto3 with the store's own keys,
//! and the store's files where it keeps objects as files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{boto3_as, Options, Stack, ACCESS_KEY, SECRET_KEY};

/// Which store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// sluice-gateway over its own directory.
    Gateway,
    /// s3s-fs over a directory (a community S3 server checking SigV4).
    S3sFs,
    /// moto, checking every signature against keys its IAM issued.
    Moto,
    /// Ceph RGW 16.2: a tenant of its own on the test binary's cluster,
    /// namespace "data" over both gateways.
    Rgw,
}

/// What keeps a third-party store running (each stops on drop).
enum Guard {
    None,
    S3sFs(S3sFs),
    /// Kept for its drop.
    Moto(#[allow(dead_code)] crate::moto::Moto),
    /// The shared cluster outlives the test; the tenant names its requests
    /// in the gateways' logs.
    Rgw(crate::ceph::Tenant),
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Guard::Rgw(tenant) = self {
            if std::thread::panicking() {
                tenant.print_requests();
            }
        }
    }
}

/// A running s3s-fs over a temporary directory. Stopped on drop.
pub struct S3sFs {
    child: std::process::Child,
    pub port: u16,
    /// The directory it serves: a directory per bucket, a file per object.
    pub root: tempfile::TempDir,
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store with a Sluice stack (gateway only for [`StoreKind::Gateway`],
/// agent, shim) in front of it. Namespaces "data" and "scoped" (prefix
/// `tenants/alpha/`) are in its bucket "data".
pub struct StoreUnderTest {
    pub kind: StoreKind,
    pub stack: Stack,
    /// The store's S3 address.
    pub addr: SocketAddr,
    keys: (String, String),
    guard: Guard,
}

impl StoreUnderTest {
    pub fn start(kind: StoreKind) -> Self {
        Self::with(kind, |o| o)
    }

    /// Starts `kind` and a stack shaped by `opts` (given the defaults with
    /// the store's endpoint and keys); `opts` may put proxies in front.
    pub fn with(kind: StoreKind, opts: impl FnOnce(Options) -> Options) -> Self {
        let (addr, endpoints, keys, guard) = match kind {
            StoreKind::Gateway => {
                let stack = Stack::with(opts(Options::default()));
                let addr = stack.gateway_addr.expect("the gateway runs");
                let keys = (ACCESS_KEY.to_owned(), SECRET_KEY.to_owned());
                return Self { kind, stack, addr, keys, guard: Guard::None };
            }
            StoreKind::S3sFs => {
                let fs = start_s3s_fs();
                let addr = SocketAddr::from(([127, 0, 0, 1], fs.port));
                (addr, vec![format!("http://{addr}")], (ACCESS_KEY.to_owned(), SECRET_KEY.to_owned()), Guard::S3sFs(fs))
            }
            StoreKind::Moto => {
                let moto = crate::moto::start();
                let addr = SocketAddr::from(([127, 0, 0, 1], moto.port));
                let keys = (moto.access_key.clone(), moto.secret_key.clone());
                (addr, vec![format!("http://{addr}")], keys, Guard::Moto(moto))
            }
            StoreKind::Rgw => {
                let cluster = crate::ceph::CephCluster::shared();
                let tenant = cluster.tenant();
                let keys = (tenant.access_key.clone(), tenant.secret_key.clone());
                (cluster.endpoints[0], cluster.urls(), keys, Guard::Rgw(tenant))
            }
        };
        let stack = Stack::with(opts(Options {
            endpoints,
            agent_credentials: keys.clone(),
            gateway: false,
            scoped_prefix: format!("tenants{sep}alpha{sep}", sep = separator(kind)),
            ..Default::default()
        }));
        Self { kind, stack, addr, keys, guard }
    }

    /// The store's access key and secret.
    pub fn keys(&self) -> (String, String) {
        self.keys.clone()
    }

    /// boto3 against the store with its own keys (see `oracle/s3_oracle.py`).
    pub fn boto3(&self, args: &[&str]) -> String {
        boto3_as(self.addr, (&self.keys.0, &self.keys.1), args)
    }

    /// `bucket/key` as the store keeps it on disk, for stores that keep
    /// objects as files (`None` for moto, which keeps them in memory).
    pub fn on_disk(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let path = match &self.guard {
            Guard::None => self.stack.stored_file(bucket, key),
            Guard::S3sFs(fs) => fs.root.path().join(bucket).join(key),
            Guard::Moto(_) | Guard::Rgw(_) => return None,
        };
        std::fs::read(path).ok()
    }

    /// Whether the store takes keys that need percent-encoding. moto's
    /// checker re-encodes an already encoded path or query value, so it
    /// refuses even boto3's own requests for keys with `ü` or a space.
    pub fn takes_any_key(&self) -> bool {
        self.kind != StoreKind::Moto
    }

    /// The "directory" separator for keys that are listed by prefix or
    /// delimiter: `/`, except for moto, which refuses a `/` in a query
    /// value (for the reason above) and so gets `-`.
    pub fn separator(&self) -> char {
        separator(self.kind)
    }

    /// alpha's namespace "scoped" keeps its keys under this prefix.
    pub fn scoped_prefix(&self) -> String {
        format!("tenants{sep}alpha{sep}", sep = self.separator())
    }
}

fn separator(kind: StoreKind) -> char {
    if kind == StoreKind::Moto {
        '-'
    } else {
        '/'
    }
}

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

/// Starts s3s-fs on a free port with buckets "data" and "other", checking
/// signatures against the test keys.
pub fn start_s3s_fs() -> S3sFs {
    let root = tempfile::tempdir().expect("tempdir");
    for b in ["data", "other"] {
        std::fs::create_dir_all(root.path().join(b)).expect("bucket dir");
    }
    let log = root.path().join("s3s-fs.log");
    // s3s-fs only logs its address, so pick a free port first.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let child = Command::new(s3s_fs_binary())
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS_KEY])
        .args(["--secret-key", SECRET_KEY])
        .arg(root.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start s3s-fs");
    let fs = S3sFs { child, port, root };
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "s3s-fs did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    fs
}

/// Runs each listed `async fn(StoreKind)` test body against every store:
/// `gateway::name`, `s3s_fs::name` and `moto::name`; with the feature
/// `ceph` also `rgw::name` (the Ceph lane runs those).
#[macro_export]
macro_rules! against_every_store {
    ($($name:ident),* $(,)?) => {
        mod gateway {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::stores::StoreKind::Gateway).await
            })*
        }
        mod s3s_fs {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::stores::StoreKind::S3sFs).await
            })*
        }
        mod moto {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::stores::StoreKind::Moto).await
            })*
        }
        #[cfg(feature = "ceph")]
        mod rgw {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::stores::StoreKind::Rgw).await
            })*
        }
    };
}
