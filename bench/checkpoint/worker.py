"""One writer/reader of the checkpoint benchmark, in a process of its own.

Run by ``run.py`` as ``python worker.py`` with a JSON configuration on
stdin (``writer``, the stack's socket/gateway/credentials/pids, the state
dict's ``layout``, ``device``, ``repeats``, ...); prints JSON lines:

* ``{"event": "info", "version": ..., "method": ...}`` once set up,
* ``{"event": "unavailable", "reason": ...}`` if it cannot be (exit 0),
* ``{"event": "state", ...}`` the state dict it built: bytes, tensors, and a
  digest of every tensor's checksum (the same for every writer),
* ``{"event": "run", "op": "save"|"load", ...}`` per timed save or load:
  seconds, CPU seconds of this process, the shim, agent and gateway, and
  this process's RSS (before, peak during, extra above the state dict),
* ``{"event": "verified", ...}`` after each load: every tensor's checksum
  and every plain item equal to what was saved,
* ``{"event": "error", "reason": ...}`` on a failure (exit 1).

Each round trip: build the state dict (random bits, seeded per tensor;
untimed), checksum every tensor (CRC-32 of its bytes), save it ``repeats``
times (timed), drop it, then load it ``repeats`` times (timed), each load
checked tensor by tensor against the checksums taken before the save.

RSS: ``VmHWM`` is reset before each timed phase (``/proc/self/clear_refs``
``5``), so each phase's peak is its own; the extra RSS of a save is its peak
over the RSS right before it (the state dict is already resident), of a
load its peak over the RSS before it less the state dict's bytes (the load
makes the state dict; on ``--device cuda`` the state lives on the GPU and
nothing is subtracted). ``ru_maxrss`` (the process's life) is reported too.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import os
import resource
import sys
import time
import warnings
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import layout as lay  # noqa: E402


sys.path.insert(0, BENCH)
from benchlib import load as _load  # noqa: E402


lw = _load("sluice_bench_loaders_worker", os.path.join(BENCH, "loaders", "worker.py"))
emit, snapshot, cpu_delta = lw.emit, lw.snapshot, lw.cpu_delta

MIB = 1 << 20
REGION = "us-east-1"


# ------------------------------------------------------------------- RSS --
def status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_hwm() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_libc: Any = None


def trim() -> None:
    """Frees what Python and malloc hold on to, so the next phase starts
    from the memory actually in use."""
    global _libc
    gc.collect()
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ----------------------------------------------------------------- state --
def get_path(d: Any, path: Tuple[str, ...]) -> Any:
    for k in path:
        d = d[k]
    return d


def set_path(d: Dict[str, Any], path: Tuple[str, ...], value: Any) -> None:
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def build(desc: Dict[str, Any], device: str, empty: bool = False) -> Dict[str, Any]:
    """The state dict of ``desc`` (layout.describe): every tensor random
    bits from a generator seeded by its index (``empty``: allocated only,
    plain items blank, as a DCP load's target)."""
    import torch

    cfg = desc["config"]
    state: Dict[str, Any] = {}
    gen = torch.Generator(device=device)
    for i, (path, dtype, shape) in enumerate(lay.tensors(cfg)):
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if not empty:
            gen.manual_seed(0x5EED0000 + i)
            flat = t.reshape(-1).view(torch.uint8)
            if flat.numel() % 8 == 0:
                flat.view(torch.int64).random_(generator=gen)
            else:
                flat.random_(0, 256, generator=gen)
            if path[-1] == "step":
                t.fill_(1000.0)
        set_path(state, path, t)
    for path, value in lay.plain_items(cfg).items():
        set_path(state, path, blank(value) if empty else value)
    return state


def blank(value: Any) -> Any:
    """A placeholder of ``value``'s shape for an in-place (DCP) load: DCP
    walks into dicts and into lists holding dicts, so those stay; every
    leaf it stores whole is None."""
    if isinstance(value, dict):
        return {k: blank(v) for k, v in value.items()}
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return [blank(v) for v in value]
    return None


def checksums(state: Dict[str, Any], desc: Dict[str, Any]) -> Dict[str, Tuple[int, int, str, List[int]]]:
    """name -> (CRC-32 of the tensor's bytes, bytes, dtype, shape)."""
    import torch

    out = {}
    for path, _, _ in lay.tensors(desc["config"]):
        t = get_path(state, path)
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"{'.'.join(path)}: a {type(t).__name__}, not a tensor")
        c = t.detach()
        if c.device.type != "cpu":
            c = c.cpu()
        c = c.contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy() if c.numel() else b""
        out[".".join(path)] = (zlib.crc32(memoryview(raw)), c.numel() * c.element_size(), str(c.dtype), list(c.shape))
    return out


