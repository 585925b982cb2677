//! The client operations on GPU regions: register, GET, PUT, batches (see
//! `gpu.rs` for how bytes move and why here).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use sluice_cuda::{Cuda, CudaError, DeviceBuffer, DeviceSpan};
use sluice_proto::common::ErrorCode;

use crate::gpu::{pack, rooms, span_of, GpuBatchGet, GpuRegion, GpuTransfer, Lane, LaneGuard, PlanItem};
use crate::{BatchGet, Client, ClientError, Region, Transfer};

fn refused(code: ErrorCode, message: String, request_id: &str) -> ClientError {
    ClientError::Gpu { code, message, request_id: request_id.to_owned() }
}

fn check_bytes(got: u64, want: u64, what: &str, request_id: &str) -> Result<(), ClientError> {
    if got == want {
        return Ok(());
    }
    Err(refused(
        ErrorCode::TransferFailed,
        format!("{what}: {got} bytes arrived where {want} were expected; nothing more was copied"),
        request_id,
    ))
}

/// Releases a region with the shim unless disarmed: one made for a single
/// request, whose future may be dropped before it can release it itself.
struct ReleaseLater {
    id: Option<String>,
    orphans: Arc<Mutex<Vec<String>>>,
}

impl Drop for ReleaseLater {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.orphans.lock().unwrap_or_else(|p| p.into_inner()).push(id);
        }
    }
}

impl Client {
    /// The CUDA driver GPU calls use (loaded on first use): allocate with
    /// this one, so the memory is the same driver's.
    pub fn cuda(&self) -> Result<Cuda, ClientError> {
        Ok(self.gpu.cuda()?)
    }

    /// Bytes of one staging lane (two halves).
    pub fn gpu_lane_bytes(&self) -> u64 {
        self.gpu.lane_bytes
    }

    /// GPU memory of this process as a region: `len` bytes at device
    /// address `ptr` (on `device`, if given). CUDA checks that the span lies
    /// inside one live device allocation of this process: another process's
    /// address, freed memory or host memory fail with `BAD_REQUEST`; no
    /// CUDA here: `UNSUPPORTED`. The memory's owner must keep it allocated
    /// while transfers use the region.
    pub fn register_gpu(&self, ptr: u64, len: u64, device: Option<u32>) -> Result<GpuRegion, ClientError> {
        let cuda = self.gpu.cuda()?;
        Ok(GpuRegion::new(cuda.device_span(ptr, len, device)?, None))
    }

    /// A device buffer as a region that keeps the buffer alive.
    pub fn register_gpu_buffer(&self, buffer: Arc<DeviceBuffer>) -> Result<GpuRegion, ClientError> {
        let cuda = self.gpu.cuda()?;
        let span = cuda.device_span(buffer.ptr(), buffer.len(), Some(buffer.device()))?;
        Ok(GpuRegion::new(span, Some(buffer)))
    }

    /// A lane of `device` for one request: a free one, a new one within the
    /// staging budget, or the next one given back.
    async fn lane(&self, device: u32) -> Result<LaneGuard, ClientError> {
        self.release_orphans().await;
        let cuda = self.gpu.cuda()?;
        let staging = self.gpu.staging(device);
        let (permit, free) = self.gpu.reserve(&staging).await;
        let lane = match free {
            Some(lane) => lane,
            None => self.new_lane(&cuda, device).await?,
        };
        Ok(self.gpu.guard(staging, permit, lane, &self.orphans))
    }

    /// A lane is a region like any other (the agent writes into it),
    /// registered and pinned once for the life of the client.
    async fn new_lane(&self, cuda: &Cuda, device: u32) -> Result<Lane, ClientError> {
        let mut region = self.register_unpinned(self.gpu.lane_bytes).await?;
        let made = (|| -> Result<_, CudaError> {
            let pinned = cuda.pin(device, region.memory())?;
            Ok((pinned, cuda.stream(device)?, [cuda.event(device)?, cuda.event(device)?]))
        })();
        match made {
            Ok((pinned, stream, events)) => {
                region.pinned = Some(pinned.clone());
                Ok(Lane::new(region, pinned, stream, events))
            }
            Err(e) => {
                let _ = self.release(region).await;
                Err(e.into())
            }
        }
    }

    /// Reads `path` ("ns/key"), or `range` of it, into `region` at
    /// `offset`, through a staging lane: half by half, each half copied to
    /// the GPU while the next is on the network; every half after the first
    /// must be the first's object version (`if_match` pins the first too).
    /// An object bigger than the room at `offset` fails with
    /// `REGION_TOO_SMALL` before any byte reaches the GPU.
    pub async fn get_gpu(
        &self,
        path: &str,
        region: &GpuRegion,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
        if_match: &str,
    ) -> Result<GpuTransfer, ClientError> {
        self.get_gpu_capped(path, region, offset, range, if_match, None).await
    }

