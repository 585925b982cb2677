//! The safe wrapper against the DOCA test model (`doca/model`: a C test
//! double written from the public API reference, not NVIDIA DOCA). These
//! tests check the wrapper's call sequences, ownership and error mapping;
//! that real DOCA behaves like the model is validated only on hardware.

use std::sync::Arc;

use doca_sys::DocaErrorCode;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sluice_doca::{model, Access, AesGcmEngine, Device, DeviceInfo, DmaEngine, Error, Mmap, Staging};
use sluice_rdma::{Buffer, PinnedMemory};

fn device() -> Arc<Device> {
    Device::open(&model::load(), "03:00.0").expect("the model's device")
}

fn code(e: &Error) -> DocaErrorCode {
    e.code().unwrap_or_else(|| panic!("expected a DOCA code, got {e:?}"))
}

#[test]
fn devices_are_listed_and_opened_by_pci_address_or_name() {
    let lib = model::load();
    let devs = sluice_doca::list(&lib).expect("list");
    assert_eq!(devs, vec![DeviceInfo { pci: "0000:03:00.0".into(), ibdev: "mlx5_0".into() }]);
    for sel in ["03:00.0", "0000:03:00.0", "mlx5_0"] {
        assert_eq!(Device::open(&lib, sel).expect(sel).info().ibdev, "mlx5_0");
    }
    match Device::open(&lib, "mlx5_9") {
        Err(e @ Error::NoDevice { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("mlx5_9") && msg.contains("0000:03:00.0 (mlx5_0)"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(Device::open(&lib, "04:00.0"), Err(Error::NoDevice { .. })));
}

#[test]
fn a_pci_export_is_imported_and_reached_with_dma() {
    let dev = device();
    // The "host" side: pinned memory exported for PCI access.
    let host = Buffer::zeroed(1 << 20);
    let pinned: Arc<dyn PinnedMemory> = host.clone();
    let exported = Mmap::pinned(&dev, pinned, Access::PCI_READ_WRITE).expect("host mmap");
    let desc = exported.export_pci().expect("export_pci");
    // The "DPU" side: import it, then copy through a staging buffer.
    let imported = Mmap::import(&dev, &desc).expect("import");
    assert_eq!((imported.addr(), imported.len()), (host.as_ptr() as usize, 1 << 20));
    let mut dma = DmaEngine::new(&dev).expect("dma engine");
    let mut staging = Staging::new(&dev, 64 << 10, Access::LOCAL_READ_WRITE).expect("staging");
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + 3) as u8).collect();
    staging.write(0, &data).expect("stage");
    dma.copy(staging.mmap(), 0, &imported, 123_456, data.len()).expect("DMA to the host");
    let mut landed = vec![0u8; data.len()];
    host.read_at(123_456, &mut landed).expect("read host");
    assert_eq!(landed, data);
    // And back: host -> staging.
    host.write_at(9, b"from the host").expect("write host");
    dma.copy(&imported, 9, staging.mmap(), 100, 13).expect("DMA from the host");
    let mut out = [0u8; 13];
    staging.read(100, &mut out).expect("read staging");
    assert_eq!(&out, b"from the host");
    // The import can be re-exported for RDMA peers (the host's export
    // allowed RDMA writes); an mmap without RDMA access cannot.
    let host2 = Buffer::zeroed(4096);
    let rdma_ok = Mmap::pinned(&dev, host2, Access::PCI_READ_WRITE.and(Access::RDMA_WRITE)).expect("mmap");
    let reimported = Mmap::import(&dev, &rdma_ok.export_pci().expect("export")).expect("import");
    assert!(!reimported.export_rdma().expect("export_rdma of an import").is_empty());
    let e = staging.mmap().export_rdma().expect_err("no RDMA access");
    assert_eq!(code(&e), DocaErrorCode::NotPermitted, "{e}");
    // Out of range: refused before DOCA sees it.
    assert!(matches!(dma.copy(staging.mmap(), 0, &imported, (1 << 20) - 10, 11), Err(Error::Invalid(_))));
    assert!(matches!(dma.copy(staging.mmap(), 64 << 10, &imported, 0, 1), Err(Error::Invalid(_))));
    drop((imported, exported));
}

#[test]
fn export_and_import_failures_are_typed() {
    let dev = device();
    // Memory without PCI access cannot be exported for PCI.
    let local = Staging::new(&dev, 4096, Access::LOCAL_READ_WRITE).expect("staging");
    let e = local.mmap().export_pci().expect_err("no PCI permission");
    assert_eq!(code(&e), DocaErrorCode::NotPermitted, "{e}");
    assert!(e.to_string().contains("doca_mmap_export_pci"), "{e}");
    // A corrupted descriptor.
    let host = Buffer::zeroed(4096);
    let m = Mmap::pinned(&dev, host, Access::PCI_READ_WRITE).expect("mmap");
    let mut desc = m.export_pci().expect("export");
    desc[0] ^= 0xff;
    let e = Mmap::import(&dev, &desc).expect_err("corrupted");
    assert_eq!(code(&e), DocaErrorCode::InvalidValue, "{e}");
    assert!(Mmap::import(&dev, &[]).is_err());
    // GPU memory needs a GPU: the model has none.
    let fd = std::os::fd::OwnedFd::from(tempfile::tempfile().expect("file"));
    let e = Mmap::dmabuf(&dev, fd, 0, 4096, 0x7f00_0000_0000, Access::PCI_READ_WRITE).expect_err("no GPU");
    assert_eq!(code(&e), DocaErrorCode::NotSupported, "{e}");
}

fn ring_seal(key: &[u8; 32], iv: &[u8; 12], aad: &[u8], data: &[u8]) -> (Vec<u8>, [u8; 16]) {
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("key"));
    let mut buf = data.to_vec();
    let tag = k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(*iv), Aad::from(aad), &mut buf).expect("seal");
    (buf, tag.as_ref().try_into().expect("16"))
}

