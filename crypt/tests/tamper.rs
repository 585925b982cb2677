//! Every way of modifying, cutting, rearranging or moving a sealed object must fail to open.

#![allow(clippy::unwrap_used)]

mod common;

use std::ops::Range;

use common::{pattern, provider, BUCKET, C, CU, KEY, TENANT};
use sluice_crypt::{
    open_object, seal_object, CryptError, KeyId, KeyProvider, Layout, MasterKey, MemoryKeyProvider, ObjectOpener,
    HEADER_LEN,
};

/// Three full chunks and a partial fourth.
const N: usize = 3 * CU + 1000;

// Header field regions as documented in docs/encryption-format.md.
const MAGIC: Range<usize> = 0..4;
const VERSION: usize = 4;
const CHUNK_SIZE: Range<usize> = 8..12;
const PLAINTEXT_LEN: Range<usize> = 12..20;
const NONCE_PREFIX: Range<usize> = 20..28;
const WRAP_NONCE: Range<usize> = 28..40;
const KEY_ID: Range<usize> = 40..72;
const WRAPPED_KEY: Range<usize> = 72..120;

fn sealed() -> (MemoryKeyProvider, Vec<u8>) {
    let p = provider();
    let object = seal_object(&p, TENANT, BUCKET, KEY, &pattern(N), C).unwrap();
    (p, object)
}

fn chunk(i: u32) -> Range<usize> {
    let r = Layout::new(N as u64, C).unwrap().chunk_ciphertext_range(i).unwrap();
    r.start as usize..r.end as usize
}

fn open(p: &dyn KeyProvider, object: &[u8]) -> Result<Vec<u8>, CryptError> {
    open_object(p, TENANT, BUCKET, KEY, object)
}

fn assert_integrity(result: Result<Vec<u8>, CryptError>, what: &str) {
    match result {
        Err(CryptError::Integrity) => {}
        other => panic!("{what}: expected Integrity, got {other:?}"),
    }
}

#[test]
fn untampered_object_opens() {
    let (p, object) = sealed();
    assert_eq!(open(&p, &object).unwrap(), pattern(N));
}

#[test]
fn flipped_ciphertext_byte_fails() {
    let (p, object) = sealed();
    for i in 0..4 {
        let r = chunk(i);
        for pos in [r.start, r.start + 500, r.end - 17] {
            let mut bad = object.clone();
            bad[pos] ^= 0x01;
            assert_integrity(open(&p, &bad), &format!("chunk {i} byte {pos}"));
        }
    }
}

#[test]
fn flipped_tag_byte_fails() {
    let (p, object) = sealed();
    for i in 0..4 {
        let r = chunk(i);
        for pos in [r.end - 16, r.end - 1] {
            let mut bad = object.clone();
            bad[pos] ^= 0x80;
            assert_integrity(open(&p, &bad), &format!("tag of chunk {i} byte {pos}"));
        }
    }
}

#[test]
fn every_flipped_header_byte_fails() {
    let (p, object) = sealed();
    for pos in 0..HEADER_LEN {
        for bit in [0x01u8, 0x80] {
            let mut bad = object.clone();
            bad[pos] ^= bit;
            let result = open(&p, &bad);
            let authenticated_region =
                [&PLAINTEXT_LEN, &NONCE_PREFIX, &WRAP_NONCE, &WRAPPED_KEY].iter().any(|r| r.contains(&pos));
            if authenticated_region {
                // Plaintext sizes this far off can also be rejected as impossible (BadHeader).
                match result {
                    Err(CryptError::Integrity) => {}
                    Err(CryptError::BadHeader(_)) if PLAINTEXT_LEN.contains(&pos) => {}
                    other => panic!("header byte {pos} ^ {bit:#x}: expected Integrity, got {other:?}"),
                }
            } else if MAGIC.contains(&pos) {
                assert!(matches!(result, Err(CryptError::BadHeader(_))), "magic byte {pos}: {result:?}");
            } else if pos == VERSION {
                assert!(matches!(result, Err(CryptError::UnsupportedVersion(_))), "version: {result:?}");
            } else {
                // Algorithm, key id length/bytes, reserved, chunk size: structurally bad, an unknown
                // key, or (if still well-formed) an authentication failure; never success.
                assert!(
                    matches!(
                        result,
                        Err(CryptError::BadHeader(_) | CryptError::UnknownKey { .. } | CryptError::Integrity)
                    ),
                    "header byte {pos} ^ {bit:#x}: {result:?}"
                );
            }
        }
    }
}

