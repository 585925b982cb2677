//! A fuzzer of the shim's socket protocol, against real shim, agent and
//! gateway processes: seeded, for a fixed time budget.
//!
//! Several connections at once send what a hostile or broken local client
//! could: valid requests with random fields (paths, region ids, offsets,
//! ranges, lengths), Register with every kind of descriptor (none, sealed and
//! unsealed memfds, regular files, pipes, several at once), requests with
//! flipped and truncated bytes, garbage frames, oversized length prefixes,
//! frames cut off by a close. Oracles: every frame the shim sends back
//! decodes and answers an id that was asked (or 0); neither daemon dies; when
//! the connections are gone the shim's descriptors and the agent's sessions
//! and regions are back to their baseline; a normal client still reads and
//! writes exact bytes.
//!
//! `SLUICE_SHIM_FUZZ_SECS` (default 15) is the budget, `SLUICE_SHIM_FUZZ_SEED`
//! (default 1) the seed; the summary line `shim-fuzz: ...` gives both, so a
//! failure can be replayed.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::common::ByteRange;
use sluice_proto::shim::{self as pb, request::Op};
use sluice_proto::{encode_frame, Message};
use sluice_tests::{pattern, sha256, Options, Stack};

/// xorshift64*: small, seeded, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Default)]
struct Counts {
    frames: AtomicU64,
    responses: AtomicU64,
    connections: AtomicU64,
    fds: AtomicU64,
}

const PATHS: &[&str] = &[
    "data/fuzz/a",
    "data/fuzz/b",
    "data/missing",
    "other/secret",
    "scoped/x",
    "data",
    "data/",
    "",
    "/",
    "data/../other/secret",
    "data//x",
    "data/./x",
    "nope/x",
    "data/日本/語",
    "data/\u{0}nul",
];

fn u64_field(rng: &mut Rng, near: u64) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => near,
        2 => near.saturating_add(1),
        3 => u64::MAX,
        4 => 1 << rng.below(40),
        _ => rng.below(near.max(1).saturating_add(4096)),
    }
}

/// An `if_match` value: mostly none, else a plausible ETag, a hostile one
/// (quotes, control bytes, very long) or a weak one.
fn etag(rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => "\"0123456789abcdef0123456789abcdef\"".into(),
        1 => format!("W/\"{}\"", rng.below(1 << 20)),
        2 => "\"\u{0}\r\n\"".into(),
        3 => "e".repeat(rng.below(5000) as usize),
        _ => String::new(),
    }
}

fn path(rng: &mut Rng) -> String {
    if rng.chance(10) {
        let n = rng.below(1100) as usize;
        return format!("data/{}", "k".repeat(n));
    }
    rng.pick(PATHS).to_string()
}

/// A descriptor of some kind, for a Register frame.
fn descriptor(rng: &mut Rng, dir: &std::path::Path, len: u64) -> OwnedFd {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let size = if rng.chance(80) { len.min(8 << 20) } else { rng.below(8 << 20) };
    match rng.below(5) {
        0 => sluice_shm::create_memfd("fuzz", size.max(1)).expect("memfd"),
        1 => {
            let fd = memfd_create(c"fuzz", MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING)
                .expect("memfd");
            let _ = std::fs::File::from(fd.try_clone().expect("dup")).set_len(size);
            fd
        }
        2 => {
            let p = dir.join(format!("fuzz-file-{}", rng.next()));
            let _ = std::fs::write(&p, vec![0u8; size.min(1 << 20) as usize]);
            let f = std::fs::File::options().read(true).write(true).open(&p).expect("file");
            let _ = std::fs::remove_file(&p);
            f.into()
        }
        3 => nix::unistd::pipe().expect("pipe").0,
        _ => std::fs::File::open("/dev/null").expect("null").into(),
    }
}

