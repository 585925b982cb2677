"""What one call costs the Python client: CPU of this process per object
(``os.times()``, user and system) and objects/s for 4 KiB reads, plus the
one-at-a-time latency of a GET into a registered region.

Run against a stack (``sluice up --dir D``), with the client to measure on
PYTHONPATH; interleave two clients to compare them (numbers move with the
load of a small machine):

    python bench/loaders/per_call.py --socket D/run/shim.sock --setup
    PYTHONPATH=host-shim/python/src python bench/loaders/per_call.py --socket D/run/shim.sock --label new

Results: bench/results/python-per-call-2core.txt, docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Callable

import sluice

OBJECTS = 4000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True, help="the shim's socket")
    ap.add_argument("--prefix", default="data/pc/", help="where the 4 KiB objects are (default data/pc/)")
    ap.add_argument("--setup", action="store_true", help=f"write the {OBJECTS} objects of 4 KiB and exit")
    ap.add_argument("--objects", type=int, default=8000, help="objects read per measurement (default 8000)")
    ap.add_argument("--label", default="", help="printed at the start of each line")
    args = ap.parse_args()

    c = sluice.Client(args.socket)
    keys = [f"{args.prefix}{i:05d}" for i in range(OBJECTS)]
    if args.setup:
        blob = os.urandom(4096)
        for k in keys:
            c.put(k, blob)
        print(f"wrote {OBJECTS} objects of 4 KiB under {args.prefix}")
        return
    n, label = args.objects, f"{args.label:4}"

    def per_object(name: str, fn: Callable[[int], None]) -> None:
        for i in range(200):  # warm up: scratch regions, size guess
            fn(i)
        t0, w0 = os.times(), time.perf_counter()
        for i in range(n):
            fn(i)
        w1, t1 = time.perf_counter(), os.times()
        user, sys_ = (t1.user - t0.user) / n * 1e6, (t1.system - t0.system) / n * 1e6
        print(f"{label} {name:24} user {user:6.1f} us, sys {sys_:6.1f} us per object; {n / (w1 - w0):7.0f} obj/s")

    per_object("get_bytes 1 thread", lambda i: c.get_bytes(keys[i % OBJECTS]))

    def batch_of_8(i: int) -> None:
        if i % 8 == 0:
            c.get_many(keys[i % OBJECTS : i % OBJECTS + 8])

    per_object("get_many of 8", batch_of_8)

    with c.register(1 << 20) as region:
        for i in range(200):
            c.get(keys[i], into=region)
        lat = []
        for i in range(3000):
            t = time.perf_counter()
            c.get(keys[i % OBJECTS], into=region)
            lat.append(time.perf_counter() - t)
    lat.sort()
    p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
    print(f"{label} get into region 1 thread   p50 {p50:6.0f} us  p99 {p99:6.0f} us")

    for threads in (16, 4):
        each = n // threads

        def work(t: int) -> None:
            for i in range(each):
                c.get_bytes(keys[(t * each + i) % OBJECTS])

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        t0, w0 = os.times(), time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        w1, t1 = time.perf_counter(), os.times()
        total = each * threads
        user, sys_ = (t1.user - t0.user) / total * 1e6, (t1.system - t0.system) / total * 1e6
        print(
            f"{label} get_bytes {threads:2} threads       user {user:6.1f} us, sys {sys_:6.1f} us per object; "
            f"{total / (w1 - w0):7.0f} obj/s"
        )
    c.close()


if __name__ == "__main__":
    main()
