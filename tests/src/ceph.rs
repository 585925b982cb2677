//! Ceph RGW as a store for the tests: a throwaway one-host cluster (one
//! mon, mgr and OSD, two radosgw on loopback ports) that `scripts/ceph`
//! starts under a temporary directory. Needs Debian's `ceph-mon ceph-mgr
//! ceph-osd radosgw` (`scripts/ceph install`); without them the test fails
//! with that command.
//!
//! One cluster serves every test of a test binary ([`CephCluster::shared`],
//! about 6 s to start); each test gets its own RGW tenant
//! ([`CephCluster::tenant`]), whose buckets "data" and "other" no other
//! test sees. A test that kills or hangs a gateway starts its own cluster
//! ([`CephCluster::start`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// A running cluster. [`CephCluster::start`]'s is stopped (and its
/// directory removed) on drop; the shared one when the test binary exits
/// (`scripts/ceph up --owner`).
pub struct CephCluster {
    dir: PathBuf,
    /// The radosgw S3 endpoints (gateway N is `endpoints[N - 1]`).
    pub endpoints: Vec<SocketAddr>,
    /// The S3 user `scripts/ceph up` created, with buckets "data" and "other".
    pub access_key: String,
    pub secret_key: String,
    /// Seconds from `scripts/ceph up` to both gateways serving.
    pub startup_s: f64,
    stop_on_drop: bool,
}

impl std::fmt::Debug for CephCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CephCluster")
            .field("dir", &self.dir)
            .field("endpoints", &self.endpoints)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .finish()
    }
}

/// An S3 user in its own RGW tenant, with buckets "data" and "other" of its
/// own (RGW resolves a bucket name within the signer's tenant).
#[derive(Clone)]
pub struct Tenant {
    /// RGW's name for it, `tenant$user` (how its requests appear in the
    /// gateways' logs).
    pub user: String,
    pub access_key: String,
    pub secret_key: String,
    /// The gateway logs to search when the test fails.
    logs: Vec<PathBuf>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("user", &self.user).field("access_key", &self.access_key).finish()
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph")
}

const INSTALL: &str =
    "scripts/ceph install (apt-get install --no-install-recommends ceph-mon ceph-mgr ceph-osd radosgw)";

/// Runs `scripts/ceph ARGS` and returns its stdout; a failure fails the test
/// with the script's message.
fn run(args: &[&str]) -> String {
    let out =
        Command::new(script()).args(args).output().unwrap_or_else(|e| panic!("running {}: {e}", script().display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scripts/ceph {} failed ({}):\n{stderr}{}",
        args.join(" "),
        out.status,
        if stderr.contains("missing ") { format!("\nInstall Ceph with: {INSTALL}") } else { String::new() }
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The packages `scripts/ceph` runs; missing ones fail the test with the
/// install command (never a silent skip).
fn check_installed() {
    let missing: Vec<&str> = ["ceph-mon", "ceph-mgr", "ceph-osd", "radosgw", "radosgw-admin", "curl"]
        .into_iter()
        .filter(|b| !["/usr/bin", "/usr/sbin", "/bin", "/sbin"].iter().any(|d| Path::new(d).join(b).exists()))
        .collect();
    assert!(missing.is_empty(), "Ceph is not installed ({} missing): run `{INSTALL}`", missing.join(", "));
}

fn parse_json(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("scripts/ceph printed {text:?}: {e}"))
}

fn string(v: &serde_json::Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("no {key:?} in {v}")).to_owned()
}

impl CephCluster {
    /// A cluster of this test's own, stopped on drop (for tests that kill or
    /// hang gateways).
    pub fn start() -> Self {
        Self::up(true)
    }

    /// The cluster of this test binary, started by the first test that asks
    /// and stopped by `scripts/ceph` itself once this process has exited
    /// (statics are never dropped).
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<CephCluster> = OnceLock::new();
        SHARED.get_or_init(|| Self::up(false))
    }

    /// `scripts/ceph up`, with this process as the owner: should it die
    /// without dropping the cluster (a static, a SIGKILL at the lane's time
    /// limit), the script's watcher stops the cluster and removes its
    /// directory.
    fn up(stop_on_drop: bool) -> Self {
        check_installed();
        // Short: the daemons' admin sockets live in it (108-byte limit).
        let dir = tempfile::Builder::new().prefix("ceph").tempdir_in(std::env::temp_dir()).expect("tempdir").keep();
        let dir_s = dir.to_str().expect("utf8 temp dir").to_owned();
        let owner = std::process::id().to_string();
        // --block-dir auto: the OSD's block file goes to /dev/shm when the
        // temp dir's disk lacks room for it (a nearly full CI disk).
        let v = parse_json(&run(&["up", "--dir", &dir_s, "--json", "--owner", &owner, "--block-dir", "auto"]));
        let endpoints = v["endpoints"]
            .as_array()
            .expect("endpoints")
            .iter()
            .map(|e| {
                let e = e.as_str().expect("endpoint string");
                e.trim_start_matches("http://").parse().unwrap_or_else(|err| panic!("endpoint {e}: {err}"))
            })
            .collect::<Vec<SocketAddr>>();
        assert_eq!(endpoints.len(), 2, "two gateways: {v}");
        let cluster = Self {
            dir,
            endpoints,
            access_key: string(&v, "access_key"),
            secret_key: string(&v, "secret_key"),
            startup_s: v["startup_s"].as_f64().unwrap_or(0.0),
            stop_on_drop,
        };
        crate::report(&format!(
            "ceph: cluster up in {:.1} s at {} (gateways {} and {})",
            cluster.startup_s,
            cluster.dir.display(),
            cluster.endpoints[0],
            cluster.endpoints[1]
        ));
        cluster
    }

    /// The directory holding the cluster (config, data, `log/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The endpoints as URLs, for a namespace's `endpoints`.
    pub fn urls(&self) -> Vec<String> {
        self.endpoints.iter().map(|a| format!("http://{a}")).collect()
    }

    /// A new user in a new tenant, with its own buckets "data" and "other".
    /// Named after the test thread (the test's name) and a counter, so its
    /// requests can be picked out of the gateways' logs.
    pub fn tenant(&self) -> Tenant {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let test = std::thread::current().name().unwrap_or("t").rsplit("::").next().unwrap_or("t").to_owned();
        // RGW takes only alphanumerics and `_` in a tenant's name.
        let mut name: String =
            test.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        name.truncate(24);
        let name = format!("t{n}_{}", name.trim_matches('_'));
        let dir = self.dir.to_str().expect("utf8");
        let v = parse_json(&run(&["user", "--dir", dir, &name, "--bucket", "data", "--bucket", "other", "--json"]));
        Tenant {
            user: format!("{name}${name}"),
            access_key: string(&v, "access_key"),
            secret_key: string(&v, "secret_key"),
            logs: (1..=self.endpoints.len()).map(|i| self.dir.join(format!("log/client.rgw.{i}.log"))).collect(),
        }
    }

    /// SIGKILLs gateway `n` (1 or 2).
    pub fn kill_rgw(&self, n: usize) {
        self.rgw("kill-rgw", n);
    }

    /// Stops gateway `n` with SIGTERM (SIGKILL after 5 s).
    pub fn stop_rgw(&self, n: usize) {
        self.rgw("stop-rgw", n);
    }

    /// Starts gateway `n` again on its port and waits until it serves.
    pub fn start_rgw(&self, n: usize) {
        self.rgw("start-rgw", n);
    }

    /// SIGSTOPs gateway `n`: connections open, nothing answered.
    pub fn hang_rgw(&self, n: usize) {
        self.rgw("hang-rgw", n);
    }

    /// SIGCONTs a hung gateway `n`.
    pub fn resume_rgw(&self, n: usize) {
        self.rgw("resume-rgw", n);
    }

    fn rgw(&self, what: &str, n: usize) {
        run(&[what, "--dir", self.dir.to_str().expect("utf8"), &n.to_string()]);
    }

    /// The last lines of the gateways' logs (for a failed test).
    pub fn print_logs(&self) {
        crate::print_logs_after_failure(&self.dir.join("log"));
    }
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        if !self.stop_on_drop {
            return;
        }
        if std::thread::panicking() {
            self.print_logs();
        }
        let _ = Command::new(script()).args(["down", "--remove", "--dir"]).arg(&self.dir).output();
    }
}