#[test]
fn aes_gcm_tasks_match_ring_byte_for_byte() {
    let dev = device();
    let engine = AesGcmEngine::new(&dev, 1 << 20, 64).expect("engine");
    let raw = [0x42u8; 32];
    let key = engine.key(&raw).expect("key");
    for (len, aad_len) in [(0usize, 37usize), (1, 0), (4096, 37), (1_000_003, 64)] {
        let iv: [u8; 12] = std::array::from_fn(|i| (i + len) as u8);
        let aad: Vec<u8> = (0..aad_len).map(|i| i as u8 ^ 0x5a).collect();
        let plain: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut data = plain.clone();
        let tag = engine.seal(&key, &iv, &aad, &mut data).expect("seal");
        let (want, want_tag) = ring_seal(&raw, &iv, &aad, &plain);
        assert_eq!((data.as_slice(), tag), (want.as_slice(), want_tag), "len {len} aad {aad_len}");
        engine.open(&key, &iv, &aad, &mut data, &tag).expect("open");
        assert_eq!(data, plain);
    }
    // A wrong tag, a changed AAD byte: the task fails, nothing is returned as plaintext.
    let iv = [1u8; 12];
    let mut data = b"attack at dawn".to_vec();
    let tag = engine.seal(&key, &iv, b"ad", &mut data).expect("seal");
    let mut bad = tag;
    bad[0] ^= 1;
    let sealed = data.clone();
    assert!(matches!(engine.open(&key, &iv, b"ad", &mut data, &bad), Err(Error::Task { .. })));
    data.copy_from_slice(&sealed);
    assert!(matches!(engine.open(&key, &iv, b"aD", &mut data, &tag), Err(Error::Task { .. })));
    // Too large for the engine: refused before DOCA sees it.
    let mut big = vec![0u8; (1 << 20) + 1];
    assert!(matches!(engine.seal(&key, &iv, b"", &mut big), Err(Error::Invalid(_))));
    assert!(matches!(engine.seal(&key, &iv, &[0u8; 65], &mut data), Err(Error::Invalid(_))));
    // The engine still works after the failures.
    let mut again = b"still fine".to_vec();
    let t = engine.seal(&key, &iv, b"", &mut again).expect("seal after failures");
    engine.open(&key, &iv, b"", &mut again, &t).expect("open after failures");
    assert_eq!(again, b"still fine");
    drop(key);
}
