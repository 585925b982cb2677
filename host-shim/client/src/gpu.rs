//! GPU memory as a place GETs land and PUTs read from: the types, the
//! staging lanes and the plan of a batch (the operations are in
//! `gpu_ops.rs`).
//!
//! A [`GpuRegion`] names GPU memory of this process, checked with CUDA.
//! Nothing about it is sent to the shim. Bytes go through *staging lanes*:
//! shared-memory regions this client registers with the shim once and pins
//! for CUDA once, each split in two halves. A GET reads the object half by
//! half into a lane (the agent writes there as into any region; every half
//! after the first is pinned to the first's ETag) while the GPU's copy
//! engine moves the previous half into the GPU region, so the network and
//! the copies overlap and the CPU copies no object byte. A PUT copies from
//! the GPU into a lane (or, larger than a lane, into a pinned region of its
//! own) and stores it from there.
//!
//! Why in this process and not in a daemon: the copy runs in the CUDA
//! context of the memory's owner, so a tenant can fill or read only memory
//! its own process can address (CUDA checks that), and no daemon holds a
//! mapping of a client's GPU memory that a dead client would leave behind.

use std::any::Any;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sluice_cuda::{Cuda, CudaError, DeviceBuffer, DeviceSpan, Event, PinnedHost, Stream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::{ClientError, Region, Transfer};

/// Bytes of pinned staging a client keeps in all (lanes are made on demand).
pub const DEFAULT_STAGING_BYTES: u64 = 256 << 20;
/// Bytes of one lane (two halves): how much of an object is on its way to
/// the GPU at once per request. 2 x 16 MiB: two agent parts per half.
pub const DEFAULT_LANE_BYTES: u64 = 32 << 20;
/// The smallest lane (two 1 MiB halves).
const MIN_LANE_BYTES: u64 = 2 << 20;

/// Whether [`crate::Client::register`] pins new host regions for CUDA, so a
/// loader's host-to-GPU copy of what it read runs at pinned speed (about
/// ten times an unpinned one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PinRegions {
    /// When this process already uses CUDA (a device's primary context is
    /// active): no CUDA is loaded, and no context made, by the client.
    #[default]
    Auto,
    /// Always (loads CUDA; registering fails without it).
    Always,
    /// Never. `SLUICE_PIN_REGIONS=0` in the environment means this too.
    Never,
}

/// GPU settings of a client ([`crate::Client::connect_with`]).
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// The CUDA driver (tests pass a [`sluice_cuda::HostModel`]); `None`:
    /// the NVIDIA driver, loaded on first GPU use.
    pub cuda: Option<Cuda>,
    /// Where that driver is loaded from (default `$SLUICE_LIBCUDA`, else
    /// `libcuda.so.1`).
    pub libcuda: Option<PathBuf>,
    /// Pinned staging in all, per device: lanes are made on demand up to
    /// this; a request waits for a free lane beyond it.
    pub staging_bytes: u64,
    /// One lane (two halves); at least 2 MiB.
    pub lane_bytes: u64,
    pub pin_regions: PinRegions,
}

impl Default for GpuOptions {
    fn default() -> Self {
        Self {
            cuda: None,
            libcuda: None,
            staging_bytes: DEFAULT_STAGING_BYTES,
            lane_bytes: DEFAULT_LANE_BYTES,
            pin_regions: PinRegions::Auto,
        }
    }
}

/// GPU memory of this process that [`crate::Client::get_gpu`],
/// [`crate::Client::get_many_gpu`] and [`crate::Client::put_gpu`] use as a
/// region. Made by [`crate::Client::register_gpu`] (an address, checked
/// with CUDA) or [`crate::Client::register_gpu_buffer`] (which keeps the
/// buffer alive). Nothing is registered with the shim, so dropping it is
/// all there is to releasing it. A transfer borrows it, and finishes its
/// copies before it returns (or, cancelled, before its lane is dropped).
#[derive(Clone)]
pub struct GpuRegion {
    span: DeviceSpan,
    keep: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for GpuRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuRegion(cuda:{} {:#x} {} bytes)", self.span.device(), self.span.ptr(), self.span.len())
    }
}

impl GpuRegion {
    pub(crate) fn new(span: DeviceSpan, keep: Option<Arc<DeviceBuffer>>) -> Self {
        Self { span, keep: keep.map(|k| k as Arc<dyn Any + Send + Sync>) }
    }

    /// The device address of its first byte.
    pub fn ptr(&self) -> u64 {
        self.span.ptr()
    }

    pub fn len(&self) -> u64 {
        self.span.len()
    }

