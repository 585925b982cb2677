//! Checks on a descriptor a client says is a dma-buf (GPU memory exported
//! with `cuMemGetHandleForAddressRange`), done by whoever receives it — the
//! shim, and again the co-located agent — before anything registers it.
//!
//! The kernel describes a dma-buf in `/proc/self/fdinfo/<fd>`: an
//! `exp_name:` line names the exporting driver (`nv_dmabuf` for CUDA), and
//! no other kind of file has one. Its size is what `lseek(SEEK_END)`
//! returns (the dma-buf documentation's way; there is no mapping to stat).

use std::os::fd::{AsRawFd, BorrowedFd};

/// What the kernel says about a dma-buf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmabufInfo {
    /// The exporting driver (`exp_name:`).
    pub exporter: String,
    /// Bytes in the buffer.
    pub size: u64,
}

/// A descriptor refused as a dma-buf region.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DmabufError {
    #[error("cannot inspect the passed descriptor: {0}")]
    Inspect(std::io::Error),
    #[error("the descriptor passed for a GPU region is not a dma-buf (export one with cuMemGetHandleForAddressRange)")]
    NotDmabuf,
    #[error("dma-buf from {exporter}: cannot read its size: {source}")]
    Size { exporter: String, source: std::io::Error },
    #[error("{len} bytes at offset {offset} do not fit the {size}-byte dma-buf from {exporter}")]
    Range { offset: u64, len: u64, size: u64, exporter: String },
    /// The CUDA address cannot be that of the byte at the offset.
    #[error("{0}")]
    Address(String),
}

/// The CPU page size. Drivers map a dma-buf by pages, so the address a
/// window is registered at (its CUDA address) and its offset in the buffer
/// must agree modulo it.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it reads a constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// What a shim sends with a dma-buf on a co-located agent's memory socket
/// (next to the memfd frame, `R` + fd): the tag `D`, then the region's
/// offset in the dma-buf, its length and its CUDA address, each a
/// little-endian u64, with exactly one fd attached to the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmabufHandOver {
    pub offset: u64,
    pub len: u64,
    pub gpu_address: u64,
}

impl DmabufHandOver {
    pub const TAG: u8 = b'D';
    /// Bytes after the tag.
    pub const BODY_LEN: usize = 24;

    pub fn encode(&self) -> [u8; 1 + Self::BODY_LEN] {
        let mut out = [0u8; 1 + Self::BODY_LEN];
        out[0] = Self::TAG;
        out[1..9].copy_from_slice(&self.offset.to_le_bytes());
        out[9..17].copy_from_slice(&self.len.to_le_bytes());
        out[17..25].copy_from_slice(&self.gpu_address.to_le_bytes());
        out
    }

    /// Refuses a CUDA address that cannot be the address of the byte at
    /// `offset`: zero, one that disagrees with the offset within a page,
    /// or one whose range wraps around.
    pub fn check_address(&self) -> Result<(), DmabufError> {
        let page = page_size();
        if self.gpu_address == 0 {
            return Err(DmabufError::Address("a GPU region needs its CUDA address (gpu_address)".into()));
        }
        if self.gpu_address % page != self.offset % page {
            return Err(DmabufError::Address(format!(
                "CUDA address {:#x} and dma-buf offset {:#x} differ within a {page}-byte page (gpu_address must be \
                 the address of the byte at the offset)",
                self.gpu_address, self.offset
            )));
        }
        if self.gpu_address.checked_add(self.len).is_none() {
            return Err(DmabufError::Address(format!(
                "{} bytes at CUDA address {:#x} wrap around",
                self.len, self.gpu_address
            )));
        }
        Ok(())
    }

    pub fn decode(body: &[u8; Self::BODY_LEN]) -> Self {
        let at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Self { offset: at(0), len: at(8), gpu_address: at(16) }
    }
}

