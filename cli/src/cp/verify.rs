//! Checksums of the bytes `sluice cp` reads and writes, and what an
//! object's ETag can prove about them.
//!
//! Every file's CRC64NVME is computed from the bytes as they were read from
//! disk (uploads) or as they are written to it (downloads). An ETag that is
//! an MD5 (a single-part PUT) or an MD5 of part MD5s (a multipart PUT with
//! the agent's part size) is recomputed from the same bytes: equal, the
//! store holds exactly what was read.

use md5::{Digest, Md5};

/// An MD5 digest.
pub type Md5Sum = [u8; 16];

/// CRC64NVME as the journal and the manifest spell it: 16 lower-case hex
/// digits.
pub fn crc_hex(crc: u64) -> String {
    format!("{crc:016x}")
}

/// An ETag without its quotes (how the journal and the manifest keep them).
pub fn norm_etag(etag: &str) -> String {
    etag.trim().trim_matches('"').to_owned()
}

/// What an ETag says about an object's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Etag {
    /// The MD5 of the bytes (a single-part PUT, no server-side encryption).
    Md5(Md5Sum),
    /// The MD5 of the parts' MD5s, and how many parts (a multipart PUT).
    Multipart { md5: Md5Sum, parts: u64 },
    /// Anything else (another store's scheme): proves nothing here.
    Other,
}

impl Etag {
    pub fn parse(s: &str) -> Self {
        let s = norm_etag(s);
        let (hash, parts) = match s.split_once('-') {
            Some((h, n)) => (h, Some(n)),
            None => (s.as_str(), None),
        };
        let Some(md5) = md5_from_hex(hash) else { return Self::Other };
        match parts {
            None => Self::Md5(md5),
            Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => match n.parse::<u64>() {
                Ok(parts) if parts >= 1 => Self::Multipart { md5, parts },
                _ => Self::Other,
            },
            Some(_) => Self::Other,
        }
    }
}

impl std::fmt::Display for Etag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Md5(m) => write!(f, "{}", hex::encode(m)),
            Self::Multipart { md5, parts } => write!(f, "{}-{parts}", hex::encode(md5)),
            Self::Other => f.write_str("(not an MD5)"),
        }
    }
}

fn md5_from_hex(s: &str) -> Option<Md5Sum> {
    let mut out = [0u8; 16];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

fn md5(data: &[u8]) -> Md5Sum {
    let mut out = [0u8; 16];
    out.copy_from_slice(&Md5::new_with_prefix(data).finalize());
    out
}

/// How the bytes' MD5 must be computed to compare with an ETag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtagCheck {
    /// One MD5 of all the bytes.
    Whole,
    /// One MD5 per part of this many bytes, then the MD5 of those.
    Parts(u64),
}

/// How `size` bytes can be checked against `etag` when multipart parts are
/// `part_bytes` each; `Err`: why they cannot.
pub fn etag_check(etag: &Etag, size: u64, part_bytes: u64) -> Result<EtagCheck, &'static str> {
    match etag {
        Etag::Md5(_) => Ok(EtagCheck::Whole),
        Etag::Multipart { parts, .. } if part_bytes > 0 && size.div_ceil(part_bytes).max(1) == *parts => {
            Ok(EtagCheck::Parts(part_bytes))
        }
        Etag::Multipart { .. } => Err("multipart ETag of another part size"),
        Etag::Other => Err("ETag is not an MD5"),
    }
}

/// The ETag `data` would have, computed as `check` says; the parts of a
/// multipart ETag on all cores.
pub fn etag_of(data: &[u8], check: EtagCheck) -> Etag {
    let part = match check {
        EtagCheck::Whole => return Etag::Md5(md5(data)),
        EtagCheck::Parts(p) => p.clamp(1, usize::MAX as u64) as usize,
    };
    let parts: Vec<&[u8]> = if data.is_empty() { vec![data] } else { data.chunks(part).collect() };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, parts.len());
    let per_thread = parts.len().div_ceil(threads);
    let mut sums = vec![[0u8; 16]; parts.len()];
    std::thread::scope(|s| {
        for (out, parts) in sums.chunks_mut(per_thread).zip(parts.chunks(per_thread)) {
            s.spawn(move || {
                for (o, p) in out.iter_mut().zip(parts) {
                    *o = md5(p);
                }
            });
        }
    });
    Etag::Multipart { md5: md5(&sums.concat()), parts: sums.len() as u64 }
}

/// Checksums of bytes that arrive in order (a file read in chunks, an
/// object in windows): always the CRC64NVME, and an ETag's MD5 if asked.
pub struct Hasher {
    crc: crc_fast::Digest,
    whole: Option<Md5>,
    parts: Option<Parts>,
}

struct Parts {
    size: u64,
    filled: u64,
    current: Md5,
    done: Vec<Md5Sum>,
}

/// What a [`Hasher`] computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sums {
    pub crc: u64,
    /// The ETag the bytes would have (when an [`EtagCheck`] was asked for).
    pub etag: Option<Etag>,
}

