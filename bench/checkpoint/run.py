"""Checkpoint benchmark (issue 28): saving and loading a transformer's training
state through Sluice's checkpoint API vs the S3 peers, all against one gateway.

Run through ``bench/run checkpoint [options]`` (which builds the release
binaries and the venv), or directly with a Python that has torch and the
peers: ``python bench/checkpoint/run.py --bin-dir target/release``.

Set-up: ``sluice up --rdma`` (gateway with its embedded store on local disk,
agent, shim) in a temporary directory. Per size (``--sizes 2,8`` GiB) a
state dict with a real model's shapes (bench/checkpoint/layout.py: bf16
weights of a Llama-style decoder, AdamW's fp32 moments and step tensors,
param_groups; 516 tensors from 4 bytes to 99 MB at 2 GiB) is round-tripped
by each writer, each in a worker process of its own (worker.py):

* Sluice: ``torch.save(state, sluice.checkpoint.CheckpointWriter(client,
  path))`` / ``torch.load(sluice.checkpoint.open_read(client, path))``, and
  ``sluice.dcp.save`` / ``sluice.dcp.load`` (one process);
* peers, straight from the gateway over HTTP with the same credentials:
  s3torchconnector's ``S3Checkpoint`` writer/reader and its DCP
  ``S3StorageWriter`` / ``S3StorageReader``, and boto3 ``upload_fileobj`` /
  ``download_fileobj`` of ``torch.save`` into a BytesIO (multipart, N
  parts in flight).

Every load is checked: every tensor's CRC-32, size, dtype and shape (and
every plain item) equal to the state dict's before the save, and the digest
of all checksums the same for every writer (one state dict).

Measured per save and load: GiB/s (the state dict's tensor bytes over wall
time), host CPU seconds per GiB (the worker process, plus sluice-shim for
Sluice; the agent's and the gateway's CPU on their own), the worker's RSS
above the state dict at the phase's peak (VmHWM reset per phase) and its
ru_maxrss. Between writers the previous checkpoint is deleted and the disk
synced (``sync``), so each starts with no write-back queued.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, HERE)
import layout as lay  # noqa: E402


sys.path.insert(0, BENCH)
from benchlib import load as _load  # noqa: E402


lr = _load("sluice_bench_loaders_run", os.path.join(BENCH, "loaders", "run.py"))
GIB, log, fmt, med = lr.GIB, lr.log, lr.fmt, lr.med
MIB = 1 << 20
WORKER = os.path.join(HERE, "worker.py")

SLUICE = ["sluice stream", "sluice dcp", "sluice dcp registered"]
PEERS = ["s3torchconnector S3Checkpoint", "s3torchconnector dcp", "boto3 upload/download_fileobj"]
#: Not a writer: torch.save into a sink and torch.load from memory, the CPU
#: and time floor of anything built on them (in the table, not in targets).
REFERENCE = ["torch.save/load (no I/O)"]
ALL = SLUICE + PEERS + REFERENCE
#: RSS target: 2 staging buffers, plus this much for the interpreter's own
#: bookkeeping (a few hundred KiB measured; pages are 4 KiB).
RSS_SLACK_MIB = 4
#: The pip package behind each peer (bench/run writes <package> into the
#: unavailable dir when it cannot be installed).
PACKAGE = {
    "s3torchconnector S3Checkpoint": "s3torchconnector",
    "s3torchconnector dcp": "s3torchconnector",
    "boto3 upload/download_fileobj": "boto3",
}
OPS = ("save", "load")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench/run checkpoint")
    ap.add_argument("--sizes", default="2,8", help="state dict sizes in GiB, comma-separated (default 2,8)")
    ap.add_argument("--writers", default=",".join(ALL), help="comma-separated subset (default: all)")
    ap.add_argument("--repeats", type=int, default=1, help="saves and loads per writer; medians (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the state dict lives (cuda: GPU tensors; needs torch with CUDA and a GPU)")
    ap.add_argument("--namespace", default="data",
                    help="Sluice namespace: data (HTTP data path) or data-rdma (RDMA path, tcp) (default data)")
    ap.add_argument("--chunk-mib", type=int, default=64,
                    help="CheckpointWriter chunk_bytes = the staging buffer (MiB, default 64, the API's default)")
    ap.add_argument("--prefetch", type=int, default=1,
                    help="open_read prefetch (chunks ahead; default 1, the API's: two chunk buffers in all)")
    ap.add_argument("--peer-threads", type=int, default=8,
                    help="boto3 max_concurrency and s3torchconnector DCP thread_count (default 8)")
    ap.add_argument("--boto3-part-mib", type=int, default=64, help="boto3 multipart part size (MiB, default 64)")
    ap.add_argument("--note", default="", help="a note on the machine's state, kept in the JSON")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"), help="where the sluice binaries are")
    ap.add_argument("--out", default="", help="JSON result file (default bench/results/checkpoint[-cuda].json)")
    ap.add_argument("--unavailable-dir", default="", help="directory of <package> files naming why it is not installed")
    ap.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    args = ap.parse_args()
    if not args.out:
        name = "checkpoint.json" if args.device == "cpu" else "checkpoint-cuda.json"
        args.out = os.path.join(ROOT, "bench", "results", name)
    return args


# ---------------------------------------------------------------- worker --
def call_worker(cfg: Dict[str, Any], env: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    p = subprocess.run([sys.executable, WORKER], input=json.dumps(cfg), capture_output=True, text=True, env=env)
    out = []
    for line in p.stdout.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    if not out:
        out.append({"event": "error", "reason": f"exit {p.returncode}: {p.stderr.strip()[-400:]}"})
    return out


def probe(device: str) -> Dict[str, Any]:
    """torch (and CUDA) as the workers see them; exits here if the run
    cannot be made."""
    ev = call_worker({"op": "probe"})[-1]
    if ev["event"] != "probe":
        raise SystemExit(f"bench/run checkpoint: {ev.get('reason')}; the benchmark needs torch (bench/run installs "
                         "torch==2.5.1 into .venv-bench)")  # fmt: skip
    if device == "cuda" and "gpu_name" not in ev:
        raise SystemExit(
            f"bench/run checkpoint --device cuda: no usable CUDA device here: {ev.get('cuda_unavailable')} "
            f"(torch {ev.get('torch')}, CUDA {ev.get('torch_cuda')}).\n"
            "--device cuda needs torch with CUDA and an NVIDIA GPU (the H100 machine: bench/checkpoint/README.md); "
            "without it, run the CPU mode (the default)."
        )
    return ev


def run_writer(name: str, cfg: Dict[str, Any], env: Dict[str, str]) -> Dict[str, Any]:
    """One writer's worker; its events, logged as they come."""
    cfg = dict(cfg, writer=name)
    res: Dict[str, Any] = {"name": name, "available": True, "runs": [], "verified": []}
    p = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(json.dumps(cfg))
    p.stdin.close()
    gib = cfg["layout"]["state_bytes"] / GIB
    for line in p.stdout:
        ev = json.loads(line)
        kind = ev["event"]
        if kind == "info":
            res["version"], res["method"] = ev["version"], ev["method"]
        elif kind == "unavailable":
            res.update(available=False, reason=ev["reason"])
        elif kind == "error":
            res["error"] = ev["reason"]
        elif kind == "state":
            res["state"] = ev
            log(f"  state: {ev['tensors']} tensors, {ev['state_bytes'] / GIB:.3f} GiB, digest {ev['digest']}, "
                f"built in {ev['build_s']:.1f}s")  # fmt: skip
        elif kind == "prepared":
            res["prepared"] = ev
            log(f"  state registered once (untimed): {ev['seconds']:.2f}s, {ev['cpu_s']:.2f}s CPU")
        elif kind == "run":
            res["runs"].append(ev)
            c = ev["cpu_s"]
            log(
                f"  {ev['op']} #{ev['repeat']}: {ev['seconds']:.2f}s = {gib / ev['seconds']:.3f} GiB/s; CPU worker "
                f"{c['worker']:.2f}s shim {fmt(c['shim'], '.2f')}s agent {fmt(c['agent'], '.2f')}s gateway "
                f"{fmt(c['gateway'], '.2f')}s; RSS +{fmt(ev['rss_extra_mib'], '.0f')} MiB over the state"
            )
        elif kind == "verified":
            res["verified"].append(ev)
            log(f"  load #{ev['repeat']} verified: {ev['tensors']} tensors match (digest {ev['digest']})")
        elif kind == "done":
            res["ru_maxrss_mib"] = ev["ru_maxrss_mib"]
    p.wait()
    if p.returncode != 0 and "error" not in res:
        res["error"] = f"worker exited with {p.returncode}"
    loads = sum(1 for r in res["runs"] if r["op"] == "load")
    if res["available"] and "error" not in res and len(res["verified"]) != loads:
        res["error"] = f"{loads} loads but {len(res['verified'])} verified"
    return res


