"""``torch.distributed.checkpoint`` (DCP) storage through the shim.

:class:`StorageWriter` / :class:`StorageReader` plug into
``torch.distributed.checkpoint.save`` / ``load`` (with or without a process
group; each rank writes its own objects). A checkpoint at ``ns/prefix`` is:

* ``ns/prefix/<save>/__<rank>_<n>.distcp``: one object per large tensor, its raw
  bytes (a GPU tensor is read straight from GPU memory through the client's
  GPU regions, and loaded straight back into GPU memory), and per rank one
  object packing its small tensors and non-tensor items. A tensor bigger
  than ``piece_bytes`` is stored as pieces ``__<rank>_<n>.distcp.<i>``,
  objects of their own, so that neither a save nor a load ever stages more
  than ``memory_bytes`` of it on the host, however big it is;
* ``ns/prefix/.metadata``: DCP's metadata (pickled), written **last**, by
  the coordinator, after every rank's objects are stored. A checkpoint
  without it does not exist (:func:`load` says so, naming it), so a save
  that dies mid-way is never mistaken for one.

Each save writes its objects under a ``<save>`` id of its own (when it
started, and a random part), so saving again to the same prefix never
touches the objects the current ``.metadata`` names: a save that dies
mid-way leaves the previous checkpoint whole. Once a save's ``.metadata``
is written, the coordinator deletes objects of this layout that neither it
nor the metadata it replaced names, once they are ``gc_grace_s`` old (a
reader of the replaced checkpoint, or another save still at work, keeps its
objects). Checkpoints written before save ids (objects directly under the
prefix) load as before.

Every object's size and ETag are recorded in the metadata; a load reads
each object whole, pinned to its ETag (an object replaced since is
refused), checks its size, and requires the agent to have verified its
bytes end to end against the CRC64NVME stored with the object
(:class:`~sluice.IntegrityError` otherwise; ``verify=False`` turns that
off).

CPU tensors are staged through registered memory from the client's scratch
pool (one copy each way, at most ``memory_bytes`` at a time). Tensors that
already live in registered memory — a state dict from
:func:`register_state_dict` — are stored from, and loaded into, their own
memory with no copy on this host.
:func:`async_save` returns once the state is captured and stores it in the
background (a ``concurrent.futures.Future``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import io
import pickle
import re
import secrets
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._dcp_registered import _client_of, _registered_home, register_state_dict, release_registered_state
from .checkpoint import GC_GRACE_S, IncompleteCheckpoint, delete_keys
from .errors import IntegrityError, NoSuchKey, PreconditionFailed, SluiceError

try:
    import torch
    from torch.distributed.checkpoint import metadata as _md
    from torch.distributed.checkpoint import planner as _pl
    from torch.distributed.checkpoint import storage as _st

    HAVE_DCP = True
    _WriterBase, _ReaderBase = _st.StorageWriter, _st.StorageReader
except ImportError:  # pragma: no cover - without torch the module still imports
    HAVE_DCP = False
    _WriterBase = _ReaderBase = object  # type: ignore[assignment,misc]

#: Tensors at least this big get an object of their own.
DEFAULT_OBJECT_THRESHOLD = 1 << 20
#: A tensor bigger than this (by default a quarter of ``memory_bytes``) is
#: stored as pieces of this size: a 400 MiB embedding is then staged 32 MiB
#: at a time, four pieces in flight, not 400 MiB at once.
PIECES_PER_BUDGET = 4
#: Bytes a writer or reader stages in registered memory at once: two 64 MiB
#: staging buffers' worth, within the client's scratch pool (256 MiB by
#: default), so the pool's regions are reused instead of registered anew.
DEFAULT_MEMORY_BYTES = 128 << 20


class _Budget:
    """Bytes that may be in flight; a request bigger than all of it waits
    for all of it (and then runs alone)."""

    def __init__(self, total: int) -> None:
        self.total, self.left = total, total
        self.cond = threading.Condition()

    def take(self, n: int) -> int:
        n = min(n, self.total)
        with self.cond:
            while self.left < n:
                self.cond.wait()
            self.left -= n
        return n

    def give(self, n: int) -> None:
        with self.cond:
            self.left += n
            self.cond.notify_all()
METADATA = ".metadata"


@dataclasses.dataclass(frozen=True)
class SluiceItem:
    """Where one DCP item is stored (kept in the checkpoint's metadata)."""

    key: str  # relative to the checkpoint prefix
    offset: int
    length: int
    etag: str
    #: For raw tensors: dtype name and shape of the stored bytes.
    dtype: str = ""
    shape: Tuple[int, ...] = ()
    #: A tensor stored in pieces: (key, length, etag) of each, in order;
    #: ``key`` is then their common stem and ``etag`` empty. Checkpoints
    #: written before pieces existed unpickle with none.
    pieces: Tuple[Tuple[str, int, str], ...] = ()


def _split(path: str) -> Tuple[str, str]:
    ns, _, prefix = str(path).partition("/")
    if not ns or not prefix:
        raise ValueError(f"a checkpoint path is 'namespace/prefix', not {path!r}")
    return ns, prefix.rstrip("/")


class StorageWriter(_WriterBase):  # type: ignore[misc,valid-type]
    """Writes a DCP checkpoint at ``path`` (``"namespace/prefix"``).

    Args:
        path: where the checkpoint goes (``checkpoint_id`` overrides it).
        client: a :class:`sluice.Client` (default: one for ``$SLUICE_SOCKET``).
        threads: objects stored at once per rank.
        object_threshold: tensors at least this big get an object each.
        memory_bytes: host memory a save stages at once (copies of CPU
            tensors, and the pinned lanes GPU tensors go through).
        piece_bytes: tensors bigger than this are stored in pieces of
            this size (default: a quarter of ``memory_bytes``; for GPU
            tensors at most one staging lane).
        gc_grace_s: objects of earlier saves that no metadata names any
            more are deleted once this old.
    """

    def __init__(
        self,
        path: str = "",
        client: Any = None,
        *,
        threads: int = 8,
        object_threshold: int = DEFAULT_OBJECT_THRESHOLD,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        piece_bytes: Optional[int] = None,
        gc_grace_s: float = GC_GRACE_S,
    ) -> None:
        if not HAVE_DCP:
            raise SluiceError("sluice.dcp needs torch with torch.distributed.checkpoint")
        super().__init__()
        self.path = path
        self.gc_grace_s = gc_grace_s
        self._client = _client_of(client)
        self.threads = max(1, threads)
        self.object_threshold = object_threshold
        #: Bytes staged on the host at once: CPU tensors' copies in
        #: registered memory, and GPU tensors' staging lanes.
        self.memory_bytes = max(1, memory_bytes)
        self.piece_bytes = max(4096, piece_bytes or self.memory_bytes // PIECES_PER_BUDGET)
        self._prefix = ""

    # -- StorageWriter --
    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.path = str(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool) -> None:
        _split(self.path)

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
        # On the coordinator only: every rank's objects go under this save's
        # own id, never over the objects the current metadata names.
        save = f"{int(time.time())}-{secrets.token_hex(4)}"
        return [dataclasses.replace(p, storage_data=f"{save}/__{i}_") for i, p in enumerate(plans)]

    def write_data(self, plan: Any, planner: Any) -> Any:
        rank_prefix = plan.storage_data
        ns, prefix = _split(self.path)
        own: List[Tuple[Any, Any]] = []
        packed: List[Tuple[Any, bytes, str, Tuple[int, ...]]] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == _pl.WriteItemType.BYTE_IO:
                packed.append((item, bytes(data.getbuffer()), "", ()))
                continue
            t = data.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            if nbytes >= self.object_threshold:
                own.append((item, t))
            else:
                cpu = t.cpu()
                packed.append((item, _tensor_bytes(cpu), str(t.dtype), tuple(t.shape)))
        # One object per tensor up to a piece; a bigger tensor is cut into
        # pieces stored side by side like any other object (each staged,
        # and checked on load, on its own). Per tensor: (key, offset, length).
        plans: List[List[Tuple[str, int, int]]] = []
        for n, (item, t) in enumerate(own):
            key = f"{rank_prefix}{n}.distcp"
            nbytes = t.numel() * t.element_size()
            piece = self._piece_of(t)
            if nbytes <= piece:
                plans.append([(key, 0, nbytes)])
            else:
                plans.append([(f"{key}.{i}", off, min(piece, nbytes - off))
                              for i, off in enumerate(range(0, nbytes, piece))])
        results: List[Any] = []
        budget = _Budget(self.memory_bytes)
        if any(t.is_cuda for _, t in own):
            _settle_callers_stream(t for _, t in own)
        with cf.ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sluice-dcp-put") as pool:
            futs = [[pool.submit(self._put_span, ns, prefix, k, t, off, length, budget) for k, off, length in plan]
                    for (_, t), plan in zip(own, plans)]
            packed_fut = None
            if packed:
                key = f"{rank_prefix}{len(own)}.distcp"
                # Piece-sized only when pieces are staged too (the pool's
                # buffers then all fit each other); a GPU state stages
                # nothing else on the host, so its small items take just
                # their own size beside the lanes.
                staged = any(not t.is_cuda and _registered_home(self._client, t, t.numel() * t.element_size()) is None
                             for _, t in own)
                packed_fut = pool.submit(self._put_packed, ns, prefix, key, packed, budget, staged)
            etags = [[f.result() for f in row] for row in futs]
            if packed_fut is not None:
                results.extend(packed_fut.result())
        for n, ((item, t), plan, tags) in enumerate(zip(own, plans, etags)):
            key = f"{rank_prefix}{n}.distcp"
            nbytes, dtype, shape = t.numel() * t.element_size(), str(t.dtype), tuple(t.shape)
            if len(plan) == 1 and plan[0][0] == key:
                info = SluiceItem(key, 0, nbytes, tags[0], dtype, shape)
            else:
                pieces = tuple((k, length, etag) for (k, _, length), etag in zip(plan, tags))
                info = SluiceItem(key, 0, nbytes, "", dtype, shape, pieces)
            results.append(_st.WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=info))
        fut = torch.futures.Future()  # what DCP waits on
        fut.set_result(results)
        return fut

    def _piece_of(self, t: Any) -> int:
        """The largest object a tensor is stored in: a GPU tensor's pieces
        go through one staging lane each, with no other host memory."""
        if t.is_cuda:
            lane = getattr(self._client, "_lane_bytes", self.piece_bytes)
            return max(1, min(self.piece_bytes, max(2 << 20, lane) & ~4095))
        return self.piece_bytes

    def _put_span(self, ns: str, prefix: str, key: str, t: Any, off: int, n: int, budget: "_Budget") -> str:
        """Stores bytes ``off..off+n`` of tensor ``t`` as object ``key``;
        returns its ETag."""
        path = f"{ns}/{prefix}/{key}"
        if t.is_cuda:
            # Straight from GPU memory through one of the client's pinned
            # staging lanes. Lanes are made on demand and kept: holding a
            # lane's worth of the budget per PUT bounds how many there are.
            held = budget.take(self._piece_of(t))
            try:
                with self._client.register_gpu(t) as g:
                    return self._client.put(path, g, off, n).etag
            finally:
                budget.give(held)
        home = _registered_home(self._client, t, t.numel() * t.element_size())
        if home is not None:
            # The tensor lives in registered memory (register_state_dict):
            # stored from where it is, no copy on this host.
            return self._client.put(path, home[0], home[1] + off, n).etag
        # Copied once into staging memory from the client's pool (kept
        # registered between objects and saves: no registration or page
        # faults per tensor). Every staging buffer is a piece's size, so
        # the pool's regions fit every later piece and never pile up past
        # the budget.
        held = budget.take(self.piece_bytes)
        try:
            with self._client.staging(self.piece_bytes) as staged:
                staged.write(_tensor_bytes(t)[off : off + n])
                return self._client.put(path, staged, 0, n).etag
        finally:
            budget.give(held)

    def _put_packed(
        self, ns: str, prefix: str, key: str, packed: List[Any], budget: "_Budget", piece_sized: bool = True
    ) -> List[Any]:
        """The small items, packed into one object, staged within the
        budget like a piece (``piece_sized``: in a piece-sized buffer, so it
        neither takes a buffer a piece is waiting for nor leaves one of
        another size in the pool; else in one of their own size)."""
        spans = []
        total = 0
        for item, data, dtype, shape in packed:
            spans.append((item, total, len(data), dtype, shape))
            total += len(data)
        buf = max(total, self.piece_bytes) if piece_sized else max(total, 1)
        held = budget.take(buf)
        try:
            with self._client.staging(buf) as staged:
                for (_, off, _, _, _), (_, data, _, _) in zip(spans, packed):
                    staged.write(data, off)
                etag = self._client.put(f"{ns}/{prefix}/{key}", staged, 0, total).etag
        finally:
            budget.give(held)
        return [
            _st.WriteResult(index=item.index, size_in_bytes=n, storage_data=SluiceItem(key, off, n, etag, dtype, shape))
            for item, off, n, dtype, shape in spans
        ]

    def finish(self, metadata: Any, results: List[List[Any]]) -> None:
        storage: Dict[Any, Any] = {}
        for rank_results in results:
            storage.update({r.index: r.storage_data for r in rank_results})
        metadata.storage_data = storage
        ns, prefix = _split(self.path)
        previous = self._metadata_or_none(f"{ns}/{prefix}/{METADATA}")
        # Last: the checkpoint exists from here on.
        self._client.put(f"{ns}/{prefix}/{METADATA}", pickle.dumps(metadata))
        keep = _named_keys(storage) | _named_keys(getattr(previous, "storage_data", None) or {})
        try:
            collect_garbage(self._client, self.path, keep=keep, older_than_s=self.gc_grace_s)
        except SluiceError:
            pass  # garbage is harmless; the next save tries again

    def _metadata_or_none(self, key: str) -> Any:
        try:
            return pickle.loads(self._client.get_bytes(key))
        except (SluiceError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
            return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            _split(str(checkpoint_id))
            return True
        except ValueError:
            return False

    def storage_meta(self) -> Any:
        return _md.StorageMeta(checkpoint_id=self.path)


#: An object of this layout, relative to the checkpoint's prefix: a save's
#: (``<started>-<id>/``) or one written before save ids.
_OBJECT_KEY = re.compile(r"^(?:(\d+)-[0-9a-f]+/)?__\d+_\d+\.distcp(?:\.\d+)?$")


def _named_keys(storage: Dict[Any, Any]) -> set:
    """The object keys (relative to the prefix) a metadata's items name."""
    keys = set()
    for item in storage.values():
        if not isinstance(item, SluiceItem):
            continue
        if item.pieces:
            keys.update(k for k, _, _ in item.pieces)
        else:
            keys.add(item.key)
    return keys


def collect_garbage(client: Any, path: str, *, keep: Optional[set] = None, older_than_s: float = GC_GRACE_S) -> int:
    """Deletes the objects of DCP checkpoint ``path`` that ``keep`` (by
    default: what its ``.metadata`` names) does not name and that are at
    least ``older_than_s`` old (objects written before save ids have no
    age: they go when unnamed); returns how many. Only keys of this
    layout are touched (not other checkpoints under the same prefix)."""
    ns, prefix = _split(path)
    if keep is None:
        try:
            keep = _named_keys(pickle.loads(client.get_bytes(f"{ns}/{prefix}/{METADATA}")).storage_data)
        except NoSuchKey:
            keep = set()
    before = time.time() - older_than_s
    stale = []
    for o in client.list(f"{ns}/{prefix}/"):
        rel = o.key[len(prefix) + 1 :]
        m = _OBJECT_KEY.match(rel)
        if m is None or rel in keep:
            continue
        if m.group(1) is None or float(m.group(1)) <= before:
            stale.append(o.key)
    return delete_keys(client, ns, stale)


class StorageReader(_ReaderBase):  # type: ignore[misc,valid-type]
    """Reads a DCP checkpoint written by :class:`StorageWriter`."""

    def __init__(
        self,
        path: str = "",
        client: Any = None,
        *,
        threads: int = 8,
        verify: bool = True,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        if not HAVE_DCP:
            raise SluiceError("sluice.dcp needs torch with torch.distributed.checkpoint")
        super().__init__()
        self.path = path
        self._client = _client_of(client)
        self.threads = max(1, threads)
        #: Bytes of objects staged in registered memory at once (an object
        #: bigger than this is read alone).
        self.memory_bytes = max(1, memory_bytes)
        #: Staging buffers are all this size (or an object's, if bigger):
        #: the pool's buffers then fit every later object, so it never holds
        #: more of them than are in use at once.
        self._buffer_bytes = max(4096, self.memory_bytes // PIECES_PER_BUDGET)
        #: Refuse bytes the agent could not check end to end (IntegrityError).
        self.verify = verify
        self.storage_data: Dict[Any, SluiceItem] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = str(checkpoint_id)

    def read_metadata(self) -> Any:
        ns, prefix = _split(self.path)
        key = f"{ns}/{prefix}/{METADATA}"
        try:
            raw = self._client.get_bytes(key)
        except NoSuchKey:
            raise IncompleteCheckpoint(
                f"no checkpoint at {self.path}: {key} is missing (the save did not complete, or nothing was saved)"
            ) from None
        metadata = pickle.loads(raw)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = _md.StorageMeta()
        return metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: List[Any]) -> List[Any]:
        return plans

    def read_data(self, plan: Any, planner: Any) -> Any:
        ns, prefix = _split(self.path)
        # Each object is read whole, once: a whole-object read is checked
        # end to end against the CRC64NVME the agent stored with it (a
        # ranged one could not be), then shared by the items in it. A
        # tensor stored in pieces is read piece by piece.
        sizes: Dict[str, int] = {}
        for info in self.storage_data.values():
            if not info.pieces:
                sizes[info.key] = max(sizes.get(info.key, 0), info.offset + info.length)
        by_key: Dict[str, List[Any]] = {}
        pieced: List[Any] = []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if info.pieces:
                pieced.append(req)
            else:
                by_key.setdefault(info.key, []).append(req)
        budget = _Budget(self.memory_bytes)
        _settle_callers_stream()
        with cf.ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sluice-dcp-get") as pool:
            futs = [
                pool.submit(self._read_object, ns, prefix, k, sizes[k], reqs, planner, budget)
                for k, reqs in by_key.items()
            ]
            for req in pieced:
                futs.extend(self._read_pieced(pool, ns, prefix, req, planner, budget))
            for f in futs:
                f.result()
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _get_checked(self, path: str, etag: str, size: int, into: Any, offset: int = 0) -> None:
        """Reads object ``path`` whole into ``into`` at ``offset``, pinned to
        ``etag``; anything but exactly ``size`` verified bytes is refused
        (and no more than ``size`` bytes are written)."""
        try:
            # The range keeps a longer object from writing past ``size``
            # (an empty object has no range to ask for).
            t = self._client.get(path, into=into, offset=offset, range=(0, size) if size else None, if_match=etag)
        except NoSuchKey:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: {path} is missing") from None
        except PreconditionFailed:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: {path} was replaced since it was saved") from None
        if t.bytes != size or t.object_size != size:
            raise IncompleteCheckpoint(f"{path}: {t.object_size} bytes where the checkpoint recorded {size}")
        if self.verify and not t.verified:
            raise IntegrityError(f"{path}: the bytes could not be verified ({t.unverified_reason})")

    def _read_object(
        self, ns: str, prefix: str, key: str, size: int, reqs: List[Any], planner: Any, budget: "_Budget"
    ) -> None:
        path = f"{ns}/{prefix}/{key}"
        etag = self.storage_data[reqs[0].storage_index].etag
        if self._read_in_place(path, etag, size, reqs, planner, budget):
            return
        with self._staged(path, etag, size, budget, packed=len(reqs) > 1) as r:
            # Copies into GPU tensors are queued item by item, then waited
            # for once (before the staging region goes back), and only then
            # are those tensors committed.
            queued: List[Tuple[Any, Any]] = []
            try:
                for req in reqs:
                    q = self._deliver(path, r, req, planner, wait=False)
                    if q is not None:
                        queued.append(q)
            finally:
                # Also when an item fails: no copy may still read the region.
                for t in {t.device: t for _, t in queued}.values():
                    _wait_for_copy(t)
            for req, t in queued:
                planner.commit_tensor(req, t)

    @contextlib.contextmanager
    def _staged(self, path: str, etag: str, size: int, budget: "_Budget", packed: bool = False) -> Iterator[Any]:
        """Object ``path`` read whole and checked into staging memory from
        the client's pool (registered once, reused by every object and every
        later load), held within the budget for the ``with`` block."""
        # Staging buffers are piece-sized, so they fit each other in the
        # pool; the small items packed together take a buffer of their own
        # size (a GPU state's load stages nothing else on the host: no
        # piece-sized buffer is made for it).
        buf = size if packed else max(size, self._buffer_bytes)
        held = budget.take(max(buf, 1))
        try:
            with self._client.staging(buf) as r:
                self._get_checked(path, etag, size, r)
                yield r
        finally:
            budget.give(held)

    def _whole_target(self, req: Any, planner: Any) -> Optional[Any]:
        """The tensor ``req`` loads into when it takes the stored tensor
        whole, as the same bytes (not a shard of it, not another dtype):
        its bytes can then be filled object by object. Else None."""
        info = self.storage_data[req.storage_index]
        if req.type == _pl.LoadItemType.BYTE_IO or not info.length:
            return None
        if any(o != 0 for o in req.storage_offsets) or tuple(req.lengths) != tuple(info.shape):
            return None
        target = planner.resolve_tensor(req).detach()
        if not target.is_contiguous() or str(target.dtype) != info.dtype:
            return None
        if target.numel() * target.element_size() != info.length:
            return None
        return target

    def _read_in_place(self, path: str, etag: str, size: int, reqs: List[Any], planner: Any, budget: "_Budget") -> bool:
        """Reads an object straight into its target tensor when the object
        is exactly that tensor's bytes and the tensor lives in registered
        memory (register_state_dict: no staging, no copy on this host) or
        in GPU memory (through a staging lane, :meth:`_read_into_gpu`).
        False when it does not apply (the staged path then reads it)."""
        if len(reqs) != 1:
            return False
        req = reqs[0]
        info = self.storage_data[req.storage_index]
        if info.offset != 0 or info.length != size:
            return False
        target = self._whole_target(req, planner)
        if target is None:
            return False
        if target.is_cuda:
            if not self._read_into_gpu(path, etag, target, 0, size, budget):
                return False
        else:
            home = _registered_home(self._client, target, size)
            if home is None:
                return False
            self._get_checked(path, etag, size, home[0], home[1])
        planner.commit_tensor(req, target)
        return True

    def _read_pieced(self, pool: Any, ns: str, prefix: str, req: Any, planner: Any, budget: "_Budget") -> List[Any]:
        """Jobs that load a tensor stored in pieces: one per piece straight
        into its target (the last to finish commits it), or, for a shard or
        a conversion, one that gathers the pieces in staging first."""
        info = self.storage_data[req.storage_index]
        paths = [(f"{ns}/{prefix}/{k}", n, etag) for k, n, etag in info.pieces]
        if sum(n for _, n, _ in paths) != info.length:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: the pieces of {info.key} do not add up to its size")
        target = self._whole_target(req, planner)
        if target is None:
            return [pool.submit(self._gather_pieces, paths, req, planner, budget)]
        left = [len(paths)]
        lock = threading.Lock()

        def piece(path: str, off: int, n: int, etag: str) -> None:
            self._read_piece(path, etag, target, off, n, budget)
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                planner.commit_tensor(req, target)

        offs = [0]
        for _, n, _ in paths[:-1]:
            offs.append(offs[-1] + n)
        return [pool.submit(piece, p, off, n, etag) for (p, n, etag), off in zip(paths, offs)]

    def _read_piece(self, path: str, etag: str, target: Any, off: int, n: int, budget: "_Budget") -> None:
        """Bytes ``off..off+n`` of ``target`` from object ``path``."""
        home = _registered_home(self._client, target, target.numel() * target.element_size())
        if home is not None:
            self._get_checked(path, etag, n, home[0], home[1] + off)
            return
        if self._read_into_gpu(path, etag, target, off, n, budget):
            return
        with self._staged(path, etag, n, budget) as r:
            dst = target.reshape(-1).view(torch.uint8)[off : off + n]
            dst.copy_(torch.frombuffer(r.view[:n], dtype=torch.uint8), non_blocking=target.is_cuda)
            if target.is_cuda:
                _wait_for_copy(target)

    def _gpu_room(self) -> int:
        """The largest object read straight into a GPU tensor: one of the
        client's staging lanes (0: the client has none)."""
        lane = getattr(self._client, "_lane_bytes", 0)
        return (max(2 << 20, lane) & ~4095) if lane else 0

    def _read_into_gpu(self, path: str, etag: str, target: Any, off: int, n: int, budget: "_Budget") -> bool:
        """Reads object ``path`` into bytes ``off..off+n`` of GPU tensor
        ``target`` through one of the client's pinned staging lanes and the
        copy engine (:meth:`Client.register_gpu`): no other host memory and
        no host copy. An object no bigger than a lane is read whole, so the
        agent checks it end to end. False when this does not apply (not a
        GPU tensor, or a bigger object, as checkpoints written with bigger
        pieces have): the staged path reads it then."""
        room = self._gpu_room()
        if not getattr(target, "is_cuda", False) or not room or n > room:
            return False
        held = budget.take(room)
        try:
            with self._client.register_gpu(target) as g:
                self._get_checked(path, etag, n, g, off)
        finally:
            budget.give(held)
        return True

    def _gather_pieces(self, paths: List[Tuple[str, int, str]], req: Any, planner: Any, budget: "_Budget") -> None:
        """A shard of (or a conversion from) a tensor stored in pieces: the
        whole stored tensor gathered in staging, then handed over."""
        info = self.storage_data[req.storage_index]
        held = budget.take(info.length)
        try:
            with self._client.staging(info.length) as r:
                off = 0
                for path, n, etag in paths:
                    self._get_checked(path, etag, n, r, off)
                    off += n
                self._deliver(paths[0][0], r, req, planner)
        finally:
            budget.give(held)

    def _deliver(self, path: str, r: Any, req: Any, planner: Any, wait: bool = True) -> Optional[Tuple[Any, Any]]:
        """Hands one item of the object in region ``r`` to the planner: bytes
        as a BytesIO, a tensor copied into its target (on the GPU: from
        registered memory, pinned when the client pins regions). With
        ``wait`` False, a copy into a GPU tensor is left queued and
        ``(req, target)`` returned: the caller waits for it, then commits."""
        info = self.storage_data[req.storage_index]
        window = r.view[info.offset : info.offset + info.length]
        if req.type == _pl.LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(bytes(window)))
            return None
        target = planner.resolve_tensor(req).detach()
        queued = False
        if info.length:
            stored = torch.frombuffer(window, dtype=_dtype(info.dtype)).view(info.shape)
            part = narrow_tensor_by_index(stored, req.storage_offsets, req.lengths)
            if target.size() != part.size():
                raise IncompleteCheckpoint(f"{path}: stored shape {tuple(part.size())}, expected {tuple(target.size())}")
            # From staging on the host: on the GPU an asynchronous copy, then
            # an asleep wait (a synchronous copy_ spins a core until done).
            target.copy_(part, non_blocking=target.is_cuda)
            queued = target.is_cuda
            del stored, part
        if queued and not wait:
            return req, target
        if queued:
            _wait_for_copy(target)
        planner.commit_tensor(req, target)
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return StorageWriter.validate_checkpoint_id(checkpoint_id)


def _settle_callers_stream(tensors: Any = ()) -> None:
    """Waits (asleep) for the work the calling thread queued on its current
    CUDA stream of each device ``tensors`` live on (and of the current
    device): the tensors a save reads or a load fills are then final
    before the save's or load's own threads touch them. Those threads'
    transfers are ordered only after their own current streams (the
    default ones), not the caller's, which may be others, on another
    device. Nothing to do where this process has not used CUDA."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    devices = {t.device for t in tensors if getattr(t, "is_cuda", False)}
    devices.add(torch.device("cuda", torch.cuda.current_device()))
    for device in devices:
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(device))
        done.synchronize()


def _wait_for_copy(target: Any) -> None:
    """Waits for the copy into GPU tensor ``target`` to finish, before its
    staging region goes back; asleep, not spinning a core for the copy's
    milliseconds."""
    done = torch.cuda.Event(blocking=True)
    done.record(torch.cuda.current_stream(target.device))
    done.synchronize()


def narrow_tensor_by_index(t: Any, offsets: Any, lengths: Any) -> Any:
    """The piece of ``t`` a read item asks for (a shard of the stored chunk)."""
    for dim, (off, n) in enumerate(zip(offsets, lengths)):
        if off != 0 or n != t.size(dim):
            t = t.narrow(dim, off, n)
    return t


def _dtype(name: str) -> Any:
    return getattr(torch, name.replace("torch.", ""))


def _itemsize(name: str) -> int:
    return torch.empty((), dtype=_dtype(name)).element_size()


def _tensor_bytes(t: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _typed(e: BaseException) -> BaseException:
    """DCP wraps every rank's error in a CheckpointException: the Sluice
    error behind it, when there is one, says what to fix."""
    for v in getattr(e, "failures", {}).values():
        exc = v[0] if isinstance(v, tuple) else v
        if isinstance(exc, SluiceError):
            return exc
    return e


def save(state_dict: Dict[str, Any], path: str, client: Any = None, **kw: Any) -> Any:
    """``torch.distributed.checkpoint.save`` into ``path`` through the shim."""
    import torch.distributed.checkpoint as dcp

    try:
        return dcp.save(state_dict, storage_writer=StorageWriter(path, client), **kw)
    except dcp.CheckpointException as e:
        raise _typed(e) from e


def load(state_dict: Dict[str, Any], path: str, client: Any = None, **kw: Any) -> None:
    """``torch.distributed.checkpoint.load`` from ``path`` (in place); an
    incomplete checkpoint raises :class:`~sluice.checkpoint.IncompleteCheckpoint`
    naming what is missing."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state_dict, storage_reader=StorageReader(path, client), **kw)
    except dcp.CheckpointException as e:
        raise _typed(e) from e


def async_save(state_dict: Dict[str, Any], path: str, client: Any = None, **kw: Any) -> "cf.Future[Any]":
    """Captures ``state_dict`` now and saves it in the background: returns a
    future for the save's metadata (or its error). The capture copies CPU
    tensors and snapshots GPU tensors on the GPU, so the training loop may
    change them as soon as this returns; the upload then holds only that
    copy."""
    snapshot = _capture(state_dict)
    # The clones were queued on the caller's current streams (each device's
    # own); the save runs in another thread, whose current streams are the
    # default ones of its current device: it must not read them unfinished.
    _settle_callers_stream(_tensors_in(snapshot))
    pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-dcp-async")
    # The worker saves on the caller's CUDA device (a new thread's current
    # device is device 0: a rank on cuda:1 would stage, and run its
    # collectives, there).
    cuda = HAVE_DCP and torch.cuda.is_available() and torch.cuda.is_initialized()
    device = torch.cuda.current_device() if cuda else None

    def save_on_callers_device() -> Any:
        if device is not None:
            torch.cuda.set_device(device)
        return save(snapshot, path, client, **kw)

    fut = pool.submit(save_on_callers_device)
    pool.shutdown(wait=False)
    return fut


def _tensors_in(obj: Any) -> List[Any]:
    if HAVE_DCP and isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_in(v)]
    return []


def _capture(obj: Any) -> Any:
    if HAVE_DCP and isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _capture(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_capture(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_capture(v) for v in obj)
    return pickle.loads(pickle.dumps(obj))


__all__ = [
    "HAVE_DCP",
    "SluiceItem",
    "StorageReader",
    "StorageWriter",
    "async_save",
    "collect_garbage",
    "load",
    "register_state_dict",
    "release_registered_state",
    "save",
]