    /// As [`Client::get_gpu`], with at most `max_bytes` of room.
    async fn get_gpu_capped(
        &self,
        path: &str,
        region: &GpuRegion,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
        if_match: &str,
        max_bytes: Option<u64>,
    ) -> Result<GpuTransfer, ClientError> {
        if offset > region.len() {
            let msg = format!("offset {offset} is past the end of the GPU region of {} bytes", region.len());
            return Err(refused(ErrorCode::OutOfBounds, msg, ""));
        }
        let t0 = Instant::now();
        let mut guard = self.lane(region.device()).await?;
        let got = self.get_through(guard.lane(), path, region, offset, range, if_match, max_bytes).await;
        // Every copy is done before the region is given back to the caller.
        let finished = guard.finish().await;
        drop(guard);
        let mut t = got?;
        finished?;
        t.transfer.elapsed_us = t0.elapsed().as_micros() as u64;
        Ok(t)
    }

    #[allow(clippy::too_many_arguments)] // the public call's arguments, and its lane
    async fn get_through(
        &self,
        lane: &mut Lane,
        path: &str,
        region: &GpuRegion,
        offset: u64,
        range: Option<(u64, Option<u64>)>,
        if_match: &str,
        max_bytes: Option<u64>,
    ) -> Result<GpuTransfer, ClientError> {
        let (start, want) = range.map_or((0, None), |(s, l)| (s, l));
        let half = lane.half;
        let first_len = want.map_or(half, |w| w.min(half));
        // The first half tells the object's size and version; nothing
        // reaches GPU memory until the whole span is known to fit.
        let first = self.get_pinned(path, lane.region.id(), 0, Some((start, Some(first_len))), if_match).await?;
        let total = span_of(first.object_size, range);
        let room = (region.len() - offset).min(max_bytes.unwrap_or(u64::MAX));
        if total > room {
            let msg = format!(
                "{total} bytes do not fit the {room} bytes of the GPU region ({} bytes) at offset {offset}; \
                 nothing was written",
                region.len()
            );
            return Err(refused(ErrorCode::RegionTooSmall, msg, &first.request_id));
        }
        check_bytes(first.bytes, first_len.min(total), "the first part", &first.request_id)?;
        let (mut parts, mut copies) = (first.parts, 0u32);
        if first.bytes > 0 {
            lane.stream.copy_to_device(&region.span().slice(offset, first.bytes)?, &lane.pinned, 0)?;
            lane.copied(0)?;
            copies += 1;
        }
        let (mut done, mut h) = (first.bytes, 0usize);
        while done < total {
            h ^= 1;
            let n = (total - done).min(half);
            lane.wait(h).await?; // its previous copy is finished
            let at = h as u64 * half;
            let t = self.get_pinned(path, lane.region.id(), at, Some((start + done, Some(n))), &first.etag).await?;
            let what = format!("bytes {}-{}", start + done, start + done + n - 1);
            check_bytes(t.bytes, n, &what, &t.request_id)?;
            lane.stream.copy_to_device(&region.span().slice(offset + done, n)?, &lane.pinned, at)?;
            lane.copied(h)?;
            copies += 1;
            parts += t.parts;
            done += n;
        }
        Ok(GpuTransfer { transfer: Transfer { bytes: total, parts, ..first }, copies })
    }

    /// Stores `len` bytes (default: to the end) of `region` from `offset`
    /// as `path`: copied from the GPU into a staging lane (or, bigger than a
    /// lane, into a pinned region of its own), then stored from there.
    pub async fn put_gpu(
        &self,
        path: &str,
        region: &GpuRegion,
        offset: u64,
        len: Option<u64>,
        content_type: &str,
    ) -> Result<GpuTransfer, ClientError> {
        let n = len.unwrap_or(region.len().saturating_sub(offset));
        let src = region.span().slice(offset, n)?;
        let t0 = Instant::now();
        let mut guard = self.lane(region.device()).await?;
        let put = self.put_through(guard.lane(), &src, path, content_type).await;
        let finished = guard.finish().await;
        drop(guard);
        let mut t = put?;
        finished?;
        t.transfer.elapsed_us = t0.elapsed().as_micros() as u64;
        Ok(t)
    }

    async fn put_through(
        &self,
        lane: &mut Lane,
        src: &DeviceSpan,
        path: &str,
        content_type: &str,
    ) -> Result<GpuTransfer, ClientError> {
        let n = src.len();
        // Bigger than a lane: a pinned region of its own for this PUT (the
        // store needs the whole object before it completes it).
        let own = if n > 2 * lane.half { Some(self.pinned_region(n, src.device()).await?) } else { None };
        let (target, pinned) = match &own {
            Some((r, _)) => (r.id().to_owned(), r.pinned.clone()),
            None => (lane.region.id().to_owned(), Some(lane.pinned.clone())),
        };
        let stored = async {
            let pinned = pinned.ok_or_else(|| ClientError::Protocol("staging region not pinned".into()))?;
            // Copied in pieces on the lane's stream: the first pieces are in
            // host memory while the last are still on their way.
            let (mut pos, mut copies) = (0u64, 0u32);
            while pos < n {
                let k = (n - pos).min(lane.half);
                lane.stream.copy_to_host(&pinned, pos, &src.slice(pos, k)?)?;
                copies += 1;
                pos += k;
            }
            lane.drain().await?;
            let t = self.put_by_id(path, &target, 0, n, content_type).await?;
            Ok(GpuTransfer { transfer: t, copies })
        }
        .await;
        if let Some((r, mut later)) = own {
            later.id = None;
            let _ = self.release(r).await;
        }
        stored
    }

