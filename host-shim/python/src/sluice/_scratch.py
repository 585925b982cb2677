"""The client's scratch memory: regions it registers for itself
(``get_bytes``, ``put(bytes)``, ``get_many`` without ``into``, staging) and
keeps for reuse, so a loop of reads or writes pays for registration and
the first touch of each page once."""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, List, Optional

from .region import Region

#: Smallest scratch region the client registers for ``get_bytes``/``put(bytes)``.
SCRATCH_MIN = 1 << 20


def _scratch_size(n: int) -> int:
    n = max(n, SCRATCH_MIN)
    p = 1 << (n - 1).bit_length()
    return p if p - n <= n // 4 else (n + 4095) & ~4095


class _ScratchPool:
    """Regions the client registers for itself (``get_bytes``, ``put(bytes)``,
    ``get_many`` without ``into``) and reuses, up to ``budget`` bytes kept in
    total. Each is lent to one operation at a time. Thread-safe."""

    def __init__(self, budget: int) -> None:
        self._free: List[Region] = []
        self._evicted: List[Region] = []
        self._budget = max(0, budget)
        self._lock = threading.Lock()

    def take(self, n: int) -> Optional[Region]:
        """The smallest free region of at least ``n`` bytes, if any."""
        with self._lock:
            best = None
            for r in self._free:
                if r.nbytes >= n and not r.released and (best is None or r.nbytes < best.nbytes):
                    best = r
            if best is not None:
                self._free.remove(best)
            return best

    def give(self, region: Region) -> bool:
        """Keeps ``region`` for reuse; False if the caller must release it."""
        if region.released or region.nbytes > self._budget:
            return False
        with self._lock:
            over = sum(r.nbytes for r in self._free) + region.nbytes - self._budget
            if over > 0:
                # Make room by evicting smaller regions, smallest first, but
                # only if that is enough.
                smaller = sorted((r for r in self._free if r.nbytes < region.nbytes), key=lambda r: r.nbytes)
                if sum(r.nbytes for r in smaller) < over:
                    return False
                for r in smaller:
                    if over <= 0:
                        break
                    self._free.remove(r)
                    self._evicted.append(r)
                    over -= r.nbytes
            self._free.append(region)
            return True

    def pop_evicted(self) -> List[Region]:
        with self._lock:
            out, self._evicted = self._evicted, []
            return out

    def clear(self) -> List[Region]:
        with self._lock:
            out = self._free + self._evicted
            self._free, self._evicted = [], []
            return out

    def __len__(self) -> int:
        return len(self._free)



@functools.lru_cache(maxsize=64)
def _byte_array(n: int) -> Any:
    """The ctypes array type of ``n`` bytes (a type per size; cached)."""
    return ctypes.c_char * n


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()
