//! Verbs tests on a real device: run inside the Soft-RoCE VM
//! (`scripts/rxe-vm`, see scripts/test). With the `rxe` feature on and no
//! device they fail; they never skip.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use sluice_rdma::{
    devices, Access, Buffer, CompletionQueue, Context, Listener, MemoryRegion, ProtectionDomain, QueuePair, RdmaError,
    DMABUF_UNSUPPORTED,
};

fn device() -> String {
    std::env::var("SLUICE_RXE_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

fn ip() -> Ipv4Addr {
    std::env::var("SLUICE_RXE_ADDR").ok().and_then(|a| a.parse().ok()).unwrap_or(Ipv4Addr::new(10, 0, 2, 15))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// An owner (listener side) with one registered region, and a connected
/// remote queue pair.
struct Pair {
    _listener: Arc<Listener>,
    owner_buf: Arc<Buffer>,
    owner_mr: Arc<MemoryRegion>,
    _owner_qp: QueuePair,
    qp: QueuePair,
}

async fn pair(len: usize) -> Pair {
    let listener = Arc::new(Listener::bind(SocketAddrV4::new(ip(), 0)).expect("rdma_cm listen (is rxe0 up?)"));
    let port = listener.port();
    let owner_buf = Buffer::zeroed(len);
    let owner_mr =
        MemoryRegion::register(listener.pd(), owner_buf.clone(), Access::REMOTE_ALL).expect("register owner MR");
    let l = listener.clone();
    let accept = tokio::spawn(async move { l.accept().await });
    let qp = QueuePair::connect(SocketAddrV4::new(ip(), port)).await.expect("rdma_cm connect");
    let owner_qp = tokio::time::timeout(Duration::from_secs(20), accept)
        .await
        .expect("accept in time")
        .expect("join")
        .expect("accept");
    Pair { _listener: listener, owner_buf, owner_mr, _owner_qp: owner_qp, qp }
}

fn local(qp: &QueuePair, data: &[u8]) -> Arc<MemoryRegion> {
    let b = Buffer::zeroed(data.len());
    b.write_at(0, data).expect("fill local buffer");
    MemoryRegion::register(qp.pd(), b, Access::LOCAL).expect("register local MR")
}

#[test]
fn device_context_pd_mr_cq() {
    let list = devices().expect("the rxe lane needs a verbs device: run via scripts/rxe-vm");
    assert!(list.iter().any(|d| d.name == device()), "{list:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _g = rt.enter();
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let buf = Buffer::zeroed(1 << 20);
    let mr = MemoryRegion::register(&pd, buf, Access::REMOTE_ALL).unwrap();
    assert_ne!(mr.rkey(), 0);
    assert_eq!(mr.len(), 1 << 20);
    let _cq = CompletionQueue::new(&ctx, 64).unwrap();
    assert!(matches!(Context::open("no-such-device"), Err(RdmaError::NoDevice(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rc_write_and_read() {
    let p = pair(1 << 20).await;
    let data = pattern(300_000, 7);
    let src = local(&p.qp, &data);
    let src =
        p.qp.write(src, 0, data.len() as u32, p.owner_mr.addr() + 4096, p.owner_mr.rkey())
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    let got = p.owner_buf.to_vec();
    assert_eq!(&got[4096..4096 + data.len()], &data[..]);
    assert!(got[..4096].iter().all(|&b| b == 0), "nothing written before the target");
    assert!(got[4096 + data.len()..].iter().all(|&b| b == 0), "nothing written after it");
    drop(src);

    let back = Buffer::zeroed(data.len());
    let dst = MemoryRegion::register(p.qp.pd(), back.clone(), Access::LOCAL).unwrap();
    p.qp.read(dst, 0, data.len() as u32, p.owner_mr.addr() + 4096, p.owner_mr.rkey())
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(back.to_vec(), data, "READ returns what WRITE placed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_lands_in_local_memory() {
    let p = pair(64 << 10).await;
    let data = pattern(50_000, 3);
    p.owner_buf.write_at(100, &data).unwrap();
    let buf = Buffer::zeroed(data.len());
    let mr = MemoryRegion::register(p.qp.pd(), buf.clone(), Access::LOCAL).unwrap();
    p.qp.read(mr, 0, data.len() as u32, p.owner_mr.addr() + 100, p.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
    assert_eq!(buf.to_vec(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rkey_is_an_error_completion() {
    let p = pair(64 << 10).await;
    let src = local(&p.qp, &[9u8; 1000]);
    let (err, _src) =
        p.qp.write(src, 0, 1000, p.owner_mr.addr(), p.owner_mr.rkey() ^ 0x5a5a).await.expect_err("bad rkey must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(p.owner_buf.to_vec().iter().all(|&b| b == 0), "nothing written");
}

/// One protection domain per tenant: tenant A's valid window and rkey,
/// used over tenant B's connection (another listener, another PD), is
/// refused by the device and nothing of A's changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rkey_of_another_protection_domain_is_refused() {
    let a = pair(64 << 10).await;
    let b = pair(64 << 10).await;
    let src = local(&b.qp, &[7u8; 4096]);
    let (err, _src) =
        b.qp.write(src, 0, 4096, a.owner_mr.addr(), a.owner_mr.rkey())
            .await
            .expect_err("A's rkey must not work over B's connection");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(a.owner_buf.to_vec().iter().all(|&x| x == 0), "nothing of A's written");
    // The same operation over A's own connection works.
    let src = local(&a.qp, &[7u8; 4096]);
    a.qp.write(src, 0, 4096, a.owner_mr.addr(), a.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
    assert_eq!(&a.owner_buf.to_vec()[..4096], &[7u8; 4096][..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_write_past_the_end_is_an_error() {
    let p = pair(64 << 10).await;
    let src = local(&p.qp, &[1u8; 4096]);
    let end = p.owner_mr.addr() + p.owner_mr.len();
    let op = p.qp.write(src, 0, 4096, end - 100, p.owner_mr.rkey());
    let (err, _) = tokio::time::timeout(Duration::from_secs(30), op)
        .await
        .expect("completes")
        .expect_err("past the end must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
    assert!(p.owner_buf.to_vec().iter().all(|&b| b == 0), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_read_before_the_start_is_an_error() {
    let p = pair(64 << 10).await;
    let dst = local(&p.qp, &[0u8; 10]);
    let op = p.qp.read(dst, 0, 10, p.owner_mr.addr() - 4096, p.owner_mr.rkey());
    let (err, _) = tokio::time::timeout(Duration::from_secs(30), op)
        .await
        .expect("completes")
        .expect_err("before the start must fail");
    assert!(matches!(err, RdmaError::Completion { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_bounds_are_checked_before_posting() {
    let p = pair(4096).await;
    let src = local(&p.qp, &[1u8; 100]);
    let (err, src) = p.qp.write(src, 50, 100, p.owner_mr.addr(), p.owner_mr.rkey()).await.expect_err("local overrun");
    assert!(matches!(err, RdmaError::Invalid(_)));
    // The buffer came back and the QP still works.
    p.qp.write(src, 0, 100, p.owner_mr.addr(), p.owner_mr.rkey()).await.map_err(|(e, _)| e).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_under_load_completes_every_request() {
    let p = pair(1 << 20).await;
    let qp = Arc::new(p.qp);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let qp = qp.clone();
        let (addr, rkey) = (p.owner_mr.addr(), p.owner_mr.rkey());
        let src = local(&qp, &[i as u8; 8192]);
        tasks.push(tokio::spawn(async move { qp.write(src, 0, 8192, addr + (i % 128) * 8192, rkey).await.is_ok() }));
    }
    // Tear the connection down while writes are in flight: each request
    // completes (done, or flushed with an error) instead of hanging.
    qp.close().unwrap();
    let results = tokio::time::timeout(Duration::from_secs(60), futures_join(tasks))
        .await
        .expect("every request completes (no hang)");
    assert_eq!(results.len(), 64);
    let src = local(&qp, &[0u8; 16]);
    let late =
        tokio::time::timeout(Duration::from_secs(30), qp.write(src, 0, 16, p.owner_mr.addr(), p.owner_mr.rkey()))
            .await
            .expect("no hang");
    assert!(late.is_err(), "a closed queue pair accepts no work");
}

async fn futures_join(tasks: Vec<tokio::task::JoinHandle<bool>>) -> Vec<bool> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or(false));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_on_a_device_without_dc_is_a_clear_error() {
    // Soft-RoCE has no mlx5 DC: creating a DC target must say so.
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    match sluice_rdma::dc::DcTarget::create(&pd, &cq, sluice_rdma::dc::DEFAULT_DC_KEY, 1, 1) {
        Err(RdmaError::Unsupported(msg)) => assert!(msg.contains("Dynamically Connected"), "{msg}"),
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("rxe unexpectedly created a DC target"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_initiator_on_a_device_without_dc_is_a_clear_error() {
    let ctx = Context::open(&device()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    match sluice_rdma::dci::DcInitiator::create(&pd, 1, 1, sluice_rdma::dc::DEFAULT_DC_KEY) {
        Err(RdmaError::Unsupported(msg)) => assert!(msg.contains("Dynamically Connected"), "{msg}"),
        Err(e) => panic!("expected Unsupported, got {e}"),
        Ok(_) => panic!("rxe unexpectedly created a DC initiator"),
    }
}

/// What a DC target would put in its token: the port's LID and the RoCE v2
/// GID carrying the device's IPv4 address.
#[test]
fn port_and_gid_table() {
    let ctx = Context::open(&device()).unwrap();
    let port = ctx.port(1).expect("query port 1");
    assert!(port.active, "rxe0 port 1 is not active");
    assert!(port.max_message >= 1 << 20, "max message {}", port.max_message);
    assert!(port.gid_table_len > 0);
    let gids = ctx.gids(1).expect("GID table");
    let picked = sluice_rdma::pick_ipv4_gid(&gids, Some(ip())).expect("a GID for the device's IPv4 address");
    assert_eq!(picked.ipv4(), Some(ip()));
    assert!(picked.roce_v2, "rxe exposes RoCE v2 GIDs: {gids:?}");
    // An address handle to ourselves over that GID can be created.
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let at = sluice_rdma::dc::DcAddress { dct_number: 1, lid: port.lid, gid: Some(picked.gid) };
    sluice_rdma::dci::AddressHandle::create(&pd, &at, 1, picked.index).expect("address handle from a token's address");
}

/// A real dma-buf in the guest: a vgem (virtual GEM) dumb buffer exported
/// with DRM PRIME. The lane's Debian 6.1 kernel has no udmabuf
/// (`CONFIG_UDMABUF` is not set) but builds vgem as a module, which
/// scripts/vm/guest.sh loads. Returns the dma-buf and its size.
fn vgem_dmabuf(len: u32) -> Result<(std::os::fd::OwnedFd, u64), String> {
    use std::os::fd::{AsRawFd, FromRawFd};
    #[repr(C)]
    struct CreateDumb {
        height: u32,
        width: u32,
        bpp: u32,
        flags: u32,
        handle: u32,
        pitch: u32,
        size: u64,
    }
    #[repr(C)]
    struct PrimeHandle {
        handle: u32,
        flags: u32,
        fd: i32,
    }
    // DRM_IOWR(0xB2, struct drm_mode_create_dumb) and
    // DRM_IOWR(0x2d, struct drm_prime_handle) from <drm/drm.h>.
    const DRM_IOCTL_MODE_CREATE_DUMB: u64 = 0xC020_64B2;
    const DRM_IOCTL_PRIME_HANDLE_TO_FD: u64 = 0xC00C_642D;

    let dir = "/sys/devices/platform/vgem/drm";
    let card = std::fs::read_dir(dir)
        .map_err(|e| format!("{dir}: {e} (is the vgem module loaded?)"))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .find(|n| n.starts_with("card"))
        .ok_or_else(|| format!("{dir} lists no card"))?;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/dri/{card}"))
        .map_err(|e| format!("/dev/dri/{card}: {e}"))?;
    // 1024 pixels of 4 bytes per row: `len / 4096` rows.
    let mut dumb = CreateDumb { height: len / 4096, width: 1024, bpp: 32, flags: 0, handle: 0, pitch: 0, size: 0 };
    // SAFETY: the request number matches the struct, whose layout is the
    // kernel's; the kernel writes handle, pitch and size into it.
    if unsafe { libc::ioctl(dev.as_raw_fd(), DRM_IOCTL_MODE_CREATE_DUMB as _, &mut dumb) } != 0 {
        return Err(format!("DRM_IOCTL_MODE_CREATE_DUMB: {}", std::io::Error::last_os_error()));
    }
    let mut prime = PrimeHandle { handle: dumb.handle, flags: (libc::O_CLOEXEC | libc::O_RDWR) as u32, fd: -1 };
    // SAFETY: as above; the kernel writes a new descriptor into `fd`.
    if unsafe { libc::ioctl(dev.as_raw_fd(), DRM_IOCTL_PRIME_HANDLE_TO_FD as _, &mut prime) } != 0 || prime.fd < 0 {
        return Err(format!("DRM_IOCTL_PRIME_HANDLE_TO_FD: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just made for us and nobody else owns.
    // (The dma-buf keeps the buffer alive after `dev` closes.)
    Ok((unsafe { std::os::fd::OwnedFd::from_raw_fd(prime.fd) }, dumb.size))
}

/// GPU memory's registration path on a real device with a real dma-buf:
/// either the device registers it — then a remote WRITE lands in it and a
/// READ returns it — or it says clearly that it cannot, and the probe the
/// agent relies on agrees. Soft-RoCE takes the second branch (its provider
/// has no `ibv_reg_dmabuf_mr`); the first has not run anywhere yet (it
/// needs a NIC that registers dma-bufs, e.g. mlx5, with this test pointed
/// at it through SLUICE_RXE_DEVICE/SLUICE_RXE_ADDR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dmabuf_regions_are_registered_or_refused_clearly() {
    use std::os::fd::AsFd;
    const LEN: u32 = 64 << 10;
    let p = pair(LEN as usize).await;
    let pd = p._listener.pd();
    let (fd, size) = vgem_dmabuf(LEN).expect("the lane makes a real dma-buf with vgem");
    let fd = Arc::new(fd);
    // The checks the shim and the agent run pass a real dma-buf...
    let info = sluice_shm::check_dmabuf(fd.as_fd(), 0, u64::from(LEN)).expect("a real dma-buf passes the checks");
    assert_eq!(info.size, size);
    assert!(!info.exporter.is_empty(), "{info:?}");
    // ...and refuse windows outside it, as the wrapper does before asking
    // the device.
    assert!(sluice_shm::check_dmabuf(fd.as_fd(), 4096, size).is_err());
    let iova = 0x7f00_0000_0000u64;
    for (offset, len, at) in [(0, 0, iova), (4096, size as usize, iova), (0, 4096, iova + 8)] {
        match MemoryRegion::register_dmabuf(pd, &fd, offset, len, at, Access::REMOTE_ALL) {
            Err(RdmaError::Invalid(_)) => {}
            other => panic!("{offset}+{len} at {at:#x}: {other:?}"),
        }
    }

    let probe = pd.probe_dmabuf();
    match MemoryRegion::register_dmabuf(pd, &fd, 0, LEN as usize, iova, Access::REMOTE_ALL) {
        Err(RdmaError::Unsupported(m)) => {
            assert!(m.starts_with(DMABUF_UNSUPPORTED) && m.contains(&device()), "{m}");
            let e = probe.expect_err("the probe agrees: this device cannot register dma-bufs");
            assert!(e.to_string().starts_with(DMABUF_UNSUPPORTED), "{e}");
            println!("dma-buf ({}) MR on {}: refused clearly ({m}); the probe agrees", info.exporter, device());
        }
        Ok(mr) => {
            probe.expect("the probe agrees: this device registers dma-bufs");
            assert_eq!((mr.addr(), mr.len()), (iova, u64::from(LEN)));
            let data = pattern(10_000, 5);
            let src = local(&p.qp, &data);
            p.qp.write(src, 0, data.len() as u32, mr.addr() + 100, mr.rkey()).await.map_err(|(e, _)| e).unwrap();
            let back = Buffer::zeroed(data.len());
            let dst = MemoryRegion::register(p.qp.pd(), back.clone(), Access::LOCAL).unwrap();
            p.qp.read(dst, 0, data.len() as u32, mr.addr() + 100, mr.rkey()).await.map_err(|(e, _)| e).unwrap();
            assert_eq!(back.to_vec(), data, "READ returns what WRITE placed in the dma-buf");
            println!("dma-buf MR on {}: WRITE then READ through it verified", device());
        }
        Err(e) => panic!("neither registered nor a clear refusal: {e}"),
    }
}
