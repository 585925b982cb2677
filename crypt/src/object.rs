//! Sealing and opening objects chunk by chunk.
//!
//! Both [`ObjectSealer`] and [`ObjectOpener`] take `&self` for every chunk operation and hold no
//! per-chunk state, so the agent can seal or open the chunks of one object on several threads at
//! once and in any order.
//!
//! Chunks go through a [`Cipher`] (ring by default, a hardware engine via the `new_with_cipher`
//! constructors); the data-key wrap in the header always uses ring (see [`ObjectSealer::new`]).

use ring::aead::{Aad, Nonce};
use ring::digest::{Context, SHA256, SHA256_OUTPUT_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::cipher::{ring_key, ChunkKey, Cipher, RingCipher, NONCE_LEN};
use crate::header::{Header, HEADER_LEN, NONCE_PREFIX_LEN, OFF_WRAPPED_KEY, WRAPPED_KEY_LEN, WRAP_NONCE_LEN};
use crate::keys::{check_tenant, KeyId, KeyProvider, MasterKey, KEY_LEN};
use crate::layout::{Layout, RangePlan, TAG_LEN};
use crate::metadata::Metadata;
use crate::CryptError;

/// Domain-separation labels: the two AEAD uses never share associated-data formats.
const WRAP_AD_LABEL: &[u8] = b"sluice-crypt/v1/wrap\0";
const CHUNK_AD_LABEL: &[u8] = b"sluice-crypt/v1/chunk\0";
/// Per-chunk associated data: SHA-256 binding digest || u32 index || u8 final flag.
const CHUNK_AD_LEN: usize = SHA256_OUTPUT_LEN + 4 + 1;

fn random<const N: usize>(rng: &SystemRandom) -> Result<[u8; N], CryptError> {
    let mut out = [0u8; N];
    rng.fill(&mut out).map_err(|_| CryptError::Crypto("system random number generator"))?;
    Ok(out)
}

/// Appends a length-prefixed field so that, e.g., bucket "ab" + key "c" differs from "a" + "bc".
fn push_field(ad: &mut Vec<u8>, field: &[u8]) {
    ad.extend_from_slice(&(field.len() as u64).to_be_bytes());
    ad.extend_from_slice(field);
}

/// Associated data of the data-key wrap: every header byte before the wrapped key (magic, version,
/// algorithm, key id, chunk size, plaintext size, nonces) plus tenant, bucket and key. Unwrapping
/// therefore authenticates the whole header and the object's identity.
fn wrap_ad(header: &[u8; HEADER_LEN], tenant: &str, bucket: &str, key: &str) -> Vec<u8> {
    let mut ad =
        Vec::with_capacity(WRAP_AD_LABEL.len() + OFF_WRAPPED_KEY + 24 + tenant.len() + bucket.len() + key.len());
    ad.extend_from_slice(WRAP_AD_LABEL);
    ad.extend_from_slice(&header[..OFF_WRAPPED_KEY]);
    push_field(&mut ad, tenant.as_bytes());
    push_field(&mut ad, bucket.as_bytes());
    push_field(&mut ad, key.as_bytes());
    ad
}

/// Digest binding every chunk to the complete header (wrapped key included) and to bucket/key.
/// Hashing once per object keeps the per-chunk associated data small and allocation-free.
fn chunk_binding(header: &[u8; HEADER_LEN], bucket: &str, key: &str) -> [u8; SHA256_OUTPUT_LEN] {
    let mut ctx = Context::new(&SHA256);
    ctx.update(CHUNK_AD_LABEL);
    ctx.update(header);
    for field in [bucket.as_bytes(), key.as_bytes()] {
        ctx.update(&(field.len() as u64).to_be_bytes());
        ctx.update(field);
    }
    let mut out = [0u8; SHA256_OUTPUT_LEN];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The per-object chunk AEAD shared by sealer and opener.
struct ChunkCipher {
    key: Box<dyn ChunkKey>,
    /// The [`Cipher::name`] that prepared `key`, for Debug output (logs).
    cipher_name: &'static str,
    nonce_prefix: [u8; NONCE_PREFIX_LEN],
    binding: [u8; SHA256_OUTPUT_LEN],
    layout: Layout,
    key_id: KeyId,
}

impl ChunkCipher {
    /// Nonce = 8-byte random per-object prefix || 32-bit big-endian chunk index. Unique per chunk
    /// because the index is, and the key is fresh per object anyway.
    fn nonce(&self, index: u32) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        n[..NONCE_PREFIX_LEN].copy_from_slice(&self.nonce_prefix);
        n[NONCE_PREFIX_LEN..].copy_from_slice(&index.to_be_bytes());
        n
    }

    fn ad(&self, index: u32) -> [u8; CHUNK_AD_LEN] {
        let mut ad = [0u8; CHUNK_AD_LEN];
        ad[..SHA256_OUTPUT_LEN].copy_from_slice(&self.binding);
        ad[SHA256_OUTPUT_LEN..SHA256_OUTPUT_LEN + 4].copy_from_slice(&index.to_be_bytes());
        ad[CHUNK_AD_LEN - 1] = u8::from(self.layout.is_final(index));
        ad
    }

    fn metadata(&self) -> Metadata {
        Metadata::v1(self.layout.plaintext_len(), self.layout.chunk_size(), self.key_id.clone())
    }
}

/// Seals the chunks of one object under a fresh data key.
pub struct ObjectSealer {
    cipher: ChunkCipher,
}

impl ObjectSealer {
    /// Draws a data key, wraps it under the tenant's current master key and returns the header to
    /// store in front of the chunks. `plaintext_len` must be the exact object size: the last chunk
    /// is marked final from it, and it is recorded (authenticated) in the header.
    ///
    /// Chunks are sealed with [`RingCipher`]; use [`ObjectSealer::new_with_cipher`] for another
    /// implementation. The stored bytes are the same either way.
    pub fn new<P: KeyProvider + ?Sized>(
        provider: &P,
        tenant: &str,
        bucket: &str,
        key: &str,
        plaintext_len: u64,
        chunk_size: u32,
    ) -> Result<([u8; HEADER_LEN], ObjectSealer), CryptError> {
        Self::new_with_cipher(&RingCipher, provider, tenant, bucket, key, plaintext_len, chunk_size)
    }

    /// Like [`ObjectSealer::new`], but chunks are sealed by `cipher` (e.g. a hardware engine;
    /// run [`self_test`](crate::self_test) on it first). The data key is still wrapped with ring:
    /// that is one 32-byte operation per object, not worth a trip to an accelerator.
    pub fn new_with_cipher<P: KeyProvider + ?Sized>(
        cipher: &dyn Cipher,
        provider: &P,
        tenant: &str,
        bucket: &str,
        key: &str,
        plaintext_len: u64,
        chunk_size: u32,
    ) -> Result<([u8; HEADER_LEN], ObjectSealer), CryptError> {
        check_tenant(tenant)?;
        let layout = Layout::new(plaintext_len, chunk_size)?;
        let (key_id, master) = provider.current(tenant)?;
        let rng = SystemRandom::new();
        let data_key: [u8; KEY_LEN] = random(&rng)?;
        let header = Header {
            key_id: key_id.clone(),
            layout,
            nonce_prefix: random(&rng)?,
            wrap_nonce: random(&rng)?,
            wrapped_key: [0; WRAPPED_KEY_LEN],
        };
        let mut bytes = header.encode();
        let ad = wrap_ad(&bytes, tenant, bucket, key);
        // The wrap nonce is random, so a master key must be rotated before ~2^32 wraps (NIST's
        // random-nonce GCM limit; see the format document). The wrap stays on ring whatever `cipher`
        // is: it seals just the 32-byte data key, far too little to gain from an accelerator.
        let mut wrapped = data_key;
        let tag = ring_key(master.bytes())?
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(header.wrap_nonce), Aad::from(&ad), &mut wrapped)
            .map_err(|_| CryptError::Crypto("wrapping the data key"))?;
        bytes[OFF_WRAPPED_KEY..OFF_WRAPPED_KEY + KEY_LEN].copy_from_slice(&wrapped);
        bytes[OFF_WRAPPED_KEY + KEY_LEN..].copy_from_slice(tag.as_ref());
        let chunks = ChunkCipher {
            key: cipher.chunk_key(&data_key)?,
            cipher_name: cipher.name(),
            nonce_prefix: header.nonce_prefix,
            binding: chunk_binding(&bytes, bucket, key),
            layout,
            key_id,
        };
        Ok((bytes, ObjectSealer { cipher: chunks }))
    }

    pub fn layout(&self) -> &Layout {
        &self.cipher.layout
    }

    pub fn key_id(&self) -> &KeyId {
        &self.cipher.key_id
    }

    /// User metadata to store with the object (plaintext size for HEAD/LIST, chunk size, key id).
    pub fn metadata(&self) -> Metadata {
        self.cipher.metadata()
    }

    fn check_len(&self, index: u32, len: usize) -> Result<(), CryptError> {
        let expected = self.cipher.layout.chunk_plaintext_len(index)?;
        if len == expected {
            Ok(())
        } else {
            Err(CryptError::ChunkLength { index, expected: expected as u64, got: len as u64 })
        }
    }

    /// Encrypts chunk `index` in place and returns its tag, for callers whose buffers cannot grow
    /// (e.g. registered RDMA memory). `chunk` must hold exactly the chunk's plaintext.
    pub fn seal_in_place_detached(&self, index: u32, chunk: &mut [u8]) -> Result<[u8; TAG_LEN], CryptError> {
        self.check_len(index, chunk.len())?;
        let c = &self.cipher;
        c.key.seal_in_place(&c.nonce(index), &c.ad(index), chunk)
    }

    /// Encrypts chunk `index` in place and appends the tag.
    pub fn seal_in_place(&self, index: u32, chunk: &mut Vec<u8>) -> Result<(), CryptError> {
        let tag = self.seal_in_place_detached(index, chunk)?;
        chunk.extend_from_slice(&tag);
        Ok(())
    }

    /// Returns chunk `index` sealed: ciphertext followed by the tag.
    pub fn seal_chunk(&self, index: u32, plaintext: &[u8]) -> Result<Vec<u8>, CryptError> {
        self.check_len(index, plaintext.len())?;
        let mut out = Vec::with_capacity(plaintext.len() + TAG_LEN);
        out.extend_from_slice(plaintext);
        self.seal_in_place(index, &mut out)?;
        Ok(out)
    }
}

