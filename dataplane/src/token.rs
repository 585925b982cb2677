//! The `x-amz-rdma-token` descriptor codec.
//!
//! Standard form: seven colon-separated lowercase hex fields, 81 characters:
//! `addr(16):size(8):rkey(8):lid(4):dct(6):gid_present(1):gid(32)`.
//! Extended form (PyTorch cuObject storage, multi-storage-client, minio-rs,
//! NIXL, elbencho): the standard form plus `:start(16):size(16)`, 115
//! characters, where the suffix overrides the address and size. A trailing
//! `;` is tolerated on either. Everything else is rejected.

use std::fmt;

/// Length of the standard descriptor.
pub const STANDARD_LEN: usize = 81;
/// Length of the extended descriptor.
pub const EXTENDED_LEN: usize = 115;

/// A parsed descriptor. `addr`/`size` are the effective transfer window
/// (from the suffix when the extended form was used).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub addr: u64,
    pub size: u64,
    pub rkey: u32,
    pub lid: u16,
    /// DC target number (24 bits).
    pub dct: u32,
    /// GID in network order, when present.
    pub gid: Option<[u8; 16]>,
    /// Registered window (field 1 and 2) as sent, before any suffix override.
    pub region_addr: u64,
    pub region_size: u32,
}

impl fmt::Debug for Token {
    // The rkey is a credential for the window: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("lid", &self.lid)
            .field("dct", &format_args!("{:#x}", self.dct))
            .field("gid", &self.gid.map(std::net::Ipv6Addr::from))
            .finish_non_exhaustive()
    }
}

/// Why a descriptor was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("token is {0} characters; expected 81 or 115 (optionally followed by ';')")]
    Length(usize),
    #[error("token field {field} is {got:?}; expected {width} lowercase hex digits")]
    Field { field: usize, width: usize, got: String },
    #[error("token GID flag must be 0 or 1")]
    GidFlag,
    #[error("token DCT number {0:#x} does not fit 24 bits")]
    Dct(u32),
    #[error("token window of {size} bytes at {addr:#x} runs past the end of the address space")]
    Window { addr: u64, size: u64 },
}

/// Field widths of the standard form, then the suffix.
const WIDTHS: [usize; 9] = [16, 8, 8, 4, 6, 1, 32, 16, 16];

fn hex_field(s: &str, field: usize) -> Result<&str, TokenError> {
    let width = WIDTHS[field];
    if s.len() == width && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(s)
    } else {
        Err(TokenError::Field { field: field + 1, width, got: s.chars().take(40).collect() })
    }
}

impl Token {
    /// A standard descriptor for a registered window.
    pub fn new(addr: u64, size: u32, rkey: u32, lid: u16, dct: u32, gid: Option<[u8; 16]>) -> Result<Self, TokenError> {
        if dct > 0xff_ffff {
            return Err(TokenError::Dct(dct));
        }
        Ok(Self { addr, size: u64::from(size), rkey, lid, dct, gid, region_addr: addr, region_size: size })
    }

    /// Narrows the transfer window (the extended form's suffix).
    pub fn with_transfer(mut self, addr: u64, size: u64) -> Self {
        self.addr = addr;
        self.size = size;
        self
    }

    /// Whether the effective window differs from the registered one, i.e.
    /// whether the extended form is needed to say it.
    pub fn is_extended(&self) -> bool {
        self.addr != self.region_addr || self.size != u64::from(self.region_size)
    }

    fn standard(&self) -> String {
        // Built by hand, one allocation: formatting showed in the agent's
        // profile (one token per one-sided request).
        let mut out = String::with_capacity(STANDARD_LEN);
        push_hex(&mut out, self.region_addr, 16);
        out.push(':');
        push_hex(&mut out, u64::from(self.region_size), 8);
        out.push(':');
        push_hex(&mut out, u64::from(self.rkey), 8);
        out.push(':');
        push_hex(&mut out, u64::from(self.lid), 4);
        out.push(':');
        push_hex(&mut out, u64::from(self.dct & 0xff_ffff), 6);
        out.push(':');
        out.push(if self.gid.is_some() { '1' } else { '0' });
        out.push(':');
        for b in self.gid.unwrap_or([0; 16]) {
            push_hex(&mut out, u64::from(b), 2);
        }
        out
    }

    /// Parses either form, tolerating one trailing `;`.
    pub fn parse(s: &str) -> Result<Self, TokenError> {
        let s = s.strip_suffix(';').unwrap_or(s);
        if s.len() != STANDARD_LEN && s.len() != EXTENDED_LEN {
            return Err(TokenError::Length(s.len()));
        }
        let fields: Vec<&str> = s.split(':').collect();
        if fields.len() != 7 && fields.len() != 9 {
            return Err(TokenError::Length(s.len()));
        }
        for (i, f) in fields.iter().enumerate() {
            hex_field(f, i)?;
        }
        // Every field is validated hex of a width that fits its type.
        let num = |i: usize| u64::from_str_radix(fields[i], 16).unwrap_or_default();
        let gid_flag = num(5);
        if gid_flag > 1 {
            return Err(TokenError::GidFlag);
        }
        let gid = if gid_flag == 1 {
            let mut g = [0u8; 16];
            for (i, b) in g.iter_mut().enumerate() {
                *b = u8::from_str_radix(&fields[6][2 * i..2 * i + 2], 16).unwrap_or_default();
            }
            Some(g)
        } else {
            None
        };
        let tok = Self::new(num(0), num(1) as u32, num(2) as u32, num(3) as u16, num(4) as u32, gid)?;
        let tok = if fields.len() == 9 { tok.with_transfer(num(7), num(8)) } else { tok };
        // Every address a transfer computes (the window's start plus what
        // was moved) must exist: refused here, not wrapped later.
        for (addr, size) in [(tok.region_addr, u64::from(tok.region_size)), (tok.addr, tok.size)] {
            if addr.checked_add(size).is_none() {
                return Err(TokenError::Window { addr, size });
            }
        }
        Ok(tok)
    }
}

