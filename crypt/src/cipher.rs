//! The pluggable AEAD behind object chunks.
//!
//! Chunk sealing and opening is the hot path of inline encryption, so it goes through the
//! [`Cipher`] trait: [`RingCipher`] (software, `ring`) everywhere, and hardware engines such as
//! DOCA's on a BlueField where available. Every implementation must produce exactly the bytes of
//! AES-256-GCM with a 96-bit nonce and a 128-bit tag, because the object format
//! (docs/encryption-format.md) does not record which implementation sealed an object.
//! [`self_test`] checks that before an implementation is trusted with data.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

use crate::keys::KEY_LEN;
use crate::layout::TAG_LEN;
use crate::CryptError;

/// GCM nonce length: 96 bits, the only size the object format uses.
pub const NONCE_LEN: usize = 12;

// The trait fixes the sizes in its signatures; fail the build if they ever drift from ring's.
const _: () = assert!(NONCE_LEN == ring::aead::NONCE_LEN && TAG_LEN == ring::aead::MAX_TAG_LEN);

/// AEAD on object chunks: AES-256-GCM with a 12-byte nonce and a 16-byte tag, in place.
pub trait Cipher: Send + Sync + std::fmt::Debug {
    /// Short name for logs and metrics, e.g. "ring" or "doca".
    fn name(&self) -> &'static str;
    /// Prepares a 256-bit key for many chunk operations.
    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError>;
}

/// A key prepared by a [`Cipher`]. Callers guarantee that a nonce is never reused with one key
/// (the object format derives it from a per-object prefix and the chunk index); implementations
/// may be used from several threads at once.
pub trait ChunkKey: Send + Sync {
    /// Encrypts `data` in place; returns the tag.
    fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], ad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError>;
    /// Decrypts `data` (ciphertext) in place after checking `tag`; on failure `data`'s content is
    /// unspecified and the error is CryptError::Integrity.
    fn open_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptError>;
}

/// AES-256-GCM in software via `ring` (AES-NI/ARMv8 crypto extensions where the CPU has them).
/// The reference implementation: [`self_test`] compares other ciphers against it.
#[derive(Debug, Default, Clone, Copy)]
pub struct RingCipher;

/// A ring AES-256-GCM key; also used directly for data-key wrapping, which stays on ring.
pub(crate) fn ring_key(bytes: &[u8; KEY_LEN]) -> Result<LessSafeKey, CryptError> {
    let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| CryptError::Crypto("AES-256-GCM key setup"))?;
    Ok(LessSafeKey::new(unbound))
}

impl Cipher for RingCipher {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn chunk_key(&self, key: &[u8; KEY_LEN]) -> Result<Box<dyn ChunkKey>, CryptError> {
        Ok(Box::new(RingChunkKey(ring_key(key)?)))
    }
}

/// No Debug: nothing that holds key material should be printable.
struct RingChunkKey(LessSafeKey);

