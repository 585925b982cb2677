//! The shim's connection to the agent: a gRPC channel (TCP or Unix socket)
//! and, in co-located mode, the memory socket that region fds travel over.

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use sluice_proto::agent::agent_client::AgentClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::{AgentLink as LinkConfig, AgentTlsPem};
use crate::error::{ShimError, StartupError};
use crate::link_kind::LinkKind;

/// Longest one memfd hand-over may take (the agent answers at once), from
/// when it has a memory-socket connection to itself.
const HAND_OVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Memory-socket connections kept, each carrying one exchange at a time:
/// a slow exchange holds up only the hand-overs behind it on its own.
const MEMORY_LANES: usize = 4;
/// Longest a hand-over waits for a memory-socket connection to itself.
/// Not part of its own deadline: after an agent restart every session
/// registers its regions again at once, and one tenant with many must not
/// make another's hand-overs miss theirs (their regions were lost).
const LANE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Channel settings for either address kind: connecting is bounded, and
/// HTTP/2 pings notice an agent that vanished without closing the
/// connection (calls then fail fast and the next one reconnects).
fn endpoint(e: Endpoint) -> Endpoint {
    e.connect_timeout(std::time::Duration::from_secs(5))
        .http2_keep_alive_interval(std::time::Duration::from_secs(10))
        .keep_alive_timeout(std::time::Duration::from_secs(20))
        .keep_alive_while_idle(true)
}

/// Mutual TLS to the agent: its certificate checked against `ca`, ours
/// presented.
fn client_tls(pem: &AgentTlsPem) -> ClientTlsConfig {
    let c = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pem.ca))
        .identity(Identity::from_pem(&pem.cert, &pem.key));
    match &pem.files.server_name {
        Some(name) => c.domain_name(name.clone()),
        None => c,
    }
}

/// Shared by all client connections of one shim.
pub struct AgentLink {
    /// `[agent] connections` channels, each its own HTTP/2 connection,
    /// calls dealt round robin over them: an agent with per-core runtimes
    /// serves each connection on one core, and on its shared runtime
    /// several connections still spread the replies over more tasks.
    channels: Vec<AgentClient<Channel>>,
    next: std::sync::atomic::AtomicUsize,
    memory_socket: PathBuf,
    /// Where framed GETs go: the agent's address, as the channels'; none
    /// with `framed_gets = false`.
    framed: Option<Arc<crate::framed_link::Target>>,
    /// Memory-socket connections ([`MEMORY_LANES`]), each reused, each
    /// carrying one exchange at a time.
    memory: Vec<Mutex<Option<BufReader<UnixStream>>>>,
    next_lane: std::sync::atomic::AtomicUsize,
}

