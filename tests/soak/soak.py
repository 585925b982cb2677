"""The soak topology and run, and its figures (docs/soak.md).

One Ceph cluster (scripts/ceph: mon, mgr, OSD, two radosgw) whose gateways
listen on the address of a Linux bridge in the root namespace; NODES
"nodes", each a network namespace with a veth onto that bridge, running a
sluice-agent (one namespace "data" over both gateways for each of two
tenants, alpha and beta, each with its own RGW user and bucket) and a
sluice-shim whose Unix socket lives on the filesystem. Tenants are told
apart by uid (SO_PEERCRED): alpha's clients run as root, beta's as nobody.

    root ns:  slsoak0 (10.213.0.1)  <- radosgw 1 and 2 listen here
                 |   |   |   |
              slsoak1 .. slsoak4 (10.213.0.11 ..): agent + shim each

The NIC lane's helpers (tests/nic/lab.py) start the daemons in their
namespaces and wait for them.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "nic"))
sys.path.insert(0, str(HERE))

import lab  # noqa: E402  (the NIC lane's Daemon, run, wait_for, BIN)
import load  # noqa: E402  (the clients' dataset and content)

REPO = lab.REPO
BIN = lab.BIN
CEPH = REPO / "scripts" / "ceph"
BRIDGE = "slsoak0"
NET = "10.213.0"
GW_ADDR = f"{NET}.1"
NODES = 4
CLIENTS_PER_NODE = 8
# tenant -> (uid its clients run as, RGW user)
TENANTS = {"alpha": (0, "soaka"), "beta": (65534, "soakb")}
AGENT_METRICS, SHIM_METRICS = 9100, 9101
# Overwritten objects' tails go to RGW's garbage collector, which by default
# waits 2 h and runs hourly: at the soak's ~3 GiB a minute of overwritten
# 24 MiB objects the 10 GiB OSD would fill (and PUTs hang) within minutes.
RGW_OPTS = ["rgw_gc_obj_min_wait=5", "rgw_gc_processor_period=10", "rgw_gc_processor_max_time=10"]
# The OSD's block file: bluestore never returns freed space to the file
# system, so the file grows to this size over a long soak (the data the
# OSD holds stays under ~2.3 GiB with the collector above): it lives in
# /tmp when that disk has this much free, else in /dev/shm (scripts/ceph
# --block-dir auto).
OSD_GIB = 5


def ns_of(k):
    return f"slsoak{k}"


def addr_of(k):
    return f"{NET}.{10 + k}"


def http(url, timeout=3.0):
    """(status, body) of a GET from the root namespace (the bridge reaches
    every node's address)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def metric_sum(text, name, *labels):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and all(lab_ in line for lab_ in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


TCP_STATES = {"01": "established", "08": "close_wait", "06": "time_wait", "0A": "listen"}


def tcp_sockets(pid, ports):
    """Socket inode -> state of the process's TCP connections whose remote
    port is one of `ports` (/proc/PID/net/tcp is the process's namespace's)."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and int(f[2].rsplit(":", 1)[1], 16) in ports:
                out[f[9]] = TCP_STATES.get(f[3], f[3])
    return out


def proc_sample(pid, store_ports=()):
    """RSS (KiB) and open descriptors of a process: all, by kind, and the
    TCP connections to the store (the agent's keep-alive pool, by state)."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    store = tcp_sockets(pid, set(store_ports)) if store_ports else {}
    kinds, to_store = {}, {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":", 1)[0] if ":" in target and not target.startswith("/") else "file"
        if target.startswith("/memfd:"):
            kind = "memfd"
        if kind == "socket" and target[len("socket:["):-1] in store:
            state = store[target[len("socket:["):-1]]
            to_store[state] = to_store.get(state, 0) + 1
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"rss_kib": rss, "fds": sum(kinds.values()) + sum(to_store.values()),
            "fds_but_store": sum(kinds.values()), "fd_kinds": kinds, "store_connections": to_store}


def cleanup_leftovers():
    """What a killed earlier run may have left: its daemons, namespaces,
    links, bridge and Ceph cluster."""
    for pidfile in Path("/tmp").glob("slsoak.*/pids"):
        for line in pidfile.read_text().split():
            try:
                pid = int(line)
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if str(pidfile.parent).encode() in cmd:
                    os.kill(pid, 9)
            except (OSError, ValueError):
                pass
    for k in range(1, NODES + 1):
        lab.run("ip", "netns", "del", ns_of(k), check=False)
        lab.run("ip", "link", "del", f"slsoakv{k}", check=False)
    lab.run("ip", "link", "del", BRIDGE, check=False)
    for d in Path("/tmp").glob("slsoak.*"):
        if (d / "ceph").is_dir():
            # --remove: an OSD block file in /dev/shm goes with it.
            lab.run(str(CEPH), "down", "--dir", str(d / "ceph"), "--remove", check=False)
        shutil.rmtree(d, ignore_errors=True)


def machine():
    """What ran it: CPUs, memory, kernel, Ceph, the binaries' directory."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) >> 10
    except (OSError, ValueError, IndexError):
        pass
    ceph = lab.run("radosgw", "--version", check=False).stdout.strip()
    # The dev profile keeps line tables (debug = "line-tables-only");
    # release builds carry no .debug_info.
    try:
        sections = lab.run("readelf", "-S", str(BIN / "sluice-agent"), check=False).stdout
        build = "debug" if ".debug_info" in sections else ("release" if sections else "unknown")
    except OSError:
        build = "unknown"
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_mib": mem, "kernel": platform.release(),
            "ceph": ceph.split("(")[0].strip(), "bin_dir": str(BIN), "build": build}


class Soak:
    """The cluster, the nodes, and the daemons on them."""

    def __init__(self):
        cleanup_leftovers()
        # In /tmp, where cleanup_leftovers looks (and the Ceph admin
        # sockets' paths stay short).
        self.work = Path(tempfile.mkdtemp(prefix="slsoak.", dir="/tmp"))
        # beta's clients (nobody) reach the shims' sockets through it.
        self.work.chmod(0o755)
        self.daemons = {}
        self.ceph = None
        self.seed = os.urandom(8).hex()
        self.creds = {}

    # ---- network and cluster ------------------------------------------------

    def network(self):
        lab.run("ip", "link", "add", BRIDGE, "type", "bridge")
        lab.run("ip", "addr", "add", f"{GW_ADDR}/24", "dev", BRIDGE)
        lab.run("ip", "link", "set", BRIDGE, "up")
        for k in range(1, NODES + 1):
            ns, veth = ns_of(k), f"slsoakv{k}"
            lab.run("ip", "netns", "add", ns)
            lab.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            lab.run("ip", "link", "set", veth, "master", BRIDGE)
            lab.run("ip", "link", "set", veth, "up")
            lab.run("ip", "-n", ns, "addr", "add", f"{addr_of(k)}/24", "dev", "eth0")
            lab.run("ip", "-n", ns, "link", "set", "eth0", "up")
            lab.run("ip", "-n", ns, "link", "set", "lo", "up")

    def start_ceph(self):
        d = self.work / "ceph"
        t0 = time.monotonic()
        out = lab.run(str(CEPH), "up", "--dir", str(d), "--json", "--bind", GW_ADDR, "--owner", str(os.getpid()),
                      "--osd-gib", str(OSD_GIB), "--block-dir", "auto",
                      *(a for opt in RGW_OPTS for a in ("--rgw-opt", opt)), check=False)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/ceph up failed:\n{out.stderr}")
        self.ceph = json.loads(out.stdout)
        self.ceph["up_s"] = time.monotonic() - t0
        for tenant, (_, user) in TENANTS.items():
            out = lab.run(str(CEPH), "user", "--dir", str(d), user, "--bucket", "data", "--json", check=False)
            if out.returncode != 0:
                raise RuntimeError(f"scripts/ceph user {user} failed:\n{out.stderr}\n{self.ceph_logs()}")
            self.creds[tenant] = json.loads(out.stdout)

    def ceph_logs(self, lines=10):
        """The cluster's daemons' output (a gateway or the OSD that died)."""
        parts = []
        for p in sorted((self.work / "ceph" / "log").glob("*.out")):
            text = p.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"---- {p.name} ----\n" + "\n".join(text))
        return "\n".join(parts)

    def store_used(self):
        """Bytes the OSD holds (`ceph df`): the gateways' garbage collector
        keeps up, or the OSD fills."""
        out = lab.run("ceph", "-c", str(self.work / "ceph" / "ceph.conf"), "--connect-timeout", "10", "df",
                      "--format", "json", check=False)
        try:
            return json.loads(out.stdout)["stats"]["total_used_raw_bytes"]
        except (ValueError, KeyError):
            return None

    def block_file_bytes(self):
        """Disk the OSD's (sparse) block file takes."""
        try:
            return (self.work / "ceph" / "osd" / "block").stat().st_blocks * 512
        except OSError:
            return None

    def rgw(self, what, n):
        out = lab.run(str(CEPH), what, "--dir", str(self.work / "ceph"), str(n), check=False)
        if out.returncode != 0:
            raise RuntimeError(f"scripts/ceph {what} {n} failed:\n{out.stderr}")

    # ---- the nodes ---------------------------------------------------------

    def write_configs(self):
        for t in TENANTS:
            p = self.work / f"{t}.shim-secret"
            p.write_bytes(os.urandom(32).hex().encode())
            p.chmod(0o600)
        endpoints = ", ".join(f'"{e}"' for e in self.ceph["endpoints"])
        for k in range(1, NODES + 1):
            nd = self.work / f"node{k}"
            (nd / "state").mkdir(parents=True)
            nd.chmod(0o755)
            text = f"""grpc_socket = "{nd}/agent.sock"
memory_socket = "{nd}/mem.sock"
metrics_listen = "{addr_of(k)}:{AGENT_METRICS}"
state_dir = "{nd}/state"

[s3]
get_part_size = 8388608
multipart_threshold = 16777216
put_part_size = 8388608
max_concurrency = 4
max_attempts = 4
retry_base_ms = 50

[failover]
first_byte_timeout_ms = 5000
eject_after_failures = 3
probe_interval_ms = 250
probe_timeout_ms = 2000
"""
            for t in TENANTS:
                c = self.creds[t]
                text += f'\n[credentials.{t}]\naccess_key = "{c["access_key"]}"\nsecret_key = "{c["secret_key"]}"\n'
            for t in TENANTS:
                text += f"""
[[tenants]]
name = "{t}"
shim_secret_file = "{self.work}/{t}.shim-secret"
[[tenants.namespaces]]
name = "data"
endpoints = [{endpoints}]
bucket = "data"
credentials = "{t}"
"""
            (nd / "agent.toml").write_text(text)
            callers = "".join(f'[[callers]]\nuid = {uid}\ntenant = "{t}"\n' for t, (uid, _) in TENANTS.items())
            secrets = "".join(f'{t} = "{self.work}/{t}.shim-secret"\n' for t in TENANTS)
            (nd / "shim.toml").write_text(
                f'socket = "{nd}/shim.sock"\nsocket_mode = 0o666\nshim_id = "node{k}"\n'
                f'metrics_listen = "{addr_of(k)}:{SHIM_METRICS}"\n'
                f'[agent]\ngrpc = "unix:{nd}/agent.sock"\nmemory_socket = "{nd}/mem.sock"\n'
                f"{callers}[tenant_secrets]\n{secrets}"
            )

    def start_nodes(self, timeout=60):
        for k in range(1, NODES + 1):
            nd = self.work / f"node{k}"
            self.daemons[f"agent{k}"] = lab.Daemon(f"agent{k}", ns_of(k),
                                                   [BIN / "sluice-agent", "--config", nd / "agent.toml"], self.work)
        self._write_pids()
        for k in range(1, NODES + 1):
            lab.wait_for(f"agent{k}'s /ready to say both tenants' stores are ok", timeout,
                         lambda k=k: self.agent_ready(k) or self._died(f"agent{k}"))
            self._check_alive(f"agent{k}")
        for k in range(1, NODES + 1):
            nd = self.work / f"node{k}"
            self.daemons[f"shim{k}"] = lab.Daemon(f"shim{k}", ns_of(k),
                                                  [BIN / "sluice-shim", "--config", nd / "shim.toml"], self.work)
        self._write_pids()
        for k in range(1, NODES + 1):
            lab.wait_for(f"shim{k}'s /ready", timeout,
                         lambda k=k: http(f"http://{addr_of(k)}:{SHIM_METRICS}/ready")[0] == 200
                         or self._died(f"shim{k}"))
            self._check_alive(f"shim{k}")

    def agent_ready(self, k):
        status, body = http(f"http://{addr_of(k)}:{AGENT_METRICS}/ready")
        return status == 200 and all(f"{t}/data: store ok" in body for t in TENANTS)

    def agent_metrics(self, k):
        return http(f"http://{addr_of(k)}:{AGENT_METRICS}/metrics")[1]

    def _died(self, name):
        return not self.daemons[name].alive()

    def _check_alive(self, name):
        if not self.daemons[name].alive():
            raise RuntimeError(f"{name} exited:\n{self.daemons[name].tail(30)}")

    def _write_pids(self):
        (self.work / "pids").write_text("\n".join(str(d.proc.pid) for d in self.daemons.values()))

    def socket(self, k):
        return self.work / f"node{k}" / "shim.sock"

    def sample(self):
        """Each daemon's RSS and descriptors."""
        ports = [int(e.rsplit(":", 1)[1]) for e in self.ceph["endpoints"]]
        return {name: proc_sample(d.proc.pid, ports) for name, d in self.daemons.items()}

    def settled_sample(self, steady_s=3.0, limit_s=30.0):
        """A sample once every daemon's descriptors but its connections to
        the store (the agent's keep-alive pool, which closes idle ones after
        90 s) have stayed the same for `steady_s` (sessions closed, regions
        released), or after `limit_s`; with how long that took."""
        t0 = time.monotonic()
        last, since = None, time.monotonic()
        while True:
            s = self.sample()
            fds = {n: v["fds_but_store"] for n, v in s.items()}
            if fds != last:
                last, since = fds, time.monotonic()
            elif time.monotonic() - since >= steady_s:
                return s, time.monotonic() - t0
            if time.monotonic() - t0 > limit_s:
                return s, time.monotonic() - t0
            time.sleep(0.5)

    # ---- clients -----------------------------------------------------------

    def client_cmd(self, k, tenant, *args):
        uid = TENANTS[tenant][0]
        cmd = ["ip", "netns", "exec", ns_of(k)]
        if uid != 0:
            cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        return cmd + [sys.executable, str(HERE / "load.py"), "--socket", str(self.socket(k)), "--seed", self.seed,
                      *map(str, args)]

    def write_dataset(self):
        for tenant in TENANTS:
            out = subprocess.run(self.client_cmd(1, tenant, "--write-dataset"), capture_output=True, text=True,
                                 timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"writing {tenant}'s dataset failed:\n{out.stderr[-3000:]}")

    def run_clients(self, duration, events=()):
        """CLIENTS_PER_NODE clients on every node (half alpha, half beta),
        for `duration` seconds from a common start; `events`: (seconds after
        the start, name, callable) run meanwhile. Returns each process's
        report, the start time and what the events did (name -> seconds
        after the start it was done, name_took_s -> how long it took,
        name_failed -> why it failed)."""
        per = CLIENTS_PER_NODE // len(TENANTS)
        start_at = time.time() + 3.0  # every process imported and connected by then
        procs = []
        for k in range(1, NODES + 1):
            for tenant in TENANTS:
                cmd = self.client_cmd(k, tenant, "--node", k, "--tenant", tenant, "--clients", per,
                                      "--start-at", f"{start_at:.3f}", "--duration", duration)
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        done = {}
        for at, name, action in sorted(events, key=lambda e: e[0]):
            time.sleep(max(0.0, start_at + at - time.time()))
            began = time.time()
            try:
                action()
                done[name] = time.time() - start_at
                done[f"{name}_took_s"] = time.time() - began
            except Exception as e:  # noqa: BLE001 -- the clients' reports still count
                done[f"{name}_failed"] = f"{began - start_at:.1f} s after the start: {e}"
        reports = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=duration + 300)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            try:
                reports.append(json.loads(out.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                reports.append({"fatal": f"exit {p.returncode}: {err[-3000:]}"})
        return reports, start_at, done

    def drained_sample(self, limit_s):
        """A sample once every agent's pool holds no more connections to the
        store than its readiness probes keep busy (one per namespace and
        endpoint, every 15 s; idle ones close after 90 s), or after
        `limit_s`; with how long that took."""
        t0 = time.monotonic()
        while True:
            s = self.sample()
            if all(sum(v["store_connections"].values()) <= self.probe_connections() for v in s.values()) \
                    or time.monotonic() - t0 > limit_s:
                return s, time.monotonic() - t0
            time.sleep(1)

    def probe_connections(self):
        """Connections an idle agent keeps to the store: its readiness
        probes', one per namespace and endpoint."""
        return len(TENANTS) * len(self.ceph["endpoints"])

    def uploads_left(self):
        """Multipart uploads in progress in each tenant's bucket (boto3)."""
        import boto3
        from botocore.config import Config

        out = {}
        for tenant, c in self.creds.items():
            s3 = boto3.client("s3", endpoint_url=self.ceph["endpoints"][1], region_name="us-east-1",
                              aws_access_key_id=c["access_key"], aws_secret_access_key=c["secret_key"],
                              config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}))
            out[tenant] = len(s3.list_multipart_uploads(Bucket="data").get("Uploads", []))
        return out

    # ---- diagnostics and teardown --------------------------------------------

    def diagnostics(self):
        parts = [f"---- last lines of {n}.log ----\n{d.tail(15)}" for n, d in self.daemons.items()]
        if self.ceph:
            parts.append(self.ceph_logs())
        return "\n".join(parts)

    def teardown(self, keep=False):
        for d in self.daemons.values():
            d.stop(timeout=5)
        if self.ceph or (self.work / "ceph").is_dir():
            # --remove takes the OSD's block file too (it may be in /dev/shm).
            lab.run(str(CEPH), "down", "--dir", str(self.work / "ceph"), *(() if keep else ("--remove",)),
                    check=False)
        for k in range(1, NODES + 1):
            lab.run("ip", "netns", "del", ns_of(k), check=False)
            lab.run("ip", "link", "del", f"slsoakv{k}", check=False)
        lab.run("ip", "link", "del", BRIDGE, check=False)
        if keep:
            print(f"soak: kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


# ---- the numbers ----------------------------------------------------------------

def jain(xs):
    """Jain's fairness index: 1 when all are equal, 1/n when one has all."""
    xs = list(xs)
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq else 0.0


def spread(values):
    """min/max ratio and Jain's index of a {name: value} dict."""
    v = list(values.values())
    return {"min_over_max": (min(v) / max(v)) if v and max(v) else 0.0, "jain": jain(v)}


def summarize(reports, duration, events):
    """Throughput (aggregate, per tenant, per node, per client), fairness,
    errors and wrong bytes, and throughput per phase (before the gateway
    was killed, while it was down, after its restart), from the client
    processes' reports."""
    fatal = [r["fatal"] for r in reports if "fatal" in r]
    elapsed = max([r.get("elapsed_s", 0) for r in reports] + [duration])
    tenants, nodes, node_tenant, clients = {}, {}, {}, {}
    ops = {}
    errors = wrong = wrong_bytes = 0
    messages = []
    timeline = {}
    for r in reports:
        if "fatal" in r:
            continue
        for j, c in enumerate(r["clients"]):
            b = sum(o["bytes"] for o in c["ops"].values())
            name = f"n{r['node']}-{r['tenant']}-{j}"
            clients[name] = b / elapsed
            tenants[r["tenant"]] = tenants.get(r["tenant"], 0) + b
            nodes[f"node{r['node']}"] = nodes.get(f"node{r['node']}", 0) + b
            nt = f"node{r['node']}/{r['tenant']}"
            node_tenant[nt] = node_tenant.get(nt, 0) + b
            for kind, o in c["ops"].items():
                t = ops.setdefault(kind, {"calls": 0, "objects": 0, "bytes": 0, "max_s": 0.0, "_sum_s": 0.0})
                t["calls"] += o["calls"]
                t["objects"] += o["objects"]
                t["bytes"] += o["bytes"]
                t["max_s"] = max(t["max_s"], o["max_s"])
                t["_sum_s"] += o["mean_s"] * o["calls"]
            errors += c["errors"]
            wrong += c["wrong"]
            wrong_bytes += c["wrong_bytes"]
            messages += [f"{name}: {m}" for m in c["messages"]]
            for sec, (nb, no) in c["per_second"].items():
                t = timeline.setdefault(int(sec), [0, 0])
                t[0] += nb
                t[1] += no
    for t in ops.values():
        t["mean_s"] = t.pop("_sum_s") / t["calls"] if t["calls"] else 0.0
    total_bytes = sum(o["bytes"] for o in ops.values())
    total_objects = sum(o["objects"] for o in ops.values())
    mib = 1 << 20

    def per_s(d):
        return {k: v / elapsed / mib for k, v in sorted(d.items())}

    phases = {}
    kill, restart = events.get("rgw1_killed"), events.get("rgw1_restarted")
    if kill is not None and restart is not None:
        for name, (a, b) in {"before_kill": (0, kill), "gateway_down": (kill, restart),
                             "after_restart": (restart, elapsed)}.items():
            secs = [s for s in timeline if a <= s < int(b)]
            span = max(int(b) - int(a), 1)
            phases[name] = {"from_s": round(a, 1), "to_s": round(b, 1),
                            "MiB_s": sum(timeline[s][0] for s in secs) / span / mib,
                            "objects_s": sum(timeline[s][1] for s in secs) / span}
    return {
        "elapsed_s": elapsed,
        "clients": len(clients),
        "client_processes_failed": fatal,
        "throughput": {"MiB_s": total_bytes / elapsed / mib, "objects_s": total_objects / elapsed,
                       "bytes": total_bytes, "objects": total_objects},
        "ops": ops,
        "per_tenant_MiB_s": per_s(tenants),
        "per_node_MiB_s": per_s(nodes),
        "per_node_tenant_MiB_s": per_s(node_tenant),
        "fairness": {"tenants": spread(tenants), "nodes": spread(nodes), "node_tenants": spread(node_tenant),
                     "clients": spread(clients)},
        "phases": phases,
        "errors": errors,
        "wrong": wrong,
        "wrong_bytes": wrong_bytes,
        "messages": messages[:40],
        "timeline_MiB_s": [round(timeline.get(s, [0, 0])[0] / mib, 1) for s in range(int(elapsed) + 1)],
    }


def human(summary):
    """The soak's numbers as a few lines of text."""
    s = summary
    load = s.get("load", {})
    lines = [f"soak: {s.get('nodes')} nodes x {s.get('clients_per_node')} clients, 2 tenants, "
             f"{s.get('duration_s')} s ({s['machine']['cpus']} CPUs, {s['machine']['build']} binaries; "
             f"Ceph up in {s.get('ceph_up_s', 0):.1f} s, OSD block file {s.get('osd_block_file', '?')})"]
    if load:
        t = load["throughput"]
        lines.append(f"soak: throughput {t['MiB_s']:.1f} MiB/s, {t['objects_s']:.1f} objects/s "
                     f"({t['bytes'] / (1 << 30):.2f} GiB, {t['objects']} objects in {load['elapsed_s']:.1f} s)")
        lines.append("soak: per tenant " + ", ".join(f"{k} {v:.1f}" for k, v in load["per_tenant_MiB_s"].items())
                     + " MiB/s; per node " + ", ".join(f"{k} {v:.1f}" for k, v in load["per_node_MiB_s"].items()))
        f = load["fairness"]
        lines.append("soak: fairness (min/max, Jain) " + "; ".join(
            f"{k} {v['min_over_max']:.2f}, {v['jain']:.3f}" for k, v in f.items()))
        if load["phases"]:
            lines.append("soak: MiB/s " + "; ".join(
                f"{k} [{v['from_s']}-{v['to_s']} s] {v['MiB_s']:.1f}" for k, v in load["phases"].items()))
        lines.append("soak: ops " + "; ".join(
            f"{k} {o['objects']} (mean {o['mean_s']:.2f} s, max {o['max_s']:.2f} s)" for k, o in load["ops"].items()))
        lines.append(f"soak: errors {load['errors']}, wrong reads {load['wrong']} ({load['wrong_bytes']} bytes), "
                     f"client processes failed {len(load['client_processes_failed'])}")
        for m in load["messages"][:10]:
            lines.append(f"soak:   {m}")
    if "store" in s:
        st = s["store"]
        lines.append(f"soak: gateway 1 killed at {st.get('killed_at_s') or 0:.1f} s, serving again at "
                     f"{st.get('restarted_at_s') or 0:.1f} s (its start took {st.get('restart_took_s') or 0:.1f} s)"
                     f"{' FAILED: ' + str(st['events_failed']) if st.get('events_failed') else ''}; "
                     f"ejections {st.get('ejections')}, failbacks "
                     f"{st.get('failbacks')}; uploads left {st.get('uploads_left')} "
                     f"(after {st.get('uploads_wait_s', 0):.1f} s)")
        used = st.get("osd_used_bytes") or {}
        if used.get("start") is not None and used.get("end") is not None:
            lines.append(f"soak: OSD used {used['start'] / (1 << 30):.2f} -> {used['end'] / (1 << 30):.2f} GiB, "
                         f"its block file {(st.get('osd_block_file_bytes') or 0) / (1 << 30):.2f} GiB on disk")
    if "daemons" in s:
        lines.append("soak: daemon   RSS MiB start -> end    fds but the store's start -> end"
                     "   store connections start -> end" + ("   fds once drained" if any(
                         "drained" in d for d in s["daemons"].values()) else ""))
        for n, d in s["daemons"].items():
            a, b = d["start"], d["end"]
            line = (f"soak: {n:8s} {a['rss_kib'] / 1024:8.1f} -> {b['rss_kib'] / 1024:6.1f}"
                    f"   {a['fds_but_store']:14d} -> {b['fds_but_store']:<5d}"
                    f"   {sum(a['store_connections'].values()):18d} -> {sum(b['store_connections'].values()):<5d}")
            if "drained" in d:
                line += f"   {d['drained']['fds']}"
            lines.append(line)
    return "\n".join(lines)