def cleanup(stack: Any, namespace: str, prefix: str) -> int:
    """Deletes every object under the prefix (through the shim), then syncs
    the disk; returns how many objects were deleted."""
    import sluice

    n = 0
    with sluice.Client(stack.info["socket"]) as c:
        for o in list(c.list(f"{namespace}/{prefix}")):
            c.delete(f"{namespace}/{o.key}")
            n += 1
    os.sync()
    return n


def mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# ------------------------------------------------------------------ main --
def main() -> None:
    args = parse_args()
    t_start = time.perf_counter()
    try:
        sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"--sizes {args.sizes!r}: GiB numbers, comma-separated") from None
    writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    unknown = [w for w in writers if w not in ALL]
    if unknown or not sizes or min(sizes) <= 0 or args.repeats < 1:
        raise SystemExit(f"bad arguments (unknown writers {unknown}; known: {ALL})")
    torch_info = probe(args.device)
    log(f"torch {torch_info['torch']}" + (f", GPU {torch_info['gpu_name']}" if args.device == "cuda" else ""))
    layouts = [lay.describe(int(s * GIB)) for s in sizes]
    avail = mem_available()
    for d in layouts:
        # The worst peer holds the state and a serialized copy (BytesIO).
        need = 2.2 * d["state_bytes"] if args.device == "cpu" else 1.2 * d["state_bytes"]
        if avail and need > avail:
            log(f"warning: {d['state_bytes'] / GIB:.1f} GiB state: a worker may need ~{need / GIB:.1f} GiB, "
                f"{avail / GIB:.1f} GiB available")  # fmt: skip

    stack = lr.Stack(args.bin_dir)
    load_start = os.getloadavg()

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    results: Dict[str, Dict[str, Dict[str, Any]]] = {}
    interrupted = False
    #: Why the run ended before every writer had run (None: it did not).
    stopped: Optional[str] = None
    try:
        log(f"stack up in {stack.dir}: gateway {stack.info['gateway']}, shim {stack.info['socket']}")
        env = lr.reader_env(stack)
        bucket = "data"
        for d in layouts:
            label = size_label(d)
            log(f"== {label}: {d['tensors']} tensors, {d['state_bytes'] / GIB:.3f} GiB "
                f"({d['parameters'] / 1e6:.0f}M parameters; config {d['config']})")  # fmt: skip
            results[label] = {}
            for name in writers:
                why = ""
                pkg = PACKAGE.get(name)
                if pkg and args.unavailable_dir and os.path.exists(os.path.join(args.unavailable_dir, pkg)):
                    with open(os.path.join(args.unavailable_dir, pkg)) as f:
                        why = f.read().strip()
                if why:
                    results[label][name] = {"name": name, "available": False, "reason": why, "runs": []}
                    log(f"{name}: unavailable ({why})")
                    continue
                tag = "".join(ch if ch.isalnum() else "-" for ch in name).strip("-")
                prefix = f"bench-ckpt/{label}/{tag}/"
                cfg = {
                    "socket": stack.info["socket"],
                    "gateway": stack.info["gateway"],
                    "bucket": bucket,
                    "namespace": args.namespace,
                    "prefix": prefix,
                    "access_key": stack.access_key,
                    "secret_key": stack.secret_key,
                    "pids": stack.pids,
                    "layout": d,
                    "device": args.device,
                    "repeats": args.repeats,
                    "chunk_bytes": args.chunk_mib * MIB,
                    "prefetch": args.prefetch,
                    "peer_threads": args.peer_threads,
                    "boto3_part_bytes": args.boto3_part_mib * MIB,
                }
                os.sync()
                log(f"{name} ({label}):")
                t0 = time.perf_counter()
                res = run_writer(name, cfg, env)
                res["wall_s"] = time.perf_counter() - t0
                results[label][name] = res
                if not res["available"]:
                    log(f"{name}: unavailable ({res['reason']})")
                if "error" in res:
                    log(f"{name}: FAILED: {res['error']}")
                try:
                    res["objects_deleted"] = cleanup(stack, args.namespace, prefix)
                except Exception as e:  # noqa: BLE001 - the next writer still runs
                    log(f"  cleanup of {prefix} failed: {e}")
    except KeyboardInterrupt:
        interrupted = True
        stopped = "stopped by a signal"
    except Exception as e:  # noqa: BLE001 - reported, then raised again below
        stopped = f"the benchmark itself failed: {type(e).__name__}: {e}"
        raise
    finally:
        # The report first, the stack's teardown after: stopping a store
        # that holds several GiB can take long enough for a time limit
        # (the GPU machine's) to end the run, and what finished must not
        # be lost with it. A run stopped part way reports what it finished
        # and says why it stopped.
        failed = True
        try:
            wall = time.perf_counter() - t_start
            failed = report(args, layouts, writers, results, wall, torch_info, (load_start, os.getloadavg()),
                            stopped=stopped)
        except KeyboardInterrupt:
            interrupted = True
            stopped = "stopped by a signal while reporting (the JSON may be missing)"
        finally:
            stack.down(args.keep_stack)
    if interrupted:
        raise SystemExit(f"interrupted: {stopped}")
    if failed:
        sys.exit(1)