/// One request with random fields; region ids come from what this
/// connection registered, or are made up.
fn request(rng: &mut Rng, id: u64, regions: &[String]) -> (pb::Request, bool) {
    let region =
        if !regions.is_empty() && rng.chance(70) { rng.pick(regions).clone() } else { format!("{:032x}", rng.next()) };
    let range = rng
        .chance(40)
        .then(|| ByteRange { start: u64_field(rng, 1 << 20), length: rng.chance(70).then(|| u64_field(rng, 1 << 20)) });
    let mut wants_fd = false;
    let op = match rng.below(10) {
        0 => Op::Hello(pb::Hello {
            version: if rng.chance(80) { 1 } else { rng.below(5) as u32 },
            client: "fuzz".into(),
            // Now and then a join token: made up, never one of a session.
            join: if rng.chance(20) { format!("{:032x}", rng.next()) } else { String::new() },
        }),
        1 | 2 => {
            wants_fd = rng.chance(50);
            let length = if rng.chance(90) { 1 + rng.below(4 << 20) } else { u64_field(rng, 1 << 40) };
            Op::Register(pb::Register {
                length,
                fd_attached: wants_fd,
                kind: if rng.chance(90) { 0 } else { rng.below(4) as i32 },
                dmabuf_offset: u64_field(rng, length),
                gpu_address: rng.next(),
            })
        }
        3 => Op::Release(pb::Release { region_id: region }),
        4 if rng.chance(40) => {
            // Batches: empty, oversized (refused whole), or a few items
            // mixing good and bad paths, regions and slots.
            let n = match rng.below(10) {
                0 => 0,
                1 => 1025 + rng.below(200) as usize,
                _ => 1 + rng.below(12) as usize,
            };
            let items = (0..n)
                .map(|_| pb::Get {
                    path: path(rng),
                    range: None,
                    region_id: region.clone(),
                    offset: u64_field(rng, 1 << 20),
                    max_bytes: u64_field(rng, 1 << 20),
                    if_match: etag(rng),
                })
                .collect();
            Op::GetBatch(pb::GetBatch { items })
        }
        4 | 5 => Op::Get(pb::Get {
            path: path(rng),
            range,
            region_id: region,
            offset: u64_field(rng, 1 << 20),
            max_bytes: if rng.chance(70) { 0 } else { u64_field(rng, 1 << 20) },
            if_match: etag(rng),
        }),
        6 => Op::Put(pb::Put {
            path: path(rng),
            region_id: region,
            offset: u64_field(rng, 1 << 20),
            length: if rng.chance(80) { rng.below(1 << 20) } else { u64_field(rng, 1 << 22) },
            content_type: if rng.chance(50) { String::new() } else { "x/\u{7f}".into() },
        }),
        7 => Op::Head(pb::Head { path: path(rng) }),
        8 => Op::List(pb::List {
            path: path(rng),
            continuation_token: if rng.chance(80) { String::new() } else { format!("{:x}", rng.next()) },
            max_keys: rng.below(3000) as u32,
            delimiter: rng.pick(&["", "/", "k", "\u{0}"]).to_string(),
        }),
        _ => Op::Delete(pb::Delete { path: path(rng) }),
    };
    let timeout_ms = if rng.chance(20) { rng.below(3000) as u32 } else { 0 };
    (pb::Request { id, request_id: String::new(), timeout_ms, op: Some(op) }, wants_fd)
}

/// Reads whatever the shim sent so far; every frame must decode. Returns
/// the region ids it registered and whether the connection is closed.
/// `asked`: the highest id sent, or `None` once the connection carried a
/// corrupted frame (the shim then answers whatever it decoded).
async fn drain(
    buf: &mut Vec<u8>,
    s: &tokio::net::UnixStream,
    asked: Option<u64>,
    counts: &Counts,
) -> (Vec<String>, bool) {
    let mut regions = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let mut closed = false;
    loop {
        let mut fds = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_millis(1), sluice_shm::recv_with_fds(s, &mut chunk, &mut fds)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => break,
        }
    }
    while buf.len() >= 4 {
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if buf.len() < 4 + len {
            break;
        }
        let resp = pb::Response::decode(&buf[4..4 + len]).expect("the shim sent a frame that does not decode");
        if let Some(max) = asked {
            assert!(resp.id <= max, "the shim answered id {} that was never asked (max {max})", resp.id);
        }
        if let Some(pb::response::Result::Registered(r)) = &resp.result {
            regions.push(r.region_id.clone());
        }
        counts.responses.fetch_add(1, Ordering::Relaxed);
        buf.drain(..4 + len);
    }
    (regions, closed)
}