impl ChunkKey for RingChunkKey {
    fn seal_in_place(&self, nonce: &[u8; NONCE_LEN], ad: &[u8], data: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError> {
        // Nonce uniqueness is the caller's contract (see ChunkKey), hence `assume_unique_for_key`.
        let tag = self
            .0
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(ad), data)
            .map_err(|_| CryptError::Crypto("sealing a chunk"))?;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    fn open_in_place(
        &self,
        nonce: &[u8; NONCE_LEN],
        ad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptError> {
        // `0..`: the whole slice is ciphertext and the plaintext replaces it where it is, so no
        // bytes are moved or copied.
        self.0
            .open_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(ad), Tag::from(*tag), data, 0..)
            .map(|_| ())
            .map_err(|_| CryptError::Integrity)
    }
}

// ---- conformance self-test ------------------------------------------------------------------

/// Checks that `cipher` is a correct AES-256-GCM (96-bit nonce, 128-bit tag) before it is trusted
/// with objects: (a) published known-answer vectors, sealing and opening; (b) a 1 MiB + 17 byte
/// round trip at an unaligned offset whose ciphertext and tag must equal [`RingCipher`]'s byte for
/// byte; (c) a flipped ciphertext byte, a flipped tag byte and a changed associated-data byte must
/// each fail with [`CryptError::Integrity`].
///
/// Returns the first failure as [`CryptError::SelfTest`], naming the check. Takes a few
/// milliseconds on ring; hardware implementations should run it once at start-up.
pub fn self_test(cipher: &dyn Cipher) -> Result<(), CryptError> {
    for vector in &KNOWN_ANSWERS {
        known_answer(cipher, vector)?;
    }
    round_trip(cipher)?;
    tamper(cipher)
}

fn fail(cipher: &dyn Cipher, check: &'static str, why: String) -> CryptError {
    CryptError::SelfTest { cipher: cipher.name(), check, why }
}

/// Decodes a hex literal at compile time; a malformed literal is a build error, not a run-time one.
const fn hex<const N: usize>(s: &str) -> [u8; N] {
    const fn digit(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("hex literals must be lower-case hex digits"),
        }
    }
    let s = s.as_bytes();
    assert!(s.len() == 2 * N, "hex literal has the wrong length");
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = digit(s[2 * i]) << 4 | digit(s[2 * i + 1]);
        i += 1;
    }
    out
}

struct KnownAnswer {
    name: &'static str,
    key: [u8; KEY_LEN],
    nonce: [u8; NONCE_LEN],
    ad: &'static [u8],
    plaintext: &'static [u8],
    ciphertext: &'static [u8],
    tag: [u8; TAG_LEN],
}

/// Key and plaintext shared by GCM spec test cases 15 and 16.
const SPEC_KEY: [u8; KEY_LEN] = hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
const SPEC_NONCE: [u8; NONCE_LEN] = hex("cafebabefacedbaddecaf888");
const SPEC_PLAIN: [u8; 64] = hex(concat!(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72",
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255",
));
const SPEC_CIPHER: [u8; 64] = hex(concat!(
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa",
    "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
));

/// AES-256-GCM vectors with 96-bit IVs and 128-bit tags. Test cases 13-16 are from McGrew & Viega,
/// "The Galois/Counter Mode of Operation (GCM)", Appendix B; the last is the first PTlen=0,
/// AADlen=128 entry of NIST CAVS gcmEncryptExtIV256.rsp. Together they cover an empty message,
/// one block, whole blocks, a partial final block with partial-block associated data, and
/// associated data with an empty message (the shape of an empty object's only chunk).
/// All were also checked against OpenSSL when transcribed.
const KNOWN_ANSWERS: [KnownAnswer; 5] = [
    KnownAnswer {
        name: "GCM spec test case 13",
        key: [0; KEY_LEN],
        nonce: [0; NONCE_LEN],
        ad: &[],
        plaintext: &[],
        ciphertext: &[],
        tag: hex("530f8afbc74536b9a963b4f1c4cb738b"),
    },
    KnownAnswer {
        name: "GCM spec test case 14",
        key: [0; KEY_LEN],
        nonce: [0; NONCE_LEN],
        ad: &[],
        plaintext: &[0; 16],
        ciphertext: &hex::<16>("cea7403d4d606b6e074ec5d3baf39d18"),
        tag: hex("d0d1c8a799996bf0265b98b5d48ab919"),
    },
    KnownAnswer {
        name: "GCM spec test case 15",
        key: SPEC_KEY,
        nonce: SPEC_NONCE,
        ad: &[],
        plaintext: &SPEC_PLAIN,
        ciphertext: &SPEC_CIPHER,
        tag: hex("b094dac5d93471bdec1a502270e3cc6c"),
    },
    KnownAnswer {
        name: "GCM spec test case 16",
        key: SPEC_KEY,
        nonce: SPEC_NONCE,
        ad: &hex::<20>("feedfacedeadbeeffeedfacedeadbeefabaddad2"),
        // Test case 16 is test case 15 cut to 60 bytes (a partial final block), plus AAD.
        plaintext: SPEC_PLAIN.split_at(60).0,
        ciphertext: SPEC_CIPHER.split_at(60).0,
        tag: hex("76fc6ece0f4e1768cddf8853bb2d551b"),
    },
    KnownAnswer {
        name: "CAVS gcmEncryptExtIV256 PTlen=0 AADlen=128 Count=0",
        key: hex("78dc4e0aaf52d935c3c01eea57428f00ca1fd475f5da86a49c8dd73d68c8e223"),
        nonce: hex("d79cf22d504cc793c3fb6c8a"),
        ad: &hex::<16>("b96baa8c1c75a671bfb2d08d06be5f36"),
        plaintext: &[],
        ciphertext: &[],
        tag: hex("3e5d486aa2e30b22e040b85723a06e76"),
    },
];

