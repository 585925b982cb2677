//! Pure arithmetic over the object layout: where each chunk lives, how long objects are, and which
//! ciphertext bytes a plaintext range needs. Nothing here touches keys, so the agent can plan a
//! ranged GET from the object's user metadata alone, before it has read the header.
//!
//! Layout (format v1): `header (HEADER_LEN bytes) || chunk 0 || chunk 1 || ...`, where chunk `i`
//! is `ciphertext(plaintext_i) || tag (16 bytes)`. Every chunk but the last holds exactly
//! `chunk_size` plaintext bytes; the last holds `1..=chunk_size`, except for the empty object,
//! which is exactly one empty final chunk (a bare tag), so that cutting a non-empty object down to
//! its header can never authenticate.

use std::ops::Range;

use crate::header::HEADER_LEN;
use crate::CryptError;

/// Length of the AES-GCM tag appended to every chunk.
pub const TAG_LEN: usize = 16;
/// Smallest accepted chunk size.
pub const MIN_CHUNK_SIZE: u32 = 4 * 1024;
/// Largest accepted chunk size.
pub const MAX_CHUNK_SIZE: u32 = 16 * 1024 * 1024;
/// Chunk size used when the namespace does not configure one.
pub const DEFAULT_CHUNK_SIZE: u32 = 1024 * 1024;

const TAG: u64 = TAG_LEN as u64;
const HEADER: u64 = HEADER_LEN as u64;

/// Rejects chunk sizes outside the supported set.
pub fn check_chunk_size(chunk_size: u64) -> Result<u32, CryptError> {
    match u32::try_from(chunk_size) {
        Ok(c) if c.is_power_of_two() && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&c) => Ok(c),
        _ => Err(CryptError::InvalidChunkSize(chunk_size)),
    }
}

/// The chunk geometry of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    plaintext_len: u64,
    chunk_size: u32,
    chunk_count: u32,
}

impl Layout {
    /// Validates the chunk size and that the chunk count fits the 32-bit nonce counter
    /// (count < 2^32).
    pub fn new(plaintext_len: u64, chunk_size: u32) -> Result<Self, CryptError> {
        let chunk_size = check_chunk_size(u64::from(chunk_size))?;
        let count = if plaintext_len == 0 { 1 } else { plaintext_len.div_ceil(u64::from(chunk_size)) };
        let chunk_count = u32::try_from(count).map_err(|_| CryptError::TooLarge { plaintext_len, chunk_size })?;
        Ok(Layout { plaintext_len, chunk_size, chunk_count })
    }

    pub fn plaintext_len(&self) -> u64 {
        self.plaintext_len
    }

    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Number of chunks; at least 1 (the empty object has one empty final chunk).
    pub fn chunk_count(&self) -> u32 {
        self.chunk_count
    }

    /// Whether `index` is the last chunk (whose associated data carries the final flag).
    pub fn is_final(&self, index: u32) -> bool {
        index.checked_add(1) == Some(self.chunk_count)
    }

    /// Total stored length: header plus all chunks with their tags.
    pub fn ciphertext_len(&self) -> u64 {
        // Cannot overflow: plaintext_len < 2^32 * 2^24 and the tag overhead is < 2^36.
        HEADER + self.plaintext_len + u64::from(self.chunk_count) * TAG
    }

    fn check_index(&self, index: u32) -> Result<(), CryptError> {
        if index < self.chunk_count {
            Ok(())
        } else {
            Err(CryptError::ChunkIndex { index, count: self.chunk_count })
        }
    }

    /// Plaintext bytes held by chunk `index`.
    pub fn chunk_plaintext_len(&self, index: u32) -> Result<usize, CryptError> {
        self.check_index(index)?;
        let c = u64::from(self.chunk_size);
        let len = if self.is_final(index) { self.plaintext_len - u64::from(index) * c } else { c };
        // len <= chunk_size <= 16 MiB, which fits every usize Rust supports here.
        Ok(len as usize)
    }

