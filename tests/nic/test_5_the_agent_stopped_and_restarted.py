"""The agent stopped: its rules stay (fail closed) and meters still hold;
restarted: the same flows, none re-added, and no probe through meanwhile."""

import fcntl
import socket
import threading
import time

import lab
import netns


def sink(ns, host, port, stop):
    """A listener in `ns` that reads and discards whatever it is sent."""
    ls = netns.socket_in(ns, socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(4)
    ls.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                c, _ = ls.accept()
            except socket.timeout:
                continue
            c.settimeout(0.5)

            def drain(c=c):
                try:
                    while not stop.is_set() and c.recv(1 << 16):
                        pass
                except OSError:
                    pass
                c.close()

            threading.Thread(target=drain, daemon=True).start()
        ls.close()

    threading.Thread(target=serve, daemon=True).start()


def stream_kbps(ns, port, out, key):
    """Streams for 4 s; the delivered rate over the last 3 (the first second
    spends the meter's burst allowance). Bytes still queued in the socket
    (TIOCOUTQ) are not delivered."""
    s = netns.socket_in(ns, socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect((lab.AG, port))
    buf = b"x" * 65536

    def delivered(sent):
        return sent - int.from_bytes(fcntl.ioctl(s.fileno(), 0x5411, bytes(4)), "little")

    t0 = time.monotonic()
    sent, mark = 0, None
    while (now := time.monotonic()) - t0 < 4:
        if mark is None and now - t0 >= 1:
            mark = (now, delivered(sent))
        try:
            sent += s.send(buf)
        except socket.timeout:
            pass
    t1, d1 = time.monotonic(), delivered(sent)
    s.close()
    out[key] = (d1 - mark[1]) * 8 / 1000 / (t1 - mark[0])


def test_with_the_agent_stopped_its_rules_stay_and_meters_hold(stack):
    before = stack.ovs.owned()
    stack.stop_agent()
    after = stack.ovs.owned()
    assert set(before) == set(after) and before, f"flows went from {len(before)} to {len(after)} when the agent stopped"
    assert not netns.connects("slb", lab.ST, 9000), "B reached storage with the agent down"
    # Stand-in listeners on the agent's address (the agent is down); each
    # tenant streams to its own port; B's rate vs its 8000 kbit/s meter.
    stop = threading.Event()
    try:
        for p in lab.PORT.values():
            sink("slag", lab.AG, p, stop)
        lab.wait_for("the sinks", 10, lambda: netns.connects("sla", lab.AG, lab.PORT["A"]))
        rates = {}
        ta = threading.Thread(target=stream_kbps, args=("sla", lab.PORT["A"], rates, "A"))
        ta.start()
        stream_kbps("slb", lab.PORT["B"], rates, "B")
        ta.join()
    finally:
        stop.set()
        time.sleep(0.3)
    print(f"nic-lane: B {rates['B']:.0f} kbit/s (meter 8000), A {rates['A']:.0f} kbit/s (meter 200000)")
    assert 6400 <= rates["B"] <= 9600, f"B's bandwidth {rates['B']:.0f} kbit/s is not within 20% of 8000"
    assert rates["A"] >= 3 * rates["B"], f"A is held near B's meter: {rates['A']:.0f} kbit/s"


def test_restarting_the_agent_changes_no_flow_and_lets_no_probe_through(stack):
    assert not stack.daemons["agent"].alive(), "the previous test leaves the agent stopped"
    before = stack.ovs.owned()
    stop = threading.Event()
    counts = {"n": 0, "through": 0, "gap": 0.0}

    def probe():
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            counts["gap"], last = max(counts["gap"], now - last), now
            for host, port in ((lab.ST, 9000), (lab.AG, 7101)):
                counts["n"] += 1
                if netns.connects("slb", host, port, timeout=0.05):
                    counts["through"] += 1

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    time.sleep(0.3)
    # Start (it is down since the last test), stop, start again, all while probing.
    t_start = time.monotonic()
    stack.start_agent()
    stack.stop_agent()
    stack.start_agent()
    time.sleep(0.5)
    stop.set()
    t.join()
    after = stack.ovs.owned()
    assert set(after) == set(before), "the flows changed across a restart"
    # None was re-added: each is older than the restarts.
    youngest = min(after.values())
    assert youngest >= time.monotonic() - t_start - 0.5, f"a flow was re-added ({youngest:.1f} s old)"
    assert counts["through"] == 0 and counts["n"] >= 10 and counts["gap"] <= 1.0, counts