/// Where two buffers first differ, for a failure message that helps whoever debugs the engine.
fn first_difference(got: &[u8], want: &[u8]) -> String {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(at) => format!("first difference at byte {at} of {}", want.len()),
        None => format!("length {} instead of {}", got.len(), want.len()),
    }
}

fn known_answer(cipher: &dyn Cipher, v: &KnownAnswer) -> Result<(), CryptError> {
    const SEAL: &str = "known answer (seal)";
    const OPEN: &str = "known answer (open)";
    let key = cipher.chunk_key(&v.key).map_err(|e| fail(cipher, SEAL, format!("{}: key setup failed: {e}", v.name)))?;

    let mut data = v.plaintext.to_vec();
    let tag = key
        .seal_in_place(&v.nonce, v.ad, &mut data)
        .map_err(|e| fail(cipher, SEAL, format!("{}: sealing failed: {e}", v.name)))?;
    if data != v.ciphertext {
        return Err(fail(
            cipher,
            SEAL,
            format!("{}: wrong ciphertext, {}", v.name, first_difference(&data, v.ciphertext)),
        ));
    }
    if tag != v.tag {
        return Err(fail(cipher, SEAL, format!("{}: wrong tag", v.name)));
    }

    let mut data = v.ciphertext.to_vec();
    key.open_in_place(&v.nonce, v.ad, &mut data, &v.tag)
        .map_err(|e| fail(cipher, OPEN, format!("{}: rejected a valid message: {e}", v.name)))?;
    if data != v.plaintext {
        return Err(fail(
            cipher,
            OPEN,
            format!("{}: wrong plaintext, {}", v.name, first_difference(&data, v.plaintext)),
        ));
    }
    Ok(())
}

