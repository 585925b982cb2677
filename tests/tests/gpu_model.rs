//! GPU regions through the Rust client against a real stack, with the CUDA
//! driver replaced by the host model (`sluice_cuda::HostModel`): device
//! memory is host memory, and copies happen only when a stream or event is
//! synchronized, so a staging half reused before its copy finished would
//! corrupt the bytes checked here. No GPU is used or needed: the model
//! stands in, explicitly. The same client code runs against libcuda on a
//! GPU machine.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::process::Command;
use std::sync::Arc;

use sluice_client::cuda::{Cuda, HostModel};
use sluice_client::{Client, ClientError, Code, GpuBatchGet, GpuOptions, GpuRegion, PinRegions};
use sluice_tests::{bin, pattern, Stack};

/// Lanes of two 1 MiB halves: the objects below cross several.
const LANE: u64 = 2 << 20;

async fn gpu_client(stack: &Stack, model: &Arc<HostModel>, staging_lanes: u64) -> Client {
    let opts = GpuOptions {
        cuda: Some(Cuda::new(model.clone())),
        lane_bytes: LANE,
        staging_bytes: staging_lanes * LANE,
        ..Default::default()
    };
    Client::connect_with(&stack.socket, opts).await.unwrap()
}

async fn put_bytes(c: &Client, path: &str, data: &[u8]) {
    let r = c.register(data.len().max(1) as u64).await.unwrap();
    r.write_at(0, data).unwrap();
    c.put(path, &r, 0, data.len() as u64).await.unwrap();
    c.release(r).await.unwrap();
}

async fn get_bytes(c: &Client, path: &str, len: usize) -> Vec<u8> {
    let r = c.register(len.max(1) as u64).await.unwrap();
    let t = c.get(path, &r, 0, None).await.unwrap();
    let out = r.as_slice()[..t.bytes as usize].to_vec();
    c.release(r).await.unwrap();
    out
}

fn item<'a>(path: String, region: &'a GpuRegion, offset: u64) -> GpuBatchGet<'a> {
    GpuBatchGet { path, region, offset, range: None, max_bytes: 0, if_match: String::new() }
}