def digest(sums: Dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(sorted(sums.items())).encode()).hexdigest()[:16]


def verify(state: Dict[str, Any], desc: Dict[str, Any], want: Dict[str, Any], device: str) -> int:
    """Every tensor's checksum, bytes, dtype, shape and device, and every
    plain item, as saved; returns the tensors checked."""
    got = checksums(state, desc)
    bad = [k for k in want if got.get(k) != want[k]]
    if bad:
        k = bad[0]
        raise RuntimeError(f"{len(bad)} tensors differ after the load, e.g. {k}: saved {want[k]}, loaded {got.get(k)}")
    for path, _, _ in lay.tensors(desc["config"]):
        dev = get_path(state, path).device.type
        if dev != device:
            raise RuntimeError(f"{'.'.join(path)} loaded onto {dev}, expected {device}")
    for path, value in lay.plain_items(desc["config"]).items():
        if get_path(state, path) != value:
            raise RuntimeError(f"{'.'.join(path)}: loaded {get_path(state, path)!r}, saved {value!r}")
    return len(got)


# --------------------------------------------------------------- writers --
class Writer:
    """Saves a state dict and loads it back (``load`` gets a function that
    makes an empty target state dict, for in-place loaders)."""

    method = ""
    #: Sluice writers count the shim's CPU as host CPU.
    sluice = False
    #: Where things go: every save to a new step's prefix (as a training
    #: job does), every load from the last one saved.
    prefix = ""
    step = 0

    def key(self, leaf: str) -> str:
        return f"{self.prefix}step-{self.step}/{leaf}"

    def version(self) -> str:
        return ""

    def save(self, state: Dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _torch_load(f: Any, device: str) -> Dict[str, Any]:
    import torch

    return torch.load(f, weights_only=True, map_location=None if device == "cpu" else device)


class SluiceStream(Writer):
    sluice = True

    def __init__(self, cfg: Dict[str, Any]) -> None:
        import sluice
        import sluice.checkpoint

        self.ck = sluice.checkpoint
        self.c = sluice.Client(cfg["socket"])
        self.ns = cfg["namespace"]
        self.chunk = cfg["chunk_bytes"]
        self.prefetch = cfg["prefetch"]
        self.device = cfg["device"]
        self.method = (
            f"torch.save(state, sluice.checkpoint.CheckpointWriter(client, path, chunk_bytes={self.chunk >> 20} MiB, "
            f"buffers=2)); torch.load(sluice.checkpoint.open_read(client, path, prefetch={self.prefetch})); "
            f"namespace {cfg['namespace']!r}"
            + ("; GPU tensors: torch.save copies each storage to the host, torch.load(map_location='cuda')"
               if self.device == "cuda" else "")
        )  # fmt: skip

    def version(self) -> str:
        import sluice

        return f"sluice {sluice.__version__} (this repo)"

    def save(self, state: Dict[str, Any]) -> None:
        import torch

        with self.ck.CheckpointWriter(self.c, f"{self.ns}/{self.key('model.pt')}", chunk_bytes=self.chunk) as w:
            torch.save(state, w)

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        with self.ck.open_read(self.c, f"{self.ns}/{self.key('model.pt')}", prefetch=self.prefetch) as r:
            return _torch_load(r, self.device)

    def close(self) -> None:
        self.c.close()


class SluiceDcp(Writer):
    sluice = True

    def __init__(self, cfg: Dict[str, Any]) -> None:
        import sluice
        import sluice.dcp

        if not sluice.dcp.HAVE_DCP:
            raise ImportError("torch.distributed.checkpoint is not available")
        self.dcp = sluice.dcp
        self.c = sluice.Client(cfg["socket"])
        self.ns = cfg["namespace"]
        self.method = (
            "sluice.dcp.save(state, path, client) / sluice.dcp.load(target, path, client) (torch.distributed."
            "checkpoint, one process, no process group; StorageWriter/Reader defaults: 8 threads, an object per "
            f"tensor >= 1 MiB); namespace {cfg['namespace']!r}"
            + ("; GPU tensors straight from and into GPU memory (register_gpu)" if cfg["device"] == "cuda" else "")
        )

    def version(self) -> str:
        import sluice
        import torch

        return f"sluice {sluice.__version__} (this repo), torch {torch.__version__}"

    def save(self, state: Dict[str, Any]) -> None:
        self.dcp.save(state, f"{self.ns}/{self.key('dcp')}", self.c)

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        state = target()
        self.dcp.load(state, f"{self.ns}/{self.key('dcp')}", self.c)
        return state

    def close(self) -> None:
        self.c.close()


class SluiceDcpRegistered(SluiceDcp):
    """DCP with the state in registered memory, as a training job keeps its
    model after ``sluice.dcp.register_state_dict`` (once, untimed: the
    "prepared" event reports what it cost): saves store the tensors from
    where they are and loads read into them, no copy on the host."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        super().__init__(cfg)
        self.registered: Optional[Dict[str, Any]] = None
        self.method = (
            "state = sluice.dcp.register_state_dict(state, client) once (untimed; a training job keeps its model "
            "there), then sluice.dcp.save(state, path, client) / sluice.dcp.load(state, path, client) into that "
            "registered state (zeroed first, untimed); otherwise as sluice dcp"
        )

    def prepare(self, state: Dict[str, Any]) -> Dict[str, Any]:
        self.registered = self.dcp.register_state_dict(state, self.c)
        return self.registered

    def before_load(self) -> None:
        assert self.registered is not None
        for t in _tensors(self.registered):
            t.zero_()

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        assert self.registered is not None
        self.dcp.load(self.registered, f"{self.ns}/{self.key('dcp')}", self.c)
        return self.registered


def _tensors(obj: Any) -> List[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _s3client_config() -> Any:
    from s3torchconnector import S3ClientConfig

    # Path-style addressing: the gateway is an IP address, not a bucket's
    # virtual host. Everything else as s3torchconnector sets it.
    return S3ClientConfig(force_path_style=True)


class S3TorchCheckpoint(Writer):
    def __init__(self, cfg: Dict[str, Any]) -> None:
        from s3torchconnector import S3Checkpoint

        self.ck = S3Checkpoint(region=REGION, endpoint=cfg["gateway"], s3client_config=_s3client_config())
        self.bucket = cfg["bucket"]
        self.device = cfg["device"]
        self.method = (
            "s3torchconnector S3Checkpoint(region, endpoint=gateway, S3ClientConfig(force_path_style=True)): "
            "torch.save(state, checkpoint.writer(uri)) (CRT multipart upload, defaults: 8 MiB parts, "
            "10 Gbps target), torch.load(checkpoint.reader(uri)) (default sequential reader)"
            + ("; GPU tensors: torch.save copies each storage to the host, torch.load(map_location='cuda')"
               if self.device == "cuda" else "")
        )  # fmt: skip

    def version(self) -> str:
        return f"s3torchconnector {_dist_version('s3torchconnector')}, s3torchconnectorclient " + _dist_version(
            "s3torchconnectorclient"
        )

    def save(self, state: Dict[str, Any]) -> None:
        import torch

        with self.ck.writer(f"s3://{self.bucket}/{self.key('model.pt')}") as w:
            torch.save(state, w)

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        with self.ck.reader(f"s3://{self.bucket}/{self.key('model.pt')}") as r:
            return _torch_load(r, self.device)


class S3TorchDcp(Writer):
    def __init__(self, cfg: Dict[str, Any]) -> None:
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter

        self.W, self.R, self.FS, self.Client = S3StorageWriter, S3StorageReader, S3FileSystem, S3Client
        self.bucket = cfg["bucket"]
        self.endpoint = cfg["gateway"]
        self.threads = cfg["peer_threads"]
        self.method = (
            f"torch.distributed.checkpoint.save/load with s3torchconnector.dcp S3StorageWriter(region, uri, "
            f"thread_count={self.threads}) / S3StorageReader(region, uri) (its default dcp_optimized reader), one "
            "process, no process group; their S3FileSystem given S3Client(region, endpoint=gateway, "
            "S3ClientConfig(force_path_style=True)) (1.5.0's storage classes take no endpoint)"
            + ("; GPU tensors: DCP's file writer copies each to the host" if cfg["device"] == "cuda" else "")
        )

    def version(self) -> str:
        import torch

        return f"s3torchconnector {_dist_version('s3torchconnector')}, torch {torch.__version__}"

    def _fs(self, reader_constructor: Any = None) -> Any:
        client = self.Client(REGION, endpoint=self.endpoint, s3client_config=_s3client_config())
        return self.FS(REGION, s3_client=client, reader_constructor=reader_constructor)

    def save(self, state: Dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        uri = f"s3://{self.bucket}/{self.key('dcp')}"
        w = self.W(REGION, uri, s3client_config=_s3client_config(), thread_count=self.threads)
        w.fs = self._fs()
        w.path = w.fs.init_path(uri)
        dcp.save(state, storage_writer=w)

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        import torch.distributed.checkpoint as dcp

        state = target()
        uri = f"s3://{self.bucket}/{self.key('dcp')}"
        r = self.R(REGION, uri, s3client_config=_s3client_config())
        r.fs = self._fs(r._reader_constructor)
        r.path = r.fs.init_path(uri)
        dcp.load(state, storage_reader=r)
        return state


class Boto3(Writer):
    def __init__(self, cfg: Dict[str, Any]) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        conc = cfg["peer_threads"]
        part = cfg["boto3_part_bytes"]
        self.s3 = boto3.client(
            "s3",
            endpoint_url=cfg["gateway"],
            aws_access_key_id=cfg["access_key"],
            aws_secret_access_key=cfg["secret_key"],
            region_name=REGION,
            config=Config(
                max_pool_connections=conc + 4,
                s3={"addressing_style": "path"},
                # Their best: no client-side CRC32 of every byte (the gateway
                # checks Content-MD5/x-amz-content-sha256 as it must).
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self.tc = TransferConfig(
            multipart_threshold=part, multipart_chunksize=part, max_concurrency=conc, use_threads=True,
            preferred_transfer_client="classic",
        )  # fmt: skip
        self.bucket = cfg["bucket"]
        self.device = cfg["device"]
        self.method = (
            "buf = io.BytesIO(); torch.save(state, buf); s3.upload_fileobj(buf, ...) / s3.download_fileobj(..., buf); "
            f"torch.load(buf); TransferConfig(multipart {part >> 20} MiB parts, max_concurrency={conc}), "
            "checksums only when required"
            + ("; GPU tensors: torch.save copies each storage to the host, torch.load(map_location='cuda')"
               if self.device == "cuda" else "")
        )  # fmt: skip

    def version(self) -> str:
        return f"boto3 {_dist_version('boto3')}, botocore {_dist_version('botocore')}, s3transfer " + _dist_version(
            "s3transfer"
        )

    def save(self, state: Dict[str, Any]) -> None:
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        self.s3.upload_fileobj(buf, self.bucket, self.key("model.pt"), Config=self.tc)
        del buf

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        buf = io.BytesIO()
        self.s3.download_fileobj(self.bucket, self.key("model.pt"), buf, Config=self.tc)
        buf.seek(0)
        try:
            return _torch_load(buf, self.device)
        finally:
            del buf


class _Sink(io.RawIOBase):
    """A write-only stream that keeps nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.n += n
        return n


class InMemory(Writer):
    """No storage at all: what torch.save/torch.load cost on their own. The
    save serializes into a sink that keeps nothing (then, untimed, into a
    BytesIO for the loads); the load is torch.load from that BytesIO."""

    method = (
        "reference, no I/O: torch.save(state, sink) where sink.write keeps nothing (timed), then untimed into a "
        "BytesIO; torch.load(BytesIO) (timed). The CPU floor of any torch.save/torch.load-based writer"
    )

    def __init__(self, cfg: Dict[str, Any]) -> None:
        self.device = cfg["device"]
        self.blob: Optional[io.BytesIO] = None
        self.state: Optional[Dict[str, Any]] = None

    def version(self) -> str:
        import torch

        return f"torch {torch.__version__}"

    def save(self, state: Dict[str, Any]) -> None:
        import torch

        torch.save(state, _Sink())
        self.state = state

    def after_saves(self) -> None:
        """Untimed: the bytes the loads read (the state is still alive)."""
        import torch

        self.blob = io.BytesIO()
        torch.save(self.state, self.blob)
        self.state = None

    def load(self, target: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        assert self.blob is not None
        self.blob.seek(0)
        return _torch_load(self.blob, self.device)


WRITERS: Dict[str, Callable[[Dict[str, Any]], Writer]] = {
    "sluice stream": SluiceStream,
    "sluice dcp": SluiceDcp,
    "sluice dcp registered": SluiceDcpRegistered,
    "s3torchconnector S3Checkpoint": S3TorchCheckpoint,
    "s3torchconnector dcp": S3TorchDcp,
    "boto3 upload/download_fileobj": Boto3,
    "torch.save/load (no I/O)": InMemory,
}


# --------------------------------------------------------------- harness --
def probe() -> None:
    """What torch and CUDA there are (run.py asks before starting the stack)."""
    try:
        import torch
    except ImportError as e:
        emit(event="unavailable", reason=f"torch is not installed: {e}")
        return
    info: Dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info.update(gpu_name=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
    else:
        info["cuda_unavailable"] = (
            "torch was built without CUDA" if torch.version.cuda is None
            else "torch.cuda.is_available() is False (no NVIDIA driver or device here)"
        )  # fmt: skip
    emit(event="probe", **info)


def timed(
    op: str, fn: Callable[[], Any], pids: Dict[str, int], rep: int, ref_kib: int, extra_base: int,
    cuda: bool = False,
) -> Tuple[Any, Dict[str, Any]]:
    """Runs ``fn`` as one timed phase: wall time, CPU of every process,
    RSS before and at peak (VmHWM reset first). The extra RSS is the peak
    over ``ref_kib`` (the RSS before the phase's first repeat: memory a
    writer keeps from one repeat to the next still counts) less
    ``extra_base`` bytes. ``cuda``: the phase ends when the GPU is done."""
    rss0 = status_kib("VmRSS") or 0
    hwm_ok = reset_hwm()
    before = snapshot(pids)
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        import torch

        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    cpu = cpu_delta(before, snapshot(pids))
    hwm = status_kib("VmHWM") if hwm_ok else None
    run = {
        "event": "run",
        "op": op,
        "repeat": rep,
        "seconds": secs,
        "cpu_s": {
            "worker": (cpu["self"] or 0.0) + (cpu["children"] or 0.0),
            "shim": cpu.get("shim"),
            "agent": cpu.get("agent"),
            "gateway": cpu.get("gateway"),
        },
        "rss_before_mib": rss0 / 1024,
        "rss_peak_mib": None if hwm is None else hwm / 1024,
        "rss_ref_mib": ref_kib / 1024,
        "rss_extra_mib": None if hwm is None else (hwm - ref_kib) / 1024 - extra_base / MIB,
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    return out, run


def run(cfg: Dict[str, Any]) -> None:
    name, device, desc = cfg["writer"], cfg["device"], cfg["layout"]
    try:
        # If memory runs out (8 GiB states held twice by some peers), the
        # kernel takes this worker first, not someone else's process.
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    try:
        import torch

        if device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda: torch.cuda.is_available() is False")
            torch.zeros(1, device="cuda")  # the CUDA context before the baseline
        writer = WRITERS[name](cfg)
    except Exception as e:  # import or set-up failure: reported, not dropped
        emit(event="unavailable", reason=f"{type(e).__name__}: {e}")
        return
    warnings.filterwarnings("ignore")
    emit(event="info", version=writer.version(), method=writer.method)
    pids = cfg["pids"]
    baseline = status_kib("VmRSS")

    t0 = time.perf_counter()
    state = build(desc, device)
    sums = checksums(state, desc)
    state_bytes = sum(v[1] for v in sums.values())
    if state_bytes != desc["state_bytes"]:
        raise RuntimeError(f"built {state_bytes} bytes of tensors, the layout says {desc['state_bytes']}")
    emit(
        event="state",
        tensors=len(sums),
        state_bytes=state_bytes,
        digest=digest(sums),
        build_s=time.perf_counter() - t0,
        rss_baseline_mib=(baseline or 0) / 1024,
        rss_with_state_mib=(status_kib("VmRSS") or 0) / 1024,
    )
    prepare = getattr(writer, "prepare", None)
    # What a load allocates on the host besides the writer's own memory (the
    # target state), not counted as extra: nothing for a writer that loads
    # into the registered state it already holds.
    on_host = state_bytes if device == "cpu" and prepare is None else 0
    if prepare is not None and device == "cpu":
        # Once, untimed (a training job does it when it builds its model);
        # the original state is dropped, as the job would.
        before, t0 = snapshot(pids), time.perf_counter()
        state = prepare(state)
        cpu = cpu_delta(before, snapshot(pids))
        emit(event="prepared", seconds=time.perf_counter() - t0, cpu_s=(cpu["self"] or 0.0) + (cpu["children"] or 0.0))
        trim()
    writer.prefix = cfg["prefix"]
    ref = status_kib("VmRSS") or 0
    for rep in range(cfg["repeats"]):
        writer.step = rep
        _, r = timed("save", lambda: writer.save(state), pids, rep, ref, 0, device == "cuda")
        emit(**r)
    if isinstance(writer, InMemory):
        writer.after_saves()
    del state
    trim()
    if device == "cuda":
        torch.cuda.empty_cache()

    def target() -> Dict[str, Any]:
        return build(desc, device, empty=True)

    ref = status_kib("VmRSS") or 0
    for rep in range(cfg["repeats"]):
        if hasattr(writer, "before_load"):
            writer.before_load()
        loaded, r = timed("load", lambda: writer.load(target), pids, rep, ref, on_host, device == "cuda")
        emit(**r)
        t1 = time.perf_counter()
        n = verify(loaded, desc, sums, device)
        emit(event="verified", repeat=rep, tensors=n, digest=digest(sums), verify_s=time.perf_counter() - t1)
        del loaded
        trim()
        if device == "cuda":
            torch.cuda.empty_cache()
    writer.close()
    emit(event="done", ru_maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    cfg = json.load(sys.stdin)
    if cfg.get("op") == "probe":
        probe()
        return
    try:
        run(cfg)
    except Exception as e:
        import traceback

        traceback.print_exc()
        emit(event="error", reason=f"{type(e).__name__}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
