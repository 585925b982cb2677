//! A shared-memory region: a memfd mapped read-write and shared, so that the
//! shim, the agent and the client all see the same pages.

use std::ffi::CString;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// Errors from creating or mapping shared memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    #[error("region length must be greater than zero")]
    EmptyRegion,
    #[error("region length {0} does not fit this machine's address space")]
    TooLarge(u64),
    #[error("the memory file holds {actual} bytes, fewer than the {wanted} requested")]
    FileTooSmall { wanted: u64, actual: u64 },
    #[error("access of {len} bytes at offset {offset} is outside the {region_len}-byte region")]
    OutOfBounds { offset: u64, len: u64, region_len: u64 },
    /// A descriptor that could shrink under a mapping: truncating the file
    /// would make every access past the new end fault (SIGBUS) in whoever
    /// maps it, so such descriptors are never mapped.
    #[error(
        "the descriptor is not a memfd sealed against shrinking ({0}); create it with \
         memfd_create(MFD_ALLOW_SEALING), size it, then fcntl(F_ADD_SEALS, F_SEAL_SHRINK)"
    )]
    NotSealed(String),
    #[error("{op} failed: {source}")]
    Os { op: &'static str, source: std::io::Error },
}

fn os(op: &'static str) -> impl FnOnce(nix::errno::Errno) -> ShmError {
    move |e| ShmError::Os { op, source: std::io::Error::from(e) }
}

/// Creates an anonymous memory file of `len` bytes (zero-filled),
/// close-on-exec, sealed at that size: it can never shrink or grow, and its
/// seals can never change, so it is safe to hand to other processes that
/// map it (see [`check_sealed`]).
pub fn create_memfd(name: &str, len: u64) -> Result<OwnedFd, ShmError> {
    if len == 0 {
        return Err(ShmError::EmptyRegion);
    }
    let cname = CString::new(name.replace('\0', "_")).unwrap_or_default();
    let fd = memfd_create(&cname, MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
        .map_err(os("memfd_create"))?;
    let file = File::from(fd);
    file.set_len(len).map_err(|source| ShmError::Os { op: "ftruncate", source })?;
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(file.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals)).map_err(os("fcntl(F_ADD_SEALS)"))?;
    Ok(OwnedFd::from(file))
}

/// Checks that `fd` is a memory file that can never shrink (a memfd with
/// `F_SEAL_SHRINK`) and returns its size. Anything else — an unsealed
/// memfd, a regular file, a pipe — could be truncated by whoever else holds
/// it, and a mapping of it would then fault (SIGBUS) on access.
pub fn check_sealed(fd: BorrowedFd<'_>) -> Result<u64, ShmError> {
    let seals = match fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits),
        Err(nix::errno::Errno::EINVAL) => {
            return Err(ShmError::NotSealed("it does not support seals: not a memfd".into()));
        }
        Err(e) => return Err(ShmError::NotSealed(format!("F_GET_SEALS failed: {e}"))),
    };
    if !seals.contains(SealFlag::F_SEAL_SHRINK) {
        return Err(ShmError::NotSealed(format!("a memfd without F_SEAL_SHRINK (seals: {seals:?})")));
    }
    // A hugetlbfs memfd (MFD_HUGETLB) cannot be unmapped at the region's
    // byte length (munmap wants whole huge pages: each release would leave
    // its mapping behind), and a hole punched in it can fault a later
    // write: refused. Huge pages come from a plain memfd with THP.
    let fs = nix::sys::statfs::fstatfs(fd).map_err(os("fstatfs"))?;
    if fs.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC {
        return Err(ShmError::NotSealed(
            "a hugetlbfs memfd (MFD_HUGETLB); use a plain memfd (transparent huge pages serve the same)".into(),
        ));
    }
    let size = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(os("fstat"))?.st_size;
    Ok(u64::try_from(size).unwrap_or(0))
}

/// A shared, read-write mapping of the first `len` bytes of a memory file.
///
/// Accesses go through [`MappedRegion::write_at`] / [`MappedRegion::read_at`],
/// which check bounds and copy with raw pointers: the pages are shared with
/// other processes, so no Rust reference to them is ever handed out mutably.
pub struct MappedRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain memory owned by this value (unmapped in Drop);
// all access copies through raw pointers with bounds checks, and concurrent
// writers to disjoint or even overlapping windows only race on byte values,
// never on Rust-visible invariants. No thread-affine state is held.
unsafe impl Send for MappedRegion {}
// SAFETY: see `Send`; `&self` methods only copy bytes in or out.
unsafe impl Sync for MappedRegion {}

