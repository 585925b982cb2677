//! The safe layer against the host model: pointer validation, deferred
//! copies (a reused staging half is caught), pin bookkeeping, per-thread
//! contexts. The LibCuda tests are in libcuda.rs.
#![allow(clippy::unwrap_used)] // a test's panic is its failure report

use std::sync::Arc;

use crate::driver::{
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_CONTEXT,
};
use crate::{Cuda, CudaError, HostModel};

fn model() -> (Arc<HostModel>, Cuda) {
    let m = HostModel::new(2);
    (m.clone(), Cuda::new(m))
}

#[test]
fn only_live_device_memory_of_this_process_is_a_span() {
    let (m, cuda) = model();
    let ptr = m.alloc(4096, 0);
    let span = cuda.device_span(ptr, 4096, None).unwrap();
    assert_eq!((span.ptr(), span.len(), span.device()), (ptr, 4096, 0));
    assert_eq!(cuda.device_span(ptr + 100, 3996, Some(0)).unwrap().len(), 3996);

    // Never allocated here: another process's address, or garbage.
    let e = cuda.device_span(0x7F00_DEAD_0000, 4096, None).unwrap_err();
    assert!(matches!(e, CudaError::NotDeviceMemory { .. }) && e.is_bad_request(), "{e:?}");
    assert!(e.to_string().contains("not GPU memory of this process"), "{e}");
    // Freed.
    let freed = m.alloc(4096, 0);
    assert!(m.free(freed));
    let e = cuda.device_span(freed, 16, None).unwrap_err();
    assert!(e.to_string().contains("not GPU memory of this process"), "{e}");
    // Past the end of its allocation.
    let e = cuda.device_span(ptr + 100, 4096, None).unwrap_err();
    assert!(e.is_bad_request() && e.to_string().contains("run past the end"), "{e}");
    // On another device than described.
    let e = cuda.device_span(ptr, 4096, Some(1)).unwrap_err();
    assert!(e.to_string().contains("on cuda:0, not cuda:1"), "{e}");
    let on1 = m.alloc(64, 1);
    assert_eq!(cuda.device_span(on1, 64, Some(1)).unwrap().device(), 1);
    // Empty.
    assert!(cuda.device_span(ptr, 0, None).unwrap_err().is_bad_request());
    // Host memory (pinned, so CUDA knows it) is not GPU memory.
    let host = cuda.pinned_buffer(0, 4096).unwrap();
    let e = cuda.device_span(host.addr() as u64, 16, None).unwrap_err();
    assert!(e.to_string().contains("is host memory"), "{e}");
    // Windows of a span stay inside it.
    assert_eq!(span.slice(4000, 96).unwrap().ptr(), ptr + 4000);
    assert!(span.slice(4000, 97).unwrap_err().is_bad_request());
    assert!(span.slice(u64::MAX, 2).is_err());
}

#[test]
fn copies_run_only_when_synchronized_so_a_reused_half_is_caught() {
    let (m, cuda) = model();
    let dst = m.alloc(8, 0);
    let span = cuda.device_span(dst, 8, None).unwrap();
    let lane = cuda.pinned_buffer(0, 4096).unwrap();
    let stream = cuda.stream(0).unwrap();
    let ev = cuda.event(0).unwrap();

    // The bug the model exists to catch: refilling the half before the
    // event says its copy is done. The device gets the second bytes.
    lane.write_at(0, b"AAAAAAAA").unwrap();
    stream.copy_to_device(&span, &lane, 0).unwrap();
    stream.record(&ev).unwrap();
    assert!(!ev.query().unwrap(), "a queued copy is not done until synchronized");
    assert_eq!(m.queued(), 1);
    lane.write_at(0, b"BBBBBBBB").unwrap();
    stream.synchronize().unwrap();
    assert_eq!(m.read(dst, 8).unwrap(), b"BBBBBBBB");

    // Done right: wait for the event, then refill.
    lane.write_at(0, b"CCCCCCCC").unwrap();
    stream.copy_to_device(&span, &lane, 0).unwrap();
    stream.record(&ev).unwrap();
    ev.synchronize().unwrap();
    assert!(ev.query().unwrap());
    lane.write_at(0, b"DDDDDDDD").unwrap();
    assert_eq!(m.read(dst, 8).unwrap(), b"CCCCCCCC");

    // An event waits only for what was queued before it.
    stream.copy_to_device(&span.slice(0, 4).unwrap(), &lane, 0).unwrap();
    stream.record(&ev).unwrap();
    stream.copy_to_device(&span.slice(4, 4).unwrap(), &lane, 100).unwrap();
    ev.synchronize().unwrap();
    assert_eq!(m.read(dst, 8).unwrap(), b"DDDDCCCC");
    assert_eq!(m.queued(), 1);
    stream.synchronize().unwrap();
    assert_eq!(m.read(dst, 8).unwrap(), b"DDDD\0\0\0\0");

    // And back: device to host.
    stream.copy_to_host(&lane, 2048, &span).unwrap();
    stream.synchronize().unwrap();
    let mut out = [0u8; 8];
    lane.read_at(2048, &mut out).unwrap();
    assert_eq!(&out, b"DDDD\0\0\0\0");
    assert_eq!(m.unpinned_copies(), 0);
    assert_eq!(m.copies(), 5);
}

