"""Where each daemon's CPU went, by kind of work, from a ``perf record``.

Sorts every sample of ``perf script -F pid,ip,sym,dso`` into a few kinds
(TLS, SigV4's SHA-256, the kernel's TCP/IP and Unix-socket paths, the rest
of the kernel, the rest of user space) and prints each kind's share of each
process's samples. With a sampling clock, samples are CPU time: a share
times the process's CPU per GET is that kind's CPU per GET.

    perf record -F 4000 -p AGENT,SHIM -o perf.data -- sleep 7
    perf script -i perf.data -F pid,ip,sym,dso | python3 bench/perf_shares.py PIDS

``PIDS`` is a ``sluice up`` ``pids`` file (lines ``sluice-agent 1234``):
processes not named there are left out. The kinds are matched by symbol
name, so they are approximate and the named kinds are lower bounds: code
inlined into other functions, and the copies and allocations done for a
kind (memcpy, malloc), count as "other", as does a kernel function shared
by both socket kinds.
"""

from __future__ import annotations

import collections
import re
import sys
from typing import Dict, List, Optional, Pattern, Tuple

KINDS: List[Tuple[str, Optional[Pattern[str]]]] = [
    ("TLS (rustls, AES-GCM)", re.compile(r"rustls|aes_gcm|ring::aead|gcm_|ghash|aes_hw|aesni|tokio_rustls")),
    ("SHA-256 (SigV4)", re.compile(r"sha256|hmac")),
    (
        "kernel TCP/IP",
        re.compile(
            r"^(__)?(tcp_|inet_|ip_|ipv4_|sk_stream|skb_entail|dev_hard|dev_queue|loopback|netif_|process_backlog"
            r"|net_rx|napi_|validate_xmit|nf_)"
        ),
    ),
    ("kernel Unix socket", re.compile(r"^(__)?unix_")),
    ("kernel, other", None),
    ("user space, other", None),
]

LINE = re.compile(r"^\s*(?P<pid>\d+)\s+\S+\s+(?P<sym>.*?)\s+\((?P<dso>[^()]*)\)\s*$")


def kind(sym: str, dso: str) -> str:
    for name, rx in KINDS:
        if rx is not None and rx.search(sym):
            return name
    # "[kernel.kallsyms]" and modules ("[veth]", "[virtio_net]"); "[vdso]"
    # runs in user space.
    in_kernel = dso.startswith("[") and dso != "[vdso]"
    return "kernel, other" if in_kernel else "user space, other"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    names: Dict[str, str] = {}
    with open(sys.argv[1]) as f:
        for line in f:
            if line.strip():
                name, pid = line.split()
                names[pid] = name
    counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in sys.stdin:
        m = LINE.match(line)
        if m and m["pid"] in names:
            counts[names[m["pid"]]][kind(m["sym"], m["dso"])] += 1
    for proc in sorted(counts):
        total = sum(counts[proc].values())
        print(f"{proc}: {total} samples")
        for name, _ in KINDS:
            print(f"  {name:24s} {100 * counts[proc][name] / total:5.1f}%")


if __name__ == "__main__":
    main()
