"""The CUDA driver, loaded at run time (nothing links CUDA at build time).

Sluice moves object bytes into GPU memory *in the process that owns it*:
the agent writes them into a pinned staging region shared with this client
(as it writes any region), and this client has the GPU's copy engines move
them from there into the tensor (``cuMemcpyHtoDAsync`` on a stream of its
own), part by part while later parts are still on the network. No daemon
maps a client's GPU memory, so a tenant can only ever fill or read memory
its own process can address: the check is CUDA's own.

Everything here goes through :class:`Driver`. :class:`LibCuda` is the real
one (``libcuda.so.1`` with ``ctypes``); :class:`HostModel` is a software
GPU whose "device memory" is host memory and whose copies happen only when
a stream or event is synchronized, so tests without a GPU run the same code
and catch a slot reused before its copy finished.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .errors import BadRequest, Unsupported

#: ``CUpointer_attribute`` values (cuda.h).
_PTR_MEMORY_TYPE = 2
_PTR_DEVICE_ORDINAL = 9
#: ``CUmemorytype``: device memory, and managed (unified) memory.
MEMORY_DEVICE = 2
MEMORY_UNIFIED = 4
#: ``CUdevice_attribute`` values (cuda.h).
ATTR_HOST_REGISTER_SUPPORTED = 99
ATTR_GPU_DIRECT_RDMA_SUPPORTED = 116
ATTR_DMA_BUF_SUPPORTED = 124
#: ``cuMemHostRegister`` flag: pinned for every context of the process.
_HOST_REGISTER_PORTABLE = 0x1
_STREAM_NON_BLOCKING = 0x1
#: ``CUevent_flags``: a thread waiting on the event sleeps until the GPU
#: signals it, instead of spinning a core (the default for streams and
#: events here, where there are fewer contexts than cores).
_EVENT_BLOCKING_SYNC = 0x1
_EVENT_DISABLE_TIMING = 0x2
_CUDA_ERROR_NOT_READY = 600


class CudaError(Unsupported):
    """A CUDA driver call failed (the message names the call and the error)."""


@dataclass(frozen=True)
class PointerInfo:
    """What CUDA says about a device address in this process."""

    memory_type: int
    device: int
    #: The allocation holding it: [base, base + size).
    base: int
    size: int


class Driver:
    """The CUDA calls Sluice makes. Addresses are ints; handles are opaque."""

    name = "abstract"

    def device_count(self) -> int:
        raise NotImplementedError

    def device_name(self, device: int) -> str:
        raise NotImplementedError

    def attribute(self, device: int, attr: int) -> int:
        raise NotImplementedError

    def pointer_info(self, ptr: int) -> PointerInfo:
        """Raises :class:`BadRequest` for an address CUDA does not know here
        (another process's, freed, or never allocated)."""
        raise NotImplementedError

    def use(self, device: int) -> None:
        """Makes ``device``'s primary context current on this thread."""
        raise NotImplementedError

    def context_active(self, device: int) -> bool:
        """Whether the process already uses ``device`` (its primary context
        is active): pinning then costs no new context."""
        raise NotImplementedError

    def host_register(self, addr: int, nbytes: int) -> None:
        raise NotImplementedError

    def host_unregister(self, addr: int) -> None:
        raise NotImplementedError

    def stream(self) -> int:
        raise NotImplementedError

    def event(self) -> int:
        raise NotImplementedError

    def htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        raise NotImplementedError

    def dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        raise NotImplementedError

    def record(self, event: int, stream: int) -> None:
        raise NotImplementedError

    def wait_event(self, event: int) -> None:
        raise NotImplementedError

    def stream_wait(self, stream: int, event: int) -> None:
        """Makes later work on ``stream`` wait, on the GPU (the host does not
        block), until ``event`` has happened."""
        raise NotImplementedError

    def synchronize(self, stream: int) -> None:
        raise NotImplementedError

    def destroy_stream(self, stream: int) -> None:
        raise NotImplementedError

    def destroy_event(self, event: int) -> None:
        raise NotImplementedError


class LibCuda(Driver):
    """``libcuda.so.1`` through ``ctypes`` (the driver API: no runtime, no
    toolkit needed, works beside torch, cupy or anything else in-process)."""

    name = "cuda"

    def __init__(self, path: Optional[str] = None) -> None:
        path = path or os.environ.get("SLUICE_LIBCUDA", "libcuda.so.1")
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise Unsupported(f"GPU memory needs the CUDA driver ({path}): {e}") from None
        self._ctx: Dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()
        #: stream -> the blocking event :meth:`synchronize` waits on.
        self._sync_events: Dict[int, int] = {}
        self._call("cuInit", ctypes.c_uint(0))

    def _call(self, name: str, *args: object) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise CudaError(f"the CUDA driver has no {name} (driver too old?)")
        fn.restype = ctypes.c_int
        rc = fn(*args)
        if rc != 0:
            raise CudaError(f"{name} failed: {self._error_name(rc)}")

    def _error_name(self, rc: int) -> str:
        s = ctypes.c_char_p()
        try:
            self._lib.cuGetErrorName(ctypes.c_int(rc), ctypes.byref(s))
        except AttributeError:
            pass
        return f"{s.value.decode() if s.value else 'CUDA error'} ({rc})"

    def device_count(self) -> int:
        n = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def _device(self, ordinal: int) -> ctypes.c_int:
        d = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(d), ctypes.c_int(ordinal))
        return d

    def device_name(self, device: int) -> str:
        buf = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", buf, ctypes.c_int(256), self._device(device))
        return buf.value.decode(errors="replace")

    def attribute(self, device: int, attr: int) -> int:
        v = ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(v), ctypes.c_int(attr), self._device(device))
        return v.value

    def pointer_info(self, ptr: int) -> PointerInfo:
        mtype, ordinal = ctypes.c_uint(0), ctypes.c_int(-1)
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        try:
            self._call("cuPointerGetAttribute", ctypes.byref(mtype), ctypes.c_int(_PTR_MEMORY_TYPE), ctypes.c_uint64(ptr))
            self._call(
                "cuPointerGetAttribute", ctypes.byref(ordinal), ctypes.c_int(_PTR_DEVICE_ORDINAL), ctypes.c_uint64(ptr)
            )
            self.use(ordinal.value)
            self._call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        except CudaError as e:
            raise BadRequest(
                f"address {ptr:#x} is not GPU memory of this process ({e}): another process's, freed, or never allocated"
            ) from None
        return PointerInfo(mtype.value, ordinal.value, base.value, size.value)

    def use(self, device: int) -> None:
        with self._lock:
            ctx = self._ctx.get(device)
            if ctx is None:
                ctx = ctypes.c_void_p()
                self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self._device(device))
                self._ctx[device] = ctx
        self._call("cuCtxSetCurrent", ctx)

    def context_active(self, device: int) -> bool:
        flags, active = ctypes.c_uint(), ctypes.c_int()
        self._call("cuDevicePrimaryCtxGetState", self._device(device), ctypes.byref(flags), ctypes.byref(active))
        return bool(active.value)

    def host_register(self, addr: int, nbytes: int) -> None:
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), ctypes.c_uint(_HOST_REGISTER_PORTABLE))

    def host_unregister(self, addr: int) -> None:
        self._call("cuMemHostUnregister", ctypes.c_void_p(addr))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(s), ctypes.c_uint(_STREAM_NON_BLOCKING))
        return s.value or 0

    def event(self) -> int:
        # Waited on with the thread asleep: a copy of tens of MiB takes
        # milliseconds, and spinning for them is host CPU a loader pays.
        e = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(e), ctypes.c_uint(_EVENT_DISABLE_TIMING | _EVENT_BLOCKING_SYNC))
        return e.value or 0

    def htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call(
            "cuMemcpyHtoDAsync_v2", ctypes.c_uint64(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
            ctypes.c_void_p(stream),
        )

    def dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._call(
            "cuMemcpyDtoHAsync_v2", ctypes.c_void_p(dst), ctypes.c_uint64(src), ctypes.c_size_t(nbytes),
            ctypes.c_void_p(stream),
        )

    def record(self, event: int, stream: int) -> None:
        self._call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def wait_event(self, event: int) -> None:
        self._call("cuEventSynchronize", ctypes.c_void_p(event))

    def stream_wait(self, stream: int, event: int) -> None:
        self._call("cuStreamWaitEvent", ctypes.c_void_p(stream), ctypes.c_void_p(event), ctypes.c_uint(0))

    def synchronize(self, stream: int) -> None:
        # Through a blocking event, not cuStreamSynchronize: that spins the
        # calling thread for as long as the stream's copies take.
        with self._lock:
            ev = self._sync_events.get(stream)
        if ev is None:
            mine = self.event()
            with self._lock:
                ev = self._sync_events.setdefault(stream, mine)
            if ev != mine:  # another thread made one first
                self.destroy_event(mine)
        self.record(ev, stream)
        self.wait_event(ev)

    def destroy_stream(self, stream: int) -> None:
        with self._lock:
            ev = self._sync_events.pop(stream, None)
        if ev is not None:
            self.destroy_event(ev)
        self._call("cuStreamDestroy_v2", ctypes.c_void_p(stream))

    def destroy_event(self, event: int) -> None:
        self._call("cuEventDestroy_v2", ctypes.c_void_p(event))


class HostModel(Driver):
    """A software GPU for tests: device memory is host memory it allocates
    (:meth:`alloc`), copies are queued per stream and happen only when the
    stream or a later event is synchronized, and it records what was
    pinned and whether any copy came from unpinned memory."""

    name = "host-model"

    def __init__(self, devices: int = 1) -> None:
        self._devices = devices
        self._allocs: Dict[int, Tuple[int, "ctypes.Array[ctypes.c_char]"]] = {}  # base -> (device, buffer)
        self._pinned: Dict[int, int] = {}  # addr -> nbytes
        self._streams: Dict[int, List[Tuple[str, int, int, int]]] = {}
        self._events: Dict[int, Tuple[int, int]] = {}  # event -> (stream, queue position)
        self._next = 1
        self._lock = threading.Lock()
        self.current: Optional[int] = None
        self.copies = 0
        self.unpinned_copies = 0
        #: cuStreamWaitEvent calls: a lane's copies ordered after other work.
        self.stream_waits = 0
        self.active: Dict[int, bool] = {d: True for d in range(devices)}

    # -- the model's own API --
    def alloc(self, nbytes: int, device: int = 0) -> int:
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        addr = ctypes.addressof(buf)
        self._allocs[addr] = (device, buf)
        return addr

    def free(self, ptr: int) -> None:
        del self._allocs[ptr]

    def read(self, ptr: int, nbytes: int) -> bytes:
        self._find(ptr, nbytes)
        return ctypes.string_at(ptr, nbytes)

    def write(self, ptr: int, data: bytes) -> None:
        self._find(ptr, len(data))
        ctypes.memmove(ptr, data, len(data))

    def pinned(self) -> Dict[int, int]:
        return dict(self._pinned)

    def _find(self, ptr: int, nbytes: int = 1) -> Tuple[int, int, int]:
        for base, (dev, buf) in self._allocs.items():
            if base <= ptr and ptr + nbytes <= base + len(buf):
                return base, len(buf), dev
        raise BadRequest(f"address {ptr:#x} is not GPU memory of this process (model): freed or never allocated")

    def _is_pinned(self, addr: int, nbytes: int) -> bool:
        return any(a <= addr and addr + nbytes <= a + n for a, n in self._pinned.items())

    # -- Driver --
    def device_count(self) -> int:
        return self._devices

    def device_name(self, device: int) -> str:
        return f"host model GPU {device}"

    def attribute(self, device: int, attr: int) -> int:
        return 1 if attr in (ATTR_HOST_REGISTER_SUPPORTED, ATTR_DMA_BUF_SUPPORTED) else 0

    def pointer_info(self, ptr: int) -> PointerInfo:
        base, size, dev = self._find(ptr)
        return PointerInfo(MEMORY_DEVICE, dev, base, size)

    def use(self, device: int) -> None:
        if not 0 <= device < self._devices:
            raise CudaError(f"cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE (model has {self._devices})")
        self.current = device

    def context_active(self, device: int) -> bool:
        return self.active.get(device, False)

    def host_register(self, addr: int, nbytes: int) -> None:
        if self._is_pinned(addr, nbytes):
            raise CudaError("cuMemHostRegister_v2 failed: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712)")
        self._pinned[addr] = nbytes

    def host_unregister(self, addr: int) -> None:
        if self._pinned.pop(addr, None) is None:
            raise CudaError("cuMemHostUnregister failed: CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (713)")

    def stream(self) -> int:
        with self._lock:
            s, self._next = self._next, self._next + 1
            self._streams[s] = []
            return s

    def event(self) -> int:
        with self._lock:
            e, self._next = self._next, self._next + 1
            self._events[e] = (0, 0)
            return e

    def _queue(self, kind: str, dst: int, src: int, nbytes: int, stream: int) -> None:
        if self.current is None:
            raise CudaError("no current context (cuCtxSetCurrent was not called on this thread)")
        host = src if kind == "htod" else dst
        dev = dst if kind == "htod" else src
        self._find(dev, nbytes)
        if not self._is_pinned(host, nbytes):
            self.unpinned_copies += 1
        with self._lock:
            self._streams[stream].append((kind, dst, src, nbytes))

    def htod(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._queue("htod", dst, src, nbytes, stream)

    def dtoh(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._queue("dtoh", dst, src, nbytes, stream)

    def _run(self, stream: int, upto: int) -> None:
        with self._lock:
            q = self._streams[stream]
            todo, self._streams[stream] = q[:upto], q[upto:]
            # Events recorded later on this stream now sit earlier in it.
            for e, (s, pos) in self._events.items():
                if s == stream:
                    self._events[e] = (s, max(0, pos - upto))
        for kind, dst, src, nbytes in todo:
            ctypes.memmove(dst, src, nbytes)
            self.copies += 1

    def record(self, event: int, stream: int) -> None:
        with self._lock:
            # A stream the model did not make (a caller's, e.g. torch's
            # legacy default stream) has nothing queued in it.
            q = self._streams.get(stream)
            self._events[event] = (stream if q is not None else 0, len(q) if q is not None else 0)

    def wait_event(self, event: int) -> None:
        stream, pos = self._events[event]
        if stream:
            self._run(stream, pos)

    def stream_wait(self, stream: int, event: int) -> None:
        # Copies run only at a synchronize here, in queue order: the work
        # before the event is run now, so it lands before anything queued
        # on ``stream`` from here on.
        self.stream_waits += 1
        self.wait_event(event)

    def synchronize(self, stream: int) -> None:
        self._run(stream, len(self._streams[stream]))

    def destroy_stream(self, stream: int) -> None:
        self.synchronize(stream)
        del self._streams[stream]

    def destroy_event(self, event: int) -> None:
        self._events.pop(event, None)


_DRIVER: Optional[Driver] = None
_DRIVER_LOCK = threading.Lock()


def driver() -> Driver:
    """The process's CUDA driver, loaded on first use; raises
    :class:`~sluice.Unsupported` where there is none."""
    global _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            _DRIVER = LibCuda()
        return _DRIVER


def try_driver() -> Optional[Driver]:
    """The driver if CUDA is usable here, else None (never raises)."""
    try:
        d = driver()
        return d if d.device_count() > 0 else None
    except Unsupported:
        return None
