//! `DocaCipher` against the DOCA test model (`doca/model`: a C test double
//! whose AES-GCM is OpenSSL's; not NVIDIA DOCA): the DOCA task layout code
//! must produce exactly the object format `RingCipher` does. Real DOCA is
//! validated only on a BlueField (the agent runs `self_test` at start-up).

#![cfg(feature = "doca")]
#![allow(clippy::unwrap_used)]

mod common;

use common::{pattern, provider, BUCKET, C, CU, KEY, TENANT};
use sluice_crypt::{
    open_object, seal_object, self_test, CryptError, DocaCipher, ObjectOpener, ObjectSealer, HEADER_LEN, TAG_LEN,
};

fn cipher() -> DocaCipher {
    let dev = sluice_doca::Device::open(&sluice_doca::model::load(), "mlx5_0").unwrap();
    DocaCipher::new(&dev).unwrap()
}

#[test]
fn the_doca_cipher_passes_the_self_test() {
    self_test(&cipher()).unwrap();
}

/// Seals with `DocaCipher` chunk by chunk, as the agent does.
fn seal_with_doca(c: &DocaCipher, p: &sluice_crypt::MemoryKeyProvider, plain: &[u8]) -> Vec<u8> {
    let (header, sealer) = ObjectSealer::new_with_cipher(c, p, TENANT, BUCKET, KEY, plain.len() as u64, C).unwrap();
    let layout = *sealer.layout();
    let mut out = header.to_vec();
    let mut at = 0;
    for i in 0..layout.chunk_count() {
        let n = layout.chunk_plaintext_len(i).unwrap();
        out.extend_from_slice(&sealer.seal_chunk(i, &plain[at..at + n]).unwrap());
        at += n;
    }
    out
}

#[test]
fn objects_cross_between_doca_and_ring() {
    let c = cipher();
    let p = provider();
    for n in [0, 1, CU, 3 * CU + 100] {
        let plain = pattern(n);
        // DOCA seals, ring opens.
        let sealed = seal_with_doca(&c, &p, &plain);
        assert_eq!(open_object(&p, TENANT, BUCKET, KEY, &sealed).unwrap(), plain, "n={n}");
        // Ring seals, DOCA opens every chunk.
        let sealed = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
        let opener = ObjectOpener::new_with_cipher(&c, &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
        let mut got = Vec::new();
        for (i, chunk) in sealed[HEADER_LEN..].chunks(CU + TAG_LEN).enumerate() {
            let mut chunk = chunk.to_vec();
            got.extend_from_slice(opener.open_chunk(i as u32, &mut chunk).unwrap());
        }
        assert_eq!(got, plain, "n={n}");
    }
}

#[test]
fn a_tampered_chunk_is_an_integrity_error_on_doca_too() {
    let c = cipher();
    let p = provider();
    let plain = pattern(2 * CU);
    let mut sealed = seal_object(&p, TENANT, BUCKET, KEY, &plain, C).unwrap();
    sealed[HEADER_LEN + 5] ^= 0x01;
    let opener = ObjectOpener::new_with_cipher(&c, &p, TENANT, BUCKET, KEY, &sealed[..HEADER_LEN]).unwrap();
    let mut chunk = sealed[HEADER_LEN..HEADER_LEN + CU + TAG_LEN].to_vec();
    assert!(matches!(opener.open_chunk(0, &mut chunk), Err(CryptError::Integrity)));
    // The next chunk is untouched and still opens on the same engine.
    let mut next = sealed[HEADER_LEN + CU + TAG_LEN..].to_vec();
    assert_eq!(opener.open_chunk(1, &mut next).unwrap(), &plain[CU..]);
}

/// A task the engine cannot run (here: a chunk larger than it takes; on
/// hardware, a task that hung and poisoned the engine) is done on the CPU
/// instead, to the same bytes: a failed engine does not fail every
/// encrypted request of every tenant.
#[test]
fn a_chunk_the_engine_fails_is_sealed_and_opened_by_ring_to_the_same_bytes() {
    use sluice_crypt::{Cipher, RingCipher, MAX_CHUNK_SIZE};
    let (c, raw, nonce) = (cipher(), [7u8; 32], [3u8; 12]);
    let (doca, ring) = (c.chunk_key(&raw).unwrap(), RingCipher.chunk_key(&raw).unwrap());
    let plain = pattern(MAX_CHUNK_SIZE as usize + 1);
    let (mut a, mut b) = (plain.clone(), plain.clone());
    let tag = doca.seal_in_place(&nonce, b"ad", &mut a).expect("sealed on the CPU");
    let ring_tag = ring.seal_in_place(&nonce, b"ad", &mut b).unwrap();
    assert_eq!((a.as_slice(), tag), (b.as_slice(), ring_tag));
    doca.open_in_place(&nonce, b"ad", &mut a, &tag).expect("opened on the CPU");
    assert_eq!(a, plain);
    let mut forged = tag;
    forged[0] ^= 1;
    assert!(matches!(doca.open_in_place(&nonce, b"ad", &mut b, &forged), Err(CryptError::Integrity)));
}
