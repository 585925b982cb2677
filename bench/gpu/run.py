"""GPU benchmark (issue 24): objects from one gateway into GPU memory, Sluice
vs peers that end with the bytes in a CUDA tensor.

Run through ``bench/run gpu [options]`` (builds the release binaries unless
``SLUICE_BIN_DIR`` names prebuilt ones), or directly:
``python bench/gpu/run.py --bin-dir target/release --split host=0-3,dpu=4-9,storage=10-15``.
On the H100 machine, see bench/gpu/README.md (one command from a bundle).

Set-up (shared with the loaders benchmark, bench/loaders/run.py):
``sluice up --rdma`` (gateway with its embedded store, agent, shim), objects
of 4 KiB, 64 KiB, 1 MiB and 64 MiB put once through the gateway, then every
reader in a process of its own (``gpu_worker.py``), 16 in flight:

* Sluice: ``Client.get(path, into=register_gpu(tensor), offset)`` from 16
  threads, and ``get_many([GetSpec(path, region, offset), ...])`` in two
  batches of 8; namespaces over the HTTP data path and the RDMA path
  (software ``tcp`` transport: there is no RDMA NIC on the GPU machine);
* peers: kvikio ``RemoteFile`` (S3 straight into device memory), and
  s3torchconnector, obstore and boto3, each reading into a pinned batch per
  thread, then one ``copy_(non_blocking=True)`` to the device.

``--split host=0-3,dpu=4-9,storage=10-15`` emulates the deployment: the
reader processes and the shim on the host cores, the agent on the "DPU"
cores, the gateway on the storage cores (``taskset -apc``: every thread).

Host CPU per GiB = reader process + sluice-shim (peers: the reader
process), sampled right before and after each timed pass (per-process CPU
clocks, i.e. /proc/<pid>/stat utime+stime at nanosecond resolution); the
agent's CPU (the DPU's) is reported on its own, the gateway's for reference.

``--dry-run-model`` runs the whole flow without a GPU: the Python client's
host-model CUDA driver (``sluice.cuda.HostModel``) stands in for the GPU,
objects are few, and the numbers mean nothing (the JSON says so). Without it,
no torch or no CUDA device makes this exit non-zero, saying so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)


sys.path.insert(0, BENCH)
import benchlib  # noqa: E402
from benchlib import load as _load  # noqa: E402


lr = _load("sluice_bench_loaders_run", os.path.join(BENCH, "loaders", "run.py"))
GIB, log, fmt, med = lr.GIB, lr.log, lr.fmt, lr.med

SIZES = lr.SIZES  # 4 KiB, 64 KiB, 1 MiB, 64 MiB
SLUICE = [
    "sluice get->gpu (http)",
    "sluice get->gpu (rdma/tcp)",
    "sluice batch->gpu (http)",
    "sluice batch->gpu (rdma/tcp)",
]
PEERS = ["kvikio", "s3torchconnector", "obstore", "boto3"]
WORKER = os.path.join(HERE, "gpu_worker.py")
#: Defaults per mode: object counts per size, concurrency, repeats.
REAL = {"small": 4000, "kib64": 2000, "medium": 1024, "large": 32, "concurrency": "16", "repeats": 3}
DRY = {"small": 64, "kib64": 32, "medium": 16, "large": 2, "concurrency": "4", "repeats": 1}
ROLES = benchlib.ROLES


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench/run gpu")
    ap.add_argument("--dry-run-model", action="store_true",
                    help="no GPU: sluice.cuda.HostModel stands in for it, few objects (exercises the code path)")
    ap.add_argument("--small", type=int, help=f"4 KiB objects (default {REAL['small']}; dry {DRY['small']})")
    ap.add_argument("--kib64", type=int, help=f"64 KiB objects (default {REAL['kib64']}; dry {DRY['kib64']})")
    ap.add_argument("--medium", type=int, help=f"1 MiB objects (default {REAL['medium']}; dry {DRY['medium']})")
    ap.add_argument("--large", type=int, help=f"64 MiB objects (default {REAL['large']}; dry {DRY['large']})")
    ap.add_argument("--concurrency", help="objects in flight per reader, comma-separated levels (default 16; dry 4)")
    ap.add_argument("--repeats", type=int, help="timed passes per cell; medians are shown (default 3; dry 1)")
    ap.add_argument("--readers", default=",".join(SLUICE + PEERS), help="comma-separated subset (default: all)")
    ap.add_argument("--split", default="",
                    help="core pinning, e.g. host=0-3,dpu=4-9,storage=10-15: readers + shim on host, agent on "
                         "dpu, gateway on storage (default: none)")  # fmt: skip
    ap.add_argument("--verify", type=int, default=4,
                    help="objects per pass per reader compared byte for byte on the GPU (default 4)")
    ap.add_argument("--peer-batch", type=int, default=8,
                    help="objects per pinned batch (one copy to the GPU per batch) for boto3/obstore/"
                         "s3torchconnector (default 8)")  # fmt: skip
    ap.add_argument("--peer-batch-mib", type=int, default=64, help="cap on a peer's pinned batch (MiB, default 64)")
    ap.add_argument("--gpu-lane-mib", type=int, default=32,
                    help="Sluice's pinned staging lane (two halves), gpu_lane_bytes (default 32)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"), help="where the sluice binaries are")
    ap.add_argument("--out", default="", help="JSON result file (default bench/results/gpu.json; dry: gpu-dry-run.json)")
    ap.add_argument("--unavailable-dir", default="", help="directory of <reader> files naming why it is not installed")
    ap.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    args = ap.parse_args()
    d = DRY if args.dry_run_model else REAL
    for k in ("small", "kib64", "medium", "large", "concurrency", "repeats"):
        if getattr(args, k) is None:
            setattr(args, k, d[k])
    if not args.out:
        name = "gpu-dry-run.json" if args.dry_run_model else "gpu.json"
        args.out = os.path.join(ROOT, "bench", "results", name)
    return args


# ----------------------------------------------------------------- split --
parse_cpus, parse_split, cpulist, pin, affinity = (
    benchlib.parse_cpus, benchlib.parse_split, benchlib.cpulist, benchlib.pin, benchlib.affinity)


# ----------------------------------------------------------------- probe --
def probe_gpu(mode: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """Asks a worker (the readers' Python, not this process: no CUDA context
    here) what GPU there is; (info, "") or (info-or-None, why not)."""
    p = subprocess.run(
        [sys.executable, WORKER], input=json.dumps({"op": "probe", "mode": mode}), capture_output=True, text=True
    )
    for line in p.stdout.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "probe":
            return ev, ""
        if ev.get("event") in ("unavailable", "error"):
            return ev, ev.get("reason", "unknown")
    return None, f"the probe exited with {p.returncode}: {p.stderr.strip()[-400:]}"


# ----------------------------------------------------------------- main --
def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    mode = "dry" if args.dry_run_model else "real"
    concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = [r for r in readers if r not in SLUICE + PEERS]
    if unknown or not concurrency or min(concurrency) < 1 or args.repeats < 1:
        raise SystemExit(f"bad arguments (unknown readers {unknown}; known: {SLUICE + PEERS})")
    split = parse_split(args.split)

    gpu_info, why = probe_gpu(mode)
    if why:
        raise SystemExit(
            f"bench/run gpu: no usable GPU here: {why}.\n"
            "The real benchmark needs torch with CUDA and an NVIDIA GPU (see bench/gpu/README.md); "
            "--dry-run-model exercises the code path on this machine with Sluice's host-model CUDA driver."
        )
    assert gpu_info is not None
    log(f"GPU: {gpu_info.get('gpu_name')} ({mode})")

    counts = {"4KiB": args.small, "64KiB": args.kib64, "1MiB": args.medium, "64MiB": args.large}
    sizes = [(label, size, counts[label]) for label, size in SIZES if counts[label] > 0]
    bucket, prefix = "data", "bench-gpu/"

    stack = lr.Stack(args.bin_dir, runtime_threads=len(split["dpu"]) if split else 0)
    placement: Dict[str, Any] = {}
    if split:
        for proc, role in (("gateway", "storage"), ("agent", "dpu"), ("shim", "host")):
            pin(stack.pids[proc], split[role])
        placement = {proc: affinity(stack.pids[proc]) for proc in ("gateway", "agent", "shim")}
        log(f"pinned: {placement}; readers on {cpulist(split['host'])}")

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    results: Dict[str, Dict[str, Any]] = {}
    interrupted = False
    try:
        log(f"stack up in {stack.dir}: gateway {stack.info['gateway']}, shim {stack.info['socket']}")
        lr.populate(stack, sizes, bucket, prefix)
        env = lr.reader_env(stack)
        base = {
            "mode": mode,
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
            "verify": args.verify,
            "peer_batch": args.peer_batch,
            "peer_batch_bytes": args.peer_batch_mib << 20,
            "gpu_lane_bytes": args.gpu_lane_mib << 20,
        }
        prefix_cmd = ["taskset", "-c", cpulist(split["host"])] if split else []
        for name in readers:
            why = ""
            if args.unavailable_dir and os.path.exists(os.path.join(args.unavailable_dir, name)):
                with open(os.path.join(args.unavailable_dir, name)) as f:
                    why = f.read().strip()
            if why:
                results[name] = {"name": name, "available": False, "reason": why, "runs": []}
                log(f"{name}: unavailable ({why})")
                continue
            log(f"{name}:")
            t0 = time.perf_counter()
            results[name] = lr.run_reader(name, dict(base), env, worker=WORKER, argv_prefix=prefix_cmd)
            results[name]["wall_s"] = time.perf_counter() - t0
            if not results[name]["available"]:
                log(f"{name}: unavailable ({results[name]['reason']})")
            if "error" in results[name]:
                log(f"{name}: FAILED: {results[name]['error']}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stack.down(args.keep_stack)
    if interrupted:
        raise SystemExit("interrupted")
    wall = time.perf_counter() - t_start
    failed = report(args, mode, sizes, concurrency, readers, results, wall, gpu_info, split, placement)
    if failed:
        sys.exit(1)


# ---------------------------------------------------------------- report --
def report(
    args: argparse.Namespace,
    mode: str,
    sizes: List[Tuple[str, int, int]],
    concurrency: List[int],
    readers: List[str],
    results: Dict[str, Dict[str, Any]],
    wall: float,
    gpu_info: Dict[str, Any],
    split: Dict[str, List[int]],
    placement: Dict[str, Any],
) -> bool:
    rows: List[Dict[str, Any]] = []
    for name in readers:
        for r in lr.summarize(name, results[name]["runs"]):
            runs = [x for x in results[name]["runs"] if x["size"] == r["size"] and x["concurrency"] == r["concurrency"]]
            r["verified_on_gpu"] = sum(x.get("verified_on_gpu", 0) for x in runs)
            r["objects_per_call"] = runs[0].get("objects_per_call") if runs else None
            rows.append(r)
    index = {(r["reader"], r["size"], r["concurrency"]): r for r in rows}
    sluice = [n for n in readers if n in SLUICE]
    peers = [n for n in readers if n in PEERS]

    desc = ", ".join(f"{lb.replace('KiB', ' KiB').replace('MiB', ' MiB')} x {n}" for lb, _, n in sizes)
    where = (
        "split " + ", ".join(f"{r} {cpulist(c)}" for r, c in split.items()) if split else "no core split"
    )
    lines = []
    if mode == "dry":
        lines.append("DRY RUN (--dry-run-model): sluice.cuda.HostModel stands in for the GPU; numbers mean nothing")
    lines += [
        f"GPU benchmark: {desc}; {','.join(map(str, concurrency))} in flight; median of {args.repeats}; "
        f"{gpu_info.get('gpu_name')}; {os.cpu_count()} CPUs, {where}",
        "host CPU = reader process + sluice-shim (peers: the reader process), agent = sluice-agent (the DPU's), "
        "gateway = storage (reference); CPU in seconds per GiB; verified = objects compared on the GPU",
        "",
        f"{'reader':<28} {'size':>5} {'conc':>4} {'GiB/s':>8} {'obj/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'host CPU':>9} {'reader':>8} {'shim':>7} {'agent':>7} {'gateway':>8} {'verified':>8}",
    ]
    for label, _, _ in sizes:
        for conc in concurrency:
            for name in readers:
                res = results.get(name, {})
                r = index.get((name, label, conc))
                if r is None:
                    why = res.get("reason") or res.get("error") or "no result"
                    status = "unavailable" if not res.get("available", True) else "FAILED"
                    lines.append(f"{name:<28} {label:>5} {conc:>4}   {status}: {why[:100]}")
                    continue
                lines.append(
                    f"{name:<28} {label:>5} {conc:>4} {r['gib_per_s']:>8.3f} {r['objects_per_s']:>9.0f} "
                    f"{fmt(r['p50_ms'], '.3f'):>8} {fmt(r['p99_ms'], '.3f'):>8} "
                    f"{fmt(r['host_cpu_s_per_gib'], '.3f'):>9} {fmt(r['reader_cpu_s_per_gib'], '.3f'):>8} "
                    f"{fmt(r['shim_cpu_s_per_gib'], '.3f'):>7} {fmt(r['dpu_cpu_s_per_gib'], '.3f'):>7} "
                    f"{fmt(r['store_cpu_s_per_gib'], '.3f'):>8} {r['verified_on_gpu']:>8}"
                )
        lines.append("")

    # ------------------------------------------------------------- ratios
    ratios: Dict[str, Any] = {}
    lines.append("Sluice vs peers: throughput / the best peer's; host CPU per GiB / the leanest peer's")
    for label, _, _ in sizes:
        for conc in concurrency:
            prs = [index[(p, label, conc)] for p in peers if (p, label, conc) in index]
            best = max(prs, key=lambda r: r["gib_per_s"], default=None)
            cpu_prs = [r for r in prs if r["host_cpu_s_per_gib"] is not None]
            lean = min(cpu_prs, key=lambda r: r["host_cpu_s_per_gib"], default=None)
            cell: Dict[str, Any] = {
                "concurrency": conc,
                "peers_compared": [r["reader"] for r in prs],
                "peers_missing": [p for p in peers if (p, label, conc) not in index],
                "best_peer": best["reader"] if best else None,
                "best_peer_gib_per_s": best["gib_per_s"] if best else None,
                "leanest_peer": lean["reader"] if lean else None,
                "leanest_peer_host_cpu_s_per_gib": lean["host_cpu_s_per_gib"] if lean else None,
                "readers": {},
            }
            for n in sluice:
                s = index.get((n, label, conc))
                if s is None:
                    continue
                tr = s["gib_per_s"] / best["gib_per_s"] if best and best["gib_per_s"] else None
                cr = (
                    s["host_cpu_s_per_gib"] / lean["host_cpu_s_per_gib"]
                    if lean and lean["host_cpu_s_per_gib"] and s["host_cpu_s_per_gib"] is not None
                    else None
                )
                cell["readers"][n] = {
                    "gib_per_s": s["gib_per_s"],
                    "throughput_ratio_vs_best_peer": tr,
                    "host_cpu_s_per_gib": s["host_cpu_s_per_gib"],
                    "host_cpu_ratio_vs_leanest_peer": cr,
                    "agent_cpu_s_per_gib": s["dpu_cpu_s_per_gib"],
                }
                lines.append(
                    f"  {label:>5} c={conc:<2} {n:<28} {fmt(tr, '.2f')}x {cell['best_peer'] or '-'} "
                    f"({fmt(cell['best_peer_gib_per_s'], '.3f')} GiB/s); host CPU {fmt(cr, '.3f')}x "
                    f"{cell['leanest_peer'] or '-'} ({fmt(cell['leanest_peer_host_cpu_s_per_gib'], '.3f')} s/GiB)"
                )
            ratios.setdefault(label, {})[str(conc)] = cell

    # ------------------------------------------------------------ targets
    # The issue's targets, judged per size at the highest concurrency: the
    # best Sluice reader >= the best peer (every size), >= 1.5x at 64 MiB,
    # host CPU per GiB <= 0.1x the leanest peer's at 1 MiB and above.
    conc = max(concurrency)
    targets: Dict[str, Any] = {}
    lines.append("")
    lines.append(f"Targets (at {conc} in flight): >= the best peer at every size, >= 1.5x at 64 MiB; "
                 "host CPU per GiB <= 0.1x the leanest peer's at 1 MiB and above")  # fmt: skip
    for label, size, _ in sizes:
        cell = ratios.get(label, {}).get(str(conc))
        if not cell:
            continue
        thr = {n: v["throughput_ratio_vs_best_peer"] for n, v in cell["readers"].items()}
        cpu = {n: v["host_cpu_ratio_vs_leanest_peer"] for n, v in cell["readers"].items()}
        thr_ok = {n: v for n, v in thr.items() if v is not None}
        cpu_ok = {n: v for n, v in cpu.items() if v is not None}
        goal_thr = 1.5 if label == "64MiB" else 1.0
        t: Dict[str, Any] = {"throughput_goal": goal_thr, "best_peer": cell["best_peer"]}
        if thr_ok:
            b = max(thr_ok, key=thr_ok.get)  # type: ignore[arg-type]
            t.update(best_sluice=b, throughput_ratio=thr_ok[b], throughput_met=thr_ok[b] >= goal_thr,
                     throughput_met_by=[n for n, v in thr_ok.items() if v >= goal_thr])  # fmt: skip
        else:
            t.update(throughput_ratio=None, throughput_met=None)
        if size >= 1 << 20:
            t["cpu_goal"] = 0.1
            t["leanest_peer"] = cell["leanest_peer"]
            if cpu_ok:
                c = min(cpu_ok, key=cpu_ok.get)  # type: ignore[arg-type]
                t.update(leanest_sluice=c, cpu_ratio=cpu_ok[c], cpu_met=cpu_ok[c] <= 0.1,
                         cpu_met_by=[n for n, v in cpu_ok.items() if v <= 0.1])  # fmt: skip
            else:
                t.update(cpu_ratio=None, cpu_met=None)
        targets[label] = t

        def verdict(v: Optional[bool]) -> str:
            if v is not None:
                return "MET" if v else "NOT MET"
            return "no Sluice reader ran" if not cell["readers"] else "no peer to compare"

        line = (
            f"  {label:>5}: throughput {fmt(t.get('throughput_ratio'), '.2f')}x {t['best_peer'] or '-'} "
            f"({t.get('best_sluice', '-')}; goal >= {goal_thr}x) -> {verdict(t['throughput_met'])}"
        )
        if "cpu_goal" in t:
            line += (
                f"; host CPU {fmt(t.get('cpu_ratio'), '.3f')}x {t.get('leanest_peer') or '-'} "
                f"({t.get('leanest_sluice', '-')}; goal <= 0.1x) -> {verdict(t['cpu_met'])}"
            )
        lines.append(line)
    missing = [p for p in peers if not any(r["reader"] == p for r in rows)]
    if missing:
        lines.append(f"  (peers compared: those that ran; without: {', '.join(missing)})")
    lines.append(f"wall time {wall:.0f}s")
    table = "\n".join(lines)
    print(table)

    machine = lr.machine_info()
    machine.pop("rustc", None)
    machine.update({k: v for k, v in gpu_info.items() if k != "event"})
    machine["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc = {
        "benchmark": "gpu",
        "issue": 24,
        "mode": "dry-run-model" if mode == "dry" else "real",
        "dry_run_note": (
            "sluice.cuda.HostModel stood in for the GPU (host memory, deferred copies): code path only, "
            "numbers mean nothing" if mode == "dry" else None
        ),
        "command": shlex.join(["bench/run", "gpu"] + lr.user_args()),
        "targets": targets,
        # At the highest concurrency: size -> Sluice reader -> ratio.
        "throughput_ratio_vs_best_peer": {
            lb: {n: v["throughput_ratio_vs_best_peer"] for n, v in c[str(conc)]["readers"].items()}
            for lb, c in ratios.items() if str(conc) in c
        },
        "host_cpu_ratio_vs_leanest_peer": {
            lb: {n: v["host_cpu_ratio_vs_leanest_peer"] for n, v in c[str(conc)]["readers"].items()}
            for lb, c in ratios.items() if str(conc) in c
        },
        # Per size and concurrency: best and leanest peers, every Sluice reader.
        "ratios": ratios,
        "machine": machine,
        "config": {
            "sizes": [{"size": lb, "object_bytes": s, "objects": n} for lb, s, n in sizes],
            "concurrency": concurrency,
            "repeats": args.repeats,
            "verify_per_pass": args.verify,
            "peer_batch": args.peer_batch,
            "peer_batch_mib": args.peer_batch_mib,
            "gpu_lane_mib": args.gpu_lane_mib,
            "split": {r: cpulist(c) for r, c in split.items()},
            "runtime_threads": len(split["dpu"]) if split else 0,
            "placement": placement,
        },
        "method": {
            "stack": "sluice up --rdma in a temp dir: sluice-gateway (embedded directory store, loopback HTTP), "
            "sluice-agent, sluice-shim; namespace 'data' (HTTP data path) and 'data-rdma' (RDMA path, software "
            "tcp transport) over the same bucket",
            "objects": "put once through the gateway; deterministic contents (bench/loaders/run.py object_bytes)",
            "cell": "untimed warm-up pass (2 x in-flight objects), then `repeats` timed passes over all objects "
            "of the size; medians per metric. A pass ends when every object is in GPU memory",
            "verification": "after every pass (warm-up included), before its numbers count, up to `verify` "
            "objects the pass left in GPU memory are compared byte for byte on the device (torch.equal) with "
            "a reference put on the GPU from pinned memory; a mismatch fails the reader",
            "host_cpu": "reader process + sluice-shim (peers: the reader process, kvikio's threads included)",
            "agent_cpu": "sluice-agent: on the DPU in deployment (on the dpu cores with --split)",
            "gateway_cpu": "sluice-gateway, for reference",
            "cpu_clocks": "per-process CPU clocks (clock_getcpuclockid; /proc/<pid>/stat utime+stime as the "
            "fallback), sampled right before and after each timed pass",
            "readers": {n: results[n].get("method") for n in readers if results.get(n, {}).get("method")},
        },
        "versions": {n: results[n].get("version") for n in readers if results.get(n, {}).get("version")},
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
        "table": rows,
        "wall_seconds": wall,
        "text_table": table,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, os.getcwd())}")
    return any("error" in r for r in results.values())


if __name__ == "__main__":
    main()
