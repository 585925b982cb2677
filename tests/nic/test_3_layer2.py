"""Identity at layer 2: B's function, as an attacker, sends frames the rules
must not let through, and a sniffer on every other port counts what arrives.
Every probe frame carries a marker, so only probe frames are counted."""

import os
import time

import lab
import netns

ZERO = "00:00:00:00:00:00"


def arp_request(src_mac, src_ip, marker, dst=netns.BROADCAST, sha=None, tags=()):
    """"Who has the agent's address?" as B may send it, but from `src_mac`."""
    return netns.ether(dst, src_mac, 0x0806, netns.arp(1, sha or src_mac, src_ip, ZERO, lab.AG, marker), tags)


def syn_to_listener(src_mac, src_ip, marker, dst=None, tags=()):
    """A SYN to B's own listener (what B may send), from `src_mac`."""
    return netns.ether(dst or lab.MAC["agent"], src_mac, 0x0800,
                       netns.tcp_syn(src_ip, lab.AG, 40000, lab.PORT["B"], marker), tags)


def arrived(sniffers, marker, hosts=("A", "agent", "storage")):
    netns.settle()
    return {h: sniffers[h].count(marker) for h in hosts if sniffers[h].count(marker)}


def test_spoofed_ethernet_sources_go_nowhere(stack, sniffers):
    raw = netns.RawPort("slb")
    for who in ("A", "agent", "storage"):
        m = f"SLUICE-SPOOF-{who}".encode()
        mac = lab.MAC[who]
        # Claiming the MAC with B's own address, and with the owner's too.
        for ip in (lab.B, lab.HOSTS[who][2]):
            raw.send(arp_request(mac, ip, m), count=3)
            raw.send(syn_to_listener(mac, ip, m), count=3)
        # B's own MAC in the Ethernet header, another's in the ARP body.
        raw.send(arp_request(lab.MAC["B"], lab.B, m, sha=mac), count=3)
        assert arrived(sniffers, m) == {}, f"frames with {who}'s MAC as source got through"
    raw.close()


def test_a_poisoning_attempt_diverts_nothing(stack, sniffers):
    """After B claimed everyone's MAC, A's traffic (its shim to the agent,
    the agent to storage) still reaches its owners, and none reaches B."""
    raw = netns.RawPort("slb")
    for who in ("A", "agent", "storage"):
        raw.send(arp_request(lab.MAC[who], lab.HOSTS[who][2], b"SLUICE-POISON"), count=20)
        raw.send(syn_to_listener(lab.MAC[who], lab.HOSTS[who][2], b"SLUICE-POISON"), count=20)
    raw.close()
    netns.settle()
    sniffers["B"].clear()
    obj = stack.work / "poison-obj"
    obj.write_bytes(os.urandom(1_000_000))
    assert stack.cli("sla", "shima", "put", obj, "data/lane/poison").returncode == 0
    got = stack.cli("sla", "shima", "get", "data/lane/poison", stack.work / "poison-back")
    assert got.returncode == 0 and (stack.work / "poison-back").read_bytes() == obj.read_bytes()
    netns.settle()
    b_mac = netns.mac_bytes(lab.MAC["B"])
    b_ip = netns.ip_bytes(lab.B)

    def not_for_b(f):
        if f[:6] not in (b_mac, b"\xff" * 6):
            return True
        if f[12:14] == b"\x08\x00":
            return f[30:34] != b_ip  # IPv4 destination
        if f[12:14] == b"\x08\x06":
            return f[38:42] != b_ip  # ARP target address
        return True

    stray = sniffers["B"].matching(not_for_b)
    assert stray == [], f"{len(stray)} frames not for B arrived at B's function, e.g. {stray[0][:64].hex()}"


def test_frames_to_other_macs_or_broadcast_reach_only_the_agent(stack, sniffers):
    raw = netns.RawPort("slb")
    for i, dst in enumerate((lab.MAC["A"], lab.MAC["storage"], netns.BROADCAST)):
        m = f"SLUICE-L2DST-{i}".encode()
        raw.send(arp_request(lab.MAC["B"], lab.B, m, dst=dst), count=3)
        raw.send(syn_to_listener(lab.MAC["B"], lab.B, m, dst=dst), count=3)
        assert arrived(sniffers, m, hosts=("A", "storage")) == {}, f"frames to {dst} reached A or storage"
        # TCP must be addressed to the agent; only the ARP request (which is
        # broadcast by nature) reaches the agent's port, and only there.
        assert sniffers["agent"].count(m) == 3, f"the agent got {sniffers['agent'].count(m)} of B's 3 ARP requests"
    raw.close()


def test_vlan_tagged_and_double_tagged_frames_are_dropped(stack, sniffers):
    raw = netns.RawPort("slb")
    for name, tags in [
        ("vid1", ((0x8100, 1),)),
        ("vid100", ((0x8100, 100),)),
        ("priority-tag", ((0x8100, 5 << 13),)),
        ("qinq", ((0x88A8, 10), (0x8100, 100))),
        ("double-8100", ((0x8100, 1), (0x8100, 2))),
    ]:
        m = f"SLUICE-VLAN-{name}".encode()
        raw.send(arp_request(lab.MAC["B"], lab.B, m, tags=tags), count=3)
        raw.send(syn_to_listener(lab.MAC["B"], lab.B, m, tags=tags), count=3)
        assert arrived(sniffers, m) == {}, f"{name} frames from B got through"
    raw.close()


def test_an_arp_flood_is_held_to_the_tenants_meter(stack, sniffers):
    """B floods the ARP it is allowed to send; what reaches the agent's port
    is held to B's meter (8000 kbit/s), and nothing reaches A or storage."""
    m = b"SLUICE-ARP-FLOOD"
    frame = arp_request(lab.MAC["B"], lab.B, m)
    raw = netns.RawPort("slb")
    sent = 0
    secs = 2.0
    t0 = time.monotonic()
    while time.monotonic() - t0 < secs:
        raw.send(frame, count=100)
        sent += 100
    elapsed = time.monotonic() - t0
    raw.close()
    netns.settle(0.5)
    offered_kbps = sent * len(frame) * 8 / 1000 / elapsed
    got = sniffers["agent"].count(m)
    delivered_kbps = got * len(frame) * 8 / 1000 / elapsed
    # The meter's burst allowance (half a second of its rate) comes on top.
    allowed_kbps = lab.METER_KBPS["B"] * 1.2 + lab.METER_KBPS["B"] * 0.5 / elapsed
    print(f"nic-lane: ARP flood offered {offered_kbps:.0f} kbit/s, delivered {delivered_kbps:.0f} kbit/s "
          f"(meter {lab.METER_KBPS['B']})")
    assert offered_kbps > 3 * lab.METER_KBPS["B"], f"the flood was too slow to test the meter ({offered_kbps:.0f})"
    assert delivered_kbps <= allowed_kbps, f"{delivered_kbps:.0f} kbit/s of ARP passed B's meter"
    assert got > 0, "none of B's ARP arrived: the meter, not a drop rule, must hold it"
    assert arrived(sniffers, m, hosts=("A", "storage")) == {}
    # B's own session still works once the flood stops.
    r = stack.cli("slb", "shimb", "whoami")
    assert r.returncode == 0, r.stderr
