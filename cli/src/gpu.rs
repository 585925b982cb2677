//! `sluice get --gpu N` and `sluice put --gpu N`: an object into or out of
//! a buffer in GPU memory (`cuMemAlloc`) through the client's staging lanes
//! and the GPU's copy engines, with the file copied back from the GPU to
//! check or save it.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;
use sluice_client::cuda::{Cuda, HostModel};
use sluice_client::{Client, GpuRegion, GpuTransfer};

use crate::ops::{parse_range, summary};

/// `SLUICE_CUDA=host-model` replaces CUDA with the host model (device
/// memory in host memory): how the tests run these commands without a GPU.
pub const MODEL_ENV: &str = "SLUICE_CUDA";

/// Host memory the CLI moves file bytes through, at most.
const CHUNK: u64 = 64 << 20;

/// The CUDA driver, or the host model when asked for explicitly.
pub fn load_cuda() -> Result<Cuda, sluice_client::cuda::CudaError> {
    if std::env::var(MODEL_ENV).is_ok_and(|v| v == "host-model") {
        eprintln!("sluice: {MODEL_ENV}=host-model: the host model stands in for CUDA; no GPU is used");
        return Ok(Cuda::new(HostModel::new(1)));
    }
    Cuda::load()
}

/// The driver for `--gpu`, failing with what to do.
pub fn cuda_for_gpu_flag() -> anyhow::Result<Cuda> {
    load_cuda().context("`--gpu` needs the NVIDIA driver (libcuda.so.1; SLUICE_LIBCUDA names another file)")
}

fn gib_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / (1u64 << 30) as f64 / secs
    } else {
        0.0
    }
}

/// Copies `total` bytes of `region` back to host memory in chunks and
/// hands each to `sink` (offset, bytes).
fn copy_back(
    cuda: &Cuda,
    region: &GpuRegion,
    total: u64,
    mut sink: impl FnMut(u64, &[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let chunk = total.clamp(1, CHUNK);
    let host = cuda.pinned_buffer(region.device(), chunk)?;
    let stream = cuda.stream(region.device())?;
    let mut buf = vec![0u8; chunk as usize];
    let mut pos = 0;
    while pos < total {
        let k = (total - pos).min(chunk);
        stream.copy_to_host(&host, 0, &region.span().slice(pos, k)?)?;
        stream.synchronize()?;
        host.read_at(0, &mut buf[..k as usize])?;
        sink(pos, &buf[..k as usize])?;
        pos += k;
    }
    Ok(())
}

/// Compares what came back from the GPU with `file`.
fn verify(cuda: &Cuda, region: &GpuRegion, total: u64, file: &Path, device: u32) -> anyhow::Result<()> {
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let size = f.metadata()?.len();
    if size != total {
        bail!("the bytes read into cuda:{device} differ from {}: {total} bytes, the file has {size}", file.display());
    }
    let mut want = vec![0u8; total.clamp(1, CHUNK) as usize];
    copy_back(cuda, region, total, |pos, got| {
        f.read_exact(&mut want[..got.len()]).context("reading the file to compare")?;
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            bail!("the bytes read into cuda:{device} differ from {} at byte {}", file.display(), pos + i as u64);
        }
        Ok(())
    })
}

/// Saves what came back from the GPU as `file` ("-": stdout), removed
/// again on failure.
fn save(cuda: &Cuda, region: &GpuRegion, total: u64, file: &Path) -> anyhow::Result<()> {
    if file == Path::new("-") {
        let mut out = std::io::stdout().lock();
        return copy_back(cuda, region, total, |_, got| Ok(out.write_all(got)?)).and_then(|()| Ok(out.flush()?));
    }
    let mut f = std::fs::File::create(file).with_context(|| format!("creating {}", file.display()))?;
    let r = copy_back(cuda, region, total, |_, got| Ok(f.write_all(got)?)).and_then(|()| Ok(f.flush()?));
    if r.is_err() {
        let _ = std::fs::remove_file(file);
    }
    r
}

/// What `sluice get --gpu` was asked.
pub struct GetArgs<'a> {
    pub device: u32,
    pub path: &'a str,
    pub file: Option<&'a Path>,
    pub range: Option<&'a str>,
    pub verify: bool,
}

