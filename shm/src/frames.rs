//! Length-delimited frames on a Unix stream, with descriptors that arrive
//! alongside (SCM_RIGHTS) kept in arrival order.
//!
//! Frame: 4-byte big-endian length, then that many bytes. A descriptor sent
//! with a frame is attached to the frame's first byte, so it has always been
//! received by the time its frame is complete; consumers pop descriptors in
//! frame order with [`FrameReader::take_fd`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;

use tokio::net::UnixStream;

use crate::recv_with_fds;

/// Reads frames from a Unix stream.
pub struct FrameReader<S> {
    stream: S,
    buf: Vec<u8>,
    start: usize,
    fds: VecDeque<OwnedFd>,
    max_frame: usize,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: usize, max: usize },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl<S: AsRef<UnixStream>> FrameReader<S> {
    pub fn new(stream: S, max_frame: usize) -> Self {
        Self { stream, buf: Vec::with_capacity(8192), start: 0, fds: VecDeque::new(), max_frame }
    }

    /// The next frame's payload, or `None` at a clean end of stream.
    pub async fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        loop {
            let avail = &self.buf[self.start..];
            if avail.len() >= 4 {
                let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
                if len > self.max_frame {
                    return Err(FrameError::TooLarge { len, max: self.max_frame });
                }
                if avail.len() >= 4 + len {
                    let frame = avail[4..4 + len].to_vec();
                    self.start += 4 + len;
                    if self.start == self.buf.len() {
                        self.buf.clear();
                        self.start = 0;
                    }
                    return Ok(Some(frame));
                }
            }
            // Compact before reading more.
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + 64 * 1024, 0);
            let mut got = Vec::new();
            let n = recv_with_fds(self.stream.as_ref(), &mut self.buf[old..], &mut got).await;
            self.fds.extend(got);
            let n = match n {
                Ok(n) => n,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e.into());
                }
            };
            self.buf.truncate(old + n);
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) };
            }
        }
    }

    /// The oldest received descriptor not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// Descriptors received but not claimed by any frame (a peer error);
    /// dropping them closes them.
    pub fn discard_fds(&mut self) -> usize {
        let n = self.fds.len();
        self.fds.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{send_with_fds, MappedRegion};
    use std::os::fd::AsFd;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = (payload.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[tokio::test]
    async fn frames_and_fds_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let r1 = MappedRegion::create("a", 16).unwrap();
        send_with_fds(&a, &frame(b"one"), &[]).await.unwrap();
        send_with_fds(&a, &frame(b"two"), &[r1.fd().as_fd()]).await.unwrap();
        send_with_fds(&a, &frame(b""), &[]).await.unwrap();
        drop(a);
        let mut rd = FrameReader::new(b, 1024);
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"one");
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"two");
        assert!(rd.take_fd().is_some());
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"");
        assert!(rd.next_frame().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn oversized_and_truncated_frames_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, &(2000u32).to_be_bytes(), &[]).await.unwrap();
        let mut rd = FrameReader::new(b, 1024);
        assert!(matches!(rd.next_frame().await, Err(FrameError::TooLarge { len: 2000, .. })));

        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, &[0, 0, 0, 9, 1, 2], &[]).await.unwrap();
        drop(a);
        let mut rd = FrameReader::new(b, 1024);
        assert!(matches!(rd.next_frame().await, Err(FrameError::Truncated)));
    }
}
