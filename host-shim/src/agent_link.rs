//! The shim's connection to the agent: a gRPC channel (TCP or Unix socket)
//! and, in co-located mode, the memory socket that region fds travel over.

use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use sluice_proto::agent::agent_client::AgentClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::config::AgentLink as LinkConfig;
use crate::error::ShimError;

/// Longest one memfd hand-over may take (the agent answers at once).
const HAND_OVER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Channel settings for either address kind: connecting is bounded, and
/// HTTP/2 pings notice an agent that vanished without closing the
/// connection (calls then fail fast and the next one reconnects).
fn endpoint(e: Endpoint) -> Endpoint {
    e.connect_timeout(std::time::Duration::from_secs(5))
        .http2_keep_alive_interval(std::time::Duration::from_secs(10))
        .keep_alive_timeout(std::time::Duration::from_secs(20))
        .keep_alive_while_idle(true)
}

/// Shared by all client connections of one shim.
pub struct AgentLink {
    pub grpc: AgentClient<Channel>,
    memory_socket: PathBuf,
    /// One memory-socket connection, reused; exchanges are serialised.
    memory: Mutex<Option<BufReader<UnixStream>>>,
}

impl AgentLink {
    /// Builds the channel. Connection happens lazily, so the shim can start
    /// before the agent; calls fail with `AgentUnavailable` until it is up.
    pub fn new(cfg: &LinkConfig) -> Result<Self, crate::error::StartupError> {
        let channel = if let Some(path) = cfg.grpc.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            // The URI is ignored by the connector; tonic needs a valid one.
            endpoint(Endpoint::from_static("http://agent.local")).connect_with_connector_lazy(tower::service_fn(
                move |_| {
                    let path = path.clone();
                    async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
                },
            ))
        } else {
            endpoint(
                Endpoint::from_shared(cfg.grpc.clone())
                    .map_err(|source| crate::error::StartupError::AgentAddress { address: cfg.grpc.clone(), source })?,
            )
            .tcp_nodelay(true)
            .connect_lazy()
        };
        Ok(Self { grpc: AgentClient::new(channel), memory_socket: cfg.memory_socket.clone(), memory: Mutex::new(None) })
    }

    /// Hands `fd` to the agent and returns the ticket that redeems it.
    pub async fn hand_over(&self, fd: BorrowedFd<'_>) -> Result<String, ShimError> {
        tokio::time::timeout(HAND_OVER_TIMEOUT, self.hand_over_now(fd)).await.map_err(|_| {
            ShimError::AgentUnavailable(format!("the agent's memory socket did not answer in {HAND_OVER_TIMEOUT:?}"))
        })?
    }

    async fn hand_over_now(&self, fd: BorrowedFd<'_>) -> Result<String, ShimError> {
        let mut guard = self.memory.lock().await;
        // One retry with a fresh connection covers an agent restart.
        for attempt in 0..2 {
            if guard.is_none() {
                let s = UnixStream::connect(&self.memory_socket).await.map_err(|e| {
                    ShimError::AgentUnavailable(format!("memory socket {}: {e}", self.memory_socket.display()))
                })?;
                *guard = Some(BufReader::new(s));
            }
            let Some(conn) = guard.as_mut() else { continue };
            let mut line = String::new();
            let res = async {
                sluice_shm::send_with_fds(conn.get_ref(), b"R", &[fd]).await?;
                conn.read_line(&mut line).await
            }
            .await;
            match res {
                Ok(n) if n > 0 => {
                    let line = line.trim_end();
                    return match line.strip_prefix("OK ") {
                        Some(t) => Ok(t.to_owned()),
                        None => Err(ShimError::AgentUnavailable(format!("agent refused the region: {line}"))),
                    };
                }
                _ if attempt == 0 => *guard = None,
                Ok(_) => break,
                Err(e) => return Err(ShimError::AgentUnavailable(format!("memory socket: {e}"))),
            }
        }
        *guard = None;
        Err(ShimError::AgentUnavailable("memory socket closed by the agent".into()))
    }
}
