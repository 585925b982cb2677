"""Keeps glibc's ``malloc`` from handing result buffers back to the kernel.

Every ``bytes`` a read returns is a fresh ``malloc`` block. glibc adapts
its thresholds to the largest block freed so far (mmap threshold = that
size, trim threshold = twice it), so a batch of eight 1 MiB results, once
freed, is more than ``malloc`` keeps: it goes back to the kernel and the
next batch faults every page in again. On the 2-core machine that was 220
faults and ~0.35 ms of CPU per MiB, for a copy of ~0.05 ms
(docs/performance.md, "Bytes-returning reads").

The cure is the settings glibc itself reaches after one 32 MiB block is
freed: blocks up to 32 MiB from the heap (its own ceiling for the adaptive
threshold on 64-bit) and up to 64 MiB of free memory kept per arena. The
client sets them once per process, the first time it copies a result of
:data:`WORTH_IT` bytes or more, so a process that never reads large
objects as ``bytes`` is left as it was. The setting is the process's:
it stays for its life and is inherited by processes it forks (DataLoader
workers), and "per arena" can mean up to 8 arenas per core. It does nothing

* when ``SLUICE_MALLOC_TUNING`` is ``0`` (or ``false``, ``no``, ``off``);
* when ``GLIBC_TUNABLES`` already sets a ``glibc.malloc`` tunable, or a
  ``MALLOC_*`` variable is set (the process's owner has chosen);
* when the C library is not glibc (no ``mallopt``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from typing import Optional

log = logging.getLogger("sluice")

#: Smallest copy that makes the client tune ``malloc`` (glibc's own default
#: mmap threshold: smaller blocks always come from the heap).
WORTH_IT = 128 << 10
#: ``M_MMAP_THRESHOLD``: glibc's ceiling for its adaptive threshold (64-bit).
MMAP_THRESHOLD = 32 << 20
#: ``M_TRIM_THRESHOLD``: twice that, as glibc pairs them itself.
TRIM_THRESHOLD = 64 << 20

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_state: Optional[bool] = None  # None: not decided yet; then whether it was applied


def _wanted() -> Optional[str]:
    """Why the client must leave ``malloc`` alone (None: it may tune it)."""
    if os.environ.get("SLUICE_MALLOC_TUNING", "").strip().lower() in ("0", "false", "no", "off"):
        return "SLUICE_MALLOC_TUNING is off"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc tunables"
    chosen = sorted(k for k in os.environ if k.startswith("MALLOC_"))
    if chosen:  # glibc's older variables (e.g. MALLOC_TRIM_THRESHOLD_=0, as Dask advises)
        return f"{', '.join(chosen)} set"
    if platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    return None


def keep_freed_memory() -> bool:
    """Applies the settings above once per process; returns whether they
    are in force (applied by this call or an earlier one)."""
    global _state
    if _state is not None:
        return _state
    with _lock:
        if _state is not None:
            return _state
        why_not = _wanted()
        if why_not is not None:
            log.debug("sluice leaves malloc's thresholds alone: %s", why_not)
            _state = False
            return False
        try:
            mallopt = ctypes.CDLL(None).mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        except (OSError, AttributeError):
            ok = False
        log.debug(
            "sluice set malloc's mmap threshold to %d and trim threshold to %d: %s", MMAP_THRESHOLD, TRIM_THRESHOLD, ok
        )
        _state = ok
        return ok


def tuned() -> Optional[bool]:
    """Whether the settings are in force: None until the first large copy."""
    return _state
