//! The envelope a host shim sends to the agent to make a region reachable
//! through DOCA: the `doca_mmap_export_pci` descriptor plus what the agent
//! must check before importing it.
//!
//! Layout (all integers little-endian; 48-byte fixed part):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `SLDX` |
//! | 4 | version (1) |
//! | 5 | kind: 0 host memory, 1 GPU memory (dma-buf) |
//! | 6..8 | reserved, zero |
//! | 8..16 | region length in bytes |
//! | 16..24 | host virtual address of the region's first byte |
//! | 24..40 | PCI address of the exporting function, ASCII, NUL-padded |
//! | 40..44 | descriptor length |
//! | 44..48 | reserved, zero |
//! | 48.. | the DOCA descriptor, exactly `descriptor length` bytes |
//!
//! The descriptor itself is opaque (DOCA's format); the envelope only bounds
//! it. Parsing never trusts a length it has not checked against the input.

use crate::Error;

const MAGIC: &[u8; 4] = b"SLDX";
/// The envelope version this build writes and reads.
pub const ENVELOPE_VERSION: u8 = 1;
const FIXED_LEN: usize = 48;
const PCI_LEN: usize = 16;
/// Largest descriptor accepted. DOCA's PCI export descriptors are a few
/// hundred bytes; anything near this bound is garbage or an attack.
pub const MAX_DESCRIPTOR_LEN: usize = 64 << 10;

/// What kind of memory the region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary host memory (the shim's memfd regions).
    Host,
    /// GPU memory registered from a CUDA dma-buf fd.
    GpuDmabuf,
}

/// A parsed (or to-be-written) export envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportEnvelope {
    pub kind: MemoryKind,
    pub len: u64,
    pub host_addr: u64,
    /// PCI address of the host function that exported it, e.g. `0000:3b:00.0`.
    pub pci: String,
    pub descriptor: Vec<u8>,
}

/// Accepts `DDDD:BB:DD.F` or `BB:DD.F` (hex digits).
pub fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let (domain, rest) = match s.matches(':').count() {
        2 => s.split_once(':').map_or(("", ""), |(d, r)| (d, r)),
        1 => ("0000", s),
        _ => return false,
    };
    let Some((bus, devfn)) = rest.split_once(':') else { return false };
    let Some((dev, func)) = devfn.split_once('.') else { return false };
    hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && func.len() == 1 && matches!(func.as_bytes()[0], b'0'..=b'7')
}