/// Checks that `fd` is a dma-buf and that `[offset, offset+len)` (len > 0)
/// lies inside it; returns what the kernel says about it.
pub fn check_dmabuf(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<DmabufInfo, DmabufError> {
    let info =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).map_err(DmabufError::Inspect)?;
    let exporter = exporter_of(&info).ok_or(DmabufError::NotDmabuf)?;
    let size = fd
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|mut f| std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)))
        .map_err(|source| DmabufError::Size { exporter: exporter.clone(), source })?;
    let info = DmabufInfo { exporter, size };
    check_window(&info, offset, len)?;
    Ok(info)
}

/// The exporter named in a descriptor's fdinfo, if it is a dma-buf.
fn exporter_of(fdinfo: &str) -> Option<String> {
    fdinfo.lines().find_map(|l| l.strip_prefix("exp_name:")).map(|s| s.trim().to_owned())
}

/// `[offset, offset+len)` must be non-empty and inside the buffer.
fn check_window(info: &DmabufInfo, offset: u64, len: u64) -> Result<(), DmabufError> {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > info.size) {
        return Err(DmabufError::Range { offset, len, size: info.size, exporter: info.exporter.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn memfds_and_pipes_are_not_dmabufs() {
        let memfd = crate::create_memfd("t", 4096).expect("memfd");
        let (r, _w) = std::io::pipe().expect("pipe");
        for (what, fd) in [("memfd", memfd.as_fd()), ("pipe", r.as_fd())] {
            match check_dmabuf(fd, 0, 4096) {
                Err(e @ DmabufError::NotDmabuf) => assert!(e.to_string().contains("not a dma-buf"), "{what}: {e}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_exporter_comes_from_fdinfo() {
        let cuda =
            "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1060\nsize:\t2097152\ncount:\t1\nexp_name:\tnv_dmabuf\n";
        assert_eq!(exporter_of(cuda).as_deref(), Some("nv_dmabuf"));
        assert_eq!(exporter_of("pos:\t0\nflags:\t02\n"), None);
    }

    #[test]
    fn the_hand_over_frame_round_trips() {
        let h = DmabufHandOver { offset: 0x1000, len: 3 << 20, gpu_address: 0x7f00_dead_0000 };
        let bytes = h.encode();
        assert_eq!(bytes[0], b'D');
        let body: &[u8; DmabufHandOver::BODY_LEN] = bytes[1..].try_into().expect("24 bytes");
        assert_eq!(DmabufHandOver::decode(body), h);
    }

    #[test]
    fn the_cuda_address_must_be_that_of_the_byte_at_the_offset() {
        let page = page_size();
        let at = |offset, gpu_address| DmabufHandOver { offset, len: 1 << 20, gpu_address };
        assert!(at(0, 0x7f00_0000_0000).check_address().is_ok());
        assert!(at(page + 100, 0x7f00_0000_0000 + 100).check_address().is_ok());
        for (h, says) in [
            (at(0, 0), "needs its CUDA address"),
            (at(0, 0x7f00_0000_0000 + 8), "differ within a"),
            (at(0, u64::MAX - page + 1), "wrap around"),
        ] {
            let e = h.check_address().unwrap_err();
            assert!(e.to_string().contains(says), "{h:?}: {e}");
        }
    }

    #[test]
    fn windows_outside_the_buffer_are_refused() {
        let info = DmabufInfo { exporter: "nv_dmabuf".into(), size: 2 << 20 };
        assert!(check_window(&info, 0, 2 << 20).is_ok());
        assert!(check_window(&info, 1 << 20, 1 << 20).is_ok());
        for (offset, len) in [(0, 0), (0, (2 << 20) + 1), (1 << 20, (1 << 20) + 1), (2 << 20, 1), (u64::MAX, 2)] {
            let e = check_window(&info, offset, len).unwrap_err();
            assert!(matches!(e, DmabufError::Range { .. }), "{offset}+{len}: {e}");
            assert!(e.to_string().contains("do not fit the 2097152-byte dma-buf from nv_dmabuf"), "{e}");
        }
    }
}
