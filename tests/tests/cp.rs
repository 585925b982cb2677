//! `sluice cp` against a real stack: trees up and down byte for byte
//! (judged by the gateway's own files and an independent CRC), a second run
//! that moves nothing (the agent's counters say so), a run SIGKILLed midway
//! that resumes, a changed file uploaded again, refusals named.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sluice_tests::{bin, pattern, report, Stack};

/// `sluice --json cp ARGS` with the journals in `state`, run in `cwd`.
fn cp_in(stack: &Stack, state: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin("sluice"))
        .current_dir(cwd)
        .env("SLUICE_CP_STATE_DIR", state)
        .env_remove("RUST_BACKTRACE")
        .args(["--socket", stack.socket.to_str().unwrap(), "--json", "cp"])
        .args(args)
        .output()
        .expect("run sluice cp")
}

/// As [`cp_in`] (in the directory holding `state`), which must succeed;
/// its JSON summary.
fn cp(stack: &Stack, state: &Path, args: &[&str]) -> serde_json::Value {
    let out = cp_in(stack, state, state.parent().unwrap(), args);
    assert!(
        out.status.success(),
        "sluice cp {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Every regular file under `root`: relative path -> bytes.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn crc64nvme(data: &[u8]) -> String {
    let mut d = sluice_dataplane::crc64::digest();
    d.update(data);
    format!("{:016x}", d.finalize())
}

/// Object bytes and PUT/GET requests the agent has served so far.
fn moved(stack: &Stack) -> (f64, f64, f64) {
    (
        stack.metric("sluice_agent_bytes_total", &[]),
        stack.metric("sluice_agent_requests_total", &["op=\"put\""]),
        stack.metric("sluice_agent_requests_total", &["op=\"get\""]),
    )
}

/// Asserts the gateway holds `files` under `prefix` of bucket "data",
/// byte for byte (its own files: an oracle independent of the agent).
fn assert_stored(stack: &Stack, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
    for (rel, data) in files {
        let stored = std::fs::read(stack.stored_file("data", &format!("{prefix}{rel}")))
            .unwrap_or_else(|e| panic!("{prefix}{rel} is not in the store: {e}"));
        assert!(stored == *data, "{prefix}{rel}: the store holds other bytes ({} vs {})", stored.len(), data.len());
    }
}

fn no_temp_files(root: &Path) {
    let left: Vec<String> = tree(root)
        .into_keys()
        .filter(|k| k.rsplit('/').next().is_some_and(|n| n.starts_with(".sluice-cp-") && n.ends_with(".tmp")))
        .collect();
    assert!(left.is_empty(), "temp files left behind: {left:?}");
}

#[test]
fn trees_round_trip_byte_exact_and_a_second_run_moves_nothing() {
    let stack = Stack::start();
    let tmp = tempfile::Builder::new().prefix("cp").tempdir_in("/tmp").unwrap();
    let (src, back, state) = (tmp.path().join("src"), tmp.path().join("back"), tmp.path().join("state"));
    write(&src, "top.txt", b"hello\n");
    write(&src, "a/empty", b"");
    write(&src, "a/b/c/deep.bin", &pattern(100_003, 1));
    // 20 MiB: a multipart PUT (the stack's threshold is 6 MiB, parts of 5 MiB).
    write(&src, "a/b/big.bin", &pattern(20 << 20, 2));
    write(&src, "ünïcødé/snow ☃.txt", "☃ ❄".as_bytes());
    write(&src, "日本語/ファイル.dat", &pattern(4097, 3));
    for i in 0..12 {
        write(&src, &format!("many/f{i:02}"), &pattern(1000 + i * 517, 10 + i as u64));
    }
    let files = tree(&src);
    let n = files.len() as u64;
    let total: u64 = files.values().map(|d| d.len() as u64).sum();

    let up = cp(&stack, &state, &["-r", src.to_str().unwrap(), "data/cp/tree/"]);
    assert_eq!(
        (up["objects"].as_u64(), up["bytes"].as_u64(), up["failed"].as_u64()),
        (Some(n), Some(total), Some(0)),
        "{up}"
    );
    assert_eq!(up["verified"], n, "every upload checked against its ETag: {up}");
    assert_eq!(up["manifest"], "data/cp/tree/.sluice-cp.json");
    assert_stored(&stack, "cp/tree/", &files);
    // The manifest names every file with its CRC64NVME, as computed here.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stack.stored_file("data", "cp/tree/.sluice-cp.json")).unwrap()).unwrap();
    let entries = manifest["objects"].as_object().unwrap();
    assert_eq!(entries.len() as u64, n, "{manifest}");
    for (rel, data) in &files {
        assert_eq!(entries[rel]["crc64nvme"], crc64nvme(data), "{rel}");
        assert_eq!(entries[rel]["size"], data.len() as u64, "{rel}");
    }

    // Again: everything skipped, not a byte or a PUT.
    let before = moved(&stack);
    let again = cp(&stack, &state, &["-r", src.to_str().unwrap(), "data/cp/tree/"]);
    assert_eq!(
        (again["objects"].as_u64(), again["skipped"].as_u64(), again["bytes"].as_u64()),
        (Some(0), Some(n), Some(0)),
        "{again}"
    );
    assert_eq!(moved(&stack), before, "a second upload moved bytes");

    let down = cp(&stack, &state, &["-r", "data/cp/tree/", back.to_str().unwrap()]);
    assert_eq!(
        (down["objects"].as_u64(), down["bytes"].as_u64(), down["failed"].as_u64()),
        (Some(n), Some(total), Some(0)),
        "{down}"
    );
    assert_eq!(down["verified"], n, "every download checked (the manifest's CRC64NVME): {down}");
    assert!(tree(&back) == files, "the tree downloaded differs from the one uploaded (or has extra files)");

    let before = moved(&stack);
    let again = cp(&stack, &state, &["-r", "data/cp/tree", back.to_str().unwrap()]);
    assert_eq!(
        (again["objects"].as_u64(), again["skipped"].as_u64(), again["bytes"].as_u64()),
        (Some(0), Some(n), Some(0)),
        "{again}"
    );
    assert_eq!(moved(&stack), before, "a second download moved bytes");

    // A file changed after its upload (same size, new mtime) goes again,
    // and only it; then its download replaces only it.
    let changed = src.join("many/f03");
    let old = std::fs::metadata(&changed).unwrap().modified().unwrap();
    let len = std::fs::metadata(&changed).unwrap().len() as usize;
    std::fs::write(&changed, pattern(len, 999)).unwrap();
    let f = std::fs::File::options().write(true).open(&changed).unwrap();
    f.set_modified(old + Duration::from_secs(3)).unwrap();
    drop(f);
    let up = cp(&stack, &state, &["-r", src.to_str().unwrap(), "data/cp/tree/"]);
    assert_eq!(
        (up["objects"].as_u64(), up["skipped"].as_u64(), up["bytes"].as_u64()),
        (Some(1), Some(n - 1), Some(len as u64)),
        "{up}"
    );
    let files = tree(&src);
    assert_stored(&stack, "cp/tree/", &files);
    let down = cp(&stack, &state, &["-r", "data/cp/tree/", back.to_str().unwrap()]);
    assert_eq!(
        (down["objects"].as_u64(), down["skipped"].as_u64(), down["verified"].as_u64()),
        (Some(1), Some(n - 1), Some(1)),
        "{down}"
    );
    assert!(tree(&back) == files);

    // One file each way; into a directory it keeps its name.
    let one = cp(&stack, &state, &[src.join("a/b/big.bin").to_str().unwrap(), "data/cp/single/"]);
    assert_eq!((one["objects"].as_u64(), one["verified"].as_u64()), (Some(1), Some(1)), "{one}");
    let one = cp(&stack, &state, &["data/cp/single/big.bin", tmp.path().to_str().unwrap()]);
    assert_eq!((one["objects"].as_u64(), one["verified"].as_u64()), (Some(1), Some(1)), "{one}");
    assert!(std::fs::read(tmp.path().join("big.bin")).unwrap() == files["a/b/big.bin"]);
    no_temp_files(tmp.path());
}

/// Spawns `sluice cp ARGS` and SIGKILLs it once `done()` says enough
/// objects are complete; fails if it finished first. Returns what `done`
/// counted at the kill.
fn kill_midway(stack: &Stack, state: &Path, args: &[&str], done: impl Fn() -> usize) -> usize {
    let mut child = Command::new(bin("sluice"))
        .current_dir(state.parent().unwrap())
        .env("SLUICE_CP_STATE_DIR", state)
        .args(["--socket", stack.socket.to_str().unwrap(), "--json", "cp", "--jobs", "2"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let n = done();
        if n >= 20 {
            assert!(
                child.try_wait().unwrap().is_none(),
                "sluice cp {args:?} finished before it could be killed midway"
            );
            child.kill().unwrap();
            child.wait().unwrap();
            return n;
        }
        assert!(child.try_wait().unwrap().is_none(), "sluice cp {args:?} exited after only {n} objects");
        assert!(t0.elapsed() < Duration::from_secs(60), "sluice cp {args:?} made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Regular files under `root` other than temp files, counted while a copy
/// writes there (what vanishes meanwhile is not counted).
fn count_files(root: &Path) -> usize {
    let mut n = 0;
    let mut dirs = vec![root.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(e.path()),
                Ok(t) if t.is_file() && !e.file_name().to_string_lossy().starts_with(".sluice-cp-") => n += 1,
                _ => {}
            }
        }
    }
    n
}

/// Objects the journal(s) in `state` record.
fn journaled(state: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(state) else { return 0 };
    dir.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|j| j["objects"].as_object().map_or(0, |o| o.len()))
        .sum()
}

#[test]
fn a_killed_copy_resumes_skipping_what_was_done() {
    let stack = Stack::start();
    let tmp = tempfile::Builder::new().prefix("cpk").tempdir_in("/tmp").unwrap();
    let (src, back) = (tmp.path().join("src"), tmp.path().join("back"));
    let (up_state, down_state) = (tmp.path().join("up-state"), tmp.path().join("down-state"));
    for i in 0..600u64 {
        write(&src, &format!("d{}/e{}/file-{i:04}", i % 7, i % 3), &pattern(4096 + (i as usize * 97) % 30_000, i));
    }
    let files = tree(&src);
    let n = files.len() as u64;

    let at_kill = kill_midway(&stack, &up_state, &["-r", src.to_str().unwrap(), "data/cpk/"], || journaled(&up_state));
    let up = cp(&stack, &up_state, &["-r", src.to_str().unwrap(), "data/cpk/"]);
    let (copied, skipped) = (up["objects"].as_u64().unwrap(), up["skipped"].as_u64().unwrap());
    assert!(skipped >= at_kill as u64, "{at_kill} were journaled at the kill, {skipped} skipped: {up}");
    assert!(copied > 0, "the killed run was not midway: {up}");
    assert_eq!((copied + skipped, up["failed"].as_u64()), (n, Some(0)), "{up}");
    assert_stored(&stack, "cpk/", &files);
    report(&format!("cp: upload of {n} killed with {at_kill} journaled; resumed: {skipped} skipped, {copied} copied"));

    let files_done = || count_files(&back);
    let at_kill = kill_midway(&stack, &down_state, &["-r", "data/cpk/", back.to_str().unwrap()], files_done);
    let down = cp(&stack, &down_state, &["-r", "data/cpk/", back.to_str().unwrap()]);
    let (copied, skipped) = (down["objects"].as_u64().unwrap(), down["skipped"].as_u64().unwrap());
    assert!(skipped >= at_kill as u64, "{at_kill} files were in place at the kill, {skipped} skipped: {down}");
    assert!(copied > 0, "the killed run was not midway: {down}");
    assert_eq!((copied + skipped, down["failed"].as_u64()), (n, Some(0)), "{down}");
    assert_eq!(down["verified"], copied, "{down}");
    no_temp_files(&back);
    assert!(tree(&back) == files, "the resumed download differs from the tree uploaded");
    report(&format!("cp: download of {n} killed with {at_kill} in place; resumed: {skipped} skipped, {copied} copied"));
}

#[test]
fn dangerous_and_ambiguous_paths_are_refused_by_name() {
    let stack = Stack::start();
    let tmp = tempfile::Builder::new().prefix("cpr").tempdir_in("/tmp").unwrap();
    let state = tmp.path().join("state");
    let src = tmp.path().join("src");
    write(&src, "ok.txt", b"fine");
    std::os::unix::fs::symlink("/etc/hostname", src.join("link")).unwrap();
    let file = src.join("ok.txt");
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    for dest in ["data/cpr/a/../b", "data//abs"] {
        let out = cp_in(&stack, &state, tmp.path(), &[file.to_str().unwrap(), dest]);
        assert!(!out.status.success(), "{dest} was accepted");
        assert!(stderr(&out).contains("refused") && stderr(&out).contains(&dest[5..]), "{dest}: {}", stderr(&out));
    }
    let out = cp_in(&stack, &state, tmp.path(), &["-r", src.to_str().unwrap(), "data/cpr/../x/"]);
    assert!(!out.status.success() && stderr(&out).contains("'..'"), "{}", stderr(&out));

    // A symlink in a tree is refused by name; the rest is copied, and the
    // run fails.
    let out = cp_in(&stack, &state, tmp.path(), &["-r", src.to_str().unwrap(), "data/cpr/tree/"]);
    assert!(!out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((summary["objects"].as_u64(), summary["failed"].as_u64()), (Some(1), Some(1)), "{summary}");
    let failure = &summary["failures"][0];
    assert!(
        failure["name"].as_str().unwrap().ends_with("src/link")
            && failure["error"].as_str().unwrap().contains("symbolic link"),
        "{failure}"
    );
    assert!(stderr(&out).contains("src/link"), "{}", stderr(&out));

    // A directory without -r, a prefix without -r, a missing object.
    let out = cp_in(&stack, &state, tmp.path(), &[src.to_str().unwrap(), "data/cpr/y"]);
    assert!(!out.status.success() && stderr(&out).contains("-r"), "{}", stderr(&out));
    let out = cp_in(&stack, &state, tmp.path(), &["data/cpr/tree", "/tmp/none"]);
    assert!(!out.status.success() && stderr(&out).contains("-r"), "{}", stderr(&out));
    let out = cp_in(&stack, &state, tmp.path(), &["data/cpr/nope", tmp.path().join("n").to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("NoSuchKey"), "{}", stderr(&out));
    assert!(!tmp.path().join("n").exists());

    // "data" both a namespace and a local directory: ambiguous.
    std::fs::create_dir(tmp.path().join("data")).unwrap();
    let out = cp_in(&stack, &state, tmp.path(), &[file.to_str().unwrap(), "data/cpr/x"]);
    assert!(!out.status.success() && stderr(&out).contains("ambiguous"), "{}", stderr(&out));
    let out = cp_in(&stack, &state, tmp.path(), &[file.to_str().unwrap(), "./data/x"]);
    assert!(!out.status.success() && stderr(&out).contains("neither"), "{}", stderr(&out));
}

/// A symbolic link already in the destination tree is not followed: the
/// keys that would land through it are refused by name, nothing is written
/// where it points, and the rest is copied.
#[test]
fn a_download_never_writes_through_a_link_in_the_destination() {
    let stack = Stack::start();
    let tmp = tempfile::Builder::new().prefix("cpl").tempdir_in("/tmp").unwrap();
    let state = tmp.path().join("state");
    let (src, dest, outside) = (tmp.path().join("src"), tmp.path().join("dest"), tmp.path().join("outside"));
    write(&src, "a/x", b"through the link");
    write(&src, "b/y", b"fine");
    cp(&stack, &state, &["-r", src.to_str().unwrap(), "data/cpl/"]);
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("a")).unwrap();
    let out = cp_in(&stack, &state, tmp.path(), &["-r", "data/cpl/", dest.to_str().unwrap()]);
    assert!(!out.status.success(), "a refused key fails the run");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failures = summary["failures"].to_string();
    assert!(failures.contains("cpl/a/x") && failures.contains("symbolic link"), "{summary}");
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing written through the link");
    assert_eq!(std::fs::read(dest.join("b/y")).unwrap(), b"fine");
}
