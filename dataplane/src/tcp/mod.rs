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
        assert_eq!(&mem.0.as_slice()[1000..1000 + data.len()], &data[..]);
        assert_eq!(mem.0.as_slice()[999], 0);

        let exp = o.expose(grant(mem.clone(), 1000, data.len() as u64, Access::RemoteRead)).unwrap();
        let back: Vec<Bytes> = remote.read_stream(&exp.token, data.len() as u64).try_collect().await.unwrap();
        assert_eq!(back.concat(), data);
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
}
