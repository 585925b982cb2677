//! Co-located host memory: the shim passes each region's memfd over the
//! agent's memory socket (SCM_RIGHTS) and receives a one-time ticket; the
//! gRPC RegisterRegion call then redeems the ticket and the agent maps the fd.
//!
//! Memory socket protocol (one exchange per fd, on a long-lived connection):
//! the shim sends the single byte `R` with exactly one fd attached; the agent
//! answers one line, `OK <ticket>\n` or `ERR <reason>\n`.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_dataplane::SharedRegion;
use sluice_shm::MappedRegion;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use super::{HostMemory, HostRegion, MemError, RegionExport};

/// Tickets not redeemed within this time are dropped (and their fds closed).
const TICKET_TTL: Duration = Duration::from_secs(60);
/// Most unredeemed tickets held at once, so a misbehaving peer cannot make
/// the agent hoard descriptors.
const MAX_PENDING: usize = 4096;

struct Pending {
    fd: OwnedFd,
    at: Instant,
}

/// The co-located backend.
#[derive(Default)]
pub struct ColocatedMemory {
    pending: Mutex<HashMap<String, Pending>>,
}

impl ColocatedMemory {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Stores an fd and returns its ticket.
    fn deposit(&self, fd: OwnedFd) -> Result<String, MemError> {
        let mut map = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, p| p.at.elapsed() < TICKET_TTL);
        if map.len() >= MAX_PENDING {
            return Err(MemError::Map("too many unredeemed memory tickets".into()));
        }
        let ticket = crate::ids::random_id();
        map.insert(ticket.clone(), Pending { fd, at: Instant::now() });
        Ok(ticket)
    }

    /// Accepts shims on the memory socket until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.handle(stream).await });
                }
                Err(e) => {
                    warn!(error = %e, "memory socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn handle(&self, mut stream: UnixStream) {
        let mut buf = [0u8; 1];
        loop {
            let mut fds = Vec::new();
            match sluice_shm::recv_with_fds(&stream, &mut buf, &mut fds).await {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) => {
                    debug!(error = %e, "memory socket read failed");
                    return;
                }
            }
            let reply = if buf[0] != b'R' || fds.len() != 1 {
                format!("ERR expected 'R' with exactly one fd, got {:?} with {} fds\n", buf[0] as char, fds.len())
            } else {
                match fds.pop().map(|fd| self.deposit(fd)) {
                    Some(Ok(t)) => format!("OK {t}\n"),
                    Some(Err(e)) => format!("ERR {e}\n"),
                    None => "ERR no fd\n".into(),
                }
            };
            if stream.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

impl HostMemory for ColocatedMemory {
    fn import(&self, export: RegionExport, len: u64) -> Result<Arc<dyn HostRegion>, MemError> {
        let ticket = match export {
            RegionExport::Colocated { ticket } => ticket,
            RegionExport::Doca { .. } => {
                return Err(MemError::Unsupported(
                    "this agent runs the co-located host-memory backend; DOCA exports need the doca backend".into(),
                ))
            }
        };
        let pending = {
            let mut map = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            map.remove(&ticket).ok_or(MemError::UnknownTicket)?
        };
        if pending.at.elapsed() >= TICKET_TTL {
            return Err(MemError::UnknownTicket);
        }
        let region = MappedRegion::map(pending.fd, len)?;
        Ok(Arc::new(SharedRegion::new(region)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use tokio::io::AsyncBufReadExt;

    #[tokio::test]
    async fn ticket_round_trip_and_single_use() {
        let mem = ColocatedMemory::new();
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(mem.clone().handle_owned(b));
        let region = MappedRegion::create("t", 4096).unwrap();
        sluice_shm::send_with_fds(&a, b"R", &[region.fd().as_fd()]).await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(a).read_line(&mut line).await.unwrap();
        let ticket = line.strip_prefix("OK ").unwrap().trim().to_owned();
        let r = mem.import(RegionExport::Colocated { ticket: ticket.clone() }, 4096).unwrap();
        r.write_at(10, b"xyz").unwrap();
        let mut out = [0u8; 3];
        region.read_at(10, &mut out).unwrap();
        assert_eq!(&out, b"xyz");
        assert!(r.write_at(4095, b"ab").is_err());
        assert!(matches!(mem.import(RegionExport::Colocated { ticket }, 4096), Err(MemError::UnknownTicket)));
    }

    #[tokio::test]
    async fn frame_without_fd_is_refused() {
        let mem = ColocatedMemory::new();
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(mem.clone().handle_owned(b));
        sluice_shm::send_with_fds(&a, b"R", &[]).await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(a).read_line(&mut line).await.unwrap();
        assert!(line.starts_with("ERR"), "{line}");
    }

    impl ColocatedMemory {
        async fn handle_owned(self: Arc<Self>, s: UnixStream) {
            self.handle(s).await
        }
    }
}
