"""Shared-memory regions registered with the shim."""

from __future__ import annotations

import mmap
from typing import TYPE_CHECKING, Any, Optional

from . import _bigcopy, _malloc
from .errors import BadRequest, RegionReleased

if TYPE_CHECKING:  # pragma: no cover
    import numpy
    import torch as _torch


class Region:
    """A memfd shared with the shim (and the agent behind it), mapped here.

    GETs write object bytes straight into it; PUTs read from it. Obtain one
    with :meth:`sluice.Client.register` (or ``await AsyncClient.register``)
    and use its memory as

    * a :class:`memoryview`: :attr:`view` (also ``memoryview(region)`` on
      Python >= 3.12),
    * a numpy array: :meth:`numpy` (no copy),
    * a torch tensor: :meth:`torch` (``torch.frombuffer``, no copy; torch is
      imported only when this is called).

    A region belongs to the connection that registered it. It is released by
    :meth:`release` (or ``Client.release``), by leaving a ``with`` block, or
    when its client closes; after that its memory is unmapped here (once no
    view of it is alive any more) and using it raises
    :class:`~sluice.RegionReleased`.

    Do not read a window while a request is writing into it; the client does
    not lock region memory.
    """

    __slots__ = ("_id", "_nbytes", "_mm", "_owner", "_released", "_local", "_scratch", "__weakref__")

    def __init__(self, owner: Any, region_id: str, nbytes: int, mm: mmap.mmap, *, local: bool = False) -> None:
        self._owner = owner
        self._id = region_id
        self._nbytes = nbytes
        self._mm: Optional[mmap.mmap] = mm
        self._released = False
        self._local = local
        #: Lent by the client's scratch pool (reused by any request), so
        #: never treated as memory a caller owns (Client.region_at).
        self._scratch = False

    # ----------------------------------------------------------- identity --
    @property
    def id(self) -> str:
        """The shim's region id (valid only on the registering connection)."""
        return self._id

    @property
    def nbytes(self) -> int:
        """Length of the region in bytes."""
        return self._nbytes

    def __len__(self) -> int:
        return self._nbytes

    @property
    def released(self) -> bool:
        """True once released (explicitly or because its client closed)."""
        return self._released

    @property
    def client_created(self) -> bool:
        """True if this process created the memfd (``register(..., local=True)``
        or ``fd=``); False if the shim created it and passed it back."""
        return self._local

    def __repr__(self) -> str:
        state = "released" if self._released else "live"
        return f"<sluice.Region {self._id} {self._nbytes} bytes {state}>"

    # ------------------------------------------------------------- memory --
    def _map(self) -> mmap.mmap:
        if self._released or self._mm is None:
            raise RegionReleased(f"region {self._id} was released")
        return self._mm

    @property
    def view(self) -> memoryview:
        """A writable ``memoryview`` of the whole region (format ``'B'``)."""
        return memoryview(self._map())

    def __buffer__(self, flags: int) -> memoryview:  # PEP 688, Python >= 3.12
        return memoryview(self._map())

    def __release_buffer__(self, view: memoryview) -> None:  # PEP 688
        view.release()

    def _window(self, offset: int, length: Optional[int]) -> "tuple[int, int]":
        if offset < 0 or offset > self._nbytes:
            raise BadRequest(f"offset {offset} outside region of {self._nbytes} bytes")
        if length is None:
            length = self._nbytes - offset
        if length < 0 or offset + length > self._nbytes:
            raise BadRequest(f"window {offset}+{length} outside region of {self._nbytes} bytes")
        return offset, length

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        """Copies ``length`` bytes (default: to the end) from ``offset``.

        The first copy of 128 KiB or more keeps glibc's ``malloc`` from
        giving freed result buffers back to the kernel (see
        :mod:`sluice._malloc`; ``SLUICE_MALLOC_TUNING=0`` turns it off).
        Copies of 32 MiB or more go into huge pages where the kernel has
        them, without the interpreter lock (:mod:`sluice._bigcopy`)."""
        offset, length = self._window(offset, length)
        if length >= _malloc.WORTH_IT and _malloc._state is None:
            _malloc.keep_freed_memory()
        mm = self._map()
        if length >= _bigcopy.MIN_BYTES and _bigcopy.available():
            data = _bigcopy.copy_out(mm, offset, length)
            if data is not None:
                return data
        return bytes(mm[offset : offset + length])

    def write(self, data: Any, offset: int = 0) -> int:
        """Copies a bytes-like object into the region at ``offset``; returns its length."""
        src = memoryview(data).cast("B")
        offset, n = self._window(offset, src.nbytes)
        self._map()[offset : offset + n] = src
        return n

    def numpy(self, dtype: Any = "uint8", count: int = -1, offset: int = 0) -> "numpy.ndarray":
        """A numpy array over the region's memory (no copy; writes go to the region)."""
        import numpy as np

        return np.frombuffer(self._map(), dtype=dtype, count=count, offset=offset)

    def torch(self, dtype: Any = None, count: int = -1, offset: int = 0) -> "_torch.Tensor":
        """A torch tensor over the region's memory via ``torch.frombuffer``
        (no copy). ``dtype`` defaults to ``torch.uint8``. Imports torch lazily."""
        import torch

        return torch.frombuffer(self._map(), dtype=dtype or torch.uint8, count=count, offset=offset)

    # ------------------------------------------------------------ release --
    def release(self) -> None:
        """Releases the region (blocking clients). Idempotent.

        For regions of an :class:`~sluice.AsyncClient` use
        ``await region.arelease()`` or ``await client.release(region)``.
        """
        if self._released:
            return
        self._owner._release_region_blocking(self)

    async def arelease(self) -> None:
        """Releases the region (asyncio clients). Idempotent."""
        if self._released:
            return
        await self._owner.release(self)

    def _invalidate(self) -> None:
        """Marks the region released and unmaps it if no view is alive
        (otherwise the mapping goes away with the last view)."""
        self._released = True
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # exported views keep the pages mapped until they die

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._released and not getattr(self._owner, "closed", False):
            self.release()
        else:
            self._invalidate()

    async def __aenter__(self) -> "Region":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if not self._released and not getattr(self._owner, "closed", False):
            await self.arelease()
        else:
            self._invalidate()