impl AgentLink {
    /// Builds the channel. Connection happens lazily, so the shim can start
    /// before the agent; calls fail with `AgentUnavailable` until it is up.
    pub fn new(cfg: &LinkConfig) -> Result<Self, StartupError> {
        // Two TLS crypto providers are linked in; rustls will not guess.
        // (Err: one is installed already.)
        let _ = rustls::crypto::ring::default_provider().install_default();
        let connections = cfg.connections.max(1);
        let (channels, framed) = if let Some(path) = cfg.grpc.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            let framed = cfg.framed_gets.then(|| crate::framed_link::Target::Unix(path.clone()));
            let channels = (0..connections)
                .map(|_| {
                    let path = path.clone();
                    // The URI is ignored by the connector; tonic needs a valid one.
                    endpoint(Endpoint::from_static("http://agent.local")).connect_with_connector_lazy(
                        tower::service_fn(move |_| {
                            let path = path.clone();
                            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
                        }),
                    )
                })
                .map(AgentClient::new)
                .collect();
            (channels, framed)
        } else {
            let address_err = |source| StartupError::AgentAddress { address: cfg.grpc.clone(), source };
            let mut e = endpoint(Endpoint::from_shared(cfg.grpc.clone()).map_err(address_err)?).tcp_nodelay(true);
            let pem = match &cfg.tls {
                Some(tls) => Some(tls.read().map_err(|e| StartupError::Tls(e.to_string()))?),
                None => None,
            };
            // Checks the TLS files (named in its errors) before tonic takes them.
            let target = crate::framed_link::Target::tcp(e.uri(), pem.as_ref())?;
            if let Some(pem) = &pem {
                e = e.tls_config(client_tls(pem)).map_err(address_err)?;
                LinkKind::Tls.remember();
            } else {
                LinkKind::Plaintext.remember();
            }
            let framed = cfg.framed_gets.then_some(target);
            ((0..connections).map(|_| AgentClient::new(e.connect_lazy())).collect(), framed)
        };
        Ok(Self {
            channels,
            next: std::sync::atomic::AtomicUsize::new(0),
            memory_socket: cfg.memory_socket.clone(),
            framed: framed.map(Arc::new),
            memory: (0..MEMORY_LANES).map(|_| Mutex::new(None)).collect(),
            next_lane: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Opens every connection now (a cheap call on each), so the shim's
    /// descriptors and the agent's are settled before clients come instead
    /// of growing with their first calls. Gives up after `within`, or at
    /// once for an agent that is not up: those connect on first use.
    pub async fn warm(&self, within: std::time::Duration) {
        let calls = self.channels.iter().map(|c| {
            let mut c = c.clone();
            async move { c.get_epoch(sluice_proto::agent::GetEpochRequest {}).await.is_ok() }
        });
        match tokio::time::timeout(within, futures::future::join_all(calls)).await {
            Ok(up) => tracing::debug!(connected = up.iter().filter(|ok| **ok).count(), of = up.len(), "agent link"),
            Err(_) => tracing::debug!("agent link: connections not all open; they open on first use"),
        }
    }

    /// Where framed GETs go (the agent's address), if they do.
    pub fn framed_target(&self) -> Option<Arc<crate::framed_link::Target>> {
        self.framed.clone()
    }

    /// A client for each connection (the readiness check).
    pub fn every_channel(&self) -> Vec<AgentClient<Channel>> {
        self.channels.clone()
    }

    /// A client for the next call: the channels in turn.
    pub fn grpc(&self) -> AgentClient<Channel> {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    /// Hands `fd` to the agent and returns the ticket that redeems it.
    pub async fn hand_over(&self, fd: BorrowedFd<'_>) -> Result<String, ShimError> {
        self.hand_over_frame(b"R", fd).await
    }

    /// Hands a GPU region's dma-buf to a co-located agent (which registers
    /// it with its RDMA NIC); returns the ticket.
    pub async fn hand_over_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        region: sluice_shm::DmabufHandOver,
    ) -> Result<String, ShimError> {
        self.hand_over_frame(&region.encode(), fd).await
    }

    async fn hand_over_frame(&self, frame: &[u8], fd: BorrowedFd<'_>) -> Result<String, ShimError> {
        let mut lane = self.lane().await?;
        tokio::time::timeout(HAND_OVER_TIMEOUT, self.hand_over_now(&mut lane, frame, fd)).await.map_err(|_| {
            ShimError::AgentUnavailable(format!("the agent's memory socket did not answer in {HAND_OVER_TIMEOUT:?}"))
        })?
    }

    /// A memory-socket connection to this caller alone: a free one, else
    /// the next in turn once it is free.
    async fn lane(&self) -> Result<tokio::sync::MutexGuard<'_, Option<BufReader<UnixStream>>>, ShimError> {
        if let Some(free) = self.memory.iter().find_map(|m| m.try_lock().ok()) {
            return Ok(free);
        }
        let i = self.next_lane.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.memory.len();
        tokio::time::timeout(LANE_WAIT, self.memory[i].lock()).await.map_err(|_| {
            ShimError::AgentUnavailable(format!("every memory-socket connection stayed busy for {LANE_WAIT:?}"))
        })
    }

    async fn hand_over_now(
        &self,
        guard: &mut Option<BufReader<UnixStream>>,
        frame: &[u8],
        fd: BorrowedFd<'_>,
    ) -> Result<String, ShimError> {
        // One retry with a fresh connection covers an agent restart.
        for attempt in 0..2 {
            if guard.is_none() {
                let s = UnixStream::connect(&self.memory_socket).await.map_err(|e| {
                    ShimError::AgentUnavailable(format!("memory socket {}: {e}", self.memory_socket.display()))
                })?;
                *guard = Some(BufReader::new(s));
            }
            // Out of the slot while the exchange runs, back only once it is
            // whole: an exchange cut short (this call's timeout, or the
            // caller's request dropped) would leave the agent's answer on
            // the connection, and the next caller, of any tenant, would
            // read it as its own ticket and redeem this caller's memory.
            // Dropped instead, the connection closes; the ticket nobody
            // read expires unredeemed at the agent.
            let Some(mut conn) = guard.take() else { continue };
            let mut line = String::new();
            let res = async {
                sluice_shm::send_with_fds(conn.get_ref(), frame, &[fd]).await?;
                conn.read_line(&mut line).await
            }
            .await;
            match res {
                Ok(n) if n > 0 && line.ends_with('\n') => {
                    *guard = Some(conn);
                    let line = line.trim_end();
                    return match line.strip_prefix("OK ") {
                        Some(t) => Ok(t.to_owned()),
                        None => Err(ShimError::AgentUnavailable(format!("agent refused the region: {line}"))),
                    };
                }
                // A connection that ended (or ended mid-line) is dropped:
                // once more on a fresh one.
                _ if attempt == 0 => {}
                Ok(_) => break,
                Err(e) => return Err(ShimError::AgentUnavailable(format!("memory socket: {e}"))),
            }
        }
        *guard = None;
        Err(ShimError::AgentUnavailable("memory socket closed by the agent".into()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test's panic is its failure report
    use super::*;
    use std::os::fd::AsFd;
    use tokio::io::AsyncWriteExt;

    /// A memory socket that answers each descriptor with its own ticket,
    /// the first one late (an agent busy for a while).
    async fn slow_first_memory_socket(listener: tokio::net::UnixListener) {
        let mut n = 0;
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            loop {
                let mut buf = [0u8; 64];
                let mut fds = Vec::new();
                match sluice_shm::recv_with_fds(&s, &mut buf, &mut fds).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                n += 1;
                if n == 1 {
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                if s.write_all(format!("OK ticket-{n}\n").as_bytes()).await.is_err() {
                    break;
                }
            }
        }
    }

    /// A hand-over cut short (its caller gave up) must not leave the
    /// agent's answer for the next caller to take as its own ticket: that
    /// ticket would redeem the first caller's memory.
    #[tokio::test]
    async fn a_hand_over_cut_short_never_gives_its_ticket_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("mem.sock");
        tokio::spawn(slow_first_memory_socket(tokio::net::UnixListener::bind(&sock).unwrap()));
        let mut cfg: crate::config::AgentLink = toml::from_str("grpc = \"unix:/nonexistent\"").unwrap();
        cfg.memory_socket = sock;
        let link = AgentLink::new(&cfg).unwrap();
        let first = sluice_shm::create_memfd("first", 4096).unwrap();
        let second = sluice_shm::create_memfd("second", 4096).unwrap();
        // The first caller gives up before the agent answers.
        let cut = tokio::time::timeout(std::time::Duration::from_millis(50), link.hand_over(first.as_fd())).await;
        assert!(cut.is_err(), "the first hand-over should still be waiting");
        // Long after the agent answered it, the next caller gets its own.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let ticket = link.hand_over(second.as_fd()).await.unwrap();
        assert_eq!(ticket, "ticket-2", "the second caller took the first one's ticket");
        // And the connection is reused once an exchange completed.
        let third = sluice_shm::create_memfd("third", 4096).unwrap();
        assert_eq!(link.hand_over(third.as_fd()).await.unwrap(), "ticket-3");
    }

    /// A memory socket serving each connection in a task of its own, that
    /// answers a descriptor after `slow` if it is the first it sees.
    async fn concurrent_memory_socket(listener: tokio::net::UnixListener, slow: std::time::Duration) {
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    let mut buf = [0u8; 64];
                    let mut fds = Vec::new();
                    match sluice_shm::recv_with_fds(&s, &mut buf, &mut fds).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    if n == 1 {
                        tokio::time::sleep(slow).await;
                    }
                    if s.write_all(format!("OK ticket-{n}\n").as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    }

    /// One slow hand-over (a busy agent, a large export) holds up only its
    /// own memory-socket connection: another caller's, of any tenant,
    /// goes over another and is answered at once.
    #[tokio::test]
    async fn a_slow_hand_over_holds_up_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("mem.sock");
        let slow = std::time::Duration::from_secs(3);
        tokio::spawn(concurrent_memory_socket(tokio::net::UnixListener::bind(&sock).unwrap(), slow));
        let mut cfg: crate::config::AgentLink = toml::from_str("grpc = \"unix:/nonexistent\"").unwrap();
        cfg.memory_socket = sock;
        let link = Arc::new(AgentLink::new(&cfg).unwrap());
        let first = {
            let link = link.clone();
            tokio::spawn(async move {
                let fd = sluice_shm::create_memfd("first", 4096).unwrap();
                link.hand_over(fd.as_fd()).await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let t0 = std::time::Instant::now();
        let second = sluice_shm::create_memfd("second", 4096).unwrap();
        assert_eq!(link.hand_over(second.as_fd()).await.unwrap(), "ticket-2");
        assert!(t0.elapsed() < std::time::Duration::from_secs(1), "waited {:?} behind the slow one", t0.elapsed());
        assert_eq!(first.await.unwrap().unwrap(), "ticket-1");
    }
}
