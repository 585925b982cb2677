"""Fixtures of the soak lane (soak.py has the topology).

`soak`: the Ceph cluster, the four nodes and their daemons, the tenants'
datasets. `result`: the run itself, once for the whole session: a warm-up,
the daemons' RSS and descriptors, SLUICE_SOAK_DURATION seconds of 32
clients with radosgw 1 SIGKILLed at 30 % and started again at 60 %, the
samples again once the clients are gone (and, with SLUICE_SOAK_DRAIN, once
the agents' idle store connections have closed), the uploads left in the
store, the agents' endpoint metrics. The tests judge what it measured; the JSON
summary goes to SLUICE_SOAK_JSON and the human one to the end of the run.
"""

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import soak as soaklib  # noqa: E402

_SOAK = None
_SUMMARY = {}


def duration():
    return float(os.environ.get("SLUICE_SOAK_DURATION", "60"))


def warmup():
    return float(os.environ.get("SLUICE_SOAK_WARMUP", "10"))


def drain():
    return float(os.environ.get("SLUICE_SOAK_DRAIN", "0"))


@pytest.fixture(scope="session")
def soak():
    global _SOAK
    if os.geteuid() != 0:
        pytest.fail("the soak lane needs root (network namespaces, a second uid for tenant beta)")
    for b in ("sluice-agent", "sluice-shim"):
        if not (soaklib.BIN / b).exists():
            pytest.fail(f"{soaklib.BIN / b} is missing (cargo build --workspace --bins, or SLUICE_BIN_DIR)")
    for tenant, (uid, _) in soaklib.TENANTS.items():
        if uid != 0:
            out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable,
                                  "-c", "import sluice"], capture_output=True, text=True)
            if out.returncode != 0:
                pytest.fail(f"{tenant}'s clients run as uid {uid}, which cannot run {sys.executable} with the "
                            f"sluice client: {out.stderr[-500:]}")
    t0 = time.monotonic()
    _SOAK = soaklib.Soak()
    try:
        _SOAK.network()
        _SOAK.start_ceph()
        _SOAK.write_configs()
        _SOAK.start_nodes()
        _SOAK.write_dataset()
        _SUMMARY["setup_s"] = time.monotonic() - t0
        _SUMMARY["ceph_up_s"] = _SOAK.ceph["up_s"]
        _SUMMARY["osd_block_file"] = _SOAK.ceph["block_file"]
        yield _SOAK
    finally:
        _SOAK.teardown(keep=os.environ.get("SLUICE_SOAK_KEEP") == "1")


def _endpoint_metrics(s):
    """Per agent: ejections, failbacks, failures by kind, whether each
    gateway is up, multipart aborts."""
    out = {}
    for k in range(1, soaklib.NODES + 1):
        text = s.agent_metrics(k)
        m = soaklib.metric_sum
        out[f"agent{k}"] = {
            "ejections": m(text, "sluice_agent_store_endpoint_ejections_total"),
            "failbacks": m(text, "sluice_agent_store_endpoint_failbacks_total"),
            "failures": {kind: m(text, "sluice_agent_store_endpoint_failures_total", f'kind="{kind}"')
                         for kind in ("refused", "deadline", "broken", "5xx")},
            "up": {e: m(text, "sluice_agent_store_endpoint_up", f'"{e}"') for e in s.ceph["endpoints"]},
            "multipart_aborts": m(text, "sluice_agent_multipart_aborts_total"),
        }
    return out


@pytest.fixture(scope="session")
def result(soak):
    d = duration()
    summary = _SUMMARY
    summary.update({
        "benchmark": "soak",
        "command": os.environ.get("SLUICE_SOAK_COMMAND", "pytest tests/soak"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": soaklib.machine(),
        "nodes": soaklib.NODES,
        "clients_per_node": soaklib.CLIENTS_PER_NODE,
        "tenants": {t: {"uid": uid} for t, (uid, _) in soaklib.TENANTS.items()},
        "duration_s": d,
        "warmup_s": warmup(),
        "dataset_per_tenant_bytes": sum(sz for _, sz in soaklib.load.DATASET),
        "write_sizes": soaklib.load.WRITE_SIZES,
    })
    # Warm-up: the same load, briefly, so lazily made things (connection
    # pools, threads, allocator arenas) exist before the first sample.
    if warmup() > 0:
        reports, _, _ = soak.run_clients(warmup())
        w = soaklib.summarize(reports, warmup(), {})
        summary["warmup"] = {k: w[k] for k in ("throughput", "errors", "wrong", "messages")}
    start, settle_start = soak.settled_sample()
    used_start = soak.store_used()
    ejections_before = _endpoint_metrics(soak)
    events = [(0.3 * d, "rgw1_killed", lambda: soak.rgw("kill-rgw", 1)),
              (0.6 * d, "rgw1_restarted", lambda: soak.rgw("start-rgw", 1))]
    reports, _, done = soak.run_clients(d, events)
    summary["load"] = soaklib.summarize(reports, d, done)
    end, settle_end = soak.settled_sample()
    summary["daemons"] = {n: {"start": start[n], "end": end[n]} for n in start}
    summary["settle_s"] = {"start": settle_start, "end": settle_end}
    if drain() > 0:
        # By hand: once the pools' idle connections have closed, every
        # descriptor counts.
        summary["probe_connections"] = soak.probe_connections()
        drained, took = soak.drained_sample(drain())
        for n in start:
            summary["daemons"][n]["drained"] = drained[n]
        summary["settle_s"]["drained"] = took
    # The agents abort what they gave up on at once and sweep every 10 s.
    t0 = time.monotonic()
    while True:
        left = soak.uploads_left()
        if sum(left.values()) == 0 or time.monotonic() - t0 > 40:
            break
        time.sleep(1)
    metrics = _endpoint_metrics(soak)
    summary["store"] = {
        "killed_at_s": done.get("rgw1_killed"),
        "restarted_at_s": done.get("rgw1_restarted"),
        "restart_took_s": done.get("rgw1_restarted_took_s"),
        "events_failed": {k: v for k, v in done.items() if k.endswith("_failed")},
        "ejections": sum(a["ejections"] - ejections_before[k]["ejections"] for k, a in metrics.items()),
        "failbacks": sum(a["failbacks"] - ejections_before[k]["failbacks"] for k, a in metrics.items()),
        "agents": metrics,
        "uploads_left": left,
        "osd_used_bytes": {"start": used_start, "end": soak.store_used()},
        "osd_block_file_bytes": soak.block_file_bytes(),
        "uploads_wait_s": time.monotonic() - t0,
    }
    summary["alive"] = {n: dmn.alive() for n, dmn in soak.daemons.items()}
    out = Path(os.environ.get("SLUICE_SOAK_JSON", soaklib.REPO / "target" / "soak.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    summary["json"] = str(out)
    return summary


def pytest_terminal_summary(terminalreporter):
    if "machine" in _SUMMARY:
        terminalreporter.write_sep("-", "soak summary")
        terminalreporter.write_line(soaklib.human(_SUMMARY))
        if "json" in _SUMMARY:
            terminalreporter.write_line(f"soak: JSON summary in {_SUMMARY['json']}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _SOAK is not None:
        rep.sections.append(("daemons and gateways", _SOAK.diagnostics()))