impl ExportEnvelope {
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        if !is_pci_address(&self.pci) {
            return Err(Error::BadExport(format!("{:?} is not a PCI address", self.pci)));
        }
        if self.len == 0 || self.host_addr.checked_add(self.len).is_none() {
            return Err(Error::BadExport(format!("region of {} bytes at {:#x}", self.len, self.host_addr)));
        }
        if self.descriptor.is_empty() || self.descriptor.len() > MAX_DESCRIPTOR_LEN {
            return Err(Error::BadExport(format!(
                "descriptor of {} bytes (must be 1..={MAX_DESCRIPTOR_LEN})",
                self.descriptor.len()
            )));
        }
        let mut out = Vec::with_capacity(FIXED_LEN + self.descriptor.len());
        out.extend_from_slice(MAGIC);
        out.push(ENVELOPE_VERSION);
        out.push(match self.kind {
            MemoryKind::Host => 0,
            MemoryKind::GpuDmabuf => 1,
        });
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.host_addr.to_le_bytes());
        let mut pci = [0u8; PCI_LEN];
        pci[..self.pci.len()].copy_from_slice(self.pci.as_bytes());
        out.extend_from_slice(&pci);
        out.extend_from_slice(&(self.descriptor.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.descriptor);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let bad = |why: String| Err(Error::BadExport(why));
        if bytes.len() < FIXED_LEN {
            return bad(format!("{} bytes, shorter than the {FIXED_LEN}-byte envelope", bytes.len()));
        }
        if &bytes[..4] != MAGIC {
            return bad("not a Sluice DOCA export (bad magic)".into());
        }
        if bytes[4] != ENVELOPE_VERSION {
            return bad(format!("envelope version {} (this agent reads {ENVELOPE_VERSION})", bytes[4]));
        }
        let kind = match bytes[5] {
            0 => MemoryKind::Host,
            1 => MemoryKind::GpuDmabuf,
            k => return bad(format!("unknown memory kind {k}")),
        };
        if bytes[6..8] != [0, 0] || bytes[44..48] != [0; 4] {
            return bad("reserved bytes are not zero".into());
        }
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
        let len = u64_at(8);
        let host_addr = u64_at(16);
        if len == 0 {
            return bad("zero-length region".into());
        }
        if host_addr.checked_add(len).is_none() {
            return bad("region wraps the address space".into());
        }
        let pci_raw = &bytes[24..24 + PCI_LEN];
        let end = pci_raw.iter().position(|&b| b == 0).unwrap_or(PCI_LEN);
        if pci_raw[end..].iter().any(|&b| b != 0) {
            return bad("PCI address field is not NUL-padded".into());
        }
        let pci = match std::str::from_utf8(&pci_raw[..end]) {
            Ok(s) if is_pci_address(s) => s.to_owned(),
            _ => {
                return bad(format!(
                    "PCI address field {:?} is not a PCI address",
                    String::from_utf8_lossy(&pci_raw[..end])
                ))
            }
        };
        let desc_len = u32::from_le_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]) as usize;
        if desc_len == 0 || desc_len > MAX_DESCRIPTOR_LEN {
            return bad(format!("descriptor length {desc_len} (must be 1..={MAX_DESCRIPTOR_LEN})"));
        }
        if bytes.len() != FIXED_LEN + desc_len {
            return bad(format!(
                "{} bytes after the envelope, descriptor length says {desc_len}",
                bytes.len() - FIXED_LEN
            ));
        }
        Ok(Self { kind, len, host_addr, pci, descriptor: bytes[FIXED_LEN..].to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ExportEnvelope {
        ExportEnvelope {
            kind: MemoryKind::Host,
            len: 1 << 20,
            host_addr: 0x7f00_0000_0000,
            pci: "0000:3b:00.0".into(),
            descriptor: (0..300u32).map(|i| i as u8).collect(),
        }
    }

    #[test]
    fn round_trip_both_kinds() {
        for kind in [MemoryKind::Host, MemoryKind::GpuDmabuf] {
            let e = ExportEnvelope { kind, ..sample() };
            let bytes = e.encode().expect("encode");
            assert_eq!(bytes.len(), FIXED_LEN + 300);
            assert_eq!(ExportEnvelope::decode(&bytes).expect("decode"), e);
        }
    }

    #[test]
    fn pci_addresses() {
        for ok in ["0000:3b:00.0", "3b:00.1", "ABCD:ff:1f.7"] {
            assert!(is_pci_address(ok), "{ok}");
        }
        for bad in ["", "3b:00", "3b:00.8", "0000:3b:00:0", "000:3b:00.0", "0000:3b:0g.0", "0000:3b:00.0\n", "mlx5_0"] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }

    fn expect_bad(bytes: &[u8], needle: &str) {
        match ExportEnvelope::decode(bytes) {
            Err(Error::BadExport(why)) => assert!(why.contains(needle), "{why:?} lacks {needle:?}"),
            other => panic!("expected BadExport({needle}), got {other:?}"),
        }
    }

    #[test]
    fn every_corruption_is_a_typed_error() {
        let good = sample().encode().expect("encode");
        expect_bad(&good[..10], "shorter");
        expect_bad(&[], "shorter");
        let patch = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            b
        };
        expect_bad(&patch(0, b'X'), "magic");
        expect_bad(&patch(4, 2), "version 2");
        expect_bad(&patch(5, 9), "kind 9");
        expect_bad(&patch(6, 1), "reserved");
        expect_bad(&patch(45, 1), "reserved");
        expect_bad(&patch(24, b'z'), "not a PCI address");
        expect_bad(&patch(38, b'x'), "NUL-padded");
        // Truncated or padded descriptor.
        expect_bad(&good[..good.len() - 1], "descriptor length says 300");
        let mut longer = good.clone();
        longer.push(0);
        expect_bad(&longer, "descriptor length says 300");
        // Lengths.
        let mut zero_len = good.clone();
        zero_len[8..16].copy_from_slice(&0u64.to_le_bytes());
        expect_bad(&zero_len, "zero-length");
        let mut wraps = good.clone();
        wraps[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        expect_bad(&wraps, "wraps");
        let mut huge = good.clone();
        huge[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        expect_bad(&huge, "descriptor length 4294967295");
    }

    #[test]
    fn encode_refuses_what_decode_would_refuse() {
        assert!(ExportEnvelope { pci: "mlx5_0".into(), ..sample() }.encode().is_err());
        assert!(ExportEnvelope { descriptor: vec![], ..sample() }.encode().is_err());
        assert!(ExportEnvelope { descriptor: vec![0; MAX_DESCRIPTOR_LEN + 1], ..sample() }.encode().is_err());
        assert!(ExportEnvelope { len: 0, ..sample() }.encode().is_err());
        assert!(ExportEnvelope { host_addr: u64::MAX, ..sample() }.encode().is_err());
    }
}
