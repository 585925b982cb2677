"""One soak client process: CLIENTS clients of one tenant on one node, each
its own connection to the node's shim, each a loop of PUT, whole GET of
what it wrote, get_many of the tenant's dataset and a ranged GET, every
byte checked against content derived from the key, its version and the
run's seed. Runs as the tenant's uid (the shim maps uids to tenants);
prints one JSON object with what it counted.

    load.py --socket S --node 1 --tenant alpha --clients 4 --seed X \\
            --start-at EPOCH --duration SECONDS
    load.py --socket S --seed X --write-dataset     (before the run)

Imported by soak.py for DATASET and WRITE_SIZES (its summary names them).
"""

import argparse
import hashlib
import json
import random
import sys
import threading
import time
import traceback

KIB, MIB = 1 << 10, 1 << 20
# The tenant's dataset, read by all its clients on every node: (key, size).
# The 12 MiB objects are read in two ranged parts (the agents' get_part_size
# is 8 MiB), possibly through both gateways.
DATASET = [(f"ds/{i:03d}", size) for i, size in
           enumerate([256 * KIB, 1 * MIB, 2 * MIB, 4 * MIB] * 4 + [12 * MIB, 12 * MIB])]
# What each client writes, in turn, under its own keys; 24 MiB is a
# multipart upload (threshold 16 MiB, 8 MiB parts).
WRITE_SIZES = [128 * KIB, 1 * MIB, 4 * MIB, 24 * MIB]
KEYS_PER_CLIENT = 4
GET_MANY_ITEMS = 4
MAX_ERRORS_KEPT = 20
_BASE = 32 * MIB


class Content:
    """The bytes of (key, version): a window of one seeded random buffer at
    an offset hashed from key and version, so every version of every key
    has its own content and a byte read from the wrong object, version or
    offset shows."""

    def __init__(self, seed):
        self.buf = memoryview(random.Random(f"sluice-soak:{seed}").randbytes(_BASE + max(WRITE_SIZES) + 16 * MIB))

    def of(self, key, version, size):
        h = int.from_bytes(hashlib.sha256(f"{key}:{version}".encode()).digest()[:8], "big")
        off = h % _BASE
        return self.buf[off:off + size]


def first_difference(got, want):
    """The offset of the first byte that differs (or the shorter length)."""
    n = min(len(got), len(want))
    step = 1 << 16
    for at in range(0, n, step):
        if got[at:at + step] != want[at:at + step]:
            for i in range(at, min(at + step, n)):
                if got[i] != want[i]:
                    return i
    return n


class Tally:
    """One client's counts. Times are seconds since the run's start."""

    def __init__(self, t0):
        self.t0 = t0
        self.ops = {}          # kind -> [calls, objects, bytes, seconds summed, slowest]
        self.errors = 0
        self.wrong = 0
        self.wrong_bytes = 0   # bytes that differ in the 4 KiB from each wrong read's first difference
        self.messages = []
        self.per_second = {}   # second -> [bytes, ops]

    def done(self, kind, nbytes, started, objects=1):
        now = time.time()
        took = now - started
        o = self.ops.setdefault(kind, [0, 0, 0, 0.0, 0.0])
        o[0] += 1
        o[1] += objects
        o[2] += nbytes
        o[3] += took
        o[4] = max(o[4], took)
        s = self.per_second.setdefault(int(now - self.t0), [0, 0])
        s[0] += nbytes
        s[1] += objects

    def error(self, kind, path, e):
        self.errors += 1
        if len(self.messages) < MAX_ERRORS_KEPT:
            self.messages.append(f"{time.time() - self.t0:.1f}s {kind} {path}: {type(e).__name__}: {e}")

    def mismatch(self, kind, path, got, want):
        self.wrong += 1
        at = first_difference(got, want)
        self.wrong_bytes += sum(1 for a, b in zip(bytes(got[at:at + 4096]), bytes(want[at:at + 4096])) if a != b) \
            + abs(len(got) - len(want))
        if len(self.messages) < MAX_ERRORS_KEPT:
            self.messages.append(f"{time.time() - self.t0:.1f}s {kind} {path}: wrong bytes: {len(got)} bytes read, "
                                 f"{len(want)} expected, first difference at {at}")

    def json(self):
        return {
            "ops": {k: {"calls": v[0], "objects": v[1], "bytes": v[2], "mean_s": v[3] / v[0] if v[0] else 0,
                        "max_s": v[4]}
                    for k, v in self.ops.items()},
            "errors": self.errors,
            "wrong": self.wrong,
            "wrong_bytes": self.wrong_bytes,
            "messages": self.messages,
            "per_second": {str(k): v for k, v in sorted(self.per_second.items())},
        }


