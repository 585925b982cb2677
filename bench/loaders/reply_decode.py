"""The Python client's reply decoding, alone: framing plus ``decode_message``
per item answer of a ``get_many`` batch, timed without a stack.

The frames have the shape the shim sends for 4 KiB batches (as captured
from a ``sluice up`` stack: ``Response{id, request_id, item, get:
GetResult{report: TransferReport{...}, object_size, etag}}``, ~95 bytes
each), eight to a read as they arrive. Compare two versions of the client
by running it under each one's source folder:

    PYTHONPATH=host-shim/python/src .venv/bin/python bench/loaders/reply_decode.py
    PYTHONPATH=/tmp/old/host-shim/python/src .venv/bin/python bench/loaders/reply_decode.py

Prints the best of ``--passes`` passes over ``--batches`` batches, in µs per
reply frame; the client's other per-object costs (encoding, futures, the
socket) are not in it.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import List

from sluice import _wire


def batch_reads(batches: int, per_batch: int, seed: int) -> List[bytes]:
    """One read (``per_batch`` frames back to back) per batch."""
    rng = random.Random(seed)
    reads = []
    for b in range(batches):
        rid = "%016x" % rng.getrandbits(64)
        frames = []
        for i in range(per_batch):
            report = {
                "request_id": f"{rid}.{i}",
                "bytes": 4096,
                "data_path": 1,
                "elapsed_us": rng.randrange(1500, 2500),
                "parts": 1,
                "verified": True,
            }
            get = {"report": report, "object_size": 4096, "etag": '"%032x"' % rng.getrandbits(128)}
            frames.append(_wire.encode_frame("Response", {"id": b + 3, "request_id": rid, "item": i, "get": get}))
        reads.append(b"".join(frames))
    return reads


def one_pass(reads: List[bytes]) -> int:
    decoder = _wire.FrameDecoder()
    n = 0
    for data in reads:
        decoder.feed(data, [])
        for payload in decoder.frames():
            _wire.decode_message("Response", payload)
            decoder.stray_fds()
            n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=250, help="batches of replies (default 250)")
    ap.add_argument("--per-batch", type=int, default=8, help="item replies per batch (default 8)")
    ap.add_argument("--passes", type=int, default=15, help="timed passes; the best is shown (default 15)")
    args = ap.parse_args()
    reads = batch_reads(args.batches, args.per_batch, seed=1)
    frames = one_pass(reads)
    best = float("inf")
    for _ in range(args.passes):
        t0 = time.perf_counter()
        one_pass(reads)
        best = min(best, time.perf_counter() - t0)
    where = os.path.dirname(_wire.__file__)
    print(f"{frames} reply frames: {best / frames * 1e6:.2f} µs per frame (framing + decode, best of {args.passes}; {where})")


if __name__ == "__main__":
    main()
