//! Memory a transport can place bytes into or take them from: a host region
//! (direct placement) or an agent-side staging buffer.

use std::io;
use std::os::fd::BorrowedFd;

/// Errors reaching a region.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    #[error("access of {len} bytes at offset {offset} is outside the {region_len}-byte region")]
    OutOfBounds { offset: u64, len: u64, region_len: u64 },
    #[error("unknown or expired memory ticket; hand the fd over the memory socket first")]
    UnknownTicket,
    #[error("cannot map the region: {0}")]
    Map(String),
    #[error("{0}")]
    Unsupported(String),
    /// A memory export (DOCA envelope/descriptor) that does not parse or
    /// does not match the registration.
    #[error("bad memory export: {0}")]
    BadExport(String),
    /// The memory backend ran out of a resource (DPU memory, descriptors).
    #[error("memory backend exhausted: {0}")]
    Exhausted(String),
    /// The memory backend failed on a valid request (device, driver).
    #[error("memory backend failed: {0}")]
    Backend(String),
}

/// A window of memory the NIC reaches through a key made by another stack
/// (DOCA's RDMA bridge for host memory imported on a DPU), valid on one PD.
pub struct NicWindow {
    /// The address remote peers put in their work requests.
    pub addr: u64,
    /// The key valid on the PD the window was made for.
    pub rkey: u32,
    /// Keeps the key valid; dropping it ends the window.
    pub guard: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for NicWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NicWindow").field("addr", &format_args!("{:#x}", self.addr)).field("rkey", &self.rkey).finish()
    }
}

impl From<sluice_shm::ShmError> for MemError {
    fn from(e: sluice_shm::ShmError) -> Self {
        match e {
            sluice_shm::ShmError::OutOfBounds { offset, len, region_len } => {
                Self::OutOfBounds { offset, len, region_len }
            }
            other => Self::Map(other.to_string()),
        }
    }
}

/// A region the data plane writes object bytes into (GET) and reads them
/// from (PUT). Every access is bounds-checked.
pub trait RegionMemory: Send + Sync + std::fmt::Debug {
    fn len(&self) -> u64;
    /// Regions are never empty (zero-length registration is refused).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError>;
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError>;

    /// Fails unless `[offset, offset+len)` lies inside the region.
    fn check(&self, offset: u64, len: u64) -> Result<(), MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(MemError::OutOfBounds { offset, len, region_len: self.len() }),
        }
    }

    /// Whether this memory is mapped here: [`read_from_fd`](Self::read_from_fd)
    /// reads straight into it and checksums read it in place. `false`
    /// (memory reached by DMA): those go through bounce buffers, and a
    /// caller holding the bytes already had better copy them in itself.
    fn is_mapped(&self) -> bool {
        false
    }

    /// CRC-64/NVME of `[offset, offset+len)`.
    fn crc64nvme(&self, offset: u64, len: u64) -> Result<u64, MemError> {
        let mut digest = crate::crc64::digest();
        self.crc64nvme_update(&mut digest, offset, len)?;
        Ok(digest.finalize())
    }

    /// Feeds `[offset, offset+len)` to `digest`. Implementations backed by a
    /// mapping checksum the memory where it lies; this default copies it
    /// through a bounce buffer (memory reached by DMA, tests).
    fn crc64nvme_update(&self, digest: &mut crate::crc64::Digest, offset: u64, len: u64) -> Result<(), MemError> {
        self.check(offset, len)?;
        let mut buf = vec![0u8; (1 << 20).min(len.max(1) as usize)];
        let mut pos = 0;
        while pos < len {
            let n = (len - pos).min(buf.len() as u64) as usize;
            self.read_at(offset + pos, &mut buf[..n])?;
            digest.update(&buf[..n]);
            pos += n as u64;
        }
        Ok(())
    }

    /// One read from `fd` into the region at `offset`, at most `len` bytes.
    /// Implementations backed by a mapping read straight into it; this
    /// default goes through a bounce buffer.
    fn read_from_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.check(offset, len as u64).map_err(io::Error::other)?;
        let mut buf = vec![0u8; len.min(1 << 20)];
        let n = nix_read(fd, &mut buf)?;
        self.write_at(offset, &buf[..n]).map_err(io::Error::other)?;
        Ok(n)
    }

    /// One write of up to `len` bytes at `offset` to `fd`.
    fn write_to_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let mut buf = vec![0u8; len.min(1 << 20)];
        self.read_at(offset, &mut buf).map_err(io::Error::other)?;
        nix_write(fd, &buf)
    }

    /// The memory as something a NIC can register (verbs transport), if it
    /// is pinned at a fixed address.
    fn pinned(&self) -> Option<std::sync::Arc<dyn sluice_rdma::PinnedMemory>> {
        None
    }

    /// Why the CPU cannot touch this memory here, when it cannot: GPU
    /// memory a co-located agent reaches only through its NIC (a dma-buf
    /// memory region). `write_at`/`read_at` then fail, so such a region
    /// takes only direct one-sided transfers through
    /// [`nic_window`](Self::nic_window) (verbs RC, DC): no HTTP part, no
    /// staged copy, no software transport, no checksum pass over its
    /// bytes. Callers refuse a request that would need one before it starts.
    fn nic_only(&self) -> Option<&str> {
        None
    }

    /// For memory that is not [`pinned`](Self::pinned) here but that the NIC
    /// can still reach (host memory imported on a DPU, GPU memory registered
    /// as a dma-buf): a key for
    /// `[offset, offset + len)` valid on `pd`. `None`: not reachable that way.
    fn nic_window(
        &self,
        _pd: &std::sync::Arc<sluice_rdma::ProtectionDomain>,
        _offset: u64,
        _len: u64,
        _remote_write: bool,
    ) -> Option<Result<NicWindow, MemError>> {
        None
    }
}