    pub fn is_empty(&self) -> bool {
        self.span.is_empty()
    }

    /// The CUDA device ordinal.
    pub fn device(&self) -> u32 {
        self.span.device()
    }

    /// The checked span (for copies of the caller's own).
    pub fn span(&self) -> &DeviceSpan {
        &self.span
    }

    /// Whether it keeps its memory alive (made from a buffer).
    pub fn owns_memory(&self) -> bool {
        self.keep.is_some()
    }
}

/// How a transfer to or from GPU memory went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTransfer {
    /// As for host memory; `bytes` is what reached (or left) the GPU region.
    pub transfer: Transfer,
    /// Copies the GPU's copy engines made (one per lane half or piece).
    pub copies: u32,
}

/// One GET of a [`crate::Client::get_many_gpu`] batch.
#[derive(Debug, Clone)]
pub struct GpuBatchGet<'a> {
    /// "namespace/key".
    pub path: String,
    pub region: &'a GpuRegion,
    pub offset: u64,
    /// `(start, Some(len))`, or `(start, None)` to the end; `None`: all.
    pub range: Option<(u64, Option<u64>)>,
    /// Most bytes the data may take from `offset`; 0: up to the next item's
    /// offset in the same region (a batch laid out item after item), else
    /// to the region's end.
    pub max_bytes: u64,
    /// The ETag the object must have (empty: any version).
    pub if_match: String,
}

/// A staging lane: a pinned shim region in two halves, with a stream and
/// an event per half (a half is refilled only once its last copy is done).
pub(crate) struct Lane {
    pub region: Region,
    pub pinned: Arc<PinnedHost>,
    pub stream: Arc<Stream>,
    events: [Arc<Event>; 2],
    pending: [bool; 2],
    /// Bytes in one half.
    pub half: u64,
}

impl Lane {
    pub fn new(region: Region, pinned: Arc<PinnedHost>, stream: Stream, events: [Event; 2]) -> Self {
        let half = region.len() / 2;
        let [a, b] = events;
        Self { region, pinned, stream: Arc::new(stream), events: [Arc::new(a), Arc::new(b)], pending: [false; 2], half }
    }

    /// Waits until the copy last queued out of `half` is done.
    pub async fn wait(&mut self, half: usize) -> Result<(), ClientError> {
        if self.pending[half] {
            wait_event(&self.events[half]).await?;
            self.pending[half] = false;
        }
        Ok(())
    }

    /// Marks the copies just queued out of `half`.
    pub fn copied(&mut self, half: usize) -> Result<(), ClientError> {
        self.stream.record(&self.events[half])?;
        self.pending[half] = true;
        Ok(())
    }

    /// Waits for every queued copy.
    pub async fn drain(&mut self) -> Result<(), ClientError> {
        drain(&self.stream).await?;
        self.pending = [false; 2];
        Ok(())
    }
}

/// Waits for an event without holding up the async runtime: a finished
/// copy is seen at once; an unfinished one (a copy engine takes
/// milliseconds) is waited for on a blocking thread.
async fn wait_event(ev: &Arc<Event>) -> Result<(), ClientError> {
    if ev.query()? {
        return Ok(());
    }
    let ev = ev.clone();
    tokio::task::spawn_blocking(move || ev.synchronize())
        .await
        .map_err(|e| ClientError::Protocol(format!("waiting for a GPU copy: {e}")))??;
    Ok(())
}

/// Waits for every copy queued on `stream` (as [`wait_event`]).
pub(crate) async fn drain(stream: &Arc<Stream>) -> Result<(), ClientError> {
    let s = stream.clone();
    tokio::task::spawn_blocking(move || s.synchronize())
        .await
        .map_err(|e| ClientError::Protocol(format!("waiting for GPU copies: {e}")))??;
    Ok(())
}

/// The lanes of one device: made on demand up to the staging budget; a
/// request holds one for its duration.
pub(crate) struct Staging {
    permits: Arc<Semaphore>,
    free: Mutex<Vec<Lane>>,
}

/// A lane held by a request. Given back on drop if the request ended
/// cleanly (its copies drained, no shim request into the lane in flight);
/// a request cancelled half-way may still have the agent writing into the
/// lane, so its lane is dropped instead and its region released later.
pub(crate) struct LaneGuard {
    lane: Option<Lane>,
    staging: Arc<Staging>,
    orphans: Arc<Mutex<Vec<String>>>,
    clean: bool,
    _permit: OwnedSemaphorePermit,
}

