//! The pluggable chunk cipher: the conformance self-test accepts ring and names what a broken
//! implementation gets wrong, the `new_with_cipher` constructors really use the given cipher, and
//! the stored format does not depend on which cipher sealed or opens an object.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{pattern, provider, BUCKET, C, CU, KEY, TENANT};
use sluice_crypt::{
    open_object, seal_object, self_test, ChunkKey, Cipher, CryptError, ObjectOpener, ObjectSealer, RingCipher,
    HEADER_LEN, KEY_LEN, NONCE_LEN, TAG_LEN,
};

/// Four chunks, the last one partial.
const LEN: usize = 3 * CU + 100;

#[test]
fn ring_passes_self_test() {
    self_test(&RingCipher).unwrap();
    assert_eq!(RingCipher.name(), "ring");
}

// ---- a cipher that counts what goes through it ----------------------------------------------

#[derive(Debug, Default)]
struct Counts {
    keys: AtomicUsize,
    seals: AtomicUsize,
    opens: AtomicUsize,
}

/// Ring underneath, so its output is real AES-256-GCM; the counts prove the object code called it.
#[derive(Debug, Default)]
struct Counting(Arc<Counts>);

struct CountingKey(Box<dyn ChunkKey>, Arc<Counts>);

impl Cipher for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }

    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError> {
        self.0.keys.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(CountingKey(RingCipher.chunk_key(key)?, self.0.clone())))
    }
}

impl ChunkKey for CountingKey {
    fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], ad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError> {
        self.1.seals.fetch_add(1, Ordering::Relaxed);
        self.0.seal_in_place(nonce, ad, data)
    }

    fn open_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptError> {
        self.1.opens.fetch_add(1, Ordering::Relaxed);
        self.0.open_in_place(nonce, ad, data, tag)
    }
}

impl Counting {
    fn counts(&self) -> (usize, usize, usize) {
        let c = &self.0;
        (c.keys.load(Ordering::Relaxed), c.seals.load(Ordering::Relaxed), c.opens.load(Ordering::Relaxed))
    }
}

/// Seals `plain` chunk by chunk with `sealer`, returning header || chunks.
fn seal_chunks(header: [u8; HEADER_LEN], sealer: &ObjectSealer, plain: &[u8]) -> Vec<u8> {
    let mut out = header.to_vec();
    for (index, chunk) in plain.chunks(CU).enumerate() {
        out.extend_from_slice(&sealer.seal_chunk(index as u32, chunk).unwrap());
    }
    out
}

#[test]
fn self_test_passes_through_a_wrapper() {
    let counting = Counting::default();
    self_test(&counting).unwrap();
    let (keys, seals, opens) = counting.counts();
    assert!(keys >= 3 && seals >= 3 && opens >= 3, "self_test exercised the cipher: {:?}", counting.counts());
}

