//! The file-based key provider: layout, permissions, rotation and caching.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::{pattern, TempDir, BUCKET, C, KEY, TENANT};
use sluice_crypt::{open_object, seal_object, CryptError, FileKeyProvider, KeyId, KeyProvider, ObjectSealer};

fn id(s: &str) -> KeyId {
    KeyId::new(s).unwrap()
}

fn chmod(path: &std::path::Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn create_key_writes_an_owner_only_hex_file() {
    let dir = TempDir::new("create");
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap();
    let path = dir.path().join(TENANT).join("k1");
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 65);
    assert!(text.ends_with('\n'));
    assert!(text[..64].bytes().all(|b| b.is_ascii_hexdigit()));

    let p = FileKeyProvider::new(dir.path()).unwrap();
    let (current, key) = p.current(TENANT).unwrap();
    assert_eq!(current, id("k1"));
    assert_eq!(key.to_hex(), text[..64]);

    // Never overwritten: that would orphan every object sealed under the old bytes.
    let err = FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap_err();
    assert!(matches!(&err, CryptError::KeyFile { path: p, .. } if *p == path), "{err}");
    assert_eq!(fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn group_or_world_readable_key_is_refused() {
    let dir = TempDir::new("mode");
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap();
    let path = dir.path().join(TENANT).join("k1");
    for mode in [0o644, 0o640, 0o604, 0o660] {
        chmod(&path, mode);
        let p = FileKeyProvider::new(dir.path()).unwrap();
        let err = p.get(TENANT, &id("k1")).unwrap_err();
        match &err {
            CryptError::KeyFileMode { path: p, mode: m } => {
                assert_eq!(p, &path);
                assert_eq!(*m, mode);
            }
            other => panic!("mode {mode:o}: expected KeyFileMode, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()) && msg.contains(&format!("{mode:04o}")), "{msg}");
        assert!(matches!(p.current(TENANT), Err(CryptError::KeyFileMode { .. })));
    }
    // Owner-only modes are fine, including read-only (as secret mounts often are).
    for mode in [0o600, 0o400] {
        chmod(&path, mode);
        FileKeyProvider::new(dir.path()).unwrap().get(TENANT, &id("k1")).unwrap();
    }
}

#[test]
fn malformed_key_files_are_refused_without_echoing_them() {
    let dir = TempDir::new("malformed");
    let tenant_dir = dir.path().join(TENANT);
    fs::create_dir_all(&tenant_dir).unwrap();
    let secretish = "ab".repeat(31) + "a"; // 63 hex digits
    let cases =
        [secretish.clone(), format!("{}zz", "ab".repeat(31)), format!("{}\n\n", "ab".repeat(32)), String::new()];
    for (i, content) in cases.iter().enumerate() {
        let path = tenant_dir.join(format!("bad{i}"));
        fs::write(&path, content).unwrap();
        chmod(&path, 0o600);
        let err = FileKeyProvider::new(dir.path()).unwrap().get(TENANT, &id(&format!("bad{i}"))).unwrap_err();
        assert!(matches!(&err, CryptError::KeyFile { path: p, .. } if *p == path), "{content:?}: {err:?}");
        assert!(!err.to_string().contains(&secretish[..20]), "{err}");
    }
    // Upper-case hex and no trailing newline are accepted.
    let path = tenant_dir.join("good");
    fs::write(&path, "AB".repeat(32)).unwrap();
    chmod(&path, 0o600);
    FileKeyProvider::new(dir.path()).unwrap().get(TENANT, &id("good")).unwrap();
}

#[test]
fn rotation_keeps_old_objects_readable() {
    let dir = TempDir::new("rotation");
    let p = FileKeyProvider::new(dir.path()).unwrap().with_current_ttl(Duration::ZERO);
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap();
    FileKeyProvider::set_current(dir.path(), TENANT, &id("k1")).unwrap();
    let old_plain = pattern(3 * C as usize + 5);
    let old = seal_object(&p, TENANT, BUCKET, KEY, &old_plain, C).unwrap();

    FileKeyProvider::create_key(dir.path(), TENANT, &id("k2")).unwrap();
    // Before `current` moves, new objects still use k1.
    assert_eq!(p.current(TENANT).unwrap().0, id("k1"));
    FileKeyProvider::set_current(dir.path(), TENANT, &id("k2")).unwrap();
    assert_eq!(fs::read_to_string(dir.path().join(TENANT).join("current")).unwrap(), "k2\n");

    let (header, sealer) = ObjectSealer::new(&p, TENANT, BUCKET, "new", 10, C).unwrap();
    assert_eq!(sealer.key_id(), &id("k2"));
    assert_eq!(&header[40..42], b"k2");
    assert_eq!(sealer.metadata().key_id, id("k2"));
    let new = seal_object(&p, TENANT, BUCKET, KEY, b"fresh", C).unwrap();

    assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &old).unwrap(), old_plain);
    assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &new).unwrap(), b"fresh");
    // A fresh provider (restarted agent) reads both as well.
    let restarted = FileKeyProvider::new(dir.path()).unwrap();
    assert_eq!(open_object(&restarted, TENANT, BUCKET, KEY, &old).unwrap(), old_plain);
    assert_eq!(restarted.current(TENANT).unwrap().0, id("k2"));
}

