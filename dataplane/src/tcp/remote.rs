//! The remote's side of the `tcp` transport (the storage gateway): performs
//! WRITE and READ against descriptors, splitting at the per-operation limit,
//! over pooled connections to each owner.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::owner::owner_addr;
use super::wire::{self, Header, Op};
use crate::capability::Key;
use crate::token::Token;
use crate::transport::TransportError;

/// Read chunk handed to the PUT body stream.
const READ_CHUNK: usize = 1 << 20;

/// An eager WRITE goes out with its header in one `write(2)` (one segment,
/// one wake-up of the owner); bigger ones keep the handshake.
const ONE_WRITE_MAX: u64 = wire::EAGER_MAX_BYTES;

/// How long an answer owed for a posted WRITE is waited for when the
/// connection is next taken (it is usually there already).
const OWED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A pooled connection unused this long is closed. Owners come and go (an
/// agent that restarts listens on a new port), so a pool that only ever
/// added would keep every owner's connections for the gateway's lifetime.
const IDLE_MAX: Duration = Duration::from_secs(30);

/// How often the pool is swept for idle connections (on a give-back).
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Most connections pooled per owner.
const PER_OWNER: usize = 16;

/// A connection to an owner, what that owner takes (it said so in a reply
/// on this very connection: see `wire`), and how many answers to posted
/// WRITEs are still to be read on it.
struct Conn {
    s: TcpStream,
    eager: bool,
    posted: bool,
    owed: u32,
    /// When it was last given back to the pool.
    idle_since: Instant,
}

/// Idle connections by owner, and when they were last swept.
#[derive(Default)]
struct Pool {
    by_owner: HashMap<SocketAddr, Vec<Conn>>,
    swept: Option<Instant>,
}

impl Pool {
    /// Closes connections idle for `IDLE_MAX` at `now`, and forgets owners
    /// left with none.
    fn sweep(&mut self, now: Instant) {
        self.swept = Some(now);
        self.by_owner.retain(|_, conns| {
            conns.retain(|c| now.saturating_duration_since(c.idle_since) < IDLE_MAX);
            !conns.is_empty()
        });
    }
}

/// Remote-side `tcp` transport with a small connection pool per owner.
/// Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct TcpRemote {
    pool: Arc<Mutex<Pool>>,
    /// Largest single operation; transfers are split into pieces this size.
    max_op: u64,
}

impl TcpRemote {
    pub fn new(max_op: u64) -> Self {
        Self { pool: Arc::default(), max_op: max_op.max(1) }
    }

    /// Largest single operation.
    pub fn max_op(&self) -> u64 {
        self.max_op
    }

