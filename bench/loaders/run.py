"""Loaders benchmark: Sluice's clients vs S3 peers reading the same objects.

Run through ``bench/run loaders [options]`` (which builds the release
binaries and the venv), or directly with a Python that has the readers'
packages: ``python bench/loaders/run.py --bin-dir target/release``.

Set-up: ``sluice up --rdma`` (gateway with its embedded store, agent, shim)
in a temporary directory; the objects (default 4 KiB x 2000, 1 MiB x 256,
64 MiB x 16) are put through the gateway once and read by every reader:

* Sluice: the Python client via the shim over the HTTP data path and the
  RDMA path (``tcp`` transport), and the Rust client (``sluice bench``) over
  both;
* peers, straight from the gateway over plain HTTP with the same
  credentials: boto3, s3torchconnectorclient (AWS CRT), s5cmd, obstore.

Each reader runs in its own process (``worker.py``); concurrency N is N
threads in that process (the Rust client: N requests in flight on its tokio
runtime; s5cmd: N threads each running one ``s5cmd cat`` at a time). Per
cell (reader x size x concurrency) it makes an untimed warm-up pass, then
``--repeats`` timed passes over all objects of the size; the table shows the
median of each metric.

Host CPU per GiB is the CPU of the processes that would run on the GPU node:
for Sluice the client process plus the shim, with the agent (the DPU's
process) in its own column; for peers the reader process (s5cmd: this
process and its s5cmd children). The gateway's CPU (the storage server) is
in the JSON for reference only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GIB = float(1 << 30)
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402

SIZES = [("4KiB", 4 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20), ("64MiB", 64 << 20)]
SLUICE = [
    "sluice-py (http)",
    "sluice-py (rdma/tcp)",
    "sluice-py (http) (python)",
    "sluice-py batch->region",
    "sluice-py batch->region (python)",
    "sluice-py batch->bytes",
    "sluice-py get_bytes",
    "sluice-py get_bytes (python)",
    "sluice-py batch->bytes (python)",
    "sluice-py batch->view",
    "sluice-py get_bytes view",
    "sluice-rs (http)",
    "sluice-rs (rdma/tcp)",
    "sluice-rs batch (http)",
]
#: Readers that fill registered memory (the target: >= 1.0x the best peer's
#: objects/s) and those that return bytes (>= 0.8x).
REGION_FILLING = ["sluice-py (http)", "sluice-py (rdma/tcp)", "sluice-py (http) (python)", "sluice-py batch->region",
                  "sluice-py batch->region (python)", "sluice-rs (http)", "sluice-rs (rdma/tcp)",
                  "sluice-rs batch (http)"]  # fmt: skip
BYTES_RETURNING = ["sluice-py batch->bytes", "sluice-py get_bytes", "sluice-py batch->view", "sluice-py get_bytes view",
                   "sluice-py get_bytes (python)", "sluice-py batch->bytes (python)"]  # fmt: skip
PEERS = ["boto3", "s3torchconnectorclient", "s5cmd", "obstore"]
SLUICE_WRITERS = ["sluice-py put(region)", "sluice-py put(bytes)"]
PEER_WRITERS = ["boto3", "obstore", "s5cmd"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench/run loaders")
    ap.add_argument("--small", type=int, default=2000, help="number of 4 KiB objects (default 2000)")
    ap.add_argument("--kib64", type=int, default=1000, help="number of 64 KiB objects (default 1000)")
    ap.add_argument("--medium", type=int, default=256, help="number of 1 MiB objects (default 256)")
    ap.add_argument("--large", type=int, default=16, help="number of 64 MiB objects (default 16)")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per cell; the median is shown (default 3)")
    ap.add_argument("--concurrency", default="1,16", help="comma-separated concurrency levels (default 1,16)")
    ap.add_argument(
        "--readers", default=",".join(SLUICE + PEERS), help="comma-separated subset of readers (default: all)"
    )
    ap.add_argument(
        "--s5cmd-small",
        type=int,
        default=500,
        help="s5cmd starts one process per object: read only this many of the 4 KiB objects with it "
        "(default 500; 0 = all). Its 4 KiB cells are marked reduced.",
    )
    ap.add_argument(
        "--write-small", type=int, default=1000, help="4 KiB objects each writer puts, 16 in flight (default 1000; 0 skips)"
    )
    ap.add_argument(
        "--write-large-mib", type=int, default=1024, help="size of the one large object each writer puts (MiB; default 1024)"
    )
    ap.add_argument(
        "--writers", default=",".join(SLUICE_WRITERS + PEER_WRITERS), help="comma-separated writers ('' for none)"
    )
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"), help="where the sluice binaries are")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "loaders.json"), help="JSON result file")
    ap.add_argument("--unavailable-dir", default="", help="directory of <reader> files naming why it is not installed")
    ap.add_argument("--keep-stack", action="store_true", help="leave the stack and its data running afterwards")
    ap.add_argument(
        "--split",
        default="",
        help="emulate the deployment by core pinning, e.g. host=0-3,dpu=4-9,storage=10-15: readers and the shim "
        "on the host cores, the agent on the dpu cores, the gateway on the storage cores (taskset, every thread). "
        "Default: no pinning (small machines)",
    )
    ap.add_argument(
        "--agent-runtime",
        choices=["shared", "per-core"],
        default="shared",
        help="the agent's [runtime]: one multi-threaded runtime (shared, its default), or a runtime per core, each "
        "serving whole connections (per-core: for an agent on cores of its own, as with --split)",
    )
    ap.add_argument(
        "--link",
        choices=["unix", "tls"],
        default="unix",
        help="how the shim reaches the agent: its Unix socket (a co-located agent, the default), or TCP with "
        "mutual TLS on the loopback, as a shim reaches the agent on its BlueField (sluice up --tcp)",
    )
    ap.add_argument(
        "--dpu-cores",
        default="",
        help="with --split: also run the Sluice readers with the agent on only the first N of the dpu cores, "
        "for each N in this comma-separated list (e.g. 2,4,6), to show how it scales with the BlueField's cores",
    )
    ap.add_argument(
        "--scaling-readers",
        default="sluice-py batch->region,sluice-rs batch (http),sluice-rs (rdma/tcp),sluice-py batch->bytes",
        help="the readers run at each --dpu-cores count",
    )
    return ap.parse_args()


# ----------------------------------------------------------------- stack --
class Stack:
    def __init__(self, bin_dir: str, runtime_threads: int = 0, per_core: bool = False, link: str = "unix") -> None:
        """``runtime_threads``: the daemons' tokio runtimes get this many
        workers (``TOKIO_WORKER_THREADS``; the shim keeps its configured
        one). With a core split the daemons are pinned after they start, so
        by default each would size its runtime to the whole machine and run
        16 workers on the 6 cores it is given; an agent on a BlueField sees
        only its own cores. ``per_core``: the agent serves connections on
        per-core runtimes (as many as ``runtime_threads``). ``link``: "unix"
        (the shim on the agent's Unix socket) or "tls" (TCP with mutual
        TLS, ``sluice up --tcp``)."""
        self.bin_dir = os.path.abspath(bin_dir)
        self.sluice = os.path.join(self.bin_dir, "sluice")
        # Short path: Unix socket names are limited to 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="slbench-", dir="/tmp")
        env = dict(os.environ)
        if runtime_threads > 0:
            env["TOKIO_WORKER_THREADS"] = str(runtime_threads)
        out = subprocess.run(
            [self.sluice, "up", "--dir", self.dir, "--bin-dir", self.bin_dir, "--json", "--rdma"]
            + (["--per-core"] if per_core else [])
            + (["--tcp"] if link == "tls" else []),
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode != 0:
            raise SystemExit(f"sluice up failed:\n{out.stderr}")
        self.info = json.loads(out.stdout.strip().splitlines()[-1])
        with open(os.path.join(self.dir, "credentials")) as f:
            self.access_key, self.secret_key = f.read().strip().split(":", 1)
        self.pids: Dict[str, int] = {}
        with open(os.path.join(self.dir, "pids")) as f:
            for line in f:
                name, pid = line.split()
                self.pids[name.replace("sluice-", "")] = int(pid)

    def down(self, keep: bool) -> None:
        if keep:
            log(f"stack left running in {self.dir} (stop: {self.sluice} down --dir {self.dir})")
            return
        subprocess.run([self.sluice, "down", "--dir", self.dir], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# -------------------------------------------------------------- populate --
def object_bytes(label: str, size: int, i: int) -> bytes:
    """Deterministic pseudo-random contents of object ``i`` of a size class."""
    seed = int.from_bytes(hashlib.sha256(f"{label}/{i}".encode()).digest()[:8], "little")
    try:
        import numpy as np

        return np.random.default_rng(seed).bytes(size)
    except ImportError:
        import random

        return random.Random(seed).randbytes(size)


def populate(stack: Stack, sizes: List[Tuple[str, int, int]], bucket: str, prefix: str) -> Dict[str, str]:
    """PUTs every object through the gateway (boto3, else the Sluice client);
    returns the MD5 of object 0 of each size, for the readers to verify."""
    md5: Dict[str, str] = {}
    try:
        import boto3
        from botocore.config import Config

        s3 = boto3.client(
            "s3",
            endpoint_url=stack.info["gateway"],
            aws_access_key_id=stack.access_key,
            aws_secret_access_key=stack.secret_key,
            region_name="us-east-1",
            config=Config(max_pool_connections=8, s3={"addressing_style": "path"}),
        )

        def put(key: str, data: bytes) -> None:
            s3.put_object(Bucket=bucket, Key=key, Body=data)

        via = "boto3 put_object to the gateway"
    except ImportError:
        import sluice

        c = sluice.Client(stack.info["socket"])

        def put(key: str, data: bytes) -> None:
            c.put(f"{bucket}/{key}", data)

        via = "the Sluice client (boto3 is not installed)"
    t0 = time.perf_counter()
    total = 0
    with ThreadPoolExecutor(8) as pool:
        for label, size, count in sizes:
            data0 = object_bytes(label, size, 0)
            md5[label] = hashlib.md5(data0).hexdigest()

            def one(i: int, label: str = label, size: int = size) -> None:
                put(f"{prefix}{label}/obj-{i:05d}", object_bytes(label, size, i))

            list(pool.map(one, range(count)))
            total += size * count
    log(f"populated {total / GIB:.2f} GiB in {time.perf_counter() - t0:.1f}s via {via}")
    return md5


# --------------------------------------------------------------- readers --
def reader_env(stack: Stack) -> Dict[str, str]:
    """The readers' environment: the stack's credentials for the peers (and
    nothing from this user's AWS configuration)."""
    env = dict(os.environ)
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        env.pop(k, None)
    env.update(
        AWS_ACCESS_KEY_ID=stack.access_key,
        AWS_SECRET_ACCESS_KEY=stack.secret_key,
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    return env


def run_reader(
    name: str,
    cfg: Dict[str, Any],
    env: Dict[str, str],
    worker: str = os.path.join(HERE, "worker.py"),
    argv_prefix: Sequence[str] = (),
) -> Dict[str, Any]:
    """Runs one reader's worker (``argv_prefix``: e.g. ``taskset -c 0-3``);
    returns its info and runs."""
    cfg = dict(cfg, reader=name)
    result: Dict[str, Any] = {"name": name, "runs": [], "available": True}
    p = subprocess.Popen(
        [*argv_prefix, sys.executable, worker],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(json.dumps(cfg))
    p.stdin.close()
    for line in p.stdout:
        ev = json.loads(line)
        if ev["event"] == "info":
            result["version"], result["method"] = ev["version"], ev["method"]
        elif ev["event"] == "unavailable":
            result.update(available=False, reason=ev["reason"])
        elif ev["event"] == "error":
            result.update(error=ev["reason"])
        elif ev["event"] == "run":
            result["runs"].append(ev)
            log(
                f"  {name:<24} {ev['size']:>5} c={ev['concurrency']:<2} #{ev['repeat']}: "
                f"{ev['bytes'] / GIB / ev['seconds']:.3f} GiB/s, {ev['objects'] / ev['seconds']:.0f} obj/s, "
                f"reader CPU {ev['cpu_s']['reader']:.3f}s"
            )
    p.wait()
    if p.returncode != 0 and "error" not in result:
        result["error"] = f"worker exited with {p.returncode}"
    return result


def med(vals: List[Optional[float]]) -> Optional[float]:
    v = [x for x in vals if x is not None]
    return statistics.median(v) if v else None


def dpu_scaling(rows: List[Dict[str, Any]], args: argparse.Namespace) -> Dict[str, Any]:
    """Per scaling reader and size (at the highest concurrency): GiB/s with
    the agent on each --dpu-cores count, and the ratio of the most cores to
    the fewest (the issue's "2 -> 6 cores: >= 2x at 1 MiB")."""
    counts = [int(n) for n in args.dpu_cores.split(",") if n.strip()]
    if not counts:
        return {}
    out: Dict[str, Any] = {}
    for r in rows:
        name, _, tail = r["reader"].partition(" @")
        if not tail.endswith(" DPU cores"):
            continue
        n = int(tail.split()[0])
        cell = out.setdefault(name, {}).setdefault(r["size"], {})
        if r["concurrency"] >= cell.get("_conc", 0):
            cell["_conc"] = r["concurrency"]
            cell[str(n)] = r["gib_per_s"]
    for sizes in out.values():
        for cell in sizes.values():
            lo, hi = cell.get(str(min(counts))), cell.get(str(max(counts)))
            cell["ratio_most_to_fewest"] = (hi / lo) if lo and hi else None
            cell["concurrency"] = cell.pop("_conc")
    return out


def summarize(name: str, runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (size, concurrency): medians over the repeats."""
    cells: Dict[Tuple[str, int], List[Dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((r["size"], r["concurrency"]), []).append(r)
    rows = []
    sluice = name.startswith("sluice")
    for (label, conc), rs in cells.items():

        def per_gib(r: Dict[str, Any], cpu: Optional[float]) -> Optional[float]:
            return None if cpu is None else cpu / (r["bytes"] / GIB)

        def per_obj(r: Dict[str, Any], cpu: Optional[float]) -> Optional[float]:
            return None if cpu is None else cpu / r["objects"] * 1e6

        def host(r: Dict[str, Any]) -> Optional[float]:
            c = r["cpu_s"]
            if sluice:
                return None if c["shim"] is None else c["reader"] + c["shim"]
            return c["reader"]

        rows.append(
            {
                "reader": name,
                "size": label,
                "object_bytes": rs[0]["object_bytes"],
                "objects": rs[0]["objects"],
                "concurrency": conc,
                "repeats": len(rs),
                "gib_per_s": med([r["bytes"] / GIB / r["seconds"] for r in rs]),
                "objects_per_s": med([r["objects"] / r["seconds"] for r in rs]),
                "p50_ms": med([r["p50_ms"] for r in rs]),
                "p99_ms": med([r["p99_ms"] for r in rs]),
                "host_cpu_s_per_gib": med([per_gib(r, host(r)) for r in rs]),
                "reader_cpu_s_per_gib": med([per_gib(r, r["cpu_s"]["reader"]) for r in rs]),
                "shim_cpu_s_per_gib": med([per_gib(r, r["cpu_s"]["shim"]) for r in rs]) if sluice else None,
                "dpu_cpu_s_per_gib": med([per_gib(r, r["cpu_s"]["agent"]) for r in rs]) if sluice else None,
                "store_cpu_s_per_gib": med([per_gib(r, r["cpu_s"]["gateway"]) for r in rs]),
                "agent_cpu_us_per_object": med([per_obj(r, r["cpu_s"]["agent"]) for r in rs]) if sluice else None,
                "shim_cpu_us_per_object": med([per_obj(r, r["cpu_s"]["shim"]) for r in rs]) if sluice else None,
                "runs": [
                    {k: r[k] for k in ("repeat", "objects", "bytes", "seconds", "p50_ms", "p99_ms", "cpu_s")}
                    for r in rs
                ],
            }
        )
    return rows


# ------------------------------------------------------------------ main --
def fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def user_args() -> List[str]:
    """This run's arguments, less the two that bench/run always adds."""
    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a in ("--bin-dir", "--unavailable-dir"):
            skip = True
        elif not a.startswith(("--bin-dir=", "--unavailable-dir=")):
            out.append(a)
    return out


def machine_info() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        info["rustc"] = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return info


def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = [r for r in readers if r not in SLUICE + PEERS]
    if unknown or not concurrency or min(concurrency) < 1 or args.repeats < 1:
        raise SystemExit(f"bad arguments (unknown readers {unknown}; known: {SLUICE + PEERS})")
    counts = {"4KiB": args.small, "64KiB": args.kib64, "1MiB": args.medium, "64MiB": args.large}
    sizes = [(label, size, counts[label]) for label, size in SIZES if counts[label] > 0]
    bucket, prefix = "data", "bench/"

    split = benchlib.parse_split(args.split) if args.split else {}
    dpu_counts = [int(n) for n in args.dpu_cores.split(",") if n.strip()]
    if dpu_counts and not split:
        raise SystemExit("--dpu-cores needs --split (which cores are the DPU's)")
    if split and dpu_counts and max(dpu_counts) > len(split["dpu"]):
        raise SystemExit(f"--dpu-cores {args.dpu_cores}: the split gives the agent only {len(split['dpu'])} cores")
    # The agent's runtime sized to the DPU cores it is pinned to (the
    # gateway's to the same number: 6 and 6 in the default split).
    stack = Stack(
        args.bin_dir,
        runtime_threads=len(split["dpu"]) if split else 0,
        per_core=args.agent_runtime == "per-core",
        link=args.link,
    )
    interrupted = False
    prefix_cmd: List[str] = []
    if split:
        for proc, role in (("gateway", "storage"), ("agent", "dpu"), ("shim", "host")):
            benchlib.pin(stack.pids[proc], split[role])
        prefix_cmd = ["taskset", "-c", benchlib.cpulist(split["host"])]
        log("pinned: " + ", ".join(f"{p} {benchlib.affinity(stack.pids[p])}" for p in ("gateway", "agent", "shim")))

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    results: Dict[str, Dict[str, Any]] = {}
    write_results: Dict[str, Dict[str, Any]] = {}
    unknown_w = [w for w in args.writers.split(",") if w.strip() and w.strip() not in SLUICE_WRITERS + PEER_WRITERS]
    if unknown_w:
        raise SystemExit(f"unknown writers {unknown_w}; known: {SLUICE_WRITERS + PEER_WRITERS}")
    try:
        log(f"stack up in {stack.dir}: gateway {stack.info['gateway']}, shim {stack.info['socket']}")
        md5 = populate(stack, sizes, bucket, prefix)
        env = reader_env(stack)
        base = {
            "socket": stack.info["socket"],
            "gateway": stack.info["gateway"],
            "bucket": bucket,
            "namespace": bucket,
            "prefix": prefix,
            "access_key": stack.access_key,
            "secret_key": stack.secret_key,
            "sizes": sizes,
            "concurrency": concurrency,
            "repeats": args.repeats,
            "pids": stack.pids,
            "md5": md5,
            "sluice_bin": stack.sluice,
        }
        for name in readers:
            why = ""
            if args.unavailable_dir and os.path.exists(os.path.join(args.unavailable_dir, name)):
                with open(os.path.join(args.unavailable_dir, name)) as f:
                    why = f.read().strip()
            if why:
                results[name] = {"name": name, "available": False, "reason": why, "runs": []}
                log(f"{name}: unavailable ({why})")
                continue
            cfg = dict(base)
            if name == "s5cmd" and args.s5cmd_small and counts["4KiB"] > args.s5cmd_small:
                cfg["sizes"] = [(lb, s, args.s5cmd_small if lb == "4KiB" else n) for lb, s, n in sizes]
            log(f"{name}:")
            t0 = time.perf_counter()
            results[name] = run_reader(name, cfg, env, argv_prefix=prefix_cmd)
            results[name]["wall_s"] = time.perf_counter() - t0
            if not results[name]["available"]:
                log(f"{name}: unavailable ({results[name]['reason']})")
            if "error" in results[name]:
                log(f"{name}: FAILED: {results[name]['error']}")
        # The agent on fewer of the DPU's cores: how the same readers scale.
        scaling_readers = [r.strip() for r in args.scaling_readers.split(",") if r.strip() in readers]
        for n in dpu_counts:
            benchlib.pin(stack.pids["agent"], split["dpu"][:n])
            for name in scaling_readers:
                label = f"{name} @{n} DPU cores"
                log(f"{label}:")
                results[label] = run_reader(name, dict(base), env, argv_prefix=prefix_cmd)
                results[label]["name"] = label
        if dpu_counts:
            benchlib.pin(stack.pids["agent"], split["dpu"])
        writers = [w.strip() for w in args.writers.split(",") if w.strip()]
        writes = []
        if args.write_small > 0:
            writes.append(("4KiB", 4 << 10, args.write_small, 16))
        if args.write_large_mib > 0:
            writes.append((f"{args.write_large_mib}MiB", args.write_large_mib << 20, 1, 1))
        for name in writers if writes else []:
            log(f"writer {name}:")
            t0 = time.perf_counter()
            write_results[name] = run_reader(name, dict(base, op="write", writes=writes), env, argv_prefix=prefix_cmd)
            write_results[name]["wall_s"] = time.perf_counter() - t0
            if "error" in write_results[name]:
                log(f"writer {name}: FAILED: {write_results[name]['error']}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stack.down(args.keep_stack)
    if interrupted:
        raise SystemExit("interrupted")

    wall = time.perf_counter() - t_start
    scaled = [f"{r} @{n} DPU cores" for n in dpu_counts for r in args.scaling_readers.split(",") if r in readers]
    report(args, sizes, concurrency, readers + [r for r in scaled if r in results], results, wall, write_results)


def report(
    args: argparse.Namespace,
    sizes: List[Tuple[str, int, int]],
    concurrency: List[int],
    readers: List[str],
    results: Dict[str, Dict[str, Any]],
    wall: float,
    write_results: Dict[str, Dict[str, Any]],
) -> None:
    rows: List[Dict[str, Any]] = []
    for name in readers:
        rows.extend(summarize(name, results[name]["runs"]))
    index = {(r["reader"], r["size"], r["concurrency"]): r for r in rows}
    reduced: List[str] = []
    if "s5cmd" in readers and args.s5cmd_small and args.small > args.s5cmd_small:
        reduced.append(
            f"s5cmd reads {args.s5cmd_small} of the {args.small} 4 KiB objects (one process per object; "
            f"--s5cmd-small); its 4 KiB rates are per object read, comparable with the others"
        )

    # ---------------------------------------------------------------- table
    desc = ", ".join(f"{label.replace('KiB', ' KiB').replace('MiB', ' MiB')} x {n}" for label, _, n in sizes)
    lines = [
        f"Loaders benchmark: {desc}; concurrency {','.join(map(str, concurrency))}; "
        f"median of {args.repeats}; {os.cpu_count()} CPUs, everything on this machine",
        "host CPU = GPU-node processes (Sluice: client + shim; peers: the reader process); "
        "DPU CPU = sluice-agent; CPU in seconds per GiB read",
        "",
        "agent/shim us = CPU microseconds per object in sluice-agent / sluice-shim",
        "",
        f"{'reader':<24} {'size':>5} {'conc':>4} {'GiB/s':>8} {'obj/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'host CPU':>9} {'DPU CPU':>8} {'agent us':>8} {'shim us':>8}",
    ]
    for label, _, _ in sizes:
        for conc in concurrency:
            for name in readers:
                res = results.get(name, {})
                r = index.get((name, label, conc))
                if r is None:
                    why = res.get("reason") or res.get("error") or "no result"
                    status = "unavailable" if not res.get("available", True) else "FAILED"
                    lines.append(f"{name:<24} {label:>5} {conc:>4}   {status}: {why[:80]}")
                    continue
                lines.append(
                    f"{name:<24} {label:>5} {conc:>4} {r['gib_per_s']:>8.3f} {r['objects_per_s']:>8.0f} "
                    f"{fmt(r['p50_ms'], '>8.3f'):>8} {fmt(r['p99_ms'], '>8.3f'):>8} "
                    f"{fmt(r['host_cpu_s_per_gib'], '>9.3f'):>9} {fmt(r['dpu_cpu_s_per_gib'], '>8.3f'):>8} "
                    f"{fmt(r.get('agent_cpu_us_per_object'), '>8.0f'):>8} "
                    f"{fmt(r.get('shim_cpu_us_per_object'), '>8.0f'):>8}"
                )
            lines.append("")

    # --------------------------------------------------------------- ratios
    sluice_readers = [n for n in readers if n in SLUICE]
    peer_readers = [n for n in readers if n in PEERS]
    ratio_cells = []
    lines.append("Sluice vs peers per cell: throughput / best peer's, host CPU per GiB / boto3's")
    lines.append(f"{'size':>5} {'conc':>4}  {'best peer':<30} " + " ".join(f"{n:>22}" for n in sluice_readers))
    for label, _, _ in sizes:
        for conc in concurrency:
            peers = [index[(p, label, conc)] for p in peer_readers if (p, label, conc) in index]
            best = max(peers, key=lambda r: r["gib_per_s"], default=None)
            boto = index.get(("boto3", label, conc))
            cell: Dict[str, Any] = {
                "size": label,
                "concurrency": conc,
                "best_peer": best["reader"] if best else None,
                "best_peer_gib_per_s": best["gib_per_s"] if best else None,
                "boto3_host_cpu_s_per_gib": boto["host_cpu_s_per_gib"] if boto else None,
                "sluice": {},
            }
            cols = []
            for n in sluice_readers:
                s = index.get((n, label, conc))
                tr = s["gib_per_s"] / best["gib_per_s"] if s and best else None
                cr = (
                    s["host_cpu_s_per_gib"] / boto["host_cpu_s_per_gib"]
                    if s and boto and s["host_cpu_s_per_gib"] is not None and boto["host_cpu_s_per_gib"]
                    else None
                )
                total = (
                    s["host_cpu_s_per_gib"] + s["dpu_cpu_s_per_gib"]
                    if s and s["host_cpu_s_per_gib"] is not None and s["dpu_cpu_s_per_gib"] is not None
                    else None
                )
                tcr = (
                    total / boto["host_cpu_s_per_gib"]
                    if total is not None and boto and boto["host_cpu_s_per_gib"]
                    else None
                )
                cell["sluice"][n] = {
                    "throughput_ratio": tr,
                    "host_cpu_ratio_vs_boto3": cr,
                    "host_plus_dpu_cpu_ratio_vs_boto3": tcr,
                }
                cols.append(f"{fmt(tr, '.2f')}x thr {fmt(cr, '.3f')}x cpu")
            ratio_cells.append(cell)
            bp = f"{best['reader']} {best['gib_per_s']:.3f} GiB/s" if best else "-"
            lines.append(f"{label:>5} {conc:>4}  {bp:<30} " + " ".join(f"{c:>22}" for c in cols))

    # ---------------------------------------------------------- headline
    def best_of(d: Dict[str, Optional[float]], pick: Any) -> Optional[Dict[str, Any]]:
        vals = {k: v for k, v in d.items() if v is not None}
        if not vals:
            return None
        k = pick(vals, key=vals.get)
        return {"reader": k, "value": vals[k]}

    ratio_64: Dict[str, Any] = {}
    cpu_vs_boto3: Dict[str, Any] = {}
    for cell in ratio_cells:
        key = f"concurrency_{cell['concurrency']}"
        thr = {n: v["throughput_ratio"] for n, v in cell["sluice"].items()}
        cpu = {n: v["host_cpu_ratio_vs_boto3"] for n, v in cell["sluice"].items()}
        total = {n: v["host_plus_dpu_cpu_ratio_vs_boto3"] for n, v in cell["sluice"].items()}
        best_cpu, worst_cpu = best_of(cpu, min), best_of(cpu, max)
        cpu_vs_boto3.setdefault(cell["size"], {})[key] = {
            "boto3_host_cpu_s_per_gib": cell["boto3_host_cpu_s_per_gib"],
            "ratios": cpu,
            "best": best_cpu,
            "worst": worst_cpu,
            "goal_le_0_1": None if best_cpu is None else best_cpu["value"] <= 0.1,
            "goal_le_0_1_every_sluice_reader": None if worst_cpu is None else worst_cpu["value"] <= 0.1,
            "host_plus_dpu_ratios": total,
        }
        if cell["size"] == "64MiB":
            b, w = best_of(thr, max), best_of(thr, min)
            ratio_64[key] = {
                "best_peer": cell["best_peer"],
                "best_peer_gib_per_s": cell["best_peer_gib_per_s"],
                "ratios": thr,
                "best": b,
                "worst": w,
                "goal_ge_1": None if b is None else b["value"] >= 1.0,
                "goal_ge_1_every_sluice_reader": None if w is None else w["value"] >= 1.0,
            }
    # Per size and concurrency: each Sluice reader's objects/s over the best
    # peer's (the issue's targets: region-filling >= 1.0x, bytes >= 0.8x),
    # and one-at-a-time latency over the best peer's (p50, p99 <= 1.5x).
    ratio_vs_best: Dict[str, Dict[str, Any]] = {}
    latency_vs_best: Dict[str, Any] = {}
    for cell in ratio_cells:
        ratio_vs_best.setdefault(cell["size"], {})[str(cell["concurrency"])] = {
            "best_peer": cell["best_peer"],
            **{n: v["throughput_ratio"] for n, v in cell["sluice"].items()},
        }
    if 1 in concurrency:
        for label, _, _ in sizes:
            peers = [index[(p, label, 1)] for p in peer_readers if (p, label, 1) in index]
            if not peers:
                continue
            b50 = min(peers, key=lambda r: r["p50_ms"])
            b99 = min(peers, key=lambda r: r["p99_ms"])
            latency_vs_best[label] = {
                "best_peer_p50": {"reader": b50["reader"], "ms": b50["p50_ms"]},
                "best_peer_p99": {"reader": b99["reader"], "ms": b99["p99_ms"]},
                **{
                    n: {
                        "p50_ratio": index[(n, label, 1)]["p50_ms"] / b50["p50_ms"],
                        "p99_ratio": index[(n, label, 1)]["p99_ms"] / b99["p99_ms"],
                    }
                    for n in sluice_readers
                    if (n, label, 1) in index and b50["p50_ms"] and b99["p99_ms"]
                },
            }
    lines.append("")
    lines.append("Targets: region-filling readers >= 1.0x the best peer's objects/s, bytes-returning >= 0.8x;")
    lines.append("one-at-a-time (concurrency 1) p50 and p99 <= 1.5x the best peer's")
    for label, _, _ in sizes:
        for conc in concurrency:
            cell = ratio_vs_best.get(label, {}).get(str(conc), {})
            parts = []
            for n in sluice_readers:
                v = cell.get(n)
                if v is None:
                    continue
                goal = 1.0 if n in REGION_FILLING else 0.8
                parts.append(f"{n} {v:.2f}x{'' if v >= goal else ' (below ' + format(goal, '.1f') + ')'}")
            if parts:
                lines.append(f"  {label:>5} c={conc:<2} vs {cell.get('best_peer')}: " + ", ".join(parts))
        lat = latency_vs_best.get(label)
        if lat:
            parts = [
                f"{n} p50 {v['p50_ratio']:.2f}x p99 {v['p99_ratio']:.2f}x"
                for n, v in lat.items()
                if n in sluice_readers
            ]
            lines.append(
                f"  {label:>5} latency vs {lat['best_peer_p50']['reader']} (p50 {lat['best_peer_p50']['ms']:.3f} ms) / "
                f"{lat['best_peer_p99']['reader']} (p99 {lat['best_peer_p99']['ms']:.3f} ms): " + ", ".join(parts)
            )
    missing = [n for n in peer_readers if (n, "64MiB", concurrency[0]) not in index]
    for v in ratio_64.values():
        v["peers_compared"] = [n for n in peer_readers if n not in missing]
    lines.append("")
    lines.append("Goals (64 MiB): Sluice throughput >= best peer; Sluice host CPU per GiB <= 0.1x boto3's")
    if missing:
        lines.append(f"  (best peer among those that ran; without: {', '.join(missing)})")
    for key, v in ratio_64.items():
        b, w = v["best"], v["worst"]
        cv = cpu_vs_boto3.get("64MiB", {}).get(key, {})
        c, cw = cv.get("best"), cv.get("worst")
        lines.append(
            f"  {key}: throughput {fmt(w and w['value'], '.2f')}x..{fmt(b and b['value'], '.2f')}x the best peer "
            f"({v['best_peer']}) -> {'MET' if v['goal_ge_1'] else 'NOT MET'}"
            f"{' by every Sluice reader' if v['goal_ge_1_every_sluice_reader'] else ''}; "
            f"host CPU {fmt(c and c['value'], '.3f')}x..{fmt(cw and cw['value'], '.3f')}x boto3's -> "
            f"{'MET' if cv.get('goal_le_0_1') else 'NOT MET'}"
            f"{' by every Sluice reader' if cv.get('goal_le_0_1_every_sluice_reader') else ''}"
        )
        tot = {n: x for n, x in cv.get("host_plus_dpu_ratios", {}).items() if x is not None}
        if tot:
            lines.append(
                f"    (counting the agent's CPU as host CPU too: "
                f"{min(tot.values()):.2f}x..{max(tot.values()):.2f}x boto3's)"
            )
    writes_doc = write_report(write_results, lines)
    for note in reduced:
        lines.append(f"note: {note}")
    lines.append(f"wall time {wall:.0f}s")
    table = "\n".join(lines)
    print(table)

    versions = {n: results[n].get("version") for n in readers if results.get(n, {}).get("version")}
    doc = {
        "benchmark": "loaders",
        "command": shlex.join(["bench/run", "loaders"] + user_args()),
        "config": {
            "sizes": [{"size": lb, "object_bytes": s, "objects": n} for lb, s, n in sizes],
            "concurrency": concurrency,
            "repeats": args.repeats,
            "s5cmd_small": args.s5cmd_small,
        },
        "method": {
            "stack": "sluice up --rdma in a temp dir: sluice-gateway (embedded directory store, loopback HTTP), "
            "sluice-agent, sluice-shim; namespace 'data' (HTTP data path) and 'data-rdma' "
            "(RDMA path, software tcp transport) over the same bucket; shim -> agent "
            + ("over TCP with mutual TLS (sluice up --tcp)" if args.link == "tls" else "on the agent's Unix socket"),
            "objects": "put once through the gateway; every reader verifies object 0 of each size (MD5)",
            "cell": "untimed warm-up pass over min(objects, 2 x concurrency) objects, then `repeats` timed passes "
            "over all objects; medians per metric",
            "concurrency": "N threads in the reader's process, each reading one object at a time "
            "(Rust: N requests in flight on one tokio runtime)",
            "host_cpu": "Sluice: client process + sluice-shim; peers: the reader process (s5cmd: + its children)",
            "dpu_cpu": "sluice-agent (runs on the DPU in deployment; here on the same 2 cores)",
            "store_cpu": "sluice-gateway, for reference (not counted as host CPU)",
            "cpu_clocks": "per-process CPU clocks (clock_getcpuclockid), CLOCK_PROCESS_CPUTIME_ID, "
            "RUSAGE_CHILDREN; sampled right before and after each timed pass",
            "readers": {n: results[n].get("method") for n in readers if results.get(n, {}).get("method")},
        },
        "machine": machine_info(),
        "split": args.split or None,
        "link": args.link,
        # TOKIO_WORKER_THREADS for the gateway and the agent (0: the machine's cores).
        "runtime_threads": len(benchlib.parse_split(args.split)["dpu"]) if args.split else 0,
        "agent_runtime": args.agent_runtime,
        "dpu_scaling": dpu_scaling(rows, args),
        "versions": versions,
        "readers": {
            n: {
                "kind": "sluice" if n in SLUICE else "peer",
                "available": results.get(n, {}).get("available", False),
                "reason": results.get(n, {}).get("reason"),
                "error": results.get(n, {}).get("error"),
                "wall_s": results.get(n, {}).get("wall_s"),
            }
            for n in readers
        },
        "ratio_vs_best_peer": ratio_vs_best,
        "latency_vs_best_peer": latency_vs_best,
        "writes": writes_doc,
        "table": rows,
        "ratios": ratio_cells,
        "ratio_64MiB_vs_best_peer": ratio_64,
        "cpu_per_gib_ratio_vs_boto3": cpu_vs_boto3,
        "reduced": reduced,
        "wall_seconds": wall,
        "text_table": table,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, os.getcwd())}")
    if any("error" in r for r in list(results.values()) + list(write_results.values())):
        sys.exit(1)


def write_report(write_results: Dict[str, Dict[str, Any]], lines: List[str]) -> Dict[str, Any]:
    """The writes table (appended to ``lines``) and its JSON: per writer and
    size, throughput and host CPU per GiB; Sluice vs the best peer and boto3."""
    if not write_results:
        return {}
    rows = [row for name, res in write_results.items() for row in summarize(name, res["runs"])]
    index = {(r["reader"], r["size"]): r for r in rows}
    lines.append("")
    lines.append("Writes (objects put through each writer; host CPU in s/GiB, agent = DPU CPU)")
    lines.append(f"{'writer':<24} {'size':>7} {'conc':>4} {'GiB/s':>8} {'obj/s':>8} {'p50 ms':>8} {'host CPU':>9} {'DPU CPU':>8}")
    for r in rows:
        lines.append(
            f"{r['reader']:<24} {r['size']:>7} {r['concurrency']:>4} {r['gib_per_s']:>8.3f} {r['objects_per_s']:>8.0f} "
            f"{fmt(r['p50_ms'], '>8.3f'):>8} {fmt(r['host_cpu_s_per_gib'], '>9.3f'):>9} "
            f"{fmt(r['dpu_cpu_s_per_gib'], '>8.3f'):>8}"
        )
    for name, res in write_results.items():
        if "error" in res or not res.get("available", True):
            lines.append(f"{name:<24} FAILED/unavailable: {(res.get('error') or res.get('reason') or '')[:90]}")
    ratios: Dict[str, Any] = {}
    lines.append("Writes target: Sluice >= the best peer's throughput with <= 0.1x boto3's host CPU per GiB")
    for size in sorted({r["size"] for r in rows}, key=lambda x: next(r["object_bytes"] for r in rows if r["size"] == x)):
        peers = [index[(p, size)] for p in PEER_WRITERS if (p, size) in index]
        best = max(peers, key=lambda r: r["gib_per_s"], default=None)
        boto = index.get(("boto3", size))
        cell: Dict[str, Any] = {"best_peer": best["reader"] if best else None}
        for n in SLUICE_WRITERS:
            s_ = index.get((n, size))
            if not s_ or not best:
                continue
            cpu = (
                s_["host_cpu_s_per_gib"] / boto["host_cpu_s_per_gib"]
                if boto and boto["host_cpu_s_per_gib"] and s_["host_cpu_s_per_gib"] is not None
                else None
            )
            cell[n] = {"throughput_ratio": s_["gib_per_s"] / best["gib_per_s"], "host_cpu_ratio_vs_boto3": cpu}
            lines.append(
                f"  {size:>7} {n:<22} {cell[n]['throughput_ratio']:.2f}x {best['reader']}, "
                f"host CPU {fmt(cpu, '.3f')}x boto3's"
            )
        ratios[size] = cell
    return {
        "table": rows,
        "ratio_vs_best_peer": ratios,
        "writers": {
            n: {k: r.get(k) for k in ("available", "reason", "error", "version", "method", "wall_s")}
            for n, r in write_results.items()
        },
    }


if __name__ == "__main__":
    main()
