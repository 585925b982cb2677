"""The client operations on GPU regions (see gpu.py for how bytes move).

Written as the other operations are (generators yielding batches of shim
calls, see _core.py), so the blocking client drives them; they also make
CUDA calls, which wait only for copy engines (milliseconds).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import gpu
from .cuda import Driver, driver as default_driver
from .errors import RegionTooSmall, SluiceError, Unsupported
from .region import Region
from .types import ByteRange, ItemResult, Transfer

if TYPE_CHECKING:  # pragma: no cover
    from ._core import Op

#: ``pin_regions`` modes: pin host regions for CUDA at registration.
PIN_AUTO, PIN_ALWAYS, PIN_NEVER = "auto", "always", "never"


def _addr(region: Region) -> int:
    """The address of a region's mapping (the ctypes view is dropped at
    once: a live export would keep the mapping from ever closing)."""
    view = (ctypes.c_char * 1).from_buffer(region._map())
    try:
        return ctypes.addressof(view)
    finally:
        del view


class GpuOps:
    """Mixed into the core client: GPU regions, staging lanes, pinning."""

    def _init_gpu(self, cuda: Optional[Driver], staging_bytes: int, lane_bytes: int, pin_regions: str) -> None:
        if pin_regions not in (PIN_AUTO, PIN_ALWAYS, PIN_NEVER):
            raise ValueError("pin_regions must be 'auto', 'always' or 'never'")
        if os.environ.get("SLUICE_PIN_REGIONS") == "0":
            pin_regions = PIN_NEVER
        self._cuda = cuda
        self._staging_bytes = staging_bytes
        self._lane_bytes = lane_bytes
        self._pin_mode = pin_regions
        self._stagings: Dict[int, gpu.Staging] = {}
        self._pinned: Dict[str, int] = {}  # region id -> pinned address

    def _driver(self) -> Driver:
        if self._cuda is None:
            self._cuda = default_driver()
        return self._cuda

    # ------------------------------------------------------------ pinning --
    def _maybe_pin(self, region: Region) -> None:
        """Pins a new host region for CUDA once (``pin_regions``): "auto"
        when this process already uses CUDA (a loader's ``.cuda()`` after a
        read then runs at pinned speed, with no new context made here),
        "always" (initialises CUDA), "never"."""
        if self._pin_mode == PIN_NEVER:
            return
        try:
            d = self._driver()
            if self._pin_mode == PIN_AUTO and not d.context_active(0):
                return
            d.use(0)
            addr = _addr(region)
            d.host_register(addr, region.nbytes)
        except Unsupported:
            if self._pin_mode == PIN_ALWAYS:
                raise
            return
        self._pinned[region.id] = addr

    def _unpin(self, region: Region) -> None:
        """Before the region is unmapped: pages must not be unmapped pinned."""
        addr = self._pinned.pop(region.id, None)
        if addr is not None and self._cuda is not None:
            try:
                self._cuda.host_unregister(addr)
            except SluiceError:
                pass

    def pinned(self, region: Region) -> bool:
        """Whether ``region`` is pinned for CUDA."""
        return region.id in self._pinned

    # -------------------------------------------------------------- lanes --
    def _lane_op(self, device: int) -> "Op[Tuple[gpu.Staging, gpu.Lane]]":
        got = yield from self._lane_try_op(device, wait=True)
        assert got is not None
        return got

    def _lane_try_op(self, device: int, wait: bool) -> "Op[Optional[Tuple[gpu.Staging, gpu.Lane]]]":
        """A lane of ``device``'s staging: a free one, else a new one while
        the budget allows; else waits for one (``wait``) or gives None."""
        d = self._driver()
        st = self._stagings.get(device)
        if st is None:
            st = self._stagings.setdefault(device, gpu.Staging(d, device, self._staging_bytes, self._lane_bytes))
        if wait:
            lane = st.take_or_reserve()
        else:
            ok, lane = st.try_take_or_reserve()
            if not ok:
                return None
        if lane is not None:
            if lane.busy:
                # Its last drain failed: copies may still be queued on it.
                # Drained before any byte lands in it again, or this
                # request fails with the driver's error.
                try:
                    d.use(device)
                    lane.drain(d)
                except BaseException:
                    st.give(lane)
                    raise
            return st, lane
        try:
            # A lane is a region like any other (the agent writes into it),
            # registered and pinned once for the life of the client.
            region = yield from self._register_op(st.lane_bytes, pin=False)  # type: ignore[attr-defined]
        except BaseException:
            st.unreserve()
            raise
        try:
            d.use(device)
            addr = _addr(region)
            d.host_register(addr, region.nbytes)
            self._pinned[region.id] = addr
            lane = gpu.Lane(region, addr, region.nbytes, d.stream(), [d.event(), d.event()], d.event())
        except BaseException:
            self._release_later(region)  # type: ignore[attr-defined]
            st.unreserve()
            raise
        st.add(lane)
        return st, lane

    def _close_gpu(self) -> None:
        """Drains every lane (copies in flight finish before the memory goes)."""
        for st in self._stagings.values():
            for lane in st.lanes:
                try:
                    st.driver.use(st.device)
                    lane.drain(st.driver)
                    st.driver.destroy_stream(lane.stream)
                    for e in lane.events:
                        st.driver.destroy_event(e)
                except SluiceError:
                    pass
                self._unpin(lane.region)
        self._stagings.clear()

    # ---------------------------------------------------------- transfers --
    def _gpu_get_op(
        self,
        path: str,
        gr: gpu.GpuRegion,
        offset: int,
        rng: Optional[Dict[str, Any]],
        if_match: str,
        request_id: str,
        max_bytes: Optional[int] = None,
    ) -> "Op[Transfer]":
        """Reads into ``gr`` at ``offset``, at most ``max_bytes`` (default:
        to the region's end); a bigger object writes nothing (RegionTooSmall)."""

        gr._check(offset, 0)
        gr._enter()
        try:
            return (yield from self._gpu_get_in(path, gr, offset, rng, if_match, request_id, max_bytes))
        finally:
            gr._leave()

    def _gpu_get_in(
        self,
        path: str,
        gr: gpu.GpuRegion,
        offset: int,
        rng: Optional[Dict[str, Any]],
        if_match: str,
        request_id: str,
        max_bytes: Optional[int],
    ) -> "Op[Transfer]":
        st, lane = yield from self._lane_op(gr.device)
        try:
            return (yield from self._gpu_get_lane(st, lane, path, gr, offset, rng, if_match, request_id, max_bytes))
        finally:
            self._give_lane(st, lane)

    def _gpu_get_lane(
        self,
        st: gpu.Staging,
        lane: gpu.Lane,
        path: str,
        gr: gpu.GpuRegion,
        offset: int,
        rng: Optional[Dict[str, Any]],
        if_match: str,
        request_id: str,
        max_bytes: Optional[int],
    ) -> "Op[Transfer]":
        """One object (or range) into ``gr`` through ``lane``, which the
        caller holds: the first read fills the whole lane, then half by
        half, each half copied to the GPU while the next is read.

        The first read asks for a whole lane, not a half, so that an object
        no bigger than a lane is one whole-object GET, which the agent
        checks end to end against its stored CRC64NVME (``verified``); a
        bigger one is read in ranges and says so (``unverified_reason``)."""
        from ._core import Call, _span, one

        d = st.driver
        d.use(gr.device)
        start = rng["start"] if rng else 0
        want = rng["length"] if rng else None
        first_len = 2 * lane.half if want is None else min(2 * lane.half, want)
        # The first read tells the object's size and version; nothing
        # reaches GPU memory until the whole span is known to fit.
        fields = {
            "path": path,
            "range": {"start": start, "length": first_len},
            "region_id": lane.region.id,
            "offset": 0,
            "if_match": if_match,
        }
        r = yield from one(Call("get", fields, request_id=request_id), "get")
        first = Transfer._from_wire(r.body["report"], r.body["etag"], r.body["object_size"])
        total = _span(first.object_size, rng)
        room = gr.nbytes - offset if max_bytes is None else min(max_bytes, gr.nbytes - offset)
        if total > room:
            e = RegionTooSmall(
                f"{total} bytes do not fit the {room} bytes of the GPU region ({gr.nbytes} bytes) at offset "
                f"{offset}; nothing was written",
                request_id=first.request_id,
            )
            e.needed_bytes = total
            raise e
        gpu._check_bytes(first.bytes, min(first_len, total), "the first part")
        parts, half = first.parts, 0
        # Copied half by half, each with its own event: the next read into
        # half 0 waits only for half 0's copy. Every copy into the memory
        # comes after the work its owner had queued on it.
        dst = gr._check(offset, first.bytes) if first.bytes else 0
        lane.after(d, gr)
        for h in (0, 1):
            n = min(lane.half, first.bytes - h * lane.half)
            if n > 0:
                lane.queued()
                d.htod(dst + h * lane.half, lane.addr + h * lane.half, n, lane.stream)
                lane.copied(d, h)
                half = h
        done = first.bytes
        while done < total:
            half ^= 1
            n = min(lane.half, total - done)
            lane.wait(d, half)  # its previous copy is finished
            fields = {
                "path": path,
                "range": {"start": start + done, "length": n},
                "region_id": lane.region.id,
                "offset": half * lane.half,
                "if_match": first.etag,
            }
            r = yield from one(Call("get", fields, request_id=request_id), "get")
            t = Transfer._from_wire(r.body["report"], r.body["etag"], r.body["object_size"])
            gpu._check_bytes(t.bytes, n, f"bytes {start + done}-{start + done + n - 1}")
            lane.queued()
            d.htod(gr._check(offset + done, n), lane.addr + half * lane.half, n, lane.stream)
            lane.copied(d, half)
            parts += t.parts
            done += n
        lane.drain(d)
        return dataclasses.replace(first, bytes=total, parts=parts)

    def _give_lane(self, st: gpu.Staging, lane: gpu.Lane) -> None:
        try:
            if lane.busy:
                st.driver.use(st.device)
                lane.drain(st.driver)
        finally:
            st.give(lane)

    def _gpu_put_op(
        self, path: str, gr: gpu.GpuRegion, offset: int, length: Optional[int], content_type: str, request_id: str
    ) -> "Op[Transfer]":

        n = gr.nbytes - offset if length is None else length
        gr._check(offset, n)
        gr._enter()
        try:
            return (yield from self._gpu_put_in(path, gr, offset, n, content_type, request_id))
        finally:
            gr._leave()

    def _gpu_put_in(
        self, path: str, gr: gpu.GpuRegion, offset: int, n: int, content_type: str, request_id: str
    ) -> "Op[Transfer]":
        from ._core import Call, one

        src = gr._check(offset, n)
        st, lane = yield from self._lane_op(gr.device)
        d = st.driver
        own: Optional[Region] = None
        clean = False
        try:
            d.use(gr.device)
            if n <= 2 * lane.half:
                region, base = lane.region, lane.addr
            else:
                # Bigger than a lane: a pinned region for this PUT (the store
                # needs the whole object before it completes it), from the
                # client's scratch pool: a save of many same-sized tensors
                # registers and pins once, not per tensor.
                own = yield from self._checkout(n)  # type: ignore[attr-defined]
                region, base = own, _addr(own)
                if own.id not in self._pinned:
                    d.host_register(base, own.nbytes)
                    self._pinned[own.id] = base
            # Copied in pieces on the lane's stream: the first pieces are in
            # host memory while the last are still on their way.
            step = max(lane.half, 1)
            lane.queued()
            lane.after(d, gr)  # the bytes as the owner's queued work leaves them
            for pos in range(0, n, step):
                d.dtoh(base + pos, src + pos, min(step, n - pos), lane.stream)
            lane.drain(d)
            fields = {"path": path, "region_id": region.id, "offset": 0, "length": n, "content_type": content_type}
            r = yield from one(Call("put", fields, request_id=request_id), "put")
            clean = True
            return Transfer._from_wire(r.body["report"], r.body["etag"], n)
        finally:
            try:
                self._give_lane(st, lane)
            finally:
                if own is not None:
                    # Kept for reuse only after a clean answer: a request cut
                    # short may still have the shim reading it.
                    self._give_back(own, clean)  # type: ignore[attr-defined]

    def _gpu_items_op(
        self, items: List[Tuple[int, str, gpu.GpuRegion, int, Optional[ByteRange], str]], results: List[ItemResult]
    ) -> "Op[None]":
        """``get_many`` items into GPU regions: packed into lane halves, one
        GetBatch per half, each item then copied to its tensor while the next
        half is read; an item bigger than a half is read on its own."""

        if not items:
            return
        # Every region stays in use (release() waits) until its copies are done.
        regions: Dict[int, gpu.GpuRegion] = {}
        for it in list(items):
            gr = it[2]
            if id(gr) in regions:
                continue
            try:
                gr._enter()
                regions[id(gr)] = gr
            except SluiceError as e:
                for j in [x for x in items if x[2] is gr]:
                    results[j[0]].error = e
                items = [x for x in items if x[2] is not gr]
        try:
            yield from self._gpu_items_in(items, results)
        finally:
            for gr in regions.values():
                gr._leave()

    def _gpu_items_in(
        self, items: List[Tuple[int, str, gpu.GpuRegion, int, Optional[ByteRange], str]], results: List[ItemResult]
    ) -> "Op[None]":
        from ._core import Call, _batch_outcomes, _range, all_of, check

        # Each item's room: its range's length, else up to the next item in
        # the same tensor (a batch laid out item after item), else to the
        # tensor's end.
        cap: Dict[int, int] = {}
        by_tensor: Dict[int, List[Tuple[int, int]]] = {}
        for i, _, gr, off, _, _ in items:
            by_tensor.setdefault(id(gr), []).append((off, i))
        for i, _, gr, off, rng, _ in items:
            r = _range(rng)
            if r is not None and r["length"] is not None:
                cap[i] = r["length"]
                continue
            later = [o for o, _ in by_tensor[id(gr)] if o > off]
            cap[i] = (min(later) if later else gr.nbytes) - off
        big: List[Tuple[int, str, gpu.GpuRegion, int, Optional[ByteRange], str]] = []  # read on their own
        by_device: Dict[int, List[Any]] = {}
        for it in items:
            i, _, gr, off, _, _ = it
            if off >= gr.nbytes or cap[i] <= 0:
                e = RegionTooSmall(f"no room in the GPU region ({gr.nbytes} bytes) at offset {off}")
                results[i].error = e
                continue
            by_device.setdefault(gr.device, []).append(it)
        for device, group in by_device.items():
            st, lane = yield from self._lane_op(device)
            d = st.driver
            try:
                d.use(device)
                half = 0
                while group:
                    # Fill one half with whole items; one that does not fit
                    # a half at all is read on its own.
                    chunk, used = [], 0
                    while group:
                        i, path, gr, off, rng, if_match = group[0]
                        room = min(cap[i], gr.nbytes - off)
                        if room > lane.half:
                            big.append(group.pop(0))
                            continue
                        if used + room > lane.half:
                            break
                        chunk.append((i, path, gr, off, rng, if_match, used, room))
                        used += (room + 63) & ~63
                        group.pop(0)
                    if not chunk:
                        continue
                    lane.wait(d, half)
                    fields = [
                        {
                            "path": path,
                            "range": _range(rng),
                            "region_id": lane.region.id,
                            "offset": half * lane.half + at,
                            "max_bytes": room,
                            "if_match": if_match,
                        }
                        for _, path, _, _, rng, if_match, at, room in chunk
                    ]
                    (out,) = yield [Call("get_batch", {"items": fields})]
                    for gr in {id(c[2]): c[2] for c in chunk}.values():
                        lane.after(d, gr)
                    for (i, path, gr, off, rng, if_match, at, room), o in zip(chunk, _batch_outcomes(out, len(fields))):
                        try:
                            rep = check(o, "get")
                        except SluiceError as e:
                            results[i].error = e
                            continue
                        t = Transfer._from_wire(rep.body["report"], rep.body["etag"], rep.body["object_size"])
                        try:
                            if t.bytes:
                                dst = gr._check(off, t.bytes)
                                lane.queued()
                                d.htod(dst, lane.addr + half * lane.half + at, t.bytes, lane.stream)
                        except SluiceError as e:
                            results[i].error = e
                            continue
                        results[i].ok, results[i].transfer, results[i].nbytes = True, t, t.bytes
                    lane.copied(d, half)
                    half ^= 1
                lane.drain(d)
            finally:
                self._give_lane(st, lane)
        # Items bigger than a half: several at once, each through a lane of
        # its own (the first worker waits for a lane; the others start only
        # if a lane is free now, so no worker waits on a sibling's lane).
        by_device_big: Dict[int, List[Any]] = {}
        for it in big:
            by_device_big.setdefault(it[2].device, []).append(it)
        for device, queue in by_device_big.items():
            width = min(len(queue), max(1, self._staging_bytes // max(self._lane_bytes, 1)))
            outs = yield from all_of([self._gpu_big_worker(device, queue, results, cap, n == 0) for n in range(width)])
            # Every worker stopped on an error (a lane that could not be
            # drained): what is still queued fails with it, never silently.
            why = next((o for o in outs if isinstance(o, SluiceError)), None)
            for i, *_ in queue:
                results[i].error = why or SluiceError("not read: no staging lane was left for it")

    def _gpu_big_worker(
        self, device: int, queue: List[Any], results: List[ItemResult], cap: Dict[int, int], first: bool
    ) -> "Op[None]":
        """Reads items from ``queue`` (shared with its sibling workers) one
        after another through one lane, until the queue is empty."""
        from ._core import _range

        got = yield from self._lane_try_op(device, wait=first)
        if got is None:
            return
        st, lane = got
        try:
            while queue:
                i, path, gr, off, rng, if_match = queue.pop(0)
                try:
                    t = yield from self._gpu_get_lane(st, lane, path, gr, off, _range(rng), if_match, "", cap[i])
                    results[i].ok, results[i].transfer, results[i].nbytes = True, t, t.bytes
                except SluiceError as e:
                    results[i].error = e
                    # The lane may hold a copy in flight from a failed item.
                    lane.drain(st.driver)
        finally:
            self._give_lane(st, lane)
