"""Fail closed before the agent first runs: a secure bridge without the
agent's flows forwards nothing, and the agent refuses a bridge that would
forward without them."""

import lab
import netns


def test_a_secure_bridge_without_the_agents_flows_forwards_nothing(bridge, sniffers):
    assert "0x51ce" not in bridge.ovs.flows(), "the agent has not run yet"
    for ns, host, port in [("sla", lab.ST, 9000), ("slb", lab.ST, 9000), ("slb", lab.A, 22), ("slag", lab.ST, 9000)]:
        assert not netns.connects(ns, host, port, timeout=0.5), f"{ns} reached {host}:{port}"
    marker = b"SLUICE-BEFORE-AGENT"
    raw = netns.RawPort("slb")
    for dst in (lab.MAC["A"], lab.MAC["storage"], lab.MAC["agent"], netns.BROADCAST):
        raw.send(netns.ether(dst, lab.MAC["B"], 0x0806,
                             netns.arp(1, lab.MAC["B"], lab.B, "00:00:00:00:00:00", lab.AG, marker)), count=5)
    raw.close()
    netns.settle()
    for host in ("A", "agent", "storage"):
        assert sniffers[host].count(marker) == 0, f"B's frames reached {host} before the agent ran"


def test_the_agent_refuses_a_bridge_that_would_forward_without_its_flows(bridge):
    ovs = bridge.ovs
    ovs.vsctl("add-br", "brfo", "--", "set", "bridge", "brfo", "datapath_type=netdev")  # fail mode unset
    try:
        cfg = bridge.work / "agent-fail-open.toml"
        cfg.write_text(bridge.agent_config(bridge="brfo", sockets="fail-open"))
        r = lab.run("ip", "netns", "exec", "slag", lab.BIN / "sluice-agent", "--config", cfg, check=False,
                    env={**ovs.env})
        assert r.returncode != 0, "the agent ran on a fail-open bridge"
        assert "ovs-vsctl set-fail-mode brfo secure" in r.stderr + r.stdout, r.stderr[-2000:]
        assert "0x51ce" not in ovs.flows_of("brfo"), "nothing was installed on it"
        # The standalone mode is refused the same way.
        ovs.vsctl("set-fail-mode", "brfo", "standalone")
        r = lab.run("ip", "netns", "exec", "slag", lab.BIN / "sluice-agent", "--config", cfg, check=False, env=ovs.env)
        assert r.returncode != 0 and "fail mode standalone" in r.stderr + r.stdout, r.stderr[-2000:]
    finally:
        ovs.vsctl("del-br", "brfo")
