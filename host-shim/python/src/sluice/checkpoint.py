"""Checkpoints through the shim: file-like streams that are never half-written.

:class:`CheckpointWriter` is a write-only file (``torch.save(obj, w)``): the
bytes go into registered memory, ``chunk_bytes`` at a time, and each full
chunk is stored as an object of its own while the caller fills the next
(double buffered; the agent sends a large chunk as a multipart upload with
parallel parts). Closing stores the *manifest* last, at the stream's own
path: a JSON object naming every chunk with its size and ETag. Until the
manifest exists there is no checkpoint at that path, so a writer that dies
mid-way leaves no half-written checkpoint; its chunks are garbage that a
later commit to the same path removes once they are an hour old
(:func:`collect_garbage` does it on demand), and a chunk upload cut short
is aborted by the agent. A commit keeps the chunks of the save it replaces
(a reader of that one goes on) and of saves still younger than the grace
(another writer of the same path may be mid-way).

:class:`CheckpointReader` is a read-only, seekable file (``torch.load(r)``):
it reads the manifest, then the chunks into registered memory, several in
flight ahead of the reader, each read whole and pinned to the ETag the
manifest recorded (a chunk replaced since is refused, not mixed in),
checked for size, and verified by the agent end to end against the
CRC64NVME stored with it.
Which chunks it fetches ahead follows the reader: the next ones in the
file, or, for a ``torch.save`` archive (whose records ``torch.load`` reads
in another order than they are stored: :mod:`sluice._archive_order`), the
chunks of the records it will read next; a chunk is evicted only when the
reader has left it behind or will not want it soon.

The stored layout (``<path>`` the manifest, ``<path>.chunks/<writer>/<n>``
the chunks) is Sluice's own; `sluice.dcp` writes torch.distributed
checkpoints in plain objects.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import json
import secrets
import sys
import time
from typing import Any, Dict, List, Optional, Set

from ._archive_order import ArchiveOrder, SeekableReader
from .errors import BadRequest, IntegrityError, NoSuchKey, PreconditionFailed, SluiceError

#: The manifest's format name (and version).
FORMAT = "sluice-checkpoint-stream/1"
#: Default bytes per chunk object.
DEFAULT_CHUNK_BYTES = 64 << 20
#: Chunks no manifest names are removed by a commit once this old.
GC_GRACE_S = 3600.0


class IncompleteCheckpoint(SluiceError):
    """The checkpoint is missing or incomplete (no manifest, or a piece it
    names is gone or changed); the message names what is missing."""


def chunk_prefix(path: str) -> str:
    return f"{path}.chunks/"


class CheckpointWriter(io.RawIOBase):
    """A write-only stream stored at ``path`` (``"namespace/key"``) when
    closed. Use it as a context manager: leaving the block with an exception
    aborts (nothing is committed and the chunks written so far are
    deleted). So does ``close()`` called while an exception is being
    handled (in a ``finally:`` or ``except:`` block: the stream may be cut
    short), and a writer dropped unclosed; :meth:`commit` commits in any
    case.

    Args:
        client: a :class:`sluice.Client`.
        chunk_bytes: bytes per chunk object (and per staging buffer).
        buffers: staging buffers (2: the caller fills one while the other
            is stored). Peak memory is ``buffers * chunk_bytes``.
        gc_grace_s: a commit removes chunks no manifest names once they are
            this old (see :func:`collect_garbage`).
    """

    def __init__(
        self,
        client: Any,
        path: str,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        buffers: int = 2,
        gc_grace_s: float = GC_GRACE_S,
    ) -> None:
        super().__init__()
        if chunk_bytes < 1 or buffers < 1:
            raise ValueError("chunk_bytes and buffers must be >= 1")
        self._client, self.path = client, path
        self.chunk_bytes = chunk_bytes
        self._token = f"{int(time.time())}-{secrets.token_hex(6)}"
        self._regions = [client.register(chunk_bytes) for _ in range(buffers)]
        self._pending: List[Optional[cf.Future]] = [None] * buffers
        self._pool = cf.ThreadPoolExecutor(max_workers=buffers, thread_name_prefix="sluice-ckpt-put")
        self._cur, self._fill = 0, 0
        self._chunks: List[Optional[Dict[str, Any]]] = []
        self._size = 0
        self._error: Optional[BaseException] = None
        self._committed = False
        self.gc_grace_s = gc_grace_s

    # -- io.RawIOBase --
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed checkpoint writer")
        self._raise_failed()
        src = memoryview(b).cast("B")
        done = 0
        while done < src.nbytes:
            room = self.chunk_bytes - self._fill
            n = min(room, src.nbytes - done)
            self._regions[self._cur].view[self._fill : self._fill + n] = src[done : done + n]
            self._fill += n
            done += n
            if self._fill == self.chunk_bytes:
                self._submit()
        self._size += done
        return done

    def tell(self) -> int:
        return self._size

    def close(self) -> None:
        """Commits what was written, unless an exception is being handled
        (then it aborts: the stream may have been cut short)."""
        if self.closed:
            return
        if sys.exc_info()[1] is not None and not self._committed:
            self.abort()
            return
        self.commit()

    def commit(self) -> None:
        """Stores the rest and the manifest (the checkpoint exists from
        then on), and closes."""
        if self.closed:
            return
        try:
            if not self._committed and self._error is None:
                self._commit()
        finally:
            self._shutdown()
            super().close()

    def __del__(self) -> None:
        # io's own __del__ would close(), which commits: a writer dropped
        # unclosed (its producer failed and nobody closed it) commits
        # nothing.
        if getattr(self, "_regions", None) is None or self.closed:
            return
        try:
            self.abort()
        except Exception:  # noqa: BLE001 - at collection, nothing to tell
            pass

    # -- the work --
    def _key(self, n: int) -> str:
        return f"{chunk_prefix(self.path)}{self._token}/{n:06d}"

    def _submit(self) -> None:
        """Stores the current buffer as the next chunk, in the background,
        and moves to a buffer whose last chunk is stored."""
        n, i, length = len(self._chunks), self._cur, self._fill
        self._chunks.append(None)
        self._pending[i] = self._pool.submit(self._put, n, i, length)
        self._cur = (self._cur + 1) % len(self._regions)
        self._fill = 0
        self._wait(self._cur)

    def _put(self, n: int, i: int, length: int) -> None:
        t = self._client.put(self._key(n), self._regions[i], 0, length)
        self._chunks[n] = {"key": self._key(n).split("/", 1)[1], "size": length, "etag": t.etag}

    def _wait(self, i: int) -> None:
        f, self._pending[i] = self._pending[i], None
        if f is not None:
            try:
                f.result()
            except BaseException as e:  # the write that needs this buffer reports it
                self._error = self._error or e
        self._raise_failed()

    def _raise_failed(self) -> None:
        if self._error is not None:
            raise SluiceError(f"checkpoint {self.path}: storing a chunk failed: {self._error}") from self._error

    def _commit(self) -> None:
        if self._fill or not self._chunks:
            self._submit()
        for i in range(len(self._regions)):
            self._wait(i)
        ns = self.path.split("/", 1)[0]
        previous = _manifest_or_none(self._client, self.path)
        manifest = {
            "format": FORMAT,
            "size": self._size,
            "chunk_bytes": self.chunk_bytes,
            "namespace": ns,
            "chunks": self._chunks,
            "written_at": time.time(),
        }
        # The manifest last: only now does a checkpoint exist at `path`.
        self._client.put(self.path, json.dumps(manifest).encode())
        self._committed = True
        # Chunks no manifest names any more: the previous save's, and those
        # of writers that died before committing.
        keep = {c["key"] for c in self._chunks if c}
        keep |= {c["key"] for c in (previous or {}).get("chunks", []) if c}
        try:
            collect_garbage(self._client, self.path, keep=keep, older_than_s=self.gc_grace_s)
        except SluiceError:
            pass  # garbage is harmless; the next commit tries again

    def abort(self) -> None:
        """Gives up: nothing is committed, chunks stored so far are deleted."""
        if self.closed:
            return
        self._error = self._error or SluiceError("aborted")
        try:
            for i in range(len(self._regions)):
                f, self._pending[i] = self._pending[i], None
                if f is not None:
                    try:
                        f.result()
                    except BaseException:  # noqa: BLE001 - aborting anyway
                        pass
            for n in range(len(self._chunks)):
                try:
                    self._client.delete(self._key(n))
                except SluiceError:
                    pass
        finally:
            self._shutdown()
            super().close()

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        for r in self._regions:
            try:
                r.release()
            except SluiceError:
                pass

    def __enter__(self) -> "CheckpointWriter":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.commit()  # not close(): this block may run inside an unrelated except


def _manifest_or_none(client: Any, path: str) -> Optional[Dict[str, Any]]:
    try:
        m = json.loads(client.get_bytes(path))
    except NoSuchKey:
        return None
    except (ValueError, SluiceError):
        return None
    return m if isinstance(m, dict) and m.get("format") == FORMAT else None


def read_manifest(client: Any, path: str) -> Dict[str, Any]:
    """The manifest at ``path``; :class:`IncompleteCheckpoint` if there is
    none (never committed) or it is not a Sluice checkpoint stream."""
    try:
        raw = client.get_bytes(path)
    except NoSuchKey:
        raise IncompleteCheckpoint(f"no checkpoint at {path}: its manifest is missing (the save did not complete)") from None
    try:
        m = json.loads(raw)
    except ValueError:
        raise IncompleteCheckpoint(f"{path} is not a Sluice checkpoint stream (not a JSON manifest)") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise IncompleteCheckpoint(f"{path} is not a Sluice checkpoint stream (format {m.get('format') if isinstance(m, dict) else None!r})")
    if sum(c["size"] for c in m["chunks"]) != m["size"]:
        raise IncompleteCheckpoint(f"{path}: the manifest's chunks do not add up to its size")
    return m


def collect_garbage(
    client: Any, path: str, *, keep: Optional[set] = None, older_than_s: float = GC_GRACE_S
) -> int:
    """Deletes chunk objects under ``path`` that its manifest does not name
    (``keep``, when given) and whose writer started at least
    ``older_than_s`` ago (left by earlier saves, or by writers that died);
    returns how many. Chunks of a writer still at work, or of a save a
    reader may still be reading, are younger than a commit's grace."""
    ns = path.split("/", 1)[0]
    if keep is None:
        m = _manifest_or_none(client, path)
        keep = {c["key"] for c in m["chunks"]} if m else set()
    before = time.time() - older_than_s
    stale = [o.key for o in client.list(chunk_prefix(path)) if o.key not in keep and _written_at(o.key) <= before]
    return delete_keys(client, ns, stale)


