//! The encrypted GET, PUT, HEAD and LIST against the in-memory store:
//! what the format and the namespace's settings decide, and what a caller
//! sees when the stored object is not what its header says.

use std::sync::Arc;

use sluice_crypt::{KeyId, MasterKey, MemoryKeyProvider};

use super::super::client::S3Client;
use super::super::failing::{refused, Failing, Failure};
use super::super::mock::{MockStore, Op};
use super::super::transfer_tests::{counters, namespace, pattern, region, tuning};
use super::*;
use crate::config::S3Tuning;

const MIB: u64 = 1 << 20;

/// The tenant's keys (one, current).
fn keys() -> Arc<MemoryKeyProvider> {
    let keys = MemoryKeyProvider::new();
    let id = KeyId::new("k1").unwrap();
    keys.insert("tenant", id.clone(), MasterKey::generate().unwrap()).unwrap();
    keys.set_current("tenant", &id).unwrap();
    Arc::new(keys)
}

/// A namespace of `mock` sealing in `chunk`-byte chunks, whose older
/// objects were sealed in `previous` ones; keys shared by every store of
/// one test (`KEYS`).
fn encrypted(mock: &MockStore, tuning: S3Tuning, chunk: u32, previous: &[u32]) -> ObjectStore {
    encrypted_over(Arc::new(mock.clone()), tuning, chunk, previous)
}

/// [`encrypted`] over any client.
fn encrypted_over(client: Arc<dyn S3Client>, tuning: S3Tuning, chunk: u32, previous: &[u32]) -> ObjectStore {
    static KEYS: std::sync::OnceLock<Arc<MemoryKeyProvider>> = std::sync::OnceLock::new();
    let enc = Encryption {
        provider: KEYS.get_or_init(keys).clone(),
        cipher: Arc::new(sluice_crypt::RingCipher),
        chunk_size: chunk,
        previous_chunk_sizes: previous.to_vec(),
    };
    ObjectStore::new(client, &namespace(), "tenant", tuning, counters(), None).with_encryption(Some(enc))
}

#[test]
fn metadata_names_are_the_format_s() {
    for (k, want) in [
        (sluice_crypt::META_ENC, "x-amz-meta-sluice-enc"),
        (sluice_crypt::META_PLAIN_SIZE, "x-amz-meta-sluice-plain-size"),
        (sluice_crypt::META_CHUNK, "x-amz-meta-sluice-chunk"),
        (sluice_crypt::META_KEY_ID, "x-amz-meta-sluice-key-id"),
    ] {
        assert_eq!(meta_header_name(k), want);
    }
}

/// An encrypted GET dropped while its chunks are decrypted on blocking
/// threads (past its deadline, cancelled) writes nothing into the
/// region once it is gone: the caller, told it ended, may already be
/// using that memory for something else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_encrypted_get_writes_nothing_once_it_is_gone() {
    // Parts of two 4 MiB chunks: each blocking task opens 8 MiB.
    let tuning = S3Tuning { get_part_size: 8 * MIB, put_part_size: 8 * MIB, multipart_threshold: 64 * MIB, ..tuning() };
    let s = encrypted(&MockStore::new(), tuning, 4 << 20, &[]);
    let len = 32 * MIB;
    let r = region(len);
    r.write_at(0, &pattern(len as usize, 3)).unwrap();
    s.put_from(&ObjectWrite::from_start("k", &r, len), &Call::ungated("req")).await.unwrap();
    let marker = vec![0xeeu8; len as usize];
    let mut caught = 0;
    for ms in [1u64, 2, 4, 8, 16, 32, 64, 128] {
        r.write_at(0, &vec![0u8; len as usize]).unwrap();
        let (read, call) = (ObjectRead::whole("k"), Call::ungated("req"));
        let slice = RegionSlice { region: &r, offset: 0, room: len };
        let get = s.get_into(&read, &slice, &call);
        if tokio::time::timeout(std::time::Duration::from_millis(ms), get).await.is_ok() {
            continue; // done before the deadline: nothing left running
        }
        caught += 1;
        // What the caller does once told the GET is over.
        r.write_at(0, &marker).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut now = vec![0u8; len as usize];
        r.read_at(0, &mut now).unwrap();
        let changed = now.iter().zip(&marker).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 0, "{changed} bytes written after a GET dropped at {ms} ms");
    }
    assert!(caught > 0, "no GET was dropped mid-way");
}

#[test]
fn encrypted_parts_are_never_smaller_than_the_part_size() {
    let mib = 1u64 << 20;
    for (part, chunk) in [(6 * mib, 4 * mib), (5 * mib, 4 * mib), (8 * mib, 1 << 16), (5 * mib, 16 * mib)] {
        let n = super::super::store::chunks_per_part(part, chunk as u32);
        assert!(n * chunk >= part, "{part} over {chunk}: {n} chunks");
        assert!((n - 1) * chunk < part, "no more than one chunk over");
    }
}

