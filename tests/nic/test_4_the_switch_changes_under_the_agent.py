"""Fail closed, always: the agent notices within a second or two when its
flows are missing or changed, or the switch restarts, restores them, is not
ready meanwhile and counts the event; nothing gets through in the gap."""

import os
import threading
import time

import lab
import netns

# The agent checks every 0.5 s; ovs-ofctl on a loaded CI machine is slow.
BOUND_S = 3.0


def restored(stack, expected, since):
    """Seconds from `since` until the bridge holds `expected` (cookies) again."""
    lab.wait_for("the agent's flows to be restored", 20, lambda: set(stack.ovs.owned()) == expected, every=0.05)
    return time.monotonic() - since


class Probes:
    """From B, until stopped: TCP connects to A's listener, storage and A,
    and raw frames (spoofed sources, other MACs, tags) carrying a marker;
    plus /ready polled from the agent's side."""

    def __init__(self, stack, marker):
        self.stack, self.marker = stack, marker
        self.attempts = self.through = 0
        self.ready_codes = set()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._connect, self._frames, self._ready)]
        for t in self.threads:
            t.start()

    def _connect(self):
        while not self.stop.is_set():
            for host, port in ((lab.AG, 7101), (lab.ST, 9000), (lab.A, 22)):
                self.attempts += 1
                if netns.connects("slb", host, port, timeout=0.05):
                    self.through += 1

    def _frames(self):
        raw = netns.RawPort("slb")
        arp = netns.arp(1, lab.MAC["A"], lab.A, "00:00:00:00:00:00", lab.AG, self.marker)
        frames = [
            netns.ether(netns.BROADCAST, lab.MAC["A"], 0x0806, arp),
            netns.ether(lab.MAC["storage"], lab.MAC["B"], 0x0800, netns.tcp_syn(lab.B, lab.ST, 40001, 9000, self.marker)),
            netns.ether(lab.MAC["A"], lab.MAC["B"], 0x0800, netns.tcp_syn(lab.B, lab.A, 40002, 22, self.marker)),
            netns.ether(netns.BROADCAST, lab.MAC["B"], 0x0806,
                        netns.arp(1, lab.MAC["B"], lab.B, "00:00:00:00:00:00", lab.AG, self.marker), ((0x8100, 7),)),
        ]
        while not self.stop.is_set():
            for f in frames:
                raw.send(f)
            time.sleep(0.005)
        raw.close()

    def _ready(self):
        while not self.stop.is_set():
            try:
                self.ready_codes.add(self.stack.agent_ready()[0])
            except OSError:
                self.ready_codes.add("down")
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)


def test_the_switch_restarting_under_probes_lets_nothing_through_and_the_rules_come_back(stack, sniffers):
    ovs = stack.ovs
    expected = set(ovs.owned())
    drift0 = stack.metric("sluice_agent_nic_drift_total", 'reason="flows"')
    marker = b"SLUICE-SWITCH-RESTART"
    probes = Probes(stack, marker)
    time.sleep(0.5)
    ovs.kill_vswitchd()
    time.sleep(1.0)  # down for a while: the agent must notice, not hang
    ovs.start_vswitchd()
    up = time.monotonic()
    took = restored(stack, expected, up)
    time.sleep(1.0)
    probes.finish()
    print(f"nic-lane: ovs-vswitchd restarted; the agent's {len(expected)} flows were back {took:.2f} s after it was "
          f"up; {probes.attempts} connects and raw frames from B meanwhile, /ready answers {sorted(map(str, probes.ready_codes))}")
    assert took <= BOUND_S, f"the flows came back {took:.2f} s after the switch (bound {BOUND_S} s)"
    assert probes.through == 0, f"{probes.through} of {probes.attempts} connects from B got through"
    netns.settle()
    for host in ("A", "agent", "storage"):
        assert sniffers[host].count(marker) == 0, f"{sniffers[host].count(marker)} of B's probe frames reached {host}"
    assert 503 in probes.ready_codes, "the agent did not say it was not ready while its rules were missing"
    # Ready again (a store probe that fell into the gap is retried within 15 s).
    lab.wait_for("/ready", 20, lambda: stack.agent_ready()[0] == 200, every=0.2)
    assert stack.metric("sluice_agent_nic_drift_total", 'reason="flows"') > drift0
    assert stack.metric("sluice_agent_nic_drift_total", 'reason="unreachable"') >= 1
    assert ovs.ofctl("get-frags", lab.BR).strip() == "drop", "fragment handling set again after the restart"
    # The owners' traffic flows again.
    obj = stack.work / "after-restart"
    obj.write_bytes(os.urandom(500_000))
    assert stack.cli("sla", "shima", "put", obj, "data/lane/after-restart").returncode == 0
    got = stack.cli("sla", "shima", "get", "data/lane/after-restart", stack.work / "after-restart.back")
    assert got.returncode == 0 and (stack.work / "after-restart.back").read_bytes() == obj.read_bytes()


def test_flows_deleted_or_changed_by_hand_are_restored_and_counted(stack):
    ovs = stack.ovs
    expected = set(ovs.owned())
    drift0 = stack.metric("sluice_agent_nic_drift_total", 'reason="flows"')
    t0 = time.monotonic()
    ovs.ofctl("del-flows", lab.BR)
    took = restored(stack, expected, t0)
    assert took <= BOUND_S, f"del-flows: restored after {took:.2f} s"
    # Another controller turning one of B's flows into MAC learning: same
    # cookie, other actions.
    victim = next(c for c in expected if c.startswith("0x51ce") and c[6:10] != "0000")
    ovs.ofctl("-O", "OpenFlow14", "mod-flows", lab.BR, f"cookie={victim}/-1,actions=NORMAL")
    t0 = time.monotonic()
    lab.wait_for("the changed flow to be replaced", 20,
                 lambda: "NORMAL" not in ovs.flows(f"cookie={victim}/-1"), every=0.05)
    took = time.monotonic() - t0
    assert took <= BOUND_S, f"mod-flows: replaced after {took:.2f} s"
    assert stack.metric("sluice_agent_nic_drift_total", 'reason="flows"') >= drift0 + 2
    lab.wait_for("/ready", 10, lambda: stack.agent_ready()[0] == 200)


def test_a_fail_mode_or_fragment_setting_changed_at_run_time_is_set_back(stack):
    ovs = stack.ovs
    expected = set(ovs.owned())
    # Standalone flushes the table and adds a NORMAL flow (MAC learning).
    t0 = time.monotonic()
    ovs.vsctl("set-fail-mode", lab.BR, "standalone")
    ovs.ofctl("set-frags", lab.BR, "normal")
    lab.wait_for("the fail mode to be secure again", 10,
                 lambda: ovs.vsctl("get-fail-mode", lab.BR).strip() == "secure", every=0.05)
    lab.wait_for("fragments to be dropped again", 10,
                 lambda: ovs.ofctl("get-frags", lab.BR).strip() == "drop", every=0.05)
    took = restored(stack, expected, t0)
    assert took <= BOUND_S, f"fail mode: flows back after {took:.2f} s"
    assert "NORMAL" not in ovs.flows(), "the switch's own NORMAL flow went with the fail mode"
    assert stack.metric("sluice_agent_nic_drift_total", 'reason="fail_mode"') >= 1
    assert stack.metric("sluice_agent_nic_drift_total", 'reason="fragments"') >= 1