/// Opens the chunks of one stored object.
pub struct ObjectOpener {
    cipher: ChunkCipher,
}

// Hand-written so that no key material can ever reach a log line.
impl std::fmt::Debug for ObjectSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSealer")
            .field("layout", &self.cipher.layout)
            .field("key_id", &self.cipher.key_id)
            .field("cipher", &self.cipher.cipher_name)
            .finish()
    }
}

impl std::fmt::Debug for ObjectOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectOpener")
            .field("layout", &self.cipher.layout)
            .field("key_id", &self.cipher.key_id)
            .field("cipher", &self.cipher.cipher_name)
            .finish()
    }
}

// The agent shares one sealer/opener between the threads working on an object's chunks.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<ObjectSealer>();
    shareable::<ObjectOpener>();
};

impl ObjectOpener {
    /// Parses `header` (exactly [`HEADER_LEN`] bytes for v1), fetches the master key named in it and
    /// unwraps the data key. Any modified header byte, or a header moved to another tenant, bucket
    /// or key, fails here with [`CryptError::Integrity`] (or `BadHeader`/`UnsupportedVersion`/
    /// `UnknownKey` when the change makes the header unparsable or names another key).
    ///
    /// Chunks are opened with [`RingCipher`]; see [`ObjectOpener::new_with_cipher`].
    pub fn new<P: KeyProvider + ?Sized>(
        provider: &P,
        tenant: &str,
        bucket: &str,
        key: &str,
        header: &[u8],
    ) -> Result<ObjectOpener, CryptError> {
        Self::new_with_cipher(&RingCipher, provider, tenant, bucket, key, header)
    }

