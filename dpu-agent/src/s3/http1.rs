//! Object GETs and HEADs to plain-HTTP stores on connections the agent owns.
//!
//! reqwest hands a body over as chunks of its own buffer, which the agent
//! then copies into the destination region: a second pass over every byte
//! after the kernel's. Here, once the response head is parsed, the body is
//! read from the socket straight into the region (`read(2)` into the
//! mapping; the CRC-64/NVME is then taken where the bytes landed, still in
//! cache). Small objects gain too: no URL parsing, header map building or
//! middleware per request, only a request head written and a response head
//! parsed (`httparse`).
//!
//! Scope: GETs and HEADs of objects over `http://` (signed by the caller;
//! GETs with a data path token too, whose answers are bodyless), with
//! keep-alive connections pooled per `host:port`. Everything else (TLS,
//! uploads, listings) stays on reqwest. A connection
//! is reused only after its body was read to the end; a pooled connection
//! the store closed meanwhile is replaced once, transparently (a GET is
//! idempotent). Bodies framed by `Content-Length` stream; a chunked or
//! close-delimited body (error replies) is read whole, bounded.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use nix::sys::socket::{recv, MsgFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::body::{Body, BodySource, Landing};
use super::endpoints::deadline_error;
use super::error::S3Error;

/// A pooled connection older than this is not reused (stores close idle
/// keep-alive connections after 5–60 s; reqwest's default is 90 s, with
/// the same retry on a connection found closed).
const IDLE_FOR: Duration = Duration::from_secs(20);
/// Idle connections kept per `host:port`.
const MAX_IDLE: usize = 64;
/// The longest response head accepted.
const MAX_HEAD: usize = 64 << 10;
/// Headers per response accepted.
const MAX_HEADERS: usize = 128;
/// Bytes of a body read whole (error replies; chunked data replies get the
/// length they asked for on top).
const MAX_WHOLE: usize = 64 << 10;
/// Largest single `read(2)` into a region.
const MAX_READ: u64 = 4 << 20;

/// Keep-alive connections to plain-HTTP stores, for GETs. Pooled per
/// `host:port` and per runtime (`crate::cores::current`): a socket is
/// registered with the runtime that opened it, and reused from another it
/// would wake that runtime's thread for every read.
#[derive(Debug)]
pub struct Http1 {
    idle: Mutex<HashMap<usize, IdleByAuthority>>,
    /// When every runtime's idle connections were last swept, in ms since
    /// `born`: connections to a store no GET goes to any more are closed
    /// too, not kept until a GET to it comes.
    swept_ms: std::sync::atomic::AtomicU64,
    born: Instant,
    connect_timeout: Duration,
    read_timeout: Duration,
}

/// One runtime's idle connections, by `host:port`, with when each went idle.
type IdleByAuthority = HashMap<String, Vec<(TcpStream, Instant)>>;

/// A GET to send: where, the request head, what it may take.
pub struct Request<'a> {
    /// `http://host[:port]`, for messages.
    pub endpoint: &'a str,
    /// `host[:port]`, to connect to.
    pub authority: &'a str,
    /// The whole request head, `GET ... HTTP/1.1\r\n...\r\n\r\n`.
    pub head: Vec<u8>,
    /// The bytes asked for (bounds a body that must be read whole).
    pub asked: u64,
    /// The longest wait for the response head (`None`: the read timeout).
    pub first_byte: Option<Duration>,
    /// The answer has no body whatever its headers say (a HEAD).
    pub no_body: bool,
}

/// A response: status, headers and the body.
pub struct Response {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Body,
}