impl std::fmt::Debug for MappedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRegion").field("len", &self.len).finish_non_exhaustive()
    }
}

impl MappedRegion {
    /// Maps `len` bytes of `fd`, which must be a memfd sealed against
    /// shrinking and at least `len` bytes long ([`check_sealed`]): a mapping
    /// past the end of a file faults (SIGBUS) on access, and an unsealed file
    /// could be truncated under the mapping at any time by another holder.
    pub fn map(fd: OwnedFd, len: u64) -> Result<Self, ShmError> {
        if len == 0 {
            return Err(ShmError::EmptyRegion);
        }
        let actual = check_sealed(fd.as_fd())?;
        let file = File::from(fd);
        if actual < len {
            return Err(ShmError::FileTooSmall { wanted: len, actual });
        }
        let ulen = usize::try_from(len).map_err(|_| ShmError::TooLarge(len))?;
        let nz = NonZeroUsize::new(ulen).ok_or(ShmError::EmptyRegion)?;
        // SAFETY: we map a fresh range chosen by the kernel (addr = None), so no
        // existing Rust memory is affected; the file is at least `len` bytes
        // and sealed against shrinking (checked above), so every byte of the
        // mapping stays backed for as long as it exists.
        let ptr = unsafe {
            mmap(None, nz, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, file.as_fd(), 0)
        }
        .map_err(os("mmap"))?;
        Ok(Self { ptr: ptr.cast(), len: ulen, fd: OwnedFd::from(file) })
    }

    /// Creates a new memfd of `len` bytes and maps it.
    pub fn create(name: &str, len: u64) -> Result<Self, ShmError> {
        Self::map(create_memfd(name, len)?, len)
    }

