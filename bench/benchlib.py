"""What the benchmark scripts share that is not a benchmark: loading a
sibling benchmark's module by path (bench/ is scripts, not a package)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Sequence, Set

#: The deployment's roles for a core split: the GPU node (readers, shim),
#: the BlueField's Arm cores (agent), storage (gateway).
ROLES = ("host", "dpu", "storage")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(name: str, path: str) -> Any:
    """The module at ``path`` as ``name`` (loaded once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def parse_cpus(text: str) -> List[int]:
    out: List[int] = []
    for part in text.replace("+", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def parse_split(spec: str, roles_needed: Sequence[str] = ROLES) -> Dict[str, List[int]]:
    """``host=0-3,dpu=4-9,storage=10-15`` (a role's list may go on after a
    comma: ``host=0-3,8,dpu=...``) -> role -> CPUs; checked against the CPUs
    this process may use, and for overlaps."""
    if not spec:
        return {}
    roles: Dict[str, str] = {}
    last = ""
    for item in spec.split(","):
        item = item.strip()
        if "=" in item:
            last, _, cpus = item.partition("=")
            last = last.strip()
            if last not in ROLES:
                raise SystemExit(f"--split: unknown role {last!r} (roles: {', '.join(ROLES)})")
            roles[last] = cpus
        elif item and last:
            roles[last] += "," + item
        elif item:
            raise SystemExit(f"--split: {item!r} names no role (expected role=cpus)")
    try:
        split = {r: parse_cpus(c) for r, c in roles.items()}
    except ValueError as e:
        raise SystemExit(f"--split {spec!r}: {e}") from None
    missing = [r for r in roles_needed if not split.get(r)]
    if missing:
        raise SystemExit(f"--split needs CPUs for every role; none for {', '.join(missing)}")
    have = os.sched_getaffinity(0)
    for r, cpus in split.items():
        absent = [c for c in cpus if c not in have]
        if absent:
            raise SystemExit(
                f"--split: CPUs {absent} ({r}) are not available here (this process may use "
                f"{cpulist(sorted(have))}; {os.cpu_count()} CPUs). Leave --split out on small machines."
            )
    seen: Set[int] = set()
    for r in ROLES:
        if seen & set(split[r]):
            log(f"warning: --split: {r} shares CPUs {sorted(seen & set(split[r]))} with another role "
                "(fine for trying the option; not the deployment's picture)")  # fmt: skip
        seen |= set(split[r])
    if not shutil.which("taskset"):
        raise SystemExit("--split needs taskset (util-linux)")
    return split


def cpulist(cpus: List[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def pin(pid: int, cpus: List[int]) -> None:
    """Every thread of ``pid`` (and those it starts later) onto ``cpus``."""
    out = subprocess.run(["taskset", "-apc", cpulist(cpus), str(pid)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"taskset -apc {cpulist(cpus)} {pid} failed: {out.stderr.strip()}")


def affinity(pid: int) -> List[str]:
    """The distinct CPU lists of ``pid``'s threads (Cpus_allowed_list)."""
    lists: Set[str] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        lists.add(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return sorted(lists)
