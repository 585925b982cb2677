"""The host CPU floor of checkpointing ordinary (unregistered) memory.

A DCP save or load of a state dict that does not live in registered memory
copies every byte once between the tensors and the shim's shared memory; a
load into a freshly allocated state also faults each page of it in on first
touch. This measures both on this machine, per GiB, so the checkpoint
benchmark's host CPU ratios can be read against them:

    python bench/checkpoint/copy_floor.py [--gib 1]

Prints the CPU seconds of: copying into a mapped (memfd) buffer with torch
(1 and 2 threads) and with a memoryview, and copying into a new, untouched
tensor (copy + first-touch faults).
"""

import argparse
import mmap
import os
import resource
import time

import torch

CHUNK = 64 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="bytes to copy, in GiB (default 1)")
    n = int(ap.parse_args().gib * (1 << 30)) // CHUNK * CHUNK
    src = torch.ones(n, dtype=torch.uint8)
    fd = os.memfd_create("copy-floor")
    os.ftruncate(fd, CHUNK)
    buf = mmap.mmap(fd, CHUNK)
    dst = torch.frombuffer(buf, dtype=torch.uint8)
    dst.fill_(0)  # the staging buffer is reused, so faulted in once
    gib = n / (1 << 30)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        c, t = cpu(), time.perf_counter()
        for off in range(0, n, CHUNK):
            dst.copy_(src[off : off + CHUNK])
        print(f"copy into shared memory, torch, {threads} thread(s): {(cpu() - c) / gib:.3f} s CPU/GiB "
              f"({(time.perf_counter() - t) / gib:.3f} s wall)")
    view = memoryview(src.numpy())
    c = cpu()
    for off in range(0, n, CHUNK):
        buf[0:CHUNK] = view[off : off + CHUNK]
    print(f"copy into shared memory, memoryview: {(cpu() - c) / gib:.3f} s CPU/GiB")
    torch.set_num_threads(1)
    fresh = torch.empty(n, dtype=torch.uint8)
    c = cpu()
    fresh.copy_(src)
    print(f"copy into a new tensor (first touch): {(cpu() - c) / gib:.3f} s CPU/GiB")


if __name__ == "__main__":
    main()
