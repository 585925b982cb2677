//! The verbs RC transport: real one-sided RDMA WRITE/READ over reliable
//! connections set up with rdma_cm (Soft-RoCE or any RoCE/IB NIC).
//!
//! Owner: listens with rdma_cm on the device's IP and, per exposure,
//! registers a memory region over exactly the window: its rkey is the
//! capability (the NIC refuses anything outside the window or with another
//! key) and deregistering it when the request ends revokes it.
//!
//! Descriptor: the standard format with addr/size = the window, rkey = the
//! window's MR, LID = the owner's rdma_cm port, GID = the owner's IP
//! (IPv4-mapped). It is sent only to endpoints configured for `verbs-rc`,
//! marked `x-sluice-rdma-transport: verbs-rc`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sluice_rdma::{Access as MrAccess, Buffer, Listener, MemoryRegion, QueuePair, RdmaError};

use crate::capability::{Access, Grant};
use crate::token::Token;
use crate::transport::{
    Capabilities, Exposure, Transport, TransportError, TransportKind, MAX_OP_BYTES, MAX_WINDOW_BYTES,
};

/// Bounce-buffer size on the remote side (one WRITE/READ each).
const CHUNK: usize = 4 << 20;

fn rdma_err(e: RdmaError) -> TransportError {
    match e {
        RdmaError::Completion { .. } => TransportError::Rejected(e.to_string()),
        other => TransportError::Unsupported(other.to_string()),
    }
}

/// The owner side.
pub struct VerbsOwner {
    listener: Arc<Listener>,
    ip: Ipv4Addr,
    /// Accepted connections, kept while remotes may use them.
    conns: Arc<Mutex<Vec<QueuePair>>>,
}

impl VerbsOwner {
    /// Listens on `ip` (the address of an RDMA device) and accepts remotes
    /// in the background (needs a tokio runtime).
    pub fn bind(ip: Ipv4Addr) -> Result<Arc<Self>, TransportError> {
        let listener = Arc::new(Listener::bind(SocketAddrV4::new(ip, 0)).map_err(rdma_err)?);
        let conns: Arc<Mutex<Vec<QueuePair>>> = Arc::default();
        let (l, c) = (listener.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok(qp) => c.lock().unwrap_or_else(|p| p.into_inner()).push(qp),
                    Err(e) => {
                        tracing::warn!(error = %e, "verbs accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok(Arc::new(Self { listener, ip, conns }))
    }

    pub fn port(&self) -> u16 {
        self.listener.port()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Transport for VerbsOwner {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: TransportKind::VerbsRc,
            standard_token: false,
            max_op_bytes: MAX_OP_BYTES,
            max_window_bytes: MAX_WINDOW_BYTES,
        }
    }

    fn expose(&self, grant: Grant) -> Result<Exposure, TransportError> {
        if grant.len == 0 || grant.len > MAX_WINDOW_BYTES {
            return Err(TransportError::WindowTooLarge(grant.len));
        }
        grant.memory.check(grant.offset, grant.len).map_err(|e| TransportError::Rejected(e.to_string()))?;
        let pinned = grant
            .memory
            .pinned()
            .ok_or_else(|| TransportError::Unsupported("this memory cannot be registered with the NIC".into()))?;
        let access = match grant.access {
            Access::RemoteWrite => MrAccess::REMOTE_WRITE,
            Access::RemoteRead => MrAccess::REMOTE_READ,
        };
        let mr =
            MemoryRegion::register_range(self.listener.pd(), pinned, grant.offset as usize, grant.len as usize, access)
                .map_err(rdma_err)?;
        let gid = self.ip.to_ipv6_mapped().octets();
        let token = Token::new(mr.addr(), grant.len as u32, mr.rkey(), self.port(), 0, Some(gid))
            .map_err(|e| TransportError::Protocol(e.to_string()))?;
        Ok(Exposure { token, guard: Box::new(mr) })
    }
}

struct Conn {
    qp: QueuePair,
    /// Registered bounce buffers for this connection's PD.
    pool: Mutex<Vec<(Arc<Buffer>, Arc<MemoryRegion>)>>,
}

/// The remote side (the storage gateway): WRITE/READ against descriptors.
#[derive(Clone, Default)]
pub struct VerbsRemote {
    conns: Arc<tokio::sync::Mutex<HashMap<SocketAddrV4, Arc<Conn>>>>,
}

fn owner(token: &Token) -> Result<SocketAddrV4, TransportError> {
    let gid = std::net::Ipv6Addr::from(
        token.gid.ok_or_else(|| TransportError::Protocol("verbs descriptor without a GID".into()))?,
    );
    let ip =
        gid.to_ipv4_mapped().ok_or_else(|| TransportError::Protocol("verbs-rc needs an IPv4-mapped GID".into()))?;
    Ok(SocketAddrV4::new(ip, token.lid))
}

impl Conn {
    fn take(&self) -> Result<(Arc<Buffer>, Arc<MemoryRegion>), TransportError> {
        if let Some(b) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(b);
        }
        let buf = Buffer::zeroed(CHUNK);
        let mr = MemoryRegion::register(self.qp.pd(), buf.clone(), MrAccess::LOCAL).map_err(rdma_err)?;
        Ok((buf, mr))
    }
    fn give(&self, b: (Arc<Buffer>, Arc<MemoryRegion>)) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(b);
    }
}

impl VerbsRemote {
    pub fn new() -> Self {
        Self::default()
    }