#[test]
fn current_is_cached_until_ttl_or_reload() {
    let dir = TempDir::new("ttl");
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap();
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k2")).unwrap();
    FileKeyProvider::set_current(dir.path(), TENANT, &id("k1")).unwrap();
    let p = FileKeyProvider::new(dir.path()).unwrap().with_current_ttl(Duration::from_secs(3600));
    assert_eq!(p.current(TENANT).unwrap().0, id("k1"));
    FileKeyProvider::set_current(dir.path(), TENANT, &id("k2")).unwrap();
    assert_eq!(p.current(TENANT).unwrap().0, id("k1"), "cached within the TTL");
    p.reload();
    assert_eq!(p.current(TENANT).unwrap().0, id("k2"));
}

#[test]
fn without_current_file_the_greatest_id_is_current() {
    let dir = TempDir::new("greatest");
    for k in ["2024-01", "2024-10", "2024-02"] {
        FileKeyProvider::create_key(dir.path(), TENANT, &id(k)).unwrap();
    }
    // Neither a directory nor a hidden file is a key.
    fs::create_dir(dir.path().join(TENANT).join("zz-dir")).unwrap();
    fs::write(dir.path().join(TENANT).join(".zz-tmp"), "x").unwrap();
    let p = FileKeyProvider::new(dir.path()).unwrap();
    assert_eq!(p.current(TENANT).unwrap().0, id("2024-10"));
}

#[test]
fn unknown_keys_and_tenants() {
    let dir = TempDir::new("unknown");
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k1")).unwrap();
    let p = FileKeyProvider::new(dir.path()).unwrap().with_current_ttl(Duration::ZERO);
    let err = p.get(TENANT, &id("nope")).unwrap_err();
    assert!(matches!(&err, CryptError::UnknownKey { tenant, key_id } if tenant == TENANT && key_id == "nope"));
    assert!(matches!(p.current("nobody"), Err(CryptError::NoCurrentKey { .. })));
    assert!(matches!(p.current("../etc"), Err(CryptError::InvalidName { .. })));
    let err = FileKeyProvider::set_current(dir.path(), TENANT, &id("nope")).unwrap_err();
    assert!(matches!(err, CryptError::UnknownKey { .. }));

    // An object whose key was deleted reports the missing key, not corruption.
    let object = seal_object(&p, TENANT, BUCKET, KEY, b"data", C).unwrap();
    fs::remove_file(dir.path().join(TENANT).join("k1")).unwrap();
    p.reload();
    assert!(matches!(open_object(&p, TENANT, BUCKET, KEY, &object), Err(CryptError::UnknownKey { .. })));

    // `current` naming a missing key or holding garbage.
    fs::write(dir.path().join(TENANT).join("current"), "k9\n").unwrap();
    assert!(matches!(p.current(TENANT), Err(CryptError::UnknownKey { .. })));
    fs::write(dir.path().join(TENANT).join("current"), "../../etc/passwd").unwrap();
    assert!(matches!(p.current(TENANT), Err(CryptError::KeyFile { .. })));
    // A key added later is found without a reload (misses are not cached).
    FileKeyProvider::create_key(dir.path(), TENANT, &id("k9")).unwrap();
    fs::write(dir.path().join(TENANT).join("current"), "k9").unwrap();
    assert_eq!(p.current(TENANT).unwrap().0, id("k9"));
}

#[test]
fn root_must_be_a_directory() {
    let dir = TempDir::new("root");
    assert!(matches!(FileKeyProvider::new(dir.path().join("missing")), Err(CryptError::Io { .. })));
    let file = dir.path().join("file");
    fs::write(&file, "").unwrap();
    assert!(matches!(FileKeyProvider::new(&file), Err(CryptError::Io { .. })));
}
