"""Helpers for the tests, importable by spawned worker processes."""

from __future__ import annotations

import hashlib
import random
from typing import Any, Dict, List, Tuple

import sluice


def payload(n: int, seed: Any = 0) -> bytes:
    """Deterministic test bytes."""
    return random.Random(str(seed)).randbytes(n)


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def worker_roundtrip(args: Tuple[str, str, int, List[str]]) -> Dict[str, Any]:
    """A worker process with its own connection: writes its own objects,
    reads them back and reads the shared ones (pipelined)."""
    import os

    socket, prefix, wid, shared = args
    out: Dict[str, Any] = {"pid": os.getpid(), "wid": wid}
    with sluice.Client(socket, timeout=60) as c:
        mine = [f"{prefix}/w{wid}/obj{i}" for i in range(8)]
        for i, p in enumerate(mine):
            c.put(p, payload(1000 + 37 * i, (wid, i)))
        got = c.get_many(mine + shared)
        out["ok"] = [r.ok for r in got]
        out["mine_match"] = all(
            r.data == payload(1000 + 37 * i, (wid, i)) for i, r in enumerate(got[: len(mine)])
        )
        out["shared"] = {r.path: digest(r.data or b"") for r in got[len(mine) :]}
        with c.register(1 << 20) as region:
            t = c.get(shared[0], into=region)
            out["region_digest"] = digest(region.read(0, t.bytes))
        out["requests"] = c.stats().requests
    return out


def iterate_shard(args: Tuple[Any, int, int]) -> List[Tuple[str, str]]:
    """Runs one emulated DataLoader worker over an iterable dataset."""
    import sluice.torch as st

    ds, wid, nworkers = args
    st._torch_worker_info = lambda: type("W", (), {"id": wid, "num_workers": nworkers})()
    return [(p, digest(d)) for p, d in ds]
