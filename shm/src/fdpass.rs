//! Sending and receiving file descriptors (SCM_RIGHTS) on tokio Unix streams.
//!
//! Receiving is where a hostile peer can hurt a daemon: every descriptor the
//! kernel installs in our table must be owned (and so closed) on every path,
//! including when the peer sent more than we asked for. `recvmsg` is called
//! here directly, with room for the kernel's per-message maximum, and every
//! `SCM_RIGHTS` entry is wrapped in an [`OwnedFd`] before anything is checked
//! (nix's `cmsgs()` refuses to iterate a truncated buffer, which left the
//! installed descriptors unowned).

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Most descriptors one message may carry; more are a protocol error.
pub const MAX_FDS_PER_MESSAGE: usize = 4;

/// The kernel's limit on descriptors in one SCM_RIGHTS message
/// (`SCM_MAX_FD`). The control buffer has room for this many, so the kernel
/// never has to drop descriptors on the floor for lack of space.
const SCM_MAX_FD: usize = 253;

/// Shuts both directions of `stream` down: the peer sees the end, and a
/// task of ours reading it sees the end too (closing one of several handles
/// to it would do neither).
pub fn shutdown(stream: &UnixStream) -> io::Result<()> {
    nix::sys::socket::shutdown(stream.as_raw_fd(), nix::sys::socket::Shutdown::Both).map_err(io::Error::from)
}

/// Writes all of `data`, attaching `fds` to its first byte.
pub async fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut sent = 0usize;
    while sent < data.len() {
        stream.writable().await?;
        let attach = sent == 0 && !raw.is_empty();
        let res = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(&data[sent..])];
            let cmsgs = [ControlMessage::ScmRights(&raw)];
            let cm: &[ControlMessage] = if attach { &cmsgs } else { &[] };
            sendmsg::<()>(stream.as_raw_fd(), &iov, cm, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
        });
        match res {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What one `recvmsg` returned.
struct Received {
    bytes: usize,
    fds: Vec<OwnedFd>,
    /// The kernel could not fit all ancillary data (`MSG_CTRUNC`).
    truncated: bool,
}

/// One non-blocking `recvmsg` into `buf`; every descriptor that arrived is
/// owned by the result, whatever else the message held.
fn recv_once(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let fd_bytes = (SCM_MAX_FD * std::mem::size_of::<libc::c_int>()) as libc::c_uint;
    // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    // u64 elements: the control buffer must be aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * 8;
    // SAFETY: `msg` points at `iov` (which covers `buf`, exclusively borrowed)
    // and at `control`, both alive and large enough for the lengths given;
    // the kernel writes only within them.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: `msg` was filled in by the kernel; CMSG_FIRSTHDR reads only
    // its control pointer and length.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return a header that lies
        // within the control buffer and is aligned for cmsghdr.
        let (level, kind, len) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
        if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA is pointer arithmetic within this header.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            let header = data as usize - cmsg as usize;
            // The kernel sets cmsg_len to what it wrote; never read past the
            // buffer even if it did not.
            let end = (cmsg as usize + len).min(control.as_ptr() as usize + control.len() * 8);
            let count = end.saturating_sub(cmsg as usize + header) / std::mem::size_of::<libc::c_int>();
            for i in 0..count {
                // SAFETY: i < count keeps the read inside this header's data,
                // which lies inside `control`; read_unaligned because
                // CMSG_DATA only guarantees cmsghdr alignment.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i)) };
                // SAFETY: the kernel just installed this descriptor in our
                // table for us (SCM_RIGHTS); nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR; NXTHDR returns null past the end.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(Received { bytes: n as usize, fds, truncated: msg.msg_flags & libc::MSG_CTRUNC != 0 })
}

/// Reads up to `buf.len()` bytes; descriptors that arrive with them are
/// appended to `fds`. Returns 0 at end of stream.
///
/// A message with more than [`MAX_FDS_PER_MESSAGE`] descriptors is an error;
/// its descriptors are closed before this returns.
pub async fn recv_with_fds(stream: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || recv_once(stream_fd(stream), buf)) {
            Ok(got) => {
                if got.truncated || got.fds.len() > MAX_FDS_PER_MESSAGE {
                    // Dropping `got` closes every descriptor that came with it.
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "peer sent {}{} descriptors in one message; at most {MAX_FDS_PER_MESSAGE} are accepted",
                            got.fds.len(),
                            if got.truncated { " or more" } else { "" }
                        ),
                    ));
                }
                fds.extend(got.fds);
                return Ok(got.bytes);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

fn stream_fd(stream: &UnixStream) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    stream.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MappedRegion;
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn memfd_crosses_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let region = MappedRegion::create("x", 64).unwrap();
        region.write_at(0, b"shared").unwrap();
        send_with_fds(&a, b"frame", &[region.fd().as_fd()]).await.unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(&b, &mut buf, &mut fds).await.unwrap();
        assert_eq!(&buf[..n], b"frame");
        assert_eq!(fds.len(), 1);
        let other = MappedRegion::map(fds.pop().unwrap(), 64).unwrap();
        let mut out = [0u8; 6];
        other.read_at(0, &mut out).unwrap();
        assert_eq!(&out, b"shared");
    }

    /// Descriptors in this process's table whose target is `memfd:<name>`.
    fn open_memfds_named(name: &str) -> usize {
        let want = format!("/memfd:{name} (deleted)");
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == want))
            .count()
    }

    /// The leak outside testing found: 5+ descriptors in one message left
    /// the received ones unowned (4 per connection, forever).
    #[tokio::test]
    async fn too_many_descriptors_are_all_closed() {
        for sent in [MAX_FDS_PER_MESSAGE + 1, 10, SCM_MAX_FD] {
            let name = format!("fdpass-flood-{sent}");
            let (a, b) = UnixStream::pair().unwrap();
            {
                let files: Vec<OwnedFd> = (0..sent).map(|_| crate::create_memfd(&name, 16).unwrap()).collect();
                assert_eq!(open_memfds_named(&name), sent, "the probe sees our descriptors");
                let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
                send_with_fds(&a, b"R", &borrowed).await.unwrap();
            }
            // In flight, the socket holds the files, not our descriptor table.
            assert_eq!(open_memfds_named(&name), 0);
            let mut buf = [0u8; 4];
            let mut fds = Vec::new();
            let err = recv_with_fds(&b, &mut buf, &mut fds).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert!(err.to_string().contains("at most 4"), "{err}");
            assert!(fds.is_empty());
            drop((a, b));
            assert_eq!(open_memfds_named(&name), 0, "every received descriptor was closed ({sent} sent)");
        }
    }

    #[tokio::test]
    async fn the_limit_itself_is_accepted() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<OwnedFd> = (0..MAX_FDS_PER_MESSAGE).map(|_| crate::create_memfd("four", 16).unwrap()).collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&a, b"R", &borrowed).await.unwrap();
        drop(borrowed);
        drop(files);
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut [0u8; 4], &mut fds).await.unwrap(), 1);
        assert_eq!(fds.len(), MAX_FDS_PER_MESSAGE);
        assert_eq!(open_memfds_named("four"), MAX_FDS_PER_MESSAGE);
        drop(fds);
        assert_eq!(open_memfds_named("four"), 0);
    }
}
