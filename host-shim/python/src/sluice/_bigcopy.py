"""Copies a large result out of scratch memory into a new ``bytes``.

A ``bytes`` of 32 MiB or more is always a fresh mapping from ``malloc``
(above any mmap threshold glibc accepts), so ``bytes(mapping[a:b])`` pays a
page fault per 4 KiB of it: ~0.55 s of CPU per GiB on the 2-core machine,
ten times the copy, all of it holding the interpreter lock. Here the bytes
object is made uninitialised (``PyBytes_FromStringAndSize(NULL, n)``, the
C API's way to build one in place), its pages are asked to be huge ones
(``madvise(MADV_HUGEPAGE)``: 2 MiB per fault; what glibc's own
``glibc.malloc.hugetlb=1`` does for its mappings) and the bytes are copied
with ``memmove`` through ctypes, which releases the interpreter lock: 0.15 s
per GiB there, and other threads run meanwhile. Nobody else holds the
object until it is returned, so filling it is not a mutation anyone sees.

CPython on Linux only; elsewhere :func:`available` is False and the caller
copies as before. Where transparent huge pages are off, ``madvise`` does
nothing and only the released lock remains.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
from typing import Any, Optional

#: Smallest copy done this way (glibc's ceiling for its mmap threshold:
#: smaller results may come from the heap, already faulted in).
MIN_BYTES = 32 << 20

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14

_new_bytes: Optional[Any] = None
_address_of: Optional[Any] = None
_madvise: Optional[Any] = None


def _load() -> bool:
    global _new_bytes, _address_of, _madvise
    if platform.python_implementation() != "CPython" or not sys.platform.startswith("linux"):
        return False
    try:
        new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
        new_bytes.restype, new_bytes.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_ssize_t]
        address_of = ctypes.pythonapi.PyBytes_AsString
        address_of.restype, address_of.argtypes = ctypes.c_void_p, [ctypes.py_object]
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.restype, madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (AttributeError, OSError):
        return False
    _new_bytes, _address_of, _madvise = new_bytes, address_of, madvise
    return True


_AVAILABLE = _load()


def available() -> bool:
    """Whether :func:`copy_out` can be used here."""
    return _AVAILABLE


def copy_out(mm: mmap.mmap, offset: int, length: int) -> Optional[bytes]:
    """``bytes(mm[offset:offset + length])``, made as described above;
    None for a mapping ctypes cannot view (read-only): copy it plainly.

    While the copy runs, ``src`` holds an export of the mapping, so a
    concurrent ``mmap.close()`` (a region released meanwhile) fails with
    ``BufferError`` instead of unmapping the pages under the copy."""
    assert _new_bytes is not None and _address_of is not None and _madvise is not None
    if offset < 0 or length <= 0 or offset + length > len(mm):
        raise ValueError(f"window {offset}+{length} outside a mapping of {len(mm)} bytes")
    try:
        src = ctypes.c_char.from_buffer(mm, offset)  # the export covers the whole mapping
    except TypeError:
        return None
    try:
        out = _new_bytes(None, length)
        dst = _address_of(out)
        start = (dst + _HUGE - 1) & ~(_HUGE - 1)
        end = (dst + length) & ~(_HUGE - 1)
        if end > start:
            _madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: its failure changes nothing
        ctypes.memmove(dst, ctypes.addressof(src), length)
    finally:
        del src
    return out