def size_label(d: Dict[str, Any]) -> str:
    g = d["target_bytes"] / GIB
    return f"{g:g}GiB"


# ---------------------------------------------------------------- report --
def summarize(name: str, res: Dict[str, Any], state_bytes: int, chunk_bytes: int) -> Dict[str, Dict[str, Any]]:
    """op -> medians over the repeats."""
    gib = state_bytes / GIB
    out: Dict[str, Dict[str, Any]] = {}
    sluice = name in SLUICE
    for op in OPS:
        rs = [r for r in res.get("runs", []) if r["op"] == op]
        if not rs:
            continue

        def per_gib(key: str) -> Optional[float]:
            return med([None if r["cpu_s"][key] is None else r["cpu_s"][key] / gib for r in rs])

        host = med([
            None if sluice and r["cpu_s"]["shim"] is None
            else (r["cpu_s"]["worker"] + (r["cpu_s"]["shim"] if sluice else 0.0)) / gib
            for r in rs
        ])  # fmt: skip
        extra = [r["rss_extra_mib"] for r in rs if r["rss_extra_mib"] is not None]
        out[op] = {
            "writer": name,
            "op": op,
            "repeats": len(rs),
            "seconds": med([r["seconds"] for r in rs]),
            "gib_per_s": med([gib / r["seconds"] for r in rs]),
            "host_cpu_s_per_gib": host,
            "worker_cpu_s_per_gib": per_gib("worker"),
            "shim_cpu_s_per_gib": per_gib("shim") if sluice else None,
            "agent_cpu_s_per_gib": per_gib("agent"),
            "gateway_cpu_s_per_gib": per_gib("gateway"),
            "rss_extra_mib": max(extra) if extra else None,
            "rss_extra_staging_buffers": max(extra) / (chunk_bytes / MIB) if extra else None,
            "rss_peak_mib": max((r["rss_peak_mib"] or 0) for r in rs),
            "ru_maxrss_mib": res.get("ru_maxrss_mib"),
            "runs": rs,
        }
    return out