#[test]
fn new_with_cipher_routes_chunks_through_the_cipher() {
    let p = provider();
    let plain = pattern(LEN);
    let counting = Counting::default();

    let (header, sealer) = ObjectSealer::new_with_cipher(&counting, &p, TENANT, BUCKET, KEY, LEN as u64, C).unwrap();
    assert_eq!(counting.counts(), (1, 0, 0), "one data key per object");
    assert!(format!("{sealer:?}").contains("counting"), "Debug names the cipher: {sealer:?}");
    let sealed = seal_chunks(header, &sealer, &plain);
    assert_eq!(counting.counts(), (1, 4, 0));

    let opener = ObjectOpener::new_with_cipher(&counting, &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
    assert_eq!(counting.counts(), (2, 4, 0));
    let plan = opener.metadata().plan_range(0, LEN as u64).unwrap();
    let mut body = sealed[HEADER_LEN..].to_vec();
    assert_eq!(opener.open_range(&plan, &mut body).unwrap(), &plain[..]);
    assert_eq!(counting.counts(), (2, 4, 4));

    // The plain constructors leave it alone.
    let opener = ObjectOpener::new(&p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
    let mut body = sealed[HEADER_LEN..].to_vec();
    opener.open_range(&plan, &mut body).unwrap();
    assert_eq!(counting.counts(), (2, 4, 4));
    assert!(format!("{opener:?}").contains("ring"));
}

#[test]
fn format_does_not_depend_on_the_cipher() {
    let p = provider();
    let plain = pattern(LEN);

    // Sealed through the trait (ring and the wrapper), opened by the original code path.
    let (header, sealer) = ObjectSealer::new_with_cipher(&RingCipher, &p, TENANT, BUCKET, KEY, LEN as u64, C).unwrap();
    assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &seal_chunks(header, &sealer, &plain)).unwrap(), plain);
    let (header, sealer) =
        ObjectSealer::new_with_cipher(&Counting::default(), &p, TENANT, BUCKET, KEY, LEN as u64, C).unwrap();
    assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &seal_chunks(header, &sealer, &plain)).unwrap(), plain);

    // Sealed by the original path, opened through the trait.
    let sealed = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    for cipher in [&RingCipher as &dyn Cipher, &Counting::default()] {
        let opener = ObjectOpener::new_with_cipher(cipher, &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
        let mut opened = Vec::new();
        let mut body = &sealed[HEADER_LEN..];
        for index in 0..opener.layout().chunk_count() {
            let len = opener.layout().chunk_plaintext_len(index).unwrap() + TAG_LEN;
            let mut chunk = body[..len].to_vec();
            opened.extend_from_slice(opener.open_chunk(index, &mut chunk).unwrap());
            body = &body[len..];
        }
        assert_eq!(opened, plain, "{cipher:?}");
    }
    // Data keys are fresh per object, so two sealings never share bytes to compare directly. But
    // GCM is deterministic and every chunk authenticated under the other path's key, nonce and
    // associated data, so the ciphertext is exactly what that path would have written.
}

#[test]
fn tampering_is_still_integrity_through_a_cipher() {
    let p = provider();
    let plain = pattern(LEN);
    let sealed = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    let opener =
        ObjectOpener::new_with_cipher(&Counting::default(), &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
    let chunk0 = &sealed[HEADER_LEN..HEADER_LEN + CU + TAG_LEN];
    // A flipped ciphertext byte, the tag's first and last bytes (the tag is split off the end of
    // the chunk), and a chunk opened at another index.
    for at in [5, CU, CU + TAG_LEN - 1] {
        let mut chunk = chunk0.to_vec();
        chunk[at] ^= 1;
        assert!(matches!(opener.open_chunk(0, &mut chunk), Err(CryptError::Integrity)), "byte {at}");
    }
    assert!(matches!(opener.open_chunk(1, &mut chunk0.to_vec()), Err(CryptError::Integrity)));
    assert_eq!(opener.open_chunk(0, &mut chunk0.to_vec()).unwrap(), &plain[..CU]);
}

// ---- deliberately broken ciphers ------------------------------------------------------------

/// The ways an engine (or its driver glue) can plausibly get AES-GCM wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Returns a tag with one bit flipped.
    TagBit,
    /// Uses a key with one bit flipped (e.g. a byte-order slip while loading it).
    KeyBit,
    /// Drops the associated data.
    IgnoresAd,
    /// Decrypts without checking the tag (CTR mode is symmetric, so sealing again decrypts).
    NoAuth,
    /// Reports an authentication failure as a device error.
    WrongError,
    /// Corrupts the last byte of buffers longer than 64 KiB (e.g. a DMA segment limit).
    LongBuffers,
}

#[derive(Debug)]
struct Broken(Fault);

struct BrokenKey(Box<dyn ChunkKey>, Fault);

impl Cipher for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }

    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError> {
        let mut key = *key;
        if self.0 == Fault::KeyBit {
            key[0] ^= 0x80;
        }
        Ok(Box::new(BrokenKey(RingCipher.chunk_key(&key)?, self.0)))
    }
}

