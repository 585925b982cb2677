//! Single GETs between a shim and its agent without HTTP/2.
//!
//! Why: on the link between a shim and its agent (the Unix socket of a
//! co-located agent, or TCP with mutual TLS to one on a BlueField),
//! `GetStream`'s messages still pay for HTTP/2 on both sides (frames, flow
//! control, and hyper's body pump, which wakes a second runtime worker for
//! each answer). This carries the same messages (`GetStreamRequest` in,
//! `GetManyItem` out, with the same rules and checks at the agent) as
//! length-prefixed frames on a connection of their own, to the same
//! address (over TLS, chosen by ALPN: [`ALPN`]).
//!
//! The connection starts with [`PREFACE`] from the shim; an agent that
//! serves it answers the same 24 bytes. (An agent that does not reads them
//! as a bad HTTP/2 preface and closes the connection: the shim then keeps
//! to `GetStream`.) After that, each frame is a 4-byte big-endian length of
//! what follows, one byte of [`Frame`] kind, and the payload: a protobuf
//! message, or for [`Frame::End`] a 4-byte gRPC status code and its text.
//! The agent sends `End` when it ends the stream with a status, as the gRPC
//! call would end with one.

use bytes::{Buf, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::agent::{GetManyItem, GetStreamRequest};

/// What a shim sends first, and an agent that serves framed GETs answers.
/// Its first byte is not HTTP/2's (`P`), so a listener tells the two apart
/// by one byte.
pub const PREFACE: &[u8; 24] = b"SLUICE-FRAMED-GETS/1\r\n\r\n";

/// The TLS application protocol (ALPN) a shim asks for on a framed
/// connection over TLS, beside `h2`: an agent that serves framed GETs
/// chooses it, an older one `h2`, which tells the shim to keep to calls
/// without a failed handshake. The preface then follows inside TLS, as on
/// any other link.
pub const ALPN: &[u8] = b"sluice-framed-gets/1";

/// A framed TCP connection notices a peer that vanished without closing
/// it (a partitioned DPU link, a host that lost power) within about this
/// long, idle or not: gRPC's connections have HTTP/2 pings for this; a
/// framed one has no pings, so TCP keepalive probes it when idle and a
/// user timeout bounds data left unacknowledged.
pub const TCP_PEER_GONE: std::time::Duration = std::time::Duration::from_secs(30);

/// Sets [`TCP_PEER_GONE`]'s keepalive and user timeout on `tcp`, and no
/// Nagle delay (frames are written whole).
pub fn watch_tcp_peer(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
    use std::time::Duration;
    let sock = socket2::SockRef::from(tcp);
    sock.set_tcp_nodelay(true)?;
    // Idle 10 s, then a probe every 5 s, 4 unanswered: gone by 30 s.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(4);
    sock.set_tcp_keepalive(&keepalive)?;
    sock.set_tcp_user_timeout(Some(TCP_PEER_GONE))
}

/// Longest frame (after its length) either side accepts: gRPC's default
/// message limit, which a `GetStreamRequest` of the agent's 256 GETs per
/// message must fit too (the shim sends at most 64, each at most 16 KiB).
pub const MAX_FRAME: usize = 4 << 20;

/// Most room a reader adds before the bytes that fill it have come.
const READ_AHEAD: usize = 64 << 10;
/// A reader that held more than this, once what it holds is small again,
/// gives its buffer back (one large frame does not keep its room for the
/// connection's life).
const KEEP_AT_MOST: usize = 1 << 20;

/// Most GETs one frame may carry: the agent's limit per message
/// (`dpu-agent/src/get_stream.rs`; a shim sends at most 64).
pub const MAX_GETS_IN_FRAME: usize = 256;
/// Most cancels one frame may carry: no more GETs than this can be running
/// on a stream (the agent's limit is 512).
pub const MAX_CANCELS_IN_FRAME: usize = 1024;

const KIND_GETS: u8 = 1;
const KIND_ANSWER: u8 = 2;
const KIND_END: u8 = 3;

/// One frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// Shim to agent: GETs to start, and cancels.
    Gets(GetStreamRequest),
    /// Agent to shim: one GET's answer.
    Answer(GetManyItem),
    /// Agent to shim: the stream ends with this gRPC status.
    End { code: i32, message: String },
}