impl LaneGuard {
    pub fn lane(&mut self) -> &mut Lane {
        // Only Drop takes the lane out.
        self.lane.as_mut().expect("a lane guard holds its lane until dropped")
    }

    /// Drains the lane and marks it fit for the next request.
    pub async fn finish(&mut self) -> Result<(), ClientError> {
        let r = self.lane().drain().await;
        self.clean = r.is_ok();
        r
    }
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        let Some(lane) = self.lane.take() else { return };
        if self.clean {
            self.staging.free.lock().unwrap_or_else(|p| p.into_inner()).push(lane);
        } else {
            // Its stream finishes its copies as it drops; the agent may
            // still write the region, which is released on the next request.
            self.orphans.lock().unwrap_or_else(|p| p.into_inner()).push(lane.region.id().to_owned());
        }
    }
}

/// The GPU side of a client: the driver, pinning, the lanes.
pub(crate) struct GpuState {
    cuda: Mutex<Option<Cuda>>,
    libcuda: Option<PathBuf>,
    pub pin: PinRegions,
    pub lane_bytes: u64,
    max_lanes: usize,
    stagings: Mutex<HashMap<u32, Arc<Staging>>>,
}

impl GpuState {
    pub fn new(opts: GpuOptions) -> Self {
        let lane_bytes = opts.lane_bytes.max(MIN_LANE_BYTES) & !4095;
        let pin = if std::env::var_os("SLUICE_PIN_REGIONS").is_some_and(|v| v == "0") {
            PinRegions::Never
        } else {
            opts.pin_regions
        };
        Self {
            cuda: Mutex::new(opts.cuda),
            libcuda: opts.libcuda,
            pin,
            lane_bytes,
            max_lanes: usize::try_from(opts.staging_bytes / lane_bytes).unwrap_or(usize::MAX).max(1),
            stagings: Mutex::default(),
        }
    }

    /// The driver, loaded on first use; [`CudaError::NoDriver`] where there
    /// is none (not cached: a later call tries again).
    pub fn cuda(&self) -> Result<Cuda, CudaError> {
        let mut c = self.cuda.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cuda) = &*c {
            return Ok(cuda.clone());
        }
        let cuda = match &self.libcuda {
            Some(p) => Cuda::load_from(p)?,
            None => Cuda::load()?,
        };
        *c = Some(cuda.clone());
        Ok(cuda)
    }

    /// The driver only if this process already uses CUDA (or one was given).
    fn cuda_in_use(&self) -> Result<Option<Cuda>, CudaError> {
        let mut c = self.cuda.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cuda) = &*c {
            return Ok(Some(cuda.clone()));
        }
        let found = Cuda::load_if_in_use(self.libcuda.as_deref().map(|p| p.as_os_str()))?;
        c.clone_from(&found);
        Ok(found)
    }

    /// Pins a new host region's memory for CUDA if [`PinRegions`] says so.
    /// `Auto` never fails the registration; `Always` does.
    pub fn pin_new(&self, region: &Region) -> Result<Option<Arc<PinnedHost>>, CudaError> {
        let attempt = || -> Result<Option<Arc<PinnedHost>>, CudaError> {
            let (cuda, device) = match self.pin {
                PinRegions::Never => return Ok(None),
                PinRegions::Auto => {
                    let Some(cuda) = self.cuda_in_use()? else { return Ok(None) };
                    let Some(device) = cuda.active_device()? else { return Ok(None) };
                    (cuda, device)
                }
                PinRegions::Always => {
                    let cuda = self.cuda()?;
                    let device = cuda.active_device()?.unwrap_or(0);
                    (cuda, device)
                }
            };
            cuda.pin(device, region.memory()).map(Some)
        };
        match attempt() {
            Err(e) if self.pin == PinRegions::Auto => {
                tracing::debug!(error = %e, "host region not pinned for CUDA");
                Ok(None)
            }
            other => other,
        }
    }

    pub fn staging(&self, device: u32) -> Arc<Staging> {
        let mut s = self.stagings.lock().unwrap_or_else(|p| p.into_inner());
        s.entry(device)
            .or_insert_with(|| {
                Arc::new(Staging { permits: Arc::new(Semaphore::new(self.max_lanes)), free: Mutex::default() })
            })
            .clone()
    }

    /// Waits for room for a lane on `staging`: a free lane, or the right to
    /// make one (`None`).
    pub async fn reserve(&self, staging: &Arc<Staging>) -> (OwnedSemaphorePermit, Option<Lane>) {
        // The semaphore is never closed.
        let permit = match staging.permits.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => unreachable!("staging semaphores are never closed"),
        };
        let lane = staging.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        (permit, lane)
    }

    /// `orphans`: where a lane dropped mid-request leaves its region id.
    pub fn guard(
        &self,
        staging: Arc<Staging>,
        permit: OwnedSemaphorePermit,
        lane: Lane,
        orphans: &Arc<Mutex<Vec<String>>>,
    ) -> LaneGuard {
        LaneGuard { lane: Some(lane), staging, orphans: orphans.clone(), clean: false, _permit: permit }
    }
}