async fn connection(seed: u64, stack_socket: std::path::PathBuf, dir: std::path::PathBuf, counts: Arc<Counts>) {
    let mut rng = Rng(seed | 1);
    let Ok(s) = tokio::net::UnixStream::connect(&stack_socket).await else { return };
    counts.connections.fetch_add(1, Ordering::Relaxed);
    let mut regions: Vec<String> = Vec::new();
    let mut buf = Vec::new();
    let mut id = 0u64;
    let mut corrupted = false;
    if rng.chance(85) {
        id += 1;
        let hello = pb::Request {
            id,
            op: Some(Op::Hello(pb::Hello { version: 1, client: "fuzz".into(), join: String::new() })),
            ..Default::default()
        };
        let _ = sluice_shm::send_with_fds(&s, &encode_frame(&hello), &[]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..1 + rng.below(25) {
        id += 1;
        let (req, wants_fd) = request(&mut rng, id, &regions);
        let mut frame = encode_frame(&req);
        let mut fds: Vec<OwnedFd> = Vec::new();
        if wants_fd || rng.chance(5) {
            let n = if rng.chance(85) { 1 } else { 2 + rng.below(8) };
            let len = match &req.op {
                Some(Op::Register(r)) => r.length,
                _ => 4096,
            };
            fds = (0..n).map(|_| descriptor(&mut rng, &dir, len)).collect();
        }
        let mutation = rng.below(20);
        corrupted |= mutation < 4;
        match mutation {
            0 => {
                // Flip bytes of the protobuf, keep the length prefix.
                for _ in 0..1 + rng.below(4) {
                    let i = 4 + rng.below((frame.len() - 4).max(1) as u64) as usize;
                    if i < frame.len() {
                        frame[i] ^= 1 << rng.below(8);
                    }
                }
            }
            1 => {
                // A lying length prefix.
                let lie = *rng.pick(&[0u32, 1, u32::MAX, (1 << 20) + 1, frame.len() as u32 + 7]);
                frame[..4].copy_from_slice(&lie.to_be_bytes());
            }
            2 => frame = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            3 => frame.truncate(rng.below(frame.len() as u64) as usize),
            _ => {}
        }
        counts.frames.fetch_add(1, Ordering::Relaxed);
        counts.fds.fetch_add(fds.len() as u64, Ordering::Relaxed);
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        if sluice_shm::send_with_fds(&s, &frame, &borrowed).await.is_err() {
            break;
        }
        drop(fds);
        if rng.chance(30) {
            tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
        }
        let (new, closed) = drain(&mut buf, &s, (!corrupted).then_some(id), &counts).await;
        regions.extend(new);
        if closed {
            break;
        }
    }
    if rng.chance(70) {
        // Wait a little for the last answers, then close (possibly with
        // requests still in flight).
        tokio::time::sleep(Duration::from_millis(rng.below(200))).await;
        let _ = drain(&mut buf, &s, (!corrupted).then_some(id), &counts).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shim_protocol_fuzz() {
    let secs: u64 = std::env::var("SLUICE_SHIM_FUZZ_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(15);
    let seed: u64 = std::env::var("SLUICE_SHIM_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mut stack = Stack::with(Options {
        agent_limits: "session_lease_ms = 1000\n".into(),
        shim_limits: "hello_timeout_ms = 500\n".into(),
        ..Default::default()
    });
    let normal = stack.client().await;
    let shim_fds = stack.fd_count("sluice-shim");
    let agent_fds = stack.fd_count_unpooled("sluice-agent");
    let counts = Arc::new(Counts::default());
    let mut master = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let t0 = Instant::now();
    let mut rounds = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        rounds += 1;
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (socket, dir, counts) = (stack.socket.clone(), stack.dir.path().to_owned(), counts.clone());
                tokio::spawn(connection(master.next(), socket, dir, counts))
            })
            .collect();
        for t in tasks {
            t.await.expect("a fuzz connection task panicked (an oracle failed)");
        }
        assert!(
            stack.alive("sluice-shim") && stack.alive("sluice-agent"),
            "a daemon died (seed {seed}, round {rounds})"
        );
    }
    // Everything the fuzz connections held is released.
    let settle = Instant::now();
    loop {
        let (fds, sessions) = (stack.fd_count("sluice-shim"), stack.metric("sluice_agent_sessions ", &[]));
        let agent = stack.fd_count_unpooled("sluice-agent");
        if fds <= shim_fds + 4 && sessions <= 1.0 && agent <= agent_fds + 4 {
            break;
        }
        assert!(
            // Memory tickets a vanished client never redeemed are closed
            // within 15 s (+ a quarter of that) by the agent.
            settle.elapsed() < Duration::from_secs(30),
            "not released: shim fds {fds} (base {shim_fds}), agent fds {agent} besides pooled store connections \
             (base {agent_fds}), sessions {sessions}, regions {}; the agent holds {:?}",
            stack.metric("sluice_agent_regions{", &[]),
            stack.fd_targets("sluice-agent")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The client that was connected all along still works, byte for byte.
    let data = pattern(3 << 20, seed);
    let r = normal.register(data.len() as u64).await.expect("register");
    r.write_at(0, &data).expect("fill");
    normal.put("data/after-fuzz", &r, 0, data.len() as u64).await.expect("put after fuzzing");
    r.write_at(0, &vec![0u8; data.len()]).expect("clear");
    normal.get("data/after-fuzz", &r, 0, None).await.expect("get after fuzzing");
    assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(&data));
    stack.kill("sluice-shim"); // (its log stays for a failed run)
    sluice_tests::report(&format!(
        "shim-fuzz: seed={seed} secs={secs} rounds={rounds} connections={} frames={} fds={} responses={} crashes=0",
        counts.connections.load(Ordering::Relaxed),
        counts.frames.load(Ordering::Relaxed),
        counts.fds.load(Ordering::Relaxed),
        counts.responses.load(Ordering::Relaxed),
    ));
}
