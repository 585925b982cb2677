//! Raw AES-256-GCM throughput of `ring` on the calling thread, for the benchmark report.

use std::hint::black_box;
use std::time::Instant;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

/// Seals `bytes` bytes (rounded up to whole chunks) in chunks of `chunk` bytes with one random
/// key on the calling thread and returns the rate in GiB/s. Returns 0.0 if there is nothing to
/// measure or the primitive cannot be set up (the caller only reports the number).
pub fn aes_gcm_throughput(bytes: usize, chunk: usize) -> f64 {
    if bytes == 0 || chunk == 0 {
        return 0.0;
    }
    let Ok(master) = crate::MasterKey::generate() else { return 0.0 };
    let Ok(unbound) = UnboundKey::new(&AES_256_GCM, master.bytes()) else { return 0.0 };
    let key = LessSafeKey::new(unbound);
    let mut buf = vec![0x5a_u8; chunk];
    let rounds = bytes.div_ceil(chunk);
    let started = Instant::now();
    for i in 0..rounds {
        let mut nonce = [0u8; NONCE_LEN];
        nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
        // Same associated-data size as a real chunk, so the per-chunk overhead is representative.
        let ad = [0u8; 37];
        match key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(ad), &mut buf) {
            Ok(tag) => _ = black_box(tag),
            Err(_) => return 0.0,
        }
    }
    black_box(&buf);
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    (rounds * chunk) as f64 / secs / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    #[test]
    fn throughput_is_positive() {
        assert!(super::aes_gcm_throughput(4 << 20, 1 << 20) > 0.0);
        assert_eq!(super::aes_gcm_throughput(0, 4096), 0.0);
    }
}