#[test]
fn pins_are_recorded_held_by_queued_copies_and_released() {
    let (m, cuda) = model();
    let dst = m.alloc(1 << 20, 0);
    let span = cuda.device_span(dst, 1 << 20, None).unwrap();
    let host = cuda.pinned_buffer(0, 1 << 20).unwrap();
    assert_eq!(m.pinned(), vec![(host.addr(), 1 << 20)]);
    // Pinning the same memory twice is CUDA's error, not a silent double pin.
    let e = cuda.pin(0, host.memory().clone()).unwrap_err();
    assert_eq!(e.code(), Some(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), "{e}");

    let stream = cuda.stream(0).unwrap();
    stream.copy_to_device(&span, &host, 0).unwrap();
    drop(host);
    assert_eq!(m.pinned().len(), 1, "a queued copy keeps its memory pinned");
    stream.synchronize().unwrap();
    assert!(m.pinned().is_empty(), "unpinned once the stream is past the copy");

    // Through the raw driver a copy from unpinned memory is possible, and
    // counted (the safe types never make one).
    let plain = vec![7u8; 64];
    let raw = cuda.driver().stream_create().unwrap();
    // SAFETY: `plain` outlives the synchronize below; `dst` is model memory.
    unsafe {
        cuda.driver().memcpy_htod_async(dst, plain.as_ptr(), 64, raw).unwrap();
        cuda.driver().stream_synchronize(raw).unwrap();
        cuda.driver().stream_destroy(raw).unwrap();
    }
    assert_eq!(m.unpinned_copies(), 1);
    assert_eq!(m.read(dst, 64).unwrap(), plain);
}

#[test]
fn work_needs_a_current_context_on_each_thread() {
    let (_m, cuda) = model();
    let d = cuda.driver().clone();
    let e = std::thread::spawn(move || d.stream_create().map(|_| ())).join().unwrap().unwrap_err();
    assert_eq!(e.code(), Some(CUDA_ERROR_INVALID_CONTEXT), "{e}");
    // The safe types make their device current themselves.
    let c2 = cuda.clone();
    std::thread::spawn(move || c2.stream(1).map(|_| ())).join().unwrap().unwrap();
    assert!(matches!(cuda.stream(2).unwrap_err(), CudaError::Call { .. }));
}

#[test]
fn memory_freed_under_a_queued_copy_fails_the_synchronize() {
    let (m, cuda) = model();
    let dst = m.alloc(64, 0);
    let span = cuda.device_span(dst, 64, None).unwrap();
    let host = cuda.pinned_buffer(0, 64).unwrap();
    let stream = cuda.stream(0).unwrap();
    stream.copy_to_device(&span, &host, 0).unwrap();
    m.free(dst);
    assert_eq!(stream.synchronize().unwrap_err().code(), Some(CUDA_ERROR_ILLEGAL_ADDRESS));
}

#[test]
fn buffers_spans_and_streams_stay_with_their_driver_and_device() {
    let (m, cuda) = model();
    let buf = cuda.alloc(1, 4096).unwrap();
    assert_eq!((buf.device(), buf.len()), (1, 4096));
    let info = cuda.driver().pointer_info(buf.ptr()).unwrap();
    assert_eq!((info.base, info.size, info.device), (buf.ptr(), 4096, 1));
    let host = cuda.pinned_buffer(1, 4096).unwrap();
    let e = cuda.stream(0).unwrap().copy_to_device(&buf.span(), &host, 0).unwrap_err();
    assert!(e.to_string().contains("on cuda:1, the stream on cuda:0"), "{e}");
    let (_other_model, other) = model();
    let e = other.stream(1).unwrap().copy_to_device(&buf.span(), &host, 0).unwrap_err();
    assert!(e.to_string().contains("another CUDA driver"), "{e}");
    let e = cuda.stream(1).unwrap().copy_to_device(&buf.span(), &host, 1).unwrap_err();
    assert!(e.to_string().contains("outside the 4096 pinned bytes"), "{e}");
    let ptr = buf.ptr();
    drop(buf);
    assert!(m.read(ptr, 1).is_err(), "a dropped buffer is freed");
    assert!(cuda.alloc(0, 0).unwrap_err().is_bad_request());
    assert!(matches!(
        cuda.dmabuf(&cuda.device_span(m.alloc(4096, 0), 4096, None).unwrap()),
        Err(CudaError::Unsupported(_))
    ));
}

#[test]
fn devices_report_name_and_attributes_and_the_active_one() {
    let (m, cuda) = model();
    let d = cuda.device(1).unwrap();
    assert_eq!(d.name, "host model GPU 1");
    assert!(d.host_register && d.dma_buf && !d.gpudirect_rdma);
    assert!(matches!(cuda.device(2), Err(CudaError::NoDevice { device: 2, count: 2 })));
    assert_eq!(cuda.active_device().unwrap(), Some(0));
    m.set_context_active(0, false);
    assert_eq!(cuda.active_device().unwrap(), Some(1));
    m.set_context_active(1, false);
    assert_eq!(cuda.active_device().unwrap(), None);
}
