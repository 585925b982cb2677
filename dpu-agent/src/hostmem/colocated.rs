//! Co-located host memory: the shim passes each region's memfd over the
//! agent's memory socket (SCM_RIGHTS) and receives a one-time ticket; the
//! gRPC RegisterRegion call then redeems the ticket and the agent maps the fd.
//!
//! Memory socket protocol (one exchange per fd, on a long-lived connection):
//! the shim sends the single byte `R` with exactly one fd attached (a
//! memfd), or `D` and 24 bytes ([`sluice_shm::DmabufHandOver`]: offset,
//! length, CUDA address) with a CUDA dma-buf attached (GPU memory, taken
//! only when the agent's verbs device registers dma-bufs, see [`super::gpu`]);
//! the agent answers one line, `OK <ticket>\n` or `ERR <reason>\n`.
//!
//! The agent maps memory it did not create, so a memfd is accepted only
//! if it can never shrink under the mapping (`F_SEAL_SHRINK`); a dma-buf
//! only if it is one and holds the range. Anything else is refused and
//! closed at once. Descriptors held for tickets are bounded per connection
//! and in total, connections are bounded, and a message with too many
//! descriptors closes all of them.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_dataplane::SharedRegion;
use sluice_shm::MappedRegion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use super::gpu::{Deposit, GpuPath};
use super::{HostMemory, HostRegion, MemError, RegionExport};

/// Tickets not redeemed within this time are dropped (and their fds closed).
/// A shim redeems its ticket in the Register that follows the deposit at
/// once; one that did not (its client vanished in between) is closed soon.
const TICKET_TTL: Duration = Duration::from_secs(15);
/// Most unredeemed tickets held at once, so a misbehaving peer cannot make
/// the agent hoard descriptors.
const MAX_PENDING: usize = 4096;
/// Most unredeemed tickets of one connection (a shim redeems each at once).
const MAX_PENDING_PER_CONNECTION: usize = 256;
/// Most memory-socket connections at once (a shim keeps one).
const MAX_CONNECTIONS: usize = 64;
/// Longest the rest of a frame may take once its first byte came (the
/// shim writes a frame in one message).
const FRAME_REST_TIMEOUT: Duration = Duration::from_secs(5);

/// A descriptor held for a ticket.
enum Deposited {
    Memfd(OwnedFd),
    Dmabuf(Deposit),
}

struct Pending {
    what: Deposited,
    at: Instant,
    connection: u64,
}

/// The co-located backend.
pub struct ColocatedMemory {
    pending: Mutex<HashMap<String, Pending>>,
    connections: Arc<tokio::sync::Semaphore>,
    next_connection: std::sync::atomic::AtomicU64,
    /// Whether GPU regions (dma-bufs) are taken, and with which device.
    gpu: GpuPath,
}

impl Default for ColocatedMemory {
    fn default() -> Self {
        Self {
            pending: Mutex::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            next_connection: std::sync::atomic::AtomicU64::new(1),
            gpu: GpuPath::Unavailable("no verbs transport was asked".into()),
        }
    }
}

impl ColocatedMemory {
    /// Host memory only (memfds).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Memfds, and GPU memory as dma-bufs when `gpu` is available.
    pub fn with_gpu(gpu: GpuPath) -> Arc<Self> {
        Arc::new(Self { gpu, ..Self::default() })
    }

    /// Checks a descriptor for what its frame says it is: a memfd that
    /// cannot shrink, or a dma-buf holding the range (when GPU memory is
    /// taken at all). Anything else is refused (and closed on return).
    fn check(&self, fd: OwnedFd, dmabuf: Option<sluice_shm::DmabufHandOver>) -> Result<Deposited, MemError> {
        match dmabuf {
            None => {
                sluice_shm::check_sealed(std::os::fd::AsFd::as_fd(&fd))?;
                Ok(Deposited::Memfd(fd))
            }
            Some(hand) => match &self.gpu {
                GpuPath::Available(_) => Ok(Deposited::Dmabuf(Deposit::check(fd, hand)?)),
                GpuPath::Unavailable(why) => {
                    Err(MemError::Unsupported(format!("this co-located agent takes no GPU memory: {why}")))
                }
            },
        }
    }

