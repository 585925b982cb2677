"""One reader of the GPU benchmark, in a process of its own (``run.py`` starts
it, pinned to the host cores with ``--split``).

The same protocol as ``bench/loaders/worker.py`` (JSON configuration on
stdin, JSON lines on stdout: ``info``, ``unavailable``, ``run``, ``error``)
and the same harness (``timed_pass``, CPU sampling): every reader ends each
object with its bytes in GPU memory, in a slot of a device buffer of its own.

* ``mode == "real"``: torch CUDA tensors on ``cuda:0``; Sluice uses libcuda
  (``sluice.cuda.LibCuda``), the peers torch's copies from pinned memory.
* ``mode == "dry"``: ``sluice.cuda.HostModel`` stands in for the GPU (its
  "device memory" is host memory, its copies run when a stream is
  synchronized); torch is not needed. Peers whose ``.cuda()`` is a copy from
  pinned host memory run against the model too; kvikio (which drives CUDA
  itself) reads into pinned host memory, then the model's copy.

After every pass (warm-up included), before its numbers are reported, up to
``verify`` of the objects that the pass left in GPU memory are compared
byte for byte *on the device* with a reference built independently
(``object_bytes``: the deterministic contents the objects were put with,
cloned into pinned memory, then copied to the GPU; ``torch.equal`` there).
A mismatch fails the reader: no reader is timed with wrong bytes.

``op == "probe"`` describes the GPU (or says why there is none) instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)


sys.path.insert(0, BENCH)
from benchlib import load as _load  # noqa: E402


lw = _load("sluice_bench_loaders_worker", os.path.join(BENCH, "loaders", "worker.py"))
lr = _load("sluice_bench_loaders_run", os.path.join(BENCH, "loaders", "run.py"))
emit, timed_pass, emit_run, batch_shape = lw.emit, lw.timed_pass, lw.emit_run, lw.batch_shape

MiB = 1 << 20


class Unavailable(Exception):
    """The reader cannot run here (reported as unavailable, with why)."""


# ------------------------------------------------------------- backends --
class TorchCuda:
    """Real GPU memory through torch: device buffers are CUDA uint8 tensors,
    pinned buffers ``pin_memory=True`` tensors, copies ``copy_(...,
    non_blocking=True)`` on a stream per slot, then that stream synchronized."""

    dry = False

    def __init__(self) -> None:
        try:
            import torch
        except ImportError as e:
            raise Unavailable(f"torch is not installed ({e})") from None
        if not torch.cuda.is_available():
            raise Unavailable(f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
        self.torch = torch
        self.device = torch.device("cuda:0")
        torch.cuda.init()
        torch.cuda.set_device(self.device)

    def describe(self) -> str:
        return f"torch {self.torch.__version__} CUDA tensors on {self.torch.cuda.get_device_name(0)}"

    def device_buffer(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def register(self, client: Any, buf: Any) -> Any:
        return client.register_gpu(buf)

    def slice(self, buf: Any, off: int, n: int) -> Any:
        return buf[off : off + n]

    def pinned(self, nbytes: int) -> Tuple[Any, memoryview]:
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        return t, memoryview((ctypes.c_ubyte * nbytes).from_address(t.data_ptr())).cast("B")

    def unpin(self, pinned: Tuple[Any, memoryview]) -> None:
        pinned[1].release()  # the tensor goes back to torch's pinned cache

    def stream(self) -> Any:
        return self.torch.cuda.Stream(self.device)

    def h2d(self, dev: Any, off: int, pinned: Tuple[Any, memoryview], n: int, stream: Any) -> None:
        with self.torch.cuda.stream(stream):
            dev[off : off + n].copy_(pinned[0][:n], non_blocking=True)
        stream.synchronize()

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def compare(self, dev: Any, off: int, data: bytes) -> Optional[int]:
        """None if GPU bytes [off, off+len) equal ``data``, else the first
        differing offset. The reference goes to the GPU from pinned memory
        (not ``frombuffer(...).cuda()``: see reference/gpu-machine.md)."""
        n = len(data)
        ref_host, mv = self.pinned(n)
        mv[:] = data
        ref = ref_host.to(self.device, non_blocking=False)
        got = dev[off : off + n]
        if bool(self.torch.equal(got, ref)):
            return None
        return int((got != ref).nonzero()[0].item())

    def free(self, buf: Any) -> None:
        pass  # the caching allocator reuses it for the next cell


class ModelBuf:
    """Host-model "device memory": an address and a length."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes


