//! dma-buf memory regions (`ibv_reg_dmabuf_mr`): GPU memory that a NIC
//! reads and writes directly, with no CPU mapping on this side.
//!
//! A CUDA allocation exported as a dma-buf (`cuMemGetHandleForAddressRange`)
//! registered here gives an rkey under which a peer's one-sided WRITE lands
//! in HBM. Not every device can do it: providers without the verb (Soft-RoCE)
//! answer `EOPNOTSUPP` from libibverbs itself, and kernel drivers without a
//! dma-buf path answer it from the kernel. Both become
//! [`RdmaError::Unsupported`] with a message naming the cause, so callers can
//! report the path unavailable up front instead of failing a transfer.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_core_sys as sys;

use crate::error::{RdmaError, Result};
use crate::memory::{Access, Backing, MemoryRegion, ProtectionDomain};

/// The start of every message saying a device lacks dma-buf registration
/// (callers and tests match on it).
pub const DMABUF_UNSUPPORTED: &str = "this RDMA device cannot register dma-buf (GPU) memory";

/// How a failed `ibv_reg_dmabuf_mr` reads: errnos that mean "this device
/// (provider or kernel driver) has no dma-buf registration" become
/// `Unsupported`; the rest stay OS errors.
pub(crate) fn dmabuf_error(device: &str, e: std::io::Error) -> RdmaError {
    match e.raw_os_error() {
        // EOPNOTSUPP: libibverbs' default for providers without the verb,
        // or a kernel driver without `reg_user_mr_dmabuf`. EPROTONOSUPPORT
        // and ENOSYS: older kernels' uverbs without the method. EINVAL:
        // what drivers answer when the device cannot map this memory (the
        // window itself was checked before the call).
        Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS | libc::EINVAL) => {
            RdmaError::Unsupported(format!("{DMABUF_UNSUPPORTED}: {device}: ibv_reg_dmabuf_mr: {e}"))
        }
        _ => RdmaError::Os { op: "ibv_reg_dmabuf_mr", source: e },
    }
}

/// The size of a dma-buf: `lseek(fd, 0, SEEK_END)`, as the dma-buf
/// documentation defines it. Descriptors that are not seekable this way
/// (pipes, sockets) fail.
pub(crate) fn dmabuf_size(fd: &OwnedFd) -> Result<u64> {
    let dup = fd.try_clone().map_err(|source| RdmaError::Os { op: "dup", source })?;
    let mut f = std::fs::File::from(dup);
    std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).map_err(|source| RdmaError::Os { op: "lseek", source })
}

impl MemoryRegion {
    /// Registers `len` bytes at `offset` of the dma-buf `fd` in `pd`, at
    /// `iova`: remotes address the window's first byte as `iova` with this
    /// region's rkey, and nothing outside the window. The NIC then DMAs to
    /// and from the exporter's memory (GPU memory for a CUDA dma-buf)
    /// without a CPU mapping.
    ///
    /// `iova` and `offset` must agree modulo the page size (drivers map the
    /// buffer by pages); a CUDA buffer's address and its dma-buf offset do.
    /// A window outside the buffer is `Invalid` before the device is asked;
    /// a device that cannot register dma-bufs is `Unsupported`
    /// ([`DMABUF_UNSUPPORTED`]).
    pub fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        fd: &Arc<OwnedFd>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<Self>> {
        let size = dmabuf_size(fd)?;
        if len == 0 || offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(RdmaError::Invalid(format!("window {offset}+{len} outside a {size}-byte dma-buf")));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(RdmaError::Invalid(format!("a {len}-byte window at IOVA {iova:#x} wraps around")));
        }
        let page = sluice_shm::page_size();
        if iova % page != offset % page {
            return Err(RdmaError::Invalid(format!(
                "IOVA {iova:#x} and dma-buf offset {offset:#x} differ within a {page}-byte page"
            )));
        }
        // SAFETY: `pd` is a live PD; `fd` is an open descriptor for the
        // whole call (the kernel takes its own reference to the dma-buf,
        // and the MR keeps `fd` besides); the window lies inside the buffer.
        let mr = unsafe { sys::ibv_reg_dmabuf_mr(pd.ptr.as_ptr(), offset, len, iova, fd.as_raw_fd(), access.flags()) };
        let Some(ptr) = NonNull::new(mr) else {
            return Err(dmabuf_error(&pd.context().device_name(), std::io::Error::last_os_error()));
        };
        Ok(Arc::new(Self { ptr, _backing: Backing::Dmabuf(fd.clone()), _pd: pd.clone(), addr: iova, len }))
    }
}

impl ProtectionDomain {
    /// Whether this PD's device can register dma-bufs, without one: a
    /// registration of descriptor -1. A device with the verb reaches the
    /// kernel driver's dma-buf path, which looks the descriptor up and
    /// fails with `EBADF`; one without it fails with `EOPNOTSUPP` (from
    /// libibverbs for providers lacking the verb, from the kernel for
    /// drivers lacking it). `EBADF` is the only answer taken as "can".
    ///
    /// What this cannot tell: whether a given exporter's memory (a GPU
    /// behind another PCIe switch, a driver without peer-to-peer support)
    /// can be mapped by this NIC; only registering that buffer shows it.
    pub fn probe_dmabuf(&self) -> Result<()> {
        let page = sluice_shm::page_size() as usize;
        // SAFETY: a live PD; fd -1 is never a valid descriptor, so nothing
        // can be registered; a region that came back anyway is released.
        let mr = unsafe { sys::ibv_reg_dmabuf_mr(self.ptr.as_ptr(), 0, page, 0, -1, Access::LOCAL.flags()) };
        if !mr.is_null() {
            // SAFETY: just registered, released once, used by nobody.
            unsafe { sys::ibv_dereg_mr(mr) };
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EBADF) => Ok(()),
            _ => Err(match dmabuf_error(&self.context().device_name(), e) {
                RdmaError::Os { source, .. } => RdmaError::Unsupported(format!(
                    "{DMABUF_UNSUPPORTED}: {}: a probe registration failed with {source} instead of EBADF",
                    self.context().device_name()
                )),
                other => other,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_without_the_verb_say_so() {
        for errno in [libc::EOPNOTSUPP, libc::EINVAL, libc::EPROTONOSUPPORT, libc::ENOSYS] {
            match dmabuf_error("rxe0", std::io::Error::from_raw_os_error(errno)) {
                RdmaError::Unsupported(m) => {
                    assert!(m.starts_with(DMABUF_UNSUPPORTED) && m.contains("rxe0"), "{m}")
                }
                other => panic!("errno {errno}: {other:?}"),
            }
        }
        // Running out of memory or pinning limits is not a missing feature.
        assert!(matches!(
            dmabuf_error("mlx5_0", std::io::Error::from_raw_os_error(libc::ENOMEM)),
            RdmaError::Os { op: "ibv_reg_dmabuf_mr", .. }
        ));
    }

    #[test]
    fn the_size_of_a_descriptor_that_cannot_seek_is_an_error() {
        let (r, _w) = std::io::pipe().expect("pipe");
        let fd = OwnedFd::from(r);
        assert!(matches!(dmabuf_size(&fd), Err(RdmaError::Os { op: "lseek", .. })));
    }
}