// The defaults work on a duplicate of the descriptor (closed on return).
fn nix_read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let mut f = std::fs::File::from(fd.try_clone_to_owned()?);
    io::Read::read(&mut f, buf)
}

fn nix_write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    let mut f = std::fs::File::from(fd.try_clone_to_owned()?);
    io::Write::write(&mut f, buf)
}

/// A mapped shared-memory region (memfd): the co-located host region, and
/// the agent's staging buffers.
#[derive(Debug)]
pub struct SharedRegion(pub std::sync::Arc<sluice_shm::MappedRegion>);

impl SharedRegion {
    pub fn new(region: sluice_shm::MappedRegion) -> Self {
        Self(std::sync::Arc::new(region))
    }
}

impl RegionMemory for SharedRegion {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError> {
        Ok(self.0.write_at(offset, data)?)
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        Ok(self.0.read_at(offset, out)?)
    }
    fn read_from_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.0.read_from_fd(offset, len, fd)
    }
    fn write_to_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> io::Result<usize> {
        self.0.write_to_fd(offset, len, fd)
    }
    fn is_mapped(&self) -> bool {
        true
    }
    /// Checksums the mapping in place: no copy of the bytes first (that
    /// copy was half the CPU of checking a GET that landed by the one-sided
    /// transport). A peer writing the window meanwhile makes the sum cover
    /// a mix of old and new bytes, so the check fails, as it must for bytes
    /// that changed under a transfer.
    fn crc64nvme_update(&self, digest: &mut crate::crc64::Digest, offset: u64, len: u64) -> Result<(), MemError> {
        let start = self.0.check(offset, len)?;
        digest.update(&self.0.as_slice()[start..start + len as usize]);
        Ok(())
    }
    fn pinned(&self) -> Option<std::sync::Arc<dyn sluice_rdma::PinnedMemory>> {
        Some(self.0.clone())
    }
}

/// Memory in a `Vec`, reached only by copies (`read_at`/`write_at`), as a
/// DPU reaches host memory by DMA: every default of [`RegionMemory`]
/// applies. For tests of what handles such memory.
#[derive(Debug)]
pub struct CopiedRegion(std::sync::Mutex<Vec<u8>>);

impl CopiedRegion {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(std::sync::Mutex::new(bytes))
    }
}

impl RegionMemory for CopiedRegion {
    fn len(&self) -> u64 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), MemError> {
        self.check(offset, data.len() as u64)?;
        self.0.lock().unwrap_or_else(|p| p.into_inner())[offset as usize..][..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, out.len() as u64)?;
        out.copy_from_slice(&self.0.lock().unwrap_or_else(|p| p.into_inner())[offset as usize..][..out.len()]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_region_checksums_in_place_as_the_copying_default_does() {
        let len = (3 << 20) + 4099;
        let data: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mapped = SharedRegion::new(sluice_shm::MappedRegion::create("crc-test", len as u64).unwrap());
        mapped.write_at(0, &data).unwrap();
        let copied = CopiedRegion::new(data.clone());
        for (off, n) in [(0, len), (1, 0), (7, 4096), (4095, (2 << 20) + 3), (len - 1, 1)] {
            let want = crate::crc64::checksum(&data[off..off + n]);
            assert_eq!(mapped.crc64nvme(off as u64, n as u64).unwrap(), want, "mapped {off}+{n}");
            assert_eq!(copied.crc64nvme(off as u64, n as u64).unwrap(), want, "copied {off}+{n}");
        }
        // Out of bounds is refused by both, nothing read.
        for r in [&mapped as &dyn RegionMemory, &copied] {
            assert!(matches!(r.crc64nvme(len as u64 - 3, 4), Err(MemError::OutOfBounds { .. })));
            assert!(matches!(r.crc64nvme(u64::MAX, 2), Err(MemError::OutOfBounds { .. })));
        }
    }
}
