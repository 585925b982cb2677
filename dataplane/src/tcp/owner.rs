//! The memory owner's side of the `tcp` transport: listens for remote
//! WRITE/READ operations and serves them against its capability table,
//! moving bytes between the socket and the registered memory directly.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use super::wire::{self, Header, Op, Status};
use crate::capability::{Access, CapabilityTable, Checked, Grant};
use crate::landing::{Copying, Moving};
use crate::token::Token;
use crate::transport::{
    Capabilities, Exposure, Transport, TransportError, TransportKind, MAX_OP_BYTES, MAX_WINDOW_BYTES,
};

/// Bytes moved per read/write syscall.
const IO_CHUNK: usize = 4 << 20;

/// How long a refused eager WRITE's payload is waited for before the refusal.
const DISCARD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Most data-plane connections served at once; more wait in the listen
/// backlog. Every remote that serves a GET or PUT keeps a few (the gateway
/// pools at most 16 per owner and closes those unused for 30 s).
const MAX_CONNECTIONS: usize = 1024;
/// A connection on which no operation's header comes for this long is
/// closed (longer than a gateway keeps an unused one), so connections that
/// say nothing cannot hold every place.
const IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// Longest a reply may wait for the remote to take it: one that stops
/// reading must not hold its task, or the memory an operation names.
const WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// What every refused access is told, whatever the reason (counted and
/// logged here): a reason per case would tell a guessing peer whether a
/// key alone exists.
const REFUSED: &str = "the descriptor does not allow this access";

/// The `tcp` provider, owner side. Its replies advertise posted WRITEs
/// (`wire::FEATURE_POSTED`): whoever exposes a window through it waits for
/// the bytes with [`crate::Exposure::settle`] before reading them, not for
/// the remote's word; dropping the exposure revokes the window.
pub struct TcpOwner {
    table: Arc<CapabilityTable>,
    advertised: SocketAddr,
    /// [`IDLE`], shorter in tests.
    idle: std::time::Duration,
}

impl TcpOwner {
    /// Binds the data-plane listener. `advertise` is the address remotes
    /// should connect to (default: the bound address).
    pub async fn bind(listen: SocketAddr, advertise: Option<IpAddr>) -> std::io::Result<(Arc<Self>, TcpListener)> {
        let listener = TcpListener::bind(listen).await?;
        let mut advertised = listener.local_addr()?;
        if let Some(ip) = advertise {
            advertised.set_ip(ip);
        }
        Ok((Arc::new(Self { table: CapabilityTable::new(), advertised, idle: IDLE }), listener))
    }

    /// The same owner, closing connections idle for `idle` (tests).
    #[cfg(test)]
    pub(crate) fn with_idle(self: Arc<Self>, idle: std::time::Duration) -> Arc<Self> {
        let me = Arc::try_unwrap(self).unwrap_or_else(|_| unreachable!("not shared yet"));
        Arc::new(Self { idle, ..me })
    }

    pub fn table(&self) -> &Arc<CapabilityTable> {
        &self.table
    }

    pub fn advertised(&self) -> SocketAddr {
        self.advertised
    }

