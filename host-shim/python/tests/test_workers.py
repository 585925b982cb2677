"""Many processes with their own connections; a client killed mid-request."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import sluice
from _helpers import digest, payload, worker_roundtrip


def test_concurrent_worker_processes(stack, client, prefix):
    shared = [f"{prefix}/shared{i}" for i in range(4)]
    for i, k in enumerate(shared):
        client.put(k, payload(50_000 + i, ("shared", i)))
    expect = {k: digest(payload(50_000 + i, ("shared", i))) for i, k in enumerate(shared)}
    _, sessions_before = stack.settled()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        outs = pool.map(worker_roundtrip, [(stack.socket, prefix, w, shared) for w in range(12)])
    assert len({o["pid"] for o in outs}) > 1
    for o in outs:
        assert all(o["ok"]), o
        assert o["mine_match"] and o["shared"] == expect
        assert o["region_digest"] == expect[shared[0]]
        assert o["requests"] >= 8 + 8 + 4 + 1  # its own session's counters
    # Every worker's objects are there, written by separate connections.
    listed = {o.key for o in client.list(prefix + "/w")}
    assert len(listed) == 12 * 8
    assert stack.wait_for(lambda: stack.sessions() == sessions_before)


CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {src!r})
    import sluice
    c = sluice.Client({socket!r})
    regions = [c.register(1 << 20) for _ in range(4)]
    big = sluice.GetSpec({key!r}, into=c.register(16 << 20))
    print("ready", flush=True)
    while True:  # keep many GETs in flight until killed
        c.get_many([big] * 16 + [{key!r}] * 4)
    """
)


def test_killed_client_frees_its_regions(stack, client, prefix):
    key = f"{prefix}/big"
    data = payload(8 << 20, "kill")
    client.put(key, data)
    survivor = sluice.Client(stack.socket)  # connected before, must keep working
    survivor_region = survivor.register(16 << 20)
    base_regions, base_sessions = stack.settled()
    src = str(Path(sluice.__file__).resolve().parents[1])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(src=src, socket=stack.socket, key=key)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read()
        # 4 regions + the GET target + the scratch region of the bytes items.
        assert stack.wait_for(lambda: stack.regions() >= base_regions + 6), stack.regions()
        assert stack.wait_for(lambda: stack.sessions() == base_sessions + 1)
        time.sleep(0.5)  # let it get deep into its GET loop
        assert child.poll() is None
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The shim notices the dead connection and the agent drops its regions.
    assert stack.wait_for(lambda: stack.regions() == base_regions, 20), (stack.regions(), base_regions)
    assert stack.wait_for(lambda: stack.sessions() == base_sessions, 20)
    # Other clients were not disturbed.
    t = survivor.get(key, into=survivor_region)
    assert t.bytes == len(data) and survivor_region.read(0, t.bytes) == data
    assert client.get_bytes(key, range=(0, 16)) == data[:16]
    with sluice.Client(stack.socket) as fresh:
        assert fresh.head(key).size == len(data)
    survivor.close()
    assert stack.wait_for(lambda: stack.regions() == base_regions - 1)


def test_lost_connection_fails_calls_instead_of_hanging(stack):
    """When the stream ends (simulated by shutting our reading side), later
    calls fail with Disconnected rather than hanging."""
    c = sluice.Client(stack.socket)
    import socket as socketlib

    c._sock.shutdown(socketlib.SHUT_RD)  # the next read sees end-of-stream
    with pytest.raises(sluice.Disconnected):
        c.head("data/x")
    with pytest.raises(sluice.Disconnected):
        c.head("data/x")  # refused at once: the connection is known gone
    c.close()
