"""A shim that vanishes without closing its connections (its host crashed,
its link was cut): nothing it sends reaches the agent, not even a FIN. Its
framed GET connections have no HTTP/2 pings, so the agent must notice by
TCP keepalive and its user timeout (`TCP_PEER_GONE`, 30 s) and give them
up; a dead peer may not hold the agent's connections for ever. Once the
link is back, the shim is served again."""

import os
import subprocess
import time

import lab

GAUGE = "sluice_agent_framed_get_connections"


def framed_open(stack):
    return stack.metric(GAUGE)


def test_a_vanished_shims_framed_connections_are_given_up_and_it_is_served_again(stack):
    obj = os.urandom(200_000)
    path = stack.work / "vanish"
    path.write_bytes(obj)
    assert stack.cli("sla", "shima", "put", path, "data/lane/vanish").returncode == 0
    got = stack.cli("sla", "shima", "get", "data/lane/vanish", stack.work / "vanish.back")
    assert got.returncode == 0, got.stderr
    # A's single GETs went framed over its listener's TLS: the connections
    # stay open for its next GETs. B's shims never GET, so every one is A's.
    opened = lab.wait_for("A's framed GET connections", 10, lambda: framed_open(stack))
    # A vanishes: its function's link goes down, so the agent's packets
    # to A (keepalive probes included) are dropped unanswered at the switch.
    lab.run("ip", "-n", "sla", "link", "set", "eth0", "down")
    cut = time.monotonic()
    try:
        lab.wait_for(f"the agent to give up A's {opened:.0f} framed connection(s)", 60,
                     lambda: framed_open(stack) == 0, every=0.5)
        took = time.monotonic() - cut
        # Not closed by anything A sent (nothing of A's can arrive): the
        # keepalive's idle time must have passed first.
        assert took >= 5, f"given up {took:.1f} s after A vanished: not by keepalive"
        assert took <= 45, f"given up only {took:.1f} s after A vanished (TCP_PEER_GONE is 30 s)"
    finally:
        lab.run("ip", "-n", "sla", "link", "set", "eth0", "up")
    assert stack.daemons["agent"].alive(), stack.daemons["agent"].tail()
    # Back: A's shim reconnects on its next request, reads byte-exact, and
    # its single GETs go framed again (not only over the gRPC link).
    back = stack.work / "vanish.back2"
    lab.wait_for("A to be served again", 60, lambda: served(stack, back), every=1)
    assert back.read_bytes() == obj
    lab.wait_for("A's framed GET connections again", 10, lambda: framed_open(stack))


def served(stack, back):
    try:
        return stack.cli("sla", "shima", "get", "data/lane/vanish", back, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False