/// The bytes a GET covers of an object of `size`: all of it, or its range.
pub(crate) fn span_of(size: u64, range: Option<(u64, Option<u64>)>) -> u64 {
    match range {
        None => size,
        Some((start, len)) => {
            let avail = size.saturating_sub(start);
            len.map_or(avail, |l| l.min(avail))
        }
    }
}

/// An item of a GPU batch as the plan sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanItem {
    /// Which GPU region (items of one region are laid out against each other).
    pub region: (u64, u64),
    pub region_len: u64,
    pub offset: u64,
    pub range_len: Option<u64>,
    pub max_bytes: u64,
}

/// Each item's room in its GPU region: its `max_bytes` or range length
/// (the smaller), else up to the next item's offset in the same region,
/// else to the region's end. `None`: no room at all.
pub(crate) fn rooms(items: &[PlanItem]) -> Vec<Option<u64>> {
    items
        .iter()
        .map(|it| {
            if it.offset >= it.region_len {
                return None;
            }
            let explicit = [(it.max_bytes > 0).then_some(it.max_bytes), it.range_len].into_iter().flatten().min();
            let cap = explicit.unwrap_or_else(|| {
                let next = items
                    .iter()
                    .filter(|o| o.region == it.region && o.offset > it.offset)
                    .map(|o| o.offset)
                    .min()
                    .unwrap_or(it.region_len);
                next - it.offset
            });
            Some(cap.min(it.region_len - it.offset)).filter(|r| *r > 0)
        })
        .collect()
}

/// One lane half's worth of items: (item index, offset in the half, room).
pub(crate) type Chunk = Vec<(usize, u64, u64)>;

