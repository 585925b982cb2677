//! Framed GETs on the agent's listeners: `GetStream` without HTTP/2
//! (`sluice_proto::framed_gets` has the wire format and why).
//!
//! A listener tells the two protocols apart per connection ([`sort`]): on
//! the Unix socket and plaintext TCP by the first byte (HTTP/2's preface
//! starts with `P`, the framed one with `S`), over TLS by the application
//! protocol the handshake chose ([`fg::ALPN`] or `h2`), the preface then
//! following inside TLS. A framed connection is served by the same driver
//! as a `GetStream` call (`get_stream.rs`), so every rule holds as it does
//! there: each GET's session is looked up against the connection's origin
//! (the Unix socket; or the peer's address and certificate, and the
//! tenant's own listener, as for its gRPC calls), its namespace authorised,
//! its deadline kept; GETs running and answers untaken are bounded; a peer
//! that breaks the rules gets the stream's status and loses it; on the
//! agent's stop new GETs are refused and the stream ends once those running
//! are answered (the listener waits for its framed connections as the gRPC
//! server waits for its calls). What this module adds is bounded the same
//! way:
//! * a connection that has not sent its whole preface (gRPC's first byte,
//!   or all of the framed one) within [`FIRST_BYTES_WAIT`] is closed, and
//!   at most [`SORTING`] connections are being sorted at once (accepting
//!   waits, as for TLS handshakes);
//! * a malformed or oversized frame, or the shim closing its side, closes
//!   the connection and stops its GETs (nobody is left to take their
//!   answers);
//! * a peer that stops reading its answers: the driver ends the stream
//!   past its bound of untaken answers, and a write that waits longer than
//!   [`WRITE_WAIT`] closes the connection.
//!
//! * at most [`FRAMED_AT_ONCE`] framed connections are served at once per
//!   listener (and per core), [`FRAMED_PER_PEER`] of them from one address;
//!   one more is closed unanswered, and its shim sends that stream's GETs
//!   as a call.
//!
//! The sorting places are shared by every connection of a listener: a
//! peer that fills them with silent connections delays the shim's too (by
//! [`FIRST_BYTES_WAIT`] at a time), as the TLS listeners' handshake places
//! do. Only the shim's user and group reach the Unix socket
//! (`socket_mode`). Any peer that reaches a TCP listener can connect
//! (with TLS, only with a certificate of the client CA): `shim_origins`
//! is checked when a session opens, and a session is used only from where
//! it was opened; so on plaintext TCP (`[tls] insecure`, for a trusted
//! link only) a peer can hold sorting places as it can hold TLS handshake
//! places. A framed connection holds at most one frame of
//! [`fg::MAX_FRAME`] being read, as a gRPC call holds one message.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use nix::sys::socket::{recv, MsgFlags};
use sluice_proto::framed_gets::{self as fg, Frame, FrameReader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::get_stream::{Answer, RunGet};

/// Longest a new connection may take to send its preface (a shim sends
/// its HTTP/2 or framed preface at once).
pub const FIRST_BYTES_WAIT: Duration = Duration::from_secs(3);
/// Most connections waiting for their preface at once.
pub const SORTING: usize = 256;
/// Longest one write of answers may wait for the peer to take them.
pub const WRITE_WAIT: Duration = Duration::from_secs(30);
/// Most framed connections served at once by one sorter (a listener, or
/// one core's share of it): a shim keeps `[agent] connections` (8 by
/// default, 64 at most) open.
pub const FRAMED_AT_ONCE: usize = 1024;
/// Most of them from one peer address (twice the 64 connections a shim
/// opens at most: room for links being replaced).
pub const FRAMED_PER_PEER: usize = 128;
/// Most bytes of answers gathered into one write.
const WRITE_BATCH: usize = 256 << 10;
/// Longest the rest of a frame may take once its first byte came (a shim
/// writes each frame whole; a peer that sends most of a 4 MiB frame and
/// stops would hold that buffer, and its place, for good).
pub const FRAME_REST_WAIT: Duration = Duration::from_secs(10);

/// Whether the first byte a socket's peer sent (left unread) is the
/// framed preface's; `None` if it closed first. (A macro: tokio's Unix and
/// TCP streams share these methods but no trait.)
macro_rules! first_byte {
    ($conn:expr) => {{
        let conn = $conn;
        let mut b = [0u8; 1];
        loop {
            conn.readable().await?;
            let peeked = conn.try_io(Interest::READABLE, || {
                recv(conn.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT)
                    .map_err(std::io::Error::from)
            });
            match peeked {
                Ok(0) => break Ok(None),
                Ok(_) => break Ok(Some(b[0] == fg::PREFACE[0])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => break Err(e),
            }
        }
    }};
}

/// Where a connection comes from: its address (none on the Unix socket)
/// and its verified client certificate (TLS only).
pub type Peer = (Option<std::net::SocketAddr>, Option<Arc<crate::tls::ClientCert>>);

/// A connection a listener can sort: a Unix or TCP socket, or TLS over
/// TCP.
pub trait Conn: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// Whether the peer asks for framed GETs, nothing of its bytes read:
    /// `None` if it closed before saying.
    fn asks_framed(&self) -> impl std::future::Future<Output = std::io::Result<Option<bool>>> + Send;
    /// Where it comes from: the peer's address (none on the Unix socket)
    /// and the leaf of the certificate chain TLS verified (TLS only). A TCP
    /// peer whose address cannot be read fails (it is never taken for the
    /// Unix socket).
    fn peer(&self) -> std::io::Result<Peer>;
    type Read: AsyncRead + Send + Unpin + 'static;
    type Write: AsyncWrite + Send + Unpin + 'static;
    /// Its two halves, each used by one task (owned halves where the
    /// socket has them: no lock between reading and writing).
    fn halves(self) -> (Self::Read, Self::Write);
    /// On TCP, notices a peer that vanished without closing
    /// ([`fg::TCP_PEER_GONE`]).
    fn watch_peer(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Conn for UnixStream {
    type Read = tokio::net::unix::OwnedReadHalf;
    type Write = tokio::net::unix::OwnedWriteHalf;
    fn halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    async fn asks_framed(&self) -> std::io::Result<Option<bool>> {
        first_byte!(self)
    }
    fn peer(&self) -> std::io::Result<Peer> {
        Ok((None, None))
    }
}

impl Conn for TcpStream {
    type Read = tokio::net::tcp::OwnedReadHalf;
    type Write = tokio::net::tcp::OwnedWriteHalf;
    fn halves(self) -> (Self::Read, Self::Write) {
        self.into_split()
    }
    fn watch_peer(&self) -> std::io::Result<()> {
        fg::watch_tcp_peer(self)
    }
    async fn asks_framed(&self) -> std::io::Result<Option<bool>> {
        first_byte!(self)
    }
    fn peer(&self) -> std::io::Result<Peer> {
        Ok((Some(self.peer_addr()?), None))
    }
}

impl Conn for TlsStream<TcpStream> {
    type Read = tokio::io::ReadHalf<Self>;
    type Write = tokio::io::WriteHalf<Self>;
    fn halves(self) -> (Self::Read, Self::Write) {
        tokio::io::split(self)
    }
    fn watch_peer(&self) -> std::io::Result<()> {
        fg::watch_tcp_peer(self.get_ref().0)
    }
    async fn asks_framed(&self) -> std::io::Result<Option<bool>> {
        // The handshake chose: a shim that asks for framed GETs offers
        // their protocol first (the preface follows inside TLS); gRPC
        // clients offer `h2` alone.
        Ok(Some(self.get_ref().1.alpn_protocol() == Some(fg::ALPN)))
    }
    fn peer(&self) -> std::io::Result<Peer> {
        let (tcp, tls) = self.get_ref();
        // The leaf of the chain TLS verified against the client CA.
        let cert = tls.peer_certificates().and_then(|chain| chain.first()).map(|c| crate::tls::ClientCert::from_der(c));
        Ok((Some(tcp.peer_addr()?), cert))
    }
}

/// The gRPC connections of `conns`, and the tasks of the framed ones: each
/// framed connection is served by `framed` in a task of `tasks` (on the
/// runtime this is called on); the rest are passed on, in the order their
/// first bytes came. Once the gRPC server is done, wait for `tasks`.
pub fn sort<C, S, F, Fut>(conns: S, framed: F) -> (ReceiverStream<std::io::Result<C>>, TaskTracker)
where
    C: Conn,
    S: Stream<Item = std::io::Result<C>> + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    sort_within(conns, framed, FIRST_BYTES_WAIT, SORTING, FRAMED_AT_ONCE)
}

/// [`sort`], with at most `places` connections given `wait` each, and at
/// most `at_once` served framed.
fn sort_within<C, S, F, Fut>(
    conns: S,
    framed: F,
    wait: Duration,
    places: usize,
    at_once: usize,
) -> (ReceiverStream<std::io::Result<C>>, TaskTracker)
where
    C: Conn,
    S: Stream<Item = std::io::Result<C>> + Send + 'static,
    F: Fn(C) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (grpc, out) = mpsc::channel(64);
    let tasks = TaskTracker::new();
    let sorting = tasks.clone();
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(places));
        let serving = Arc::new(Serving::new(at_once, FRAMED_PER_PEER.min(at_once)));
        let mut conns = std::pin::pin!(conns);
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => s,
                () = grpc.closed() => break,
            };
            let Ok(slot) = slot else { break };
            let Some(conn) = crate::accept::next_conn(&mut conns, grpc.closed(), "a control connection").await else {
                break;
            };
            let (grpc, framed, serving) = (grpc.clone(), framed.clone(), serving.clone());
            sorting.spawn(async move {
                let sorted = tokio::time::timeout(wait, preface(conn)).await;
                // The place is held until the whole preface has come.
                drop(slot);
                match sorted {
                    Ok(Ok(Sorted::Framed(conn))) => {
                        // (A peer whose address cannot be read is refused
                        // by `framed` itself.)
                        let ip = conn.peer().ok().and_then(|(addr, _)| addr).map(|a| a.ip());
                        if let Some(_admitted) = serving.admit(ip) {
                            framed(conn).await;
                        }
                    }
                    Ok(Ok(Sorted::Grpc(conn))) => {
                        let _ = grpc.send(Ok(conn)).await;
                    }
                    Ok(Ok(Sorted::Closed)) => {}
                    Ok(Err(why)) => tracing::debug!(%why, "a control connection closed before it was served"),
                    Err(_) => tracing::debug!("a control connection sent no whole preface in {wait:?}; closed"),
                }
            });
        }
        // Nothing more to sort: the tracker may finish once its tasks have.
        sorting.close();
    });
    (ReceiverStream::new(out), tasks)
}

