"""GPU regions against a real stack, with the CUDA driver replaced by the
host model (sluice.cuda.HostModel): device memory is host memory, and copies
happen only when a stream or event is synchronized, so a staging half reused
before its copy finished would corrupt the bytes checked here. The same code
runs against libcuda on a GPU machine (scripts/gpu-lane)."""

from __future__ import annotations

import asyncio
import ctypes

import numpy as np
import pytest

import sluice
from sluice.cuda import HostModel
from _helpers import payload

LANE = 2 << 20  # halves of 1 MiB: objects below cross several


class CudaArray:
    """A minimal ``__cuda_array_interface__`` producer over model memory."""

    def __init__(self, ptr: int, shape, typestr: str = "|u1", strides=None, stream=None) -> None:
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream


@pytest.fixture
def model():
    return HostModel()


@pytest.fixture
def gclient(stack, model):
    with sluice.Client(stack.socket, timeout=60, cuda=model, gpu_lane_bytes=LANE,
                       gpu_staging_bytes=4 * LANE) as c:
        yield c


def test_an_object_crosses_several_halves_into_gpu_memory_byte_exact(gclient, model, prefix):
    data = payload(5 * (1 << 20) + 12345, "gpu-big")
    gclient.put(f"{prefix}/big", data)
    ptr = model.alloc(len(data) + 100)
    with gclient.register_gpu(ptr, nbytes=len(data) + 100) as g:
        t = gclient.get(f"{prefix}/big", into=g, offset=100)
        assert (t.bytes, t.object_size) == (len(data), len(data))
        # A first read of a whole lane (2 MiB), then 1 MiB halves.
        assert t.etag and t.parts >= 5, t
        assert not t.verified and "ranged" in t.unverified_reason, "bigger than a lane: read in ranges, and says so"
        assert model.read(ptr + 100, len(data)) == data
        # A range, at an offset.
        model.write(ptr, b"\0" * 100)
        t = gclient.get(f"{prefix}/big", into=g, offset=7, range=(1_500_000, 2_000_000))
        assert t.bytes == 2_000_000 and model.read(ptr + 7, 2_000_000) == data[1_500_000:3_500_000]
    assert model.unpinned_copies == 0, "every copy came from pinned staging"


