//! Length-delimited frames on a Unix stream, with descriptors that arrive
//! alongside (SCM_RIGHTS) kept in arrival order.
//!
//! Frame: 4-byte big-endian length, then that many bytes. A descriptor sent
//! with a frame is attached to the frame's first byte, so it has always been
//! received by the time its frame is complete; consumers pop descriptors in
//! frame order with [`FrameReader::take_fd`].
//!
//! Which frame a descriptor belongs to is known only by position. The
//! kernel ends a read at the end of the message that carried descriptors,
//! so the descriptors of one read came with a frame that *starts* inside
//! that read's bytes. Each descriptor is kept with the stream offsets of the
//! read it came with: a frame claims one only if the frame starts inside that
//! read, and one is stray (closed) only once no frame can start there any
//! more, not merely because an earlier frame in the same read did not claim
//! it (pipelined frames share reads).

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
    /// Stream offset of `buf[0]`.
    base: u64,
    /// Stream offset of the frame `next_frame` returned last.
    frame_at: u64,
    fds: VecDeque<QueuedFd>,
    max_frame: usize,
}

/// A received descriptor and the stream offsets `[from, to)` of the read
/// that brought it: it belongs to a frame starting in that range.
struct QueuedFd {
    from: u64,
    to: u64,
    fd: OwnedFd,
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
        Self { stream, buf: Vec::with_capacity(8192), start: 0, base: 0, frame_at: 0, fds: VecDeque::new(), max_frame }
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
                    self.frame_at = self.base + self.start as u64;
                    // Descriptors that came wholly before this frame can
                    // never be claimed: close them now, whether or not the
                    // caller took or discarded the last frame's (a frame
                    // it could not decode, say). A peer cannot pile them up.
                    while self.fds.front().is_some_and(|q| q.to <= self.frame_at) {
                        self.fds.pop_front();
                    }
                    self.start += 4 + len;
                    if self.start == self.buf.len() {
                        self.base += self.buf.len() as u64;
                        self.buf.clear();
                        self.start = 0;
                    }
                    return Ok(Some(frame));
                }
            }
            // Compact before reading more.
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.base += self.start as u64;
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + 64 * 1024, 0);
            let mut got = Vec::new();
            let n = recv_with_fds(self.stream.as_ref(), &mut self.buf[old..], &mut got).await;
            let n = match n {
                Ok(n) => n,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e.into());
                }
            };
            self.buf.truncate(old + n);
            let from = self.base + old as u64;
            let to = from + n as u64;
            if !got.is_empty() && self.frame_starts_in(from, to) {
                self.fds.extend(got.into_iter().map(|fd| QueuedFd { from, to, fd }));
            }
            // else: no frame can start in these bytes (the middle of a frame
            // whose length is known), so no frame can claim them: dropping
            // closes them. A peer cannot pile up descriptors that way.
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) };
            }
        }
    }

    /// Whether a frame may start in stream bytes `[from, to)` just read:
    /// not if they lie inside the frame being received, whose length is
    /// known once its 4-byte header is in.
    fn frame_starts_in(&self, from: u64, to: u64) -> bool {
        let next = self.base + self.start as u64;
        let avail = &self.buf[self.start..];
        if from <= next || avail.len() < 4 {
            return true;
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as u64;
        // The frame at `next` ends at next + 4 + len; the next one starts there.
        next + 4 + len < to
    }

    /// The descriptor sent with the frame `next_frame` returned last, if it
    /// came with one: the oldest not yet taken, provided it arrived with
    /// that frame's first byte (one that came later belongs to a later
    /// frame and stays for it).
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        let at = self.frame_at;
        while self.fds.front().is_some_and(|q| q.to <= at) {
            self.fds.pop_front(); // an earlier frame's, never claimed
        }
        match self.fds.front() {
            Some(q) if q.from <= at => self.fds.pop_front().map(|q| q.fd),
            _ => None,
        }
    }

    /// Closes the descriptors no frame can claim any more (a peer error):
    /// those that came with bytes every frame starting in has been read.
    /// Descriptors of a read that also brought frames not yet read are
    /// kept: they may be those frames'. Returns how many were closed.
    pub fn discard_fds(&mut self) -> usize {
        let next = self.base + self.start as u64;
        let mut n = 0;
        while self.fds.front().is_some_and(|q| q.to <= next) {
            self.fds.pop_front();
            n += 1;
        }
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
    async fn a_descriptor_read_with_an_earlier_frame_waits_for_its_own() {
        // Both frames are sent before the reader reads: one read brings the
        // frame without a descriptor and the one with it. Handling the first
        // must not close the second's descriptor.
        let (a, b) = UnixStream::pair().unwrap();
        let r1 = MappedRegion::create("b", 16).unwrap();
        send_with_fds(&a, &frame(b"get"), &[]).await.unwrap();
        send_with_fds(&a, &frame(b"register"), &[r1.fd().as_fd()]).await.unwrap();
        send_with_fds(&a, &frame(b"stats"), &[]).await.unwrap();
        drop(a);
        let mut rd = FrameReader::new(b, 1024);
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"get");
        assert_eq!(rd.discard_fds(), 0);
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"register");
        assert!(rd.take_fd().is_some());
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"stats");
        assert!(rd.take_fd().is_none());
        assert_eq!(rd.discard_fds(), 0);
    }

    #[tokio::test]
    async fn a_descriptor_no_frame_claims_is_closed_once_its_frames_are_read() {
        let (a, b) = UnixStream::pair().unwrap();
        let r1 = MappedRegion::create("c", 16).unwrap();
        send_with_fds(&a, &frame(b"stats"), &[r1.fd().as_fd()]).await.unwrap();
        let mut rd = FrameReader::new(b, 1024);
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"stats");
        assert_eq!(rd.discard_fds(), 1);
        // A later frame cannot claim an earlier frame's descriptor either.
        let r2 = MappedRegion::create("d", 16).unwrap();
        send_with_fds(&a, &frame(b"one"), &[r2.fd().as_fd()]).await.unwrap();
        send_with_fds(&a, &frame(b"two"), &[]).await.unwrap();
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"one");
        drop(a);
        // The kernel ends a read after the message that carried descriptors,
        // so "two" comes in a later read: "one"'s descriptor is not its.
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"two");
        assert!(rd.take_fd().is_none());
        assert!(rd.fds.is_empty());
    }

    #[tokio::test]
    async fn descriptors_sent_inside_a_frame_are_closed_at_once() {
        // A peer attaching descriptors to the middle of a long frame (where
        // no frame starts) cannot make the reader hold them.
        let (a, b) = UnixStream::pair().unwrap();
        let body = vec![7u8; 4000];
        let whole = frame(&body);
        let regions: Vec<_> = (0..8).map(|i| MappedRegion::create(&format!("mid{i}"), 16).unwrap()).collect();
        let mut rd = FrameReader::new(b, 8192);
        send_with_fds(&a, &whole[..100], &[]).await.unwrap();
        let writer = async {
            for (i, piece) in whole[100..].chunks(500).enumerate() {
                send_with_fds(&a, piece, &[regions[i % regions.len()].fd().as_fd()]).await.unwrap();
                tokio::task::yield_now().await;
            }
        };
        let (_, got) = tokio::join!(writer, rd.next_frame());
        assert_eq!(got.unwrap().unwrap(), body);
        // At most those of a read that also brought the frame's first byte
        // (where the frame's own descriptor would be) are kept until the
        // frame has been handled; the other seven were closed on arrival.
        assert!(rd.fds.len() <= 1, "{} descriptors held", rd.fds.len());
        rd.discard_fds();
        assert!(rd.fds.is_empty());
    }

    #[tokio::test]
    async fn descriptors_of_frames_nobody_claimed_are_closed_by_the_next_frame() {
        // A peer sends frames with descriptors that the caller never takes
        // nor discards (frames it could not decode): reading on must not
        // keep them all.
        let (a, b) = UnixStream::pair().unwrap();
        let r = MappedRegion::create("c", 16).unwrap();
        let mut rd = FrameReader::new(b, 1024);
        for i in 0..200u32 {
            send_with_fds(&a, &frame(&i.to_be_bytes()), &[r.fd().as_fd(), r.fd().as_fd()]).await.unwrap();
            assert_eq!(rd.next_frame().await.unwrap().unwrap(), i.to_be_bytes());
            // Only the frame just returned may still claim its own.
            assert!(rd.fds.len() <= 2, "{} descriptors held after frame {i}", rd.fds.len());
        }
        send_with_fds(&a, &frame(b"last"), &[]).await.unwrap();
        assert_eq!(rd.next_frame().await.unwrap().unwrap(), b"last");
        assert!(rd.fds.is_empty(), "{} descriptors held", rd.fds.len());
        assert!(rd.take_fd().is_none());
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