    /// A region of `len` bytes pinned on `device`, for one request.
    async fn pinned_region(&self, len: u64, device: u32) -> Result<(Region, ReleaseLater), ClientError> {
        let mut r = self.register_unpinned(len).await?;
        let later = ReleaseLater { id: Some(r.id().to_owned()), orphans: self.orphans.clone() };
        match self.gpu.cuda().and_then(|c| c.pin(device, r.memory())) {
            Ok(p) => {
                r.pinned = Some(p);
                Ok((r, later))
            }
            Err(e) => {
                let mut later = later;
                later.id = None;
                let _ = self.release(r).await;
                Err(e.into())
            }
        }
    }

    /// Reads many objects into GPU regions: items packed into lane halves,
    /// one batch ([`Client::get_many`]) per half, each item then copied to
    /// its region while the next half is read; an item bigger than a half
    /// is read on its own ([`Client::get_gpu`]). One result per item, in
    /// order; an item's failure (missing, too big for its room) never fails
    /// the others. `Err` only when the batch as a whole could not be served.
    pub async fn get_many_gpu(
        &self,
        items: &[GpuBatchGet<'_>],
    ) -> Result<Vec<Result<Transfer, ClientError>>, ClientError> {
        let mut results: Vec<Option<Result<Transfer, ClientError>>> = (0..items.len()).map(|_| None).collect();
        let plan: Vec<PlanItem> = items
            .iter()
            .map(|it| PlanItem {
                region: (it.region.ptr(), it.region.len()),
                region_len: it.region.len(),
                offset: it.offset,
                range_len: it.range.and_then(|r| r.1),
                max_bytes: it.max_bytes,
            })
            .collect();
        let room = rooms(&plan);
        // Items by device, in order.
        let mut groups: Vec<(u32, Vec<(usize, u64)>)> = Vec::new();
        for (i, it) in items.iter().enumerate() {
            let Some(r) = room[i] else {
                let msg = format!("no room in the GPU region ({} bytes) at offset {}", it.region.len(), it.offset);
                results[i] = Some(Err(refused(ErrorCode::RegionTooSmall, msg, "")));
                continue;
            };
            match groups.iter_mut().find(|(d, _)| *d == it.region.device()) {
                Some((_, g)) => g.push((i, r)),
                None => groups.push((it.region.device(), vec![(i, r)])),
            }
        }
        let half = self.gpu.lane_bytes / 2;
        let max_items = self.capabilities.max_batch_items as usize;
        let mut big = Vec::new();
        for (device, group) in groups {
            let (chunks, alone) = pack(&group, half, max_items);
            big.extend(alone);
            if chunks.is_empty() {
                continue;
            }
            let mut guard = self.lane(device).await?;
            let served = self.batch_through(guard.lane(), &chunks, items, &mut results).await;
            let finished = guard.finish().await;
            // Given back before the big items take lanes of their own.
            drop(guard);
            served?;
            finished?;
        }
        for i in big {
            let it = &items[i];
            let cap = room[i];
            let got = self.get_gpu_capped(&it.path, it.region, it.offset, it.range, &it.if_match, cap).await;
            results[i] = Some(got.map(|g| g.transfer));
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(Err(ClientError::Disconnected))).collect())
    }

    async fn batch_through(
        &self,
        lane: &mut Lane,
        chunks: &[crate::gpu::Chunk],
        items: &[GpuBatchGet<'_>],
        results: &mut [Option<Result<Transfer, ClientError>>],
    ) -> Result<(), ClientError> {
        let mut h = 0usize;
        for chunk in chunks {
            lane.wait(h).await?;
            let base = h as u64 * lane.half;
            let gets: Vec<BatchGet> = chunk
                .iter()
                .map(|&(i, at, room)| BatchGet {
                    path: items[i].path.clone(),
                    region_id: lane.region.id().to_owned(),
                    offset: base + at,
                    range: items[i].range,
                    max_bytes: room,
                    if_match: items[i].if_match.clone(),
                })
                .collect();
            let outcomes = self.get_many(&gets).await?;
            for (&(i, at, _), outcome) in chunk.iter().zip(outcomes) {
                let it = &items[i];
                results[i] = Some(outcome.and_then(|t| {
                    if t.bytes > 0 {
                        let dst = it.region.span().slice(it.offset, t.bytes)?;
                        lane.stream.copy_to_device(&dst, &lane.pinned, base + at)?;
                    }
                    Ok(t)
                }));
            }
            lane.copied(h)?;
            h ^= 1;
        }
        Ok(())
    }
}