/// A frame that cannot be read: the connection is to be closed.
#[derive(Debug, thiserror::Error)]
pub enum FramedError {
    #[error("a frame of {0} bytes; at most {MAX_FRAME}")]
    TooLong(usize),
    #[error("a frame of unknown kind {0}")]
    UnknownKind(u8),
    #[error("an empty frame (no kind)")]
    Empty,
    #[error("a malformed frame: {0}")]
    Malformed(#[from] prost::DecodeError),
    #[error("a malformed frame: {0}")]
    Unreadable(#[from] crate::entries::Malformed),
    #[error("the connection closed inside a frame")]
    Truncated,
    #[error("the rest of a frame did not come within {} s of its start", .0.as_secs_f32())]
    Stalled(std::time::Duration),
    #[error("an End frame without its status code")]
    EndWithoutCode,
    /// Counted before decoding ([`crate::entries`]): the decoded frame would
    /// be far larger than its bytes.
    #[error("a frame of {n} {what}; at most {most}")]
    TooMany { what: &'static str, n: usize, most: usize },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn push(out: &mut Vec<u8>, kind: u8, payload_len: usize, payload: impl FnOnce(&mut Vec<u8>)) {
    // Our messages stay far below u32; saturating lets the peer refuse an
    // impossible one as too long rather than this side panicking.
    let len = u32::try_from(payload_len + 1).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind);
    payload(out);
}

/// Appends `m` as a [`Frame::Gets`].
pub fn push_gets(out: &mut Vec<u8>, m: &GetStreamRequest) {
    // Encoding into a Vec cannot run out of room.
    push(out, KIND_GETS, m.encoded_len(), |o| m.encode_raw(o));
}

/// Appends `m` as a [`Frame::Answer`].
pub fn push_answer(out: &mut Vec<u8>, m: &GetManyItem) {
    push(out, KIND_ANSWER, m.encoded_len(), |o| m.encode_raw(o));
}

/// Appends a [`Frame::End`] with gRPC status `code` and `message`.
pub fn push_end(out: &mut Vec<u8>, code: i32, message: &str) {
    push(out, KIND_END, 4 + message.len(), |o| {
        o.extend_from_slice(&code.to_be_bytes());
        o.extend_from_slice(message.as_bytes());
    });
}

/// The first whole frame at the start of `buf`, taken out of it; `None`
/// while it has not all come.
pub fn take_frame(buf: &mut BytesMut) -> Result<Option<Frame>, FramedError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_FRAME {
        return Err(FramedError::TooLong(len));
    }
    if len == 0 {
        return Err(FramedError::Empty);
    }
    if buf.len() < 4 + len {
        // Room for more of it, but no more than a read's worth ahead of
        // what came: a length alone does not buy a peer 4 MiB.
        buf.reserve((4 + len - buf.len()).min(READ_AHEAD));
        return Ok(None);
    }
    buf.advance(4);
    let mut frame = buf.split_to(len);
    let kind = frame.get_u8();
    Ok(Some(match kind {
        KIND_GETS => {
            use crate::entries::{count, Kind};
            let (gets, cancels) = (count(&frame, &[], 1, Kind::Messages)?, count(&frame, &[], 2, Kind::Varints)?);
            if gets > MAX_GETS_IN_FRAME {
                return Err(FramedError::TooMany { what: "GETs", n: gets, most: MAX_GETS_IN_FRAME });
            }
            if cancels > MAX_CANCELS_IN_FRAME {
                return Err(FramedError::TooMany { what: "cancels", n: cancels, most: MAX_CANCELS_IN_FRAME });
            }
            Frame::Gets(GetStreamRequest::decode(frame)?)
        }
        KIND_ANSWER => Frame::Answer(GetManyItem::decode(frame)?),
        KIND_END if frame.len() >= 4 => {
            let code = frame.get_i32();
            Frame::End { code, message: String::from_utf8_lossy(&frame).into_owned() }
        }
        KIND_END => return Err(FramedError::EndWithoutCode),
        other => return Err(FramedError::UnknownKind(other)),
    }))
}

/// Reads frames from one side of a connection.
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    /// The buffer held more than [`KEEP_AT_MOST`] since it was last given
    /// back: its allocation is that large still.
    grown: bool,
    /// Longest the rest of a frame may take once its first byte came
    /// ([`Self::rest_within`]); none: as long as it takes.
    rest_wait: Option<std::time::Duration>,
    /// When the first byte of the frame being read came.
    frame_began: Option<tokio::time::Instant>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R) -> Self {
        // Small to start: an idle connection (a shim keeps several) holds
        // little; the buffer grows with what comes.
        Self { io, buf: BytesMut::with_capacity(4 << 10), grown: false, rest_wait: None, frame_began: None }
    }

    /// Refuses a frame whose rest does not come within `wait` of its first
    /// byte ([`FramedError::Stalled`]): a peer that sends most of a large
    /// frame and stops holds its buffer, and its connection's place, no
    /// longer than that. (Between frames a reader waits as long as it
    /// takes.)
    pub fn rest_within(mut self, wait: std::time::Duration) -> Self {
        self.rest_wait = Some(wait);
        self
    }

    /// The next frame; `None` when the peer closed between frames.
    pub async fn next(&mut self) -> Result<Option<Frame>, FramedError> {
        loop {
            self.grown |= self.buf.len() > KEEP_AT_MOST;
            if let Some(f) = take_frame(&mut self.buf)? {
                // What follows (if anything came) is the next frame's start.
                self.frame_began = None;
                if self.grown && self.buf.len() < READ_AHEAD {
                    // What is left moves to a buffer of its own: the large
                    // one is freed with the frames taken from it.
                    self.buf = BytesMut::from(&self.buf[..]);
                    self.grown = false;
                }
                return Ok(Some(f));
            }
            if self.buf.capacity() == self.buf.len() {
                self.buf.reserve(READ_AHEAD);
            }
            let began = match (self.buf.is_empty(), self.frame_began) {
                (true, _) => None,
                (false, Some(t)) => Some(t),
                (false, None) => Some(tokio::time::Instant::now()),
            };
            self.frame_began = began;
            let read = self.io.read_buf(&mut self.buf);
            let n = match (self.rest_wait, began) {
                (Some(wait), Some(t)) => {
                    tokio::time::timeout_at(t + wait, read).await.map_err(|_| FramedError::Stalled(wait))??
                }
                _ => read.await?,
            };
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(FramedError::Truncated) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{GetItem, StreamedGet};

    fn gets() -> GetStreamRequest {
        let item = GetItem { request_id: "r1".into(), namespace: "data".into(), key: "k".into(), ..Default::default() };
        GetStreamRequest {
            gets: vec![StreamedGet { index: 7, session_id: "s".into(), item: Some(item) }],
            cancel: vec![3],
        }
    }

    /// Nothing here can make a loopback peer vanish (it would need a
    /// dropped route); what can be checked is that the kernel holds the
    /// settings that reclaim such a connection, and that they add up to
    /// the bound the docs give.
    #[tokio::test]
    async fn a_watched_tcp_connection_carries_the_settings_that_notice_a_vanished_peer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        watch_tcp_peer(&c).unwrap();
        let s = socket2::SockRef::from(&c);
        assert!(s.tcp_nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        let (idle, every, probes) =
            (s.tcp_keepalive_time().unwrap(), s.tcp_keepalive_interval().unwrap(), s.tcp_keepalive_retries().unwrap());
        assert_eq!((idle.as_secs(), every.as_secs(), probes), (10, 5, 4));
        assert!(idle + every * probes <= TCP_PEER_GONE, "an idle peer is given up within {TCP_PEER_GONE:?}");
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(TCP_PEER_GONE), "and one that leaves bytes unacknowledged");
    }

    #[test]
    fn frames_come_back_as_they_went_even_a_byte_at_a_time() {
        let mut wire = Vec::new();
        push_gets(&mut wire, &gets());
        push_answer(&mut wire, &GetManyItem { index: 7, result: None });
        push_end(&mut wire, 8, "too many");
        let mut buf = BytesMut::new();
        let mut seen = Vec::new();
        for b in &wire {
            buf.extend_from_slice(&[*b]);
            while let Some(f) = take_frame(&mut buf).unwrap() {
                seen.push(f);
            }
        }
        assert!(buf.is_empty());
        assert_eq!(
            seen,
            vec![
                Frame::Gets(gets()),
                Frame::Answer(GetManyItem { index: 7, result: None }),
                Frame::End { code: 8, message: "too many".into() },
            ]
        );
    }

    #[test]
    fn bad_frames_are_refused_by_kind() {
        let refused = |bytes: &[u8]| take_frame(&mut BytesMut::from(bytes)).unwrap_err();
        assert!(matches!(refused(&(MAX_FRAME as u32 + 1).to_be_bytes()), FramedError::TooLong(_)));
        assert!(matches!(refused(&[0, 0, 0, 0]), FramedError::Empty));
        assert!(matches!(refused(&[0, 0, 0, 1, 9]), FramedError::UnknownKind(9)));
        assert!(matches!(refused(&[0, 0, 0, 3, KIND_END, 0, 0]), FramedError::EndWithoutCode));
        assert!(matches!(
            refused(&[0, 0, 0, 3, KIND_GETS, 0xff, 0xff]),
            FramedError::Malformed(_) | FramedError::Unreadable(_)
        ));
    }

    /// A frame of the largest size full of empty GETs (2 bytes each on the
    /// wire, hundreds decoded), or of cancels, is refused before it is
    /// decoded; a frame at the limits is taken.
    #[test]
    fn a_frame_of_more_entries_than_a_message_may_hold_is_refused_undecoded() {
        let framed = |payload: Vec<u8>| {
            let mut f = u32::try_from(payload.len() + 1).unwrap().to_be_bytes().to_vec();
            f.push(KIND_GETS);
            f.extend_from_slice(&payload);
            BytesMut::from(&f[..])
        };
        let empty_gets = |n: usize| [0x0a, 0x00].repeat(n);
        let flood = empty_gets((MAX_FRAME - 1) / 2);
        match take_frame(&mut framed(flood)) {
            Err(FramedError::TooMany { what: "GETs", n, most: MAX_GETS_IN_FRAME }) => assert!(n > 2_000_000),
            other => panic!("{other:?}"),
        }
        let at_most = take_frame(&mut framed(empty_gets(MAX_GETS_IN_FRAME))).unwrap();
        assert!(matches!(at_most, Some(Frame::Gets(g)) if g.gets.len() == MAX_GETS_IN_FRAME));
        // Packed cancels: one byte each.
        let mut cancels = vec![0x12, 0x80, 0x80, 0x40]; // field 2, 1 MiB
        cancels.extend(std::iter::repeat_n(1u8, 1 << 20));
        assert!(matches!(
            take_frame(&mut framed(cancels)),
            Err(FramedError::TooMany { what: "cancels", most: MAX_CANCELS_IN_FRAME, .. })
        ));
    }

    #[test]
    fn a_length_alone_does_not_buy_room() {
        let mut buf = BytesMut::from(&(MAX_FRAME as u32).to_be_bytes()[..]);
        assert!(take_frame(&mut buf).unwrap().is_none());
        assert!(buf.capacity() < MAX_FRAME / 4, "{} bytes of room for 4 bytes", buf.capacity());
    }

    #[tokio::test]
    async fn a_reader_says_when_the_peer_closed_inside_a_frame() {
        let mut wire = Vec::new();
        push_answer(&mut wire, &GetManyItem { index: 1, result: None });
        let whole = wire.len();
        push_answer(&mut wire, &GetManyItem { index: 2, result: None });
        wire.truncate(whole + 3);
        let mut r = FrameReader::new(&wire[..]);
        assert!(matches!(r.next().await.unwrap(), Some(Frame::Answer(_))));
        assert!(matches!(r.next().await.unwrap_err(), FramedError::Truncated));
        let mut r = FrameReader::new(&wire[..whole]);
        assert!(r.next().await.unwrap().is_some());
        assert!(r.next().await.unwrap().is_none(), "closed between frames");
    }

    /// A frame begun and not finished is refused after the rest's wait; a
    /// peer quiet between frames is not.
    #[tokio::test(start_paused = true)]
    async fn a_frame_whose_rest_does_not_come_is_refused_and_silence_between_frames_is_not() {
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(ours).rest_within(std::time::Duration::from_secs(10));
        let mut wire = Vec::new();
        push_answer(&mut wire, &GetManyItem { index: 1, result: None });
        let writer = async {
            tokio::time::sleep(std::time::Duration::from_secs(3_600)).await;
            tokio::io::AsyncWriteExt::write_all(&mut peer, &wire).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut peer, &wire[..3]).await.unwrap();
            peer
        };
        let (first, _peer) = tokio::join!(r.next(), writer);
        assert!(matches!(first.unwrap(), Some(Frame::Answer(_))), "an hour of silence between frames is fine");
        let started = tokio::time::Instant::now();
        assert!(matches!(r.next().await.unwrap_err(), FramedError::Stalled(_)));
        assert_eq!(started.elapsed().as_secs(), 10);
    }
}
