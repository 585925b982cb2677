//! The `sluice` CLI as a user runs it: `up`, object commands, `demo`, `down`.
//! Includes the 256 MiB byte-exact round trip through `sluice put`/`get`.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::Path;
use std::process::Command;

use sluice_tests::{bin, bin_dir, pattern, print_logs_after_failure, sha256};

fn sluice(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin("sluice"))
        .args(["--socket", dir.join("run/shim.sock").to_str().unwrap()])
        .args(args)
        .output()
        .expect("run sluice");
    assert!(
        out.status.success(),
        "sluice {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stops the stack; after a failure, first shows its logs.
struct Down<'a>(&'a Path);
impl Drop for Down<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_logs_after_failure(self.0);
        }
        let _ = Command::new(bin("sluice")).args(["down", "--dir", self.0.to_str().unwrap()]).output();
    }
}

/// `sluice up --json` in `dir`; its JSON answer.
fn up(dir: &Path) -> serde_json::Value {
    let up = Command::new(bin("sluice"))
        .args(["up", "--dir", dir.to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(up.status.success(), "sluice up failed: {}", String::from_utf8_lossy(&up.stderr));
    serde_json::from_slice(&up.stdout).unwrap()
}

#[test]
fn up_put_get_ls_stat_rm_demo_down() {
    let tmp = tempfile::Builder::new().prefix("cli").tempdir_in("/tmp").unwrap();
    let dir = tmp.path().join("stack");
    let _down = Down(&dir);
    let info = up(&dir);
    assert_eq!(info["tenant"], "default");
    // Every daemon's operations endpoint is on, and `up` says where.
    for daemon in ["gateway", "agent", "shim"] {
        let url = info["ops"][daemon].as_str().unwrap_or_else(|| panic!("no ops.{daemon} in {info}"));
        let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
        let t0 = std::time::Instant::now();
        loop {
            let (status, body) = sluice_tests::ready_at(addr);
            if status == 200 {
                break;
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{daemon} /ready: {status} {body}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    // A second `up` in the same directory refuses.
    let again = Command::new(bin("sluice"))
        .args(["up", "--dir", dir.to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));

    // 256 MiB, byte-exact.
    let src = tmp.path().join("big.bin");
    let data = pattern(256 << 20, 2026);
    std::fs::write(&src, &data).unwrap();
    let put: serde_json::Value =
        serde_json::from_str(&sluice(&dir, &["--json", "put", src.to_str().unwrap(), "data/big/256MiB.bin"])).unwrap();
    assert_eq!(put["bytes"], 256u64 << 20);
    // The bytes to compare with are in memory; keep the disk footprint small.
    std::fs::remove_file(&src).unwrap();
    let dst = tmp.path().join("back.bin");
    let get: serde_json::Value =
        serde_json::from_str(&sluice(&dir, &["--json", "get", "data/big/256MiB.bin", dst.to_str().unwrap()])).unwrap();
    assert_eq!(get["bytes"], 256u64 << 20);
    assert_eq!(get["data_path"], "http");
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(sha256(&back), sha256(&data), "256 MiB round trip must be byte-exact");
    drop(back);

    // Ranged get to stdout.
    let out = Command::new(bin("sluice"))
        .args([
            "--socket",
            dir.join("run/shim.sock").to_str().unwrap(),
            "get",
            "data/big/256MiB.bin",
            "-",
            "--range",
            "100-199",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, &data[100..200]);

    let ls = sluice(&dir, &["ls", "data/big/"]);
    assert!(ls.contains("data/big/256MiB.bin") && ls.contains("268435456"), "{ls}");
    let stat: serde_json::Value =
        serde_json::from_str(&sluice(&dir, &["--json", "stat", "data/big/256MiB.bin"])).unwrap();
    assert_eq!(stat["size"], 256u64 << 20);
    sluice(&dir, &["rm", "data/big/256MiB.bin"]);
    assert!(!sluice(&dir, &["ls", "data"]).contains("256MiB"));

    // The quickstart's job, small.
    let demo: serde_json::Value =
        serde_json::from_str(&sluice(&dir, &["--json", "demo", "--objects", "12", "--max-mib", "8"])).unwrap();
    assert_eq!(demo["all_verified"], true, "{demo}");
    assert_eq!(demo["rows"][1]["verified"], 12);

    // A clear error for a missing object.
    let miss = Command::new(bin("sluice"))
        .args(["--socket", dir.join("run/shim.sock").to_str().unwrap(), "stat", "data/nope"])
        .output()
        .unwrap();
    assert!(!miss.status.success());
    assert!(String::from_utf8_lossy(&miss.stderr).contains("NoSuchKey"), "{}", String::from_utf8_lossy(&miss.stderr));

    let down = Command::new(bin("sluice")).args(["down", "--dir", dir.to_str().unwrap()]).output().unwrap();
    assert!(down.status.success());
    assert!(
        !dir.join("run/shim.sock").exists()
            || std::os::unix::net::UnixStream::connect(dir.join("run/shim.sock")).is_err()
    );
}

/// `sluice bench` (one request per object, and `--batch`: `get_many`)
/// reads every object it uploaded, byte counts checked, and reports it.
#[test]
fn bench_reads_every_object_with_and_without_batches() {
    let tmp = tempfile::Builder::new().prefix("clib").tempdir_in("/tmp").unwrap();
    let dir = tmp.path().join("stack");
    let _down = Down(&dir);
    up(&dir);
    for batch in [false, true] {
        let mut args = vec!["--json", "bench", "--small", "24", "--kib64", "8", "--medium", "0", "--large", "0"];
        args.extend(["--concurrency", "1,6", "--repeats", "1"]);
        if batch {
            args.push("--batch");
        }
        let out: serde_json::Value = serde_json::from_str(&sluice(&dir, &args)).unwrap();
        let cells = out["cells"].as_array().expect("cells");
        assert_eq!(cells.len(), 4, "2 sizes x 2 concurrencies: {out}");
        for c in cells {
            let n = c["objects"].as_u64().unwrap();
            assert_eq!(n, if c["size"] == "4KiB" { 24 } else { 8 });
            assert_eq!(c["data_paths"]["http"].as_u64(), Some(n), "every object read once over HTTP: {c}");
            assert_eq!(c["fallbacks"], 0);
            assert!(c["median"]["objects_per_s"].as_f64().unwrap() > 0.0);
        }
    }
}

/// `sluice up --tcp`: the DPU layout on one machine — the shim reaches the
/// agent over TCP with mutual TLS, certificates issued into `<dir>/tls`
/// (keys 0600) and reused by the next `up`.
#[test]
fn up_over_tcp_speaks_mutual_tls() {
    let tmp = tempfile::Builder::new().prefix("cli").tempdir_in("/tmp").unwrap();
    let dir = tmp.path().join("stack");
    let _down = Down(&dir);
    let up = |tcp: &[&str]| {
        let out = Command::new(bin("sluice"))
            .args(["up", "--dir", dir.to_str().unwrap(), "--bin-dir", bin_dir().to_str().unwrap(), "--json"])
            .args(tcp)
            .output()
            .unwrap();
        assert!(out.status.success(), "sluice up failed: {}", String::from_utf8_lossy(&out.stderr));
    };
    up(&["--tcp"]);
    for key in ["ca.key", "agent.key", "shim-default.key"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("tls").join(key)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let shim = std::fs::read_to_string(dir.join("shim.toml")).unwrap();
    assert!(shim.contains("grpc = \"https://127.0.0.1:"), "{shim}");
    let src = tmp.path().join("f.bin");
    let data = pattern((1 << 20) + 7, 9);
    std::fs::write(&src, &data).unwrap();
    sluice(&dir, &["put", src.to_str().unwrap(), "data/tls.bin"]);
    let dst = tmp.path().join("back.bin");
    sluice(&dir, &["get", "data/tls.bin", dst.to_str().unwrap()]);
    assert_eq!(sha256(&std::fs::read(&dst).unwrap()), sha256(&data));
    // Down and up again: the CA is reused, the data is still readable.
    let ca = std::fs::read(dir.join("tls/ca.crt")).unwrap();
    let down = Command::new(bin("sluice")).args(["down", "--dir", dir.to_str().unwrap()]).output().unwrap();
    assert!(down.status.success());
    up(&["--tcp"]);
    assert_eq!(std::fs::read(dir.join("tls/ca.crt")).unwrap(), ca, "the CA is kept");
    assert!(sluice(&dir, &["ls", "data"]).contains("data/tls.bin"));
}