class ModelGpu:
    """``sluice.cuda.HostModel`` as the GPU (dry run): the same calls, the
    model's memory, its deferred copies."""

    dry = True

    def __init__(self) -> None:
        from sluice.cuda import HostModel

        self.model = HostModel()
        self._keep: List[Any] = []

    def describe(self) -> str:
        return "sluice.cuda.HostModel (software GPU: host memory, copies deferred to synchronization)"

    def device_buffer(self, nbytes: int) -> ModelBuf:
        return ModelBuf(self.model.alloc(nbytes), nbytes)

    def register(self, client: Any, buf: ModelBuf) -> Any:
        return client.register_gpu(buf.ptr, nbytes=buf.nbytes)

    def slice(self, buf: ModelBuf, off: int, n: int) -> Any:
        return ModelBuf(buf.ptr + off, n)

    def pinned(self, nbytes: int) -> Tuple[Any, memoryview]:
        raw = ctypes.create_string_buffer(nbytes)
        self.model.host_register(ctypes.addressof(raw), nbytes)
        return raw, memoryview(raw).cast("B")

    def unpin(self, pinned: Tuple[Any, memoryview]) -> None:
        pinned[1].release()
        self.model.host_unregister(ctypes.addressof(pinned[0]))

    def stream(self) -> int:
        return self.model.stream()

    def h2d(self, dev: ModelBuf, off: int, pinned: Tuple[Any, memoryview], n: int, stream: int) -> None:
        self.model.use(0)
        self.model.htod(dev.ptr + off, ctypes.addressof(pinned[0]), n, stream)
        self.model.synchronize(stream)

    def sync(self) -> None:
        pass

    def compare(self, dev: ModelBuf, off: int, data: bytes) -> Optional[int]:
        got = self.model.read(dev.ptr + off, len(data))
        if got == data:
            return None
        return next(i for i, (a, b) in enumerate(zip(got, data)) if a != b)

    def free(self, buf: ModelBuf) -> None:
        self.model.free(buf.ptr)


def backend(mode: str) -> Any:
    return ModelGpu() if mode == "dry" else TorchCuda()


# --------------------------------------------------------------- readers --
class GpuReader(lw.Reader):
    """A reader that lands objects in slots of one device buffer; remembers
    which key each slot holds (``last``) for the check after a pass."""

    #: Peers read ``per_call`` objects per thread into a pinned batch, then
    #: make one copy to the GPU (see ``shape``).
    def __init__(self, cfg: Dict[str, Any], gpu: Any) -> None:
        self.cfg, self.gpu = cfg, gpu
        self.bucket = cfg["bucket"]
        self.size = 0
        self.dev: Any = None
        self.last: Dict[int, str] = {}

    def shape(self, conc: int) -> Optional[Tuple[int, int]]:
        """(threads, objects per call) for batch readers; None: one object
        per call from ``conc`` threads."""
        return None

    def slots(self, conc: int) -> int:
        s = self.shape(conc)
        return conc if s is None else s[0] * s[1]

    def setup_cell(self, size: int, conc: int) -> None:
        self.size = size
        self.dev = self.gpu.device_buffer(self.slots(conc) * size)
        self.last = {}

    def teardown_cell(self) -> None:
        dev, self.dev = self.dev, None
        if dev is not None:
            self.gpu.free(dev)

    def samples(self) -> List[Tuple[str, int]]:
        """(key, byte offset in ``dev``) of what the GPU holds now."""
        return [(k, slot * self.size) for slot, k in sorted(self.last.items())]