def client_loop(client, name, content, dataset, t0, end, tally):
    """PUT, read back, get_many, ranged GET, until `end`."""
    rnd = random.Random(name)
    i = 0
    while time.time() < end:
        size = WRITE_SIZES[i % len(WRITE_SIZES)]
        path = f"data/w/{name}/{i % KEYS_PER_CLIENT}"
        want = content.of(path, i, size)
        started = time.time()
        try:
            client.put(path, want)
            tally.done("put", size, started)
        except Exception as e:  # noqa: BLE001 -- every failure is counted
            tally.error("put", path, e)
            i += 1
            continue
        if time.time() >= end:
            break
        started = time.time()
        try:
            got = client.get_bytes(path, size_hint=size)
            tally.done("get", len(got), started)
            if got != want:
                tally.mismatch("get", path, got, want)
        except Exception as e:  # noqa: BLE001
            tally.error("get", path, e)
        if time.time() >= end:
            break
        picks = rnd.sample(dataset, GET_MANY_ITEMS)
        started = time.time()
        try:
            results = client.get_many([f"data/{k}" for k, _ in picks])
            moved = got_ok = 0
            for (key, sz), r in zip(picks, results):
                if not r.ok:
                    tally.error("get_many", r.path, r.error)
                    continue
                moved += r.nbytes
                got_ok += 1
                if r.data != content.of(f"data/{key}", 0, sz):
                    tally.mismatch("get_many", r.path, r.data, content.of(f"data/{key}", 0, sz))
            tally.done("get_many", moved, started, objects=got_ok)
        except Exception as e:  # noqa: BLE001
            tally.error("get_many", "batch", e)
        if time.time() >= end:
            break
        key, sz = rnd.choice(dataset)
        start = rnd.randrange(sz)
        length = rnd.randint(1, min(sz - start, 2 * MIB))
        started = time.time()
        try:
            got = client.get_bytes(f"data/{key}", range=(start, length))
            tally.done("ranged_get", len(got), started)
            want = content.of(f"data/{key}", 0, sz)[start:start + length]
            if got != want:
                tally.mismatch("ranged_get", f"data/{key}[{start}+{length}]", got, want)
        except Exception as e:  # noqa: BLE001
            tally.error("ranged_get", f"data/{key}", e)
        i += 1


def write_dataset(args, content):
    import sluice

    with sluice.Client(args.socket, client_name="soak-seed") as c:
        for key, size in DATASET:
            c.put(f"data/{key}", content.of(f"data/{key}", 0, size))
            got = c.get_bytes(f"data/{key}", size_hint=size)
            if got != content.of(f"data/{key}", 0, size):
                raise SystemExit(f"data/{key}: read back wrong")
    print(json.dumps({"written": len(DATASET), "bytes": sum(s for _, s in DATASET)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--write-dataset", action="store_true")
    p.add_argument("--node", type=int, default=0)
    p.add_argument("--tenant", default="")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--start-at", type=float, default=0)
    p.add_argument("--duration", type=float, default=10)
    args = p.parse_args()
    content = Content(args.seed)
    if args.write_dataset:
        write_dataset(args, content)
        return
    import sluice

    clients, tallies, threads = [], [], []
    out = {"node": args.node, "tenant": args.tenant, "clients": []}
    try:
        for j in range(args.clients):
            clients.append(sluice.Client(args.socket, client_name=f"soak-n{args.node}-{args.tenant}-{j}"))
    except Exception as e:  # noqa: BLE001
        out["fatal"] = f"connecting client {len(clients)}: {type(e).__name__}: {e}"
        print(json.dumps(out))
        return
    t0 = max(args.start_at, time.time())
    time.sleep(max(0.0, t0 - time.time()))
    end = t0 + args.duration
    for j, c in enumerate(clients):
        tally = Tally(t0)
        tallies.append(tally)
        name = f"n{args.node}-{args.tenant}-{j}"

        def run(c=c, name=name, tally=tally):
            try:
                client_loop(c, name, content, DATASET, t0, end, tally)
            except Exception as e:  # noqa: BLE001
                tally.error("loop", name, e)
                tally.messages.append(traceback.format_exc()[-2000:])

        threads.append(threading.Thread(target=run, name=name))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["elapsed_s"] = time.time() - t0
    for c in clients:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass
    out["clients"] = [t.json() for t in tallies]
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