    /// Like [`ObjectOpener::new`], but chunks are opened by `cipher`. Any conforming cipher opens
    /// objects sealed by any other: the format does not depend on the implementation. The data
    /// key is still unwrapped with ring (one 32-byte operation per object).
    pub fn new_with_cipher<P: KeyProvider + ?Sized>(
        cipher: &dyn Cipher,
        provider: &P,
        tenant: &str,
        bucket: &str,
        key: &str,
        header: &[u8],
    ) -> Result<ObjectOpener, CryptError> {
        let parsed = Header::parse(header)?;
        check_tenant(tenant)?;
        // Authenticate the bytes as stored (not a re-encoding), so no byte can escape the check.
        let bytes: [u8; HEADER_LEN] = header.try_into().map_err(|_| CryptError::BadHeader("wrong length".into()))?;
        let master: MasterKey = provider.get(tenant, &parsed.key_id)?;
        let ad = wrap_ad(&bytes, tenant, bucket, key);
        let mut wrapped = parsed.wrapped_key;
        let nonce = Nonce::assume_unique_for_key(parsed.wrap_nonce);
        // Unwrapping stays on ring, as wrapping does: one 32-byte message per object.
        let data_key = ring_key(master.bytes())?
            .open_in_place(nonce, Aad::from(&ad), &mut wrapped)
            .map_err(|_| CryptError::Integrity)?;
        let data_key: &[u8; KEY_LEN] = (&*data_key).try_into().map_err(|_| CryptError::Integrity)?;
        Ok(ObjectOpener {
            cipher: ChunkCipher {
                key: cipher.chunk_key(data_key)?,
                cipher_name: cipher.name(),
                nonce_prefix: parsed.nonce_prefix,
                binding: chunk_binding(&bytes, bucket, key),
                layout: parsed.layout,
                key_id: parsed.key_id,
            },
        })
    }