class SluiceGpu(GpuReader):
    """``Client.get(path, into=gpu_region, offset=slot)``: one client, one GPU
    region over the reader's device buffer, a slot per thread."""

    def __init__(self, cfg: Dict[str, Any], gpu: Any, namespace: str, want: str) -> None:
        super().__init__(cfg, gpu)
        import sluice

        lane = cfg["gpu_lane_bytes"]
        lanes = max(cfg["concurrency"])
        kw: Dict[str, Any] = {"gpu_lane_bytes": lane, "gpu_staging_bytes": lane * lanes, "timeout": 600}
        if gpu.dry:
            kw["cuda"] = gpu.model
        self.sluice = sluice
        self.c = sluice.Client(cfg["socket"], **kw)
        self.ns, self.want = namespace, want
        self.region: Any = None
        self.method = (
            f"sluice.Client.get(path, into=register_gpu(device buffer), offset=slot): one client, a slot per "
            f"thread; bytes staged in pinned lanes of {lane >> 20} MiB (two halves, copy engine overlapped with "
            f"the network), up to {lanes} lanes; namespace {namespace!r} (data path {want}); GPU: {gpu.describe()}"
        )

    def version(self) -> str:
        return f"sluice {self.sluice.__version__} (this repo)"

    def setup_cell(self, size: int, conc: int) -> None:
        super().setup_cell(size, conc)
        self.region = self.gpu.register(self.c, self.dev)

    def teardown_cell(self) -> None:
        if self.region is not None:
            self.region.release()
        self.region = None
        super().teardown_cell()

    def _check(self, key: str, t: Any) -> None:
        if t.data_path != self.want or t.fallback_reason:
            raise RuntimeError(f"{key}: moved via {t.data_path} ({t.fallback_reason}), expected {self.want}")

    def read(self, key: str, slot: int) -> int:
        t = self.c.get(f"{self.ns}/{key}", into=self.region, offset=slot * self.size)
        self._check(key, t)
        self.last[slot] = key
        return t.bytes

    def close(self) -> None:
        self.c.close()


class SluiceGpuBatch(SluiceGpu):
    """``Client.get_many([GetSpec(path, gpu_region, offset), ...])``: one
    GetBatch per batch into consecutive slots of the device buffer; two
    threads of conc/2 (as the loaders' batch readers)."""

    batched = True

    def __init__(self, cfg: Dict[str, Any], gpu: Any, namespace: str, want: str) -> None:
        super().__init__(cfg, gpu, namespace, want)
        self.method = self.method.replace(
            "sluice.Client.get(path, into=register_gpu(device buffer), offset=slot): one client, a slot per thread",
            "sluice.Client.get_many([GetSpec(path, gpu_region, offset), ...]): one GetBatch per batch of conc/2 "
            "from each of two threads, into consecutive slots of one GPU region (items larger than half a lane "
            "are read one by one)",
        )

    def shape(self, conc: int) -> Optional[Tuple[int, int]]:
        return batch_shape(conc)

    def read_many(self, keys: Sequence[str], slot: int) -> List[int]:
        per = self.shape_per
        base = slot * per
        specs = [
            self.sluice.GetSpec(f"{self.ns}/{k}", self.region, (base + i) * self.size) for i, k in enumerate(keys)
        ]
        out = []
        for i, r in enumerate(self.c.get_many(specs)):
            r.unwrap()
            self._check(r.path, r.transfer)
            self.last[base + i] = keys[i]
            out.append(r.nbytes)
        return out

    def setup_cell(self, size: int, conc: int) -> None:
        self.shape_per = batch_shape(conc)[1]
        super().setup_cell(size, conc)


