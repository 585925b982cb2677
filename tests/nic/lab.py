"""The NIC isolation lab: an Open vSwitch bridge (userspace datapath) whose
ports are named like a BlueField's representors, each the bridge end of a
veth whose other end is eth0 in a network namespace:

    pfva  -> sla   tenant A's host function (its shim)
    pfvb  -> slb   tenant B's host function (its shim, and the attacker)
    agp   -> slag  the agent (the DPU's Arm side)
    up0   -> slst  storage (sluice-gateway)

The agent programs the bridge from its [nic] config. Everything lives in one
temporary directory and is torn down by `Lab.teardown`.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import netns

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("SLUICE_BIN_DIR", REPO / "target" / "debug")).resolve()

BR = "brsl"
AG, A, B, ST = "192.168.77.1", "192.168.77.11", "192.168.77.12", "192.168.77.100"
MAC = {"agent": "02:5c:00:00:00:01", "A": "02:5c:00:00:00:0a", "B": "02:5c:00:00:00:0b", "storage": "02:5c:00:00:00:64"}
# namespace, bridge port, address, MAC
HOSTS = {
    "A": ("sla", "pfva", A, MAC["A"]),
    "B": ("slb", "pfvb", B, MAC["B"]),
    "agent": ("slag", "agp", AG, MAC["agent"]),
    "storage": ("slst", "up0", ST, MAC["storage"]),
}
PORT = {"A": 7101, "B": 7102}
METER_KBPS = {"A": 200_000, "B": 8_000}
AK, SK = "lane-access-key", "lane-secret-key-0123456789"


def run(*cmd, check=True, env=None, input=None):
    return subprocess.run(cmd, capture_output=True, text=True, check=check, env=env, input=input)


def wait_for(what, seconds, probe, every=0.1):
    """Polls `probe` until it returns something true; that value, or raises."""
    end = time.monotonic() + seconds
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {seconds}s waiting for {what}")
        time.sleep(every)


class Daemon:
    """A process started in a namespace, its output in a log file."""

    def __init__(self, name, ns, cmd, work, env=None):
        self.name, self.log = name, work / f"{name}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, *map(str, cmd)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=10):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n=20):
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Ovs:
    """ovsdb-server and ovs-vswitchd in a private run directory."""

    def __init__(self, work):
        self.dir = work / "ovs"
        self.dir.mkdir()
        self.env = {**os.environ, "OVS_RUNDIR": str(self.dir)}
        d = self.dir
        run("ovsdb-tool", "create", f"{d}/conf.db", "/usr/share/openvswitch/vswitch.ovsschema")
        run("ovsdb-server", f"{d}/conf.db", f"--remote=punix:{d}/db.sock", f"--pidfile={d}/ovsdb.pid", "--detach",
            f"--log-file={d}/ovsdb.log", f"--unixctl={d}/ovsdb.ctl")
        self.vsctl("--no-wait", "init")
        self.start_vswitchd()

    def start_vswitchd(self):
        d = self.dir
        run("ovs-vswitchd", f"unix:{d}/db.sock", f"--pidfile={d}/vswitchd.pid", "--detach",
            f"--log-file={d}/vswitchd.log", f"--unixctl={d}/vswitchd.ctl", env=self.env)

    def kill_vswitchd(self):
        """SIGKILL, as a crash would (no clean teardown of the datapath)."""
        pid = int((self.dir / "vswitchd.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for("ovs-vswitchd to die", 10, lambda: not Path(f"/proc/{pid}").exists())
        (self.dir / "vswitchd.pid").unlink(missing_ok=True)

    def vsctl(self, *args):
        return run("ovs-vsctl", f"--db=unix:{self.dir}/db.sock", *args, env=self.env).stdout

    def ofctl(self, *args, check=True, input=None):
        return run("ovs-ofctl", *args, env=self.env, check=check, input=input).stdout

    def flows(self, *match):
        return self.flows_of(BR, *match)

    def flows_of(self, bridge, *match):
        return self.ofctl("-O", "OpenFlow14", "--names", "dump-flows", bridge, *match)

    def owned(self):
        """The agent's flows: cookie -> the flow's duration in seconds."""
        out = {}
        for line in self.flows("cookie=0x51ce000000000000/0xffff000000000000").splitlines():
            m = re.search(r"cookie=(0x[0-9a-f]+), duration=([0-9.]+)s", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def stop(self):
        for name in ("vswitchd", "ovsdb"):
            p = self.dir / f"{name}.pid"
            if p.exists():
                try:
                    os.kill(int(p.read_text()), signal.SIGTERM)
                except (OSError, ValueError):
                    pass


def cleanup_leftovers():
    """What a killed earlier run may have left: its OVS (which would hold the
    userspace datapath), namespaces and ports."""
    for pid in Path("/tmp").glob("niclane.*/ovs/*.pid"):
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    for ns, port, *_ in HOSTS.values():
        run("ip", "netns", "del", ns, check=False)
        run("ip", "link", "del", port, check=False)
    for d in Path("/tmp").glob("niclane.*"):
        shutil.rmtree(d, ignore_errors=True)


class Lab:
    def __init__(self):
        cleanup_leftovers()
        self.work = Path(tempfile.mkdtemp(prefix="niclane."))
        self.daemons = {}
        self.ovs = Ovs(self.work)
        # Secure: a bridge without flows forwards nothing (before the agent
        # starts, after the switch restarts). The agent refuses any other.
        self.ovs.vsctl("add-br", BR, "--", "set", "bridge", BR, "datapath_type=netdev", "fail_mode=secure")
        for ns, port, addr, mac in HOSTS.values():
            self._port(ns, port, addr, mac)

    def _port(self, ns, port, addr, mac):
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        # The switch's end sends nothing of its own: with IPv6 on, the kernel
        # would send router solicitations and MLD reports from it when it
        # comes up, straight to the function's end of the veth (not through
        # the switch), which the sniffers would count as frames the switch
        # let through.
        run("sysctl", "-qw", f"net.ipv6.conf.{port}.disable_ipv6=1")
        run("ip", "link", "set", port, "up")
        # TX checksum offload off on both ends: the userspace datapath drops
        # TCP with partial checksums.
        run("ethtool", "-K", port, "tx", "off")
        run("ip", "-n", ns, "link", "set", "eth0", "address", mac)
        run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off")
        self.ovs.vsctl("add-port", BR, port)

    # ---- the stack -------------------------------------------------------

    def start_gateway(self):
        w = self.work
        (w / "gateway.toml").write_text(
            f'listen = "{ST}:9000"\ndata_dir = "{w}/data"\nbuckets = ["data"]\nmetrics_listen = "{ST}:9101"\n'
            f'[tls]\ncert = "{w}/tls/gateway.crt"\nkey = "{w}/tls/gateway.key"\n'
            f'[[credentials]]\naccess_key = "{AK}"\nsecret_key = "{SK}"\n'
        )
        self.daemons["gateway"] = Daemon("gateway", "slst", [BIN / "sluice-gateway", "--config", w / "gateway.toml"], w)
        wait_for("the gateway", 30, lambda: self._ready("slst", ST, 9101))

    def write_secrets_and_certs(self):
        for t in ("alpha", "beta"):
            p = self.work / f"{t}.shim-secret"
            p.write_bytes(os.urandom(32).hex().encode())
            p.chmod(0o600)
        # The tenant listeners speak mutual TLS: the agent's certificate for
        # its address, a client certificate per tenant's shim; storage serves
        # HTTPS (tenants share the wire: object bytes never cross it in clear).
        run(BIN / "sluice", "certs", "--dir", self.work / "tls", "--agent-name", AG, "--shim", "alpha", "--shim", "beta",
            "--gateway-name", ST)

    def agent_config(self, with_beta=True, bridge=BR, sockets="agent"):
        w = self.work

        def tenant(name, host):
            ns, port, addr, mac = HOSTS[host]
            return f"""