    /// Serves remote operations until the listener fails, at most
    /// [`MAX_CONNECTIONS`] connections at once.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let mut last_full_warning: Option<std::time::Instant> = None;
        loop {
            let place = match places.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if last_full_warning.is_none_or(|t| t.elapsed() > std::time::Duration::from_secs(60)) {
                        warn!(max = MAX_CONNECTIONS, "data-plane connections at their limit; new ones wait");
                        last_full_warning = Some(std::time::Instant::now());
                    }
                    match places.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => return,
                    }
                }
            };
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.connection(stream).await {
                            debug!(%peer, error = %e, "data-plane connection ended");
                        }
                        drop(place);
                    });
                }
                Err(e) => {
                    warn!(error = %e, "data-plane accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn connection(&self, mut s: TcpStream) -> std::io::Result<()> {
        loop {
            let mut hb = [0u8; wire::HEADER_LEN];
            match tokio::time::timeout(self.idle, s.read_exact(&mut hb)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Ok(Err(e)) => return Err(e),
                // Nothing asked for a while: closed (a remote reconnects).
                Err(_) => return Ok(()),
            }
            let h = match Header::decode(&hb) {
                Ok(h) => h,
                Err(e) => return refuse(&mut s, Status::Protocol, &e.to_string()).await,
            };
            let access = match h.op {
                Op::Write => Access::RemoteWrite,
                Op::Read => Access::RemoteRead,
            };
            let checked = match self.table.check(h.key, h.addr, h.len, access) {
                Ok(c) => c,
                Err(_) => {
                    // The payload of a refused WRITE never reaches memory. A
                    // small eager one is already on its way: it is read and
                    // dropped (for a short while at most), so the remote
                    // reads the refusal rather than a reset connection.
                    if h.eager && h.len <= wire::EAGER_MAX_BYTES {
                        let _ = tokio::time::timeout(DISCARD_WAIT, discard(&mut s, h.len)).await;
                    }
                    return refuse(&mut s, Status::Rejected, REFUSED).await;
                }
            };
            let Checked { memory: mem, offset: mut off, moving } = checked;
            let mut left = h.len;
            match h.op {
                Op::Write => {
                    // The go-ahead: the remote sends no payload before it,
                    // unless this connection already had an answer from
                    // us and the WRITE says its payload follows (eager).
                    if !h.eager {
                        reply(&mut s, &wire::reply(Status::Ok, 0), &moving).await?;
                    }
                    while left > 0 {
                        let want = left.min(IO_CHUNK as u64) as usize;
                        let _copying = ready_to_copy(&s, Interest::READABLE, &moving).await?;
                        let n = match s.try_io(Interest::READABLE, || mem.read_from_fd(off, want, s.as_fd())) {
                            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                            Ok(n) => n,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                            Err(e) => return Err(e),
                        };
                        off += n as u64;
                        left -= n as u64;
                    }
                    // Landed before it is answered: a requester waiting on
                    // the window (a posted WRITE) is released here.
                    moving.finished(h.len);
                    tokio::time::timeout(WRITE_WAIT, s.write_all(&wire::reply(Status::Ok, 0)))
                        .await
                        .map_err(|_| std::io::Error::other("the remote did not take a reply"))??;
                }
                Op::Read => {
                    reply(&mut s, &wire::reply(Status::Ok, h.len), &moving).await?;
                    // Memory this side does not map (host memory a DPU
                    // reaches by DMA) is copied out a chunk at a time and
                    // sent from that copy: written straight from the
                    // memory, each write copied a whole chunk and sent what
                    // the socket took, so a remote taking a few KiB at a
                    // time made the owner DMA megabytes per few KiB sent.
                    let mut staged = Staged::default();
                    while left > 0 {
                        let want = left.min(IO_CHUNK as u64) as usize;
                        let _copying = ready_to_copy(&s, Interest::WRITABLE, &moving).await?;
                        let sent = if mem.is_mapped() {
                            s.try_io(Interest::WRITABLE, || mem.write_to_fd(off, want, s.as_fd()))
                        } else {
                            staged.send(&s, &*mem, off, left)
                        };
                        let n = match sent {
                            Ok(n) => n,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                            Err(e) => return Err(e),
                        };
                        off += n as u64;
                        left -= n as u64;
                    }
                    moving.finished(h.len);
                }
            }
        }
    }
}

/// Most of an unmapped window copied out at once ([`Staged`]).
const STAGED_CHUNK: usize = 256 << 10;

/// Bytes of an unmapped window copied out and not yet all sent.
#[derive(Default)]
struct Staged {
    buf: Vec<u8>,
    sent: usize,
}

impl Staged {
    /// Sends what the socket takes of the bytes at `off` (`left` of the
    /// operation still to go), copying the next chunk out of `mem` only
    /// when the last one is all sent.
    fn send(
        &mut self,
        s: &TcpStream,
        mem: &dyn crate::memory::RegionMemory,
        off: u64,
        left: u64,
    ) -> std::io::Result<usize> {
        if self.sent == self.buf.len() {
            self.buf.resize(left.min(STAGED_CHUNK as u64) as usize, 0);
            mem.read_at(off, &mut self.buf).map_err(std::io::Error::other)?;
            self.sent = 0;
        }
        let n = s.try_write(&self.buf[self.sent..])?;
        self.sent += n;
        Ok(n)
    }
}