impl Tenant {
    /// Prints this tenant's requests as the gateways logged them (status
    /// and latency per request); for a failed test.
    pub fn print_requests(&self) {
        for log in &self.logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(&format!(" {} [", self.user))).collect();
            eprintln!("---- {}'s last requests in {} ----", self.user, log.display());
            for line in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{line}");
            }
        }
    }
}

/// Reads or replaces an object with boto3 (the independent client), keeping
/// its user metadata, so a test can look at or change what the store holds.
const RAW: &str = r#"
import boto3, json, sys
from botocore.config import Config
ep, ak, sk, cmd, bucket, key, path = sys.argv[1:8]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1", aws_access_key_id=ak, aws_secret_access_key=sk,
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
if cmd == "get":
    o = s3.get_object(Bucket=bucket, Key=key)
    open(path, "wb").write(o["Body"].read())
    print(json.dumps(o.get("Metadata", {})))
else:
    s3.put_object(Bucket=bucket, Key=key, Body=open(path, "rb").read(), Metadata=json.loads(sys.argv[8]))
    print("{}")
"#;

/// The bytes and user metadata (`x-amz-meta-` stripped) of `bucket/key` as
/// the store at `store` holds them, read with boto3.
pub fn raw_get(store: SocketAddr, keys: (&str, &str), bucket: &str, key: &str) -> (Vec<u8>, serde_json::Value) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let meta =
        python(&[&format!("http://{store}"), keys.0, keys.1, "get", bucket, key, file.path().to_str().expect("utf8")]);
    (std::fs::read(file.path()).expect("read back"), parse_json(&meta))
}

/// Replaces `bucket/key` in the store with `data` and user metadata `meta`.
pub fn raw_put(store: SocketAddr, keys: (&str, &str), bucket: &str, key: &str, data: &[u8], meta: &serde_json::Value) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), data).expect("write");
    python(&[
        &format!("http://{store}"),
        keys.0,
        keys.1,
        "put",
        bucket,
        key,
        file.path().to_str().expect("utf8"),
        &meta.to_string(),
    ]);
}

fn python(args: &[&str]) -> String {
    let python = std::env::var("SLUICE_TEST_PYTHON").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python").to_string_lossy().into_owned()
    });
    let out = Command::new(&python).args(["-c", RAW]).args(args).output().unwrap_or_else(|e| {
        panic!("running {python}: {e} (scripts/test creates .venv with boto3; or set SLUICE_TEST_PYTHON)")
    });
    assert!(out.status.success(), "boto3 failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
