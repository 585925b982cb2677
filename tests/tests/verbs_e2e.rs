//! End to end over the verbs RC transport, inside the Soft-RoCE VM:
//! shim -> agent -> gateway, the gateway RDMA-WRITEs into (GET) and
//! RDMA-READs from (PUT) the host region itself through rxe0.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use sluice_client::MemoryKind;
use sluice_tests::{pattern, sha256, Options, Stack};

fn ip() -> String {
    std::env::var("SLUICE_RXE_ADDR").unwrap_or_else(|_| "10.0.2.15".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_put_over_verbs() {
    assert!(
        std::path::Path::new("/sys/class/infiniband").exists(),
        "the verbs lane needs an RDMA device: run via scripts/rxe-vm"
    );
    let stack = Stack::with(Options {
        data_ns: "data_path = \"rdma\"\ntransport = \"verbs-rc\"".into(),
        // The agent is on the guest's NIC address, not loopback.
        gateway_rdma: format!("verbs = true\nallowed_clients = [\"{}/32\"]", ip()),
        agent_dataplane: format!("verbs_listen = \"{}\"", ip()),
        ..Default::default()
    });
    let c = stack.client().await;
    let r = c.register(8 << 20).await.unwrap();
    for (i, n) in [1usize, 4096, (3 << 20) + 5, (7 << 20) + 3].into_iter().enumerate() {
        let data = pattern(n, 700 + i as u64);
        r.write_at(0, &data).unwrap();
        let key = format!("verbs/obj-{n}");
        let t = c.put(&format!("data/{key}"), &r, 0, n as u64).await.unwrap();
        assert_eq!((t.data_path, t.fallback_reason.as_str()), ("rdma", ""), "PUT {n}: {}", stack.log("sluice-gateway"));
        let stored = std::fs::read(stack.stored_file("data", &key)).unwrap();
        assert_eq!(sha256(&stored), sha256(&data), "PUT {n} stored bytes");
        r.write_at(0, &vec![0; n]).unwrap();
        let g = c.get(&format!("data/{key}"), &r, 0, None).await.unwrap();
        assert_eq!((g.bytes, g.data_path, g.fallback_reason.as_str()), (n as u64, "rdma", ""), "GET {n}");
        assert_eq!(sha256(&r.as_slice()[..n]), sha256(&data), "GET {n} bytes");
    }
    // After the first GET the agent knew the gateway checks the size first:
    // the others went without a HEAD, over verbs, and none fell back.
    let log = stack.log("sluice-agent");
    assert!(log.contains("checks x-sluice-rdma-object-max before moving bytes"), "{log}");
    assert!(!log.contains("first part fell back"), "{log}");
    // A ranged GET lands at its offset.
    let data = pattern((3 << 20) + 5, 702);
    r.write_at(0, &vec![0xAB; 8 << 20]).unwrap();
    let g = c.get("data/verbs/obj-3145733", &r, 4096, Some((1000, Some(2 << 20)))).await.unwrap();
    assert_eq!((g.bytes, g.data_path), (2 << 20, "rdma"));
    assert_eq!(&r.as_slice()[4096..4096 + (2 << 20)], &data[1000..1000 + (2 << 20)]);
    assert_eq!(r.as_slice()[4095], 0xAB);
    // GPU memory: the agent probed rxe0, which cannot register dma-bufs
    // (its provider has no ibv_reg_dmabuf_mr), so GPU regions are not
    // offered (the shim refuses them up front) and the log says why.
    assert!(c.capabilities().agent_memory().all(|k| k != MemoryKind::GpuDmabuf));
    let log = stack.log("sluice-agent");
    assert!(
        log.contains("GPU memory (dma-buf) regions are not offered")
            && log.contains("cannot register dma-buf (GPU) memory"),
        "{log}"
    );
    println!("verbs e2e: 4 PUTs, 5 GETs over verbs RC on rxe0, bytes verified; GPU regions not offered on rxe0");
}

/// A namespace configured for mlx5 DC on rxe0 (which has no DC) falls back
/// to verbs RC, loudly, and still moves bytes one-sidedly and correctly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dc_namespace_falls_back_to_verbs_rc_on_soft_roce() {
    assert!(
        std::path::Path::new("/sys/class/infiniband").exists(),
        "the verbs lane needs an RDMA device: run via scripts/rxe-vm"
    );
    let stack = Stack::with(Options {
        data_ns: "data_path = \"rdma\"\ntransport = \"dc\"".into(),
        // The agent is on the guest's NIC address, not loopback.
        gateway_rdma: format!("verbs = true\nallowed_clients = [\"{}/32\"]", ip()),
        agent_dataplane: format!("verbs_listen = \"{}\"\n[dataplane.dc]\ndevice = \"rxe0\"", ip()),
        ..Default::default()
    });
    let c = stack.client().await;
    let r = c.register(4 << 20).await.unwrap();
    let data = pattern((2 << 20) + 9, 99);
    r.write_at(0, &data).unwrap();
    let t = c.put("data/dc/obj", &r, 0, data.len() as u64).await.unwrap();
    assert_eq!(t.data_path, "rdma", "{}", stack.log("sluice-agent"));
    assert!(t.fallback_reason.starts_with("dc_unavailable"), "{}", t.fallback_reason);
    assert!(t.fallback_reason.contains("Dynamically Connected"), "{}", t.fallback_reason);
    r.write_at(0, &vec![0; data.len()]).unwrap();
    let g = c.get("data/dc/obj", &r, 0, None).await.unwrap();
    assert_eq!((g.bytes, g.data_path), (data.len() as u64, "rdma"));
    assert_eq!(sha256(&r.as_slice()[..data.len()]), sha256(&data));
    assert_eq!(stack.metric("sluice_agent_fallbacks_total", &["reason=\"dc_unavailable\""]), 2.0);
    println!("dc fallback: PUT and GET over verbs RC after DC was refused by rxe0");
}
