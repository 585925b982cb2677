"""GPU memory as a place GETs land and PUTs read from.

A :class:`GpuRegion` names GPU memory of this process: a torch CUDA tensor,
anything with ``__cuda_array_interface__`` (cupy, numba) or a CUDA DLPack
capsule, or a raw device address. Nothing about it is sent to the shim.
The bytes go through *staging lanes*: pinned shared-memory regions the
client registers with the shim once (``cudaHostRegister``-ed once), each
split in two halves. A GET reads the object half by half into a lane (the
agent writes there as into any region; the parts after the first are pinned
to the first's ETag) while the GPU's copy engine moves the previous half
into the tensor, so the network and the copies overlap and the CPU copies
no object byte. A PUT copies from the tensor into a lane (or, larger than a
lane, into a pinned region of its own) and stores it from there.

Why in this process and not in a daemon: the copy runs in the CUDA context
of the memory's owner, so a tenant can fill or read only memory its own
process can address (CUDA checks that), and no daemon holds a mapping of a
client's GPU memory that a dead client would leave behind.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .cuda import MEMORY_DEVICE, MEMORY_UNIFIED, Driver
from .errors import BadRequest, RegionReleased, RegionTooSmall, SluiceError, TransferFailed

#: Bytes of pinned staging a client keeps in all (lanes are made on demand).
DEFAULT_STAGING_BYTES = 256 << 20
#: Bytes of one lane (two halves): how much of an object is on its way to
#: the GPU at once per request. 2 x 16 MiB: two agent parts per half.
DEFAULT_LANE_BYTES = 32 << 20

#: DLPack device type of CUDA memory (dlpack.h ``kDLCUDA``), and managed.
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13


class GpuRegion:
    """GPU memory of this process that ``get``/``get_many``/``put`` can use
    as a region. Made by :meth:`sluice.Client.register_gpu`; keeps the object
    it came from alive. ``release()`` (or leaving a ``with`` block) ends its
    use; nothing is registered with the shim, so there is nothing to leak."""

    __slots__ = ("ptr", "nbytes", "device", "_keep", "_producer", "_released", "_busy", "_idle", "__weakref__")

    def __init__(
        self, ptr: int, nbytes: int, device: int, keep: Any = None, producer: Optional[Callable[[], Optional[int]]] = None
    ) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.device = device
        self._keep = keep
        #: The stream (a CUDA handle) whose queued work on this memory must
        #: come before the client's copies, asked at each transfer: torch's
        #: current stream for a torch tensor, the ``__cuda_array_interface__``
        #: ``stream`` for an array that names one; None: nothing to wait for.
        self._producer = producer
        self._released = False
        self._busy = 0  # transfers using it now
        self._idle = threading.Condition()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Ends its use. A transfer using it stops at its next part
        (RegionReleased) and its copies already queued finish first: only
        then is the memory's owner let go (a tensor freed with a copy still
        on its way would have bytes written into memory reused by another)."""
        with self._idle:
            self._released = True
            while self._busy:
                self._idle.wait()
            self._keep = None

    def _enter(self) -> None:
        with self._idle:
            if self._released:
                raise RegionReleased("this GPU region was released")
            self._busy += 1

    def _leave(self) -> None:
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def _check(self, offset: int, length: int) -> int:
        if self._released:
            raise RegionReleased("this GPU region was released")
        if offset < 0 or length < 0 or offset + length > self.nbytes:
            raise BadRequest(f"window {offset}+{length} outside GPU region of {self.nbytes} bytes")
        return self.ptr + offset

    def __enter__(self) -> "GpuRegion":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<sluice.GpuRegion cuda:{self.device} {self.ptr:#x} {self.nbytes} bytes{' released' if self._released else ''}>"


def describe(obj: Any, nbytes: Optional[int] = None, device: Optional[int] = None) -> Tuple[int, int, int, Any]:
    """(address, bytes, device ordinal, object to keep alive) of GPU memory:
    a torch CUDA tensor, ``__cuda_array_interface__``, a CUDA DLPack
    producer, or an int address with ``nbytes`` (and ``device``)."""
    if isinstance(obj, bool):
        raise TypeError("register_gpu() takes a CUDA tensor or array, or an address with nbytes=")
    if isinstance(obj, int):
        if nbytes is None:
            raise TypeError("register_gpu(address) needs nbytes=")
        return obj, nbytes, -1 if device is None else device, None
    if type(obj).__module__.startswith("torch") and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            raise BadRequest("this torch tensor is not on a CUDA device (register() host memory instead)")
        if not obj.is_contiguous():
            raise BadRequest("the tensor is not contiguous: bytes land in one span (call .contiguous())")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj.device.index or 0, obj
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(cai, obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj)
    raise TypeError(
        f"register_gpu() takes a torch CUDA tensor, an object with __cuda_array_interface__ or __dlpack__, "
        f"or an address with nbytes=, not {type(obj).__name__}"
    )


def _itemsize(typestr: str) -> int:
    try:
        return int(typestr[2:])
    except ValueError:
        raise BadRequest(f"unknown __cuda_array_interface__ typestr {typestr!r}") from None


def _from_cai(cai: Dict[str, Any], obj: Any) -> Tuple[int, int, int, Any]:
    ptr, _readonly = cai["data"]
    shape = tuple(cai["shape"])
    item = _itemsize(cai["typestr"])
    count = 1
    for s in shape:
        count *= s
    strides = cai.get("strides")
    if strides is not None:
        expect, want = item, []
        for s in reversed(shape):
            want.append(expect)
            expect *= s
        if tuple(strides) != tuple(reversed(want)) and count > 1:
            raise BadRequest("the array is not C-contiguous: bytes land in one span")
    return ptr, count * item, -1, obj


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _from_dlpack(obj: Any) -> Tuple[int, int, int, Any]:
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise BadRequest(f"the DLPack tensor is on device type {int(dev_type)}, not CUDA")
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # A DLManagedTensor starts with its DLTensor; the capsule stays
    # unconsumed (its producer frees it), and `obj` is kept alive.
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    count = 1
    for i in range(t.ndim):
        count *= t.shape[i]
    if t.strides and count > 1:
        expect = 1
        for i in reversed(range(t.ndim)):
            if t.shape[i] != 1 and t.strides[i] != expect:
                raise BadRequest("the DLPack tensor is not contiguous: bytes land in one span")
            expect *= t.shape[i]
    item = (t.dtype.bits * t.dtype.lanes + 7) // 8
    return (t.data or 0) + t.byte_offset, count * item, int(dev_id), (obj, capsule)


def validate(driver: Driver, obj: Any, nbytes: Optional[int], device: Optional[int]) -> GpuRegion:
    """A :class:`GpuRegion` for ``obj``, checked with CUDA itself: the span
    must lie inside one live device allocation of this process (another
    process's address, freed memory or host memory are refused)."""
    ptr, n, dev, keep = describe(obj, nbytes, device)
    if n <= 0:
        raise BadRequest("a GPU region needs at least one byte")
    info = driver.pointer_info(ptr)
    if info.memory_type not in (MEMORY_DEVICE, MEMORY_UNIFIED):
        raise BadRequest(f"address {ptr:#x} is host memory, not GPU memory (register() it as a host region)")
    if dev not in (-1, info.device):
        raise BadRequest(f"the memory is on cuda:{info.device}, not cuda:{dev} as described")
    if ptr + n > info.base + info.size:
        raise BadRequest(
            f"{n} bytes at {ptr:#x} run past the end of their allocation ({info.size} bytes at {info.base:#x})"
        )
    return GpuRegion(ptr, n, info.device, keep, _producer_of(obj, info.device))


def _producer_of(obj: Any, device: int) -> Optional[Callable[[], Optional[int]]]:
    """How to find the stream whose work on ``obj`` the client's copies must
    follow. The lanes' streams do not synchronize with any other (they are
    non-blocking), so without this a kernel still writing a tensor (or the
    caching allocator's reuse of a block a kernel still uses) could land
    after, or under, the bytes a GET put there, and a PUT could store bytes
    a kernel has not finished writing."""
    if type(obj).__module__.startswith("torch") and hasattr(obj, "is_cuda"):
        import torch

        return lambda: torch.cuda.current_stream(device).cuda_stream
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        # v3: None = no synchronization needed; 1 = the legacy default
        # stream and 2 = the per-thread one (CU_STREAM_LEGACY and
        # CU_STREAM_PER_THREAD in the driver API); otherwise a stream.
        stream = cai.get("stream")
        if isinstance(stream, int) and not isinstance(stream, bool) and stream > 0:
            return lambda: stream
    return None


class Lane:
    """A pinned staging region in two halves, with a stream and an event per
    half (a half is refilled only once its last copy is done)."""

    def __init__(self, region: Any, addr: int, nbytes: int, stream: int, events: List[int], order: int = 0) -> None:
        self.region = region
        self.addr = addr
        self.half = nbytes // 2
        self.stream = stream
        self.events = events
        #: Recorded on a producer's stream for this lane's stream to wait on.
        self.order = order
        self.pending = [False, False]
        #: Copies may be queued on the stream since the last drain.
        self.busy = False

    def wait(self, driver: Driver, half: int) -> None:
        if self.pending[half]:
            driver.wait_event(self.events[half])
            self.pending[half] = False

    def queued(self) -> None:
        """Copies are about to be queued on the lane's stream."""
        self.busy = True

    def after(self, driver: Driver, gr: "GpuRegion") -> None:
        """Orders the copies queued from here on after the work queued so
        far on ``gr``'s producer stream (on the GPU: the host does not wait)."""
        stream = gr._producer() if gr._producer is not None else None
        if stream is None or not self.order:
            return
        driver.record(self.order, stream)
        driver.stream_wait(self.stream, self.order)

    def copied(self, driver: Driver, half: int) -> None:
        driver.record(self.events[half], self.stream)
        self.pending[half] = True
        self.busy = True

    def drain(self, driver: Driver) -> None:
        """Waits for every copy queued on the lane's stream (nothing to wait
        for, no CUDA call: a lane is drained by its request, then again as
        it is given back)."""
        if self.busy:
            driver.synchronize(self.stream)
        self.pending = [False, False]
        self.busy = False


class Staging:
    """The lanes of one client for one device, made on demand up to a byte
    budget; a request holds one lane for its duration."""

    def __init__(self, driver: Driver, device: int, budget: int, lane_bytes: int) -> None:
        self.driver, self.device = driver, device
        self.lane_bytes = max(2 << 20, lane_bytes) & ~4095
        self.max_lanes = max(1, budget // self.lane_bytes)
        self.free: List[Lane] = []
        self.count = 0
        self.cond = threading.Condition()
        self.lanes: List[Lane] = []

    def take_or_reserve(self) -> Optional[Lane]:
        """A free lane, or None after reserving room for a new one (the
        caller registers it); waits while all lanes are in use."""
        with self.cond:
            while True:
                if self.free:
                    return self.free.pop()
                if self.count < self.max_lanes:
                    self.count += 1
                    return None
                self.cond.wait()

    def try_take_or_reserve(self) -> Tuple[bool, Optional[Lane]]:
        """As :meth:`take_or_reserve` without waiting: (False, None) when
        every lane is in use and no more may be made. For a request that
        wants extra lanes beside the one it holds: waiting for one would
        deadlock if the holders are its own siblings."""
        with self.cond:
            if self.free:
                return True, self.free.pop()
            if self.count < self.max_lanes:
                self.count += 1
                return True, None
            return False, None

    def add(self, lane: Lane) -> None:
        with self.cond:
            self.lanes.append(lane)

    def unreserve(self) -> None:
        with self.cond:
            self.count -= 1
            self.cond.notify()

    def give(self, lane: Lane) -> None:
        with self.cond:
            self.free.append(lane)
            self.cond.notify()


@dataclass
class GpuTransferTotals:
    """What a transfer through the lanes did (merged into its Transfer)."""

    parts: int = 0
    copies: int = 0


def _check_bytes(got: int, want: int, what: str) -> None:
    if got != want:
        raise TransferFailed(f"{what}: {got} bytes arrived where {want} were expected; nothing more was copied")


__all__ = [
    "DEFAULT_LANE_BYTES",
    "DEFAULT_STAGING_BYTES",
    "GpuRegion",
    "GpuTransferTotals",
    "Lane",
    "RegionTooSmall",
    "SluiceError",
    "Staging",
    "describe",
    "validate",
]