fn code(e: &ClientError) -> Option<Code> {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_crosses_several_halves_into_gpu_memory_byte_exact() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = gpu_client(&stack, &model, 4).await;
    let data = pattern(5 * (1 << 20) + 12345, 1);
    put_bytes(&c, "data/gpu/big", &data).await;
    let ptr = model.alloc(data.len() + 100, 0);
    let g = c.register_gpu(ptr, data.len() as u64 + 100, None).unwrap();

    let t = c.get_gpu("data/gpu/big", &g, 100, None, "").await.unwrap();
    assert_eq!((t.transfer.bytes, t.transfer.object_size), (data.len() as u64, data.len() as u64));
    assert!(!t.transfer.etag.is_empty() && t.transfer.parts >= 6, "{t:?}");
    assert_eq!(t.copies, 6, "one copy per 1 MiB half");
    assert!(model.read(ptr + 100, data.len()).unwrap() == data, "the GPU holds the object");

    // A range, at another offset.
    model.write(ptr, &[0; 100]).unwrap();
    let t = c.get_gpu("data/gpu/big", &g, 7, Some((1_500_000, Some(2_000_000))), "").await.unwrap();
    assert_eq!(t.transfer.bytes, 2_000_000);
    assert!(model.read(ptr + 7, 2_000_000).unwrap() == data[1_500_000..3_500_000]);
    // A range to the end, and the object pinned to its version.
    let t = c.get_gpu("data/gpu/big", &g, 0, Some((5 << 20, None)), &t.transfer.etag).await.unwrap();
    assert_eq!(t.transfer.bytes, 12345);
    assert!(model.read(ptr, 12345).unwrap() == data[5 << 20..]);
    let e = c.get_gpu("data/gpu/big", &g, 0, None, "\"not-the-etag\"").await.unwrap_err();
    assert_eq!(code(&e), Some(Code::PreconditionFailed), "{e}");
    // An empty object.
    put_bytes(&c, "data/gpu/empty", &[]).await;
    assert_eq!(c.get_gpu("data/gpu/empty", &g, 0, None, "").await.unwrap().transfer.bytes, 0);

    assert_eq!(model.unpinned_copies(), 0, "every copy came from pinned staging");
    assert_eq!(model.queued(), 0, "nothing is left on a stream once a GET returns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_does_not_fit_writes_nothing_to_the_gpu() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = gpu_client(&stack, &model, 4).await;
    put_bytes(&c, "data/gpu/fit", &pattern(3 << 20, 2)).await;
    let ptr = model.alloc(2 << 20, 0);
    model.write(ptr, &vec![0xEE; 2 << 20]).unwrap();
    let g = c.register_gpu(ptr, 2 << 20, Some(0)).unwrap();
    let copies = model.copies();

    let e = c.get_gpu("data/gpu/fit", &g, 0, None, "").await.unwrap_err();
    assert_eq!(code(&e), Some(Code::RegionTooSmall), "{e}");
    assert!(e.to_string().contains("3145728 bytes do not fit the 2097152 bytes"), "{e}");
    // ... also where the room ends before the region does (an offset).
    let e = c.get_gpu("data/gpu/fit", &g, (2 << 20) - 10, Some((0, Some(11))), "").await.unwrap_err();
    assert_eq!(code(&e), Some(Code::RegionTooSmall), "{e}");
    let e = c.get_gpu("data/gpu/fit", &g, (2 << 20) + 1, None, "").await.unwrap_err();
    assert_eq!(code(&e), Some(Code::OutOfBounds), "{e}");
    let e = c.get_gpu("data/gpu/missing", &g, 0, None, "").await.unwrap_err();
    assert_eq!(code(&e), Some(Code::NoSuchKey), "{e}");
    assert_eq!(model.copies(), copies, "no copy was made");
    assert!(model.read(ptr, 2 << 20).unwrap().iter().all(|b| *b == 0xEE), "the GPU region is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn put_reads_from_gpu_memory_small_and_larger_than_a_lane() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = gpu_client(&stack, &model, 4).await;
    for (n, tag) in [(300_000usize, "small"), (3 * LANE as usize + 17, "large")] {
        let data = pattern(n, n as u64);
        let ptr = model.alloc(n + 10, 0);
        model.write(ptr + 10, &data).unwrap();
        let g = c.register_gpu(ptr, n as u64 + 10, None).unwrap();
        let t = c.put_gpu(&format!("data/gpu/put-{tag}"), &g, 10, None, "application/octet-stream").await.unwrap();
        assert_eq!(t.transfer.bytes, n as u64, "{tag}");
        assert_eq!(t.copies as usize, n.div_ceil(LANE as usize / 2), "{tag}: pieces of a half");
        assert!(get_bytes(&c, &format!("data/gpu/put-{tag}"), n).await == data, "{tag}");
        let e = c.put_gpu("data/gpu/oob", &g, 10, Some(n as u64 + 1), "").await.unwrap_err();
        assert_eq!(code(&e), Some(Code::BadRequest), "{e}");
    }
    assert_eq!(model.unpinned_copies(), 0);
    // The large PUT's own pinned region is gone again: only lanes stay pinned.
    assert!(model.pinned().iter().all(|(_, n)| *n as u64 == LANE), "{:?}", model.pinned());
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.regions, 1, "one lane stays registered; the large PUT's region was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_many_fills_a_gpu_batch_and_fails_only_bad_items() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = gpu_client(&stack, &model, 4).await;
    // Slots of 300 kB: three items to a 1 MiB lane half, so the batch takes
    // three halves and alternates between them.
    let sizes = [1000usize, 70_000, 4096, 0, 250_000, 123, 65_536, 200_000];
    let objs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, n)| pattern(*n, 100 + i as u64)).collect();
    for (i, d) in objs.iter().enumerate() {
        put_bytes(&c, &format!("data/gpu/m{i}"), d).await;
    }
    let big = pattern(1_500_000, 99);
    put_bytes(&c, "data/gpu/big", &big).await;
    let slot = 300_000u64;
    let ptr = model.alloc(slot as usize * sizes.len(), 0);
    let g = c.register_gpu(ptr, slot * sizes.len() as u64, None).unwrap();
    let mut items: Vec<GpuBatchGet> =
        (0..sizes.len()).map(|i| item(format!("data/gpu/m{i}"), &g, i as u64 * slot)).collect();
    items.push(item("data/gpu/nope".into(), &g, 0)); // missing: fails alone
    let small = model.alloc(600, 0);
    let g2 = c.register_gpu(small, 600, None).unwrap();
    let mut ranged = item("data/gpu/big".into(), &g2, 10); // a range, into another region
    ranged.range = Some((1000, Some(500)));
    items.push(ranged);
    // Bigger than a half: read on its own, half by half.
    let alone = model.alloc(big.len(), 0);
    let g3 = c.register_gpu(alone, big.len() as u64, None).unwrap();
    items.push(item("data/gpu/big".into(), &g3, 0));
    let copies = model.copies();
    let res = c.get_many_gpu(&items).await.unwrap();
    assert_eq!(res.len(), items.len());
    for (i, d) in objs.iter().enumerate() {
        let t = res[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        assert_eq!(t.bytes, d.len() as u64, "item {i}");
        assert!(model.read(ptr + i as u64 * slot, d.len()).unwrap() == *d, "item {i}");
    }
    let e = res[sizes.len()].as_ref().unwrap_err();
    assert_eq!(code(e), Some(Code::NoSuchKey), "{e}");
    assert_eq!(res[sizes.len() + 1].as_ref().unwrap().bytes, 500);
    assert!(model.read(small + 10, 500).unwrap() == big[1000..1500]);
    assert_eq!(res[sizes.len() + 2].as_ref().unwrap().bytes, big.len() as u64);
    assert!(model.read(alone, big.len()).unwrap() == big);
    // One copy per non-empty batched item, two for the item read alone.
    assert_eq!(model.copies() - copies, 7 + 1 + 2);

    // An item bigger than its room (up to the next item) fails, typed; the
    // next item's bytes stay; one past the region's end has no room at all.
    put_bytes(&c, "data/gpu/toolarge", &pattern(2 * slot as usize, 7)).await;
    model.write(ptr, &vec![0xAB; slot as usize]).unwrap();
    let res = c
        .get_many_gpu(&[
            item("data/gpu/toolarge".into(), &g, 0),
            item("data/gpu/m1".into(), &g, slot),
            item("data/gpu/m1".into(), &g, slot * sizes.len() as u64),
            GpuBatchGet { max_bytes: 100, ..item("data/gpu/m1".into(), &g, 3 * slot) },
        ])
        .await
        .unwrap();
    assert_eq!(code(res[0].as_ref().unwrap_err()), Some(Code::RegionTooSmall));
    assert!(model.read(ptr, slot as usize).unwrap().iter().all(|b| *b == 0xAB), "nothing of it was written");
    assert!(res[1].is_ok() && model.read(ptr + slot, sizes[1]).unwrap() == objs[1]);
    assert_eq!(code(res[2].as_ref().unwrap_err()), Some(Code::RegionTooSmall));
    assert_eq!(code(res[3].as_ref().unwrap_err()), Some(Code::RegionTooSmall), "max_bytes bounds an item");
    assert_eq!(model.unpinned_copies(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_gets_share_a_small_staging_budget() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = Arc::new(gpu_client(&stack, &model, 2).await);
    let objs: Vec<Vec<u8>> = (0..6).map(|i| pattern(3 * (1 << 20) + 1000 * i, 200 + i as u64)).collect();
    for (i, d) in objs.iter().enumerate() {
        put_bytes(&c, &format!("data/gpu/c{i}"), d).await;
    }
    let ptrs: Vec<u64> = objs.iter().map(|d| model.alloc(d.len(), 0)).collect();
    let mut tasks = Vec::new();
    for (i, (d, ptr)) in objs.iter().zip(&ptrs).enumerate() {
        let (c, len, ptr) = (c.clone(), d.len() as u64, *ptr);
        tasks.push(tokio::spawn(async move {
            let g = c.register_gpu(ptr, len, None).unwrap();
            c.get_gpu(&format!("data/gpu/c{i}"), &g, 0, None, "").await.map(|t| t.transfer.bytes)
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(t.await.unwrap().unwrap(), objs[i].len() as u64);
        assert!(model.read(ptrs[i], objs[i].len()).unwrap() == objs[i], "object {i}");
    }
    let lanes = model.pinned().len();
    assert!((1..=2).contains(&lanes), "no more lanes than the budget: {lanes}");
    assert_eq!(c.stats().await.unwrap().regions as usize, lanes);
}

/// A GET dropped half-way (a timeout around it) may leave the agent writing
/// into its lane: that lane is never reused, its region is released with
/// the shim on the next request, and later GETs are byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_get_never_hands_its_lane_to_the_next() {
    let stack = Stack::start();
    let model = HostModel::new(1);
    let c = gpu_client(&stack, &model, 2).await;
    let data = pattern(4 << 20, 31);
    put_bytes(&c, "data/gpu/cancel", &data).await;
    let ptr = model.alloc(data.len(), 0);
    let g = c.register_gpu(ptr, data.len() as u64, None).unwrap();
    let mut cancelled = 0;
    for us in [50u64, 200, 500, 1000, 2000, 4000, 8000] {
        let get = c.get_gpu("data/gpu/cancel", &g, 0, None, "");
        if tokio::time::timeout(std::time::Duration::from_micros(us), get).await.is_err() {
            cancelled += 1;
        }
    }
    assert!(cancelled > 0, "no GET was cancelled: the test proves nothing");
    model.write(ptr, &vec![0; data.len()]).unwrap();
    assert_eq!(c.get_gpu("data/gpu/cancel", &g, 0, None, "").await.unwrap().transfer.bytes, data.len() as u64);
    assert!(model.read(ptr, data.len()).unwrap() == data);
    // Only live lanes stay registered and pinned. A registration the shim
    // answered after its caller gave up is released at the next one: keep
    // registering (and releasing) until that answer has come, 2 s at most.
    let lanes = model.pinned().len();
    assert!((1..=2).contains(&lanes), "{lanes}");
    let t0 = std::time::Instant::now();
    loop {
        let r = c.register(4096).await.unwrap();
        c.release(r).await.unwrap();
        let regions = c.stats().await.unwrap().regions as usize;
        if regions == lanes {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "{regions} regions registered, {lanes} lanes");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn bad_gpu_memory_is_refused() {
    let stack = Stack::start();
    let model = HostModel::new(2);
    let c = gpu_client(&stack, &model, 4).await;
    let ptr = model.alloc(4096, 0);
    let bad = |r: Result<GpuRegion, ClientError>, what: &str| {
        let e = r.unwrap_err();
        assert_eq!(code(&e), Some(Code::BadRequest), "{e}");
        assert!(e.to_string().contains(what), "{e}");
    };
    // Never allocated here (another process's address, or garbage).
    bad(c.register_gpu(0x7F00_DEAD_0000, 4096, None), "not GPU memory of this process");
    // Freed.
    let freed = model.alloc(4096, 0);
    model.free(freed);
    bad(c.register_gpu(freed, 4096, None), "not GPU memory of this process");
    // Past the end of its allocation.
    bad(c.register_gpu(ptr + 100, 4096, None), "run past the end");
    // Described as on another device.
    bad(c.register_gpu(ptr, 4096, Some(1)), "not cuda:1");
    bad(c.register_gpu(ptr, 0, None), "at least one byte");
    // Host memory, even pinned (CUDA knows it), is not GPU memory.
    let host = c.register(4096).await.unwrap();
    assert!(host.is_pinned());
    assert_eq!(model.pinned().len(), 1);
    let host_addr = model.pinned()[0].0 as u64;
    bad(c.register_gpu(host_addr, 16, None), "is host memory");
    // A region on device 1 goes through device 1's lanes.
    let on1 = model.alloc(LANE as usize, 1);
    put_bytes(&c, "data/gpu/dev1", &pattern(1 << 20, 9)).await;
    let g1 = c.register_gpu(on1, LANE, Some(1)).unwrap();
    assert_eq!(c.get_gpu("data/gpu/dev1", &g1, 0, None, "").await.unwrap().transfer.bytes, 1 << 20);
    assert!(model.read(on1, 1 << 20).unwrap() == pattern(1 << 20, 9));
}

#[tokio::test]
async fn without_cuda_gpu_memory_is_unsupported_and_host_regions_work() {
    let stack = Stack::start();
    let opts = GpuOptions { libcuda: Some("/nonexistent/libcuda.so.1".into()), ..Default::default() };
    let c = Client::connect_with(&stack.socket, opts).await.unwrap();
    let e = c.register_gpu(0x1000, 16, None).unwrap_err();
    assert_eq!(code(&e), Some(Code::Unsupported), "{e}");
    assert!(e.to_string().starts_with("no CUDA driver: /nonexistent/libcuda.so.1"), "{e}");
    // Host regions still work, unpinned (this process does not use CUDA).
    let r = c.register(4096).await.unwrap();
    assert!(!r.is_pinned());
    put_bytes(&c, "data/gpu/plain", b"plain").await;
    assert_eq!(c.get("data/gpu/plain", &r, 0, None).await.unwrap().bytes, 5);
    // Asking to pin always, with no CUDA, fails the registration clearly
    // and leaves no region behind.
    let opts = GpuOptions {
        libcuda: Some("/nonexistent/libcuda.so.1".into()),
        pin_regions: PinRegions::Always,
        ..Default::default()
    };
    let c2 = Client::connect_with(&stack.socket, opts).await.unwrap();
    let e = c2.register(4096).await.unwrap_err();
    assert_eq!(code(&e), Some(Code::Unsupported), "{e}");
    assert_eq!(c2.stats().await.unwrap().regions, 0);
}

#[tokio::test]
async fn host_regions_are_pinned_once_when_cuda_is_in_use() {
    let stack = Stack::start();
    for (active, mode, expect) in [
        (true, PinRegions::Auto, true),
        (false, PinRegions::Auto, false),
        (true, PinRegions::Never, false),
        (false, PinRegions::Always, true),
    ] {
        let model = HostModel::new(1);
        model.set_context_active(0, active);
        let opts = GpuOptions { cuda: Some(Cuda::new(model.clone())), pin_regions: mode, ..Default::default() };
        let c = Client::connect_with(&stack.socket, opts).await.unwrap();
        let r = c.register(1 << 20).await.unwrap();
        assert_eq!(r.is_pinned(), expect, "{active} {mode:?}");
        assert_eq!(model.pinned().len(), usize::from(expect));
        c.release(r).await.unwrap();
        assert!(model.pinned().is_empty(), "a released region is unpinned");
        let _kept = c.register(1 << 20).await.unwrap();
        drop(c);
        drop(_kept);
        assert!(model.pinned().is_empty(), "nothing stays pinned once the client and its regions are gone");
    }
}

/// `sluice get/put --gpu` and `sluice doctor` with the host model standing
/// in for CUDA (SLUICE_CUDA=host-model), and with no CUDA at all.
#[tokio::test]
async fn the_cli_reads_into_and_writes_from_a_gpu() {
    let stack = Stack::start();
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(3 * (1 << 20) + 5, 11);
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let sluice = |env: &[(&str, &str)], args: &[&str]| {
        let out = Command::new(bin("sluice"))
            .args(["--socket", stack.socket.to_str().unwrap()])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let model = [("SLUICE_CUDA", "host-model")];
    let (ok, out, err) = sluice(&model, &["--json", "put", "--gpu", "0", src.to_str().unwrap(), "data/gpu/cli"]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["bytes"].as_u64(), v["device"].as_u64()), (Some(data.len() as u64), Some(0)), "{v}");
    assert!(v["copies"].as_u64().unwrap() >= 1, "{v}");

    let back = dir.path().join("back.bin");
    let (ok, out, err) = sluice(&model, &["--json", "get", "--gpu", "0", "data/gpu/cli", back.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["bytes"].as_u64(), Some(data.len() as u64), "{v}");
    assert!(std::fs::read(&back).unwrap() == data, "the bytes came back from the GPU intact");
    // --verify compares instead of writing.
    let (ok, out, err) = sluice(&model, &["get", "--gpu", "0", "--verify", "data/gpu/cli", src.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(err.contains("cuda:0") && err.contains("copies") && err.contains("matches"), "{err}");
    std::fs::write(&back, pattern(data.len(), 12)).unwrap();
    let (ok, _, err) = sluice(&model, &["get", "--gpu", "0", "--verify", "data/gpu/cli", back.to_str().unwrap()]);
    assert!(!ok && err.contains("differ"), "{err}");
    // A range.
    let (ok, out, err) =
        sluice(&model, &["--json", "get", "--gpu", "0", "--range", "10-19", "data/gpu/cli", back.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert_eq!(std::fs::read(&back).unwrap(), data[10..20]);
    // A device the machine does not have.
    let (ok, _, err) = sluice(&model, &["get", "--gpu", "3", "data/gpu/cli"]);
    assert!(!ok && err.contains("no CUDA device 3"), "{err}");

    // Without CUDA: a clear refusal, and doctor still passes.
    let none = [("SLUICE_LIBCUDA", "/nonexistent/libcuda.so.1")];
    let (ok, _, err) = sluice(&none, &["get", "--gpu", "0", "data/gpu/cli"]);
    assert!(!ok && err.contains("no CUDA driver"), "{err}");
    let (ok, _, err) = sluice(&none, &["put", "--gpu", "0", src.to_str().unwrap(), "data/gpu/x"]);
    assert!(!ok && err.contains("no CUDA driver"), "{err}");
    let (ok, out, err) = sluice(&none, &["--json", "doctor"]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let gpu = v["checks"].as_array().unwrap().iter().find(|c| c["check"] == "gpu: CUDA driver").unwrap();
    assert!(
        gpu["ok"] == true && gpu["detail"].as_str().unwrap().starts_with("no CUDA driver: GPU regions unavailable"),
        "{gpu}"
    );

    // With the model: devices, the pinned round trip, the paths.
    let (ok, out, err) = sluice(&model, &["doctor"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("gpu 0: host model GPU 0: host register yes, GPUDirect RDMA no, dma-buf yes"), "{out}");
    assert!(out.contains("gpu 0: pinned round trip"), "{out}");
    assert!(out.contains("gpu paths: client staging (copy engines)"), "{out}");
}
