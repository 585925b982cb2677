"""PyTorch datasets over a prefix, read through the shim.

* :class:`ShimDataset` (map-style): ``dataset[i]`` is the i-th object under
  the prefix. A DataLoader batch is fetched with one pipelined
  :meth:`~sluice.Client.get_many` (``__getitems__``), and an optional
  ``readahead`` keeps the next objects in flight for sequential access.
* :class:`ShimIterableDataset`: streams the objects under the prefix, sharded
  across DataLoader workers (and ranks), with ``prefetch`` reads in flight
  (:meth:`~sluice.Client.iter_get`).

Both list the prefix once, when constructed, and open **one shim connection
per process** lazily on first use, so they work in a ``DataLoader`` with
``num_workers > 0`` (fork or spawn): each worker gets its own connection.

With ``device="cuda:N"`` both yield CUDA tensors (``uint8``, one per object;
``transform`` then gets the tensor): each batch is read straight into one
GPU buffer with :meth:`~sluice.Client.get_many` through pinned staging and
the copy engines (no host copy of the bytes), and the samples are views of
it. CUDA in DataLoader workers needs the ``spawn`` start method (or
``num_workers=0``), as for any CUDA use in workers.

This module imports without torch installed: the datasets are then plain
Python sequences/iterables (the same code paths, testable without torch).
With torch they subclass ``torch.utils.data.Dataset`` / ``IterableDataset``.
"""

from __future__ import annotations

import os
import random
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ._core import resolve_socket
from .client import Client, _Handle
from .errors import SluiceError
from .types import GetSpec, ItemResult

try:  # torch is optional
    import torch as _torch  # noqa: F401
    from torch.utils.data import Dataset as _MapBase
    from torch.utils.data import IterableDataset as _IterBase
    from torch.utils.data import get_worker_info as _torch_worker_info

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - exercised when torch is absent
    HAVE_TORCH = False

    class _MapBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.Dataset``."""

    class _IterBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.IterableDataset``."""

    def _torch_worker_info() -> Any:  # type: ignore[misc]
        return None


Transform = Callable[[Any], Any]


def _gpu_buffer(nbytes: int, device: Any) -> Any:
    """An uninitialised CUDA ``uint8`` tensor of ``nbytes`` on ``device``."""
    if not HAVE_TORCH:
        raise SluiceError("device= needs torch (pip install torch)")
    return _torch.empty(nbytes, dtype=_torch.uint8, device=device)


def worker_info() -> Tuple[int, int]:
    """``(worker id, number of workers)`` of the current DataLoader worker,
    ``(0, 1)`` outside one."""
    info = _torch_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


# One client per (process, socket, options). A forked child never sees its
# parent's clients (their sockets are closed in the child at fork).
_clients: Dict[Tuple[str, Tuple[Tuple[str, Any], ...]], Client] = {}
_clients_pid = os.getpid()
_clients_lock = threading.Lock()


def worker_client(socket: Optional[str] = None, **options: Any) -> Client:
    """This process's shared :class:`~sluice.Client` for ``socket``
    (created on first use; a fresh one after fork or if it disconnected)."""
    global _clients_pid
    key = (resolve_socket(socket), tuple(sorted(options.items())))
    with _clients_lock:
        if _clients_pid != os.getpid():
            _clients.clear()
            _clients_pid = os.getpid()
        c = _clients.get(key)
        if c is None or c.closed or getattr(c, "_dead", False):
            c = Client(key[0], **options)
            _clients[key] = c
        return c


def list_prefix(prefix: str, socket: Optional[str] = None, **options: Any) -> List[Tuple[str, int]]:
    """``(path, size)`` of every object under ``prefix`` (``"ns"`` or
    ``"ns/prefix"``), in key order, listed over a short-lived connection."""
    ns = prefix.split("/", 1)[0]
    with Client(socket, **options) as c:
        return [(f"{ns}/{o.key}", o.size) for o in c.list(prefix)]