    /// The authenticated layout (plaintext size and chunk size from the header).
    pub fn layout(&self) -> &Layout {
        &self.cipher.layout
    }

    pub fn key_id(&self) -> &KeyId {
        &self.cipher.key_id
    }

    /// The metadata this object should carry, derived from the authenticated header.
    pub fn metadata(&self) -> Metadata {
        self.cipher.metadata()
    }

    /// Fails with [`CryptError::Integrity`] unless the (unauthenticated) user metadata agrees with
    /// the header; call it before trusting a plaintext size or range plan taken from metadata.
    pub fn check_metadata(&self, meta: &Metadata) -> Result<(), CryptError> {
        if *meta == self.metadata() {
            Ok(())
        } else {
            Err(CryptError::Integrity)
        }
    }

    /// Decrypts chunk `index` (ciphertext followed by tag) in place and returns its plaintext.
    /// A chunk of the wrong length for its position, a chunk from another position or object, or a
    /// non-final chunk presented as the final one (or vice versa) fails with `Integrity`.
    pub fn open_chunk<'a>(&self, index: u32, chunk: &'a mut [u8]) -> Result<&'a mut [u8], CryptError> {
        let c = &self.cipher;
        let expected = c.layout.chunk_plaintext_len(index)?;
        if chunk.len() != expected + TAG_LEN {
            return Err(CryptError::Integrity);
        }
        let (data, tag) = chunk.split_last_chunk_mut::<TAG_LEN>().ok_or(CryptError::Integrity)?;
        // Errors pass through unchanged: authentication failures are `Integrity` by the ChunkKey
        // contract, and a failing engine (`Crypto`) must not be reported as tampering.
        c.key.open_in_place(&c.nonce(index), &c.ad(index), data, &*tag)?;
        Ok(data)
    }

    /// Decrypts the chunks of `plan` held in `ciphertext` (exactly the bytes `plan.ciphertext` of the
    /// stored object) and returns the requested plaintext, compacted in place at the start of
    /// `ciphertext`. A plan that disagrees with the header (metadata lied) fails with `Integrity`.
    pub fn open_range<'a>(&self, plan: &RangePlan, ciphertext: &'a mut [u8]) -> Result<&'a [u8], CryptError> {
        let layout = &self.cipher.layout;
        match layout.plan_range(plan.start, plan.len) {
            Ok(expected) if expected == *plan => {}
            _ => return Err(CryptError::Integrity),
        }
        if ciphertext.len() as u64 != plan.ciphertext.end - plan.ciphertext.start {
            return Err(CryptError::Integrity);
        }
        let mut read = 0usize;
        let mut written = 0usize;
        let mut remaining = plan.len;
        for index in plan.chunks() {
            let len = layout.chunk_plaintext_len(index)? + TAG_LEN;
            let chunk = ciphertext.get_mut(read..read + len).ok_or(CryptError::Integrity)?;
            let plain_len = self.open_chunk(index, chunk)?.len();
            let skip = if index == plan.first_chunk { plan.skip } else { 0 };
            let take = (plain_len - skip).min(usize::try_from(remaining).unwrap_or(usize::MAX));
            // `written <= read` always holds, so this only ever moves plaintext towards the front.
            ciphertext.copy_within(read + skip..read + skip + take, written);
            written += take;
            remaining -= take as u64;
            read += len;
        }
        Ok(&ciphertext[..written])
    }
}