    /// Plaintext offset of the first byte of chunk `index`.
    pub fn chunk_plaintext_offset(&self, index: u32) -> u64 {
        u64::from(index) * u64::from(self.chunk_size)
    }

    /// Byte range of chunk `index` (ciphertext and tag) within the stored object.
    pub fn chunk_ciphertext_range(&self, index: u32) -> Result<Range<u64>, CryptError> {
        let plain = self.chunk_plaintext_len(index)? as u64;
        let start = HEADER + u64::from(index) * (u64::from(self.chunk_size) + TAG);
        Ok(start..start + plain + TAG)
    }

    /// Plans the read of plaintext bytes `[start, start + len)`; see [`plan_range`].
    pub fn plan_range(&self, start: u64, len: u64) -> Result<RangePlan, CryptError> {
        let size = self.plaintext_len;
        let end = match start.checked_add(len) {
            Some(end) if len > 0 && end <= size => end,
            _ => return Err(CryptError::RangeOutOfBounds { start, len, size }),
        };
        let c = u64::from(self.chunk_size);
        // Both quotients are < chunk_count, which fits u32.
        let first = (start / c) as u32;
        let last = ((end - 1) / c) as u32;
        let first_range = self.chunk_ciphertext_range(first)?;
        let last_range = self.chunk_ciphertext_range(last)?;
        Ok(RangePlan {
            start,
            len,
            first_chunk: first,
            chunk_count: last - first + 1,
            ciphertext: first_range.start..last_range.end,
            // < chunk_size, so it fits usize.
            skip: (start - u64::from(first) * c) as usize,
        })
    }
}

/// What a ranged GET must fetch and how to cut the decrypted chunks down to the requested range.
///
/// The header (bytes `0..HEADER_LEN`) is always needed as well; when `first_chunk == 0` the two
/// ranges are contiguous and one request for `0..ciphertext.end` covers both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangePlan {
    /// Requested plaintext offset.
    pub start: u64,
    /// Requested plaintext length (>= 1).
    pub len: u64,
    /// Index of the first chunk to decrypt.
    pub first_chunk: u32,
    /// Number of consecutive chunks to decrypt.
    pub chunk_count: u32,
    /// Stored-object byte range holding exactly those chunks.
    pub ciphertext: Range<u64>,
    /// Plaintext bytes to drop from the start of the first decrypted chunk.
    pub skip: usize,
}

impl RangePlan {
    /// The chunk indices to decrypt.
    pub fn chunks(&self) -> Range<u32> {
        self.first_chunk..self.first_chunk + self.chunk_count
    }

    /// Plaintext bytes to keep after skipping (the same as `len`).
    pub fn take(&self) -> u64 {
        self.len
    }
}

/// Stored length of an object with `plaintext_len` bytes of plaintext.
pub fn ciphertext_len(plaintext_len: u64, chunk_size: u32) -> Result<u64, CryptError> {
    Ok(Layout::new(plaintext_len, chunk_size)?.ciphertext_len())
}

/// Inverse of [`ciphertext_len`]; rejects lengths that the format cannot produce (so a truncated
/// object is noticed from its length alone).
pub fn plaintext_len(ciphertext_len: u64, chunk_size: u32) -> Result<u64, CryptError> {
    let c = u64::from(check_chunk_size(u64::from(chunk_size))?);
    let bad = CryptError::BadCiphertextLength { len: ciphertext_len, chunk_size };
    let body = ciphertext_len.checked_sub(HEADER).ok_or(bad)?;
    let full = body / (c + TAG);
    let rest = body % (c + TAG);
    let plain = match (full, rest) {
        // A bare tag is the empty object; nothing shorter is valid.
        (0, TAG) => 0,
        (0, 0) => return Err(CryptError::BadCiphertextLength { len: ciphertext_len, chunk_size }),
        (_, 0) => full * c,
        // A partial final chunk holds at least one plaintext byte after full chunks.
        (_, r) if r > TAG => full * c + (r - TAG),
        _ => return Err(CryptError::BadCiphertextLength { len: ciphertext_len, chunk_size }),
    };
    // Round-trip through Layout so the chunk-count limit applies here too.
    let layout = Layout::new(plain, chunk_size)?;
    debug_assert_eq!(layout.ciphertext_len(), ciphertext_len);
    Ok(plain)
}