class _Base:
    def __init__(
        self,
        prefix: str,
        socket: Optional[str],
        transform: Optional[Transform],
        return_path: bool,
        paths: Optional[Sequence[Union[str, Tuple[str, int]]]],
        client_options: Optional[Dict[str, Any]],
    ) -> None:
        self.prefix = prefix
        self.socket = resolve_socket(socket)
        self.transform = transform
        self.return_path = return_path
        self.client_options = dict(client_options or {})
        self.device: Any = None
        if paths is None:
            self.items: List[Tuple[str, Optional[int]]] = list(
                list_prefix(prefix, self.socket, **self.client_options)
            )
        else:
            self.items = [(p, None) if isinstance(p, str) else (p[0], p[1]) for p in paths]

    def _client(self) -> Client:
        return worker_client(self.socket, **self.client_options)

    def _sample(self, path: str, data: Any) -> Any:
        out = self.transform(data) if self.transform is not None else data
        return (path, out) if self.return_path else out

    def _sizes(self, items: Sequence[Tuple[str, Optional[int]]]) -> List[int]:
        """Object sizes (from the listing; a HEAD for paths given without)."""
        client = self._client()
        return [n if n is not None else client.head(p).size for p, n in items]

    def _to_device(self, items: Sequence[Tuple[str, Optional[int]]]) -> List[ItemResult]:
        """Reads ``items`` into one GPU buffer of the dataset's device;
        each result's ``data`` is a view of it."""
        sizes = self._sizes(items)
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += (n + 255) & ~255  # aligned starts for the samples' views
        buf = _gpu_buffer(max(total, 1), self.device)
        client = self._client()
        with client.register_gpu(buf) as region:
            results = client.get_many(
                [GetSpec(p, region, off) for (p, _), off in zip(items, offsets)]
            )
        for r, off in zip(results, offsets):
            if r.ok:
                r.data = buf[off : off + r.nbytes]
        return results

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_ahead", None)  # in-flight reads belong to this process
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)


class ShimDataset(_Base, _MapBase):
    """Map-style dataset: item ``i`` is the ``i``-th object under ``prefix``.

    Args:
        prefix: ``"namespace"`` or ``"namespace/prefix"``; listed once here.
        socket: the shim socket (default as for :class:`~sluice.Client`).
        transform: applied to each object's bytes (e.g. decode an image).
        return_path: yield ``(path, sample)`` instead of ``sample``.
        paths: use these ``"ns/key"`` paths (or ``(path, size)``) instead of
            listing.
        readahead: for sequential access, keep the next ``readahead``
            objects in flight after each ``dataset[i]`` (0: off; not with
            ``device``).
        device: ``"cuda:N"`` (or a ``torch.device``): samples are CUDA
            ``uint8`` tensors read straight into GPU memory.
        client_options: keyword arguments for each worker's
            :class:`~sluice.Client` (e.g. ``timeout``).

    Errors (missing object, access denied ...) raise the typed
    :class:`~sluice.SluiceError` from ``__getitem__``.
    """

    def __init__(
        self,
        prefix: str,
        socket: Optional[str] = None,
        *,
        transform: Optional[Transform] = None,
        return_path: bool = False,
        paths: Optional[Sequence[Union[str, Tuple[str, int]]]] = None,
        readahead: int = 0,
        client_options: Optional[Dict[str, Any]] = None,
        device: Any = None,
    ) -> None:
        _Base.__init__(self, prefix, socket, transform, return_path, paths, client_options)
        self.readahead = readahead
        self.device = device

    def __len__(self) -> int:
        return len(self.items)

    def path(self, index: int) -> str:
        return self.items[index][0]

    def _ahead_cache(self) -> "OrderedDict[int, Tuple[int, _Handle]]":
        cache = self.__dict__.get("_ahead")
        if cache is None:
            cache = self.__dict__["_ahead"] = OrderedDict()
        return cache

    def __getitem__(self, index: int) -> Any:
        n = len(self.items)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for {n} objects")
        path, size = self.items[index]
        if self.device is not None:
            [r] = self._to_device([(path, size)])
            if r.error is not None:
                raise r.error
            return self._sample(path, r.data)
        client = self._client()
        if self.readahead <= 0:
            return self._sample(path, client.get_bytes(path, size_hint=size))
        cache = self._ahead_cache()
        entry = cache.pop(index, None)
        if entry is not None and entry[0] != os.getpid():
            entry = None
        # Reads for indices we skipped past are abandoned.
        for stale in [i for i in cache if not index < i <= index + self.readahead]:
            cache.pop(stale)[1].cancel()
        for j in range(index + 1, min(n, index + 1 + self.readahead)):
            if j not in cache:
                p, s = self.items[j]
                cache[j] = (os.getpid(), _Handle(client, client._get_bytes_op(p, size_hint=s)))
        if entry is None:
            data = client.get_bytes(path, size_hint=size)
        else:
            data = entry[1].result()[0]
        client._pump()
        for _, h in cache.values():
            h.poll(pump=False)
        return self._sample(path, data)

    def __getitems__(self, indices: Sequence[int]) -> List[Any]:
        """A whole batch with one pipelined ``get_many`` (used by
        ``DataLoader`` for batched map-style datasets)."""
        items = [self.items[i] for i in indices]
        if self.device is not None:
            results = self._to_device(items)
        else:
            results = self._client().get_many([p for p, _ in items])
        out = []
        for r in results:
            if r.error is not None:
                raise r.error
            out.append(self._sample(r.path, r.data if r.data is not None else b""))
        return out