    /// Stores a checked descriptor and returns its ticket.
    fn deposit(&self, what: Deposited, connection: u64) -> Result<String, MemError> {
        self.expire_tickets();
        let mut map = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_PENDING {
            return Err(MemError::Exhausted("too many unredeemed memory tickets".into()));
        }
        if map.values().filter(|p| p.connection == connection).count() >= MAX_PENDING_PER_CONNECTION {
            return Err(MemError::Exhausted(format!(
                "{MAX_PENDING_PER_CONNECTION} unredeemed memory tickets on this connection"
            )));
        }
        let ticket = crate::ids::random_id();
        map.insert(ticket.clone(), Pending { what, at: Instant::now(), connection });
        Ok(ticket)
    }

    /// Closes the descriptors of tickets nobody redeemed in time (a shim
    /// whose client vanished between depositing and registering).
    fn expire_tickets(&self) -> usize {
        let mut map = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let before = map.len();
        map.retain(|_, p| p.at.elapsed() < TICKET_TTL);
        before - map.len()
    }

    /// Accepts shims on the memory socket until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        // Unredeemed tickets are closed within a quarter TTL of expiring,
        // not only when the next deposit happens to come.
        let weak = Arc::downgrade(&self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICKET_TTL / 4);
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { return };
                let n = me.expire_tickets();
                if n > 0 {
                    debug!(tickets = n, "closed unredeemed memory tickets");
                }
            }
        });
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let Ok(slot) = self.connections.clone().try_acquire_owned() else {
                        warn!(max = MAX_CONNECTIONS, "memory socket: too many connections; refusing one");
                        drop(stream);
                        continue;
                    };
                    let me = self.clone();
                    tokio::spawn(async move {
                        me.handle(stream).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    warn!(error = %e, "memory socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn handle(&self, mut stream: UnixStream) {
        let connection = self.next_connection.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            let dmabuf = if buf[0] == sluice_shm::DmabufHandOver::TAG {
                let mut body = [0u8; sluice_shm::DmabufHandOver::BODY_LEN];
                match tokio::time::timeout(FRAME_REST_TIMEOUT, stream.read_exact(&mut body)).await {
                    Ok(Ok(_)) => Some(sluice_shm::DmabufHandOver::decode(&body)),
                    // A frame cut short: nothing after it can be parsed.
                    _ => return,
                }
            } else {
                None
            };
            let reply = if !(buf[0] == b'R' || dmabuf.is_some()) || fds.len() != 1 {
                format!(
                    "ERR expected 'R' or 'D' with exactly one fd, got {:?} with {} fds\n",
                    buf[0] as char,
                    fds.len()
                )
            } else {
                let taken = fds.pop().map(|fd| self.check(fd, dmabuf).and_then(|d| self.deposit(d, connection)));
                match taken {
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
    fn capabilities(&self) -> super::MemoryCaps {
        // GPU memory only by direct placement (no staging: the agent has
        // no CPU view of it), and only where the verbs device can register
        // dma-bufs.
        let mut kinds = vec![super::MemoryKind::Memfd];
        if matches!(self.gpu, GpuPath::Available(_)) {
            kinds.push(super::MemoryKind::GpuDmabuf);
        }
        super::MemoryCaps { kinds, gpu_staging: None }
    }

    fn discard(&self, export: &RegionExport) {
        if let RegionExport::Colocated { ticket } = export {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(ticket);
        }
    }

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
        match (pending.what, &self.gpu) {
            (Deposited::Memfd(fd), _) => Ok(Arc::new(SharedRegion::new(MappedRegion::map(fd, len)?))),
            (Deposited::Dmabuf(d), GpuPath::Available(device)) => d.import(len, device),
            // Not deposited without a device; kept total all the same.
            (Deposited::Dmabuf(_), GpuPath::Unavailable(why)) => {
                Err(MemError::Unsupported(format!("this co-located agent takes no GPU memory: {why}")))
            }
        }
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

    /// A ticket whose registration was refused, or that nobody redeemed,
    /// does not keep its memfd open.
    #[tokio::test]
    async fn unredeemed_tickets_are_closed() {
        let mem = ColocatedMemory::new();
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(mem.clone().handle_owned(b));
        let mut reader = tokio::io::BufReader::new(a);
        let region = MappedRegion::create("t", 4096).unwrap();
        let mut tickets = Vec::new();
        for _ in 0..2 {
            sluice_shm::send_with_fds(reader.get_ref(), b"R", &[region.fd().as_fd()]).await.unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            tickets.push(line.strip_prefix("OK ").unwrap().trim().to_owned());
        }
        mem.discard(&RegionExport::Colocated { ticket: tickets[0].clone() });
        assert_eq!(mem.pending.lock().unwrap().len(), 1);
        let ticket = RegionExport::Colocated { ticket: tickets[0].clone() };
        assert!(matches!(mem.import(ticket, 4096), Err(MemError::UnknownTicket)));
        // Expiry: age the other ticket past its TTL.
        mem.pending.lock().unwrap().values_mut().for_each(|p| p.at -= TICKET_TTL);
        assert_eq!(mem.expire_tickets(), 1);
        assert!(mem.pending.lock().unwrap().is_empty());
    }

    /// The SIGBUS attack at the agent: descriptors that could shrink under
    /// its mapping are refused at the door and closed.
    #[tokio::test]
    async fn only_sealed_memfds_are_taken() {
        let mem = ColocatedMemory::new();
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(mem.clone().handle_owned(b));
        let mut reader = tokio::io::BufReader::new(a);
        let path = std::env::temp_dir().join(format!("sluice-colocated-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let regular = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let unsealed = nix::sys::memfd::memfd_create(c"t", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        for (what, fd) in [("regular file", regular.as_fd()), ("unsealed memfd", unsealed.as_fd())] {
            sluice_shm::send_with_fds(reader.get_ref(), b"R", &[fd]).await.unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).await.unwrap();
            assert!(line.starts_with("ERR") && line.contains("sealed"), "{what}: {line}");
        }
        assert!(mem.pending.lock().unwrap().is_empty(), "nothing was kept");
    }

    /// Without a verbs device that registers dma-bufs, GPU memory is not
    /// offered and a dma-buf frame is refused with the reason, its
    /// descriptor closed.
    #[tokio::test]
    async fn gpu_memory_is_refused_without_a_dmabuf_device() {
        let why = "no verbs transport runs";
        let mem = ColocatedMemory::with_gpu(GpuPath::Unavailable(why.into()));
        let caps = mem.capabilities();
        assert_eq!((caps.kinds, caps.gpu_staging), (vec![super::super::MemoryKind::Memfd], None));
        let (a, b) = UnixStream::pair().unwrap();
        tokio::spawn(mem.clone().handle_owned(b));
        let mut reader = tokio::io::BufReader::new(a);
        let region = MappedRegion::create("t", 4096).unwrap();
        let frame = sluice_shm::DmabufHandOver { offset: 0, len: 4096, gpu_address: 0x7f00_0000_0000 }.encode();
        sluice_shm::send_with_fds(reader.get_ref(), &frame, &[region.fd().as_fd()]).await.unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        assert!(line.starts_with("ERR this co-located agent takes no GPU memory") && line.contains(why), "{line}");
        assert!(mem.pending.lock().unwrap().is_empty(), "nothing was kept");
        // The connection still serves memfds.
        sluice_shm::send_with_fds(reader.get_ref(), b"R", &[region.fd().as_fd()]).await.unwrap();
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        assert!(line.starts_with("OK "), "{line}");
    }

    /// A dma-buf frame cut short ends the connection: its descriptor is
    /// closed and nothing is kept.
    #[tokio::test]
    async fn a_cut_short_dmabuf_frame_closes_the_connection() {
        let mem = ColocatedMemory::new();
        let (a, b) = UnixStream::pair().unwrap();
        let served = tokio::spawn(mem.clone().handle_owned(b));
        let region = MappedRegion::create("t", 4096).unwrap();
        let frame = sluice_shm::DmabufHandOver { offset: 0, len: 4096, gpu_address: 1 << 40 }.encode();
        sluice_shm::send_with_fds(&a, &frame[..9], &[region.fd().as_fd()]).await.unwrap();
        drop(a);
        tokio::time::timeout(Duration::from_secs(10), served).await.expect("the handler ends").unwrap();
        assert!(mem.pending.lock().unwrap().is_empty());
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
