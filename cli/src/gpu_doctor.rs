//! The GPU part of `sluice doctor`: is there a CUDA driver, which GPUs and
//! what they support, does pinned staging work (a 1 MiB round trip through
//! a pinned lane), and which GPU paths this node has. A node without CUDA
//! is not a failure: GPU regions are simply unavailable there.

use std::io::{Seek, SeekFrom};
use std::time::Instant;

use sluice_client::cuda::{Cuda, CudaError};
use sluice_client::{Capabilities, MemoryKind};

use crate::doctor::Check;
use crate::gpu::load_cuda;

const MIB: u64 = 1 << 20;

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// 1 MiB host -> GPU -> host through a pinned memfd lane of two halves (the
/// memory a client's staging lane is): (H2D, D2H) in microseconds.
fn round_trip(cuda: &Cuda, device: u32) -> Result<(u128, u128), CudaError> {
    let lane = cuda.pinned_buffer(device, 2 * MIB)?;
    let dev = cuda.alloc(device, MIB)?;
    let stream = cuda.stream(device)?;
    let pattern: Vec<u8> = (0..MIB).map(|i| (i * 7 % 251) as u8).collect();
    lane.write_at(0, &pattern)?;
    let t0 = Instant::now();
    stream.copy_to_device(&dev.span(), &lane, 0)?;
    stream.synchronize()?;
    let h2d = t0.elapsed().as_micros();
    let t1 = Instant::now();
    stream.copy_to_host(&lane, MIB, &dev.span())?;
    stream.synchronize()?;
    let d2h = t1.elapsed().as_micros();
    let mut back = vec![0u8; MIB as usize];
    lane.read_at(MIB, &mut back)?;
    if back != pattern {
        return Err(CudaError::Invalid("the bytes that came back from the GPU differ from those sent".into()));
    }
    Ok((h2d, d2h))
}

/// Whether CUDA exports device memory as a dma-buf here (what the verbs and
/// DOCA GPU paths hand to the NIC or DPU).
fn dmabuf(cuda: &Cuda, device: u32) -> Check {
    let what = format!("gpu {device}: dma-buf export");
    let tried = cuda.alloc(device, 2 * MIB).and_then(|buf| cuda.dmabuf(&buf.span()));
    match tried {
        Ok(fd) => {
            let size = std::fs::File::from(fd)
                .seek(SeekFrom::End(0))
                .map_or_else(|e| format!("size unknown: {e}"), |n| format!("{n} bytes"));
            Check::info(what, format!("works (cuMemGetHandleForAddressRange: a dma-buf of {size})"))
        }
        Err(e) => Check::info(what, format!("not available: {e}")),
    }
}

/// The GPU paths this node has: client staging where CUDA works, and what
/// the shim and agent said at the handshake.
fn paths(staging: bool, caps: Option<&Capabilities>) -> Check {
    let mut p = Vec::new();
    if staging {
        p.push("client staging (copy engines)".to_owned());
    }
    if let Some(c) = caps {
        let both =
            c.agent_memory().any(|k| k == MemoryKind::GpuDmabuf) && c.shim_memory().any(|k| k == MemoryKind::GpuDmabuf);
        if both {
            p.push("dma-buf regions (register_dmabuf: the agent places bytes in GPU memory)".to_owned());
        }
        if !c.gpu_staging.is_empty() {
            p.push(format!("agent staging: {}", c.gpu_staging));
        }
    }
    if p.is_empty() {
        Check::info("gpu paths", "none: GPU regions unavailable on this node")
    } else {
        Check::pass("gpu paths", p.join("; "))
    }
}

/// The GPU checks (`caps`: the connection's, if the shim answered).
pub fn checks(caps: Option<&Capabilities>) -> Vec<Check> {
    let what = "gpu: CUDA driver";
    let mut out = Vec::new();
    let cuda = match load_cuda() {
        Ok(c) => c,
        // dlerror's reason names the file it tried.
        Err(CudaError::NoDriver { reason, .. }) => {
            out.push(Check::info(what, format!("no CUDA driver: GPU regions unavailable ({reason})")));
            out.push(paths(false, caps));
            return out;
        }
        Err(e) if e.is_unavailable() => {
            out.push(Check::info(what, format!("no usable GPU: GPU regions unavailable ({e})")));
            out.push(paths(false, caps));
            return out;
        }
        Err(e) => {
            out.push(Check::fail(
                what,
                e.to_string(),
                "the NVIDIA driver is installed but does not start: check nvidia-smi and the kernel module",
            ));
            out.push(paths(false, caps));
            return out;
        }
    };
    let count = match cuda.device_count() {
        Ok(n) => n,
        Err(e) => {
            out.push(Check::fail(what, e.to_string(), "check nvidia-smi"));
            return out;
        }
    };
    let from = if cuda.driver().path().is_empty() { String::new() } else { format!(" from {}", cuda.driver().path()) };
    out.push(Check::pass(what, format!("{}{from}, {count} GPU(s)", cuda.name())));
    for d in 0..count {
        out.push(match cuda.device(d) {
            Ok(i) => Check::pass(
                format!("gpu {d}"),
                format!(
                    "{}: host register {}, GPUDirect RDMA {}, dma-buf {}",
                    i.name,
                    yes(i.host_register),
                    yes(i.gpudirect_rdma),
                    yes(i.dma_buf)
                ),
            ),
            Err(e) => Check::fail(format!("gpu {d}"), e.to_string(), "check nvidia-smi"),
        });
    }
    let mut staging = false;
    if count > 0 {
        let what = "gpu 0: pinned round trip";
        out.push(match round_trip(&cuda, 0) {
            Ok((h2d, d2h)) => {
                staging = true;
                Check::pass(
                    what,
                    format!(
                        "1 MiB host -> GPU -> host through a pinned lane, bytes intact (H2D {h2d} us, D2H {d2h} us)"
                    ),
                )
            }
            Err(e) => Check::fail(
                what,
                e.to_string(),
                "pinned staging does not work, so GPU regions cannot be filled here: check that cuMemHostRegister \
                 is allowed (ulimit -l, containers: the NVIDIA runtime) and nvidia-smi",
            ),
        });
        out.push(dmabuf(&cuda, 0));
    }
    out.push(paths(staging, caps));
    out
}
