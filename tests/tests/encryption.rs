//! Inline encryption end to end: namespace "data" is `aes-256-gcm`. Bytes
//! round-trip, the store holds only ciphertext, HEAD/LIST report plaintext
//! sizes, ranged reads across chunk boundaries match, key rotation keeps old
//! objects readable, and every kind of tampering makes the GET fail with
//! INTEGRITY (never partial success).
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::{Client, ClientError, Code};
use sluice_crypt::{FileKeyProvider, KeyId};
use sluice_tests::{boto3, pattern, sha256, Options, Stack};

const CHUNK: u64 = 64 << 10;
const TAG: u64 = 16;
const HEADER: u64 = 120;

struct Env {
    stack: Stack,
    keys: tempfile::TempDir,
}

fn env() -> Env {
    let keys = tempfile::tempdir().unwrap();
    FileKeyProvider::create_key(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
    FileKeyProvider::set_current(keys.path(), "alpha", &KeyId::new("k1").unwrap()).unwrap();
    let stack = Stack::with(Options {
        data_ns: format!("encryption = \"aes-256-gcm\"\nencryption_chunk_bytes = {CHUNK}"),
        agent_dataplane: format!("[encryption]\nkey_dir = \"{}\"", keys.path().display()),
        ..Default::default()
    });
    Env { stack, keys }
}

async fn put(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

async fn get(c: &Client, path: &str, len: usize) -> Result<Vec<u8>, ClientError> {
    let r = c.register(len.max(1) as u64).await.unwrap();
    let t = c.get(path, &r, 0, None).await?;
    assert_eq!(t.bytes, len as u64);
    Ok(r.as_slice()[..len].to_vec())
}

fn code(e: ClientError) -> Code {
    e.code().unwrap_or_else(|| panic!("expected a typed error, got {e}"))
}

fn ciphertext_len(n: u64) -> u64 {
    HEADER + n + TAG * n.div_ceil(CHUNK).max(1)
}

#[tokio::test]
async fn round_trip_ciphertext_at_rest_and_plaintext_sizes() {
    let e = env();
    let c = e.stack.client().await;
    // Up to 7 MiB: above the 6 MiB multipart threshold the upload is multipart.
    for (i, n) in [0usize, 1, 65_535, 65_536, 65_537, (3 << 20) + 5, (7 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 40 + i as u64);
        let key = format!("enc/o{n}");
        put(&c, &format!("data/{key}"), &data).await;
        assert_eq!(sha256(&get(&c, &format!("data/{key}"), n).await.unwrap()), sha256(&data), "{n}");
        let stored = std::fs::read(e.stack.stored_file("data", &key)).unwrap();
        assert_eq!(stored.len() as u64, ciphertext_len(n as u64), "{n}: stored size");
        assert_eq!(&stored[..4], b"SLCE");
        if n >= 64 {
            let window = &data[..64];
            assert!(!stored.windows(64).any(|w| w == window), "{n}: plaintext visible at rest");
        }
        assert_eq!(c.head(&format!("data/{key}")).await.unwrap().size, n as u64, "{n}: HEAD size");
    }
    let listed = c.list_all("data/enc/").await.unwrap();
    assert_eq!(listed.len(), 7);
    for o in listed {
        assert_eq!(o.size.to_string(), o.key.trim_start_matches("enc/o"), "LIST reports plaintext sizes");
    }
}

#[tokio::test]
async fn ranged_reads_across_chunk_boundaries() {
    let e = env();
    let c = e.stack.client().await;
    let n = 5 * CHUNK as usize + 777;
    let data = pattern(n, 9);
    put(&c, "data/ranged", &data).await;
    let r = c.register(n as u64).await.unwrap();
    let c64 = CHUNK;
    let mut cases =
        vec![(0, 1), (c64 - 1, 2), (c64, c64), (c64 - 5, 2 * c64 + 10), (n as u64 - 1, 1), (3, n as u64 - 3)];
    // Pseudo-random ranges (fixed seed) for the rest.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..30 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let start = x % n as u64;
        let len = 1 + (x >> 20) % (n as u64 - start);
        cases.push((start, len));
    }
    for (start, len) in cases {
        let t = c.get("data/ranged", &r, 0, Some((start, Some(len)))).await.unwrap();
        assert_eq!(t.bytes, len, "{start}+{len}");
        assert_eq!(&r.as_slice()[..len as usize], &data[start as usize..(start + len) as usize], "{start}+{len}");
    }
}

#[tokio::test]
async fn key_rotation_keeps_old_objects_readable() {
    let e = env();
    let c = e.stack.client().await;
    let old = pattern(100_000, 1);
    put(&c, "data/old", &old).await;
    FileKeyProvider::create_key(e.keys.path(), "alpha", &KeyId::new("k2").unwrap()).unwrap();
    FileKeyProvider::set_current(e.keys.path(), "alpha", &KeyId::new("k2").unwrap()).unwrap();
    // The agent re-reads `current` within about a second.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let new = pattern(100_000, 2);
    put(&c, "data/new", &new).await;
    let key_id = |k: &str| {
        let s = std::fs::read(e.stack.stored_file("data", k)).unwrap();
        String::from_utf8_lossy(&s[40..72]).trim_end_matches('\0').to_owned()
    };
    assert_eq!((key_id("old").as_str(), key_id("new").as_str()), ("k1", "k2"));
    assert_eq!(get(&c, "data/old", old.len()).await.unwrap(), old);
    assert_eq!(get(&c, "data/new", new.len()).await.unwrap(), new);
}

#[tokio::test]
async fn tampered_objects_fail_cleanly() {
    let e = env();
    let c = e.stack.client().await;
    let n = 3 * CHUNK as usize + 100;
    let data = pattern(n, 5);
    let file = |k: &str| e.stack.stored_file("data", k);
    let chunk_at = |i: u64| HEADER + i * (CHUNK + TAG);
    // Each tamper: a fresh object, modified on disk, then a GET that must fail.
    type Tamper = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Tamper)> = vec![
        ("ciphertext byte", Box::new(move |s| s[chunk_at(1) as usize + 10] ^= 1)),
        ("header byte (nonce prefix)", Box::new(|s| s[21] ^= 0x80)),
        ("header byte (wrapped key)", Box::new(|s| s[100] ^= 1)),
        ("tag byte", Box::new(move |s| s[(chunk_at(1) + CHUNK) as usize + 3] ^= 1)),
        ("truncated mid-chunk", Box::new(|s| s.truncate(s.len() - 50))),
        ("last chunk dropped", Box::new(move |s| s.truncate(chunk_at(3) as usize))),
        (
            "two chunks swapped",
            Box::new(move |s| {
                let (a, b) = (chunk_at(0) as usize, chunk_at(1) as usize);
                let len = (CHUNK + TAG) as usize;
                let first: Vec<u8> = s[a..a + len].to_vec();
                s.copy_within(b..b + len, a);
                s[b..b + len].copy_from_slice(&first);
            }),
        ),
    ];
    let r = c.register(n as u64).await.unwrap();
    for (i, (what, tamper)) in cases.iter().enumerate() {
        let key = format!("t{i}");
        put(&c, &format!("data/{key}"), &data).await;
        let mut stored = std::fs::read(file(&key)).unwrap();
        tamper(&mut stored);
        std::fs::write(file(&key), &stored).unwrap();
        r.write_at(0, &vec![0xee; n]).unwrap();
        let err = c.get(&format!("data/{key}"), &r, 0, None).await.expect_err(what);
        assert_eq!(code(err), Code::Integrity, "{what}");
        // A ranged read of an untouched-looking first chunk fails too when
        // the header or the stored length was changed.
        if what.starts_with("header") || what.starts_with("truncated") || what.starts_with("last") {
            let err = c.get(&format!("data/{key}"), &r, 0, Some((0, Some(10)))).await.expect_err(what);
            assert_eq!(code(err), Code::Integrity, "{what} (ranged)");
        }
    }
    // Copied to another key (metadata and all) by the store: the object is
    // bound to its key, so it does not open there; the original still does.
    put(&c, "data/orig", &data).await;
    boto3(e.stack.gateway_addr.unwrap(), &["copy", "data", "orig", "copied"]);
    assert!(file("copied").exists());
    assert_eq!(code(c.get("data/copied", &r, 0, None).await.unwrap_err()), Code::Integrity);
    assert_eq!(get(&c, "data/orig", n).await.unwrap(), data);
    // A plaintext object where ciphertext must be (written by the
    // unencrypted "plain" namespace over the same bucket): refused.
    put(&c, "plain/sneaky", &data).await;
    assert_eq!(code(c.get("data/sneaky", &r, 0, None).await.unwrap_err()), Code::Integrity);
}
