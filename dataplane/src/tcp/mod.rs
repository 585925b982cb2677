//! The `tcp` software transport: one-sided WRITE/READ semantics over TCP,
//! so the S3-over-RDMA protocol runs end to end on any machine.

mod owner;
mod remote;
pub mod wire;

pub use owner::{owner_addr, TcpOwner};
pub use remote::TcpRemote;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::{Access, Grant};
    use crate::memory::{RegionMemory, SharedRegion};
    use crate::transport::Transport;
    use bytes::Bytes;
    use futures::TryStreamExt;
    use std::sync::Arc;

    const WAIT: std::time::Duration = std::time::Duration::from_secs(5);

    async fn owner() -> Arc<TcpOwner> {
        let (o, l) = TcpOwner::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
        tokio::spawn(o.clone().serve(l));
        o
    }

    fn region(len: u64) -> Arc<SharedRegion> {
        Arc::new(SharedRegion::new(sluice_shm::MappedRegion::create("t", len).unwrap()))
    }

    fn grant(mem: Arc<SharedRegion>, offset: u64, len: u64, access: Access) -> Grant {
        Grant { memory: mem, offset, len, access, tenant: "t".into(), request_id: "r".into() }
    }

    #[tokio::test]
    async fn write_then_read_split_into_small_ops() {
        let o = owner().await;
        let mem = region(1 << 20);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let exp = o.expose(grant(mem.clone(), 1000, data.len() as u64, Access::RemoteWrite)).unwrap();
        let remote = TcpRemote::new(64 << 10); // many ops per transfer
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            data.chunks(7777).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let n = remote.write_stream(&exp.token, data.len() as u64, futures::stream::iter(chunks)).await.unwrap();
        assert_eq!(n, data.len() as u64);
        // The last piece may be posted: the owner's window says when it is in.
        exp.settle(n, WAIT).await.unwrap();
        assert_eq!(&mem.0.as_slice()[1000..1000 + data.len()], &data[..]);
        assert_eq!(mem.0.as_slice()[999], 0);

        let exp = o.expose(grant(mem.clone(), 1000, data.len() as u64, Access::RemoteRead)).unwrap();
        let back: Vec<Bytes> = remote.read_stream(&exp.token, data.len() as u64).try_collect().await.unwrap();
        assert_eq!(back.concat(), data);
    }

    /// Memory the owner does not map (as a DPU's import of host memory),
    /// counting the bytes copied out of it.
    #[derive(Debug)]
    struct Unmapped(Arc<SharedRegion>, std::sync::atomic::AtomicU64);

    impl RegionMemory for Unmapped {
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), crate::memory::MemError> {
            self.0.write_at(offset, data)
        }
        fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<(), crate::memory::MemError> {
            self.1.fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.0.read_at(offset, out)
        }
    }

    /// A remote reading an unmapped window slowly, a few KiB at a time:
    /// every byte is copied out of the memory once (each write copied a
    /// whole chunk again, and sent what the socket took).
    #[tokio::test]
    async fn a_slow_reader_of_unmapped_memory_costs_one_copy_of_each_byte() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let o = owner().await;
        let len = 3u64 << 20;
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let shared = region(len);
        shared.write_at(0, &data).unwrap();
        let mem = Arc::new(Unmapped(shared, Default::default()));
        let g = Grant {
            memory: mem.clone(),
            offset: 0,
            len,
            access: Access::RemoteRead,
            tenant: "t".into(),
            request_id: "r".into(),
        };
        let exp = o.expose(g).unwrap();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let mut s = sock.connect(owner_addr(&exp.token).unwrap()).await.unwrap();
        let key = crate::capability::Key { rkey: exp.token.rkey, dct: exp.token.dct };
        let h = wire::Header { op: wire::Op::Read, key, addr: exp.token.addr, len, eager: false };
        s.write_all(&h.encode()).await.unwrap();
        let mut reply = [0u8; wire::REPLY_LEN];
        s.read_exact(&mut reply).await.unwrap();
        let mut got = Vec::with_capacity(len as usize);
        let mut piece = [0u8; 8192];
        while (got.len() as u64) < len {
            let n = s.read(&mut piece).await.unwrap();
            assert!(n > 0, "closed after {} bytes", got.len());
            got.extend_from_slice(&piece[..n]);
            if got.len() % (256 << 10) < 8192 {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        assert!(got == data, "the bytes read are the window's");
        let copied = mem.1.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(copied, len, "bytes copied out of the memory for {len} sent");
    }

    #[tokio::test]
    async fn refusals_change_nothing() {
        let o = owner().await;
        let mem = region(4096);
        let exp = o.expose(grant(mem.clone(), 0, 100, Access::RemoteWrite)).unwrap();
        let remote = TcpRemote::new(1 << 30);
        let body = || futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![7u8; 200]))]);
        // Larger than the window.
        assert!(remote.write_stream(&exp.token, 200, body()).await.is_err());
        // A forged descriptor pointing past the window.
        let forged = exp.token.with_transfer(exp.token.addr + 50, 100);
        assert!(remote.write_stream(&forged, 100, body()).await.is_err());
        // Wrong key.
        let mut wrong = exp.token;
        wrong.rkey ^= 0x55;
        assert!(remote.write_stream(&wrong, 10, body()).await.is_err());
        // Wrong direction.
        assert!(remote.read_stream(&exp.token, 10).try_collect::<Vec<_>>().await.is_err());
        // Revoked.
        let tok = exp.token;
        drop(exp);
        assert!(remote.write_stream(&tok, 10, body()).await.is_err());
        assert!(mem.0.as_slice().iter().all(|&b| b == 0), "no byte was written");
        assert_eq!(o.table().rejections.total(), 4);
        assert!(mem.len() == 4096);
    }

    /// A token naming some other service (the SSRF attempt): it receives
    /// the operation header and not one payload byte.
    #[tokio::test]
    async fn a_token_for_another_service_gets_no_payload() {
        use tokio::io::AsyncReadExt;
        let o = owner().await;
        let mem = region(4096);
        let exp = o.expose(grant(mem, 0, 4096, Access::RemoteWrite)).unwrap();
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = other.local_addr().unwrap().port();
        // Same token, owner address swapped for the other service's.
        let mut token = exp.token;
        token.lid = port;
        let received = tokio::spawn(async move {
            let (mut s, _) = other.accept().await.unwrap();
            let mut got = Vec::new();
            // The service answers nothing; it just reads until the remote gives up.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), s.read_to_end(&mut got)).await;
            got
        });
        let remote = TcpRemote::new(1 << 30);
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![0x41u8; 4096]))]);
        let r =
            tokio::time::timeout(std::time::Duration::from_millis(500), remote.write_stream(&token, 4096, body)).await;
        assert!(!matches!(r, Ok(Ok(_))), "the write must not succeed");
        drop(r);
        let got = received.await.unwrap();
        assert_eq!(got.len(), wire::HEADER_LEN, "only the header reached the other service");
    }

    /// An owner that answers with `features`, recording for every WRITE
    /// whether it came eager; payload bytes are read and dropped.
    async fn fake_owner(features: u8) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<bool>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut reply = wire::reply(wire::Status::Ok, 0);
            reply[1] = features;
            loop {
                let mut hb = [0u8; wire::HEADER_LEN];
                if s.read_exact(&mut hb).await.is_err() {
                    return;
                }
                let h = wire::Header::decode(&hb).unwrap();
                tx.send(h.eager).unwrap();
                if !h.eager {
                    s.write_all(&reply).await.unwrap();
                }
                let mut payload = vec![0u8; h.len as usize];
                s.read_exact(&mut payload).await.unwrap();
                s.write_all(&reply).await.unwrap();
            }
        });
        (addr, rx)
    }

    fn token_at(addr: std::net::SocketAddr, size: u32) -> crate::Token {
        let gid = match addr.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        crate::Token::new(0x1000, size, 7, addr.port(), 9, Some(gid)).unwrap()
    }

    /// The first WRITE on a connection waits for a go-ahead; later ones on
    /// the same connection go eager once the owner said it takes them, and
    /// never when it did not (an owner from before the feature).
    #[tokio::test]
    async fn writes_go_eager_only_after_an_owner_said_so() {
        let both = wire::FEATURE_EAGER | wire::FEATURE_POSTED;
        for (features, want) in [
            (wire::FEATURE_EAGER, vec![false, true, true]),
            (both, vec![false, true, true]),
            (0, vec![false, false, false]),
        ] {
            let (addr, mut seen) = fake_owner(features).await;
            let remote = TcpRemote::new(1 << 20);
            let token = token_at(addr, 8192);
            for _ in 0..3 {
                let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 4096]))]);
                assert_eq!(remote.write_stream(&token, 4096, body).await.unwrap(), 4096);
            }
            // A posted WRITE returns before the owner has read it: wait for it.
            let mut got = Vec::new();
            for _ in 0..3 {
                got.push(tokio::time::timeout(WAIT, seen.recv()).await.unwrap().unwrap());
            }
            assert_eq!(got, want, "features {features}");
        }
    }

    /// On a connection that already had answers, an eager WRITE with a
    /// wrong key, and one past its window, write nothing. The first is
    /// posted: the remote cannot know, but the window it aimed at shows
    /// nothing landed, and the refusal is read (and the connection
    /// replaced) before the next transfer, which still works.
    #[tokio::test]
    async fn a_refused_eager_write_changes_nothing() {
        let o = owner().await;
        let mem = region(1 << 16);
        let remote = TcpRemote::new(1 << 20);
        let good = o.expose(grant(mem.clone(), 0, 4096, Access::RemoteWrite)).unwrap();
        let body = |b: u8, n: usize| futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![b; n]))]);
        remote.write_stream(&good.token, 4096, body(5, 4096)).await.unwrap();
        good.settle(4096, WAIT).await.unwrap();
        // The pooled connection is now eager, and posts.
        let other = o.expose(grant(mem.clone(), 8192, 4096, Access::RemoteWrite)).unwrap();
        let mut wrong = other.token;
        wrong.rkey ^= 1;
        assert_eq!(remote.write_stream(&wrong, 4096, body(6, 4096)).await.unwrap(), 4096);
        let short = std::time::Duration::from_millis(300);
        assert!(matches!(
            other.settle(4096, short).await,
            Err(crate::landing::Unsettled::Missing { landed: 0, expected: 4096, .. })
        ));
        let past = other.token.with_transfer(other.token.addr + 2048, 4096);
        let e = remote.write_file(&past, &std::fs::File::open("/dev/zero").unwrap(), 0, 4096).await.unwrap_err();
        // A fresh connection's WRITE has the handshake: the owner's reason comes back.
        assert!(matches!(e, crate::TransportError::Rejected(_)), "{e}");
        assert!(mem.0.as_slice()[4096..].iter().all(|&b| b == 0), "no refused byte landed");
        assert!(mem.0.as_slice()[..4096].iter().all(|&b| b == 5));
        // A window an access was refused on is not trusted to settle.
        assert_eq!(other.settle(0, short).await, Err(crate::landing::Unsettled::Broke));
        let third = o.expose(grant(mem.clone(), 8192, 4096, Access::RemoteWrite)).unwrap();
        remote.write_stream(&third.token, 4096, body(7, 4096)).await.unwrap();
        third.settle(4096, WAIT).await.unwrap();
        assert!(mem.0.as_slice()[8192..12288].iter().all(|&b| b == 7));
        assert_eq!(o.table().rejections.total(), 2);
    }

    /// A connection that asks for nothing is closed once idle, so silent
    /// connections cannot hold the owner's places; and every refused access
    /// is told the same, whatever the reason, so a peer cannot tell a key
    /// that exists (with the wrong base) from a made-up one.
    #[tokio::test]
    async fn silent_connections_close_and_refusals_tell_nothing() {
        use tokio::io::AsyncReadExt;
        let (o, l) = TcpOwner::bind("127.0.0.1:0".parse().unwrap(), None).await.unwrap();
        let o = o.with_idle(std::time::Duration::from_millis(200));
        tokio::spawn(o.clone().serve(l));
        let mut silent = tokio::net::TcpStream::connect(o.advertised()).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(WAIT, silent.read(&mut buf)).await.expect("closed when idle").unwrap();
        assert_eq!(n, 0);

        let mem = region(1 << 16);
        let remote = TcpRemote::new(1 << 20);
        let exp = o.expose(grant(mem.clone(), 0, 4096, Access::RemoteWrite)).unwrap();
        let mut made_up = exp.token;
        made_up.rkey ^= 1;
        let wrong_base = exp.token.with_transfer(exp.token.addr + 8192, 16);
        let mut said = Vec::new();
        for t in [made_up, wrong_base] {
            let e = remote.write_file(&t, &std::fs::File::open("/dev/zero").unwrap(), 0, 16).await.unwrap_err();
            said.push(e.to_string());
        }
        assert_eq!(said[0], said[1]);
        assert!(!exp.landing.as_ref().unwrap().is_broken(), "a probe without the base broke the window");
    }

    /// A WRITE that begins after the window's bytes settled (a late or
    /// repeated one, from whoever holds the descriptor) may change them
    /// before the window is revoked: closing the exposure says so, where
    /// one with no such WRITE closes clean.
    #[tokio::test]
    async fn a_write_after_the_bytes_settled_is_caught_when_the_window_closes() {
        let o = owner().await;
        let mem = region(1 << 16);
        let remote = TcpRemote::new(1 << 20);
        let body = |b: u8| futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![b; 4096]))]);
        let clean = o.expose(grant(mem.clone(), 8192, 4096, Access::RemoteWrite)).unwrap();
        remote.write_stream(&clean.token, 4096, body(3)).await.unwrap();
        clean.settle(4096, WAIT).await.unwrap();
        assert_eq!(clean.close(), Ok(()));

        let exp = o.expose(grant(mem.clone(), 0, 4096, Access::RemoteWrite)).unwrap();
        remote.write_stream(&exp.token, 4096, body(1)).await.unwrap();
        exp.settle(4096, WAIT).await.unwrap();
        let again = exp.token;
        remote.write_stream(&again, 4096, body(2)).await.unwrap();
        let t0 = std::time::Instant::now();
        while mem.0.as_slice()[4095] != 2 {
            assert!(t0.elapsed() < WAIT, "the second WRITE never landed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(exp.close(), Err(crate::landing::Unsettled::Late));
    }

    /// A posted WRITE returns before the owner has answered (its answer is
    /// still owed on the pooled connection); the bytes are in once the
    /// window says so, and the answer is read on the connection's next use.
    #[tokio::test]
    async fn posted_writes_land_before_the_window_settles() {
        let o = owner().await;
        let mem = region(1 << 16);
        let remote = TcpRemote::new(1 << 20);
        for i in 0..8u8 {
            let exp = o.expose(grant(mem.clone(), 4096 * i as u64, 4096, Access::RemoteWrite)).unwrap();
            let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![i + 1; 4096]))]);
            assert_eq!(remote.write_stream(&exp.token, 4096, body).await.unwrap(), 4096);
            // The first WRITE on the connection has the handshake and is
            // answered; the later ones are posted.
            assert_eq!(remote.owed(), u32::from(i > 0), "write {i}");
            exp.settle(4096, WAIT).await.unwrap();
            let at = 4096 * i as usize;
            assert!(mem.0.as_slice()[at..at + 4096].iter().all(|&b| b == i + 1), "write {i}");
        }
        assert_eq!(o.table().live(), 0);
    }

    /// A remote that stalls mid-WRITE: once the window is dropped (the
    /// request ended, answered or cancelled), the rest of its payload
    /// lands nowhere.
    #[tokio::test]
    async fn a_dropped_window_takes_no_more_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let o = owner().await;
        let mem = region(1 << 16);
        let exp = o.expose(grant(mem.clone(), 0, 8192, Access::RemoteWrite)).unwrap();
        let mut s = tokio::net::TcpStream::connect(o.advertised()).await.unwrap();
        let h = wire::Header { op: wire::Op::Write, key: o_key(&exp), addr: exp.token.addr, len: 8192, eager: false };
        s.write_all(&h.encode()).await.unwrap();
        let mut rb = [0u8; wire::REPLY_LEN];
        s.read_exact(&mut rb).await.unwrap(); // the go-ahead
        s.write_all(&[9u8; 4096]).await.unwrap();
        // The first half lands; the remote then stalls.
        while mem.0.as_slice()[4095] != 9 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let landing = exp.landing.clone().unwrap();
        assert!(exp.settle(8192, std::time::Duration::from_millis(100)).await.is_err());
        drop(exp);
        assert!(landing.is_revoked());
        // The rest arrives late (or the owner has closed the connection).
        let _ = s.write_all(&[9u8; 4096]).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(mem.0.as_slice()[4096..].iter().all(|&b| b == 0), "nothing landed after the drop");
        assert_eq!(landing.landed(), 0, "the WRITE never finished");
    }

    /// A refused access to a live window (past its end) fails a requester
    /// waiting on it at once, not after its wait.
    #[tokio::test]
    async fn a_refused_access_ends_the_wait_on_its_window() {
        let o = owner().await;
        let mem = region(1 << 16);
        let exp = o.expose(grant(mem.clone(), 0, 4096, Access::RemoteWrite)).unwrap();
        let remote = TcpRemote::new(1 << 20);
        let past = exp.token.with_transfer(exp.token.addr + 2048, 4096);
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![3u8; 4096]))]);
        assert!(remote.write_stream(&past, 4096, body).await.is_err());
        let started = std::time::Instant::now();
        assert_eq!(exp.settle(4096, WAIT).await, Err(crate::landing::Unsettled::Broke));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(mem.0.as_slice().iter().all(|&b| b == 0));
    }

    fn o_key(exp: &crate::transport::Exposure) -> crate::capability::Key {
        crate::capability::Key { rkey: exp.token.rkey, dct: exp.token.dct }
    }

    /// A refused eager WRITE whose payload never comes is answered within
    /// the discard wait, not held open.
    #[tokio::test]
    async fn a_refused_eager_write_without_payload_is_answered_in_time() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let o = owner().await;
        let addr = o.advertised();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let h = wire::Header {
            op: wire::Op::Write,
            key: crate::capability::Key { rkey: 1, dct: 2 },
            addr: 0x1000,
            len: 100_000,
            eager: true,
        };
        s.write_all(&h.encode()).await.unwrap();
        let started = std::time::Instant::now();
        let mut rb = [0u8; wire::REPLY_LEN];
        tokio::time::timeout(std::time::Duration::from_secs(10), s.read_exact(&mut rb)).await.unwrap().unwrap();
        assert_eq!(wire::decode_reply(&rb).status, wire::Status::Rejected as u8);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    /// Eager pieces of a WRITE split into many operations, from a file and
    /// from a stream of odd-sized chunks, land byte for byte.
    #[tokio::test]
    async fn eager_pieces_land_in_order() {
        use std::io::Write;
        let o = owner().await;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        let mut f = tempfile_in_tmp();
        f.write_all(&data).unwrap();
        let remote = TcpRemote::new(10_000);
        for round in 0..2 {
            let mem = region(1 << 20);
            let exp = o.expose(grant(mem.clone(), 100, data.len() as u64, Access::RemoteWrite)).unwrap();
            if round == 0 {
                let chunks: Vec<Result<Bytes, std::io::Error>> =
                    data.chunks(3333).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
                remote.write_stream(&exp.token, data.len() as u64, futures::stream::iter(chunks)).await.unwrap();
            } else {
                remote.write_file(&exp.token, &f, 0, data.len() as u64).await.unwrap();
            }
            exp.settle(data.len() as u64, WAIT).await.unwrap();
            assert_eq!(&mem.0.as_slice()[100..100 + data.len()], &data[..], "round {round}");
        }
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("sluice-tcp-test-{}", std::process::id()));
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