/// Seals a whole in-memory object: header followed by all chunks.
pub fn seal_object<P: KeyProvider + ?Sized>(
    provider: &P,
    tenant: &str,
    bucket: &str,
    key: &str,
    plaintext: &[u8],
    chunk_size: u32,
) -> Result<Vec<u8>, CryptError> {
    let (header, sealer) = ObjectSealer::new(provider, tenant, bucket, key, plaintext.len() as u64, chunk_size)?;
    let layout = *sealer.layout();
    // Fits usize: it is at most plaintext.len() plus a small overhead.
    let mut out = Vec::with_capacity(layout.ciphertext_len() as usize);
    out.extend_from_slice(&header);
    let mut offset = 0usize;
    for index in 0..layout.chunk_count() {
        let len = layout.chunk_plaintext_len(index)?;
        let start = out.len();
        out.extend_from_slice(&plaintext[offset..offset + len]);
        let tag = sealer.seal_in_place_detached(index, &mut out[start..])?;
        out.extend_from_slice(&tag);
        offset += len;
    }
    Ok(out)
}

/// Opens a whole in-memory object sealed by [`seal_object`] (or chunk by chunk).
pub fn open_object<P: KeyProvider + ?Sized>(
    provider: &P,
    tenant: &str,
    bucket: &str,
    key: &str,
    object: &[u8],
) -> Result<Vec<u8>, CryptError> {
    let header = object.get(..HEADER_LEN).unwrap_or(object);
    let opener = ObjectOpener::new(provider, tenant, bucket, key, header)?;
    let layout = *opener.layout();
    // A length that differs from the authenticated header means chunks were dropped, cut or added.
    if object.len() as u64 != layout.ciphertext_len() {
        return Err(CryptError::Integrity);
    }
    let mut body = object[HEADER_LEN..].to_vec();
    let mut read = 0usize;
    let mut written = 0usize;
    for index in 0..layout.chunk_count() {
        let len = layout.chunk_plaintext_len(index)? + TAG_LEN;
        let plain = opener.open_chunk(index, &mut body[read..read + len])?.len();
        body.copy_within(read..read + plain, written);
        written += plain;
        read += len;
    }
    body.truncate(written);
    Ok(body)
}

// The wrap uses GCM's nonce and tag sizes; fail the build if the header constants drift.
const _: () = assert!(WRAPPED_KEY_LEN == KEY_LEN + TAG_LEN && WRAP_NONCE_LEN == NONCE_LEN);