class PinnedPeer(GpuReader):
    """A peer that reads each object into pinned host memory, a batch of
    objects per thread, then makes one copy of the batch to the GPU on a
    stream of the thread's own, and waits for it (the best a loader can do
    with ``.cuda(non_blocking=True)``)."""

    batched = True

    def shape(self, conc: int) -> Optional[Tuple[int, int]]:
        per = max(1, min(self.cfg["peer_batch"], self.cfg["peer_batch_bytes"] // max(self.size, 1)))
        return conc, per

    def setup_cell(self, size: int, conc: int) -> None:
        self.size = size
        threads, per = self.shape(conc)  # type: ignore[misc]
        self.per = per
        super().setup_cell(size, conc)
        self.pins = [self.gpu.pinned(per * size) for _ in range(threads)]
        self.streams = [self.gpu.stream() for _ in range(threads)]

    def teardown_cell(self) -> None:
        for p in self.pins:
            self.gpu.unpin(p)
        self.pins, self.streams = [], []
        super().teardown_cell()

    def fill(self, key: str, mv: memoryview, off: int) -> int:
        """Reads object ``key`` into ``mv[off:]``; returns its length."""
        raise NotImplementedError

    def read_many(self, keys: Sequence[str], slot: int) -> List[int]:
        pin = self.pins[slot]
        ns = [self.fill(k, pin[1], i * self.size) for i, k in enumerate(keys)]
        base = slot * self.per
        self.gpu.h2d(self.dev, base * self.size, pin, len(keys) * self.size, self.streams[slot])
        for i, k in enumerate(keys):
            self.last[base + i] = k
        return ns

    def copy_note(self) -> str:
        return (
            "objects read into a pinned batch per thread (pin_memory=True tensor; up to peer_batch objects, at most "
            "peer_batch_bytes), then one copy_(non_blocking=True) of the batch into the device buffer on the "
            "thread's own stream, synchronized"
            if not self.gpu.dry
            else "objects read into a pinned batch per thread (host-model-registered), then one model htod copy"
        )


class Boto3Gpu(PinnedPeer):
    def __init__(self, cfg: Dict[str, Any], gpu: Any) -> None:
        super().__init__(cfg, gpu)
        self.r = lw.Boto3(cfg)
        self.method = f"boto3 get_object(...)['Body'].read() -> bytes, copied into pinned memory; {self.copy_note()}"

    def version(self) -> str:
        return self.r.version()

    def fill(self, key: str, mv: memoryview, off: int) -> int:
        data = self.r.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        mv[off : off + len(data)] = data
        return len(data)


class ObstoreGpu(PinnedPeer):
    def __init__(self, cfg: Dict[str, Any], gpu: Any) -> None:
        super().__init__(cfg, gpu)
        self.r = lw.Obstore(cfg)
        self.method = (
            f"obstore.get(store, key).bytes() -> obstore.Bytes (Rust buffer), copied into pinned memory; "
            f"{self.copy_note()}"
        )

    def version(self) -> str:
        return self.r.version()

    def fill(self, key: str, mv: memoryview, off: int) -> int:
        b = memoryview(self.r.obstore.get(self.r.store, key).bytes()).cast("B")
        mv[off : off + len(b)] = b
        return len(b)


class S3TorchGpu(PinnedPeer):
    def __init__(self, cfg: Dict[str, Any], gpu: Any) -> None:
        super().__init__(cfg, gpu)
        self.r = lw.S3Torch(cfg)
        self.method = (
            "s3torchconnectorclient MountpointS3Client.get_object (the AWS CRT client under s3torchconnector's "
            f"S3Reader; defaults), each chunk copied into pinned memory as it arrives; {self.copy_note()}"
        )

    def version(self) -> str:
        v = self.r.version()
        try:
            v += f", s3torchconnector {lw._dist_version('s3torchconnector')}"
        except Exception:
            v += " (s3torchconnector itself not installed: its client is what is measured)"
        return v

    def fill(self, key: str, mv: memoryview, off: int) -> int:
        pos = off
        for chunk in self.r.c.get_object(self.bucket, key):
            c = memoryview(chunk).cast("B")
            mv[pos : pos + len(c)] = c
            pos += len(c)
        return pos - off


class KvikioGpu(GpuReader):
    """kvikio's ``RemoteFile`` (libcurl, S3 SigV4) reading each object
    straight into its device slot (``RemoteFile.read(device_view)``: kvikio's
    own bounce buffers and copies), one ``open_s3`` per object with its size
    given (no HEAD); ``concurrency`` threads, and kvikio's thread pool of
    the same size (so as many requests are in flight)."""

    def __init__(self, cfg: Dict[str, Any], gpu: Any) -> None:
        super().__init__(cfg, gpu)
        if gpu.dry:
            try:
                ctypes.CDLL(os.environ.get("SLUICE_LIBCUDA", "libcuda.so.1"))
            except OSError as e:
                raise Unavailable(
                    f"dry run: kvikio needs the CUDA driver even to read into host memory, and there is none ({e})"
                ) from None
        nthreads = max(cfg["concurrency"])
        os.environ.setdefault("KVIKIO_NTHREADS", str(nthreads))
        try:
            import kvikio
        except Exception as e:
            raise Unavailable(f"import kvikio failed: {type(e).__name__}: {e}") from None
        self.kvikio = kvikio
        self.gateway, self.ak, self.sk = cfg["gateway"], cfg["access_key"], cfg["secret_key"]
        self.presigned: Dict[str, str] = {}
        self.use_presigned = False
        threads: Any = os.environ.get("KVIKIO_NTHREADS")
        try:
            import kvikio.defaults as kd

            kd.set({"num_threads": nthreads})
            threads = kd.get("num_threads")
        except Exception:
            pass  # older kvikio: KVIKIO_NTHREADS (set above) sizes the pool
        self.threads = threads
        self.pins: List[Any] = []
        self.streams: List[Any] = []
        self.views: List[Any] = []

    def version(self) -> str:
        return f"kvikio {getattr(self.kvikio, '__version__', '?')}"

    def teardown_cell(self) -> None:
        for p in self.pins:
            self.gpu.unpin(p)
        self.views, self.pins, self.streams = [], [], []
        super().teardown_cell()

    @property
    def method(self) -> str:  # type: ignore[override]
        how = (
            "RemoteFile.open_s3_presigned_url(boto3-presigned URL, nbytes) (open_s3's own SigV4 was refused "
            "by the gateway; URLs presigned before each pass, untimed)"
            if self.use_presigned
            else "RemoteFile.open_s3(bucket, key, nbytes=size, aws_endpoint_url=gateway, credentials) (SigV4 by libcurl)"
        )
        where = (
            "f.read(device slot view): straight into GPU memory"
            if not self.gpu.dry
            else "dry run: f.read(pinned host buffer), then the host model's copy (kvikio cannot drive the model)"
        )
        return f"kvikio {how}; {where}; one open per object; kvikio thread pool {self.threads} threads"

    def _open(self, key: str) -> Any:
        R = self.kvikio.RemoteFile
        if self.use_presigned:
            return R.open_s3_presigned_url(self.presigned[key], nbytes=self.size)
        return R.open_s3(
            self.bucket,
            key,
            nbytes=self.size,
            aws_region_name="us-east-1",
            aws_access_key_id=self.ak,
            aws_secret_access_key=self.sk,
            aws_endpoint_url=self.gateway,
        )

    def setup_cell(self, size: int, conc: int) -> None:
        super().setup_cell(size, conc)
        if self.gpu.dry:
            self.pins = [self.gpu.pinned(size) for _ in range(conc)]
            self.streams = [self.gpu.stream() for _ in range(conc)]
            return
        # Device views of the slots, made once per cell: cupy arrays over the
        # torch memory (kvikio's own array type), else the torch slices.
        views = [self.gpu.slice(self.dev, s * size, size) for s in range(conc)]
        try:
            import cupy

            self.views = [cupy.asarray(v) for v in views]
        except Exception:
            self.views = views

    def prepare_pass(self, keys: Sequence[str]) -> None:
        if self.use_presigned:
            import boto3
            from botocore.config import Config

            s3 = boto3.client(
                "s3", endpoint_url=self.gateway, aws_access_key_id=self.ak, aws_secret_access_key=self.sk,
                region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
            )  # fmt: skip
            self.presigned = {
                k: s3.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": k}, ExpiresIn=3600)
                for k in keys
            }

    def probe(self, key: str) -> None:
        """One untimed read with open_s3; on failure, presigned URLs."""
        try:
            self.read(key, 0)
        except Exception as e:
            first = f"{type(e).__name__}: {e}"
            self.use_presigned = True
            try:
                self.prepare_pass([key])
                self.read(key, 0)
            except Exception as e2:
                raise RuntimeError(f"kvikio open_s3 failed ({first}); presigned URL too ({type(e2).__name__}: {e2})")

    def read(self, key: str, slot: int) -> int:
        f = self._open(key)
        try:
            if self.gpu.dry:
                import numpy as np

                raw, mv = self.pins[slot]
                n = f.read(np.frombuffer(mv, dtype=np.uint8)[: self.size])
                self.gpu.h2d(self.dev, slot * self.size, (raw, mv), n, self.streams[slot])
            else:
                n = f.read(self.views[slot])
        finally:
            f.close()
        self.last[slot] = key
        return n


def make_reader(name: str, cfg: Dict[str, Any], gpu: Any) -> GpuReader:
    ns = cfg["namespace"]
    if name == "sluice get->gpu (http)":
        return SluiceGpu(cfg, gpu, ns, "http")
    if name == "sluice get->gpu (rdma/tcp)":
        return SluiceGpu(cfg, gpu, ns + "-rdma", "rdma")
    if name == "sluice batch->gpu (http)":
        return SluiceGpuBatch(cfg, gpu, ns, "http")
    if name == "sluice batch->gpu (rdma/tcp)":
        return SluiceGpuBatch(cfg, gpu, ns + "-rdma", "rdma")
    if name == "kvikio":
        return KvikioGpu(cfg, gpu)
    if name == "s3torchconnector":
        return S3TorchGpu(cfg, gpu)
    if name == "obstore":
        return ObstoreGpu(cfg, gpu)
    if name == "boto3":
        return Boto3Gpu(cfg, gpu)
    raise ValueError(f"unknown reader {name!r}")


# --------------------------------------------------------------- harness --
def key_index(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def verify(name: str, reader: GpuReader, gpu: Any, label: str, size: int, limit: int, turn: int) -> int:
    """Compares up to ``limit`` of the objects in GPU memory (rotating over
    the slots from pass to pass) with their reference; raises on a mismatch.
    Returns how many were compared."""
    gpu.sync()
    samples = reader.samples()
    if not samples or limit <= 0:
        return 0
    start = (turn * limit) % len(samples)
    picked = [samples[(start + j) % len(samples)] for j in range(min(limit, len(samples)))]
    for key, off in picked:
        want = lr.object_bytes(label, size, key_index(key))
        at = gpu.compare(reader.dev, off, want)
        if at is not None:
            raise RuntimeError(f"{name}: {key} in GPU memory differs from the object at byte {at}")
    return len(picked)


def run_gpu_reader(name: str, cfg: Dict[str, Any]) -> None:
    try:
        gpu = backend(cfg["mode"])
        reader = make_reader(name, cfg, gpu)
    except Exception as e:  # import or set-up failure: reported, not dropped
        emit(event="unavailable", reason=f"{type(e).__name__}: {e}" if not isinstance(e, Unavailable) else str(e))
        return
    pids = cfg["pids"]
    info_sent = False
    for label, size, count in cfg["sizes"]:
        keys = [f"{cfg['prefix']}{label}/obj-{i:05d}" for i in range(count)]
        for conc in cfg["concurrency"]:
            reader.setup_cell(size, conc)
            try:
                if isinstance(reader, KvikioGpu) and not info_sent:
                    reader.probe(keys[0])
                if not info_sent:
                    emit(event="info", version=reader.version(), method=reader.method)
                    info_sent = True
                shape = reader.shape(conc)
                threads, per = shape if shape else (conc, 1)
                warm = keys[: min(len(keys), 2 * threads * per)]
                if isinstance(reader, KvikioGpu):
                    reader.prepare_pass(warm)
                reader.last = {}
                timed_pass(reader, warm, size, conc, shape=shape)
                verify(name, reader, gpu, label, size, cfg["verify"], 0)
                for rep in range(cfg["repeats"]):
                    if isinstance(reader, KvikioGpu):
                        reader.prepare_pass(keys)
                    reader.last = {}  # only what this pass wrote is checked
                    r = timed_pass(reader, keys, size, conc, pids, shape=shape)
                    checked = verify(name, reader, gpu, label, size, cfg["verify"], rep + 1)
                    emit_run(
                        label, size, conc, rep, len(keys), r["seconds"], r["lat"], r["cpu"],
                        verified_on_gpu=checked, threads=threads, objects_per_call=per,
                    )  # fmt: skip
            finally:
                reader.teardown_cell()
    reader.close()


def probe(cfg: Dict[str, Any]) -> None:
    """The GPU and its software, or why there is none (``unavailable``)."""
    info: Dict[str, Any] = {"mode": cfg["mode"]}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except ImportError as e:
        info["torch"] = None
        torch = None  # type: ignore[assignment]
        why_torch = f"torch is not installed ({e})"
    if cfg["mode"] == "dry":
        from sluice.cuda import HostModel

        info["gpu_name"] = HostModel().device_name(0)
        info["note"] = "dry run: sluice.cuda.HostModel stands in for the GPU; no CUDA is used"
        emit(event="probe", **info)
        return
    if torch is None:
        emit(event="unavailable", reason=why_torch, **info)
        return
    if not torch.cuda.is_available():
        emit(event="unavailable", reason=f"torch {torch.__version__} sees no CUDA device", **info)
        return
    p = torch.cuda.get_device_properties(0)
    info.update(
        gpu_name=torch.cuda.get_device_name(0),
        gpu_count=torch.cuda.device_count(),
        gpu_memory_gib=round(p.total_memory / (1 << 30), 1),
        compute_capability=f"{p.major}.{p.minor}",
    )
    try:
        lib = ctypes.CDLL(os.environ.get("SLUICE_LIBCUDA", "libcuda.so.1"))
        v = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(v))
        info["cuda_driver_api"] = f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError as e:
        emit(event="unavailable", reason=f"libcuda.so.1 does not load ({e}): Sluice's GPU regions need it", **info)
        return
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name,pcie.link.gen.current,pcie.link.width.current",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if out.returncode == 0:
            f = [x.strip() for x in out.stdout.splitlines()[0].split(",")]
            info.update(driver=f[0], pcie=f"gen{f[2]} x{f[3]}" if len(f) > 3 else None)
    except (OSError, subprocess.TimeoutExpired, IndexError):
        pass
    try:
        from sluice.cuda import ATTR_DMA_BUF_SUPPORTED, ATTR_HOST_REGISTER_SUPPORTED, try_driver

        d = try_driver()
        if d is not None:
            info["host_register_supported"] = d.attribute(0, ATTR_HOST_REGISTER_SUPPORTED)
            info["dma_buf_supported"] = d.attribute(0, ATTR_DMA_BUF_SUPPORTED)
    except Exception as e:  # informative only
        info["sluice_cuda_error"] = f"{type(e).__name__}: {e}"
    emit(event="probe", **info)


def main() -> None:
    cfg = json.load(sys.stdin)
    try:
        if cfg.get("op") == "probe":
            probe(cfg)
        else:
            run_gpu_reader(cfg["reader"], cfg)
    except Exception as e:
        emit(event="error", reason=f"{type(e).__name__}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
