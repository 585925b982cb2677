//! The remote side of the verbs transports (the storage gateway): RDMA
//! WRITE (GET) and READ (PUT) against descriptors, through 4 MiB registered
//! bounce buffers. Two flavours share the streaming code: `verbs-rc` (a
//! cached rdma_cm connection per owner) and mlx5 DC (one DC initiator,
//! an address handle per target built from the standard token).

use std::net::SocketAddrV4;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sluice_rdma::dc::DcAddress;
use sluice_rdma::dci::{AddressHandle, DcInitiator, DcPeer};
use sluice_rdma::{Access as MrAccess, Buffer, MemoryRegion, PostResult, ProtectionDomain, QueuePair};

use super::rdma_err;
use crate::peer_cache::{CacheError, PeerCache};
use crate::token::Token;
use crate::transport::TransportError;

/// Bounce-buffer size (one WRITE/READ each).
const CHUNK: usize = 4 << 20;

/// Most owners connected at once (each an RC queue pair or a DC address
/// handle, with its registered bounce buffers).
const MAX_PEERS: usize = 256;

/// An owner no transfer used for this long is let go, with its buffers.
const PEER_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// How this side reaches owners.
enum Mode {
    /// rdma_cm connections to the owner's listener (token LID = its port,
    /// GID = its IPv4 address).
    Rc,
    /// One DCI for every DC target; the token names the target.
    Dc { dci: Arc<DcInitiator>, port: u8, sgid_index: u8 },
}

/// Which owner a descriptor points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    Rc(SocketAddrV4),
    Dc { lid: u16, dct_number: u32, gid: Option<[u8; 16]> },
}

/// One owner as reached from here.
enum Link {
    Rc(QueuePair),
    Dc { dci: Arc<DcInitiator>, peer: DcPeer },
}

impl Link {
    fn pd(&self) -> &Arc<ProtectionDomain> {
        match self {
            Self::Rc(qp) => qp.pd(),
            Self::Dc { dci, .. } => dci.pd(),
        }
    }

    async fn write(&self, mr: Arc<MemoryRegion>, len: u32, remote: u64, rkey: u32) -> PostResult {
        match self {
            Self::Rc(qp) => qp.write(mr, 0, len, remote, rkey).await,
            Self::Dc { dci, peer } => dci.write(peer, mr, 0, len, remote, rkey).await,
        }
    }

    async fn read(&self, mr: Arc<MemoryRegion>, len: u32, remote: u64, rkey: u32) -> PostResult {
        match self {
            Self::Rc(qp) => qp.read(mr, 0, len, remote, rkey).await,
            Self::Dc { dci, peer } => dci.read(peer, mr, 0, len, remote, rkey).await,
        }
    }
}

struct Conn {
    link: Link,
    /// Registered bounce buffers for this connection's PD.
    pool: Mutex<Vec<(Arc<Buffer>, Arc<MemoryRegion>)>>,
}

/// The remote side (the storage gateway): WRITE/READ against descriptors.
#[derive(Clone)]
pub struct VerbsRemote {
    mode: Arc<Mode>,
    conns: Arc<PeerCache<PeerKey, Conn>>,
}

impl Default for VerbsRemote {
    fn default() -> Self {
        Self::new()
    }
}

/// The RC owner a `verbs-rc` descriptor names (its IP in the GID, its
/// rdma_cm port in the LID field).
fn rc_owner(token: &Token) -> Result<SocketAddrV4, TransportError> {
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
        let mr = MemoryRegion::register(self.link.pd(), buf.clone(), MrAccess::LOCAL).map_err(rdma_err)?;
        Ok((buf, mr))
    }
    fn give(&self, b: (Arc<Buffer>, Arc<MemoryRegion>)) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(b);
    }
}

impl VerbsRemote {
    /// Serves `verbs-rc` descriptors.
    pub fn new() -> Self {
        Self { mode: Arc::new(Mode::Rc), conns: Arc::new(PeerCache::new(MAX_PEERS, PEER_IDLE)) }
    }

    /// Serves standard (mlx5 DC) descriptors through `dci`, reaching
    /// targets from local `port` with source GID `sgid_index`.
    pub fn dc(dci: Arc<DcInitiator>, port: u8, sgid_index: u8) -> Self {
        Self {
            mode: Arc::new(Mode::Dc { dci, port, sgid_index }),
            conns: Arc::new(PeerCache::new(MAX_PEERS, PEER_IDLE)),
        }
    }

    fn peer_key(&self, token: &Token) -> Result<PeerKey, TransportError> {
        match &*self.mode {
            Mode::Rc => rc_owner(token).map(PeerKey::Rc),
            Mode::Dc { .. } => Ok(PeerKey::Dc { lid: token.lid, dct_number: token.dct, gid: token.gid }),
        }
    }

    async fn conn(&self, key: PeerKey) -> Result<Arc<Conn>, TransportError> {
        let connect = || async {
            let link = match (&*self.mode, key) {
                (Mode::Rc, PeerKey::Rc(addr)) => Link::Rc(QueuePair::connect(addr).await.map_err(rdma_err)?),
                (Mode::Dc { dci, port, sgid_index }, PeerKey::Dc { lid, dct_number, gid }) => {
                    let at = DcAddress { dct_number, lid, gid };
                    let ah = AddressHandle::create(dci.pd(), &at, *port, *sgid_index).map_err(rdma_err)?;
                    Link::Dc { dci: dci.clone(), peer: DcPeer { ah, dct_number } }
                }
                _ => return Err(TransportError::Protocol("descriptor does not match this transport".into())),
            };
            Ok(Conn { link, pool: Mutex::default() })
        };
        self.conns.get_or_connect(&key, connect).await.map_err(|e| match e {
            CacheError::Connect(e) => e,
            CacheError::Full(n) => TransportError::Io(std::io::Error::other(format!(
                "{n} memory owners are connected and all in use; try again later"
            ))),
        })
    }

    /// A broken RC connection is dropped so the next request reconnects; a
    /// DCI in the error state is reset (the target's address stays cached).
    async fn forget(&self, key: PeerKey) {
        match &*self.mode {
            Mode::Rc => {
                self.conns.remove(&key);
            }
            Mode::Dc { dci, .. } => {
                if let Err(e) = dci.recover() {
                    tracing::error!(error = %e, "cannot recover the DC initiator");
                }
            }
        }
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
        let key = self.peer_key(token)?;
        let conn = self.conn(key).await?;
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
            mr = match conn.link.write(mr, want as u32, token.addr + done, token.rkey).await {
                Ok(m) => m,
                Err((e, _)) => {
                    self.forget(key).await;
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
        let f = file.try_clone().map_err(TransportError::Io)?;
        let stream = crate::file::span_stream(f, file_offset, len, CHUNK);
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
                let key = this.peer_key(&token)?;
                let conn = this.conn(key).await?;
                let (buf, mr) = conn.take()?;
                let n = (len - done).min(CHUNK as u64) as usize;
                let mr = match conn.link.read(mr, n as u32, token.addr + done, token.rkey).await {
                    Ok(m) => m,
                    Err((e, _)) => {
                        this.forget(key).await;
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