impl fmt::Display for Token {
    /// The standard form, or the extended form when the transfer window was
    /// narrowed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_extended() {
            write!(f, "{}:{:016x}:{:016x}", self.standard(), self.addr, self.size)
        } else {
            f.write_str(&self.standard())
        }
    }
}

/// `v` as `width` lower-case hex digits (the low `width` nibbles).
fn push_hex(out: &mut String, v: u64, width: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for i in (0..width).rev() {
        out.push(DIGITS[((v >> (4 * i)) & 0xf) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = "0102030405060708:01020304:01020304:0102:010203:1:0102030405060708090a0b0c0d0e0f10";

    #[test]
    fn reference_example() {
        let t = Token::parse(EXAMPLE).unwrap();
        assert_eq!(t.addr, 0x0102030405060708);
        assert_eq!(t.size, 0x01020304);
        assert_eq!(t.rkey, 0x01020304);
        assert_eq!(t.lid, 0x0102);
        assert_eq!(t.dct, 0x010203);
        assert_eq!(t.gid.unwrap()[15], 0x10);
        assert_eq!(t.to_string(), EXAMPLE);
        assert_eq!(Token::parse(&format!("{EXAMPLE};")).unwrap(), t);
    }

    #[test]
    fn extended_form_overrides_address_and_size() {
        let ext = format!("{EXAMPLE}:0102030405061000:0000000000000100");
        assert_eq!(ext.len(), EXTENDED_LEN);
        let t = Token::parse(&ext).unwrap();
        assert_eq!((t.addr, t.size), (0x0102030405061000, 0x100));
        assert_eq!((t.region_addr, t.region_size), (0x0102030405060708, 0x01020304));
        assert_eq!(t.to_string(), ext);
        assert!(Token::parse(&format!("{ext};")).is_ok());
    }

    #[test]
    fn windows_past_the_end_of_the_address_space_are_refused() {
        let near_end = "fffffffffffff000:00002000:01020304:0102:010203:0:00000000000000000000000000000000";
        assert!(matches!(Token::parse(near_end), Err(TokenError::Window { .. })));
        let ext = format!("{EXAMPLE}:fffffffffffff000:0000000000002000");
        assert!(matches!(Token::parse(&ext), Err(TokenError::Window { .. })));
        // Its end (one past the last byte) must be an address too.
        let ends_below = format!("{EXAMPLE}:ffffffffffffe000:0000000000001000");
        assert!(Token::parse(&ends_below).is_ok());
        let ends_at_the_top = format!("{EXAMPLE}:fffffffffffff000:0000000000001000");
        assert!(matches!(Token::parse(&ends_at_the_top), Err(TokenError::Window { .. })));
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            ";",
            &EXAMPLE[1..],
            &format!("{EXAMPLE};;"),
            &EXAMPLE.to_uppercase(),
            &EXAMPLE.replace(":1:", ":2:"),
            &EXAMPLE.replacen(':', "-", 1),
            &format!("{EXAMPLE}:00"),
            &format!(" {}", &EXAMPLE[1..]),
            &EXAMPLE.replacen("0102:", "010g:", 1),
            "0102030405060708:01020304:01020304:0102:010203:1:0102030405060708090a0b0c0d0e0f1:0",
        ] {
            assert!(Token::parse(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn gid_absent() {
        let t = Token::new(0x1000, 4096, 7, 1, 2, None).unwrap();
        let s = t.to_string();
        assert!(s.contains(":0:00000000000000000000000000000000"));
        assert_eq!(Token::parse(&s).unwrap(), t);
        assert!(Token::new(0, 0, 0, 0, 0x100_0000, None).is_err());
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(addr: u64, size: u32, rkey: u32, lid: u16, dct in 0u32..0x100_0000,
                                         gid: Option<[u8; 16]>, ext: Option<(u64, u64)>) {
            let fits = |a: u64, s: u64| a.checked_add(s).is_some();
            prop_assume!(fits(addr, u64::from(size)) && ext.is_none_or(|(a, s)| fits(a, s)));
            let mut t = Token::new(addr, size, rkey, lid, dct, gid).unwrap();
            if let Some((a, s)) = ext {
                t = t.with_transfer(a, s);
            }
            let text = t.to_string();
            prop_assert!(text.len() == STANDARD_LEN || text.len() == EXTENDED_LEN);
            prop_assert_eq!(Token::parse(&text).unwrap(), t);
        }

        #[test]
        fn random_strings_never_panic(s in ".{0,130}") {
            let _ = Token::parse(&s);
        }

        #[test]
        fn hexish_strings_never_panic(s in "[0-9a-f:;]{75,120}") {
            let _ = Token::parse(&s);
        }
    }
}