/// Waits until the socket is ready for the next copy of an operation, and
/// marks the copy (see `Landing::revoke`). A revoked window ends the
/// operation, whether it was waiting on a remote that stalls (which then
/// holds no memory) or had bytes at hand: nothing more reaches or leaves
/// the window once its requester has ended.
async fn ready_to_copy<'a>(s: &TcpStream, interest: Interest, moving: &'a Moving) -> std::io::Result<Copying<'a>> {
    tokio::select! {
        biased;
        _ = moving.landing().revoked() => {
            return Err(std::io::Error::other("the window was revoked while its operation waited on the socket"));
        }
        r = s.ready(interest) => { r?; }
    }
    moving.copy().ok_or_else(|| std::io::Error::other("the window was revoked during the operation"))
}

/// Writes a reply within [`WRITE_WAIT`], and not past the revocation of the
/// window `moving` is on: a remote that stops reading holds neither the
/// task nor the memory after the request ended.
async fn reply(s: &mut TcpStream, bytes: &[u8], moving: &Moving) -> std::io::Result<()> {
    tokio::select! {
        biased;
        _ = moving.landing().revoked() => Err(std::io::Error::other("the window was revoked while a reply waited")),
        r = tokio::time::timeout(WRITE_WAIT, s.write_all(bytes)) => {
            r.map_err(|_| std::io::Error::other("the remote did not take a reply"))?
        }
    }
}

/// Reads and drops `len` bytes through a small buffer (a refused payload
/// costs no memory of its size).
async fn discard(s: &mut TcpStream, mut len: u64) -> std::io::Result<()> {
    let mut sink = [0u8; 4096];
    while len > 0 {
        let want = len.min(sink.len() as u64) as usize;
        match s.read(&mut sink[..want]).await? {
            0 => return Ok(()),
            n => len -= n as u64,
        }
    }
    Ok(())
}

async fn refuse(s: &mut TcpStream, status: Status, msg: &str) -> std::io::Result<()> {
    let _ = tokio::time::timeout(WRITE_WAIT, async {
        s.write_all(&wire::reply(status, msg.len() as u64)).await?;
        s.write_all(msg.as_bytes()).await?;
        s.shutdown().await
    })
    .await;
    Ok(())
}

/// The owner's address as a GID: IPv4-mapped for IPv4 (as RoCE does).
fn gid_of(addr: SocketAddr) -> [u8; 16] {
    match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Where a `tcp` descriptor says the owner listens.
pub fn owner_addr(token: &Token) -> Option<SocketAddr> {
    let gid = std::net::Ipv6Addr::from(token.gid?);
    let ip = gid.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(gid));
    Some(SocketAddr::new(ip, token.lid))
}

impl Transport for TcpOwner {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::Tcp,
            standard_token: false,
            max_op_bytes: MAX_OP_BYTES,
            max_window_bytes: MAX_WINDOW_BYTES,
        }
    }

    fn expose(&self, grant: Grant) -> Result<Exposure, TransportError> {
        if grant.len > MAX_WINDOW_BYTES {
            return Err(TransportError::WindowTooLarge(grant.len));
        }
        grant.memory.check(grant.offset, grant.len).map_err(|e| TransportError::Rejected(e.to_string()))?;
        // The software transport copies with the CPU: memory only a NIC
        // reaches is refused here, not when the peer's first WRITE fails.
        if let Some(why) = grant.memory.nic_only() {
            return Err(TransportError::Unsupported(format!("the tcp transport cannot reach this memory: {why}")));
        }
        let cap = self.table.grant(grant);
        // The descriptor: GID = owner IP, LID = owner port, rkey + DCT +
        // base address = the capability key.
        let token = Token::new(
            cap.base,
            cap.len as u32,
            cap.key.rkey,
            self.advertised.port(),
            cap.key.dct,
            Some(gid_of(self.advertised)),
        )
        .map_err(|e| TransportError::Protocol(e.to_string()))?;
        let landing = Some(cap.landing.clone());
        Ok(Exposure { token, guard: Box::new(cap), landing })
    }
}
