//! The gateway as an S3 server, judged by boto3 and the AWS CRT client
//! (`tests/oracle/s3_conformance.py`): hostile and fuzzed keys stored
//! faithfully or refused with a 400, never outside their bucket; suffix
//! ranges; url-encoded listings; ETags in listings (the CRT client lists
//! them); NoSuchBucket / InvalidAccessKeyId; quiet deletes; conditional
//! reads and writes; checksums kept and returned; multipart rules; copies
//! and bucket operations. Then the store's directory must hold nothing but
//! its buckets and its own (empty) bookkeeping.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::path::Path;
use std::process::Command;

use sluice_tests::{Stack, ACCESS_KEY, SECRET_KEY};

/// Every file below `dir` (paths relative to it).
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

#[test]
fn the_gateway_behaves_as_s3_for_boto3_and_the_crt_client() {
    let stack = Stack::start();
    let gw = stack.gateway_addr.expect("gateway");
    let python = std::env::var("SLUICE_TEST_PYTHON").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python").to_string_lossy().into_owned()
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle/s3_conformance.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([&format!("http://{gw}"), ACCESS_KEY, SECRET_KEY, "other", "1"])
        .output()
        .unwrap_or_else(|e| panic!("running {python}: {e} (scripts/test creates .venv; or set SLUICE_TEST_PYTHON)"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(out.status.success(), "S3 conformance failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let summary = stdout.lines().find(|l| l.starts_with("checks=")).expect("summary line");
    sluice_tests::report(&format!("gateway-s3: {summary}"));

    // Nothing escaped the bucket, nothing was left behind: only the
    // buckets and the store's bookkeeping directories remain.
    let mut top: Vec<String> =
        std::fs::read_dir(&stack.data_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    top.sort();
    assert_eq!(top, [".sluice", "data", "other"], "the data directory holds something else");
    assert!(!stack.data_dir.parent().unwrap().join("x").exists(), "a key escaped the data directory");
    let left: Vec<String> =
        files(&stack.data_dir).into_iter().filter(|f| !f.starts_with(".sluice/meta/data/")).collect();
    assert!(left.is_empty(), "left behind after every object was deleted: {left:?}");
    let dirs_left: Vec<_> = std::fs::read_dir(stack.data_dir.join("other")).unwrap().collect();
    assert!(dirs_left.is_empty(), "empty directories left in the bucket: {dirs_left:?}");
}
