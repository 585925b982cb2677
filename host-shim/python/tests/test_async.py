"""The asyncio client (driven with asyncio.run; no plugin needed)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import sluice
from _helpers import payload


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_every_call(stack, prefix):
    async def main():
        async with sluice.AsyncClient(stack.socket) as c:
            assert c.tenant == "default" and "data" in c.namespaces
            data = payload(50_000, "async")
            t = await c.put(f"{prefix}/a", data, content_type="x/y")
            assert t.bytes == len(data) and t.data_path in ("http", "rdma", "rdma-staged")
            assert await c.get_bytes(f"{prefix}/a") == data
            assert await c.get_bytes(f"{prefix}/a", (10, 10)) == data[10:20]
            info = await c.head(f"{prefix}/a")
            assert info.size == len(data) and info.content_type == "x/y"
            async with await c.register(64 << 10) as region:
                t = await c.get(f"{prefix}/a", into=region, offset=8)
                assert t.bytes == len(data) and region.numpy()[8 : 8 + len(data)].tobytes() == data
                t = await c.put(f"{prefix}/b", region, 8, 100)
                assert t.bytes == 100
            assert region.released
            local = await c.register(4096, local=True)
            local.write(b"local")
            await c.put(f"{prefix}/c", local, 0, 5)
            await local.arelease()
            with pytest.raises(TypeError):
                local2 = await c.register(16)
                local2.release()  # blocking release is refused on an AsyncClient region
            assert await c.get_bytes(f"{prefix}/b") == data[:100]
            assert await c.get_bytes(f"{prefix}/c") == b"local"
            keys = [o.key async for o in c.list(prefix + "/", page_size=1)]
            rel = prefix.split("/", 1)[1]
            assert keys == [f"{rel}/a", f"{rel}/b", f"{rel}/c"]
            page = await c.list_page(prefix + "/", max_keys=2)
            assert len(page.objects) == 2 and page.next_continuation_token
            await c.delete(f"{prefix}/c")
            with pytest.raises(sluice.NoSuchKey):
                await c.head(f"{prefix}/c")
            stats = await c.stats()
            assert stats.requests >= 8 and stats.errors >= 1
            res = await c.get_many([f"{prefix}/a", f"{prefix}/c", "nope/x", (f"{prefix}/b", None, 0, (0, 4))])
            assert [r.ok for r in res] == [True, False, False, True]
            assert res[0].data == data and res[3].data == data[:4]
            assert isinstance(res[1].error, sluice.NoSuchKey) and isinstance(res[2].error, sluice.UnknownNamespace)
            got = [r async for r in c.iter_get([f"{prefix}/a", f"{prefix}/c", f"{prefix}/b"], prefetch=2)]
            assert [r.ok for r in got] == [True, False, True] and got[2].data == data[:100]
        assert c.closed

    run(main())


def test_errors_are_typed(stack, prefix):
    async def main():
        c = await sluice.AsyncClient.connect(stack.socket)
        try:
            region = await c.register(1024)
            region.numpy()[:] = 7
            await c.put(f"{prefix}/2k", bytes(2048))
            with pytest.raises(sluice.RegionTooSmall):
                await c.get(f"{prefix}/2k", into=region)
            assert (region.numpy() == 7).all()
            with pytest.raises(sluice.OutOfBounds):
                await c.put(f"{prefix}/x", region, 1000, 100)
            with pytest.raises(sluice.BadRequest):
                await c.head("data")
            with pytest.raises(sluice.UnknownNamespace):
                await c.get_bytes("nope/x")
            await c.release(region)
            with pytest.raises(sluice.UnknownRegion):
                await c.get(f"{prefix}/2k", into=region)
        finally:
            await c.close()
        with pytest.raises(sluice.ShimConnectionError):
            await c.head("data/x")

    run(main())
    with pytest.raises(sluice.UnsupportedVersion):
        run(sluice.AsyncClient.connect(stack.socket, _protocol_version=9))


def test_concurrent_tasks_share_one_connection(stack, prefix):
    async def main():
        async with sluice.AsyncClient(stack.socket) as c:
            objs = {f"{prefix}/t{i}": payload(3000 + i, ("t", i)) for i in range(20)}
            await asyncio.gather(*(c.put(k, v) for k, v in objs.items()))
            keys = list(objs) * 5
            got = await asyncio.gather(*(c.get_bytes(k) for k in keys))
            assert got == [objs[k] for k in keys]
            regions = await asyncio.gather(*(c.register(8192) for _ in range(8)))
            assert len({r.id for r in regions}) == 8
            ts = await asyncio.gather(*(c.get(k, into=r) for k, r in zip(objs, regions)))
            for (k, r), t in zip(zip(objs, regions), ts):
                assert r.read(0, t.bytes) == objs[k]
            # Cancelling a task mid-request leaves the connection usable.
            task = asyncio.ensure_future(c.get_bytes(keys[0]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await c.get_bytes(keys[1]) == objs[keys[1]]
            arr = np.frombuffer(regions[0].view, dtype=np.uint8)
            assert arr.size == 8192

    run(main())


def test_copy_false_returns_views(stack, prefix):
    async def main():
        async with sluice.AsyncClient(stack.socket) as c:
            data = payload(70_000, "z")
            await c.put(f"{prefix}/z", data)
            v = await c.get_bytes(f"{prefix}/z", copy=False)
            assert isinstance(v, memoryview) and v.readonly and v == data
            res = await c.get_many([f"{prefix}/z", f"{prefix}/z"], copy=False)
            assert [r.data for r in res] == [data, data] and all(isinstance(r.data, memoryview) for r in res)

    run(main())
