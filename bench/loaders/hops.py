"""Where a one-at-a-time small GET spends its time, hop by hop.

Starts a stack (``sluice up``), stores one object per size, then reads it
``--count`` times one at a time with the Python client (``get_into`` a
registered region: no copy in the client) and, for comparison, with boto3
straight to the gateway. Every daemon keeps a latency histogram
(``request_duration_seconds``: the shim from a request's frame to its reply,
the agent from the gRPC call to its answer, the gateway until the response
head); the mean of each over the run, and each process's CPU, give the
time and CPU per hop:

* client <-> shim: what the client saw, less the shim's time (the Unix
  socket round trip and the client's own work);
* shim -> agent: the shim's time less the agent's (gRPC over a Unix socket,
  the shim's work);
* agent -> gateway: the agent's time less the gateway's (signing, the HTTP
  request and the body, checksums, the agent's own work);
* gateway: until the response head.

Each process's context switches per GET (``/proc/<pid>/task/*/status``,
voluntary and not) count its sleeps: on a machine where a wake-up is
expensive, they are most of the CPU per GET.

    bench/run hops [--count 2000] [--sizes 4096,65536] [--bin-dir DIR]

Numbers from a shared machine are only as good as its quiet: the JSON
records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import urllib.request
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from benchlib import load as _load  # noqa: E402

lr = _load("sluice_bench_loaders_run", os.path.join(HERE, "run.py"))

#: The histograms' op label of a GET, per process.
GET_OPS = {"shim": ("get",), "agent": ("get",), "gateway": ("get",)}


def scrape(url: str) -> Dict[str, float]:
    """Sum and count of request_duration_seconds per op label."""
    out: Dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#") or "request_duration_seconds_" not in line:
                continue
            name, value = line.rsplit(" ", 1)
            if not (name.split("{")[0].endswith("_sum") or name.split("{")[0].endswith("_count")):
                continue
            kind = "sum" if name.split("{")[0].endswith("_sum") else "count"
            labels = dict(
                kv.split("=", 1) for kv in name[name.find("{") + 1 : name.rfind("}")].split(",") if "=" in kv
            ) if "{" in name else {}
            op = labels.get("op", "").strip('"')
            out[f"{op}:{kind}"] = out.get(f"{op}:{kind}", 0.0) + float(value)
    return out


def mean_of(before: Dict[str, float], after: Dict[str, float], ops: tuple) -> Any:
    s = sum(after.get(f"{op}:sum", 0.0) - before.get(f"{op}:sum", 0.0) for op in ops)
    n = sum(after.get(f"{op}:count", 0.0) - before.get(f"{op}:count", 0.0) for op in ops)
    return (s / n, int(n)) if n else (None, 0)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches(pid: int) -> int:
    """Times the process's threads were switched out (voluntarily: each sleep
    that a wake-up ends; or preempted), summed over its threads."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench/run hops")
    ap.add_argument("--count", type=int, default=2000, help="GETs per size and reader (default 2000)")
    ap.add_argument("--sizes", default="4096,65536", help="object sizes in bytes (default 4096,65536)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "hops.json"))
    args = ap.parse_args()
    import boto3
    import botocore.config

    import sluice

    stack = lr.Stack(args.bin_dir)
    results: List[Dict[str, Any]] = []
    load0 = os.getloadavg()
    try:
        ops = stack.info["ops"]
        client = sluice.Client(stack.info["socket"])
        s3 = boto3.client(
            "s3", endpoint_url=stack.info["gateway"], aws_access_key_id=stack.access_key,
            aws_secret_access_key=stack.secret_key, region_name="us-east-1",
            config=botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip
        for size in (int(x) for x in args.sizes.split(",")):
            key = f"hops/{size}"
            client.put(f"data/{key}", os.urandom(size))
            region = client.register(max(size, 4096))
            for _ in range(50):  # warm connections and caches
                client.get(f"data/{key}", into=region)
                s3.get_object(Bucket="data", Key=key)["Body"].read()
            before = {p: scrape(u) for p, u in ops.items()}
            cpu0 = {p: cpu_s(stack.pids[p]) for p in ("shim", "agent", "gateway")}
            sw0 = {p: switches(stack.pids[p]) for p in ("shim", "agent", "gateway")}
            sw0["client"] = switches(os.getpid())
            self0 = time.process_time()
            lat = []
            for _ in range(args.count):
                t0 = time.perf_counter()
                client.get(f"data/{key}", into=region)
                lat.append(time.perf_counter() - t0)
            self_cpu = time.process_time() - self0
            cpu1 = {p: cpu_s(stack.pids[p]) for p in ("shim", "agent", "gateway")}
            sw1 = {p: switches(stack.pids[p]) for p in ("shim", "agent", "gateway")}
            sw1["client"] = switches(os.getpid())
            after = {p: scrape(u) for p, u in ops.items()}
            means = {p: mean_of(before[p], after[p], GET_OPS[p]) for p in ops}
            direct = []
            for _ in range(args.count):
                t0 = time.perf_counter()
                s3.get_object(Bucket="data", Key=key)["Body"].read()
                direct.append(time.perf_counter() - t0)
            us = 1e6
            client_mean = statistics.fmean(lat)
            shim, agent, gw = (means[p][0] for p in ("shim", "agent", "gateway"))
            row = {
                "size": size,
                "count": args.count,
                "client_us": {"mean": client_mean * us, "p50": statistics.median(lat) * us,
                              "p99": sorted(lat)[int(0.99 * len(lat)) - 1] * us},
                "boto3_direct_us": {"mean": statistics.fmean(direct) * us, "p50": statistics.median(direct) * us,
                                    "p99": sorted(direct)[int(0.99 * len(direct)) - 1] * us},
                "daemon_mean_us": {p: None if m[0] is None else m[0] * us for p, m in means.items()},
                "daemon_requests": {p: m[1] for p, m in means.items()},
                "hops_us": None if None in (shim, agent, gw) else {
                    "client <-> shim": (client_mean - shim) * us,
                    "shim -> agent": (shim - agent) * us,
                    "agent -> gateway": (agent - gw) * us,
                    "gateway (to the response head)": gw * us,
                },
                "cpu_us_per_get": {"client": self_cpu / args.count * us,
                                   **{p: (cpu1[p] - cpu0[p]) / args.count * us for p in cpu0}},
                "switches_per_get": {p: (sw1[p] - sw0[p]) / args.count for p in ("client", "shim", "agent", "gateway")},
            }  # fmt: skip
            results.append(row)
            hops = row["hops_us"] or {}
            print(f"{size} B, {args.count} GETs one at a time: client mean {row['client_us']['mean']:.0f} us "
                  f"(p50 {row['client_us']['p50']:.0f}, p99 {row['client_us']['p99']:.0f}); boto3 straight to the "
                  f"gateway {row['boto3_direct_us']['mean']:.0f} us (p50 {row['boto3_direct_us']['p50']:.0f})")  # fmt: skip
            for h, v in hops.items():
                print(f"    {h:<32} {v:7.0f} us")
            print("    CPU per GET: " + ", ".join(f"{p} {v:.0f} us" for p, v in row["cpu_us_per_get"].items()))
            print("    threads switched out per GET (sleeps and preemptions): "
                  + ", ".join(f"{p} {v:.1f}" for p, v in row["switches_per_get"].items()))  # fmt: skip
            region.release()
        client.close()
    finally:
        stack.down(False)
    doc = {
        "benchmark": "hops",
        "issue": 25,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "bin_dir": args.bin_dir,
                    "loadavg_start": load0, "loadavg_end": os.getloadavg()},
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "results": results,
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