pub async fn get(client: &Client, cuda: &Cuda, a: GetArgs<'_>, json: bool) -> anyhow::Result<()> {
    let info = cuda.device(a.device)?;
    let obj = client.head(a.path).await?;
    let range = a.range.map(parse_range).transpose()?;
    let start = range.map_or(0, |r| r.0);
    if start > obj.size || (start == obj.size && obj.size > 0) {
        bail!("range starts at {start}, past the end of the {}-byte object", obj.size);
    }
    let total = range.and_then(|r| r.1).map_or(obj.size - start, |l| l.min(obj.size - start));
    let buf = Arc::new(cuda.alloc(a.device, total.max(1))?);
    let region = client.register_gpu_buffer(buf)?;
    let t0 = Instant::now();
    // The version HEAD saw, in every half.
    let GpuTransfer { transfer: t, copies } = client.get_gpu(a.path, &region, 0, range, &obj.etag).await?;
    let secs = t0.elapsed().as_secs_f64();
    let back = match (a.file, a.verify) {
        (Some(f), true) => {
            verify(cuda, &region, total, f, a.device)?;
            format!("; read back: matches {}", f.display())
        }
        (Some(f), false) => {
            save(cuda, &region, total, f)?;
            format!("; read back into {}", f.display())
        }
        (None, _) => String::new(),
    };
    if json {
        println!(
            "{}",
            json!({"path": a.path, "device": a.device, "gpu": info.name, "driver": cuda.name(), "bytes": t.bytes,
            "object_size": obj.size, "etag": t.etag, "data_path": t.data_path, "fallback_reason": t.fallback_reason,
            "seconds": secs, "gib_per_s": gib_per_s(t.bytes, secs), "copies": copies, "dest": a.file,
            "verified": a.file.is_some() && a.verify, "request_id": t.request_id})
        );
    } else {
        eprintln!(
            "{} -> cuda:{} ({}): {}, {copies} copies to the GPU{back}",
            a.path,
            a.device,
            info.name,
            summary(&t, secs)
        );
    }
    Ok(())
}

pub async fn put(
    client: &Client,
    cuda: &Cuda,
    device: u32,
    src: &Path,
    path: &str,
    content_type: &str,
    json: bool,
) -> anyhow::Result<()> {
    let info = cuda.device(device)?;
    let mut file = std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let size = file.metadata()?.len();
    let buf = Arc::new(cuda.alloc(device, size.max(1))?);
    // Fill the device buffer from the file, through pinned memory.
    let host = cuda.pinned_buffer(device, size.clamp(1, CHUNK))?;
    let stream = cuda.stream(device)?;
    let mut chunk = vec![0u8; size.clamp(1, CHUNK) as usize];
    let mut pos = 0;
    while pos < size {
        let k = (size - pos).min(CHUNK);
        file.read_exact(&mut chunk[..k as usize]).with_context(|| format!("reading {}", src.display()))?;
        host.write_at(0, &chunk[..k as usize])?;
        stream.copy_to_device(&buf.span().slice(pos, k)?, &host, 0)?;
        stream.synchronize()?;
        pos += k;
    }
    let region = client.register_gpu_buffer(buf)?;
    let t0 = Instant::now();
    let GpuTransfer { transfer: t, copies } = client.put_gpu(path, &region, 0, Some(size), content_type).await?;
    let secs = t0.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            json!({"path": path, "src": src, "device": device, "gpu": info.name, "driver": cuda.name(),
            "bytes": t.bytes, "etag": t.etag, "parts": t.parts, "data_path": t.data_path,
            "fallback_reason": t.fallback_reason, "seconds": secs, "gib_per_s": gib_per_s(t.bytes, secs),
            "copies": copies, "request_id": t.request_id})
        );
    } else {
        eprintln!(
            "{} (via cuda:{device}, {}) -> {path}: {} in {} part(s), {copies} copies from the GPU, etag {}",
            src.display(),
            info.name,
            summary(&t, secs),
            t.parts,
            t.etag
        );
    }
    Ok(())
}
