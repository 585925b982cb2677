"""Fixtures: a real Sluice stack (gateway + embedded store, agent, shim)
started with ``sluice up`` for the whole session.

The binaries come from ``$SLUICE_BIN_DIR`` (default: ``<repo>/target/debug``;
build them with ``cargo build``). If they are missing or the stack does not
come up, the tests fail; they never skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))  # helper modules for spawned processes

import sluice  # noqa: E402


def bin_dir() -> Path:
    return Path(os.environ.get("SLUICE_BIN_DIR") or REPO / "target" / "debug")


@dataclass
class Stack:
    dir: str
    socket: str
    metrics_url: str
    gateway: str
    tenant: str
    namespaces: list

    def metrics(self) -> Dict[str, float]:
        """The agent's Prometheus samples, ``name{labels}`` -> value."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        out: Dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def regions(self) -> int:
        """``sluice_agent_regions{tenant="default"}``: regions the agent holds."""
        return int(self.metrics().get('sluice_agent_regions{tenant="default"}', 0))

    def sessions(self) -> int:
        return int(self.metrics().get("sluice_agent_sessions", 0))

    def settled(self, timeout: float = 15.0) -> "tuple[int, int]":
        """``(regions, sessions)`` once they stop changing: connections that
        earlier tests closed are torn down by the shim asynchronously."""
        last = (self.regions(), self.sessions())
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.2)
            now = (self.regions(), self.sessions())
            if now == last:
                return now
            last = now
        return last

    def wait_for(self, what: Callable[[], bool], timeout: float = 15.0) -> bool:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if what():
                return True
            time.sleep(0.05)
        return what()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    bins = bin_dir()
    exe = bins / "sluice"
    missing = [n for n in ("sluice", "sluice-gateway", "sluice-agent", "sluice-shim") if not (bins / n).exists()]
    if missing:
        pytest.fail(
            f"Sluice binaries missing in {bins}: {', '.join(missing)} "
            "(run `cargo build --workspace --bins`, or set SLUICE_BIN_DIR)"
        )
    d = tempfile.mkdtemp(prefix="slpy-", dir="/tmp")  # short: the socket path must stay < 100 chars
    try:
        p = subprocess.run(
            [str(exe), "up", "--dir", d, "--bin-dir", str(bins), "--json", "--encrypted"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        if p.returncode != 0:
            pytest.fail(f"`sluice up` failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        info = json.loads(p.stdout.strip().splitlines()[-1])
        st = Stack(info["dir"], info["socket"], info["metrics"], info["gateway"], info["tenant"], info["namespaces"])
        yield st
    finally:
        subprocess.run([str(exe), "down", "--dir", d], capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def client(stack: Stack) -> Iterator[sluice.Client]:
    with sluice.Client(stack.socket, timeout=60) as c:
        yield c


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix in namespace "data" (no trailing slash)."""
    return f"data/pytest-{uuid.uuid4().hex[:12]}"
