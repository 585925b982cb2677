"""Where a Python process's CPU went, from a py-spy sampling profile.

``py-spy record -f raw --subprocesses -o FILE -- <command>`` writes one line
per distinct stack: ``process N:"cmd";frame;frame;... count`` (samples, idle
threads left out unless ``--idle``). This prints, per process with enough
samples, the functions with the most samples on top of the stack (*self*)
and in the stack at all (*inclusive*), as shares of that process's samples.

    python bench/profile_top.py FILE [--top 25] [--min-samples 50] [--match worker.py] [--exclude a,b]

``--exclude a,b`` drops the samples whose stack holds a function whose
name contains one of these (set-up that is not the timed work: imports,
building the state, checksums), before the shares are taken. Pool threads'
stacks do not hold their caller's, so filtering *in* the timed phase is not
possible from raw stacks; filtering out the untimed work is.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from typing import Dict, List, Tuple

FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*?)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (file.py)``: lines of one function
    are counted together."""
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m['fn']} ({m['file'].rsplit('/', 1)[-1]})"


def parse(path: str) -> Dict[str, List[Tuple[List[str], int]]]:
    procs: Dict[str, List[Tuple[List[str], int]]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = stack.split(";")
            # Leading "process N:..." entries: the innermost one is the process.
            procs_in = [fr for fr in frames if fr.startswith("process ")]
            proc = procs_in[-1] if procs_in else "?"
            frames = [short(fr) for fr in frames if not fr.startswith("process ") and not fr.startswith("thread ")]
            procs[proc].append((frames, int(count)))
    return procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--min-samples", type=int, default=50)
    ap.add_argument("--match", default="", help="only processes whose command line contains this")
    ap.add_argument("--exclude", default="", help="comma-separated function names: drop samples whose stack holds one")
    ap.add_argument(
        "--waits",
        default="Condition.wait (,_wait_for_tstate_lock (,Event.wait (,Thread.join (",
        help="samples whose innermost frame is one of these are waiting, not working: dropped (py-spy's own "
        "idle detection misses threads blocked in a lock under some VMs)",
    )
    args = ap.parse_args()
    drop = [x for x in args.exclude.split(",") if x]
    waits = [x for x in args.waits.split(",") if x]
    for proc, stacks in sorted(parse(args.file).items(), key=lambda kv: -sum(c for _, c in kv[1])):
        stacks = [
            (fr, c)
            for fr, c in stacks
            if not any(d in f for d in drop for f in fr) and not (fr and any(w in fr[-1] for w in waits))
        ]
        total = sum(c for _, c in stacks)
        if total < args.min_samples or args.match not in proc:
            continue
        own: Dict[str, int] = collections.Counter()
        incl: Dict[str, int] = collections.Counter()
        for frames, c in stacks:
            if frames:
                own[frames[-1]] += c
            for fr in set(frames):
                incl[fr] += c
        print(f"\n=== {proc}: {total} samples ===")
        print("  self %  function")
        for fr, c in own.most_common(args.top):
            print(f"  {100 * c / total:6.1f}  {fr}")
        print("  incl %  function")
        for fr, c in incl.most_common(args.top):
            print(f"  {100 * c / total:6.1f}  {fr}")


if __name__ == "__main__":
    sys.exit(main())