/// Packs items (index, room) into lane halves of `half` bytes, whole items
/// only, 64-byte aligned, at most `max_items` per half (the shim's batch
/// limit; 0: none). Items bigger than a half come back apart, to be read
/// on their own.
pub(crate) fn pack(items: &[(usize, u64)], half: u64, max_items: usize) -> (Vec<Chunk>, Vec<usize>) {
    let (mut chunks, mut big) = (Vec::new(), Vec::new());
    let mut chunk: Chunk = Vec::new();
    let mut used = 0u64;
    for &(i, room) in items {
        if room > half {
            big.push(i);
            continue;
        }
        if used + room > half || (max_items > 0 && chunk.len() >= max_items) {
            chunks.push(std::mem::take(&mut chunk));
            used = 0;
        }
        chunk.push((i, used, room));
        used += (room + 63) & !63;
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    (chunks, big)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(region: u64, len: u64, offset: u64, range_len: Option<u64>, max_bytes: u64) -> PlanItem {
        PlanItem { region: (region, len), region_len: len, offset, range_len, max_bytes }
    }

    #[test]
    fn an_items_room_ends_at_the_next_item_of_its_region() {
        let items = [
            item(1, 1000, 0, None, 0),
            item(1, 1000, 600, None, 0),
            item(1, 1000, 300, None, 0),
            item(2, 500, 0, None, 0),         // another region: not bounded by region 1's items
            item(1, 1000, 700, Some(50), 0),  // a range bounds it
            item(1, 1000, 900, None, 30),     // so does max_bytes
            item(1, 1000, 990, Some(500), 0), // ... never past the end
            item(1, 1000, 1000, None, 0),     // no room
        ];
        assert_eq!(rooms(&items), vec![Some(300), Some(100), Some(300), Some(500), Some(50), Some(30), Some(10), None]);
    }

    #[test]
    fn halves_take_whole_aligned_items_and_big_ones_go_alone() {
        let (chunks, big) = pack(&[(0, 100), (1, 1000), (2, 2000), (3, 900), (4, 1), (5, 1024)], 1024, 0);
        assert_eq!(big, vec![2]);
        assert_eq!(
            chunks,
            vec![vec![(0, 0, 100)], vec![(1, 0, 1000)], vec![(3, 0, 900), (4, 960, 1)], vec![(5, 0, 1024)]]
        );
        // The batch limit splits a half too.
        let (chunks, _) = pack(&[(0, 1), (1, 1), (2, 1)], 1024, 2);
        assert_eq!(chunks, vec![vec![(0, 0, 1), (1, 64, 1)], vec![(2, 0, 1)]]);
    }

    #[test]
    fn a_span_is_the_object_or_its_range() {
        assert_eq!(span_of(100, None), 100);
        assert_eq!(span_of(100, Some((10, None))), 90);
        assert_eq!(span_of(100, Some((10, Some(20)))), 20);
        assert_eq!(span_of(100, Some((90, Some(20)))), 10);
        assert_eq!(span_of(100, Some((200, Some(20)))), 0);
    }

    fn region(id: &str, len: u64) -> Region {
        Region::new(id.into(), sluice_shm::MappedRegion::create("gpu-test", len).unwrap())
    }

    fn with_model(model: &Arc<sluice_cuda::HostModel>, pin: PinRegions) -> GpuState {
        GpuState::new(GpuOptions { cuda: Some(Cuda::new(model.clone())), pin_regions: pin, ..Default::default() })
    }

    #[test]
    fn host_regions_are_pinned_as_the_mode_and_the_process_say() {
        let model = sluice_cuda::HostModel::new(2);
        let r = region("r", 1 << 20);
        // Auto: pinned on the device the process uses.
        model.set_context_active(0, false);
        let p = with_model(&model, PinRegions::Auto).pin_new(&r).unwrap().expect("device 1 is in use");
        assert_eq!(model.pinned(), vec![(p.addr(), 1 << 20)]);
        drop(p);
        assert!(model.pinned().is_empty());
        model.set_context_active(1, false);
        assert!(with_model(&model, PinRegions::Auto).pin_new(&r).unwrap().is_none(), "no GPU in use here");
        assert!(with_model(&model, PinRegions::Never).pin_new(&r).unwrap().is_none());
        assert!(with_model(&model, PinRegions::Always).pin_new(&r).unwrap().is_some());
        // No driver: Auto quietly does nothing; Always says why.
        let none = |pin| {
            GpuState::new(GpuOptions {
                libcuda: Some("/nonexistent/libcuda.so.1".into()),
                pin_regions: pin,
                ..Default::default()
            })
        };
        assert!(none(PinRegions::Auto).pin_new(&r).unwrap().is_none());
        assert!(none(PinRegions::Always).pin_new(&r).unwrap_err().is_unavailable());
    }

    fn lane(model: &Arc<sluice_cuda::HostModel>, id: &str) -> Lane {
        let cuda = Cuda::new(model.clone());
        let r = region(id, 2 << 20);
        let pinned = cuda.pin(0, r.memory()).unwrap();
        Lane::new(r, pinned, cuda.stream(0).unwrap(), [cuda.event(0).unwrap(), cuda.event(0).unwrap()])
    }

    #[tokio::test]
    async fn a_lane_goes_back_only_from_a_request_that_finished() {
        let model = sluice_cuda::HostModel::new(1);
        let state = with_model(&model, PinRegions::Never);
        let orphans: Arc<Mutex<Vec<String>>> = Arc::default();
        let staging = state.staging(0);

        let (permit, free) = state.reserve(&staging).await;
        assert!(free.is_none(), "no lane yet: the caller makes one");
        let mut g = state.guard(staging.clone(), permit, lane(&model, "a"), &orphans);
        assert_eq!(g.lane().half, 1 << 20);
        g.finish().await.unwrap();
        drop(g);
        let (permit, free) = state.reserve(&staging).await;
        let reused = free.expect("a finished request gives its lane back");
        assert_eq!(reused.region.id(), "a");

        // Dropped without finishing (a cancelled request): the lane is not
        // reused, its memory is unpinned, its region is left to release.
        let g = state.guard(staging.clone(), permit, reused, &orphans);
        drop(g);
        assert_eq!(*orphans.lock().unwrap(), vec!["a".to_owned()]);
        assert!(model.pinned().is_empty());
        let (_permit, free) = state.reserve(&staging).await;
        assert!(free.is_none());
    }

    #[test]
    fn lanes_are_page_sized_and_the_budget_allows_at_least_one() {
        let s = GpuState::new(GpuOptions { lane_bytes: 5 << 20 | 123, staging_bytes: 1, ..Default::default() });
        assert_eq!((s.lane_bytes, s.max_lanes), (5 << 20, 1));
        let s = GpuState::new(GpuOptions { lane_bytes: 1, staging_bytes: 9 << 20, ..Default::default() });
        assert_eq!((s.lane_bytes, s.max_lanes), (2 << 20, 4));
    }
}