class ShimIterableDataset(_Base, _IterBase):
    """Iterable dataset streaming the objects under ``prefix``.

    Each DataLoader worker (and each rank, with ``rank``/``world_size``)
    reads a disjoint shard; within a worker up to ``prefetch`` reads are in
    flight ahead of the consumer. With ``shuffle`` the order is a
    permutation seeded by ``seed`` and the epoch (:meth:`set_epoch`), the
    same in every worker so the shards stay disjoint.

    Args:
        prefix, socket, transform, return_path, paths, client_options:
            as for :class:`ShimDataset`.
        prefetch: reads in flight per worker.
        shuffle, seed: shuffle the object order each epoch.
        rank, world_size: shard across distributed processes too.
        on_error: ``"raise"`` (default) raises the item's
            :class:`~sluice.SluiceError`; ``"skip"`` drops the item.
        device: ``"cuda:N"``: samples are CUDA ``uint8`` tensors; each
            group of ``prefetch`` objects is read into one GPU buffer.
    """

    def __init__(
        self,
        prefix: str,
        socket: Optional[str] = None,
        *,
        transform: Optional[Transform] = None,
        return_path: bool = False,
        paths: Optional[Sequence[Union[str, Tuple[str, int]]]] = None,
        prefetch: int = 8,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        on_error: str = "raise",
        client_options: Optional[Dict[str, Any]] = None,
        device: Any = None,
    ) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        if on_error not in ("raise", "skip"):
            raise ValueError("on_error must be 'raise' or 'skip'")
        if not 0 <= rank < world_size:
            raise ValueError("need 0 <= rank < world_size")
        _Base.__init__(self, prefix, socket, transform, return_path, paths, client_options)
        self.prefetch = prefetch
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.on_error = on_error
        self.epoch = 0
        self.device = device

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch that seeds the shuffle (call before each epoch)."""
        self.epoch = epoch

    def shard(
        self, worker_id: Optional[int] = None, num_workers: Optional[int] = None
    ) -> List[Tuple[str, Optional[int]]]:
        """The ``(path, size)`` items this worker reads this epoch."""
        if worker_id is None or num_workers is None:
            worker_id, num_workers = worker_info()
        items = list(self.items)
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(items)
        shard, shards = self.rank * num_workers + worker_id, self.world_size * num_workers
        return items[shard::shards]

    def results(self) -> Iterator[ItemResult]:
        """This worker's per-item results (errors included), in order."""
        if self.device is None:
            return self._client().iter_get(self.shard(), prefetch=self.prefetch)
        return self._device_results()

    def _device_results(self) -> Iterator[ItemResult]:
        shard = self.shard()
        for i in range(0, len(shard), self.prefetch):
            yield from self._to_device(shard[i : i + self.prefetch])

    def __iter__(self) -> Iterator[Any]:
        for r in self.results():
            if r.error is not None:
                if self.on_error == "skip":
                    continue
                raise r.error
            yield self._sample(r.path, r.data if r.data is not None else b"")


__all__ = [
    "HAVE_TORCH",
    "ShimDataset",
    "ShimIterableDataset",
    "worker_client",
    "worker_info",
    "list_prefix",
    "SluiceError",
]