/// Maps plaintext bytes `[start, start + len)` of an object of `plaintext_size` bytes to the chunks
/// and ciphertext bytes that cover them. `len` must be at least 1 and the range inside the object.
pub fn plan_range(plaintext_size: u64, chunk_size: u32, start: u64, len: u64) -> Result<RangePlan, CryptError> {
    Layout::new(plaintext_size, chunk_size)?.plan_range(start, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u32 = 4096;

    #[test]
    fn chunk_sizes() {
        for ok in [4096u64, 8192, 1 << 20, 16 << 20] {
            assert_eq!(check_chunk_size(ok).unwrap() as u64, ok);
        }
        for bad in [0u64, 1, 2048, 4095, 4097, 12288, 32 << 20, 1 << 40] {
            assert!(matches!(check_chunk_size(bad), Err(CryptError::InvalidChunkSize(b)) if b == bad));
        }
    }

    #[test]
    fn lengths_round_trip() {
        let c = u64::from(C);
        for n in [0, 1, c - 1, c, c + 1, 2 * c, 5 * c + 17, 1 << 30] {
            let l = ciphertext_len(n, C).unwrap();
            assert_eq!(plaintext_len(l, C).unwrap(), n, "n={n}");
        }
        assert_eq!(ciphertext_len(0, C).unwrap(), HEADER + TAG);
        assert_eq!(ciphertext_len(c, C).unwrap(), HEADER + c + TAG);
        assert_eq!(ciphertext_len(c + 1, C).unwrap(), HEADER + c + 1 + 2 * TAG);
    }

    #[test]
    fn impossible_lengths_rejected() {
        let c = u64::from(C);
        let invalid = [0, HEADER - 1, HEADER, HEADER + 1, HEADER + TAG - 1, HEADER + c + TAG + 5, HEADER + c + 2 * TAG];
        for l in invalid {
            assert!(matches!(plaintext_len(l, C), Err(CryptError::BadCiphertextLength { .. })), "l={l}");
        }
    }

    #[test]
    fn chunk_count_limit() {
        let max = u64::from(u32::MAX) * u64::from(C);
        assert_eq!(Layout::new(max, C).unwrap().chunk_count(), u32::MAX);
        assert!(matches!(Layout::new(max + 1, C), Err(CryptError::TooLarge { .. })));
        assert!(matches!(Layout::new(u64::MAX, C), Err(CryptError::TooLarge { .. })));
    }

    #[test]
    fn plans() {
        let c = u64::from(C);
        let p = plan_range(3 * c + 10, C, c + 5, c).unwrap();
        assert_eq!((p.first_chunk, p.chunk_count, p.skip), (1, 2, 5));
        assert_eq!(p.ciphertext, HEADER + c + TAG..HEADER + 3 * (c + TAG));
        let last = plan_range(3 * c + 10, C, 3 * c, 10).unwrap();
        assert_eq!(last.ciphertext, HEADER + 3 * (c + TAG)..HEADER + 3 * (c + TAG) + 10 + TAG);
        assert_eq!(last.ciphertext.end, ciphertext_len(3 * c + 10, C).unwrap());
        for (size, start, len) in [(10, 0, 0), (10, 5, 6), (0, 0, 1), (10, u64::MAX, 2)] {
            assert!(matches!(plan_range(size, C, start, len), Err(CryptError::RangeOutOfBounds { .. })));
        }
    }
}
