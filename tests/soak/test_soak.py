"""The soak's checks, in order: the topology came up; every client ran;
no client saw an error or a wrong byte while radosgw 1 was SIGKILLed and
started again; the agents ejected it and failed back; tenants and nodes
got fair shares; no multipart upload is left; the daemons' descriptors
are back to the count after the warm-up and their RSS is within the
tolerance below. The numbers are in the summary at the end of the run and
in SLUICE_SOAK_JSON."""

import os

import soak as soaklib

# Fairness floors: both tenants (and all nodes) run the same load with the
# same weight, so their shares should be close; these leave room for the
# noise of 2 CPUs shared by Ceph, 8 daemons and the clients.
MIN_JAIN = 0.9
MIN_RATIO = 0.5
# RSS at the end may exceed the start by this much (allocator caches and
# arenas grown under a heavier load than the warm-up's keep pages).
RSS_PCT = float(os.environ.get("SLUICE_SOAK_RSS_PCT", "25"))
RSS_MIB = float(os.environ.get("SLUICE_SOAK_RSS_MIB", "32"))


def test_1_the_cluster_and_the_nodes_come_up(soak):
    assert len(soak.ceph["endpoints"]) == 2
    for k in range(1, soaklib.NODES + 1):
        assert soak.agent_ready(k), f"agent{k} not ready"
    assert all(d.alive() for d in soak.daemons.values())


def test_2_every_client_ran(result):
    load = result["load"]
    assert not load["client_processes_failed"], load["client_processes_failed"]
    assert load["clients"] == soaklib.NODES * soaklib.CLIENTS_PER_NODE
    for kind in ("put", "get", "get_many", "ranged_get"):
        assert load["ops"].get(kind, {}).get("objects", 0) > 0, f"no {kind} completed"


def test_3_no_client_saw_an_error(result):
    assert result["load"]["errors"] == 0, "\n".join(result["load"]["messages"])
    assert result.get("warmup", {}).get("errors", 0) == 0, "\n".join(result["warmup"]["messages"])


def test_4_no_wrong_byte(result):
    assert result["load"]["wrong"] == 0, "\n".join(result["load"]["messages"])
    assert result.get("warmup", {}).get("wrong", 0) == 0, "\n".join(result["warmup"]["messages"])


def test_5_the_killed_gateway_was_ejected_and_failed_back(result):
    store = result["store"]
    assert not store["events_failed"], store["events_failed"]
    assert store["killed_at_s"] is not None and store["restarted_at_s"] is not None
    assert store["ejections"] >= 1, store["agents"]
    assert store["failbacks"] >= 1, store["agents"]
    for name, a in store["agents"].items():
        assert all(v == 1 for v in a["up"].values()), f"{name}: an endpoint still ejected at the end: {a['up']}"


def test_6_tenants_and_nodes_get_fair_shares(result):
    f = result["load"]["fairness"]
    for what in ("tenants", "nodes"):
        assert f[what]["jain"] >= MIN_JAIN, f"{what}: {f[what]} {result['load']['per_' + what[:-1] + '_MiB_s']}"
        assert f[what]["min_over_max"] >= MIN_RATIO, f"{what}: {f[what]}"


def test_7_no_multipart_upload_is_left(result):
    assert sum(result["store"]["uploads_left"].values()) == 0, result["store"]["uploads_left"]


def test_8_every_daemon_is_still_running(result):
    assert all(result["alive"].values()), result["alive"]


# The agents' keep-alive pool to the store: at most 64 idle connections per
# endpoint (dpu-agent/src/s3/http_client.rs), closed after 90 s idle
# (reqwest's default); one pool per agent here.
POOL_IDLE_PER_ENDPOINT = 64


def test_9_descriptors_are_back_to_the_start(result):
    diff = {n: (d["start"]["fd_kinds"], d["end"]["fd_kinds"]) for n, d in result["daemons"].items()
            if d["start"]["fds_but_store"] != d["end"]["fds_but_store"]}
    assert not diff, f"descriptors but the store connections (by kind) after the warm-up and at the end: {diff}"
    for n, d in result["daemons"].items():
        conns = d["end"]["store_connections"]
        assert sum(conns.values()) <= 2 * POOL_IDLE_PER_ENDPOINT, f"{n}: connections to the store: {conns}"
        assert set(conns) <= {"established"}, f"{n}: connections to the store not closed: {conns}"
        if "drained" in d:
            # Once idle for the pool's timeout: only what the readiness
            # probes keep (one per namespace and endpoint), nothing else new.
            drained = d["drained"]
            assert drained["fds_but_store"] == d["start"]["fds_but_store"], f"{n}: once the pool is idle: {drained}"
            assert sum(drained["store_connections"].values()) <= result["probe_connections"], \
                f"{n}: connections to the store once the pool is idle: {drained['store_connections']}"


def test_10_memory_is_back_near_the_start(result):
    over = {}
    for n, d in result["daemons"].items():
        start, end = d["start"]["rss_kib"] / 1024, d["end"]["rss_kib"] / 1024
        if end > start * (1 + RSS_PCT / 100) + RSS_MIB:
            over[n] = f"{start:.1f} -> {end:.1f} MiB"
    assert not over, f"RSS grew past {RSS_PCT:.0f} % + {RSS_MIB:.0f} MiB: {over}"