    async fn conn(&self, addr: SocketAddr) -> Result<Conn, TransportError> {
        loop {
            let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).by_owner.get_mut(&addr).and_then(Vec::pop);
            let Some(mut c) = pooled else { break };
            // The answers to its posted WRITEs come first. One that failed
            // was the requester's to find (its bytes never landed); the
            // connection, closed by the owner, is dropped.
            match tokio::time::timeout(OWED_WAIT, Self::settle_owed(&mut c)).await {
                Ok(Ok(())) => return Ok(c),
                Ok(Err(e)) => tracing::warn!(owner = %addr, error = %e, "a posted WRITE failed at the owner"),
                Err(_) => tracing::warn!(owner = %addr, "no answer to a posted WRITE within {OWED_WAIT:?}"),
            }
        }
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        // Nothing has answered on it yet: its first WRITE waits for a go-ahead.
        Ok(Conn { s, eager: false, posted: false, owed: 0, idle_since: Instant::now() })
    }

    /// Answers owed for posted WRITEs on the pooled connections.
    #[cfg(test)]
    pub(crate) fn owed(&self) -> u32 {
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.by_owner.values().flatten().map(|c| c.owed).sum()
    }

    /// Reads the answers owed for posted WRITEs.
    async fn settle_owed(c: &mut Conn) -> Result<(), TransportError> {
        while c.owed > 0 {
            Self::reply(c).await?;
            c.owed -= 1;
        }
        Ok(())
    }

    fn give_back(&self, addr: SocketAddr, mut c: Conn) {
        let now = Instant::now();
        c.idle_since = now;
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.swept.is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY) {
            pool.sweep(now);
        }
        let v = pool.by_owner.entry(addr).or_default();
        if v.len() < PER_OWNER {
            v.push(c);
        }
    }

    fn target(token: &Token) -> Result<(SocketAddr, Key), TransportError> {
        let addr = owner_addr(token)
            .ok_or_else(|| TransportError::Protocol("tcp descriptor without an owner address (GID)".into()))?;
        Ok((addr, Key { rkey: token.rkey, dct: token.dct }))
    }

    /// Reads an owner's reply; on error, the owner's message. A good reply
    /// that advertises eager WRITEs marks the connection for them.
    async fn reply(c: &mut Conn) -> Result<u64, TransportError> {
        let mut rb = [0u8; wire::REPLY_LEN];
        c.s.read_exact(&mut rb).await?;
        let r = wire::decode_reply(&rb);
        if r.status == 0 {
            c.eager = r.features & wire::FEATURE_EAGER != 0;
            c.posted = r.features & wire::FEATURE_POSTED != 0;
            return Ok(r.len);
        }
        let mut msg = vec![0u8; r.len.min(4096) as usize];
        let _ = c.s.read_exact(&mut msg).await;
        Err(TransportError::Rejected(String::from_utf8_lossy(&msg).into_owned()))
    }

    /// Starts a WRITE of `piece` bytes at `addr` with the handshake: its
    /// header, then the owner's go-ahead. No payload byte leaves before
    /// then. (Eager WRITEs are the small ones, sent whole with their header;
    /// a big one gains nothing from skipping a round trip, and a refusal
    /// would reset the connection under a payload still being sent, losing
    /// the owner's reason.)
    async fn start_write(c: &mut Conn, key: Key, addr: u64, piece: u64) -> Result<(), TransportError> {
        c.s.write_all(&Header { op: Op::Write, key, addr, len: piece, eager: false }.encode()).await?;
        Self::go_ahead(c).await
    }

    /// Waits for the owner's go-ahead to a WRITE header (see `wire`): no
    /// payload byte leaves before an owner has accepted the descriptor.
    async fn go_ahead(c: &mut Conn) -> Result<(), TransportError> {
        match Self::reply(c).await {
            Ok(0) => Ok(()),
            Ok(n) => Err(TransportError::Protocol(format!("the owner answered a WRITE header with {n} bytes"))),
            Err(e) => Err(e),
        }
    }

    /// WRITEs `len` bytes from `body` into the descriptor's window, starting
    /// at its beginning, in operations of at most `max_op` bytes. Returns the
    /// bytes written; fails if `body` ends early or the owner refuses.
    pub async fn write_stream<S, E>(&self, token: &Token, len: u64, body: S) -> Result<u64, TransportError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if len > token.size {
            return Err(TransportError::Rejected(format!("{len} bytes do not fit the {}-byte window", token.size)));
        }
        let (addr, key) = Self::target(token)?;
        let mut c = self.conn(addr).await?;
        let mut body = body;
        let mut pending = Bytes::new();
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(self.max_op);
            let mut left = piece;
            if c.eager && piece <= ONE_WRITE_MAX {
                // Header and payload in one write: gather the piece first.
                let h = Header { op: Op::Write, key, addr: token.addr + done, len: piece, eager: true };
                let mut buf = BytesMut::with_capacity(wire::HEADER_LEN + piece as usize);
                buf.extend_from_slice(&h.encode());
                while left > 0 {
                    let mut chunk = next_chunk(&mut body, &mut pending, done + piece - left, len).await?;
                    let take = (chunk.len() as u64).min(left) as usize;
                    buf.extend_from_slice(&chunk.split_to(take));
                    pending = chunk;
                    left -= take as u64;
                }
                c.s.write_all(&buf).await?;
                if c.posted && done + piece == len {
                    // Posted: the owner's requester waits for the bytes
                    // itself; its answer is read before the next use.
                    c.owed += 1;
                    done += piece;
                    continue;
                }
            } else {
                Self::start_write(&mut c, key, token.addr + done, piece).await?;
                while left > 0 {
                    let mut chunk = next_chunk(&mut body, &mut pending, done + piece - left, len).await?;
                    let take = (chunk.len() as u64).min(left) as usize;
                    c.s.write_all(&chunk.split_to(take)).await?;
                    pending = chunk;
                    left -= take as u64;
                }
            }
            Self::reply(&mut c).await?;
            done += piece;
        }
        self.give_back(addr, c);
        Ok(done)
    }

    /// WRITEs `len` bytes of `file` from `file_offset` into the descriptor's
    /// window with `sendfile(2)`: the bytes go from the page cache to the
    /// socket without passing through this process (a small eager piece is
    /// read and sent with its header in one write instead).
    pub async fn write_file(
        &self,
        token: &Token,
        file: &std::fs::File,
        file_offset: u64,
        len: u64,
    ) -> Result<u64, TransportError> {
        use std::os::fd::AsFd;
        use std::os::unix::fs::FileExt;
        if len > token.size {
            return Err(TransportError::Rejected(format!("{len} bytes do not fit the {}-byte window", token.size)));
        }
        let (addr, key) = Self::target(token)?;
        let mut c = self.conn(addr).await?;
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(self.max_op);
            if c.eager && piece <= ONE_WRITE_MAX {
                let h = Header { op: Op::Write, key, addr: token.addr + done, len: piece, eager: true };
                let mut buf = vec![0u8; wire::HEADER_LEN + piece as usize];
                buf[..wire::HEADER_LEN].copy_from_slice(&h.encode());
                // A page-cache read of at most 256 KiB: no longer than the
                // copy sendfile would make, and it spares a segment.
                file.read_exact_at(&mut buf[wire::HEADER_LEN..], file_offset + done).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        TransportError::Protocol(format!("file ended before {piece} bytes"))
                    } else {
                        e.into()
                    }
                })?;
                c.s.write_all(&buf).await?;
                if c.posted && done + piece == len {
                    c.owed += 1; // posted, as in `write_stream`
                } else {
                    Self::reply(&mut c).await?;
                }
                done += piece;
                continue;
            }
            Self::start_write(&mut c, key, token.addr + done, piece).await?;
            let mut left = piece;
            let s = &c.s;
            while left > 0 {
                s.writable().await?;
                let mut off = (file_offset + done + piece - left) as nix::libc::off_t;
                let want = left.min(8 << 20) as usize;
                let res = s.try_io(tokio::io::Interest::WRITABLE, || {
                    nix::sys::sendfile::sendfile64(s.as_fd(), file.as_fd(), Some(&mut off), want)
                        .map_err(std::io::Error::from)
                });
                match res {
                    Ok(0) => return Err(TransportError::Protocol(format!("file ended {left} bytes early"))),
                    Ok(n) => left -= n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Self::reply(&mut c).await?;
            done += piece;
        }
        self.give_back(addr, c);
        Ok(done)
    }

    /// READs `len` bytes from the start of the descriptor's window, as a
    /// stream of chunks (for a PUT body), in operations of at most `max_op`.
    pub fn read_stream(
        &self,
        token: &Token,
        len: u64,
    ) -> impl Stream<Item = Result<Bytes, TransportError>> + Send + 'static {
        let this = self.clone();
        struct St {
            conn: Option<Conn>,
            addr: Option<SocketAddr>,
            key: Key,
            base: u64,
            done: u64,
            left_in_op: u64,
            len: u64,
        }
        let target = Self::target(token);
        let oversize = len > token.size;
        let window = token.size;
        let (addr, key) = match &target {
            Ok((a, k)) => (Some(*a), *k),
            Err(_) => (None, Key { rkey: 0, dct: 0 }),
        };
        let st = St { conn: None, addr, key, base: token.addr, done: 0, left_in_op: 0, len };
        futures::stream::try_unfold(st, move |mut st| {
            let this = this.clone();
            async move {
                if oversize {
                    return Err(TransportError::Rejected(format!(
                        "{} bytes do not fit the {window}-byte window",
                        st.len
                    )));
                }
                let addr = st
                    .addr
                    .ok_or_else(|| TransportError::Protocol("tcp descriptor without an owner address (GID)".into()))?;
                if st.done >= st.len {
                    if let Some(c) = st.conn.take() {
                        this.give_back(addr, c);
                    }
                    return Ok(None);
                }
                let mut c = match st.conn.take() {
                    Some(c) => c,
                    None => this.conn(addr).await?,
                };
                if st.left_in_op == 0 {
                    let piece = (st.len - st.done).min(this.max_op);
                    let h = Header { op: Op::Read, key: st.key, addr: st.base + st.done, len: piece, eager: false };
                    c.s.write_all(&h.encode()).await?;
                    let n = Self::reply(&mut c).await?;
                    if n != piece {
                        return Err(TransportError::Protocol(format!(
                            "owner answered {n} bytes for a {piece}-byte READ"
                        )));
                    }
                    st.left_in_op = piece;
                }
                let want = st.left_in_op.min(READ_CHUNK as u64) as usize;
                let mut buf = BytesMut::zeroed(want);
                c.s.read_exact(&mut buf).await?;
                st.left_in_op -= want as u64;
                st.done += want as u64;
                st.conn = Some(c);
                Ok(Some((buf.freeze(), st)))
            }
        })
    }
}

