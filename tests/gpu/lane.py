"""The GPU lane: Sluice's GPU regions against real CUDA memory.

Run on a machine with an NVIDIA GPU, torch and the release binaries
(scripts/gpu-lane does the set-up). It builds nothing: it starts a gateway
(embedded store), an agent with three namespaces (HTTP, the tcp one-sided
transport, and encrypted) and a shim, then checks, with bytes compared on
the GPU (torch.equal on the device):

* GET, ranged GET, get_many and PUT into and from CUDA tensors, in each
  namespace, at sizes that cross several staging halves;
* a region released while a copy is in flight (the GET stops, the memory
  is not written after release returns);
* a client killed mid-transfer (its GPU memory is released, the shim and
  agent drop its regions and still serve);
* a wrong address, another process's address and freed memory refused;
* host regions pinned for CUDA at registration (`.cuda()` at pinned speed).

Prints "gpu-lane: N passed, M failed"; exits 2 when there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "host-shim" / "python" / "src"))

import sluice  # noqa: E402

PASS, FAIL = [], []
MIB = 1 << 20


def check(name):
    def wrap(fn):
        def run(*a, **k):
            t0 = time.monotonic()
            try:
                detail = fn(*a, **k)
                PASS.append(name)
                print(f"gpu-lane: ok: {name} ({time.monotonic() - t0:.1f}s){': ' + detail if detail else ''}", flush=True)
            except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the lane
                FAIL.append(name)
                print(f"gpu-lane: FAILED: {name}: {type(e).__name__}: {e}", flush=True)
                traceback.print_exc(limit=4)

        return run

    return wrap


class Stack:
    """Gateway, agent and shim from the release binaries, in a temp dir."""

    def __init__(self, bins: Path) -> None:
        self.bins = bins
        self.dir = Path(tempfile.mkdtemp(prefix="slgpu-", dir="/tmp"))
        self.procs = {}

    def start(self) -> "Stack":
        d = self.dir
        ak, sk = "gpu-lane-" + secrets.token_hex(4), secrets.token_hex(20)
        (d / "data").mkdir()
        (d / "gateway.toml").write_text(
            f'listen = "127.0.0.1:0"\ndata_dir = "{d}/data"\nbuckets = ["data"]\naddr_file = "{d}/gateway.addr"\n'
            f'[[credentials]]\naccess_key = "{ak}"\nsecret_key = "{sk}"\n'
        )
        self._spawn("gateway", "sluice-gateway", d / "gateway.toml")
        gw = self._addr(d / "gateway.addr", "s3")
        keys = d / "keys" / "default"
        keys.mkdir(parents=True)
        (keys / "k1").write_text(secrets.token_hex(32))
        (keys / "current").write_text("k1")
        for p in (keys / "k1", keys / "current"):
            p.chmod(0o600)
        (d / "default.shim-secret").write_text(secrets.token_hex(32))
        (d / "default.shim-secret").chmod(0o600)
        ns = lambda name, extra="": (  # noqa: E731
            f'[[tenants.namespaces]]\nname = "{name}"\nendpoints = ["{gw}"]\nbucket = "data"\nprefix = "{name}/"\n'
            f'credentials = "local"\n{extra}\n'
        )
        (d / "agent.toml").write_text(
            f'grpc_socket = "{d}/agent.sock"\nmemory_socket = "{d}/agent-mem.sock"\nmetrics_listen = "127.0.0.1:0"\n'
            f'addr_file = "{d}/agent.addr"\nstate_dir = "{d}/agent-state"\n[encryption]\nkey_dir = "{d}/keys"\n'
            f'[credentials.local]\naccess_key = "{ak}"\nsecret_key = "{sk}"\n'
            f'[[tenants]]\nname = "default"\nshim_secret_file = "{d}/default.shim-secret"\nshim_origins = ["unix"]\n'
            + ns("data")
            + ns("data-rdma", 'data_path = "rdma"\ntransport = "tcp"')
            + ns("data-enc", 'encryption = "aes-256-gcm"')
        )
        self._spawn("agent", "sluice-agent", d / "agent.toml")
        self.metrics = "http://" + self._addr(d / "agent.addr", "metrics") + "/metrics"
        (d / "shim.toml").write_text(
            f'socket = "{d}/shim.sock"\nsocket_mode = 0o600\n[agent]\ngrpc = "unix:{d}/agent.sock"\n'
            f'memory_socket = "{d}/agent-mem.sock"\n[[callers]]\nuid = {os.getuid()}\ntenant = "default"\n'
            f'[tenant_secrets]\ndefault = "{d}/default.shim-secret"\n'
        )
        self._spawn("shim", "sluice-shim", d / "shim.toml")
        self.socket = str(d / "shim.sock")
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the shim did not start:\n{self.tail('shim')}")
            time.sleep(0.1)
        return self

    def _spawn(self, name: str, exe: str, cfg: Path) -> None:
        log = open(self.dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([str(self.bins / exe), "--config", str(cfg)], stdout=log, stderr=log)

    def _addr(self, path: Path, key: str) -> str:
        """The bound address from an addr_file: the gateway's is a bare
        `host:port`; the agent's is TOML (`metrics = "host:port"`)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = path.read_text().strip() if path.exists() else ""
            if text and key == "s3":
                return f"http://{text}"
            for line in text.splitlines():
                k, _, v = line.partition("=")
                if k.strip() == key and v.strip().strip('"'):
                    return v.strip().strip('"')
            time.sleep(0.1)
        raise RuntimeError(f"no {key} address in {path}:\n{self.tail(path.stem.split('.')[0])}")

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name))

    def tail(self, name: str) -> str:
        p = self.dir / f"{name}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-20:]) if p.exists() else ""

    def stop(self) -> None:
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def rand(torch, n: int):
    """n random bytes made on the GPU."""
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", default=os.environ.get("SLUICE_BIN_DIR", str(REPO / "target" / "release")))
    ap.add_argument("--large-mib", type=int, default=64, help="size of the large objects (MiB)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"gpu-lane: no torch here ({e}): the GPU lane needs torch with CUDA", flush=True)
        return 2
    if not torch.cuda.is_available():
        print("gpu-lane: no CUDA GPU here (torch.cuda.is_available() is False): nothing was checked", flush=True)
        return 2
    torch.cuda.init()
    dev = torch.cuda.get_device_name(0)
    print(f"gpu-lane: {dev}, torch {torch.__version__}, CUDA {torch.version.cuda}, binaries {args.bin_dir}", flush=True)
    stack = Stack(Path(args.bin_dir)).start()
    try:
        run_checks(torch, stack, args.large_mib * MIB)
    finally:
        stack.stop()
    print(f"gpu-lane: {len(PASS)} passed, {len(FAIL)} failed", flush=True)
    return 0 if not FAIL else 1


def run_checks(torch, stack: Stack, large: int) -> None:
    c = sluice.Client(stack.socket, timeout=120)
    sizes = [4096, MIB + 7, large + 13]

    for ns in ("data", "data-rdma", "data-enc"):

        @check(f"{ns}: PUT from and GET into CUDA tensors, whole and ranged, compared on the GPU")
        def round_trip(ns=ns):
            moved = []
            for n in sizes:
                src = rand(torch, n)
                t = c.put(f"{ns}/obj-{n}", c.register_gpu(src))
                assert t.bytes == n, t
                dst = torch.zeros(n + 512, dtype=torch.uint8, device="cuda")
                g = c.register_gpu(dst)
                t = c.get(f"{ns}/obj-{n}", into=g, offset=512)
                torch.cuda.synchronize()
                assert t.bytes == n and torch.equal(dst[512:], src), f"{n} bytes differ"
                start, length = n // 3, max(1, n // 2)
                t = c.get(f"{ns}/obj-{n}", into=g, offset=0, range=(start, length))
                assert torch.equal(dst[:length], src[start : start + length]), f"range of {n} differs"
                g.release()
                moved.append(f"{n} B via {t.data_path}")
            return ", ".join(moved)

        round_trip()

        @check(f"{ns}: get_many into one CUDA batch tensor, one missing item failing alone")
        def batch(ns=ns):
            objs = [rand(torch, 1000 + 37 * i) for i in range(32)]
            for i, o in enumerate(objs):
                c.put(f"{ns}/b{i}", c.register_gpu(o))
            slot = 4096
            buf = torch.zeros(slot * (len(objs) + 1), dtype=torch.uint8, device="cuda")
            g = c.register_gpu(buf)
            specs = [sluice.GetSpec(f"{ns}/b{i}", g, i * slot) for i in range(len(objs))]
            specs.append(sluice.GetSpec(f"{ns}/missing", g, len(objs) * slot))
            res = c.get_many(specs)
            torch.cuda.synchronize()
            for i, o in enumerate(objs):
                assert res[i].ok, res[i]
                assert torch.equal(buf[i * slot : i * slot + o.numel()], o), f"item {i}"
            assert isinstance(res[-1].error, sluice.NoSuchKey), res[-1]

        batch()

    @check("a region released while its copy is in flight: the GET stops, nothing written after release")
    def release_in_flight():
        n = 256 * MIB
        c.put("data/rel", c.register_gpu(rand(torch, n)))
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
        g = c.register_gpu(dst)
        out = {}

        def reader():
            try:
                out["t"] = c.get("data/rel", into=g)
            except sluice.SluiceError as e:
                out["e"] = e

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.02)
        g.release()
        torch.cuda.synchronize()
        snapshot = dst.clone()
        time.sleep(0.5)
        torch.cuda.synchronize()
        t.join(60)
        assert torch.equal(snapshot, dst), "the tensor changed after release() returned"
        assert "t" in out or isinstance(out.get("e"), sluice.RegionReleased), out
        return "finished first" if "t" in out else "stopped with RegionReleased"

    release_in_flight()

    @check("a client killed mid-transfer: its GPU memory released, its regions dropped, the stack still serves")
    def killed_client():
        c.put("data/kill", c.register_gpu(rand(torch, 512 * MIB)))
        regions_before = stack.metric('sluice_agent_regions{tenant="default"}')
        child = subprocess.Popen(
            [sys.executable, "-c", KILLED_CHILD, stack.socket],
            env={**os.environ, "PYTHONPATH": str(REPO / "host-shim" / "python" / "src")},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        assert line.startswith("reading"), line
        time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 30
        while stack.metric('sluice_agent_regions{tenant="default"}') > regions_before:
            assert time.monotonic() < deadline, "the dead client's regions were not reclaimed"
            time.sleep(0.2)
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout
        assert str(child.pid) not in apps.split(), f"the killed client still holds GPU memory: {apps}"
        dst = torch.zeros(512 * MIB, dtype=torch.uint8, device="cuda")
        assert c.get("data/kill", into=c.register_gpu(dst)).bytes == 512 * MIB

    killed_client()

    @check("a wrong address, another process's address and freed memory are refused")
    def refused():
        import ctypes

        try:
            c.register_gpu(0x7F0000001000, nbytes=4096)
            raise AssertionError("a made-up address was accepted")
        except sluice.BadRequest:
            pass
        other = subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.split()
        addr, n = int(other[0]), int(other[1])
        try:
            g = c.register_gpu(addr, nbytes=n)
            # CUDA addresses are per process; if it happens to be inside one
            # of ours, it is our own memory, never the other process's bytes.
            ours = [(t.data_ptr(), t.numel()) for t in gc_tensors(torch)]
            assert any(p <= g.ptr < p + m for p, m in ours), "another process's address was accepted"
        except sluice.BadRequest:
            pass
        t = torch.zeros(64 * MIB, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        del t
        torch.cuda.empty_cache()
        try:
            c.register_gpu(ptr, nbytes=64 * MIB)
            raise AssertionError("freed memory was accepted")
        except sluice.BadRequest:
            pass
        del ctypes

    refused()

    @check("host regions pinned for CUDA at registration: .cuda() at pinned speed")
    def pinned():
        with sluice.Client(stack.socket, pin_regions="always") as pc, sluice.Client(stack.socket, pin_regions="never") as uc:
            rp, ru = pc.register(256 * MIB), uc.register(256 * MIB)
            assert pc.pinned(rp) and not uc.pinned(ru)
            rates = []
            for r in (rp, ru):
                host = r.torch()
                host.cuda()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(4):
                    host.cuda(non_blocking=True)
                torch.cuda.synchronize()
                rates.append(4 * r.nbytes / (time.perf_counter() - t0) / (1 << 30))
            assert rates[0] > 2 * rates[1], f"pinned {rates[0]:.1f} GiB/s vs unpinned {rates[1]:.1f} GiB/s"
            return f"pinned {rates[0]:.1f} GiB/s, unpinned {rates[1]:.1f} GiB/s"

    pinned()

    @check("checkpoints: DCP save from and load into CUDA tensors, and torch.save/load through a stream")
    def checkpoints():
        from sluice import checkpoint as ck
        from sluice import dcp

        state = {
            "w": torch.randn(4096, 4096, device="cuda"),
            "b": torch.randn(4096, device="cuda").to(torch.bfloat16),
            "step": 11,
        }
        dcp.save(state, "data/lane-dcp", c)
        back = {"w": torch.zeros_like(state["w"]), "b": torch.zeros_like(state["b"]), "step": 0}
        dcp.load(back, "data/lane-dcp", c)
        torch.cuda.synchronize()
        assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"]) and back["step"] == 11
        with ck.CheckpointWriter(c, "data/lane-stream.pt") as w:
            torch.save(state, w)
        with ck.open_read(c, "data/lane-stream.pt") as r:
            got = torch.load(r, map_location="cuda")
        assert torch.equal(got["w"], state["w"])

    checkpoints()
    c.close()


def gc_tensors(torch):
    import gc

    return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]


KILLED_CHILD = r"""
import sys, torch, sluice
c = sluice.Client(sys.argv[1], timeout=120)
dst = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
g = c.register_gpu(dst)
print("reading", flush=True)
c.get("data/kill", into=g)
"""

OTHER_PROCESS = r"""
import torch
t = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
print(t.data_ptr() + (1 << 20), 1 << 20, flush=True)
"""

if __name__ == "__main__":
    sys.exit(main())