impl Hasher {
    pub fn new(check: Option<EtagCheck>) -> Self {
        let (whole, parts) = match check {
            None => (None, None),
            Some(EtagCheck::Whole) => (Some(Md5::new()), None),
            Some(EtagCheck::Parts(size)) => {
                (None, Some(Parts { size: size.max(1), filled: 0, current: Md5::new(), done: Vec::new() }))
            }
        };
        Self { crc: crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme), whole, parts }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        self.crc.update(data);
        if let Some(m) = &mut self.whole {
            m.update(data);
        }
        if let Some(p) = &mut self.parts {
            while !data.is_empty() {
                let n = ((p.size - p.filled).min(data.len() as u64)) as usize;
                p.current.update(&data[..n]);
                p.filled += n as u64;
                data = &data[n..];
                if p.filled == p.size {
                    let full = std::mem::replace(&mut p.current, Md5::new());
                    p.done.push(md5_array(full));
                    p.filled = 0;
                }
            }
        }
    }

    pub fn finish(self) -> Sums {
        let etag = match (self.whole, self.parts) {
            (Some(m), _) => Some(Etag::Md5(md5_array(m))),
            (None, Some(mut p)) => {
                if p.filled > 0 || p.done.is_empty() {
                    p.done.push(md5_array(p.current));
                }
                Some(Etag::Multipart { md5: md5(&p.done.concat()), parts: p.done.len() as u64 })
            }
            (None, None) => None,
        };
        Sums { crc: self.crc.finalize(), etag }
    }
}

fn md5_array(h: Md5) -> Md5Sum {
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize());
    out
}

/// CRC64NVME of a whole file (read in 8 MiB chunks; call it off the async
/// threads).
pub fn crc_of_file(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Hasher::new(None);
    // Small: every job of a resumed run may be checking a file at once.
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish().crc);
        }
        h.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_parse() {
        let m = "9e107d9d372bb6826bd81d3542a419d6";
        assert!(matches!(Etag::parse(&format!("\"{m}\"")), Etag::Md5(_)));
        assert!(matches!(Etag::parse(&format!("{m}-3")), Etag::Multipart { parts: 3, .. }));
        assert_eq!(Etag::parse(&format!("{m}-")), Etag::Other);
        assert_eq!(Etag::parse(&format!("{m}-0")), Etag::Other);
        assert_eq!(Etag::parse(&format!("{m}-+3")), Etag::Other);
        assert_eq!(Etag::parse("abc"), Etag::Other);
        assert_eq!(Etag::parse(&format!("{m}-3")).to_string(), format!("{m}-3"));
    }

    #[test]
    fn md5_of_known_bytes() {
        let want = Etag::parse("9e107d9d372bb6826bd81d3542a419d6");
        let data = b"The quick brown fox jumps over the lazy dog";
        assert_eq!(etag_of(data, EtagCheck::Whole), want);
        let mut h = Hasher::new(Some(EtagCheck::Whole));
        h.update(&data[..10]);
        h.update(&data[10..]);
        assert_eq!(h.finish().etag, Some(want));
    }

    #[test]
    fn multipart_etag_streamed_equals_parallel() {
        // Two parts "a" and "b": md5(md5("a") || md5("b")) with 2 parts.
        let want = Etag::Multipart { md5: md5(&[md5(b"a"), md5(b"b")].concat()), parts: 2 };
        assert_eq!(etag_of(b"ab", EtagCheck::Parts(1)), want);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let whole = etag_of(&data, EtagCheck::Parts(1000));
        assert!(matches!(whole, Etag::Multipart { parts: 10, .. }));
        for chunk in [1usize, 333, 1000, 4096] {
            let mut h = Hasher::new(Some(EtagCheck::Parts(1000)));
            for c in data.chunks(chunk) {
                h.update(c);
            }
            assert_eq!(h.finish().etag, Some(whole), "chunks of {chunk}");
        }
        let data = &data[..9_500];
        let mut h = Hasher::new(Some(EtagCheck::Parts(1000)));
        h.update(data);
        assert_eq!(h.finish().etag, Some(etag_of(data, EtagCheck::Parts(1000))));
    }

    #[test]
    fn which_check() {
        let m = [0u8; 16];
        assert_eq!(etag_check(&Etag::Md5(m), 5, 0), Ok(EtagCheck::Whole));
        let mp = Etag::Multipart { md5: m, parts: 4 };
        assert_eq!(etag_check(&mp, 20 << 20, 5 << 20), Ok(EtagCheck::Parts(5 << 20)));
        assert!(etag_check(&mp, 20 << 20, 8 << 20).is_err());
        assert!(etag_check(&Etag::Other, 1, 1).is_err());
    }

    #[test]
    fn crc_matches_the_reference() {
        // CRC-64/NVME check value ("123456789").
        let mut h = Hasher::new(None);
        h.update(b"123456789");
        assert_eq!(h.finish().crc, 0xae8b_1486_0a79_9888);
    }
}