[[tenants]]
name = "{name}"
shim_secret_file = "{w}/{name}.shim-secret"
[tenants.nic]
functions = [{{ port = "{port}", mac = "{mac}", addresses = ["{addr}"] }}]
listener_port = {PORT[host]}
meter_kbps = {METER_KBPS[host]}
[[tenants.namespaces]]
name = "data"
endpoints = ["https://{ST}:9000"]
ca_file = "{w}/tls/ca.crt"
bucket = "data"
prefix = "{name}/"
credentials = "store"
"""

        text = f"""grpc_socket = "{w}/{sockets}.sock"
memory_socket = "{w}/{sockets}-mem.sock"
metrics_listen = "{AG}:9100"
state_dir = "{w}/{sockets}-state"

[tls]
cert = "{w}/tls/agent.crt"
key = "{w}/tls/agent.key"
client_ca = "{w}/tls/ca.crt"

[nic]
bridge = "{bridge}"
ovs_rundir = "{self.ovs.dir}"
uplinks = ["up0"]
agent_port = "agp"
agent_address = "{AG}"
storage = ["{ST}"]

[credentials.store]
access_key = "{AK}"
secret_key = "{SK}"
""" + tenant("alpha", "A")
        if with_beta:
            text += tenant("beta", "B")
        return text

    def start_agent(self, wait_ready=True):
        cfg = self.work / "agent.toml"
        if not cfg.exists():
            cfg.write_text(self.agent_config())
        self.daemons["agent"] = Daemon("agent", "slag", [BIN / "sluice-agent", "--config", cfg], self.work,
                                       env={"OVS_RUNDIR": str(self.ovs.dir)})
        if wait_ready:
            wait_for("the agent's /ready", 30, lambda: self._ready("slag", AG, 9100) or self._died("agent"))
            if not self.daemons["agent"].alive():
                raise RuntimeError(f"the agent exited:\n{self.daemons['agent'].tail()}")

    def stop_agent(self):
        self.daemons["agent"].stop()

    def start_shims(self):
        w = self.work
        # name: (namespace, tenant whose secret it holds, listener port)
        shims = {"shima": ("sla", "alpha", 7101), "shimb": ("slb", "beta", 7102),
                 # A's secret on B's function: it can reach only B's listener.
                 "shimx": ("slb", "alpha", 7102)}
        for name, (ns, tenant, port) in shims.items():
            (w / f"{name}.toml").write_text(
                f'socket = "{w}/{name}.sock"\nsocket_mode = 0o600\nshim_id = "{name}"\n'
                f'[agent]\ngrpc = "https://{AG}:{port}"\nmemory_socket = "{w}/agent-mem.sock"\n'
                f'tls = {{ ca = "{w}/tls/ca.crt", cert = "{w}/tls/shim-{tenant}.crt", key = "{w}/tls/shim-{tenant}.key" }}\n'
                f'[[callers]]\nuid = 0\ntenant = "{tenant}"\n[tenant_secrets]\n{tenant} = "{w}/{tenant}.shim-secret"\n'
            )
            self.daemons[name] = Daemon(name, ns, [BIN / "sluice-shim", "--config", w / f"{name}.toml"], w)
        for name in shims:
            wait_for(name, 30, lambda: (w / f"{name}.sock").exists() or self._died(name))
            if not self.daemons[name].alive():
                raise RuntimeError(f"{name} exited:\n{self.daemons[name].tail()}")

    def _died(self, name):
        return not self.daemons[name].alive()

    def _ready(self, ns, host, port):
        try:
            return netns.http_get(ns, host, port, "/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def agent_ready(self):
        """(status, body) of the agent's /ready."""
        return netns.http_get("slag", AG, 9100, "/ready")

    def metric(self, name, *labels):
        """The sum of the agent's samples of `name` whose labels contain all of `labels`."""
        _, text = netns.http_get("slag", AG, 9100, "/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and all(lab in line for lab in labels):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def cli(self, ns, shim, *args, timeout=None):
        """`sluice` against `shim`'s socket in `ns`; with `timeout`, a run
        that takes longer is killed and raises `subprocess.TimeoutExpired`."""
        cmd = ["ip", "netns", "exec", ns, BIN / "sluice", "--socket", self.work / f"{shim}.sock", *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)

    # ---- diagnostics and teardown ----------------------------------------

    def diagnostics(self):
        parts = []
        try:
            parts.append("---- flow table (with counters) ----\n" + self.ovs.flows())
            parts.append(self.ovs.ofctl("-O", "OpenFlow13", "dump-meters", BR, check=False))
        except subprocess.CalledProcessError as e:
            parts.append(f"(no flow table: {e.stderr})")
        for name, d in self.daemons.items():
            parts.append(f"---- last lines of {name}.log ----\n{d.tail(15)}")
        return "\n".join(parts)

    def teardown(self, keep=False):
        for d in self.daemons.values():
            d.stop(timeout=3)
        self.ovs.stop()
        for ns, port, *_ in HOSTS.values():
            run("ip", "netns", "del", ns, check=False)
            run("ip", "link", "del", port, check=False)
        if keep:
            print(f"nic-lane: kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)