/// The next bytes of a WRITE's source: what is left of the last chunk, or
/// the next chunk. `got`: bytes taken so far (for the error).
async fn next_chunk<S, E>(body: &mut S, pending: &mut Bytes, got: u64, len: u64) -> Result<Bytes, TransportError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    if !pending.is_empty() {
        return Ok(std::mem::take(pending));
    }
    match body.next().await {
        Some(Ok(b)) => Ok(b),
        Some(Err(e)) => Err(TransportError::Protocol(format!("source failed: {e}"))),
        None => Err(TransportError::Protocol(format!("source ended after {got} of {len} bytes"))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test's panic is its failure report
    use super::*;

    #[tokio::test]
    async fn idle_connections_and_owners_gone_quiet_are_let_go() {
        let owner = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = owner.local_addr().unwrap();
        let remote = TcpRemote::new(1 << 20);
        for _ in 0..3 {
            let c = remote.conn(addr).await.unwrap();
            remote.give_back(addr, c);
        }
        let pooled = |r: &TcpRemote| r.pool.lock().unwrap().by_owner.values().map(Vec::len).sum::<usize>();
        assert_eq!(pooled(&remote), 1, "one connection, taken and given back");
        let (a, b) = (remote.conn(addr).await.unwrap(), remote.conn(addr).await.unwrap());
        remote.give_back(addr, a);
        remote.give_back(addr, b);
        assert_eq!(pooled(&remote), 2);
        let mut pool = remote.pool.lock().unwrap();
        pool.sweep(Instant::now() + IDLE_MAX / 2);
        assert_eq!(pool.by_owner.len(), 1, "not idle long enough yet");
        pool.sweep(Instant::now() + IDLE_MAX);
        assert!(pool.by_owner.is_empty(), "closed, and the owner forgotten");
    }
}
