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

/// The `tcp` provider, owner side. Its replies advertise posted WRITEs
/// (`wire::FEATURE_POSTED`): whoever exposes a window through it waits for
/// the bytes with [`crate::Exposure::settle`] before reading them, not for
/// the remote's word; dropping the exposure revokes the window.
pub struct TcpOwner {
    table: Arc<CapabilityTable>,
    advertised: SocketAddr,
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
        Ok((Arc::new(Self { table: CapabilityTable::new(), advertised }), listener))
    }

    pub fn table(&self) -> &Arc<CapabilityTable> {
        &self.table
    }

    pub fn advertised(&self) -> SocketAddr {
        self.advertised
    }

    /// Serves remote operations until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let me = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = me.connection(stream).await {
                            debug!(%peer, error = %e, "data-plane connection ended");
                        }
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
            match s.read_exact(&mut hb).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
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
                Err(r) => {
                    // The payload of a refused WRITE never reaches memory. A
                    // small eager one is already on its way: it is read and
                    // dropped (for a short while at most), so the remote
                    // reads the reason rather than a reset connection.
                    if h.eager && h.len <= wire::EAGER_MAX_BYTES {
                        let _ = tokio::time::timeout(DISCARD_WAIT, discard(&mut s, h.len)).await;
                    }
                    return refuse(&mut s, Status::Rejected, &r.to_string()).await;
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
                        s.write_all(&wire::reply(Status::Ok, 0)).await?;
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
                    s.write_all(&wire::reply(Status::Ok, 0)).await?;
                }
                Op::Read => {
                    s.write_all(&wire::reply(Status::Ok, h.len)).await?;
                    while left > 0 {
                        let want = left.min(IO_CHUNK as u64) as usize;
                        let _copying = ready_to_copy(&s, Interest::WRITABLE, &moving).await?;
                        let n = match s.try_io(Interest::WRITABLE, || mem.write_to_fd(off, want, s.as_fd())) {
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
    let _ = s.write_all(&wire::reply(status, msg.len() as u64)).await;
    let _ = s.write_all(msg.as_bytes()).await;
    let _ = s.shutdown().await;
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