def test_an_object_no_bigger_than_a_lane_is_one_whole_read_checked_end_to_end(gclient, model, prefix):
    """Up to a whole lane (both halves) an object is one whole-object GET,
    which the agent checks against its stored CRC64NVME: a GPU read of it
    is ``verified``, whether it fills one half or both."""
    for n in (LANE // 2 - 3, LANE // 2 + 4097, LANE):
        data = payload(n, f"gpu-lane-{n}")
        gclient.put(f"{prefix}/lane-{n}", data)
        ptr = model.alloc(n + 64)
        with gclient.register_gpu(ptr, nbytes=n + 64) as g:
            t = gclient.get(f"{prefix}/lane-{n}", into=g, offset=64)
            assert (t.bytes, t.object_size) == (n, n)
            assert t.verified, t
            assert model.read(ptr + 64, n) == data
            # A range that is the whole object is checked too; a shorter one is not.
            t = gclient.get(f"{prefix}/lane-{n}", into=g, offset=0, range=(0, n))
            assert t.verified and model.read(ptr, n) == data
            t = gclient.get(f"{prefix}/lane-{n}", into=g, offset=0, range=(1, n - 1))
            assert not t.verified and model.read(ptr, n - 1) == data[1:]
    assert model.unpinned_copies == 0


def test_copies_come_after_the_work_the_owner_queued_on_the_memory(gclient, model, prefix):
    """The lanes' streams synchronize with no other, so a transfer first
    makes its lane wait for the work queued on the memory's producer stream
    (torch's current stream; here ``__cuda_array_interface__``'s): a copy
    the owner queued before a GET cannot land after (over) its bytes, and a
    PUT stores the bytes that copy writes, not what was there before."""
    n = 3 * LANE // 2 + 5  # a first read of a whole lane, then a half
    data = payload(n, "gpu-ordered")
    gclient.put(f"{prefix}/ordered", data)
    stale = ctypes.create_string_buffer(b"s" * n, n)
    model.host_register(ctypes.addressof(stale), n)
    ptr = model.alloc(n)
    producer = model.stream()
    model.use(0)
    # The owner's work still queued on its stream: stale bytes into the tensor.
    model.htod(ptr, ctypes.addressof(stale), n, producer)
    with gclient.register_gpu(CudaArray(ptr, (n,), stream=producer)) as g:
        gclient.get(f"{prefix}/ordered", into=g)
    model.synchronize(producer)  # the owner's stream, whenever it runs
    assert model.read(ptr, n) == data, "the GET's bytes landed before the owner's earlier copy"
    assert model.stream_waits >= 1

    # get_many into it: the same.
    model.htod(ptr, ctypes.addressof(stale), n, producer)
    with gclient.register_gpu(CudaArray(ptr, (n,), stream=producer)) as g:
        res = gclient.get_many([sluice.GetSpec(f"{prefix}/ordered", g, 0, range=(0, 4096))])
        assert res[0].ok, res[0].error
    model.synchronize(producer)
    assert model.read(ptr, 4096) == data[:4096]

    # A PUT stores what the owner's queued copy writes.
    fresh = ctypes.create_string_buffer(b"f" * n, n)
    model.host_register(ctypes.addressof(fresh), n)
    model.htod(ptr, ctypes.addressof(fresh), n, producer)
    with gclient.register_gpu(CudaArray(ptr, (n,), stream=producer)) as g:
        gclient.put(f"{prefix}/ordered-put", g)
    assert gclient.get_bytes(f"{prefix}/ordered-put") == b"f" * n


def test_what_does_not_fit_writes_nothing_to_the_gpu(gclient, model, prefix):
    data = payload(3 << 20, "gpu-fit")
    gclient.put(f"{prefix}/fit", data)
    ptr = model.alloc(2 << 20)
    model.write(ptr, b"\xee" * (2 << 20))
    g = gclient.register_gpu(ptr, nbytes=2 << 20)
    with pytest.raises(sluice.RegionTooSmall) as e:
        gclient.get(f"{prefix}/fit", into=g)
    assert e.value.needed_bytes == 3 << 20
    assert model.read(ptr, 2 << 20) == b"\xee" * (2 << 20)
    with pytest.raises(sluice.NoSuchKey):
        gclient.get(f"{prefix}/missing", into=g)
    g.release()
    with pytest.raises(sluice.RegionReleased):
        gclient.get(f"{prefix}/fit", into=g)


def test_bad_gpu_memory_is_refused(gclient, model):
    ptr = model.alloc(4096)
    # Never allocated here (another process's address, or garbage).
    with pytest.raises(sluice.BadRequest, match="not GPU memory of this process"):
        gclient.register_gpu(0x7F00DEAD0000, nbytes=4096)
    # Freed.
    freed = model.alloc(4096)
    model.free(freed)
    with pytest.raises(sluice.BadRequest, match="not GPU memory of this process"):
        gclient.register_gpu(freed, nbytes=4096)
    # Past the end of its allocation.
    with pytest.raises(sluice.BadRequest, match="run past the end"):
        gclient.register_gpu(ptr + 100, nbytes=4096)
    # Described as on another device.
    with pytest.raises(sluice.BadRequest, match="not cuda:1"):
        gclient.register_gpu(ptr, nbytes=4096, device=1)
    with pytest.raises(TypeError):
        gclient.register_gpu(ptr)  # an address needs nbytes
    with pytest.raises(TypeError):
        gclient.register_gpu("0x1000")
    # Host memory (numpy, DLPack device type CPU) is not GPU memory.
    with pytest.raises(sluice.BadRequest, match="not CUDA"):
        gclient.register_gpu(np.zeros(16, dtype=np.uint8))
    # __cuda_array_interface__: contiguous works, strided does not.
    g = gclient.register_gpu(CudaArray(ptr, (1024,), "<f4"))
    assert (g.ptr, g.nbytes, g.device) == (ptr, 4096, 0)
    with pytest.raises(sluice.BadRequest, match="not C-contiguous"):
        gclient.register_gpu(CudaArray(ptr, (16, 16), "<f4", strides=(4, 64)))


def test_without_cuda_gpu_memory_is_unsupported(stack, monkeypatch):
    monkeypatch.setenv("SLUICE_LIBCUDA", "/nonexistent/libcuda.so.1")
    import sluice.cuda as cu

    monkeypatch.setattr(cu, "_DRIVER", None)
    with sluice.Client(stack.socket) as c:
        with pytest.raises(sluice.Unsupported, match="CUDA driver"):
            c.register_gpu(0x1000, nbytes=16)
        # Host regions still work, unpinned.
        with c.register(4096) as r:
            assert not c.pinned(r)


def test_put_reads_from_gpu_memory_small_and_larger_than_a_lane(gclient, model, prefix):
    for n, tag in [(300_000, "small"), (3 * LANE + 17, "large")]:
        data = payload(n, f"gpu-put-{tag}")
        ptr = model.alloc(n + 10)
        model.write(ptr + 10, data)
        g = gclient.register_gpu(ptr, nbytes=n + 10)
        t = gclient.put(f"{prefix}/{tag}", g, offset=10)
        assert t.bytes == n
        assert gclient.get_bytes(f"{prefix}/{tag}", size_hint=n) == data
        with pytest.raises(sluice.BadRequest):
            gclient.put(f"{prefix}/{tag}-oob", g, offset=10, length=n + 1)
    assert model.unpinned_copies == 0


def test_puts_larger_than_a_lane_reuse_one_pinned_staging_region(gclient, model, prefix):
    pins = []
    real = model.host_register
    model.host_register = lambda addr, n: (pins.append(n), real(addr, n))[1]
    n = 3 * LANE + 17
    ptr = model.alloc(n)
    with gclient.register_gpu(ptr, nbytes=n) as g:
        for k in range(4):
            data = payload(n, f"gpu-put-reuse-{k}")  # different bytes each time
            model.write(ptr, data)
            assert gclient.put(f"{prefix}/reuse{k}", g).bytes == n
            assert gclient.get_bytes(f"{prefix}/reuse{k}", size_hint=n) == data
    big = [p for p in pins if p >= n]
    assert len(big) == 1, f"the staging for PUTs larger than a lane was pinned {len(big)} times"
    assert model.unpinned_copies == 0


def test_get_many_fills_a_gpu_batch_and_fails_only_bad_items(gclient, model, prefix):
    sizes = [1000, 70_000, 4096, 0, 900_000, 123, 1_500_000, 65_536]
    objs = {}
    for i, n in enumerate(sizes):
        objs[i] = payload(n, f"gpu-many-{i}")
        gclient.put(f"{prefix}/m{i}", objs[i])
    slot = 1_600_000
    ptr = model.alloc(slot * len(sizes))
    g = gclient.register_gpu(ptr, nbytes=slot * len(sizes))
    specs = [sluice.GetSpec(f"{prefix}/m{i}", g, i * slot) for i in range(len(sizes))]
    specs.append(sluice.GetSpec(f"{prefix}/nope", g, 0))
    specs.append(f"{prefix}/m0")  # a bytes item in the same batch
    res = gclient.get_many(specs)
    for i, n in enumerate(sizes):
        assert res[i].ok and res[i].nbytes == n, res[i]
        assert model.read(ptr + i * slot, n) == objs[i], f"item {i}"
    assert not res[len(sizes)].ok and isinstance(res[len(sizes)].error, sluice.NoSuchKey)
    assert res[-1].ok and res[-1].data == objs[0]
    # An item bigger than its room (up to the next item) fails, typed; the
    # next item's bytes stay.
    big = payload(2 * slot, "gpu-many-big")
    gclient.put(f"{prefix}/toolarge", big)
    res = gclient.get_many([sluice.GetSpec(f"{prefix}/toolarge", g, 0), sluice.GetSpec(f"{prefix}/m1", g, slot)])
    assert isinstance(res[0].error, sluice.RegionTooSmall), res[0]
    assert res[1].ok and model.read(ptr + slot, sizes[1]) == objs[1]
    assert model.unpinned_copies == 0


def _gpu_batch(gclient, model, stem, objs, slot):
    """Stores ``objs`` as ``<stem><i>`` and makes one GPU region with a
    ``slot``-byte place for each: (its address, the region, the specs)."""
    for i, o in enumerate(objs):
        gclient.put(f"{stem}{i}", o)
    ptr = model.alloc(slot * len(objs))
    g = gclient.register_gpu(ptr, nbytes=slot * len(objs))
    return ptr, g, [sluice.GetSpec(f"{stem}{i}", g, i * slot) for i in range(len(objs))]


def test_get_many_reads_items_bigger_than_a_lane_side_by_side(gclient, model, prefix):
    # Halves of 1 MiB: each of these items is read on its own, through a
    # lane of its own, up to the staging's 4 lanes at once.
    sizes = [3 << 20, (2 << 20) + 5, 5 << 20, (1 << 20) + 1, 4 << 20, 3 << 20]
    objs = [payload(n, f"gpu-big-many-{i}") for i, n in enumerate(sizes)]
    slot = 6 << 20
    ptr, g, specs = _gpu_batch(gclient, model, f"{prefix}/bm", objs, slot)
    specs.insert(2, sluice.GetSpec(f"{prefix}/bm-missing", g, 0, range=(0, 3 << 20)))
    res = gclient.get_many(specs)
    assert isinstance(res[2].error, sluice.NoSuchKey), res[2]
    got = [r for j, r in enumerate(res) if j != 2]
    for i, (r, o) in enumerate(zip(got, objs)):
        assert r.ok and r.nbytes == len(o), r
        assert model.read(ptr + i * slot, len(o)) == o, f"item {i}"
    st = gclient._stagings[0]
    assert st.count > 1, "the big items were read one after another"
    assert len(st.free) == st.count, "every lane was given back"
    assert model.unpinned_copies == 0


def test_big_gpu_batch_items_fail_typed_when_the_copy_engine_fails(gclient, model, prefix):
    from sluice.cuda import CudaError

    objs = [payload((2 << 20) + 11 * i, f"gpu-ce-{i}") for i in range(6)]
    slot = 3 << 20
    ptr, g, specs = _gpu_batch(gclient, model, f"{prefix}/ce", objs, slot)
    real_htod, real_sync = model.htod, model.synchronize
    failed = []

    def broken_htod(*a, **k):
        failed.append(1)
        raise CudaError("cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_LAUNCH_FAILED (719) (test)")

    def sync(stream):
        if failed:  # once a copy failed, the stream is broken too
            raise CudaError("cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (719) (test)")
        real_sync(stream)

    # Copies fail, and so does draining a lane afterwards: every worker
    # stops, and no item is left without an error.
    model.htod, model.synchronize = broken_htod, sync
    try:
        res = gclient.get_many(specs)
    finally:
        model.htod, model.synchronize = real_htod, real_sync
    for r in res:
        assert not r.ok and isinstance(r.error, sluice.SluiceError), r
    st = gclient._stagings[0]
    assert len(st.free) == st.count, "every lane was given back"
    # The lanes still work afterwards.
    res = gclient.get_many(specs)
    for i, (r, o) in enumerate(zip(res, objs)):
        assert r.ok and model.read(ptr + i * slot, len(o)) == o, (i, r)


def test_big_gpu_batches_from_several_threads_share_the_lanes_without_deadlock(gclient, model, prefix):
    import threading

    objs = [payload((2 << 20) + 77 * i, f"gpu-threads-{i}") for i in range(6)]
    for i, o in enumerate(objs):
        gclient.put(f"{prefix}/tb{i}", o)
    slot = 3 << 20
    errors = []

    def reader(k: int) -> None:
        try:
            ptr = model.alloc(slot * len(objs))
            with gclient.register_gpu(ptr, nbytes=slot * len(objs)) as g:
                for _ in range(3):
                    res = gclient.get_many([sluice.GetSpec(f"{prefix}/tb{i}", g, i * slot) for i in range(len(objs))])
                    for i, (r, o) in enumerate(zip(res, objs)):
                        assert r.ok, r
                        assert model.read(ptr + i * slot, len(o)) == o, f"thread {k} item {i}"
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a reader is stuck waiting for a lane"
    assert not errors, errors


def test_host_regions_are_pinned_once_when_cuda_is_in_use(stack, model):
    for active, mode, expect in [(True, "auto", True), (False, "auto", False), (True, "never", False),
                                 (False, "always", True)]:
        model.active[0] = active
        with sluice.Client(stack.socket, cuda=model, pin_regions=mode) as c:
            r = c.register(1 << 20)
            assert c.pinned(r) is expect, (active, mode)
            pinned = set(model.pinned())
            c.release(r)
            assert set(model.pinned()) < pinned or not expect, "released regions are unpinned first"
        assert model.pinned() == {}, "a closed client leaves nothing pinned"
    with pytest.raises(ValueError):
        sluice.Client(stack.socket, cuda=model, pin_regions="sometimes")


def test_the_asyncio_client_refuses_gpu_regions(stack, model, prefix):
    async def main():
        async with await sluice.AsyncClient.connect(stack.socket) as c:
            g = sluice.GpuRegion(model.alloc(16), 16, 0)
            with pytest.raises(sluice.Unsupported, match="blocking"):
                await c.get(f"{prefix}/x", into=g)

    asyncio.run(main())


class FakeCudaTensor:
    """What sluice.torch allocates for a device batch (a torch CUDA uint8
    tensor), over model memory: contiguous bytes, sliceable."""

    def __init__(self, model: HostModel, nbytes: int, ptr: int = 0) -> None:
        self.model, self.nbytes = model, nbytes
        self.ptr = ptr or model.alloc(nbytes)
        self.__cuda_array_interface__ = {"data": (self.ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                         "strides": None, "version": 3}

    def __getitem__(self, s: slice) -> "FakeCudaTensor":
        return FakeCudaTensor(self.model, s.stop - s.start, self.ptr + s.start)

    def bytes(self) -> bytes:
        return self.model.read(self.ptr, self.nbytes)


def test_datasets_yield_samples_read_into_gpu_memory(stack, model, prefix, monkeypatch):
    import sluice.torch as st

    monkeypatch.setattr(st, "_gpu_buffer", lambda n, device: FakeCudaTensor(model, n))
    objs = {f"{prefix}/ds/{i:02d}": payload(1000 * i + 7, f"ds-{i}") for i in range(12)}
    with sluice.Client(stack.socket) as c:
        for k, v in objs.items():
            c.put(k, v)
    opts = {"cuda": model, "gpu_lane_bytes": LANE}
    ds = st.ShimDataset(f"{prefix}/ds/", stack.socket, device="cuda:0", client_options=opts)
    assert len(ds) == 12
    batch = ds.__getitems__([3, 0, 11, 5])
    assert [b.bytes() for b in batch] == [objs[ds.path(i)] for i in (3, 0, 11, 5)]
    assert ds[7].bytes() == objs[ds.path(7)]
    it = st.ShimIterableDataset(f"{prefix}/ds/", stack.socket, device="cuda:0", prefetch=5, client_options=opts)
    assert [s.bytes() for s in it] == [objs[k] for k in sorted(objs)]


def test_releasing_a_gpu_region_waits_for_its_copies_in_flight(stack, model, prefix):
    """release() during a GET: the GET stops at its next part (or finishes),
    and release returns only once no copy into the memory is pending, so the
    memory's owner can free it safely."""
    import threading
    import time

    data = payload(8 << 20, "gpu-release")
    with sluice.Client(stack.socket, cuda=model, gpu_lane_bytes=LANE) as c:
        c.put(f"{prefix}/rel", data)
        ptr = model.alloc(len(data))
        g = c.register_gpu(ptr, nbytes=len(data))
        out = {}

        def reader():
            try:
                out["t"] = c.get(f"{prefix}/rel", into=g)
            except sluice.SluiceError as e:
                out["e"] = e
            out["done"] = time.monotonic()

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.05)
        g.release()
        released_at = time.monotonic()
        t.join(30)
        assert "done" in out and out["done"] <= released_at, "release() returned while the GET still ran"
        assert "t" in out or isinstance(out["e"], sluice.RegionReleased), out
        with pytest.raises(sluice.RegionReleased):
            c.get(f"{prefix}/rel", into=g)
        res = c.get_many([sluice.GetSpec(f"{prefix}/rel", g, 0)])
        assert isinstance(res[0].error, sluice.RegionReleased)


def test_gpu_paths_say_what_this_node_can_do(stack, model, monkeypatch):
    with sluice.Client(stack.socket, cuda=model) as c:
        paths = dict(c.gpu_paths())
        assert paths.get("client-staging", "").startswith("host-model: 1 device(s)"), paths
        # A co-located agent without an RDMA NIC that registers dma-bufs.
        assert c.capabilities.gpu_dmabuf_path == "" and "dmabuf-rdma" not in paths
    import sluice.cuda as cu

    monkeypatch.setenv("SLUICE_LIBCUDA", "/nonexistent/libcuda.so.1")
    monkeypatch.setattr(cu, "_DRIVER", None)
    with sluice.Client(stack.socket) as c:
        assert c.gpu_paths() == []


def count_checkouts(client):
    """The sizes of the scratch regions ``client`` checks out from here on
    (staging memory: GPU transfers through the lanes take none)."""
    sizes = []
    real = client._checkout

    def counting(n):
        sizes.append(n)
        return (yield from real(n))

    client._checkout = counting
    return sizes


class ModelTensor(CudaArray):
    """Just enough of a CUDA torch tensor, over model memory, for the DCP
    writer's GPU path (torch here has no CUDA)."""

    is_cuda = True

    def __init__(self, ptr: int, nbytes: int) -> None:
        super().__init__(ptr, (nbytes,))
        self._n = nbytes

    def numel(self) -> int:
        return self._n

    def element_size(self) -> int:
        return 1


def test_dcp_saves_gpu_tensors_in_lane_sized_pieces_within_its_budget(gclient, model, prefix):
    """A GPU tensor bigger than a lane is stored as lane-sized pieces, each
    straight through a lane (no other host staging); the writer's budget
    bounds the lanes it brings into being, whatever its thread count."""
    from sluice import dcp
    if not dcp.HAVE_DCP:
        pytest.fail("torch.distributed.checkpoint is missing from the test venv")
    import concurrent.futures as cf

    writer = dcp.StorageWriter(f"{prefix}/gpu-dcp", gclient, threads=8, memory_bytes=2 * LANE, piece_bytes=8 * LANE)
    tensors = []
    for k, n in enumerate([3 * LANE + 17, 2 * LANE, LANE - 5]):
        ptr = model.alloc(n)
        data = payload(n, f"gpu-dcp-{k}")
        model.write(ptr, data)
        tensors.append((ModelTensor(ptr, n), data))
    assert writer._piece_of(tensors[0][0]) == LANE
    checkouts = count_checkouts(gclient)
    budget = dcp._Budget(writer.memory_bytes)
    jobs = [(k, off, min(LANE, len(d) - off)) for k, (_, d) in enumerate(tensors) for off in range(0, len(d), LANE)]
    with cf.ThreadPoolExecutor(8) as pool:
        etags = list(pool.map(lambda j: writer._put_span(prefix.split("/", 1)[0], prefix.split("/", 1)[1],
                                                         f"gpu-dcp/{j[0]}.{j[1]}", tensors[j[0]][0], j[1], j[2],
                                                         budget), jobs))
    assert all(etags) and len(jobs) == 4 + 2 + 1
    assert checkouts == [], "GPU pieces went through the lanes, with no scratch staging"
    for k, off, n in jobs:
        assert gclient.get_bytes(f"{prefix}/gpu-dcp/{k}.{off}") == tensors[k][1][off : off + n]
    st = gclient._stagings[0]
    assert st.count <= 2, f"{st.count} lanes for a budget of 2"
    assert model.unpinned_copies == 0


def test_dcp_loads_gpu_pieces_through_the_lanes_checked_end_to_end(gclient, model, prefix):
    """The reader puts a GPU tensor's pieces (each no bigger than a lane)
    straight into the tensor through the lanes: no scratch staging, at most
    its budget of lanes, every piece read whole so the agent checks it; a
    replaced piece is refused with nothing written past its span; an
    object bigger than a lane is left to the staged path."""
    from sluice import dcp
    from sluice.checkpoint import IncompleteCheckpoint
    if not dcp.HAVE_DCP:
        pytest.fail("torch.distributed.checkpoint is missing from the test venv")
    import concurrent.futures as cf

    ns, pre = prefix.split("/", 1)
    n = 3 * LANE + 17
    data = payload(n, "gpu-dcp-load")
    pieces = [(off, min(LANE, n - off)) for off in range(0, n, LANE)]
    etags = [gclient.put(f"{prefix}/load/{i}", data[off : off + k]).etag for i, (off, k) in enumerate(pieces)]
    reader = dcp.StorageReader(prefix, gclient, threads=8, memory_bytes=2 * LANE)
    ptr = model.alloc(n)
    target = ModelTensor(ptr, n)
    checkouts = count_checkouts(gclient)
    budget = dcp._Budget(reader.memory_bytes)
    with cf.ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda j: reader._read_into_gpu(f"{prefix}/load/{j[0]}", etags[j[0]], target, j[1][0], j[1][1],
                                                             budget), enumerate(pieces)))
    assert done == [True] * len(pieces)
    assert model.read(ptr, n) == data
    assert checkouts == [], "read through the lanes, with no scratch staging"
    assert gclient._stagings[0].count <= 2, "at most the reader's budget of lanes"
    assert model.unpinned_copies == 0

    # A piece replaced since the save: refused, and nothing written.
    model.write(ptr, b"\0" * n)
    gclient.put(f"{prefix}/load/1", data[:LANE])
    with pytest.raises(IncompleteCheckpoint, match="replaced"):
        reader._read_into_gpu(f"{prefix}/load/1", etags[1], target, LANE, LANE, budget)
    assert model.read(ptr, n) == b"\0" * n
    # A stored object bigger than the span asked for: refused, nothing past the span.
    gclient.put(f"{prefix}/load/long", data[: LANE // 2 + 100])
    with pytest.raises(IncompleteCheckpoint, match="recorded"):
        reader._read_into_gpu(f"{prefix}/load/long", "", target, 0, LANE // 2, budget)
    assert model.read(ptr + LANE // 2, n - LANE // 2) == b"\0" * (n - LANE // 2)
    # Bigger than a lane: not this path's.
    assert reader._read_into_gpu(f"{prefix}/load/0", etags[0], target, 0, LANE + 4096, budget) is False


def test_a_lane_whose_drain_failed_is_drained_before_its_next_use(gclient, model, prefix):
    """A drain that fails leaves a lane with copies possibly queued; it goes
    back to the pool marked busy, and the next request drains it before
    reading into it: the failed request's queued copies run from the bytes
    they were queued for, never from the next object's."""
    from sluice.cuda import CudaError

    first, second = payload(LANE, "gpu-drain-1"), payload(LANE, "gpu-drain-2")
    gclient.put(f"{prefix}/drain-1", first)
    gclient.put(f"{prefix}/drain-2", second)
    a, b = model.alloc(LANE), model.alloc(LANE)
    real, fails = model.synchronize, [2]

    def flaky(stream):
        if fails[0]:
            fails[0] -= 1
            raise CudaError("cuEventSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (model)")
        return real(stream)

    model.synchronize = flaky
    with gclient.register_gpu(a, nbytes=LANE) as ga:
        with pytest.raises(CudaError):
            gclient.get(f"{prefix}/drain-1", into=ga)
    assert fails == [0] and gclient._stagings[0].lanes[0].busy, "the lane went back with its copies unconfirmed"
    with gclient.register_gpu(b, nbytes=LANE) as gb:
        t = gclient.get(f"{prefix}/drain-2", into=gb)
    assert t.bytes == LANE and model.read(b, LANE) == second
    assert model.read(a, LANE) == first, "the failed request's copies ran from its own bytes"
