//! Sending and receiving file descriptors (SCM_RIGHTS) on tokio Unix streams.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// Most descriptors one message may carry; more are a protocol error.
pub const MAX_FDS_PER_MESSAGE: usize = 4;

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

/// Reads up to `buf.len()` bytes; descriptors that arrive with them are
/// appended to `fds`. Returns 0 at end of stream.
pub async fn recv_with_fds(stream: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        let res = stream.try_io(Interest::READABLE, || {
            let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
            let mut iov = [IoSliceMut::new(buf)];
            let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
                .map_err(io::Error::from)?;
            let mut got = Vec::new();
            for c in msg.cmsgs().map_err(io::Error::from)? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for fd in raw {
                        // SAFETY: the kernel just installed this descriptor in
                        // our table for us (SCM_RIGHTS); nothing else owns it.
                        got.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
            let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
            Ok((msg.bytes, got, truncated))
        });
        match res {
            Ok((n, got, truncated)) => {
                // Received descriptors are closed when `got` drops on error.
                if truncated {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("peer sent more than {MAX_FDS_PER_MESSAGE} descriptors in one message"),
                    ));
                }
                fds.extend(got);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
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
}
