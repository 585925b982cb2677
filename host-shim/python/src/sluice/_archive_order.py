"""Where ``torch.load`` reads next in a ``torch.save`` archive.

``torch.save`` writes a zip whose records are stored in name order
(``data.pkl``, ``data/0``, ``data/1``, ``data/10``, ``data/100``, ...,
``data/2``, ...), while ``torch.load`` reads the tensors' records in number
order, as its unpickler meets them. Read in file order, a state dict of a
few hundred tensors is read all over the file, and a reader that keeps two
or three chunks of it in memory fetches most chunks several times. The
archive's central directory says where every record is, so the checkpoint
reader can fetch ahead in the order the records will be asked for.
"""

from __future__ import annotations

import bisect
import io
import itertools
import re
import zipfile
from typing import Callable, Iterator, List, Optional, Tuple

from .errors import SluiceError

#: A zip's first bytes (a local file header).
ZIP_MAGIC = b"PK\x03\x04"
#: Most bytes a record's local header may take beyond its fixed 30 bytes and
#: its name (torch pads the extra field to align the data to 64 bytes).
_LOCAL_EXTRA_MAX = 4 + 64

#: Most bytes of directory kept (about 100 bytes per record).
MAX_TAIL_BYTES = 4 << 20

_STORAGE = re.compile(r"(?:^|/)data/(\d+)$")


class SeekableReader(io.RawIOBase):
    """A read-only, seekable raw file of ``_size`` bytes, at ``_pos``:
    subclasses provide ``readinto``."""

    _size = 0
    _pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError(f"seek to {pos}, before the start")
        self._pos = pos
        return pos


class _At(SeekableReader):
    """A file over ``read_at(pos, n)``, for :mod:`zipfile`."""

    def __init__(self, read_at: Callable[[int, int], bytes], size: int) -> None:
        super().__init__()
        self._read_at, self._size, self._pos = read_at, size, 0

    def readinto(self, b: "bytearray") -> int:  # type: ignore[override]
        data = self._read_at(self._pos, min(len(b), max(0, self._size - self._pos)))
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


class ArchiveOrder:
    """The byte spans of an archive's records, in the order ``torch.load``
    reads them: ``data.pkl`` first, then the tensors' records by number."""

    def __init__(self, spans: List[Tuple[int, int]], tail_start: int = 0, tail: bytes = b"") -> None:
        self.spans = spans
        #: The archive's directory (and end record) from ``tail_start`` on,
        #: kept: torch.load reads it again, and it need not cost a chunk.
        self.tail_start, self.tail = (tail_start, tail) if tail else (-1, b"")
        placed = sorted((start, end, rank) for rank, (start, end) in enumerate(spans))
        self._starts = [s for s, _, _ in placed]
        self._placed = placed

    @classmethod
    def of(cls, read_at: Callable[[int, int], bytes], size: int) -> Optional["ArchiveOrder"]:
        """The order of the ``torch.save`` archive read by ``read_at``, or
        None if it is not one (not a zip, or no tensor records)."""
        if size < 22 or read_at(0, 4) != ZIP_MAGIC:
            return None
        try:
            with zipfile.ZipFile(io.BufferedReader(_At(read_at, size), 1 << 16)) as z:
                infos = z.infolist()
                tail_start = int(getattr(z, "start_dir", size))
        except SluiceError:
            raise  # a chunk that could not be read: the reader's error
        except Exception:  # noqa: BLE001 - any malformed archive: read it in file order
            return None
        pickle: List[Tuple[int, int]] = []
        storages: List[Tuple[int, Tuple[int, int]]] = []
        for info in infos:
            end = info.header_offset + 30 + len(info.filename.encode()) + _LOCAL_EXTRA_MAX + info.compress_size
            span = (info.header_offset, min(end, size))
            m = _STORAGE.search(info.filename)
            if m:
                storages.append((int(m.group(1)), span))
            elif info.filename.endswith("data.pkl"):
                pickle.append(span)
        if not storages:
            return None
        tail = read_at(tail_start, size - tail_start) if 0 <= size - tail_start <= MAX_TAIL_BYTES else b""
        return cls(pickle + [span for _, span in sorted(storages)], tail_start, tail)

    def after(self, pos: int) -> Iterator[Tuple[int, int]]:
        """The spans ``torch.load`` reads from byte ``pos`` on: the rest of
        the record holding it, then the records read after that one (none
        if ``pos`` is in no record: the zip's directory)."""
        k = bisect.bisect_right(self._starts, pos) - 1
        if k < 0:
            return
        start, end, rank = self._placed[k]
        if pos >= end:
            return
        yield pos, end
        yield from itertools.islice(self.spans, rank + 1, None)
