//! The remote's side of the `tcp` transport (the storage gateway): performs
//! WRITE and READ against descriptors, splitting at the per-operation limit,
//! over pooled connections to each owner.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

/// Remote-side `tcp` transport with a small connection pool per owner.
/// Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct TcpRemote {
    pool: Arc<Mutex<HashMap<SocketAddr, Vec<TcpStream>>>>,
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

    async fn conn(&self, addr: SocketAddr) -> Result<TcpStream, TransportError> {
        if let Some(s) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&addr).and_then(Vec::pop) {
            return Ok(s);
        }
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    fn give_back(&self, addr: SocketAddr, s: TcpStream) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let v = pool.entry(addr).or_default();
        if v.len() < 16 {
            v.push(s);
        }
    }

    fn target(token: &Token) -> Result<(SocketAddr, Key), TransportError> {
        let addr = owner_addr(token)
            .ok_or_else(|| TransportError::Protocol("tcp descriptor without an owner address (GID)".into()))?;
        Ok((addr, Key { rkey: token.rkey, dct: token.dct }))
    }

    /// Reads an owner's reply; on error, the owner's message.
    async fn reply(s: &mut TcpStream) -> Result<u64, TransportError> {
        let mut rb = [0u8; wire::REPLY_LEN];
        s.read_exact(&mut rb).await?;
        let (status, len) = wire::decode_reply(&rb);
        if status == 0 {
            return Ok(len);
        }
        let mut msg = vec![0u8; len.min(4096) as usize];
        let _ = s.read_exact(&mut msg).await;
        Err(TransportError::Rejected(String::from_utf8_lossy(&msg).into_owned()))
    }

    /// Waits for the owner's go-ahead to a WRITE header (see `wire`): no
    /// payload byte leaves before an owner has accepted the descriptor.
    async fn go_ahead(s: &mut TcpStream) -> Result<(), TransportError> {
        match Self::reply(s).await {
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
        let mut s = self.conn(addr).await?;
        let mut body = body;
        let mut pending = Bytes::new();
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(self.max_op);
            s.write_all(&Header { op: Op::Write, key, addr: token.addr + done, len: piece }.encode()).await?;
            Self::go_ahead(&mut s).await?;
            let mut left = piece;
            while left > 0 {
                if pending.is_empty() {
                    pending = match body.next().await {
                        Some(Ok(b)) => b,
                        Some(Err(e)) => return Err(TransportError::Protocol(format!("source failed: {e}"))),
                        None => {
                            return Err(TransportError::Protocol(format!(
                                "source ended after {} of {len} bytes",
                                done + piece - left
                            )))
                        }
                    };
                }
                let take = (pending.len() as u64).min(left) as usize;
                s.write_all(&pending.split_to(take)).await?;
                left -= take as u64;
            }
            Self::reply(&mut s).await?;
            done += piece;
        }
        self.give_back(addr, s);
        Ok(done)
    }

    /// WRITEs `len` bytes of `file` from `file_offset` into the descriptor's
    /// window with `sendfile(2)`: the bytes go from the page cache to the
    /// socket without passing through this process.
    pub async fn write_file(
        &self,
        token: &Token,
        file: &std::fs::File,
        file_offset: u64,
        len: u64,
    ) -> Result<u64, TransportError> {
        use std::os::fd::AsFd;
        if len > token.size {
            return Err(TransportError::Rejected(format!("{len} bytes do not fit the {}-byte window", token.size)));
        }
        let (addr, key) = Self::target(token)?;
        let mut s = self.conn(addr).await?;
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(self.max_op);
            s.write_all(&Header { op: Op::Write, key, addr: token.addr + done, len: piece }.encode()).await?;
            Self::go_ahead(&mut s).await?;
            let mut left = piece;
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
            Self::reply(&mut s).await?;
            done += piece;
        }
        self.give_back(addr, s);
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
            conn: Option<TcpStream>,
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
                    c.write_all(&Header { op: Op::Read, key: st.key, addr: st.base + st.done, len: piece }.encode())
                        .await?;
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
                c.read_exact(&mut buf).await?;
                st.left_in_op -= want as u64;
                st.done += want as u64;
                st.conn = Some(c);
                Ok(Some((buf.freeze(), st)))
            }
        })
    }
}