#[test]
fn valid_but_different_header_fields_fail_authentication() {
    let (p, object) = sealed();
    // Another valid chunk size: parses fine, so only authentication can catch it.
    let mut bad = object.clone();
    bad[CHUNK_SIZE].copy_from_slice(&8192u32.to_be_bytes());
    assert_integrity(open(&p, &bad), "chunk size 8192");
    // A smaller plaintext size with the object cut to match: the length check alone would pass.
    let mut bad = object[..object.len() - 1].to_vec();
    bad[PLAINTEXT_LEN].copy_from_slice(&(N as u64 - 1).to_be_bytes());
    assert_integrity(open(&p, &bad), "plaintext size - 1");
    // A key id that exists but is not the one that wrapped the data key.
    p.insert(TENANT, KeyId::new("k2").unwrap(), MasterKey::generate().unwrap()).unwrap();
    let mut bad = object.clone();
    bad[KEY_ID.start + 1] = b'2';
    assert_integrity(open(&p, &bad), "key id k2");
}

#[test]
fn truncation_fails() {
    let (p, object) = sealed();
    assert_integrity(open(&p, &object[..chunk(3).start]), "last chunk dropped");
    assert_integrity(open(&p, &object[..chunk(2).start]), "two chunks dropped");
    assert_integrity(open(&p, &object[..object.len() - 1]), "cut one byte");
    assert_integrity(open(&p, &object[..chunk(3).start + 100]), "cut mid final chunk");
    assert_integrity(open(&p, &object[..chunk(1).start + 100]), "cut mid chunk 1");
    assert_integrity(open(&p, &object[..HEADER_LEN]), "cut to the header");
    assert!(matches!(open(&p, &object[..HEADER_LEN - 1]), Err(CryptError::BadHeader(_))));
    assert!(matches!(open(&p, &[]), Err(CryptError::BadHeader(_))));
    let mut extended = object.clone();
    extended.extend_from_slice(&[0; 17]);
    assert_integrity(open(&p, &extended), "bytes appended");
}

#[test]
fn truncation_to_an_empty_object_fails() {
    let (p, object) = sealed();
    // Header + one bare tag is the shape of an empty object; with this header it must not open.
    let mut as_empty = object[..HEADER_LEN].to_vec();
    as_empty.extend_from_slice(&object[chunk(0).end - 16..chunk(0).end]);
    assert_integrity(open(&p, &as_empty), "cut to empty-object shape");
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &object[..HEADER_LEN]).unwrap();
    let mut tag = object[chunk(3).end - 16..chunk(3).end].to_vec();
    assert!(matches!(opener.open_chunk(3, &mut tag), Err(CryptError::Integrity)));
}

#[test]
fn swapped_chunks_fail() {
    let (p, object) = sealed();
    let mut bad = object.clone();
    let (a, b) = (chunk(0), chunk(1));
    bad[a.clone()].copy_from_slice(&object[b.clone()]);
    bad[b].copy_from_slice(&object[a]);
    assert_integrity(open(&p, &bad), "chunks 0 and 1 swapped");
}

