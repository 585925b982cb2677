"""Sockets inside network namespaces, Ethernet frames, and sniffers.

A socket keeps the namespace it was created in, so each is made on a
short-lived thread that first joins the namespace (setns(2) changes only
the calling thread). Everything else runs in the test process.
"""

import ctypes
import os
import socket
import struct
import subprocess
import threading
import time

CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
PACKET_OUTGOING = 4
SO_RCVBUFFORCE = 33

_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def socket_in(ns, family, kind, proto=0):
    """A socket created in network namespace `ns` (as `ip netns` names it)."""
    out = {}

    def make():
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns}")
            finally:
                os.close(fd)
            out["sock"] = socket.socket(family, kind, proto)
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


def connects(ns, host, port, timeout=1.0):
    """Whether a TCP connection from `ns` to host:port is accepted."""
    s = socket_in(ns, socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def http_get(ns, host, port, path, timeout=3.0):
    """(status, body) of a plain HTTP GET made from `ns`."""
    s = socket_in(ns, socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


def mac_bytes(mac):
    return bytes(int(x, 16) for x in mac.split(":"))


def ip_bytes(ip):
    return socket.inet_aton(ip)


BROADCAST = "ff:ff:ff:ff:ff:ff"


def ether(dst, src, ethertype, payload, tags=()):
    """An Ethernet frame; `tags`: (TPID, VID) pairs, outermost first."""
    head = mac_bytes(dst) + mac_bytes(src)
    for tpid, vid in tags:
        head += struct.pack("!HH", tpid, vid)
    frame = head + struct.pack("!H", ethertype) + payload
    return frame + bytes(max(0, 60 - len(frame)))


def arp(op, sha, spa, tha, tpa, marker=b""):
    """An ARP payload (trailing bytes carry a marker the sniffers look for)."""
    return (
        struct.pack("!HHBBH", 1, 0x0800, 6, 4, op)
        + mac_bytes(sha)
        + ip_bytes(spa)
        + mac_bytes(tha)
        + ip_bytes(tpa)
        + marker
    )


def _checksum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def tcp_syn(src, dst, sport, dport, payload=b""):
    """An IPv4 TCP SYN (with payload: the marker) with valid checksums."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0) + payload
    pseudo = ip_bytes(src) + ip_bytes(dst) + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, 6, 0, ip_bytes(src), ip_bytes(dst))
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return ip + tcp


class RawPort:
    """Sends whole Ethernet frames out of `iface` in `ns`."""

    def __init__(self, ns, iface="eth0"):
        self.sock = socket_in(ns, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((iface, 0))

    def send(self, frame, count=1):
        for _ in range(count):
            self.sock.send(frame)

    def close(self):
        self.sock.close()


def ifindex(ns, iface):
    """The interface index of `iface` in `ns`."""
    out = subprocess.run(["ip", "-n", ns, "-o", "link", "show", iface], capture_output=True, text=True, check=True)
    return int(out.stdout.split(":", 1)[0])


class Sniffer:
    """Every frame that arrives on `iface` in `ns` (promiscuous: whatever
    the switch delivers, whoever it is addressed to)."""

    def __init__(self, ns, iface="eth0"):
        self.ns = ns
        self.sock = socket_in(ns, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((iface, 0))
        mreq = struct.pack("iHH8s", ifindex(ns, iface), PACKET_MR_PROMISC, 0, b"")
        self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        # A burst (a multi-megabyte PUT) must not overflow the queue while
        # this thread is descheduled: frames missed would be frames unjudged.
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        self.sock.settimeout(0.1)
        self.frames = []
        self.bytes = 0
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop:
            try:
                data, addr = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            with self._lock:
                self.bytes += len(data)
                if len(self.frames) < 200_000:
                    self.frames.append(data)

    def clear(self):
        with self._lock:
            self.frames = []
            self.bytes = 0

    def count(self, marker):
        """Frames that carry `marker`."""
        with self._lock:
            return sum(1 for f in self.frames if marker in f)

    def matching(self, pred):
        with self._lock:
            return [f for f in self.frames if pred(f)]

    def close(self):
        self._stop = True
        self._thread.join(timeout=1)
        self.sock.close()


def settle(seconds=0.3):
    """Time for frames in flight to arrive (the userspace datapath is fast,
    but the machine may be busy)."""
    time.sleep(seconds)