    async fn conn(&self, addr: SocketAddrV4) -> Result<Arc<Conn>, TransportError> {
        let mut conns = self.conns.lock().await;
        if let Some(c) = conns.get(&addr) {
            return Ok(c.clone());
        }
        let qp = QueuePair::connect(addr).await.map_err(rdma_err)?;
        let c = Arc::new(Conn { qp, pool: Mutex::default() });
        conns.insert(addr, c.clone());
        Ok(c)
    }

    /// A broken connection is dropped so the next request reconnects.
    async fn forget(&self, addr: SocketAddrV4) {
        self.conns.lock().await.remove(&addr);
    }

    /// WRITEs `len` bytes from `body` into the descriptor's window.
    pub async fn write_stream<S, E>(&self, token: &Token, len: u64, mut body: S) -> Result<u64, TransportError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if len > token.size {
            return Err(TransportError::Rejected(format!("{len} bytes do not fit the {}-byte window", token.size)));
        }
        let addr = owner(token)?;
        let conn = self.conn(addr).await?;
        let (buf, mut mr) = conn.take()?;
        let mut pending = Bytes::new();
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(CHUNK as u64) as usize;
            let mut fill = 0usize;
            while fill < want {
                if pending.is_empty() {
                    pending = match body.next().await {
                        Some(Ok(b)) => b,
                        Some(Err(e)) => return Err(TransportError::Protocol(format!("source failed: {e}"))),
                        None => {
                            return Err(TransportError::Protocol(format!(
                                "source ended after {} of {len} bytes",
                                done + fill as u64
                            )))
                        }
                    };
                }
                let take = pending.len().min(want - fill);
                buf.write_at(fill, &pending.split_to(take)).map_err(rdma_err)?;
                fill += take;
            }
            mr = match conn.qp.write(mr, 0, want as u32, token.addr + done, token.rkey).await {
                Ok(m) => m,
                Err((e, _)) => {
                    self.forget(addr).await;
                    return Err(rdma_err(e));
                }
            };
            done += want as u64;
        }
        conn.give((buf, mr));
        Ok(done)
    }

    /// WRITEs `len` bytes of `file` from `file_offset`.
    pub async fn write_file(
        &self,
        token: &Token,
        file: &std::fs::File,
        file_offset: u64,
        len: u64,
    ) -> Result<u64, TransportError> {
        let f = Arc::new(file.try_clone().map_err(TransportError::Io)?);
        let stream = futures::stream::try_unfold((f, file_offset, len), |(f, pos, left)| async move {
            if left == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            let n = left.min(CHUNK as u64) as usize;
            let f2 = f.clone();
            let b = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut b = vec![0u8; n];
                f2.read_exact_at(&mut b, pos).map(|()| b)
            })
            .await
            .map_err(std::io::Error::other)??;
            Ok(Some((Bytes::from(b), (f, pos + n as u64, left - n as u64))))
        });
        self.write_stream(token, len, Box::pin(stream)).await
    }

    /// READs `len` bytes from the descriptor's window as a stream of chunks.
    pub fn read_stream(
        &self,
        token: &Token,
        len: u64,
    ) -> impl Stream<Item = Result<Bytes, TransportError>> + Send + Sync + 'static {
        let this = self.clone();
        let token = *token;
        futures::stream::try_unfold(0u64, move |done| {
            let this = this.clone();
            async move {
                if done >= len {
                    return Ok(None);
                }
                if len > token.size {
                    return Err(TransportError::Rejected(format!(
                        "{len} bytes do not fit the {}-byte window",
                        token.size
                    )));
                }
                let addr = owner(&token)?;
                let conn = this.conn(addr).await?;
                let (buf, mr) = conn.take()?;
                let n = (len - done).min(CHUNK as u64) as usize;
                let mr = match conn.qp.read(mr, 0, n as u32, token.addr + done, token.rkey).await {
                    Ok(m) => m,
                    Err((e, _)) => {
                        this.forget(addr).await;
                        return Err(rdma_err(e));
                    }
                };
                let mut out = vec![0u8; n];
                buf.read_at(0, &mut out).map_err(rdma_err)?;
                conn.give((buf, mr));
                Ok(Some((Bytes::from(out), done + n as u64)))
            }
        })
    }
}