    /// Start of the mapping (for registering it with a NIC; accessing the
    /// memory through it is the caller's `unsafe` business).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Always false: empty regions are refused at creation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory file behind the mapping (to pass to another process).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Checks that `[offset, offset+len)` lies inside the region and returns the
    /// start as usize.
    pub fn check(&self, offset: u64, len: u64) -> Result<usize, ShmError> {
        let oob = || ShmError::OutOfBounds { offset, len, region_len: self.len as u64 };
        let end = offset.checked_add(len).ok_or_else(oob)?;
        if end > self.len as u64 {
            return Err(oob());
        }
        usize::try_from(offset).map_err(|_| oob())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ShmError> {
        let start = self.check(offset, data.len() as u64)?;
        // SAFETY: `check` proved start + data.len() <= self.len, so the
        // destination lies inside our live mapping; `data` is a separate Rust
        // slice, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(start), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from the region at `offset` into `out`.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), ShmError> {
        let start = self.check(offset, out.len() as u64)?;
        // SAFETY: bounds checked as in `write_at`; `out` is an exclusive Rust
        // slice distinct from the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(start), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Fills `[offset, offset+len)` with `byte`.
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), ShmError> {
        let start = self.check(offset, len)?;
        // SAFETY: bounds checked; writing bytes into our own mapping.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(start), byte, len as usize) };
        Ok(())
    }

    /// One `read(2)` from `fd` straight into the region at `offset` (at most
    /// `len` bytes): the kernel copies socket data into the final memory with
    /// no bounce buffer. Returns the bytes read (0 at end of stream);
    /// `WouldBlock` passes through for non-blocking sockets.
    pub fn read_from_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> std::io::Result<usize> {
        let start = self.check(offset, len as u64).map_err(std::io::Error::other)?;
        // SAFETY: `check` proved [start, start+len) lies inside our live
        // mapping; read(2) writes at most `len` bytes there and nothing in
        // Rust holds a reference into that window (all access is by copy).
        let n = unsafe { libc::read(fd.as_raw_fd(), self.ptr.as_ptr().add(start).cast(), len) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// One `write(2)` of up to `len` bytes from the region at `offset` to
    /// `fd` (send straight from the final memory). Returns the bytes written.
    pub fn write_to_fd(&self, offset: u64, len: usize, fd: BorrowedFd<'_>) -> std::io::Result<usize> {
        let start = self.check(offset, len as u64).map_err(std::io::Error::other)?;
        // SAFETY: bounds checked as above; write(2) only reads the window.
        let n = unsafe { libc::write(fd.as_raw_fd(), self.ptr.as_ptr().add(start).cast(), len) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// A read-only view of the whole region, for zero-copy consumers (hashing,
    /// parsing) on the side that owns the region. The bytes may change only
    /// while a request that the owner issued against this region is in flight;
    /// callers must not hold the view across such a request.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe our live mapping for as long as `self`
        // lives; the lifetime of the slice is tied to `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned and nothing else
        // unmaps them; no reference into the mapping outlives `self`.
        if let Err(e) = unsafe { munmap(self.ptr.cast(), self.len) } {
            // Nothing useful can be done; the address range leaks.
            eprintln!("sluice-shm: munmap failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_share_pages() {
        let a = MappedRegion::create("t", 4096).unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = MappedRegion::map(dup, 4096).unwrap();
        a.write_at(100, b"hello").unwrap();
        let mut out = [0u8; 5];
        b.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(&b.as_slice()[100..105], b"hello");
    }

    #[test]
    fn bounds_are_checked() {
        let r = MappedRegion::create("t", 10).unwrap();
        assert!(r.write_at(8, b"abc").is_err());
        assert!(r.write_at(u64::MAX, b"a").is_err());
        assert!(r.read_at(10, &mut [0u8; 1]).is_err());
        assert!(r.write_at(7, b"abc").is_ok());
        assert!(r.fill(0, 11, 0).is_err());
    }

    #[test]
    fn socket_bytes_land_directly_in_the_region() {
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let r = MappedRegion::create("t", 64).unwrap();
        std::io::Write::write_all(&mut a, b"direct").unwrap();
        assert_eq!(r.read_from_fd(10, 6, b.as_fd()).unwrap(), 6);
        assert_eq!(&r.as_slice()[10..16], b"direct");
        assert!(r.read_from_fd(60, 6, b.as_fd()).is_err(), "out of bounds");
        assert_eq!(r.write_to_fd(10, 6, b.as_fd()).unwrap(), 6);
        let mut out = [0u8; 6];
        std::io::Read::read_exact(&mut a, &mut out).unwrap();
        assert_eq!(&out, b"direct");
    }

    /// The SIGBUS attack: a region whose file is truncated under the
    /// mapping. Files this crate creates cannot shrink; files it did not
    /// create are mapped only when they cannot either.
    /// A sealed hugetlbfs memfd is refused: released, its mapping could not
    /// be unmapped at the region's length and would stay behind.
    #[test]
    fn a_hugetlb_memfd_is_refused() {
        let flags = MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING | MemFdCreateFlag::MFD_HUGETLB;
        let huge = memfd_create(c"huge", flags).expect("memfd_create(MFD_HUGETLB) (a kernel with hugetlbfs)");
        File::from(huge.try_clone().unwrap()).set_len(2 << 20).unwrap();
        fcntl(huge.as_raw_fd(), FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
        let e = check_sealed(huge.as_fd()).unwrap_err();
        assert!(matches!(&e, ShmError::NotSealed(why) if why.contains("hugetlbfs")), "{e}");
        assert!(MappedRegion::map(huge, 4096).is_err());
    }

    #[test]
    fn only_files_that_cannot_shrink_are_mapped() {
        let ours = create_memfd("t", 4096).unwrap();
        let f = File::from(ours.try_clone().unwrap());
        assert!(f.set_len(0).is_err(), "a sealed memfd refuses to shrink");
        assert!(f.set_len(8192).is_err(), "nor does it grow");
        assert_eq!(check_sealed(ours.as_fd()).unwrap(), 4096);
        assert!(MappedRegion::map(ours, 4096).is_ok());

        let unsealed = memfd_create(c"t", MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING).unwrap();
        File::from(unsealed.try_clone().unwrap()).set_len(4096).unwrap();
        let e = MappedRegion::map(unsealed, 4096).unwrap_err();
        assert!(matches!(&e, ShmError::NotSealed(why) if why.contains("without F_SEAL_SHRINK")), "{e}");

        let no_sealing = memfd_create(c"t", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        File::from(no_sealing.try_clone().unwrap()).set_len(4096).unwrap();
        assert!(matches!(MappedRegion::map(no_sealing, 4096), Err(ShmError::NotSealed(_))));

        let path = std::env::temp_dir().join(format!("sluice-shm-regular-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let regular = OwnedFd::from(File::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let e = MappedRegion::map(regular, 4096).unwrap_err();
        assert!(matches!(&e, ShmError::NotSealed(why) if why.contains("not a memfd")), "{e}");
    }

    #[test]
    fn short_file_is_refused() {
        let fd = create_memfd("t", 10).unwrap();
        match MappedRegion::map(fd, 11) {
            Err(ShmError::FileTooSmall { wanted: 11, actual: 10 }) => {}
            other => panic!("unexpected: {other:?}"),
        }
        assert!(matches!(MappedRegion::create("t", 0), Err(ShmError::EmptyRegion)));
    }
}