impl ChunkKey for BrokenKey {
    fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], ad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError> {
        let ad = if self.1 == Fault::IgnoresAd { &[][..] } else { ad };
        let mut tag = self.0.seal_in_place(nonce, ad, data)?;
        match self.1 {
            Fault::TagBit => tag[3] ^= 0x04,
            Fault::LongBuffers if data.len() > 1 << 16 => *data.last_mut().unwrap() ^= 1,
            _ => {}
        }
        Ok(tag)
    }

    fn open_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptError> {
        match self.1 {
            Fault::IgnoresAd => self.0.open_in_place(nonce, &[], data, tag),
            Fault::NoAuth => self.0.seal_in_place(nonce, ad, data).map(|_| ()),
            Fault::WrongError => {
                self.0.open_in_place(nonce, ad, data, tag).map_err(|_| CryptError::Crypto("device error"))
            }
            _ => self.0.open_in_place(nonce, ad, data, tag),
        }
    }
}

/// Runs the self-test on a broken cipher and returns the failed check and its detail.
fn failed_check(fault: Fault) -> (&'static str, String) {
    match self_test(&Broken(fault)) {
        Err(CryptError::SelfTest { cipher, check, why }) => {
            assert_eq!(cipher, "broken");
            // The message carries all three, for the operator's log.
            let shown = CryptError::SelfTest { cipher, check, why: why.clone() }.to_string();
            assert!(shown.contains("broken") && shown.contains(check) && shown.contains(&why), "{shown}");
            (check, why)
        }
        other => panic!("{fault:?}: expected a self-test failure, got {other:?}"),
    }
}

#[test]
fn self_test_names_the_failed_check() {
    let (check, why) = failed_check(Fault::TagBit);
    assert_eq!(check, "known answer (seal)");
    assert!(why.contains("test case 13") && why.contains("wrong tag"), "{why}");

    let (check, why) = failed_check(Fault::KeyBit);
    assert_eq!(check, "known answer (seal)");
    assert!(why.contains("test case 13"), "{why}");

    // Test cases 13-15 have no AAD, so only the vectors with associated data catch this.
    let (check, why) = failed_check(Fault::IgnoresAd);
    assert_eq!(check, "known answer (seal)");
    assert!(why.contains("test case 16") && why.contains("wrong tag"), "{why}");

    // Correct on every valid input; only the tamper checks can tell.
    let (check, why) = failed_check(Fault::NoAuth);
    assert_eq!(check, "tamper: flipped ciphertext byte");
    assert!(why.contains("accepted"), "{why}");

    let (check, why) = failed_check(Fault::WrongError);
    assert_eq!(check, "tamper: flipped ciphertext byte");
    assert!(why.contains("device error"), "{why}");

    // The vectors are all short; only the large round trip against ring finds this.
    let (check, why) = failed_check(Fault::LongBuffers);
    assert_eq!(check, "round trip");
    assert!(why.contains(&format!("first difference at byte {}", (1 << 20) + 16)), "{why}");
}

#[test]
fn device_errors_are_not_reported_as_tampering() {
    // A cipher whose open fails for a non-authentication reason: open_chunk must pass the error on
    // rather than turning it into Integrity (which the agent would report as a corrupt object).
    let p = provider();
    let sealed = seal_object(&p, TENANT, BUCKET, KEY, &pattern(100), C).unwrap();
    let opener =
        ObjectOpener::new_with_cipher(&Broken(Fault::WrongError), &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN])
            .unwrap();
    let mut chunk = sealed[HEADER_LEN..].to_vec();
    assert_eq!(opener.open_chunk(0, &mut chunk).unwrap(), &pattern(100)[..]);
    let mut chunk = sealed[HEADER_LEN..].to_vec();
    chunk[0] ^= 1;
    assert!(matches!(opener.open_chunk(0, &mut chunk), Err(CryptError::Crypto("device error"))));
}