async fn put(s: &ObjectStore, key: &str, len: u64, seed: u8) {
    let r = region(len.max(1));
    r.write_at(0, &pattern(len as usize, seed)).unwrap();
    s.put_from(&ObjectWrite::from_start(key, &r, len), &Call::ungated("req")).await.unwrap();
}

async fn listed(s: &ObjectStore) -> Result<Vec<(String, u64)>, S3Error> {
    let page = s.list_page("", "", 1000, "", "req").await?;
    Ok(page.objects.into_iter().map(|o| (o.key, o.size)).collect())
}

/// A listing gives plaintext sizes from stored sizes, which only the
/// chunk size makes exact: after `encryption_chunk_bytes` changed, objects
/// sealed before (named in `encryption_previous_chunk_bytes`) are listed
/// with their own sizes, read from their metadata where the stored size
/// is ambiguous, and only there.
#[tokio::test]
async fn a_listing_gives_every_object_its_size_after_the_chunk_size_changed() {
    let mock = MockStore::new();
    let before = encrypted(&mock, tuning(), 1 << 20, &[]);
    put(&before, "old", 3 * MIB, 1).await;
    put(&before, "small", 1000, 2).await;
    let after = encrypted(&mock, tuning(), 4096, &[1 << 20]);
    put(&after, "new", 3 * MIB + 5, 3).await;
    let heads = mock.count(Op::Head);
    let want = vec![("new".to_owned(), 3 * MIB + 5), ("old".to_owned(), 3 * MIB), ("small".to_owned(), 1000)];
    assert_eq!(listed(&after).await.unwrap(), want);
    assert_eq!(mock.count(Op::Head) - heads, 2, "a HEAD for each object whose stored size is ambiguous, only");
    // Without the history, 3 MiB sealed in 1 MiB chunks reads as another
    // size in 4 KiB ones: why the setting exists.
    let forgetful = encrypted(&mock, tuning(), 4096, &[]);
    let sizes = listed(&forgetful).await.unwrap();
    assert_ne!(sizes[1], ("old".to_owned(), 3 * MIB), "the stored size alone misleads");
}

/// A listed object that is not a sealed object (written around the agent)
/// keeps its stored size, and its HEAD says why it cannot be read; a HEAD
/// that fails fails the page rather than list a wrong size.
#[tokio::test]
async fn a_listing_never_passes_a_stored_size_off_as_a_plaintext_size() {
    let mock = MockStore::new();
    let s = encrypted(&mock, tuning(), 4096, &[1 << 20]);
    mock.insert("t/plain", vec![7u8; 5000]);
    let e = s.head("plain", "req").await.unwrap_err();
    assert!(matches!(e, S3Error::Integrity(_)) && e.to_string().contains("no encryption metadata"), "{e}");
    assert_eq!(listed(&s).await.unwrap(), vec![("plain".to_owned(), 5000)]);
    put(&s, "sealed", 3 * MIB, 4).await;
    let failing = Failing::new(Arc::new(mock.clone())).fail(Op::Head, 0, 100, Failure::Error(refused));
    let s = encrypted_over(Arc::new(failing), tuning(), 4096, &[1 << 20]);
    let e = listed(&s).await.unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("refused"), "{e}");
}

/// What the format refuses in a stored header or metadata is the object's
/// failing (INTEGRITY), not the agent's (INTERNAL).
#[test]
fn a_malformed_stored_object_is_an_integrity_error() {
    for e in [
        CryptError::UnknownKey { tenant: "tenant".into(), key_id: "gone".into() },
        CryptError::InvalidChunkSize(3),
        CryptError::TooLarge { plaintext_len: u64::MAX, chunk_size: 4096 },
        CryptError::ChunkIndex { index: 9, count: 1 },
        CryptError::Integrity,
    ] {
        assert!(matches!(open_err(e), S3Error::Integrity(_)));
    }
    assert!(matches!(open_err(CryptError::NoCurrentKey { tenant: "t".into() }), S3Error::Encryption(_)));
}

#[test]
fn a_stored_size_is_read_as_a_plaintext_size_only_where_unambiguous() {
    let enc = |chunk: u32, previous: Vec<u32>| Encryption {
        provider: keys(),
        cipher: Arc::new(sluice_crypt::RingCipher),
        chunk_size: chunk,
        previous_chunk_sizes: previous,
    };
    let three_mib_in_1mib = sluice_crypt::ciphertext_len(3 * MIB, 1 << 20).unwrap();
    assert_eq!(enc(1 << 20, vec![]).size_from_listing(three_mib_in_1mib), Some(3 * MIB));
    assert_eq!(enc(4096, vec![1 << 20]).size_from_listing(three_mib_in_1mib), None);
    // Small objects (one chunk under every size) read the same under all.
    let small = sluice_crypt::ciphertext_len(1000, 4096).unwrap();
    assert_eq!(enc(4096, vec![1 << 20, 16 << 20]).size_from_listing(small), Some(1000));
    // A length no chunk size can give.
    assert_eq!(enc(4096, vec![]).size_from_listing(10), None);
}
