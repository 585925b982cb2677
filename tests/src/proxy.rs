//! A TCP proxy for tests: counts the bytes it carries and can "crash" after
//! a given number of response bytes (closing every connection and refusing
//! new ones), which is how a store dying mid-transfer looks to the agent.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicU64>,
    stopped: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Offset (in bytes carried back to clients) of a byte to corrupt.
    flip: Arc<AtomicU64>,
    /// Bytes carried from clients to the target, and the offset of a byte
    /// among them to corrupt.
    up: Arc<AtomicU64>,
    flip_up: Arc<AtomicU64>,
}

impl Proxy {
    /// Forwards to `target`. With `cut_after = Some(n)`, once `n` bytes have
    /// flowed back to clients the proxy closes everything and stops accepting.
    pub fn start(target: SocketAddr, cut_after: Option<u64>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let down = Arc::new(AtomicU64::new(0));
        let stopped = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let flip = Arc::new(AtomicU64::new(u64::MAX));
        let (up, flip_up) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(u64::MAX)));
        let (d, s, cs, st, fl) = (down.clone(), stopped.clone(), conns.clone(), stalled.clone(), flip.clone());
        let (u, fu) = (up.clone(), flip_up.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                };
                let _ = client.set_nonblocking(false);
                let Ok(upstream) = TcpStream::connect(target) else { continue };
                for sock in [&client, &upstream] {
                    if let Ok(c) = sock.try_clone() {
                        cs.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                    }
                }
                let (c2, u2) = (client.try_clone().expect("clone"), upstream.try_clone().expect("clone"));
                let st2 = st.clone();
                // Upward, bytes are counted (and one may be flipped) but never cut.
                let up_count = (u.clone(), None, Arc::new(AtomicBool::new(false)), Arc::default(), fu.clone());
                std::thread::spawn(move || pump(c2, u2, Some(up_count), &st2));
                let (d, s, cs, st, fl) = (d.clone(), s.clone(), cs.clone(), st.clone(), fl.clone());
                std::thread::spawn(move || pump(upstream, client, Some((d, cut_after, s, cs, fl)), &st));
            }
            // Dropping the listener here refuses new connections.
        });
        Self { addr, down, stopped, stalled, conns, flip, up, flip_up }
    }

    /// Corrupts (inverts) one byte, `after` bytes from now, on its way from
    /// a client to the target: a request body damaged on the network.
    pub fn flip_byte_up(&self, after: u64) {
        self.flip_up.store(self.up.load(Ordering::SeqCst) + after, Ordering::SeqCst);
    }

    /// Corrupts (inverts) one byte, `after` bytes from now, on its way back
    /// to a client: a store or network that damages data silently.
    pub fn flip_byte(&self, after: u64) {
        self.flip.store(self.bytes_down() + after, Ordering::SeqCst);
    }

    /// While stalled, connections are accepted and bytes are read but none
    /// is passed on: a store that hangs without closing anything.
    pub fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Bytes carried from the target back to clients.
    pub fn bytes_down(&self) -> u64 {
        self.down.load(Ordering::SeqCst)
    }

    /// Closes every connection and stops accepting.
    pub fn stop(&self) {
        stop_all(&self.stopped, &self.conns);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

type Count = (Arc<AtomicU64>, Option<u64>, Arc<AtomicBool>, Arc<Mutex<Vec<TcpStream>>>, Arc<AtomicU64>);

fn stop_all(stopped: &AtomicBool, conns: &Mutex<Vec<TcpStream>>) {
    stopped.store(true, Ordering::SeqCst);
    for c in conns.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        let _ = c.shutdown(Shutdown::Both);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, count: Option<Count>, stalled: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while stalled.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut n = n;
        if let Some((down, cut, stopped, conns, flip)) = &count {
            let total = down.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
            let (from, at) = (total - n as u64, flip.load(Ordering::SeqCst));
            if (from..total).contains(&at)
                && flip.compare_exchange(at, u64::MAX, Ordering::SeqCst, Ordering::SeqCst).is_ok()
            {
                buf[(at - from) as usize] ^= 0xff;
            }
            if let Some(limit) = cut {
                if total >= *limit {
                    n -= (total - limit).min(n as u64) as usize;
                    let _ = to.write_all(&buf[..n]);
                    stop_all(stopped, conns);
                    break;
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