def report(
    args: argparse.Namespace,
    layouts: List[Dict[str, Any]],
    writers: List[str],
    results: Dict[str, Dict[str, Dict[str, Any]]],
    wall: float,
    torch_info: Dict[str, Any],
    loadavg: Any,
    stopped: Optional[str] = None,
) -> bool:
    chunk = args.chunk_mib * MIB
    sluice = [w for w in writers if w in SLUICE]
    peers = [w for w in writers if w in PEERS]
    lines = [
        f"Checkpoint benchmark (issue 28): torch state dicts through one gateway; device {args.device}; "
        f"median of {args.repeats}; {os.cpu_count()} CPUs, everything on this machine; Sluice namespace "
        f"{args.namespace!r}",
        "host CPU = worker process (+ sluice-shim for Sluice), s per GiB of state; agent / gateway = their CPU "
        "per GiB; RSS+ = the worker's peak RSS above the state dict (MiB) and in staging buffers of "
        f"{args.chunk_mib} MiB",
        "",
        f"{'writer':<30} {'size':>6} {'op':>4} {'GiB/s':>7} {'secs':>7} {'host CPU':>8} {'worker':>7} {'shim':>6} "
        f"{'agent':>6} {'gateway':>7} {'RSS+ MiB':>8} {'bufs':>5} {'maxrss':>7}",
    ]
    table: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for d in layouts:
        label = size_label(d)
        table[label] = {}
        digests = set()
        for name in writers:
            res = results.get(label, {}).get(name, {})
            if res.get("state"):
                digests.add(res["state"]["digest"])
            summ = summarize(name, res, d["state_bytes"], chunk) if res else {}
            table[label][name] = summ
            if not summ:
                why = res.get("reason") or res.get("error") or "no result"
                status = "unavailable" if not res.get("available", True) else "FAILED"
                if not res and stopped:
                    status, why = "NOT RUN", f"the run ended first ({stopped})"
                lines.append(f"{name:<30} {label:>6}       {status}: {why[:110]}")
                continue
            for op in OPS:
                r = summ.get(op)
                if r is None:
                    lines.append(f"{name:<30} {label:>6} {op:>4}   FAILED: {(res.get('error') or 'no result')[:100]}")
                    continue
                lines.append(
                    f"{name:<30} {label:>6} {op:>4} {r['gib_per_s']:>7.3f} {r['seconds']:>7.2f} "
                    f"{fmt(r['host_cpu_s_per_gib'], '.3f'):>8} {fmt(r['worker_cpu_s_per_gib'], '.3f'):>7} "
                    f"{fmt(r['shim_cpu_s_per_gib'], '.3f'):>6} {fmt(r['agent_cpu_s_per_gib'], '.3f'):>6} "
                    f"{fmt(r['gateway_cpu_s_per_gib'], '.3f'):>7} {fmt(r['rss_extra_mib'], '.0f'):>8} "
                    f"{fmt(r['rss_extra_staging_buffers'], '.1f'):>5} {fmt(r['ru_maxrss_mib'], '.0f'):>7}"
                )
            if "error" in res:
                lines.append(f"{'':<30} {label:>6}       FAILED: {res['error'][:110]}")
        if len(digests) > 1:
            lines.append(f"  WARNING: the writers built different state dicts at {label}: {sorted(digests)}")
        lines.append("")

    # ------------------------------------------------------------ targets
    lines.append(
        "Targets: >= 1.0x the best peer's GiB/s, <= 0.1x that peer's host CPU per GiB, "
        f"RSS above the state <= 2 staging buffers ({2 * args.chunk_mib} MiB, + {RSS_SLACK_MIB} MiB of slack)"
    )
    targets: Dict[str, Any] = {}
    thr_ratio: Dict[str, Any] = {op: {} for op in OPS}
    cpu_ratio: Dict[str, Any] = {op: {} for op in OPS}
    rss_bufs: Dict[str, Any] = {op: {} for op in OPS}
    for d in layouts:
        label = size_label(d)
        targets[label] = {}
        for op in OPS:
            prs = [table[label][p][op] for p in peers if op in table[label].get(p, {})]
            best = max(prs, key=lambda r: r["gib_per_s"], default=None)
            cell: Dict[str, Any] = {
                "peers_compared": [r["writer"] for r in prs],
                "peers_missing": [p for p in peers if op not in table[label].get(p, {})],
                "best_peer": best["writer"] if best else None,
                "best_peer_gib_per_s": best["gib_per_s"] if best else None,
                "best_peer_host_cpu_s_per_gib": best["host_cpu_s_per_gib"] if best else None,
                "writers": {},
            }
            for n in sluice:
                s = table[label].get(n, {}).get(op)
                if s is None:
                    continue
                tr = s["gib_per_s"] / best["gib_per_s"] if best else None
                cr = (
                    s["host_cpu_s_per_gib"] / best["host_cpu_s_per_gib"]
                    if best and best["host_cpu_s_per_gib"] and s["host_cpu_s_per_gib"] is not None
                    else None
                )
                bufs = s["rss_extra_staging_buffers"]
                w = {
                    "gib_per_s": s["gib_per_s"],
                    "throughput_ratio": tr,
                    "throughput_met": None if tr is None else tr >= 1.0,
                    "host_cpu_s_per_gib": s["host_cpu_s_per_gib"],
                    "host_cpu_ratio": cr,
                    "cpu_met": None if cr is None else cr <= 0.1,
                    "rss_extra_mib": s["rss_extra_mib"],
                    "rss_extra_staging_buffers": bufs,
                    "rss_met": None if bufs is None else s["rss_extra_mib"] <= 2 * args.chunk_mib + RSS_SLACK_MIB,
                }
                w["all_met"] = all(w[k] for k in ("throughput_met", "cpu_met", "rss_met"))
                cell["writers"][n] = w
                thr_ratio[op].setdefault(label, {})[n] = tr
                cpu_ratio[op].setdefault(label, {})[n] = cr
                rss_bufs[op].setdefault(label, {})[n] = bufs

                def v(x: Optional[bool]) -> str:
                    return "no peer to compare" if x is None else "MET" if x else "NOT MET"

                bp = f"{best['writer']} {best['gib_per_s']:.3f} GiB/s, {fmt(best['host_cpu_s_per_gib'], '.3f')} s/GiB" if best else "-"
                lines.append(
                    f"  {label:>6} {op:<4} {n:<14} {fmt(tr, '.2f')}x [{v(w['throughput_met'])}]; host CPU "
                    f"{fmt(cr, '.3f')}x [{v(w['cpu_met'])}]; RSS+ {fmt(s['rss_extra_mib'], '.1f')} MiB = "
                    f"{fmt(bufs, '.2f')} buffers [{v(w['rss_met'])}]   (best peer: {bp})"
                )
            cell["met_by"] = [n for n, w in cell["writers"].items() if w["all_met"]]
            ref = next((table[label][r][op] for r in REFERENCE if op in table[label].get(r, {})), None)
            if ref is not None:
                rr = (
                    ref["host_cpu_s_per_gib"] / best["host_cpu_s_per_gib"]
                    if best and best["host_cpu_s_per_gib"] and ref["host_cpu_s_per_gib"] is not None
                    else None
                )
                cell["torch_alone"] = {"gib_per_s": ref["gib_per_s"], "host_cpu_s_per_gib": ref["host_cpu_s_per_gib"],
                                       "host_cpu_ratio_vs_best_peer": rr}  # fmt: skip
                lines.append(
                    f"  {label:>6} {op:<4} (torch.{op} alone, no I/O: {ref['gib_per_s']:.3f} GiB/s, "
                    f"{fmt(ref['host_cpu_s_per_gib'], '.3f')} s/GiB = {fmt(rr, '.3f')}x the best peer's host CPU)"
                )
            targets[label][op] = cell
    missing = sorted({p for lb in targets.values() for c in lb.values() for p in c["peers_missing"]})
    if missing:
        lines.append(f"  (best peer among those that ran; without: {', '.join(missing)})")
    lines.append(f"load average {loadavg[0][0]:.1f} at the start, {loadavg[1][0]:.1f} at the end; wall time {wall:.0f}s")
    if stopped:
        lines.append(f"INCOMPLETE: {stopped} before every writer had run; the rows above are what finished")
    text = "\n".join(lines)
    print(text)

    machine = lr.machine_info()
    machine.update(torch={k: v for k, v in torch_info.items() if k != "event"}, device=args.device)
    machine["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    machine["loadavg_start"], machine["loadavg_end"] = list(loadavg[0]), list(loadavg[1])
    machine["store"] = "the gateway's embedded directory store under /tmp (local disk)"
    machine["description"] = (
        f"{machine.get('cpus')} CPUs ({machine.get('cpu_model', '?')}), {machine.get('mem_gib', '?')} GiB RAM; "
        "client, shim, agent, gateway and peers share the CPUs; the gateway writes to local disk"
        + (f"; {args.note}" if args.note else "")
    )
    if args.note:
        machine["note"] = args.note
    doc = {
        "benchmark": "checkpoint",
        "issue": 28,
        "device": args.device,
        "command": shlex.join(["bench/run", "checkpoint"] + lr.user_args()),
        "machine": machine,
        "targets": targets,
        # size -> Sluice writer -> ratio (vs the fastest peer of that op).
        "save_throughput_ratio_vs_best_peer": thr_ratio["save"],
        "load_throughput_ratio_vs_best_peer": thr_ratio["load"],
        "save_host_cpu_ratio_vs_best_peer": cpu_ratio["save"],
        "load_host_cpu_ratio_vs_best_peer": cpu_ratio["load"],
        "save_rss_extra_staging_buffers": rss_bufs["save"],
        "load_rss_extra_staging_buffers": rss_bufs["load"],
        "layouts": {size_label(d): d for d in layouts},
        "config": {
            "sizes_gib": [d["target_bytes"] / GIB for d in layouts],
            "repeats": args.repeats,
            "namespace": args.namespace,
            "chunk_mib": args.chunk_mib,
            "staging_buffer_mib": args.chunk_mib,
            "rss_target_mib": 2 * args.chunk_mib + RSS_SLACK_MIB,
            "prefetch": args.prefetch,
            "peer_threads": args.peer_threads,
            "boto3_part_mib": args.boto3_part_mib,
        },
        "method": {
            "stack": "sluice up --rdma in a temp dir under /tmp: sluice-gateway (embedded directory store on local "
            "disk, loopback HTTP), sluice-agent, sluice-shim",
            "state": "bench/checkpoint/layout.py: a Llama-style decoder's bf16 weights, AdamW exp_avg/exp_avg_sq in "
            "fp32 and step tensors, param_groups and plain items; random bits seeded per tensor, same for every writer",
            "round_trip": "per writer one worker process: build the state, CRC-32 every tensor, save x repeats "
            "(timed), drop the state, load x repeats (timed, DCP into an allocated empty state), check every tensor "
            "(CRC-32, bytes, dtype, shape, device) and plain item against the values before the save",
            "throughput": "the state dict's tensor bytes / wall seconds of torch.save/dcp.save + upload (save) or "
            "download + torch.load/dcp.load (load)",
            "host_cpu": "worker process (self + children) + sluice-shim for Sluice; per-process CPU clocks "
            "(clock_getcpuclockid = /proc/<pid>/stat utime+stime at ns resolution) sampled around each phase",
            "agent_cpu": "sluice-agent (the DPU's in deployment); gateway: the storage server",
            "rss": "VmHWM reset per phase (/proc/self/clear_refs 5); save: peak - RSS before the save (the state "
            "is resident); load: peak - RSS before the load - the state's bytes (cpu; cuda: nothing subtracted); "
            "ru_maxrss over the worker's life",
            "between_writers": "the previous writer's objects deleted through the shim, then sync",
            "writers": {
                n: results[lb][n].get("method") for lb in results for n in results[lb] if results[lb][n].get("method")
            },
        },
        "versions": {n: r.get("version") for lb in results for n, r in results[lb].items() if r.get("version")},
        "writers": {
            lb: {
                n: {
                    "kind": "sluice" if n in SLUICE else "peer" if n in PEERS else "reference",
                    **{k: r.get(k) for k in ("available", "reason", "error", "wall_s", "state", "verified",
                                             "objects_deleted", "ru_maxrss_mib")},
                }  # fmt: skip
                for n, r in results[lb].items()
            }
            for lb in results
        },
        "table": table,
        "wall_seconds": wall,
        "text_table": text,
    }
    if stopped:
        # Writers or sizes that had not run are "NOT RUN" in the table.
        doc["interrupted"] = f"{stopped} before every writer had run; the table has what finished"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(args.out, os.getcwd())}")
    return any("error" in r for lb in results.values() for r in lb.values())


if __name__ == "__main__":
    main()