def delete_keys(client: Any, ns: str, keys: List[str]) -> int:
    """Deletes ``keys`` of namespace ``ns`` (one already gone is fine);
    returns how many were asked for."""
    for key in keys:
        try:
            client.delete(f"{ns}/{key}")
        except NoSuchKey:
            pass
    return len(keys)


def _written_at(key: str) -> float:
    """When the writer of chunk ``key`` (``<path>.chunks/<start>-<id>/<n>``)
    started; 0 for a key not of that form (nobody is writing it)."""
    token = key.rsplit(".chunks/", 1)[-1].split("/", 1)[0]
    try:
        return float(token.split("-", 1)[0])
    except ValueError:
        return 0.0


class CheckpointReader(SeekableReader):
    """A read-only, seekable stream of the checkpoint at ``path``.

    Args:
        client: a :class:`sluice.Client`.
        prefetch: chunks read ahead of the reader (in registered memory;
            1: double buffered, 2 chunk buffers in all).
    """

    def __init__(self, client: Any, path: str, *, prefetch: int = 1, verify: bool = True) -> None:
        super().__init__()
        self._client, self.path = client, path
        #: Refuse chunks the agent could not check end to end.
        self.verify = verify
        self._m = read_manifest(client, path)
        self._ns = self._m["namespace"]
        self._starts = []
        pos = 0
        for c in self._m["chunks"]:
            self._starts.append(pos)
            pos += c["size"]
        self._size = pos
        self._pos = 0
        self._prefetch = max(0, prefetch)
        width = max([c["size"] for c in self._m["chunks"]] + [1])
        self._free = [client.register(width) for _ in range(self._prefetch + 1)]
        self._loaded: Dict[int, Any] = {}  # chunk -> (region, future)
        #: Where torch.load will read next, when this is a torch.save
        #: archive (worked out on the first read).
        self._order: Optional[ArchiveOrder] = None
        self._order_tried = self._planning = False
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, self._prefetch + 1), thread_name_prefix="sluice-ckpt-get")

    @property
    def size(self) -> int:
        return self._size

    def readinto(self, b: Any) -> int:
        if self.closed:
            raise ValueError("read from a closed checkpoint reader")
        if not self._order_tried:
            self._order_tried = True
            # Looked up with no chunk fetched ahead: the archive's directory
            # is at its end, far from where the reader starts.
            self._planning = True
            try:
                self._order = ArchiveOrder.of(self._read_at, self._size)
            finally:
                self._planning = False
        dst = memoryview(b).cast("B")
        want = max(0, min(dst.nbytes, self._size - self._pos))
        done = self._copy_out(self._pos, dst[:want])
        self._pos += done
        return done

    def _read_at(self, pos: int, n: int) -> bytes:
        """``n`` bytes from ``pos`` (through the chunks), not moving the reader."""
        out = bytearray(max(0, min(n, self._size - pos)))
        self._copy_out(pos, memoryview(out))
        return bytes(out)

    def _copy_out(self, pos: int, dst: memoryview) -> int:
        done = 0
        order = self._order
        while done < dst.nbytes:
            if order is not None and order.tail_start >= 0 and pos + done >= order.tail_start:
                at = pos + done - order.tail_start
                n = min(dst.nbytes - done, len(order.tail) - at)
                dst[done : done + n] = order.tail[at : at + n]
                done += n
                continue
            i = self._chunk_of(pos + done)
            region = self._chunk(i, pos + done)
            off = pos + done - self._starts[i]
            n = min(dst.nbytes - done, self._m["chunks"][i]["size"] - off)
            dst[done : done + n] = region.view[off : off + n]
            done += n
        return done

    def _chunk_of(self, pos: int) -> int:
        lo, hi = 0, len(self._starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._starts[mid] <= pos:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _chunk(self, i: int, pos: int) -> Any:
        """The region holding chunk ``i`` (read now if it is not), with the
        chunks the reader will want next (from byte ``pos`` on) started."""
        ahead = self._ahead(i, pos)
        keep = {i, *ahead}
        for j in [i, *ahead]:
            if not self._start(j, keep):
                break  # no region to spare: the chunk itself has one
        region, fut = self._loaded[i]
        fut.result()
        return region

    def _ahead(self, i: int, pos: int) -> List[int]:
        """Up to ``prefetch`` chunks the reader will want after chunk ``i``,
        soonest first: the next ones in the file, or, for a torch.save
        archive, those of the records torch.load reads next."""
        if self._planning:
            return []
        if self._order is None:
            return list(range(i + 1, min(i + 1 + self._prefetch, len(self._starts))))
        out: List[int] = []
        for start, end in self._order.after(pos):
            for j in range(self._chunk_of(start), self._chunk_of(max(start, end - 1)) + 1):
                if j != i and j not in out:
                    out.append(j)
                    if len(out) >= self._prefetch:
                        return out
        return out

    def _start(self, i: int, keep: Set[int]) -> bool:
        """Starts reading chunk ``i`` unless it is loaded; False if no region
        can be taken for it without evicting a chunk in ``keep`` (the one
        being read and those wanted next)."""
        if i in self._loaded:
            return True
        if not self._free:
            spare = [j for j in self._loaded if j not in keep]
            if not spare:
                return False
            # Read sequentially, a chunk the reader has left behind goes
            # first (the farthest), else the one farthest ahead; in an
            # archive, every chunk not wanted soon is as good as another.
            behind = [j for j in spare if j < i]
            old = min(behind) if behind else max(spare)
            region, fut = self._loaded.pop(old)
            try:
                fut.result()  # its read is done before the region is reused
            except SluiceError:
                pass
            self._free.append(region)
        region = self._free.pop()
        self._loaded[i] = (region, self._pool.submit(self._get, i, region))
        return True

    def _get(self, i: int, region: Any) -> None:
        c = self._m["chunks"][i]
        key = f"{self._ns}/{c['key']}"
        try:
            t = self._client.get(key, into=region, if_match=c["etag"])
        except NoSuchKey:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: chunk {key} is missing") from None
        except PreconditionFailed:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: chunk {key} was replaced since it was written") from None
        if t.bytes != c["size"]:
            raise IncompleteCheckpoint(f"checkpoint {self.path}: chunk {key} has {t.bytes} bytes, the manifest says {c['size']}")
        if self.verify and not t.verified:
            raise IntegrityError(f"checkpoint {self.path}: chunk {key} could not be verified ({t.unverified_reason})")

    def close(self) -> None:
        if self.closed:
            return
        self._pool.shutdown(wait=True)
        for region, _ in self._loaded.values():
            self._free.append(region)
        for r in self._free:
            try:
                r.release()
            except SluiceError:
                pass
        super().close()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_write(client: Any, path: str, **kw: Any) -> CheckpointWriter:
    return CheckpointWriter(client, path, **kw)


def open_read(client: Any, path: str, **kw: Any) -> io.BufferedReader:
    """A buffered reader (``torch.load`` reads small pieces at a time)."""
    return io.BufferedReader(CheckpointReader(client, path, **kw), buffer_size=1 << 20)


__all__ = [
    "BadRequest",
    "CheckpointReader",
    "CheckpointWriter",
    "DEFAULT_CHUNK_BYTES",
    "FORMAT",
    "IncompleteCheckpoint",
    "collect_garbage",
    "open_read",
    "open_write",
    "read_manifest",
]