/// Deterministic filler (xorshift32): the self-test needs no randomness, and its failures must
/// reproduce.
fn filler(seed: u32, out: &mut [u8]) {
    let mut x = seed | 1;
    for b in out {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
}

/// Round-trip buffer: more than one default-size chunk and not a multiple of the AES block, so
/// both bulk paths and the partial final block are exercised.
const ROUND_TRIP_LEN: usize = (1 << 20) + 17;
/// Associated-data length of a real chunk (binding digest, index, final flag).
const CHUNK_AD_LEN: usize = 37;

fn round_trip(cipher: &dyn Cipher) -> Result<(), CryptError> {
    const CHECK: &str = "round trip";
    let mut key = [0u8; KEY_LEN];
    let mut nonce = [0u8; NONCE_LEN];
    let mut ad = [0u8; CHUNK_AD_LEN];
    filler(1, &mut key);
    filler(2, &mut nonce);
    filler(3, &mut ad);
    // One spare byte in front: sealing `[1..]` hands the cipher a buffer at an odd address (for any
    // usual allocator), as a chunk at an arbitrary offset of a stored object can be; engines with
    // DMA alignment rules must cope.
    let mut plain = vec![0u8; ROUND_TRIP_LEN + 1];
    filler(4, &mut plain);

    let mut want = plain.clone();
    let want_tag = RingCipher.chunk_key(&key)?.seal_in_place(&nonce, &ad, &mut want[1..])?;

    let fail = |why: String| fail(cipher, CHECK, why);
    let key = cipher.chunk_key(&key).map_err(|e| fail(format!("key setup failed: {e}")))?;
    let mut data = plain.clone();
    let tag = key.seal_in_place(&nonce, &ad, &mut data[1..]).map_err(|e| fail(format!("sealing failed: {e}")))?;
    if data != want {
        return Err(fail(format!("ciphertext differs from ring's, {}", first_difference(&data[1..], &want[1..]))));
    }
    if tag != want_tag {
        return Err(fail("tag differs from ring's".into()));
    }
    key.open_in_place(&nonce, &ad, &mut data[1..], &tag).map_err(|e| fail(format!("rejected its own output: {e}")))?;
    if data != plain {
        return Err(fail(format!(
            "opening did not restore the plaintext, {}",
            first_difference(&data[1..], &plain[1..])
        )));
    }
    Ok(())
}

/// Tamper-check message: several whole blocks and a partial one.
const TAMPER_LEN: usize = 100;

fn tamper(cipher: &dyn Cipher) -> Result<(), CryptError> {
    let mut key = [0u8; KEY_LEN];
    let mut nonce = [0u8; NONCE_LEN];
    let mut ad = [0u8; CHUNK_AD_LEN];
    let mut sealed = [0u8; TAMPER_LEN];
    filler(5, &mut key);
    filler(6, &mut nonce);
    filler(7, &mut ad);
    filler(8, &mut sealed);
    let key = cipher.chunk_key(&key).map_err(|e| fail(cipher, "tamper", format!("key setup failed: {e}")))?;
    let tag = key
        .seal_in_place(&nonce, &ad, &mut sealed)
        .map_err(|e| fail(cipher, "tamper", format!("sealing failed: {e}")))?;

    // Single-bit changes are the least an authenticator must notice; each case alters exactly one.
    type Alter = fn(&mut [u8; TAMPER_LEN], &mut [u8; TAG_LEN], &mut [u8; CHUNK_AD_LEN]);
    let cases: [(&'static str, Alter); 3] = [
        ("tamper: flipped ciphertext byte", |data, _, _| data[57] ^= 0x01),
        ("tamper: flipped tag byte", |_, tag, _| tag[TAG_LEN - 1] ^= 0x01),
        ("tamper: changed associated-data byte", |_, _, ad| ad[CHUNK_AD_LEN - 1] ^= 0x01),
    ];
    for (check, alter) in cases {
        let (mut data, mut tag, mut ad) = (sealed, tag, ad);
        alter(&mut data, &mut tag, &mut ad);
        match key.open_in_place(&nonce, &ad, &mut data, &tag) {
            Err(CryptError::Integrity) => {}
            Ok(()) => return Err(fail(cipher, check, "the altered message was accepted".into())),
            Err(e) => return Err(fail(cipher, check, format!("failed with \"{e}\" instead of an integrity error"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_passes_its_own_self_test() {
        self_test(&RingCipher).unwrap();
    }

    #[test]
    fn hex_literals_decode() {
        assert_eq!(hex::<3>("00a9ff"), [0x00, 0xa9, 0xff]);
        // Test case 16's inputs are test case 15's cut to 60 bytes; guard the slicing above.
        assert_eq!((KNOWN_ANSWERS[3].plaintext.len(), KNOWN_ANSWERS[3].ciphertext.len()), (60, 60));
        assert_eq!(KNOWN_ANSWERS[3].plaintext, &KNOWN_ANSWERS[2].plaintext[..60]);
    }
}