#[test]
fn chunk_opened_at_another_index_fails() {
    let (p, object) = sealed();
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &object[..HEADER_LEN]).unwrap();
    for i in 0..4u32 {
        for j in 0..4u32 {
            let mut data = object[chunk(i)].to_vec();
            let result = opener.open_chunk(j, &mut data).map(|p| p.to_vec());
            if i == j {
                assert_eq!(result.unwrap(), pattern(N)[i as usize * CU..(i as usize * CU + CU).min(N)]);
            } else {
                assert_integrity(result, &format!("chunk {i} opened as {j}"));
            }
        }
    }
    let mut data = object[chunk(0)].to_vec();
    assert!(matches!(opener.open_chunk(4, &mut data), Err(CryptError::ChunkIndex { index: 4, count: 4 })));
}

#[test]
fn final_flag_is_authenticated() {
    // An object of exactly two full chunks: chunk 0 has the right length for position 1, so only
    // the index and final flag in the associated data tell them apart.
    let p = provider();
    let plain = pattern(2 * CU);
    let object = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &object[..HEADER_LEN]).unwrap();
    let first = HEADER_LEN..HEADER_LEN + CU + 16;
    let mut data = object[first].to_vec();
    assert!(matches!(opener.open_chunk(1, &mut data), Err(CryptError::Integrity)));
}

#[test]
fn object_copied_to_another_key_fails() {
    let (p, object) = sealed();
    for (bucket, key) in
        [(BUCKET, "2024/dog.jpg"), ("other", KEY), ("photos2", "024/cat.jpg"), ("photo", "s2024/cat.jpg")]
    {
        assert_integrity(open_object(&p, TENANT, bucket, key, &object), &format!("{bucket}/{key}"));
    }
}

#[test]
fn other_tenants_key_fails() {
    let (p, object) = sealed();
    // Another tenant that happens to use the same key id, with its own key.
    p.insert("evil", KeyId::new("k1").unwrap(), MasterKey::generate().unwrap()).unwrap();
    assert_integrity(open_object(&p, "evil", BUCKET, KEY, &object), "other tenant's key");
    // Even the very same master key under another tenant name: the tenant is in the wrap's AD.
    let same = p.get(TENANT, &KeyId::new("k1").unwrap()).unwrap();
    p.insert("twin", KeyId::new("k1").unwrap(), same).unwrap();
    assert_integrity(open_object(&p, "twin", BUCKET, KEY, &object), "same key, other tenant");
    // The right tenant whose key was replaced.
    let replaced = MemoryKeyProvider::new();
    replaced.insert(TENANT, KeyId::new("k1").unwrap(), MasterKey::generate().unwrap()).unwrap();
    assert_integrity(open(&replaced, &object), "wrong master key");
    assert!(matches!(open_object(&p, "nobody", BUCKET, KEY, &object), Err(CryptError::UnknownKey { .. })));
}

#[test]
fn splicing_between_objects_fails() {
    // Two objects sealed at the same bucket/key (e.g. an overwrite): mixing their parts must fail.
    let p = provider();
    let a = seal_object(&p, TENANT, BUCKET, KEY, &pattern(N), C).unwrap();
    let b = seal_object(&p, TENANT, BUCKET, KEY, &pattern(N + 1)[..N], C).unwrap();
    let mut header_swap = b[..HEADER_LEN].to_vec();
    header_swap.extend_from_slice(&a[HEADER_LEN..]);
    assert_integrity(open(&p, &header_swap), "header of another object");
    let mut chunk_swap = a.clone();
    chunk_swap[chunk(1)].copy_from_slice(&b[chunk(1)]);
    assert_integrity(open(&p, &chunk_swap), "chunk of another object");
}

#[test]
fn garbage_never_panics() {
    let (p, object) = sealed();
    let mut x: u64 = 0x1234_5678_9abc_def0;
    for round in 0..2000 {
        x ^= x << 7;
        x ^= x >> 9;
        let len = (x % 300) as usize;
        let mut junk: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
        if round % 2 == 0 && len >= 5 {
            junk[..5].copy_from_slice(&object[..5]);
        }
        assert!(open(&p, &junk).is_err());
        assert!(ObjectOpener::new(&p, TENANT, BUCKET, KEY, &junk).is_err());
    }
}