impl Http1 {
    pub fn new(connect_timeout: Duration, read_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(HashMap::new()),
            swept_ms: Default::default(),
            born: Instant::now(),
            connect_timeout,
            read_timeout,
        })
    }

    /// Sends `req` and reads the response head; the body streams from the
    /// returned [`Body`].
    pub async fn get(self: &Arc<Self>, req: Request<'_>) -> Result<Response, S3Error> {
        let wait = req.first_byte.unwrap_or(self.read_timeout);
        let exchange = async {
            // A pooled connection may have been closed by the store since;
            // then (and only then) the request goes again on a new one.
            loop {
                let (mut conn, reused) = match self.take(req.authority) {
                    Some(c) => (c, true),
                    None => (self.connect(&req).await?, false),
                };
                match exchange(&mut conn, &req.head).await {
                    Ok(head) => return Ok((conn, head)),
                    Err(Exchange::Closed) if reused => {
                        // Its idle neighbours are likely closed too (a
                        // store restarted): start afresh.
                        self.forget(req.authority);
                        continue;
                    }
                    Err(Exchange::Closed) => {
                        return Err(connection(req.endpoint, "the store closed the connection without answering"))
                    }
                    Err(Exchange::Failed(e)) => return Err(e.with_endpoint(req.endpoint)),
                }
            }
        };
        let (conn, (head, rest)) = tokio::time::timeout(wait, exchange)
            .await
            .map_err(|_| deadline_error(req.endpoint, "no response head; [failover] first_byte_timeout_ms", wait))??;
        let framing =
            if req.no_body { Framing::Length(0) } else { head.framing().map_err(|m| connection(req.endpoint, &m))? };
        let mut body = Socket {
            pool: self.clone(),
            core: crate::cores::current(),
            authority: req.authority.to_owned(),
            endpoint: req.endpoint.to_owned(),
            conn: Some(conn),
            buffered: rest.freeze(),
            remaining: 0,
            keep_alive: head.keep_alive,
        };
        let body = match framing {
            Framing::Length(n) => {
                body.remaining = n;
                if n == 0 {
                    body.release();
                }
                Body::from_source(body)
            }
            Framing::Chunked | Framing::UntilClose => {
                let asked = usize::try_from(req.asked).unwrap_or(usize::MAX);
                let cap = if head.status.is_success() { MAX_WHOLE.saturating_add(asked) } else { MAX_WHOLE };
                let whole = body.read_whole(framing, cap).await?;
                Body::from_stream(futures::stream::iter([Ok(whole)]))
            }
        };
        Ok(Response { status: head.status, headers: head.headers, body })
    }

    async fn connect(&self, req: &Request<'_>) -> Result<TcpStream, S3Error> {
        let target = if has_port(req.authority) { req.authority.to_owned() } else { format!("{}:80", req.authority) };
        let conn = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&target))
            .await
            .map_err(|_| connection(req.endpoint, &format!("connect timed out after {:?}", self.connect_timeout)))?
            .map_err(|e| connection(req.endpoint, &format!("connect: {e}")))?;
        conn.set_nodelay(true).map_err(|e| connection(req.endpoint, &format!("TCP_NODELAY: {e}")))?;
        Ok(conn)
    }

    /// An idle connection to `authority` that can carry a request: not
    /// too old, and with nothing to read on it (a store that closed it, or
    /// sent bytes no request asked for, makes it unusable).
    fn take(&self, authority: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let conns = idle.get_mut(&crate::cores::current())?.get_mut(authority)?;
        while let Some((conn, since)) = conns.pop() {
            if since.elapsed() >= IDLE_FOR {
                continue;
            }
            let mut probe = [0u8; 1];
            let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
            if let Err(nix::errno::Errno::EAGAIN) = recv(conn.as_raw_fd(), &mut probe, peek) {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn`, opened or taken on runtime `core`, for that runtime.
    fn put(&self, core: usize, authority: &str, conn: TcpStream) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now_ms = self.born.elapsed().as_millis() as u64;
        if now_ms.saturating_sub(self.swept_ms.load(Relaxed)) >= IDLE_FOR.as_millis() as u64 {
            self.swept_ms.store(now_ms, Relaxed);
            sweep(&mut idle, Instant::now());
        }
        let per_core = idle.entry(core).or_default();
        let conns = match per_core.get_mut(authority) {
            Some(conns) => conns,
            None => per_core.entry(authority.to_owned()).or_default(),
        };
        conns.retain(|(_, since)| since.elapsed() < IDLE_FOR);
        if conns.len() < MAX_IDLE {
            conns.push((conn, Instant::now()));
        }
    }

    /// Drops every runtime's idle connections to `authority`.
    fn forget(&self, authority: &str) {
        for per_core in self.idle.lock().unwrap_or_else(|p| p.into_inner()).values_mut() {
            per_core.remove(authority);
        }
    }

    /// Idle connections held (tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().values().flat_map(HashMap::values).map(Vec::len).sum()
    }
}

/// Closes the idle connections older than [`IDLE_FOR`] at `now`, of every
/// runtime and store, and forgets stores left with none.
fn sweep(idle: &mut HashMap<usize, IdleByAuthority>, now: Instant) {
    for per_core in idle.values_mut() {
        per_core.retain(|_, conns| {
            conns.retain(|(_, since)| now.saturating_duration_since(*since) < IDLE_FOR);
            !conns.is_empty()
        });
    }
}

fn has_port(authority: &str) -> bool {
    match authority.rsplit_once(':') {
        // An IPv6 literal's colons are inside brackets.
        Some((host, port)) => !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !host.ends_with(':'),
        None => false,
    }
}

fn connection(endpoint: &str, what: &str) -> S3Error {
    S3Error::Connection { message: format!("{endpoint}: {what}"), attempts: 1 }
}

fn broken(endpoint: &str, what: &str) -> S3Error {
    S3Error::TransferFailed { message: format!("{endpoint}: {what}"), attempts: 1 }
}

/// How one exchange on a connection went wrong.
enum Exchange {
    /// Closed before a byte of the response: on a pooled connection, the
    /// store had closed it while idle.
    Closed,
    Failed(Failure),
}

/// A failure to name with the endpoint once known.
enum Failure {
    Io(std::io::Error),
    Protocol(String),
}

impl Failure {
    fn with_endpoint(self, endpoint: &str) -> S3Error {
        match self {
            Self::Io(e) => connection(endpoint, &e.to_string()),
            // As reqwest reported a reply it could not parse: the endpoint
            // is broken (retried elsewhere, counted against its health).
            Self::Protocol(m) => connection(endpoint, &m),
        }
    }
}

/// A parsed response head.
struct Head {
    status: http::StatusCode,
    headers: http::HeaderMap,
    keep_alive: bool,
}

enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

impl Head {
    fn framing(&self) -> Result<Framing, String> {
        // These never have a body, whatever the headers say (RFC 9112 6.3).
        if self.status == http::StatusCode::NO_CONTENT || self.status == http::StatusCode::NOT_MODIFIED {
            return Ok(Framing::Length(0));
        }
        // Every Transfer-Encoding header counts (codings listed over several
        // headers apply in turn), and only a body that is chunked alone can
        // be read: chunked then gzip, or a value that is not text, is not
        // one this client can frame. With Content-Length as well, the
        // framing is ambiguous (RFC 9112 6.3): refused, not guessed.
        let mut codings = Vec::new();
        for v in self.headers.get_all("transfer-encoding") {
            let v = v.to_str().map_err(|_| format!("a Transfer-Encoding that is not text: {v:?}"))?;
            codings.extend(v.split(',').map(str::trim).filter(|c| !c.is_empty()));
        }
        if !codings.is_empty() {
            if self.headers.contains_key("content-length") {
                return Err("both Transfer-Encoding and Content-Length".into());
            }
            return match codings[..] {
                [c] if c.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
                _ => Err(format!("unsupported Transfer-Encoding {:?}", codings.join(", "))),
            };
        }
        // Every Content-Length must say the same (else the framing is
        // ambiguous and bytes of one reply could be read as the next's).
        let mut length = None;
        for v in self.headers.get_all("content-length") {
            let n: u64 = v
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("bad Content-Length {v:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length headers".into());
            }
            length = Some(n);
        }
        Ok(length.map_or(Framing::UntilClose, Framing::Length))
    }
}

/// Writes the request head and reads the response head; the head and the
/// bytes read past it.
async fn exchange(conn: &mut TcpStream, request: &[u8]) -> Result<(Head, BytesMut), Exchange> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::UnexpectedEof => {
            Exchange::Closed
        }
        _ => Exchange::Failed(Failure::Io(e)),
    };
    conn.write_all(request).await.map_err(closed)?;
    let mut buf = BytesMut::with_capacity(16 << 10);
    loop {
        let n = match conn.read_buf(&mut buf).await {
            Ok(n) => n,
            // Part of an answer came: this is no idle connection closed.
            Err(e) if !buf.is_empty() => return Err(Exchange::Failed(Failure::Io(e))),
            Err(e) => return Err(closed(e)),
        };
        if n == 0 {
            return Err(if buf.is_empty() {
                Exchange::Closed
            } else {
                Exchange::Failed(Failure::Io(std::io::ErrorKind::UnexpectedEof.into()))
            });
        }
        if let Some((head, len)) = parse_head(&buf).map_err(|m| Exchange::Failed(Failure::Protocol(m)))? {
            buf.advance(len);
            return Ok((head, buf));
        }
        if buf.len() > MAX_HEAD {
            return Err(Exchange::Failed(Failure::Protocol(format!("a response head longer than {MAX_HEAD} bytes"))));
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 << 10);
        }
    }
}

/// The response head at the start of `buf` and its length, or `None` when
/// more bytes are needed. Interim (1xx) responses are skipped.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, String> {
    let mut start = 0;
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(&buf[start..]).map_err(|e| format!("a malformed response head: {e}"))? {
            httparse::Status::Partial => return Ok(None),
            httparse::Status::Complete(n) => n,
        };
        let code = resp.code.unwrap_or(0);
        if code == 101 {
            return Err("a switch of protocols (101) in answer to a GET".into());
        }
        if (100..200).contains(&code) {
            start += len;
            continue;
        }
        let status = http::StatusCode::from_u16(code).map_err(|_| format!("status {code}"))?;
        let mut headers = http::HeaderMap::with_capacity(resp.headers.len());
        let (mut close, mut keep) = (false, false);
        for h in resp.headers.iter() {
            let name =
                http::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| format!("header name {:?}", h.name))?;
            let value =
                http::HeaderValue::from_bytes(h.value).map_err(|_| format!("the value of header {}", h.name))?;
            if name == http::header::CONNECTION {
                for token in value.to_str().unwrap_or_default().split(',').map(str::trim) {
                    close |= token.eq_ignore_ascii_case("close");
                    keep |= token.eq_ignore_ascii_case("keep-alive");
                }
            }
            headers.append(name, value);
        }
        // HTTP/1.1 keeps the connection unless told to close; 1.0 only when asked.
        let keep_alive = !close && (resp.version == Some(1) || keep);
        return Ok(Some((Head { status, headers, keep_alive }, start + len)));
    }
}

/// A body read from the connection, `Content-Length` framed.
struct Socket {
    pool: Arc<Http1>,
    /// The runtime whose pool the connection goes back to.
    core: usize,
    authority: String,
    endpoint: String,
    /// `None` once the body is read (the connection went back to the pool).
    conn: Option<TcpStream>,
    /// Body bytes that came with the head.
    buffered: Bytes,
    /// Body bytes not yet taken, `buffered` included.
    remaining: u64,
    keep_alive: bool,
}

impl Socket {
    /// The body is read to its end: the connection can carry another GET.
    fn release(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.keep_alive && self.buffered.is_empty() {
                self.pool.put(self.core, &self.authority, conn);
            }
        }
    }

    fn taken(&mut self, n: u64) {
        self.remaining -= n;
        if self.remaining == 0 {
            self.release();
        }
    }

    fn conn(&self) -> Result<&TcpStream, S3Error> {
        self.conn.as_ref().ok_or_else(|| broken(&self.endpoint, "the body was already read"))
    }

    fn ended_early(&self) -> S3Error {
        broken(&self.endpoint, &format!("the connection closed with {} body bytes still to come", self.remaining))
    }

    /// Waits until the socket has bytes (or an error), at most the read timeout.
    async fn readable(&self) -> Result<(), S3Error> {
        let wait = self.pool.read_timeout;
        match tokio::time::timeout(wait, self.conn()?.readable()).await {
            Ok(r) => r.map_err(|e| broken(&self.endpoint, &e.to_string())),
            Err(_) => Err(deadline_error(&self.endpoint, "in a body; [s3] read_timeout_ms", wait)),
        }
    }

    /// Up to `max` bytes into a new buffer.
    async fn read_chunk(&mut self, max: usize) -> Result<Bytes, S3Error> {
        let mut buf = BytesMut::with_capacity(max);
        loop {
            self.readable().await?;
            match self.conn()?.try_read_buf(&mut buf) {
                Ok(0) => return Err(self.ended_early()),
                Ok(_) => return Ok(buf.freeze()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(broken(&self.endpoint, &e.to_string())),
            }
        }
    }

    /// A chunked or close-delimited body, read whole: at most `cap` bytes
    /// of it (an error reply's text, a data reply's asked-for span); past
    /// that the rest is left unread and the connection dropped.
    async fn read_whole(&mut self, framing: Framing, cap: usize) -> Result<Bytes, S3Error> {
        let chunked = matches!(framing, Framing::Chunked);
        let mut raw = BytesMut::from(&self.buffered[..]);
        self.buffered = Bytes::new();
        let mut out = BytesMut::new();
        loop {
            if chunked && dechunk(&mut raw, &mut out).map_err(|m| broken(&self.endpoint, &m))? {
                if raw.is_empty() {
                    self.remaining = 0;
                    self.release();
                } else {
                    self.conn = None;
                }
                return Ok(out.freeze());
            }
            let held = if chunked { out.len() } else { raw.len() };
            if held >= cap || raw.len() > cap.saturating_add(64 << 10) {
                self.conn = None;
                let mut whole = if chunked { out } else { raw };
                whole.truncate(cap);
                return Ok(whole.freeze());
            }
            self.readable().await?;
            match self.conn()?.try_read_buf(&mut raw) {
                Ok(0) if !chunked => {
                    self.conn = None;
                    raw.truncate(cap);
                    return Ok(raw.freeze());
                }
                Ok(0) => return Err(broken(&self.endpoint, "the connection closed inside a chunked body")),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(broken(&self.endpoint, &e.to_string())),
            }
            if raw.capacity() - raw.len() < 4096 {
                raw.reserve(16 << 10);
            }
        }
    }
}

/// Most bytes of trailers after a chunked body's last chunk.
const MAX_TRAILERS: usize = 8 << 10;

/// Moves the complete chunks at the start of `raw` into `out`; `true` once
/// the last chunk (and the trailers) are through.
fn dechunk(raw: &mut BytesMut, out: &mut BytesMut) -> Result<bool, String> {
    loop {
        let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") else {
            return if raw.len() > 1024 { Err("a chunk size line longer than 1 KiB".into()) } else { Ok(false) };
        };
        let line = std::str::from_utf8(&raw[..eol]).map_err(|_| "a chunk size that is not text".to_owned())?;
        let hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| format!("chunk size {hex:?}"))?;
        if size == 0 {
            // Trailers, then an empty line; at most MAX_TRAILERS of them,
            // so a store dripping trailer bytes costs a bounded scan per
            // read, not one over all it sent.
            let Some(end) = raw[eol..].windows(4).position(|w| w == b"\r\n\r\n") else {
                return if raw.len() - eol > MAX_TRAILERS {
                    Err(format!("chunked trailers longer than {MAX_TRAILERS} bytes"))
                } else {
                    Ok(false)
                };
            };
            raw.advance(eol + end + 4);
            return Ok(true);
        }
        let need = (eol + 4).checked_add(size).ok_or_else(|| format!("chunk size {hex:?}"))?;
        if raw.len() < need {
            return Ok(false);
        }
        if &raw[need - 2..need] != b"\r\n" {
            return Err("a chunk not followed by CRLF".into());
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw.advance(need);
    }
}

impl BodySource for Socket {
    fn next_chunk(&mut self) -> BoxFuture<'_, Option<Result<Bytes, S3Error>>> {
        Box::pin(async move {
            if self.remaining == 0 {
                return None;
            }
            if !self.buffered.is_empty() {
                let take = (self.buffered.len() as u64).min(self.remaining) as usize;
                let chunk = self.buffered.split_to(take);
                self.taken(take as u64);
                return Some(Ok(chunk));
            }
            let chunk = match self.read_chunk(self.remaining.min(256 << 10) as usize).await {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            self.taken(chunk.len() as u64);
            Some(Ok(chunk))
        })
    }

    fn read_into<'a>(&'a mut self, to: Landing<'a>) -> BoxFuture<'a, Result<u64, S3Error>> {
        Box::pin(async move {
            let want = to.max.min(self.remaining);
            if want == 0 {
                return Ok(0);
            }
            let dest = |e: sluice_dataplane::MemError| S3Error::Destination(e.to_string());
            if !self.buffered.is_empty() {
                let bytes = self.buffered.split_to((self.buffered.len() as u64).min(want) as usize);
                to.region.write_at(to.dst, &bytes).map_err(dest)?;
                to.digest.update(&bytes);
                self.taken(bytes.len() as u64);
                return Ok(bytes.len() as u64);
            }
            if !to.region.is_mapped() {
                // Memory reached by DMA: land a copy, checksummed here.
                let chunk = self.read_chunk(want.min(256 << 10) as usize).await?;
                to.region.write_at(to.dst, &chunk).map_err(dest)?;
                to.digest.update(&chunk);
                self.taken(chunk.len() as u64);
                return Ok(chunk.len() as u64);
            }
            to.region.check(to.dst, want).map_err(dest)?;
            let n = loop {
                self.readable().await?;
                let conn = self.conn()?;
                let read = conn.try_io(Interest::READABLE, || {
                    to.region.read_from_fd(to.dst, want.min(MAX_READ) as usize, conn.as_fd())
                });
                match read {
                    Ok(0) => return Err(self.ended_early()),
                    Ok(n) => break n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(broken(&self.endpoint, &e.to_string())),
                }
            };
            to.region.crc64nvme_update(to.digest, to.dst, n).map_err(dest)?;
            self.taken(n);
            Ok(n)
        })
    }
}

#[cfg(test)]
#[path = "http1_tests.rs"]
mod tests;