/// The framed connections one sorter serves: at most `total` in all and
/// `per_peer` from one address (the Unix socket is one), so no one peer
/// takes every place.
struct Serving {
    total: Arc<Semaphore>,
    per_peer: usize,
    peers: std::sync::Mutex<std::collections::HashMap<Option<std::net::IpAddr>, usize>>,
    /// When a refusal was last logged (a flood of them would flood the log).
    warned: std::sync::Mutex<Option<std::time::Instant>>,
}

/// A place among those [`Serving`] has; given back when dropped.
struct Admitted {
    _total: tokio::sync::OwnedSemaphorePermit,
    serving: Arc<Serving>,
    ip: Option<std::net::IpAddr>,
}

impl Serving {
    fn new(total: usize, per_peer: usize) -> Self {
        Self { total: Arc::new(Semaphore::new(total)), per_peer, peers: Default::default(), warned: Default::default() }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Option<std::net::IpAddr>, usize>> {
        self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for a framed connection from `ip`, if one is free; a
    /// refusal is logged (at most once a minute) and the connection is
    /// closed unanswered: its shim sends those GETs as calls.
    fn admit(self: &Arc<Self>, ip: Option<std::net::IpAddr>) -> Option<Admitted> {
        let why = match self.total.clone().try_acquire_owned() {
            Ok(total) => {
                let mut peers = self.peers();
                let n = peers.entry(ip).or_insert(0);
                if *n < self.per_peer {
                    *n += 1;
                    return Some(Admitted { _total: total, serving: self.clone(), ip });
                }
                format!("{} from one address", self.per_peer)
            }
            Err(_) => "all of the listener's".to_owned(),
        };
        let mut warned = self.warned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            *warned = Some(std::time::Instant::now());
            let from = ip.map_or("the Unix socket".to_owned(), |ip| ip.to_string());
            tracing::warn!(
                %from,
                "a framed GET connection was closed unanswered: {why} places are taken (its shim sends those \
                 GETs as calls; further refusals within a minute are not logged)"
            );
        }
        None
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut peers = self.serving.peers();
        if let Some(n) = peers.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

/// What a connection's first bytes said.
enum Sorted<C> {
    /// It sent the framed preface (read): serve it framed.
    Framed(C),
    /// Anything else (nothing read): the gRPC server's.
    Grpc(C),
    /// It closed before sending a byte.
    Closed,
}

/// Sorts `conn`; a framed one's preface is read whole.
async fn preface<C: Conn>(mut conn: C) -> Result<Sorted<C>, String> {
    match conn.asks_framed().await.map_err(|e| e.to_string())? {
        None => Ok(Sorted::Closed),
        Some(false) => Ok(Sorted::Grpc(conn)),
        Some(true) => {
            let mut preface = [0u8; fg::PREFACE.len()];
            conn.read_exact(&mut preface).await.map_err(|e| format!("reading the framed preface: {e}"))?;
            if &preface == fg::PREFACE {
                Ok(Sorted::Framed(conn))
            } else {
                Err("not the framed-GETs preface".into())
            }
        }
    }
}

/// Serves one framed connection whose preface [`sort`] has read, until
/// either side ends it.
pub async fn serve<C: Conn>(conn: C, run: RunGet, stop: Option<watch::Receiver<bool>>) {
    match serve_conn(conn, run, stop).await {
        Ok(()) => tracing::debug!("framed GET connection ended"),
        Err(why) => tracing::debug!(%why, "framed GET connection closed"),
    }
}

async fn serve_conn<C: Conn>(conn: C, run: RunGet, stop: Option<watch::Receiver<bool>>) -> Result<(), String> {
    if let Err(e) = conn.watch_peer() {
        // Served without: a vanished peer is then noticed only by a write.
        tracing::warn!(error = %e, "framed GETs: could not set TCP keepalive on a connection");
    }
    let (rd, mut wr) = conn.halves();
    written(send(&mut wr, fg::PREFACE)).await?;
    let reader = FrameReader::new(rd).rest_within(FRAME_REST_WAIT);
    let inbound = futures::stream::unfold(Some(reader), |reader| async move {
        let mut r = reader?;
        // Whatever ends the shim's side ends the stream, and the driver
        // stops its GETs: a shim never half-closes a stream it still reads
        // (its side ends when it gives the stream up), so nobody would take
        // their answers. (A `GetStream` call's shim going away drops the
        // call, the same.)
        let gone = |why: String| Some((Err(Status::cancelled(why)), None));
        match r.next().await {
            Ok(Some(Frame::Gets(m))) => Some((Ok(m), Some(r))),
            Ok(None) => gone("the shim closed the connection".into()),
            Ok(Some(_)) => {
                tracing::warn!("framed GETs: a shim sent an agent's frame; closing its connection");
                gone("a shim sent an agent's frame".into())
            }
            // The shim went away mid-frame, or its socket failed.
            Err(e @ (fg::FramedError::Io(_) | fg::FramedError::Truncated)) => gone(e.to_string()),
            // Counted before decoding: refused as the stream refuses a
            // decoded message of too many GETs, with its status.
            Err(e @ fg::FramedError::TooMany { .. }) => {
                Some((Err(Status::invalid_argument(format!("GetStream message refused: {e}"))), None))
            }
            Err(e) => {
                tracing::warn!(error = %e, "framed GETs: a bad frame from a shim; closing its connection");
                gone(e.to_string())
            }
        }
    });
    let mut answers = crate::get_stream::start(run, Box::pin(inbound), stop).into_inner();
    let mut out = Vec::new();
    while let Some(a) = answers.recv().await {
        out.clear();
        // Whatever else is ready goes in the same write.
        let mut ended = push(&mut out, a);
        while !ended && out.len() < WRITE_BATCH {
            match answers.try_recv() {
                Ok(a) => ended = push(&mut out, a),
                Err(_) => break,
            }
        }
        written(send(&mut wr, &out)).await?;
        if ended {
            break;
        }
        // A burst's room is not kept for the connection's life.
        out.shrink_to(WRITE_BATCH);
    }
    // Dropping `answers` (a write failed) stops the GETs still running.
    written(wr.shutdown()).await
}

/// Writes `bytes` and flushes them: over TLS a write the socket cannot
/// take at once stays in the session's buffer until flushed (on a socket
/// the flush costs nothing).
async fn send<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    wr.write_all(bytes).await?;
    wr.flush().await
}

/// Appends `a`; `true` when it ends the stream.
fn push(out: &mut Vec<u8>, a: Answer) -> bool {
    match a {
        Ok(item) => {
            fg::push_answer(out, &item);
            false
        }
        Err(status) => {
            fg::push_end(out, status.code() as i32, status.message());
            true
        }
    }
}

async fn written(w: impl std::future::Future<Output = std::io::Result<()>>) -> Result<(), String> {
    match tokio::time::timeout(WRITE_WAIT, w).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing answers: {e}")),
        Err(_) => Err(format!("the shim took no answers for {WRITE_WAIT:?}")),
    }
}

#[cfg(test)]
#[path = "framed_gets_tests.rs"]
mod tests;
